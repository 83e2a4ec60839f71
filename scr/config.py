"""Settings of the SCR policy: ``ScrConfig``, the authors' ``KVREUSE_*`` variables, per-request knobs.

Every field is a knob that the default two-phase path reads (``scr_spec.md`` §2.1, §2.2). Its
default is the spec's *effective* value: ``config.DEFAULTS`` where the authors' ``serve.py`` sets
one, otherwise the overlay's module default. Our server behaves like ``serve.py``, so the authors'
launch scripts give the same decisions here.

| field                 | env var                          | spec  | default      | overlay module default |
|-----------------------|----------------------------------|-------|--------------|------------------------|
| enabled               | KVREUSE_ENABLED                  | §2.1  | True         | False                  |
| max_blocks            | KVREUSE_MAX_BLOCKS               | §2.1  | 6            | 3                      |
| splice_retry          | KVREUSE_SPLICE_RETRY             | §2.1  | 8            | 0                      |
| mb_min_gap            | KVREUSE_MB_MIN_GAP               | §2.1  | 0            |                        |
| min_extend            | KVREUSE_V6_MIN_EXTEND            | §2.1  | 16           |                        |
| ssm_mode              | KVREUSE_SSM_MODE                 | §2.1  | "fork"       |                        |
| max_sessions          | KVREUSE_MAX_SESSIONS             | §2.1  | 16           | 256                    |
| side_sessions         | KVREUSE_SIDE_SESSIONS            | §2.1  | 12           | 8                      |
| side_tokens           | KVREUSE_SIDE_TOKENS              | §2.1  | 30000        | 34000                  |
| trace                 | KVREUSE_TRACE                    | §2.1  | True         | False                  |
| debug                 | KVREUSE_DEBUG                    | §2.1  | True         | False                  |
| no_rerotate           | KVREUSE_NO_REROTATE              | §2.2  | False        |                        |
| min_tail              | KVREUSE_V6_MIN_TAIL              | §2.2  | 64           |                        |
| ssm_snap              | KVREUSE_SSM_SNAP                 | §2.2  | "prefill_end"|                        |
| evict_floor_frac      | KVREUSE_EVICT_FLOOR_FRAC         | §2.2  | 0.20         |                        |
| evict_on_alloc_fail   | KVREUSE_EVICT_ON_ALLOC_FAIL      | §2.2  | True         |                        |
| evict_margin          | KVREUSE_EVICT_MARGIN             | §2.2  | 2048         |                        |
| fastdiff              | KVREUSE_FASTDIFF                 | §2.2  | True         |                        |
| cdc_target            | KVREUSE_CDC_TARGET               | §2.2  | 64           |                        |
| fastdiff_min          | KVREUSE_FASTDIFF_MIN             | §2.2  | 2048         |                        |
| cdc_extend            | KVREUSE_CDC_EXTEND               | §2.2  | True         |                        |
| match_window          | KVREUSE_MATCH_WINDOW             | §2.2  | 8192         |                        |
| match_min_tokens      | KVREUSE_MATCH_MIN_TOKENS         | §2.2  | 1024         |                        |
| match_min_ratio       | KVREUSE_MATCH_MIN_RATIO          | §2.2  | 0.55         |                        |
| match_min_prefix_frac | KVREUSE_MATCH_MIN_PREFIX_FRAC    | §2.2  | 0.5          |                        |
| match_min_overlap     | KVREUSE_MATCH_MIN_OVERLAP        | §2.2  | 0.5          |                        |
| match_ambig_margin    | KVREUSE_MATCH_AMBIG_MARGIN       | §2.2  | 0.15         |                        |
| t6_guard              | KVREUSE_T6_GUARD                 | §2.2  | True         |                        |
| ssm                   | KVREUSE_SSM                      | §2.2  | True         |                        |
| timing                | KVREUSE_TIMING                   | §2.2  | False        |                        |
| timing_every          | KVREUSE_TIMING_EVERY             | §2.2  | 50           |                        |
| relocated_in_tree     | KVREUSE_RELOCATED_IN_TREE        | ours  | False        | their code: True (§7.5)|

Knobs left out, and why:

- ``KVREUSE_FORCE``, ``KVREUSE_MIN_EXTRA_TOKENS``, ``KVREUSE_MIN_EXTRA_FRAC``: the single-phase
  "gain over radix" test; dead on the default path (§2.1, §15.4).
- ``KVREUSE_SUFFIX_GATE``: single-phase path only (§2.2).
- ``KVREUSE_BUDGET_FRAC``: only logged; ``_reclaim``, which would use it, is never called (§2.1).
- ``KVREUSE_MIN_FREE_FRAC``, ``KVREUSE_SNAP_MAX``, ``KVREUSE_ALLOC_MARGIN``,
  ``KVREUSE_MATCH_MIN_FRAC``: defined but unused (§2.2).
- ``KVREUSE_V6``, ``KVREUSE_PIN_ONLY``, ``KVREUSE_LEAD_FREEZE``: they select the legacy
  single-phase path (§2.2, §7.6), which this port does not implement. ``from_env`` accepts their
  default values and rejects the others, so an ablation script never silently runs full SCR.
  The per-request knobs ``pin``, ``v6``, ``lead`` and ``force`` (§2.3) are refused the same way
  (``UnsupportedKnob``, per request); ``min_extra`` is ignored like ``KVREUSE_MIN_EXTRA_TOKENS``.
- ``kvreuse_session_id`` (a request attribute SGLang never sets) is dead (§2.3).

The dead variables above are ignored by ``from_env`` (``config.DEFAULTS`` sets several of them).

Precedence, lowest first: field defaults < ``KVREUSE_*`` environment (``from_env``) <
``--cache-policy-set key=value`` (``merge``). ``resolve`` applies all three.

Parsing of the environment (the spec fixes only ``KVREUSE_ENABLED``, §2.1):

- ``KVREUSE_ENABLED``: on only for exactly ``"1"``; any other text is off, as in the overlay.
- other booleans: ``"1"`` or ``"0"``. The authors' scripts use only these; other spellings are
  rejected, because the spec does not say how the overlay reads them.
- integers: Python ``int()``; numbers: ``float()``; modes: the exact names.
- an empty value is an error, not "unset".
"""

