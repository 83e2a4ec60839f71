"""The authors' ``KVREUSE_*`` environment, read underneath ``--cache-policy-set`` (``docs/scr.md`` §2).

Each ``ScrConfig`` field names its variable in its metadata (``env``); this module only parses
them. Precedence, lowest first: field defaults < ``KVREUSE_*`` (``from_env``) <
``--cache-policy-set key=value`` (``scr.settings.merge``); ``resolve`` applies all three.

Parsing (the spec fixes only ``KVREUSE_ENABLED``, §2.1):

- ``KVREUSE_ENABLED``: on only for exactly ``"1"``; any other text is off, as in the overlay.
- other booleans: ``"1"`` or ``"0"``. The authors' scripts use only these; other spellings are
  rejected, because the spec does not say how the overlay reads them.
- integers: Python ``int()``; numbers: ``float()``; modes: the exact names.
- an empty value is an error, not "unset".

Variables the overlay reads that have no field, and why (``from_env`` ignores them):

- ``KVREUSE_FORCE``, ``KVREUSE_MIN_EXTRA_TOKENS``, ``KVREUSE_MIN_EXTRA_FRAC``: the single-phase
  "gain over radix" test; dead on the default path (§2.1, §15.4).
- ``KVREUSE_SUFFIX_GATE``: single-phase path only (§2.2).
- ``KVREUSE_BUDGET_FRAC``: only logged; ``_reclaim``, which would use it, is never called (§2.1).
- ``KVREUSE_MIN_FREE_FRAC``, ``KVREUSE_SNAP_MAX``, ``KVREUSE_ALLOC_MARGIN``,
  ``KVREUSE_MATCH_MIN_FRAC``: defined but unused (§2.2).
- ``KVREUSE_TIMING``, ``KVREUSE_TIMING_EVERY``: the overlay's optional profiling lines (§2.2),
  which this port does not print (the banner's ``timing=`` is always ``False``).
- ``KVREUSE_V6``, ``KVREUSE_PIN_ONLY``, ``KVREUSE_LEAD_FREEZE``: they select the legacy
  single-phase path (§2.2, §7.6), which this port does not implement. ``from_env`` accepts their
  default values and rejects the others (``UnsupportedKnob``), so an ablation script never
  silently runs full SCR. The per-request knobs ``pin``, ``v6``, ``lead`` and ``force`` (§2.3)
  are refused the same way (``scr.knobs``).
- ``kvreuse_session_id`` (a request attribute SGLang never sets) is dead (§2.3).
"""
# Spec: docs/scr.md

from __future__ import annotations

import dataclasses
import typing
from typing import Any, Literal, Mapping

from scr.settings import ScrConfig, field_problem, field_types, merge
from policy.api import RequestRefused

# Field -> variable, in field order.
ENV_VARS: dict[str, str] = {f.name: f.metadata["env"] for f in dataclasses.fields(ScrConfig)}

# Read by the overlay but dead on the default path (see the module docstring): ignored.
IGNORED_ENV: tuple[str, ...] = (
    "KVREUSE_FORCE", "KVREUSE_MIN_EXTRA_TOKENS", "KVREUSE_MIN_EXTRA_FRAC", "KVREUSE_SUFFIX_GATE",
    "KVREUSE_BUDGET_FRAC", "KVREUSE_MIN_FREE_FRAC", "KVREUSE_SNAP_MAX", "KVREUSE_ALLOC_MARGIN",
    "KVREUSE_MATCH_MIN_FRAC", "KVREUSE_TIMING", "KVREUSE_TIMING_EVERY",
)

# Single-phase path selectors: the value each must have here, since that path is not ported.
SINGLE_PHASE_ENV: dict[str, str] = {"KVREUSE_V6": "1", "KVREUSE_PIN_ONLY": "0", "KVREUSE_LEAD_FREEZE": "0"}


class UnsupportedKnob(RequestRefused):
    """A ``KVREUSE_*`` variable or a request's ``cache_salt`` knob asks for the single-phase path
    (§7.6), which this port does not implement. Raised so that nothing runs full SCR in its place
    silently: at start for the variables, per request for the knobs (a 400 naming ``cache_salt``)."""

    field = "cache_salt"


