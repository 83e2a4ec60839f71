"""``ScrConfig``: the SCR server settings, each stated once, in its field.

A field's default is the spec's *effective* value: the authors' ``config.DEFAULTS`` where their
``serve.py`` sets one, otherwise the overlay's module default, so the authors' launch scripts give
the same decisions here (``docs/scr.md`` §2.1, §2.2). Its metadata carries the rest: ``help`` (what
it does), ``env`` (the authors' ``KVREUSE_*`` variable, read by ``scr.kvreuse_env``), ``spec`` (the
table that lists it), ``overlay`` (the overlay's module default where it differs) and ``check``
(the range rule). ``settings_table()`` renders all of it as the markdown table in
``scr/README.md``; ``python -m scr.settings`` prints it.

Precedence, lowest first: field defaults < ``KVREUSE_*`` environment (``scr.kvreuse_env.from_env``)
< ``--cache-policy-set key=value`` (``merge``). ``ScrPolicy.config_from_settings`` applies all
three (there, not here: ``scr.kvreuse_env`` builds on this module, which imports nothing of scr).
"""
# Spec: docs/scr.md

from __future__ import annotations

import dataclasses
import functools
import typing
from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Mapping

from policy.registry import parse_value

SsmMode = Literal["fork", "strict", "none"]
SsmSnap = Literal["prefill_end", "release"]
SessionIdentity = Literal["content", "session_id", "rid"]
Check = tuple[Callable[[Any], bool], str]


def _at_least(low: int) -> Check:
    return (lambda v: v >= low), f"must be >= {low}"


_FRACTION: Check = ((lambda v: 0.0 <= v <= 1.0), "must be within [0, 1]")
_POWER_OF_TWO: Check = ((lambda v: v >= 1 and v & (v - 1) == 0), "must be a power of two (it is used as a bit mask)")


def _setting(default: Any, what: str, env: str, spec: str = "§2.2", check: Check | None = None,
             overlay: str = "") -> Any:
    """A field with its default and the metadata ``settings_table`` and ``kvreuse_env`` read."""
    return field(default=default, metadata={"help": what, "env": env, "spec": spec, "check": check,
                                            "overlay": overlay})


@dataclass(frozen=True)
class ScrConfig:
    enabled: bool = _setting(True, "False: the null policy (plain radix cache), same code path",
                             "KVREUSE_ENABLED", "§2.1", overlay="False")
    max_blocks: int = _setting(6, "K: most blocks relocated per request (§6.5 step 3)",
                               "KVREUSE_MAX_BLOCKS", "§2.1", _at_least(1), "3")
    splice_retry: int = _setting(8, "waiting-queue passes a plan waits for the busy chunked slot (§7.2 step 6)",
                                 "KVREUSE_SPLICE_RETRY", "§2.1", _at_least(0), "0")
    mb_min_gap: int = _setting(0, "minimum forwarded stretch between relocated blocks; 0 = off (§6.5 step 4)",
                               "KVREUSE_MB_MIN_GAP", "§2.1", _at_least(0))
    min_extend: int = _setting(16, "kext: last tokens of each block that are forwarded, not relocated",
                               "KVREUSE_V6_MIN_EXTEND", "§2.1", _at_least(1))
    ssm_mode: SsmMode = _setting("fork", "recurrent-state handling at the first relocation (§9.5)",
                                 "KVREUSE_SSM_MODE", "§2.1")
    max_sessions: int = _setting(16, "LRU cap on tracked conversations (§4.4)",
                                 "KVREUSE_MAX_SESSIONS", "§2.1", _at_least(1), "256")
    side_sessions: int = _setting(12, "side-buffer slots (§5.1)", "KVREUSE_SIDE_SESSIONS", "§2.1", _at_least(1), "8")
    side_tokens: int = _setting(30000, "rows per side slot (§5.1)", "KVREUSE_SIDE_TOKENS", "§2.1", _at_least(1),
                                "34000")
    trace: bool = _setting(True, "kv6trace lines (§11.2)", "KVREUSE_TRACE", "§2.1", overlay="False")
    debug: bool = _setting(True, "verbose planning and decision lines", "KVREUSE_DEBUG", "§2.1", overlay="False")
    no_rerotate: bool = _setting(False, "ablation: skip RoPE re-rotation of relocated keys (§8)",
                                 "KVREUSE_NO_REROTATE")
    min_tail: int = _setting(64, "mintail: smallest block, and smallest relocated part, worth moving (§6.5)",
                             "KVREUSE_V6_MIN_TAIL", check=_at_least(1))
    ssm_snap: SsmSnap = _setting("prefill_end", "when the recurrent state is snapshotted (§9.2)", "KVREUSE_SSM_SNAP")
    evict_floor_frac: float = _setting(0.20, "reclaimable KV that must remain after evict-then-retry (§10.3)",
                                       "KVREUSE_EVICT_FLOOR_FRAC", check=_FRACTION)
    evict_on_alloc_fail: bool = _setting(True, "evict from the radix tree and retry once (§10.3)",
                                         "KVREUSE_EVICT_ON_ALLOC_FAIL")
    evict_margin: int = _setting(2048, "tokens evicted beyond the shortfall (§10.3)", "KVREUSE_EVICT_MARGIN",
                                 check=_at_least(0))
    fastdiff: bool = _setting(True, "content-defined-chunk diff for long sequences (§6.1)", "KVREUSE_FASTDIFF")
    cdc_target: int = _setting(64, "CDC target chunk size; a bit mask, hence a power of two (§6.1)",
                               "KVREUSE_CDC_TARGET", check=_POWER_OF_TWO)
    fastdiff_min: int = _setting(2048, "CDC diff only when both sequences are at least this long (§6.1)",
                                 "KVREUSE_FASTDIFF_MIN", check=_at_least(0))
    cdc_extend: bool = _setting(True, "grow CDC-equal blocks token by token (§6.1 step 4)", "KVREUSE_CDC_EXTEND")
    match_window: int = _setting(8192, "common prefix measured over the first tokens only (§4.3)",
                                 "KVREUSE_MATCH_WINDOW", check=_at_least(1))
    match_min_tokens: int = _setting(1024, "minimum common prefix of a session candidate (§4.3)",
                                     "KVREUSE_MATCH_MIN_TOKENS", check=_at_least(1))
    match_min_ratio: float = _setting(0.55, "floor on the winner's overall overlap (§4.3)",
                                      "KVREUSE_MATCH_MIN_RATIO", check=_FRACTION)
    match_min_prefix_frac: float = _setting(0.5, "weak test: prefix share of the old prompt (§4.3)",
                                            "KVREUSE_MATCH_MIN_PREFIX_FRAC", check=_FRACTION)
    match_min_overlap: float = _setting(0.5, "weak test: overall overlap (§4.3)", "KVREUSE_MATCH_MIN_OVERLAP",
                                        check=_FRACTION)
    match_ambig_margin: float = _setting(0.15, "an unslotted session this much better makes it ambiguous (§4.3)",
                                         "KVREUSE_MATCH_AMBIG_MARGIN", check=_FRACTION)
    t6_guard: bool = _setting(True, "re-check slot owner and token identity before every relocation (§7.5 step 5)",
                              "KVREUSE_T6_GUARD")
    ssm: bool = _setting(True, "keep the recurrent-state shadow; off declines fork/strict on hybrids (§9)",
                         "KVREUSE_SSM")
    # The authors' code caches a relocated request like any other, relocated rows and forked state
    # included (§7.5); False (ours, an ablation) keeps them out of the shared radix tree, as
    # their README describes.
    relocated_in_tree: bool = _setting(True, "cache relocated rows and the forked state in the radix tree like any "
                                       "other request (the authors' code); False keeps them out (their README's "
                                       "sentence; an ablation)", "KVREUSE_RELOCATED_IN_TREE", "§7.5")
    # Ours, beyond the authors: where a request's conversation comes from. "content" is theirs
    # (§4.3: the best-overlapping session of the namespace); "session_id" takes SGLang's request
    # field ``session_id``, "rid" the rid up to its last "." (as eval.cluster routes); a request
    # without one is matched by content.
    session_identity: SessionIdentity = _setting("content", "where a request's session comes from: content "
                                                 "matching (the authors'), the request's session_id, or its rid "
                                                 "up to the last '.'", "KVREUSE_SESSION_IDENTITY", "ours")

    def __post_init__(self):
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            problem = field_problem(f.name, value)
            if problem:
                raise ValueError(f"{f.name}={value!r}: {problem}")
        if self.match_min_tokens > self.match_window:
            raise ValueError(
                f"match_min_tokens={self.match_min_tokens}: must be <= match_window={self.match_window}, "
                "or no session could ever match"
            )