from __future__ import annotations

import dataclasses
import functools
import os
import typing
from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Mapping

from policy.registry import parse_value

SsmMode = Literal["fork", "strict", "none"]
SsmSnap = Literal["prefill_end", "release"]


@dataclass(frozen=True)
class ScrConfig:
    enabled: bool = True  # False: the null policy (plain radix cache), same code path
    max_blocks: int = 6  # K: most blocks relocated per request (§6.5 step 3)
    splice_retry: int = 8  # waiting-queue passes a plan waits for the busy chunked slot (§7.2 step 6)
    mb_min_gap: int = 0  # minimum forwarded stretch between relocated blocks; 0 = off (§6.5 step 4)
    min_extend: int = 16  # kext: last tokens of each block that are forwarded, not relocated
    ssm_mode: SsmMode = "fork"  # recurrent-state handling at the first splice (§9.5)
    max_sessions: int = 16  # LRU cap on tracked conversations (§4.4)
    side_sessions: int = 12  # side-buffer slots (§5.1)
    side_tokens: int = 30000  # rows per side slot (§5.1)
    trace: bool = True  # kv6trace lines (§11.2)
    debug: bool = True  # verbose planning and decision lines
    no_rerotate: bool = False  # ablation: skip RoPE re-rotation of relocated keys (§8)
    min_tail: int = 64  # mintail: smallest block, and smallest relocated part, worth moving (§6.5)
    ssm_snap: SsmSnap = "prefill_end"  # when the recurrent state is snapshotted (§9.2)
    evict_floor_frac: float = 0.20  # reclaimable KV that must remain after evict-then-retry (§10.3)
    evict_on_alloc_fail: bool = True  # evict from the radix tree and retry once (§10.3)
    evict_margin: int = 2048  # tokens evicted beyond the shortfall (§10.3)
    fastdiff: bool = True  # content-defined-chunk diff for long sequences (§6.1)
    cdc_target: int = 64  # CDC target chunk size; a bit mask, hence a power of two (§6.1)
    fastdiff_min: int = 2048  # CDC diff only when both sequences are at least this long (§6.1)
    cdc_extend: bool = True  # grow CDC-equal blocks token by token (§6.1 step 4)
    match_window: int = 8192  # common prefix measured over the first tokens only (§4.3)
    match_min_tokens: int = 1024  # minimum common prefix of a session candidate (§4.3)
    match_min_ratio: float = 0.55  # floor on the winner's overall overlap (§4.3)
    match_min_prefix_frac: float = 0.5  # weak test: prefix share of the old prompt (§4.3)
    match_min_overlap: float = 0.5  # weak test: overall overlap (§4.3)
    match_ambig_margin: float = 0.15  # an unslotted session this much better makes it ambiguous (§4.3)
    t6_guard: bool = True  # re-check slot owner and token identity before every splice (§7.5 step 5)
    ssm: bool = True  # keep the recurrent-state shadow; off declines fork/strict on hybrids (§9)
    timing: bool = False  # optional profiling lines
    timing_every: int = 50  # intercepts per profiling line
    # Ours, not the authors': False keeps relocated rows out of the shared radix tree (their README's
    # design); True caches a spliced request like any other, relocated rows included (their code).
    relocated_in_tree: bool = False

    @classmethod
    def from_settings(cls, settings: Mapping[str, Any]) -> "ScrConfig":
        """The launcher's entry (``policy.registry``): defaults < ``KVREUSE_*`` < ``--cache-policy-set``."""
        return resolve(os.environ, settings)

    def __post_init__(self):
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            problem = _field_problem(f.name, value)
            if problem:
                raise ValueError(f"{f.name}={value!r}: {problem}")
        if self.match_min_tokens > self.match_window:
            raise ValueError(
                f"match_min_tokens={self.match_min_tokens}: must be <= match_window={self.match_window}, "
                "or no session could ever match"
            )


