"""The authors' log lines (``docs/scr.md`` §11) and SGLang's ``Finish:`` line: formatters and one parser.

A compatibility module: the server side (``scr/``, ``patches/``) writes these lines and the
accounting (``eval/accounting/server_log.py``) reads them, so the formats are an interface and live
here, in one place, outside the ``policy/`` seam (which stays free of SCR's vocabulary). It also
builds the two start-up lines that need the settings (``scr_start_line``, ``site_banner``).

Each line is one template in ``TEMPLATES``; ``format_line`` renders it and ``parse_line`` reads it
back, both from the same template, so a formatted line always parses to the values it was given.

Template syntax: ``{name:kind}`` is a field (``kind`` omitted = a word without spaces); all other
text is literal. Kinds (``_KINDS``) say how a value is written and read:

    int      123 / -4           opt_int  None or an int       bool   True / False
    flag     True / False, also read as 1 / 0                 onoff  on / off
    word     text without spaces: ``escape_word`` percent-encodes spaces, line breaks, ``%``
             and anything outside printable ASCII, and reading decodes it (request ids)
    text     text up to the literal that follows              f1/f2  float with 1 / 2 decimals
    ints     Python list of ints, "[3, 7, 11]"                repr   Python repr of a string
    kvs      "k=v k=v" (dict; values int, float, None, bool or word)
    env      "KEY=value KEY=value" (dict of strings)     opt_word  a word, or None

The four lines ``analysis/scr_report.py`` reads (§12.1) are ``scr_site`` (``max_blocks``,
``splice_retry``), ``trace_req`` (``rid``, ``sid``, ``n_old``), ``splice_ok`` (``rid``,
``relocated`` = C') and ``finish`` (see ``parse_finish``). The report's regexes need much less
than the templates (other fields may stand in between, booleans may be spelled any way), so the
accounting reads those lines with ``parse_report_line`` (``REPORT_LINES``), which accepts every
line the report accepts. Report rules that are not line syntax: keep the first ``Finish:`` and the
first ``trace_req`` per rid, sum ``relocated`` over all ``splice_ok`` lines of a rid, use the
first ``scr_site`` line of a log.

Field names: ``A+B'`` is ``stop`` (the prefix length before the splice) and ``C'`` is
``relocated`` (rows spliced); other names follow the spec's text.

Choices where the spec gives no exact text (``docs/scr.md`` leaves these open): banner booleans
are written ``True``/``False``, as the authors' overlay prints Python booleans (read back as
``True``/``False`` or ``1``/``0``, the spelling of this port's earlier banners); the ``[scr]``
line separates ``KEY=value`` pairs with one space; the ``tag=`` of ``ev=req`` is
``repr(text.replace("\\n", " ")[:90])`` (cut before ``repr`` so it stays a valid literal);
``rows=a:b`` and ``extend=[a,b)`` are half-open; ``multiblock DROP`` names the block as ``i/K``;
lists are Python lists; the ``ev=drop_private`` fields are ``sid slot n_side``.
"""
# Spec: docs/scr.md

from __future__ import annotations

import ast
import re
import string
import urllib.parse
from typing import Any, Callable, Mapping, NamedTuple

from scr.kvreuse_env import AUTHORS_DEFAULTS
from scr.settings import ScrConfig

SGLANG_TARGET = "0.5.16"
_SITE_HEAD = (
    "[kvreuse-site] v6.10 splice-after-extend patches applied (per-request knobs via kvreuse_session_id) (v5 base) "
)

