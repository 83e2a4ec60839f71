"""The authors' log lines (``scr_spec.md`` §11): the formats and the parser live in
``policy/log_lines.py`` (standard library only, shared with the accounting in ``eval/``); this
module re-exports all of them and adds the start-up lines built from ``scr.config``.
"""

from __future__ import annotations

from typing import Mapping

from policy.log_lines import (  # noqa: F401  (re-exported: scr and patches import them from here)
    _FIELDS,
    _FINISH_ID,
    _FINISH_INTS,
    _KINDS,
    _PATTERNS,
    _SITE_HEAD,
    REPORT_LINES,
    SGLANG_TARGET,
    TEMPLATES,
    TRACE_FIELDS,
    LogLineError,
    _check_trace_fields,
    _compile,
    _parts,
    _read_env,
    _read_kvs,
    _read_scalar,
    _render_env,
    _render_int,
    _render_kvs,
    _render_word,
    format_line,
    parse_finish,
    parse_line,
    parse_report_line,
    side_buffer_line,
    trace_tag,
)
from scr.config import AUTHORS_DEFAULTS, ScrConfig


def scr_start_line(enabled: bool, sglang_version: str, env: Mapping[str, str]) -> str:
    """``serve.py``'s line: every ``config.DEFAULTS`` key, in table order, as the process sees it."""
    settings = {key: env.get(key, default) for key, default in AUTHORS_DEFAULTS.items()}
    return format_line("scr_start", state=enabled, sglang_version=sglang_version, settings=settings)


def site_banner(config: ScrConfig, pid: int) -> str:
    """The per-process banner; ``v6``/``pin_only``/``lead_freeze`` are constant in this port.

    Booleans are printed ``True``/``False``, as the authors' overlay prints them (``policy.log_lines``
    template ``scr_site``, kind ``flag``).
    """
    return format_line(
        "scr_site", v6=True, pin_only=False, lead_freeze=False, ssm_snap=config.ssm_snap, pid=pid,
        no_rerotate=config.no_rerotate, max_sessions=config.max_sessions, fastdiff=config.fastdiff,
        cdc_target=config.cdc_target, fastdiff_min=config.fastdiff_min, timing=config.timing,
        min_extend=config.min_extend, t6_guard=config.t6_guard, trace=config.trace,
        evict_on_fail=config.evict_on_alloc_fail, evict_margin=config.evict_margin,
        max_blocks=config.max_blocks, mb_min_gap=config.mb_min_gap, splice_retry=config.splice_retry,
    )
