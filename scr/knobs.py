"""Per-request knobs: what a request's ``cache_salt`` asks of SCR (``docs/scr.md`` §2.3).

- no ``kvreuse:`` prefix (or None): no knobs;
- ``kvreuse:off`` exactly: ``off`` (no intercept, no session, plain SGLang);
- ``kvreuse:knobs:k=v,k=v``: overrides, applied in order, a later key winning;
- any other ``kvreuse:<switch>``: no effect, reported in ``ignored``.

The knobs, their fields and how each value is read are the table ``_KNOBS``; an item the table
cannot read (no ``=``, an unknown key, a bad value) is ignored and reported, and the server
setting stays. The single-phase knobs (``_SINGLE_PHASE_KNOBS``) are refused with
``UnsupportedKnob`` unless at their two-phase value.
"""
# Spec: docs/scr.md

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from policy.namespace import salt_of
from scr.kvreuse_env import UnsupportedKnob, not_ported
from scr.settings import ScrConfig, SsmMode

KNOB_PREFIX = "kvreuse:"
_KNOBS_SWITCH = "knobs:"
_TRUE_WORDS = frozenset({"1", "true", "on", "yes"})


def _knob_int(raw: str) -> int:
    try:
        return int(raw)
    except ValueError:
        raise ValueError("expected an integer") from None


def _clamped_to_1(raw: str) -> int:
    """``maxblocks`` and ``minext`` below 1 become 1, as the planner clamps them (§6.5 step 3)."""
    return max(1, _knob_int(raw))


def _at_least_1(raw: str) -> int:
    value = _knob_int(raw)
    if value < 1:
        raise ValueError("must be >= 1")
    return value


def _ssm_mode(raw: str) -> str:
    if raw not in typing.get_args(SsmMode):
        raise ValueError(f"expected one of {', '.join(typing.get_args(SsmMode))}")
    return raw


# Knob -> (ScrConfig field, reader) for the knobs the two-phase path reads. A reader raises
# ValueError with the reason the item is ignored. Booleans are true for ``_TRUE_WORDS``
# (case-insensitive) and false for anything else.
_KNOBS: dict[str, tuple[str, Callable[[str], Any]]] = {
    "rerot": ("no_rerotate", lambda raw: raw.lower() not in _TRUE_WORDS),
    "ssm": ("ssm_mode", _ssm_mode),
    "maxblocks": ("max_blocks", _clamped_to_1),
    "minext": ("min_extend", _clamped_to_1),
    "mintail": ("min_tail", _at_least_1),
}
# Single-phase knobs (§2.3, §7.2 step 3, §7.6): knob -> (the value that keeps the two-phase path,
# what any other value does, what to use instead). ``force`` skips the single-phase gain test.
_SINGLE_PHASE_KNOBS: dict[str, tuple[bool, str, str]] = {
    "pin": (False, "selects the single-phase path",
            "for a control run that relocates nothing use cache_salt 'kvreuse:off' (plain radix cache)"),
    "v6": (True, "selects the single-phase path", "leave the knob out: the two-phase path is the default"),
    "lead": (False, "selects the single-phase path", "leave the knob out: the radix cache serves the leading run"),
    "force": (False, "applies to the single-phase path only",
              "leave the knob out: the two-phase path has no gain test to skip"),
}
# The single-phase gain threshold: without that path it has nothing to act on (like KVREUSE_MIN_EXTRA_TOKENS).
_NO_EFFECT_KNOBS = {"min_extra": "single-phase path only (its gain test): no effect"}


@dataclass(frozen=True)
class RequestKnobs:
    """What a request's ``cache_salt`` asks of SCR (§2.3).

    The salt itself, knobs included, stays the request's namespace (``namespace``): a salted
    request shares no session or radix entry with other salts. ``overrides`` maps ScrConfig fields
    to values; ``ignored`` lists ``(item, reason)`` for every part of the knob string that had no
    effect. A salt that asks for the single-phase path never becomes a ``RequestKnobs``:
    ``parse_request_knobs`` raises ``UnsupportedKnob``.
    """

    namespace: str | None = None
    off: bool = False  # "kvreuse:off": no intercept, no session, plain SGLang
    overrides: dict[str, Any] = field(default_factory=dict)
    ignored: tuple[tuple[str, str], ...] = ()

    def apply(self, config: ScrConfig) -> ScrConfig:
        """The config this request runs with; ``config`` is not mutated."""
        return dataclasses.replace(config, **self.overrides) if self.overrides else config


def parse_request_knobs(cache_salt: str | None) -> RequestKnobs:
    """Read the switch in ``cache_salt`` (the request's namespace, SGLang's ``extra_key``: its salt
    part, ``policy.namespace.salt_of``) by the rules in the module docstring.

    Pure. Raises ``UnsupportedKnob`` when, after a later key has overridden an earlier one,
    ``pin``, ``lead`` or ``force`` is true or ``v6`` is false: those ask for the single-phase path,
    and serving the request with full SCR instead would be a silent change of algorithm. The same
    knobs at their two-phase value are reported in ``ignored``.
    """
    salt = salt_of(cache_salt)  # the knobs are in the salt part of the namespace (policy/namespace.py)
    if salt is None or not salt.startswith(KNOB_PREFIX):
        return RequestKnobs(namespace=cache_salt)
    switch = salt[len(KNOB_PREFIX):]
    if switch == "off":
        return RequestKnobs(namespace=cache_salt, off=True)
    if not switch.startswith(_KNOBS_SWITCH):
        return RequestKnobs(namespace=cache_salt, ignored=((switch, "unknown kvreuse switch"),))
    overrides: dict[str, Any] = {}
    single_phase: dict[str, tuple[str, str]] = {}  # knob -> (item, value), the last one given
    ignored: list[tuple[str, str]] = []
    for item in filter(str.strip, switch[len(_KNOBS_SWITCH):].split(",")):
        key, sep, raw = (part.strip() for part in item.partition("="))
        if sep and key in _SINGLE_PHASE_KNOBS:
            single_phase[key] = (item, raw)
            continue
        try:
            name, value = _read_knob(key, sep, raw)
        except ValueError as exc:
            ignored.append((item, str(exc)))
            continue
        overrides[name] = value
    ignored += _refuse_single_phase(single_phase)
    return RequestKnobs(cache_salt, False, overrides, tuple(ignored))


def _read_knob(key: str, sep: str, raw: str) -> tuple[str, Any]:
    """One item of a knob list -> (ScrConfig field, value); ``ValueError`` says why it is ignored."""
    if not sep:
        raise ValueError("expected key=value")
    if key in _NO_EFFECT_KNOBS:
        raise ValueError(_NO_EFFECT_KNOBS[key])
    if key not in _KNOBS:
        raise ValueError("unknown knob")
    name, read = _KNOBS[key]
    return name, read(raw)


def _refuse_single_phase(single_phase: Mapping[str, tuple[str, str]]) -> list[tuple[str, str]]:
    """Raise ``UnsupportedKnob`` for the first knob that leaves the two-phase path; else the
    ``ignored`` entries of the knobs (all at their two-phase value, so without effect)."""
    for key, (_item, raw) in single_phase.items():
        two_phase, effect, instead = _SINGLE_PHASE_KNOBS[key]
        if (raw.lower() in _TRUE_WORDS) != two_phase:
            accepted = "1" if two_phase else "0"
            raise UnsupportedKnob(f"cache_salt knob {not_ported(key, raw, accepted, effect)}; {instead}")
    return [(item, "single-phase knob at its two-phase value: no effect") for item, _raw in single_phase.values()]