TEMPLATES: dict[str, str] = {
    # Start-up (§11.1, §3.3, §5.1, §9.1, H4).
    "scr_start": "[scr] Suffix Cache Reuse {state:onoff} | sglang {sglang_version} (built for "
    + SGLANG_TARGET + ") | {settings:env}",
    "scr_site": _SITE_HEAD + "v6={v6:flag} pin_only={pin_only:flag} lead_freeze={lead_freeze:flag} "
    "ssm_snap={ssm_snap} pid={pid:int} no_rerotate={no_rerotate:flag} max_sessions={max_sessions:int} "
    "fastdiff={fastdiff:flag} cdc_target={cdc_target:int} fastdiff_min={fastdiff_min:int} "
    "timing={timing:flag} min_extend={min_extend:int} t6_guard={t6_guard:flag} trace={trace:flag} "
    "evict_on_fail={evict_on_fail:flag} evict_margin={evict_margin:int} | v6.10k multiblock=1 "
    "max_blocks={max_blocks:int} mb_min_gap={mb_min_gap:int} splice_retry={splice_retry:int}",
    "prefill_hook": "[kvreuse] v6.3: prefill-end snapshot hook attached to SchedulerBatchResultProcessor",
    "wrapped_alloc": "[kvreuse] wrapped {pool_class}.alloc for state restore",
    "ssm_shadow": "[kvreuse] ssm shadow: {sessions:int} sessions, {gib:f2} GiB private (outside the mamba pool)",
    "side_buffer": "[kvreuse] side buffer: {slots:int} slots x {tokens:int} tokens "
    "({gib:f2} GiB, {kib_per_token:f1} KiB/token)",
    "init": "[kvreuse] init: full_attn_layers={full_attn_layers:int} rotary={rotary:bool} layers={layers:ints} "
    "pool_slots={pool_slots:int} snapshot_budget={snapshot_budget:int} evict_floor={evict_floor:int}",
    # Per request (§11.2-§11.4, §4.2, §7, §10).
    "trace_req": "[kvreuse] kv6trace ev=req rid={rid} sid={sid} slot={slot:opt_int} n_new={n_new:int} "
    "n_old={n_old:int} nsess={nsess:int} tag={tag:repr}",
    "trace": "[kvreuse] kv6trace ev={ev} {fields:kvs}",
    "splice_ok": "[kvreuse] v6 splice OK: rid={rid} sid={sid} slot={slot:int} A+B'={stop:int} "
    "C'={relocated:int} extend={extend:int} live={live:int} [spliced={spliced:int} "
    "tokens={spliced_tokens:int}] blocks={block:int}/{num_blocks:int}",
    "ssm_dropped": "[kvreuse] ssm snapshot dropped: rid={rid} sid={sid} finished before prefill end",
    "passthrough": "[kvreuse] {sid} passthrough kept={kept:int} del={deleted:int} ins={inserted:int}",
    "deferred_retry": "[kvreuse] kv6 rid={rid} tail DEFERRED-RETRY {attempt:int}/{max_attempts:int} "
    "(chunked slot busy)",
    "multiblock_plan": "[kvreuse] kv6 rid={rid} multiblock plan: K={num_blocks:int} stops={stops:ints} "
    "reloc={reloc:ints} kext={kext:int} maxb={maxb:int} cands={cands:int} live={live:int}",
    "phase1": "[kvreuse] kv6 rid={rid} phase1 radix_a={radix_n0:int} chunk1={chunk1:int} tail={n_c:int} "
    "total={total:int} ssm_restore={ssm_restore:bool} ssm_mode={ssm_mode} ssm_na={ssm_na:bool} "
    "ssm_obj={ssm_obj:bool}",
    "phase2": "[kvreuse] kv6 rid={rid} phase2 prefilled_chunk1={prefilled_chunk1:int} "
    "reused_tail={reused_tail:int} extend2={extend2:int} total={total:int} rot_delta={rot_delta:int}",
    "multiblock_next": "[kvreuse] kv6 rid={rid} multiblock next: block {block:int}/{num_blocks:int} "
    "extend=[{start:int},{end:int}) then splice {rows:int} rows",
    "multiblock_drop": "[kvreuse] kv6 rid={rid} multiblock DROP: block {block:int}/{num_blocks:int} "
    "stop={stop:int} <= prefix={prefix:int} (or empty); {abandoned:int} block(s) abandoned, tail re-prefilled",
    "phase1_aborted": "[kvreuse] v6 phase1 aborted ({reason:text}); normal prefill of the tail [aborts={aborts:int}]",
    "phase2_mismatch": "[kvreuse] v6 phase2: prefix {prefix:int} != |A|+|B'| {stop:int} -> normal prefill of the tail",
    "alloc_failed": "[kvreuse] v6 phase2: alloc({n:int}) failed -> normal prefill of the tail",
    "slot_stolen": "[kvreuse] v6 SIDE SLOT STOLEN: rid={rid} slot={slot:int} owner={owner:opt_word} sess={sess} "
    "rows={row_start:int}:{row_end:int} ids_match={ids_match:bool} guard=True -> normal prefill of the tail "
    "[stolen={stolen:int}]",
    "evict_declined": "[kvreuse] evict-before-fail: declined (avail={avail:int} evictable={evictable:int} "
    "need={need:int} floor={floor:int})",
    "evict_retry": "[kvreuse] evict-before-fail: requested={requested:int} evicted={evicted:int} "
    "retry={retry} [{ok:int}/{total:int}]",
    "drift": "[kvreuse] DRIFT: {unaccounted:int} slots unaccounted (first={first:int} max={max:int}) after "
    "{allocs:int} freeze allocs / {alloc_slots:int} slots | side_held={side_held:int}",
}