ENV_VARS: dict[str, str] = {
    "enabled": "KVREUSE_ENABLED", "max_blocks": "KVREUSE_MAX_BLOCKS", "splice_retry": "KVREUSE_SPLICE_RETRY",
    "mb_min_gap": "KVREUSE_MB_MIN_GAP", "min_extend": "KVREUSE_V6_MIN_EXTEND", "ssm_mode": "KVREUSE_SSM_MODE",
    "max_sessions": "KVREUSE_MAX_SESSIONS", "side_sessions": "KVREUSE_SIDE_SESSIONS",
    "side_tokens": "KVREUSE_SIDE_TOKENS", "trace": "KVREUSE_TRACE", "debug": "KVREUSE_DEBUG",
    "no_rerotate": "KVREUSE_NO_REROTATE", "min_tail": "KVREUSE_V6_MIN_TAIL", "ssm_snap": "KVREUSE_SSM_SNAP",
    "evict_floor_frac": "KVREUSE_EVICT_FLOOR_FRAC", "evict_on_alloc_fail": "KVREUSE_EVICT_ON_ALLOC_FAIL",
    "evict_margin": "KVREUSE_EVICT_MARGIN", "fastdiff": "KVREUSE_FASTDIFF", "cdc_target": "KVREUSE_CDC_TARGET",
    "fastdiff_min": "KVREUSE_FASTDIFF_MIN", "cdc_extend": "KVREUSE_CDC_EXTEND",
    "match_window": "KVREUSE_MATCH_WINDOW", "match_min_tokens": "KVREUSE_MATCH_MIN_TOKENS",
    "match_min_ratio": "KVREUSE_MATCH_MIN_RATIO", "match_min_prefix_frac": "KVREUSE_MATCH_MIN_PREFIX_FRAC",
    "match_min_overlap": "KVREUSE_MATCH_MIN_OVERLAP", "match_ambig_margin": "KVREUSE_MATCH_AMBIG_MARGIN",
    "t6_guard": "KVREUSE_T6_GUARD", "ssm": "KVREUSE_SSM", "timing": "KVREUSE_TIMING",
    "timing_every": "KVREUSE_TIMING_EVERY", "relocated_in_tree": "KVREUSE_RELOCATED_IN_TREE",
}

