"""Arms of a benchmark: a name, a policy and the settings it runs with, side by side in one run.

    --arm NAME=POLICY[:KEY=VALUE,KEY=VALUE...]     (repeatable)

``KEY=VALUE`` pairs are the policy's own settings (``--cache-policy-set``; ``policy.registry``
checks the key and the value at parse time, so a typo fails before any server starts). Without
``--arm`` the arms are the three policies with their defaults (``DEFAULT_ARMS``). A variant is an
arm, never a silent default: ``scr-notree=scr:relocated_in_tree=0`` beside ``scr``.

``--concurrency 1,4`` is a sweep: every arm runs at every concurrency, named ``NAME@c1``,
``NAME@c4`` when more than one is given.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Iterable, Sequence

from policy import registry
from serving import profile as serving_profile

NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]*")
DEFAULT_ARMS = ("radix=radix", "exact=exact", "scr=scr")


class ArmError(ValueError):
    """A bad ``--arm`` or ``--concurrency`` value; the message says what is valid."""


@dataclass(frozen=True)
class Arm:
    name: str
    policy: str
    settings: tuple[tuple[str, str], ...] = ()
    concurrency: int | None = None  # set by ``sweep``
    # The SGLang settings every arm shares (``serving/profile.py``); one value for all arms of a
    # run (``with_profile``), recorded with each result.
    serving_profile: str = serving_profile.DEFAULT

    def setting(self, key: str, default: str | None = None) -> str | None:
        return dict(self.settings).get(key, default)

    def cache_policy_args(self) -> list[str]:
        return [arg for key, value in self.settings for arg in ("--cache-policy-set", f"{key}={value}")]

    def describe(self) -> str:
        settings = ",".join(f"{k}={v}" for k, v in self.settings)
        return f"{self.policy}" + (f":{settings}" if settings else "")


def parse_arm(text: str) -> Arm:
    """``NAME=POLICY[:KEY=VALUE,...]`` -> ``Arm``; ``ArmError`` names what is wrong."""
    name, sep, rest = text.partition("=")
    if not sep or not NAME.fullmatch(name):
        raise ArmError(f"--arm {text!r}: expected NAME=POLICY[:KEY=VALUE,...] with NAME of letters, digits, _.+-")
    policy, _, assignments = rest.partition(":")
    if policy not in registry.names():
        raise ArmError(f"--arm {text!r}: unknown policy {policy!r}; valid: {', '.join(registry.names())}")
    pairs = []
    for item in filter(None, assignments.split(",")):
        key, eq, value = item.partition("=")
        if not eq or not key:
            raise ArmError(f"--arm {text!r}: {item!r} is not KEY=VALUE")
        pairs.append((key.strip(), value.strip()))
    try:
        registry.resolve_config(policy, dict(pairs))
    except registry.PolicyError as exc:
        raise ArmError(f"--arm {text!r}: {exc}") from None
    return Arm(name, policy, tuple(pairs))


def parse_arms(texts: Iterable[str] | None) -> list[Arm]:
    arms = [parse_arm(t) for t in (texts or DEFAULT_ARMS)]
    names = [a.name for a in arms]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ArmError(f"--arm: names must be unique, repeated: {', '.join(duplicates)}")
    return arms


def parse_concurrency(text: str) -> list[int]:
    """``"4"`` or ``"1,4"`` -> ``[4]`` / ``[1, 4]``."""
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise ArmError(f"--concurrency {text!r}: expected integers separated by commas") from None
    if not values or min(values) < 1 or len(set(values)) != len(values):
        raise ArmError(f"--concurrency {text!r}: distinct integers >= 1")
    return values


def sweep(arms: Sequence[Arm], concurrencies: Sequence[int]) -> list[Arm]:
    """Every arm at every concurrency (names suffixed ``@cN`` when there is more than one)."""
    several = len(concurrencies) > 1
    return [replace(arm, name=f"{arm.name}@c{c}" if several else arm.name, concurrency=c)
            for c in concurrencies for arm in arms]


def with_profile(arms: Sequence[Arm], name: str) -> list[Arm]:
    """Every arm served with the serving profile ``name`` (``ArmError`` for an unknown one)."""
    try:
        serving_profile.get(name)
    except serving_profile.ProfileError as exc:
        raise ArmError(str(exc)) from None
    return [replace(arm, serving_profile=name) for arm in arms]


def baseline(arms: Sequence[Arm]) -> Arm:
    """The arm the ratios are taken to: the first radix arm at the first concurrency, else the first arm."""
    return next((a for a in arms if a.policy == "radix"), arms[0])