# Field order of the other kv6trace events (§5.1, §5.2, §9.2, §9.4); format_line checks it.
TRACE_FIELDS: dict[str, tuple[str, ...]] = {
    "side_acq": ("slot", "sid", "free"),
    "side_rel": ("slot", "sid"),
    "drop_private": ("sid", "slot", "n_side"),
    "snap": ("sid", "slot", "keep", "n", "prev"),
    "ssm_save": ("rid", "sid", "slot", "midx", "n"),
    "ssm_restore": ("rid", "slot", "midx", "sid", "before", "shadow", "after"),
}


def _render_int(value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"expected an int, got {value!r}")
    return str(value)


# Characters a word is written with as they are: printable ASCII but the space and ``%``.
_WORD_SAFE = frozenset(chr(c) for c in range(0x21, 0x7F)) - {"%"}


def escape_word(text: str) -> str:
    """``text`` as one word of a log line: every character outside printable ASCII, the space and
    ``%`` percent-encoded (UTF-8 bytes, ``%20``), so a request id holding spaces, line breaks,
    quotes or non-ASCII stays one word that nobody can use to start a line; ``unescape_word``
    reads it back. Ordinary ids (``bcp-17.3``, uuids) are written unchanged, so the authors'
    report, which reads ``rid=(\\S+)``, still matches them to SGLang's ``Finish:`` lines."""
    if all(c in _WORD_SAFE for c in text):
        return text
    return "".join(c if c in _WORD_SAFE else "".join(f"%{b:02X}" for b in c.encode("utf-8")) for c in text)


def unescape_word(text: str) -> str:
    """Inverse of ``escape_word``."""
    return urllib.parse.unquote(text, errors="strict") if "%" in text else text


def _render_word(value: Any) -> str:
    text = "None" if value is None else escape_word(str(value))
    if not text:
        raise ValueError("a word field cannot be empty")
    return text


def _read_word(text: str) -> str:
    return unescape_word(text)


def _read_scalar(text: str) -> Any:
    if re.fullmatch(r"-?\d+", text):
        return int(text)
    if text in ("None", "True", "False"):
        return {"None": None, "True": True, "False": False}[text]
    try:
        return float(text)
    except ValueError:
        return unescape_word(text)


def _render_kvs(values: Mapping[str, Any]) -> str:
    return " ".join(f"{_render_word(k)}={_render_word(v)}" for k, v in values.items())


def _read_kvs(text: str) -> dict[str, Any]:
    return {key: _read_scalar(value) for key, value in _read_env(text).items()}


def _render_env(values: Mapping[str, str]) -> str:
    for key, value in values.items():
        if any(c.isspace() for c in key + value) or not key:
            raise ValueError(f"{key}={value!r}: keys and values cannot contain spaces")
    return " ".join(f"{key}={value}" for key, value in values.items())


def _read_env(text: str) -> dict[str, str]:
    return {key: value for key, _, value in (item.partition("=") for item in text.split(" "))}