# Read by the overlay but dead on the default path (see the module docstring): ignored.
IGNORED_ENV: tuple[str, ...] = (
    "KVREUSE_FORCE", "KVREUSE_MIN_EXTRA_TOKENS", "KVREUSE_MIN_EXTRA_FRAC", "KVREUSE_SUFFIX_GATE",
    "KVREUSE_BUDGET_FRAC", "KVREUSE_MIN_FREE_FRAC", "KVREUSE_SNAP_MAX", "KVREUSE_ALLOC_MARGIN",
    "KVREUSE_MATCH_MIN_FRAC",
)

# Single-phase path selectors: the value each must have here, since that path is not ported.
SINGLE_PHASE_ENV: dict[str, str] = {"KVREUSE_V6": "1", "KVREUSE_PIN_ONLY": "0", "KVREUSE_LEAD_FREEZE": "0"}


class UnsupportedKnob(ValueError):
    """A ``KVREUSE_*`` variable or a request's ``cache_salt`` knob asks for the single-phase path
    (§7.6), which this port does not implement. Raised so that nothing runs full SCR in its place
    silently: at start for the variables, per request for the knobs."""


def _not_ported(setting: str, raw: str, accepted: str, effect: str = "selects the single-phase path") -> str:
    """The refusal's wording, shared by ``from_env`` and ``parse_request_knobs``."""
    return f"{setting}={raw!r}: {effect}, which this port does not implement (only {setting}={accepted} is accepted)"


# The authors' ``config.DEFAULTS`` (§2.1) as environment strings, in table order; the ``[scr]``
# start-up line prints these keys. ``from_env(AUTHORS_DEFAULTS) == ScrConfig()``.
AUTHORS_DEFAULTS: dict[str, str] = {
    "KVREUSE_ENABLED": "1", "KVREUSE_MAX_BLOCKS": "6", "KVREUSE_SPLICE_RETRY": "8", "KVREUSE_MB_MIN_GAP": "0",
    "KVREUSE_V6_MIN_EXTEND": "16", "KVREUSE_SSM_MODE": "fork", "KVREUSE_FORCE": "1",
    "KVREUSE_MIN_EXTRA_TOKENS": "1024", "KVREUSE_MIN_EXTRA_FRAC": "0.15", "KVREUSE_MAX_SESSIONS": "16",
    "KVREUSE_SIDE_SESSIONS": "12", "KVREUSE_SIDE_TOKENS": "30000", "KVREUSE_BUDGET_FRAC": "0.25",
    "KVREUSE_TRACE": "1", "KVREUSE_DEBUG": "1",
}


def _at_least(low: int) -> tuple[Callable[[Any], bool], str]:
    return (lambda v: v >= low), f"must be >= {low}"


