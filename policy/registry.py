"""Policy names -> implementations, and resolution of ``key=value`` settings into a typed config.

Names feed the launcher's ``--cache-policy`` choices. Implementations are referenced by dotted
path and imported on first use, so this package keeps importing nothing but the standard
library, and ``policy/`` never depends on the packages that implement it.

A policy class has a ``name``, is built as ``cls(config)`` and implements ``policy.api.CachePolicy``
(inheriting ``PolicyDefaults`` for the optional members); its ``plans_at`` says when it plans, and
so which hook set ``patches/`` runs it with (the registry names no module of ``patches/``); its
config class is a frozen dataclass (named by the ``config_class`` attribute of the policy class, or ``<Name>Config`` next
to it) whose ``__post_init__`` rejects bad values with ``ValueError``.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import typing
from dataclasses import dataclass, field
from typing import Any, Iterable, Literal, Mapping

SPEC_ENV = "CACHE_POLICY_SPEC"

# name -> "module:Class" of the policy (the plan producer).
_IMPLEMENTATIONS: dict[str, str] = {
    "radix": "policy.radix:RadixPolicy",
    "exact": "exact_cache.policy:ExactPolicy",
    "scr": "scr.policy:ScrPolicy",
}

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


class PolicyError(ValueError):
    """A bad policy name, setting key or setting value; the message says what is valid."""


def register(name: str, dotted_path: str) -> None:
    """Make ``name`` selectable; ``dotted_path`` is ``"module:Class"``."""
    if ":" not in dotted_path:
        raise ValueError(f"expected 'module:attribute', got {dotted_path!r}")
    _IMPLEMENTATIONS[name] = dotted_path


def plans_at(name: str) -> str:
    """When policy ``name`` plans (``policy.api.PLANS_AT``): ``patches/`` picks its hook set by this."""
    return getattr(policy_class(name), "plans_at", "match")


def names() -> tuple[str, ...]:
    return tuple(sorted(_IMPLEMENTATIONS))


def policy_class(name: str) -> type:
    if name not in _IMPLEMENTATIONS:
        raise PolicyError(f"unknown cache policy {name!r}; valid policies: {', '.join(names())}")
    module_name, class_name = _IMPLEMENTATIONS[name].split(":")
    return getattr(importlib.import_module(module_name), class_name)


def config_class(name: str) -> type:
    cls = policy_class(name)
    explicit = getattr(cls, "config_class", None)
    if explicit is not None:
        return explicit
    module = importlib.import_module(cls.__module__)
    return getattr(module, cls.__name__.removesuffix("Policy") + "Config")


def parse_value(key: str, raw: str, kind: Any) -> Any:
    """A ``key=value`` setting as the config field type ``kind`` (int, float, bool, str, Literal)."""
    origin = typing.get_origin(kind)
    if origin is Literal:
        choices = typing.get_args(kind)
        for choice in choices:
            if str(choice) == raw:
                return choice
        raise PolicyError(f"{key}={raw!r}: expected one of {', '.join(map(str, choices))}")
    if kind is bool:
        lowered = raw.strip().lower()
        if lowered in _TRUE:
            return True
        if lowered in _FALSE:
            return False
        raise PolicyError(f"{key}={raw!r}: expected a boolean (1/0, true/false, yes/no, on/off)")
    if kind in (int, float):
        try:
            return kind(raw)
        except ValueError:
            raise PolicyError(f"{key}={raw!r}: expected {'an integer' if kind is int else 'a number'}") from None
    if kind is str:
        return raw
    raise PolicyError(f"{key}: settings of type {kind!r} cannot be set from the command line")


def setting_names(name: str) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(config_class(name)))


def setting_defaults(name: str) -> dict[str, Any]:
    """Each setting of policy ``name`` with its default (a field without one shows as None)."""
    fields = dataclasses.fields(config_class(name))
    return {f.name: f.default if f.default is not dataclasses.MISSING
            else f.default_factory() if f.default_factory is not dataclasses.MISSING else None for f in fields}


def parse_assignments(assignments: Iterable[str]) -> dict[str, str]:
    """``["a=1", "b=x"]`` -> ``{"a": "1", "b": "x"}``; a later assignment of a key wins."""
    parsed: dict[str, str] = {}
    for item in assignments:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise PolicyError(f"--cache-policy-set expects key=value, got {item!r}")
        parsed[key.strip()] = value.strip()
    return parsed


def resolve_config(name: str, settings: Mapping[str, str]) -> Any:
    """Build the policy's config from defaults overridden by ``settings`` (strings)."""
    cls = config_class(name)
    hints = typing.get_type_hints(cls)
    valid = setting_names(name)
    values = {}
    for key, raw in settings.items():
        if key not in valid:
            listed = ", ".join(valid) if valid else "(none)"
            raise PolicyError(f"cache policy {name!r} has no setting {key!r}; valid settings: {listed}")
        values[key] = parse_value(key, raw, hints[key])
    # A policy may add its own layer under the command line (SCR honours the authors' ``KVREUSE_*``
    # environment): its ``config_from_settings(values)`` builds the config from the parsed settings.
    build = getattr(policy_class(name), "config_from_settings", None) or (lambda parsed: cls(**parsed))
    try:
        return build(values)
    except (TypeError, ValueError) as exc:
        raise PolicyError(f"cache policy {name!r}: {exc}") from None


@dataclass(frozen=True)
class PolicySpec:
    """Everything a server process needs to run a policy; travels as one JSON env var."""

    policy: str
    config: dict = field(default_factory=dict)
    events_path: str | None = None

    @classmethod
    def resolve(cls, policy: str, assignments: Iterable[str] = (), events_path: str | None = None) -> "PolicySpec":
        config = resolve_config(policy, parse_assignments(assignments))
        return cls(policy=policy, config=dataclasses.asdict(config), events_path=events_path)

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "PolicySpec":
        data = json.loads(text)
        return cls(policy=data["policy"], config=dict(data.get("config") or {}), events_path=data.get("events_path"))

    def build(self):
        """Instantiate the policy with this spec's config."""
        config = config_class(self.policy)(**self.config)
        return policy_class(self.policy)(config)