# kind -> (regex, render, read)
_KINDS: dict[str, tuple[str, Callable[[Any], str], Callable[[str], Any]]] = {
    "word": (r"\S+", _render_word, _read_word),
    "opt_word": (r"\S+", _render_word, lambda s: None if s == "None" else _read_word(s)),
    "int": (r"-?\d+", _render_int, int),
    "opt_int": (r"None|-?\d+", lambda v: "None" if v is None else _render_int(v), _read_scalar),
    "bool": (r"True|False", lambda v: str(bool(v)), lambda s: s == "True"),
    "flag": (r"True|False|1|0", lambda v: str(bool(v)), lambda s: s in ("True", "1")),
    "onoff": (r"on|off", lambda v: "on" if v else "off", lambda s: s == "on"),
    "text": (r".+?", str, str),
    "f1": (r"-?\d+\.\d", lambda v: f"{v:.1f}", float),
    "f2": (r"-?\d+\.\d\d", lambda v: f"{v:.2f}", float),
    "ints": (r"\[(?:-?\d+(?:, -?\d+)*)?\]", lambda v: str([int(x) for x in v]), ast.literal_eval),
    "repr": (r"'.*'|\".*\"", repr, ast.literal_eval),
    "kvs": (r"\S+=\S+(?: \S+=\S+)*", _render_kvs, _read_kvs),
    "env": (r"\S+=\S*(?: \S+=\S*)*", _render_env, _read_env),
}


def _parts(template: str) -> list[tuple[str, str | None, str]]:
    """Template -> [(literal, field or None, kind)]."""
    return [(lit, name, spec or "word") for lit, name, spec, _ in string.Formatter().parse(template)]


def _compile(template: str) -> re.Pattern:
    regex = "".join(
        re.escape(lit) + (f"(?P<{name}>{_KINDS[kind][0]})" if name is not None else "")
        for lit, name, kind in _parts(template)
    )
    return re.compile(regex + "$")


_PATTERNS = {name: _compile(template) for name, template in TEMPLATES.items()}
_FIELDS = {name: [(f, k) for _, f, k in _parts(template) if f is not None] for name, template in TEMPLATES.items()}


def format_line(kind: str, **values: Any) -> str:
    """The authors' text of line ``kind`` (a ``TEMPLATES`` key) for ``values``; every field is required."""
    if kind == "trace":
        _check_trace_fields(values["ev"], values["fields"])
    out = []
    for lit, name, field_kind in _parts(TEMPLATES[kind]):
        out.append(lit)
        if name is not None:
            out.append(_KINDS[field_kind][1](values[name]))
    return "".join(out)


def _check_trace_fields(ev: str, fields: Mapping[str, Any]) -> None:
    if ev == "req":
        raise ValueError("ev=req has its own template: format_line('trace_req', ...)")
    expected = TRACE_FIELDS.get(ev)
    if expected is not None and tuple(fields) != expected:
        raise ValueError(f"kv6trace ev={ev}: fields must be {expected}, in that order; got {tuple(fields)}")


def parse_line(line: str) -> dict[str, Any] | None:
    """One log line -> ``{"kind": ..., field: value, ...}``, or None if it is none of ours.

    Text before the line's start (a timestamp, a process prefix) is ignored; the template must
    match up to the end of the line. ``Finish:`` lines go to ``parse_finish``.
    """
    line = line.rstrip("\r\n")
    if "Finish: " in line:
        return parse_finish(line)
    if "[kvreuse" not in line and "[scr] " not in line:
        return None
    for kind, pattern in _PATTERNS.items():
        found = pattern.search(line)
        if found is None:
            continue
        parsed: dict[str, Any] = {"kind": kind}
        for name, field_kind in _FIELDS[kind]:
            parsed[name] = _KINDS[field_kind][2](found.group(name))
        return parsed
    return None


class LogLineError(ValueError):
    """A line ``parse_report_line`` recognises (it carries a ``REPORT_LINES`` marker) but cannot read."""