@functools.cache
def field_types() -> dict[str, Any]:
    """Field name -> its type (``Literal`` for the modes), resolved once."""
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


@functools.cache
def _checks() -> dict[str, Check]:
    return {f.name: f.metadata["check"] for f in dataclasses.fields(ScrConfig) if f.metadata["check"]}


def field_problem(name: str, value: Any) -> str | None:
    """Why ``value`` is not valid for field ``name`` (type, then range), or None.

    One rule set for ``ScrConfig.__post_init__`` and ``kvreuse_env.from_env``.
    """
    problem = _type_problem(field_types()[name], value)
    if problem or name not in _checks():
        return problem
    ok, rule = _checks()[name]
    return None if ok(value) else rule


def merge(config: ScrConfig, overrides: Mapping[str, Any]) -> ScrConfig:
    """``config`` with ``overrides`` (field -> value) applied; ``config`` is not mutated.

    String values are parsed by field type exactly as ``--cache-policy-set`` parses them
    (``policy.registry``); other values are used as given. Raises ``ValueError`` for an unknown
    field or an invalid value.
    """
    types = field_types()
    values: dict[str, Any] = {}
    for key, value in overrides.items():
        if key not in types:
            raise ValueError(f"scr has no setting {key!r}; valid settings: {', '.join(types)}")
        values[key] = parse_value(key, value, types[key]) if isinstance(value, str) else value
    return dataclasses.replace(config, **values)


TABLE_HEADER = (
    "| setting | default | env var | spec | overlay module default | what it does |\n"
    "|---|---|---|---|---|---|\n"
)


def settings_table() -> str:
    """Every ``ScrConfig`` field as a markdown table row, in field order, from its metadata.

    ``scr/README.md`` holds a copy; ``tests/unit/test_scr_settings.py`` keeps the two equal.
    """
    rows = []
    for f in dataclasses.fields(ScrConfig):
        meta = f.metadata
        cells = (f"`{f.name}`", f"`{f.default}`", f"`{meta['env']}`", meta["spec"], meta["overlay"], meta["help"])
        rows.append("| " + " | ".join(cells) + " |\n")
    return TABLE_HEADER + "".join(rows)


if __name__ == "__main__":
    print(settings_table(), end="")