def not_ported(setting: str, raw: str, accepted: str, effect: str = "selects the single-phase path") -> str:
    """The refusal's wording, shared by ``from_env`` and ``scr.knobs.parse_request_knobs``."""
    return f"{setting}={raw!r}: {effect}, which this port does not implement (only {setting}={accepted} is accepted)"


def env_text(value: Any) -> str:
    """A setting as the authors' scripts write it: booleans ``1``/``0``, everything else ``str``."""
    return ("1" if value else "0") if isinstance(value, bool) else str(value)


# The authors' ``config.DEFAULTS`` (§2.1), in their table order; the ``[scr]`` start-up line prints
# these keys. A key with a field takes the field's default; the others are the dead variables'
# values. ``from_env(AUTHORS_DEFAULTS) == ScrConfig()``.
_DEAD_DEFAULTS = {"KVREUSE_FORCE": "1", "KVREUSE_MIN_EXTRA_TOKENS": "1024", "KVREUSE_MIN_EXTRA_FRAC": "0.15",
                  "KVREUSE_BUDGET_FRAC": "0.25"}
_AUTHORS_ORDER = (
    "KVREUSE_ENABLED", "KVREUSE_MAX_BLOCKS", "KVREUSE_SPLICE_RETRY", "KVREUSE_MB_MIN_GAP", "KVREUSE_V6_MIN_EXTEND",
    "KVREUSE_SSM_MODE", "KVREUSE_FORCE", "KVREUSE_MIN_EXTRA_TOKENS", "KVREUSE_MIN_EXTRA_FRAC",
    "KVREUSE_MAX_SESSIONS", "KVREUSE_SIDE_SESSIONS", "KVREUSE_SIDE_TOKENS", "KVREUSE_BUDGET_FRAC", "KVREUSE_TRACE",
    "KVREUSE_DEBUG",
)
_FIELD_DEFAULTS = {var: env_text(getattr(ScrConfig(), name)) for name, var in ENV_VARS.items()}
AUTHORS_DEFAULTS: dict[str, str] = {var: _DEAD_DEFAULTS.get(var) or _FIELD_DEFAULTS[var] for var in _AUTHORS_ORDER}


def _parse_env(name: str, raw: str) -> Any:
    """Text of one ``KVREUSE_*`` variable -> field value, by the rules in the module docstring."""
    kind = field_types()[name]
    if name == "enabled":
        return raw == "1"
    if raw == "":
        raise ValueError("empty value")
    if kind is bool:
        if raw not in ("0", "1"):
            raise ValueError("expected 0 or 1")
        return raw == "1"
    if typing.get_origin(kind) is Literal:
        return raw
    try:
        return kind(raw)
    except ValueError:
        raise ValueError("expected an integer" if kind is int else "expected a number") from None


def from_env(env: Mapping[str, str], base: ScrConfig | None = None) -> ScrConfig:
    """``base`` (default: ``ScrConfig()``) with every ``KVREUSE_*`` variable present in ``env`` applied.

    Does not mutate ``env``. Raises ``ValueError`` naming the variable and the field for a value
    that does not parse or is out of range, and ``UnsupportedKnob`` (a ``ValueError``) for a
    single-phase selector (``SINGLE_PHASE_ENV``) set to anything but its default. Dead variables
    (``IGNORED_ENV``) and unknown names are ignored.
    """
    for var, required in SINGLE_PHASE_ENV.items():
        if var in env and env[var] != required:
            raise UnsupportedKnob(not_ported(var, env[var], required))
    values: dict[str, Any] = {}
    for name, var in ENV_VARS.items():
        if var not in env:
            continue
        raw = env[var]
        try:
            value = _parse_env(name, raw)
        except ValueError as exc:
            raise ValueError(f"{var}={raw!r} ({name}): {exc}") from None
        problem = field_problem(name, value)
        if problem:
            raise ValueError(f"{var}={raw!r} ({name}): {problem}")
        values[name] = value
    return dataclasses.replace(base or ScrConfig(), **values)


def resolve(env: Mapping[str, str], settings: Mapping[str, Any]) -> ScrConfig:
    """Defaults < ``env`` (``KVREUSE_*``) < ``settings`` (``--cache-policy-set``)."""
    return merge(from_env(env), settings)