_FRACTION = ((lambda v: 0.0 <= v <= 1.0), "must be within [0, 1]")
# Range rules, stated once: ``__post_init__`` and ``from_env`` both use them.
_RANGES: dict[str, tuple[Callable[[Any], bool], str]] = {
    "max_blocks": _at_least(1),
    "splice_retry": _at_least(0),
    "mb_min_gap": _at_least(0),
    "min_extend": _at_least(1),
    "max_sessions": _at_least(1),
    "side_sessions": _at_least(1),
    "side_tokens": _at_least(1),
    "min_tail": _at_least(1),
    "evict_floor_frac": _FRACTION,
    "evict_margin": _at_least(0),
    "cdc_target": ((lambda v: v >= 1 and v & (v - 1) == 0), "must be a power of two (it is used as a bit mask)"),
    "fastdiff_min": _at_least(0),
    "match_window": _at_least(1),
    "match_min_tokens": _at_least(1),
    "match_min_ratio": _FRACTION,
    "match_min_prefix_frac": _FRACTION,
    "match_min_overlap": _FRACTION,
    "match_ambig_margin": _FRACTION,
    "timing_every": _at_least(1),
}


@functools.cache
def _field_types() -> dict[str, Any]:
    return typing.get_type_hints(ScrConfig)


def _type_problem(kind: Any, value: Any) -> str | None:
    if typing.get_origin(kind) is Literal:
        choices = typing.get_args(kind)
        return None if value in choices else f"expected one of {', '.join(choices)}"
    if kind is bool:
        return None if isinstance(value, bool) else "expected a boolean"
    if kind is int:
        return None if isinstance(value, int) and not isinstance(value, bool) else "expected an integer"
    if kind is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        return None if ok else "expected a number"
    return None


def _field_problem(name: str, value: Any) -> str | None:
    """Why ``value`` is not valid for field ``name`` (type, then range), or None."""
    problem = _type_problem(_field_types()[name], value)
    if problem or name not in _RANGES:
        return problem
    ok, rule = _RANGES[name]
    return None if ok(value) else rule


def _parse_env(name: str, raw: str) -> Any:
    """Text of one ``KVREUSE_*`` variable -> field value, by the rules in the module docstring."""
    kind = _field_types()[name]
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
            raise UnsupportedKnob(_not_ported(var, env[var], required))
    values: dict[str, Any] = {}
    for name, var in ENV_VARS.items():
        if var not in env:
            continue
        raw = env[var]
        try:
            value = _parse_env(name, raw)
        except ValueError as exc:
            raise ValueError(f"{var}={raw!r} ({name}): {exc}") from None
        problem = _field_problem(name, value)
        if problem:
            raise ValueError(f"{var}={raw!r} ({name}): {problem}")
        values[name] = value
    return dataclasses.replace(base or ScrConfig(), **values)


def merge(config: ScrConfig, overrides: Mapping[str, Any]) -> ScrConfig:
    """``config`` with ``overrides`` (field -> value) applied; ``config`` is not mutated.

    String values are parsed by field type exactly as ``--cache-policy-set`` parses them
    (``policy.registry``); other values are used as given. Raises ``ValueError`` for an unknown
    field or an invalid value.
    """
    types = _field_types()
    values: dict[str, Any] = {}
    for key, value in overrides.items():
        if key not in types:
            raise ValueError(f"scr has no setting {key!r}; valid settings: {', '.join(types)}")
        values[key] = parse_value(key, value, types[key]) if isinstance(value, str) else value
    return dataclasses.replace(config, **values)


def resolve(env: Mapping[str, str], settings: Mapping[str, Any]) -> ScrConfig:
    """Defaults < ``env`` (``KVREUSE_*``) < ``settings`` (``--cache-policy-set``)."""
    return merge(from_env(env), settings)


# Per-request knobs (§2.3).