class ReportLine(NamedTuple):
    marker: str  # text that makes a line this kind's line; reading it must then succeed
    pattern: re.Pattern  # what analysis/scr_report.py needs of it (searched anywhere in the line)
    needs: str  # the same, for error messages


# What the authors' report needs of each SCR line it reads (docs/scr.md §11.1-§11.3, §12.1), and
# no more: any text may stand before, between and after the named fields.
#   scr_site   [kvreuse-site] ...max_blocks=<int>...splice_retry=<int>
#   splice_ok  v6 splice OK...rid=<rid>...sid=<sid>...slot=<slot>...A+B'=<int>...C'=<int>
#   trace_req  kv6trace ev=req rid=<rid> sid=<sid> slot=<slot> n_new=<int> n_old=<int>
# Only these markers are recognised; every other [kvreuse] line (debug, phase, other kv6trace
# events) is not read by the accounting and is skipped.
REPORT_LINES: dict[str, ReportLine] = {
    "scr_site": ReportLine(
        "[kvreuse-site] ",
        re.compile(r"\[kvreuse-site\] .*?max_blocks=(?P<max_blocks>\d+).*?splice_retry=(?P<splice_retry>\d+)"),
        "'[kvreuse-site] ', then max_blocks=<int>, then splice_retry=<int>"),
    "splice_ok": ReportLine(
        "[kvreuse] v6 splice OK",
        re.compile(r"v6 splice OK.*?rid=(?P<rid>\S+).*?sid=(?P<sid>\S+).*?slot=(?P<slot>\S+)"
                   r".*?A\+B'=(?P<stop>\d+).*?C'=(?P<relocated>\d+)"),
        "rid=, sid=, slot=, A+B'=<int>, C'=<int> in that order"),
    "trace_req": ReportLine(
        "[kvreuse] kv6trace ev=req ",
        re.compile(r"kv6trace ev=req rid=(?P<rid>\S+) sid=(?P<sid>\S+) slot=(?P<slot>\S+) "
                   r"n_new=(?P<n_new>\d+) n_old=(?P<n_old>\d+)"),
        "rid= sid= slot= n_new=<int> n_old=<int>, space-separated"),
}
# The splice line's running counters and block index (§11.3), read wherever they stand; a line
# without them is still a splice (the report does not need them) but cannot be checked for gaps.
_SPLICE_EXTRAS = (re.compile(r"\[spliced=(?P<spliced>\d+) tokens=(?P<spliced_tokens>\d+)\]"),
                  re.compile(r"blocks=(?P<block>\d+)/(?P<num_blocks>\d+)"))


def parse_report_line(line: str) -> dict[str, Any] | None:
    """A line the authors' report reads -> ``{"kind": ..., field: value}``; None for any other line.

    ``Finish:`` lines go to ``parse_finish``. An SCR line (``REPORT_LINES``) is read by its full
    template when that matches (every field, typed), else by the report's pattern: the fields it
    names, the splice counters and block index where present, and every other field of the
    template None. Raises ``LogLineError``, with the line's text, for a line that carries a
    marker but lacks what the report needs: skipping it would silently change the accounting.
    """
    line = line.rstrip("\r\n")
    if "Finish: " in line:
        return parse_finish(line)
    for kind, spec in REPORT_LINES.items():
        found = spec.pattern.search(line)
        if found is not None:
            return _report_fields(kind, line, found)
        if spec.marker in line:
            raise LogLineError(f"unreadable {kind} line (the report needs {spec.needs}): {line!r}")
    return None


def _report_fields(kind: str, line: str, found: re.Match) -> dict[str, Any]:
    full = _PATTERNS[kind].search(line)
    if full is not None:
        return {"kind": kind, **{name: _KINDS[k][2](full.group(name)) for name, k in _FIELDS[kind]}}
    parsed: dict[str, Any] = {"kind": kind, **{name: None for name, _ in _FIELDS[kind]}}
    extras = [p.search(line, found.end()) for p in _SPLICE_EXTRAS] if kind == "splice_ok" else []
    kinds = dict(_FIELDS[kind])
    for match in [found, *extras]:
        if match is not None:
            fields = match.groupdict().items()
            parsed.update({name: _read_report_field(kinds[name], text) for name, text in fields})
    return parsed