KNOB_PREFIX = "kvreuse:"
_TRUE_WORDS = frozenset({"1", "true", "on", "yes"})
# Knob -> ScrConfig field for the knobs the default path reads.
_KNOB_FIELDS = {"rerot": "no_rerotate", "ssm": "ssm_mode", "maxblocks": "max_blocks",
                "minext": "min_extend", "mintail": "min_tail"}
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
    """Read the switch in ``cache_salt`` (SGLang's ``extra_key``).

    - no ``kvreuse:`` prefix (or None): no knobs;
    - ``kvreuse:off`` exactly: ``off``;
    - ``kvreuse:knobs:k=v,k=v``: overrides, applied in order, a later key winning;
    - any other ``kvreuse:<switch>``: no effect, reported in ``ignored``.

    Knob values: booleans are true for ``1``/``true``/``on``/``yes`` (case-insensitive) and false
    for anything else; ``maxblocks`` and ``minext`` below 1 become 1, as the planner clamps them
    (§6.5 step 3). Items without ``=``, unknown keys, non-integers for integer knobs, an unknown
    ``ssm`` mode, ``mintail`` below 1 and ``min_extra`` are ignored and reported; the server
    setting stays.

    Raises ``UnsupportedKnob`` when, after a later key has overridden an earlier one, ``pin``,
    ``lead`` or ``force`` is true or ``v6`` is false: those ask for the single-phase path, and
    serving the request with full SCR instead would be a silent change of algorithm. The same
    knobs at their two-phase value are reported in ``ignored``.
    """
    if cache_salt is None or not cache_salt.startswith(KNOB_PREFIX):
        return RequestKnobs(namespace=cache_salt)
    switch = cache_salt[len(KNOB_PREFIX):]
    if switch == "off":
        return RequestKnobs(namespace=cache_salt, off=True)
    if not switch.startswith("knobs:"):
        return RequestKnobs(namespace=cache_salt, ignored=((switch, "unknown kvreuse switch"),))
    overrides: dict[str, Any] = {}
    single_phase: dict[str, tuple[str, str]] = {}  # knob -> (item, value), the last one given
    ignored: list[tuple[str, str]] = []
    for item in switch[len("knobs:"):].split(","):
        if not item.strip():
            continue
        key, sep, raw = (part.strip() for part in item.partition("="))
        if not sep:
            ignored.append((item, "expected key=value"))
        elif key in _SINGLE_PHASE_KNOBS:
            single_phase[key] = (item, raw)
        elif key in _NO_EFFECT_KNOBS:
            ignored.append((item, _NO_EFFECT_KNOBS[key]))
        else:
            try:
                name, value = _parse_knob(key, raw)
            except ValueError as exc:
                ignored.append((item, str(exc)))
                continue
            overrides[name] = value
    ignored += _refuse_single_phase(single_phase)
    return RequestKnobs(cache_salt, False, overrides, tuple(ignored))


def _refuse_single_phase(single_phase: Mapping[str, tuple[str, str]]) -> list[tuple[str, str]]:
    """Raise ``UnsupportedKnob`` for the first knob that leaves the two-phase path; else the
    ``ignored`` entries of the knobs (all at their two-phase value, so without effect)."""
    for key, (_item, raw) in single_phase.items():
        two_phase, effect, instead = _SINGLE_PHASE_KNOBS[key]
        if (raw.lower() in _TRUE_WORDS) != two_phase:
            accepted = "1" if two_phase else "0"
            raise UnsupportedKnob(f"cache_salt knob {_not_ported(key, raw, accepted, effect)}; {instead}")
    return [(item, "single-phase knob at its two-phase value: no effect") for item, _raw in single_phase.values()]


def _parse_knob(key: str, raw: str) -> tuple[str, Any]:
    """One ``key=value`` of a knob the two-phase path reads -> (ScrConfig field, value)."""
    if key not in _KNOB_FIELDS:
        raise ValueError("unknown knob")
    name = _KNOB_FIELDS[key]
    if key == "rerot":
        return name, raw.lower() not in _TRUE_WORDS
    if key == "ssm":
        if raw not in typing.get_args(SsmMode):
            raise ValueError(f"expected one of {', '.join(typing.get_args(SsmMode))}")
        return name, raw
    value = _knob_int(raw)
    if key in ("maxblocks", "minext"):
        return name, max(1, value)
    if value < 1:
        raise ValueError("must be >= 1")
    return name, value


def _knob_int(raw: str) -> int:
    try:
        return int(raw)
    except ValueError:
        raise ValueError("expected an integer") from None