def _read_report_field(field_kind: str, text: str) -> Any:
    """A field a report pattern matched: ids stay text; numbers are ints; the slot, which the
    report takes as any word, is an int, None or the text as written."""
    return _KINDS[field_kind][2](text) if field_kind in ("word", "opt_word") else _read_scalar(text)


# The id as Python writes a string (``repr``): quotes and escapes included, read with literal_eval.
_FINISH_ID = re.compile(r"""'id': ('(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*")""")
_FINISH_INTS = {name: re.compile(rf"'{name}': (\d+)") for name in ("prompt_tokens", "completion_tokens", "cached_tokens")}


def parse_finish(line: str) -> dict[str, Any] | None:
    """SGLang's request-logger ``Finish:`` line (``--log-requests``, text format) -> counts, or None.

    Reads ``'id'``, ``'prompt_tokens'``, ``'completion_tokens'`` and ``'cached_tokens'`` from the
    ``out=`` dict's ``meta_info`` (§11.5, §12.1); the last two default to 0. A line without both
    an id and ``prompt_tokens`` gives None, as in the report. Under SCR ``cached_tokens`` counts
    every relocated row twice (§12.2): radix matched = cached_tokens - 2 * relocated.
    """
    if "Finish: " not in line:
        return None
    # The request's own fields come first; meta_info is in the out= part, at the end.
    out_at = line.rfind(", out=")
    meta = line[out_at:] if out_at >= 0 else line
    found_id = _FINISH_ID.search(meta)
    found_prompt = _FINISH_INTS["prompt_tokens"].search(meta)
    if found_id is None or found_prompt is None:
        return None
    parsed: dict[str, Any] = {"kind": "finish", "rid": ast.literal_eval(found_id.group(1))}
    for name, pattern in _FINISH_INTS.items():
        found = pattern.search(meta)
        parsed[name] = int(found.group(1)) if found else 0
    return parsed


def trace_tag(text: str) -> str:
    """The ``tag=`` text of ``ev=req`` before ``repr``: decoded first 48 tokens, newlines as spaces, 90 chars."""
    return text.replace("\n", " ")[:90]


def side_buffer_line(slots: int, tokens: int, bytes_per_token: int) -> str:
    """``side buffer:`` with sizes from the K+V bytes per token over all full-attention layers (§5.1)."""
    return format_line("side_buffer", slots=slots, tokens=tokens, gib=slots * tokens * bytes_per_token / 2**30,
                       kib_per_token=bytes_per_token / 1024)


def scr_start_line(enabled: bool, sglang_version: str, env: Mapping[str, str]) -> str:
    """``serve.py``'s line: every ``config.DEFAULTS`` key, in table order, as the process sees it."""
    settings = {key: env.get(key, default) for key, default in AUTHORS_DEFAULTS.items()}
    return format_line("scr_start", state=enabled, sglang_version=sglang_version, settings=settings)


def site_banner(config: ScrConfig, pid: int) -> str:
    """The per-process banner; ``v6``/``pin_only``/``lead_freeze``/``timing`` are constant in this port.

    Booleans are printed ``True``/``False``, as the authors' overlay prints them (template
    ``scr_site``, kind ``flag``). ``timing`` is ``False``: this port prints no profiling lines.
    """
    return format_line(
        "scr_site", v6=True, pin_only=False, lead_freeze=False, ssm_snap=config.ssm_snap, pid=pid,
        no_rerotate=config.no_rerotate, max_sessions=config.max_sessions, fastdiff=config.fastdiff,
        cdc_target=config.cdc_target, fastdiff_min=config.fastdiff_min, timing=False,
        min_extend=config.min_extend, t6_guard=config.t6_guard, trace=config.trace,
        evict_on_fail=config.evict_on_alloc_fail, evict_margin=config.evict_margin,
        max_blocks=config.max_blocks, mb_min_gap=config.mb_min_gap, splice_retry=config.splice_retry,
    )
