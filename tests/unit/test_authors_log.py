"""``scr.authors_log``: the authors' log lines (``docs/scr.md`` §11) byte for byte, parsed back,
SGLang's ``Finish:`` line (§11.5, §12.1), and the start-up lines built from ``ScrConfig``."""
# Spec: docs/scr.md

from __future__ import annotations

import dataclasses
import re

import pytest

from scr import authors_log
from scr.authors_log import (
    TEMPLATES,
    LogLineError,
    escape_word,
    format_line,
    parse_finish,
    parse_line,
    parse_report_line,
)
from scr.settings import ScrConfig

# (kind, values, exact text). Texts are written out from the spec's field lists.
CASES = [
    pytest.param(
        "scr_start",
        {"state": False, "sglang_version": "0.5.16", "settings": {"KVREUSE_ENABLED": "0", "KVREUSE_MAX_BLOCKS": "3"}},
        "[scr] Suffix Cache Reuse off | sglang 0.5.16 (built for 0.5.16) | KVREUSE_ENABLED=0 KVREUSE_MAX_BLOCKS=3",
        id="scr_start",
    ),
    pytest.param(
        "scr_site",
        {"v6": True, "pin_only": False, "lead_freeze": False, "ssm_snap": "release", "pid": 31337, "no_rerotate": True,
         "max_sessions": 256, "fastdiff": False, "cdc_target": 128, "fastdiff_min": 4096, "timing": True,
         "min_extend": 32, "t6_guard": False, "trace": False, "evict_on_fail": False, "evict_margin": 0,
         "max_blocks": 3, "mb_min_gap": 128, "splice_retry": 0},
        "[kvreuse-site] v6.10 splice-after-extend patches applied (per-request knobs via kvreuse_session_id) "
        "(v5 base) v6=True pin_only=False lead_freeze=False ssm_snap=release pid=31337 no_rerotate=True "
        "max_sessions=256 fastdiff=False cdc_target=128 fastdiff_min=4096 timing=True min_extend=32 t6_guard=False "
        "trace=False evict_on_fail=False evict_margin=0 | v6.10k multiblock=1 max_blocks=3 mb_min_gap=128 "
        "splice_retry=0",
        id="scr_site",
    ),
    pytest.param("prefill_hook", {},
                 "[kvreuse] v6.3: prefill-end snapshot hook attached to SchedulerBatchResultProcessor",
                 id="prefill_hook"),
    pytest.param("wrapped_alloc", {"pool_class": "HybridReqToTokenPool"},
                 "[kvreuse] wrapped HybridReqToTokenPool.alloc for state restore", id="wrapped_alloc"),
    pytest.param("ssm_shadow", {"sessions": 12, "gib": 1.5},
                 "[kvreuse] ssm shadow: 12 sessions, 1.50 GiB private (outside the mamba pool)", id="ssm_shadow"),
    pytest.param("side_buffer", {"slots": 12, "tokens": 30000, "gib": 21.97, "kib_per_token": 64.0},
                 "[kvreuse] side buffer: 12 slots x 30000 tokens (21.97 GiB, 64.0 KiB/token)", id="side_buffer"),
    pytest.param(
        "init",
        {"full_attn_layers": 16, "rotary": True, "layers": [3, 7, 11, 15, 19, 23, 27, 31], "pool_slots": 400000,
         "snapshot_budget": 100000, "evict_floor": 80000},
        "[kvreuse] init: full_attn_layers=16 rotary=True layers=[3, 7, 11, 15, 19, 23, 27, 31] pool_slots=400000 "
        "snapshot_budget=100000 evict_floor=80000",
        id="init",
    ),
    pytest.param(
        "trace_req",
        {"rid": "conv-1-turn2", "sid": "s000001", "slot": 0, "n_new": 5321, "n_old": 4800, "nsess": 3,
         "tag": "<|im_start|>system You are"},
        "[kvreuse] kv6trace ev=req rid=conv-1-turn2 sid=s000001 slot=0 n_new=5321 n_old=4800 nsess=3 "
        "tag='<|im_start|>system You are'",
        id="trace_req",
    ),
    pytest.param(
        "trace_req",
        {"rid": "r", "sid": "s000002", "slot": None, "n_new": 10, "n_old": 0, "nsess": 1, "tag": "it's"},
        "[kvreuse] kv6trace ev=req rid=r sid=s000002 slot=None n_new=10 n_old=0 nsess=1 tag=\"it's\"",
        id="trace_req-new-session-no-slot",
    ),
    pytest.param("trace", {"ev": "side_acq", "fields": {"slot": 0, "sid": "s000001", "free": 11}},
                 "[kvreuse] kv6trace ev=side_acq slot=0 sid=s000001 free=11", id="trace-side_acq"),
    pytest.param("trace", {"ev": "side_rel", "fields": {"slot": 0, "sid": "s000001"}},
                 "[kvreuse] kv6trace ev=side_rel slot=0 sid=s000001", id="trace-side_rel"),
    pytest.param("trace", {"ev": "drop_private", "fields": {"sid": "s000001", "slot": None, "n_side": 0}},
                 "[kvreuse] kv6trace ev=drop_private sid=s000001 slot=None n_side=0", id="trace-drop_private"),
    pytest.param("trace", {"ev": "snap", "fields": {"sid": "s000001", "slot": 0, "keep": 1500, "n": 2300, "prev": 2100}},
                 "[kvreuse] kv6trace ev=snap sid=s000001 slot=0 keep=1500 n=2300 prev=2100", id="trace-snap"),
    pytest.param("trace", {"ev": "ssm_save", "fields": {"rid": "r1", "sid": "s000001", "slot": 0, "midx": 5, "n": 2000}},
                 "[kvreuse] kv6trace ev=ssm_save rid=r1 sid=s000001 slot=0 midx=5 n=2000", id="trace-ssm_save"),
    pytest.param(
        "trace",
        {"ev": "ssm_restore", "fields": {"rid": "r1", "slot": 0, "midx": 5, "sid": "s000001", "before": 0.0,
                                         "shadow": 1234.5, "after": 1234.5}},
        "[kvreuse] kv6trace ev=ssm_restore rid=r1 slot=0 midx=5 sid=s000001 before=0.0 shadow=1234.5 after=1234.5",
        id="trace-ssm_restore",
    ),
    pytest.param(
        "splice_ok",
        {"rid": "conv-1-turn2", "sid": "s000001", "slot": 0, "stop": 2000, "relocated": 984, "extend": 1016,
         "live": 4000, "spliced": 7, "spliced_tokens": 6100, "block": 1, "num_blocks": 2},
        "[kvreuse] v6 splice OK: rid=conv-1-turn2 sid=s000001 slot=0 A+B'=2000 C'=984 extend=1016 live=4000 "
        "[spliced=7 tokens=6100] blocks=1/2",
        id="splice_ok",
    ),
    pytest.param("ssm_dropped", {"rid": "stale-2", "sid": "s000004"},
                 "[kvreuse] ssm snapshot dropped: rid=stale-2 sid=s000004 finished before prefill end",
                 id="ssm_dropped"),
    pytest.param("passthrough", {"sid": "s000001", "kept": 2000, "deleted": 0, "inserted": 150},
                 "[kvreuse] s000001 passthrough kept=2000 del=0 ins=150", id="passthrough"),
    pytest.param("deferred_retry", {"rid": "r1", "attempt": 3, "max_attempts": 8},
                 "[kvreuse] kv6 rid=r1 tail DEFERRED-RETRY 3/8 (chunked slot busy)", id="deferred_retry"),
    pytest.param(
        "multiblock_plan",
        {"rid": "r1", "num_blocks": 2, "stops": [2000, 3500], "reloc": [984, 400], "kext": 16, "maxb": 6,
         "cands": 4, "live": 5000},
        "[kvreuse] kv6 rid=r1 multiblock plan: K=2 stops=[2000, 3500] reloc=[984, 400] kext=16 maxb=6 cands=4 "
        "live=5000",
        id="multiblock_plan",
    ),
    pytest.param(
        "phase1",
        {"rid": "r1", "radix_n0": 1024, "chunk1": 976, "n_c": 1000, "total": 4000, "ssm_restore": True,
         "ssm_mode": "fork", "ssm_na": False, "ssm_obj": True},
        "[kvreuse] kv6 rid=r1 phase1 radix_a=1024 chunk1=976 tail=1000 total=4000 ssm_restore=True ssm_mode=fork "
        "ssm_na=False ssm_obj=True",
        id="phase1",
    ),
    pytest.param(
        "phase2",
        {"rid": "r1", "prefilled_chunk1": 976, "reused_tail": 984, "extend2": 1016, "total": 4000, "rot_delta": -100},
        "[kvreuse] kv6 rid=r1 phase2 prefilled_chunk1=976 reused_tail=984 extend2=1016 total=4000 rot_delta=-100",
        id="phase2-negative-shift",
    ),
    pytest.param(
        "multiblock_next",
        {"rid": "r1", "block": 2, "num_blocks": 2, "start": 2984, "end": 3500, "rows": 400},
        "[kvreuse] kv6 rid=r1 multiblock next: block 2/2 extend=[2984,3500) then splice 400 rows",
        id="multiblock_next",
    ),
    pytest.param(
        "multiblock_drop",
        {"rid": "r1", "block": 2, "num_blocks": 3, "stop": 2900, "prefix": 2984, "abandoned": 2},
        "[kvreuse] kv6 rid=r1 multiblock DROP: block 2/3 stop=2900 <= prefix=2984 (or empty); 2 block(s) "
        "abandoned, tail re-prefilled",
        id="multiblock_drop",
    ),
    pytest.param(
        "phase1_aborted",
        {"reason": "admitted extend ends at 900 > |A|+|B'| 800", "aborts": 3},
        "[kvreuse] v6 phase1 aborted (admitted extend ends at 900 > |A|+|B'| 800); normal prefill of the tail "
        "[aborts=3]",
        id="phase1_aborted",
    ),
    pytest.param("phase2_mismatch", {"prefix": 1990, "stop": 2000},
                 "[kvreuse] v6 phase2: prefix 1990 != |A|+|B'| 2000 -> normal prefill of the tail",
                 id="phase2_mismatch"),
    pytest.param("alloc_failed", {"n": 984},
                 "[kvreuse] v6 phase2: alloc(984) failed -> normal prefill of the tail", id="alloc_failed"),
    pytest.param(
        "slot_stolen",
        {"rid": "r1", "slot": 3, "owner": "s000009", "sess": "s000001", "row_start": 1000, "row_end": 1984,
         "ids_match": False, "stolen": 1},
        "[kvreuse] v6 SIDE SLOT STOLEN: rid=r1 slot=3 owner=s000009 sess=s000001 rows=1000:1984 ids_match=False "
        "guard=True -> normal prefill of the tail [stolen=1]",
        id="slot_stolen",
    ),
    pytest.param(
        "slot_stolen",
        {"rid": "r1", "slot": 3, "owner": None, "sess": "s000001", "row_start": 0, "row_end": 84,
         "ids_match": True, "stolen": 2},
        "[kvreuse] v6 SIDE SLOT STOLEN: rid=r1 slot=3 owner=None sess=s000001 rows=0:84 ids_match=True "
        "guard=True -> normal prefill of the tail [stolen=2]",
        id="slot_stolen-free-slot",
    ),
    pytest.param(
        "evict_declined", {"avail": 100, "evictable": 5000, "need": 984, "floor": 80000},
        "[kvreuse] evict-before-fail: declined (avail=100 evictable=5000 need=984 floor=80000)", id="evict_declined",
    ),
    pytest.param(
        "evict_retry", {"requested": 2932, "evicted": 3000, "retry": "OK", "ok": 4, "total": 5},
        "[kvreuse] evict-before-fail: requested=2932 evicted=3000 retry=OK [4/5]", id="evict_retry",
    ),
    pytest.param(
        "drift", {"unaccounted": 984, "first": 984, "max": 1968, "allocs": 12, "alloc_slots": 9000, "side_held": 60000},
        "[kvreuse] DRIFT: 984 slots unaccounted (first=984 max=1968) after 12 freeze allocs / 9000 slots | "
        "side_held=60000",
        id="drift",
    ),
]  # fmt: skip


@pytest.mark.parametrize("kind, values, text", CASES)
def test_format_is_byte_exact(kind, values, text):
    assert format_line(kind, **values) == text


@pytest.mark.parametrize("kind, values, text", CASES)
def test_parse_reads_the_values_back(kind, values, text):
    assert parse_line(text) == {"kind": kind, **values}


@pytest.mark.parametrize("kind, values, text", CASES)
def test_parse_ignores_a_leading_prefix_and_the_newline(kind, values, text):
    assert parse_line(f"[2026-01-01 12:00:00 TP0] {text}\n") == {"kind": kind, **values}


def test_every_template_has_a_case():
    assert {case.values[0] for case in CASES} == set(TEMPLATES)


def test_every_trace_event_has_a_case():
    events = {case.values[1]["ev"] for case in CASES if case.values[0] == "trace"}
    assert events == set(authors_log.TRACE_FIELDS)


# ---------------------------------------------------------------------- helpers


@pytest.mark.parametrize(
    "text, expected",
    [
        pytest.param("hello", "hello", id="short"),
        pytest.param("a\nb\n", "a b ", id="newlines-to-spaces"),
        pytest.param("x" * 100, "x" * 90, id="cut-to-90"),
        pytest.param("\n" * 95, " " * 90, id="newlines-then-cut"),
    ],
)
def test_trace_tag(text, expected):
    assert authors_log.trace_tag(text) == expected


def test_trace_tag_round_trips_through_the_req_line():
    tag = authors_log.trace_tag("<|im_start|>system\nYou are a 'helpful' \"agent\"\t\u00e9")
    line = format_line("trace_req", rid="r", sid="s000001", slot=1, n_new=1, n_old=0, nsess=1, tag=tag)
    assert parse_line(line)["tag"] == "<|im_start|>system You are a 'helpful' \"agent\"\t\u00e9"


def test_side_buffer_line_from_bytes_per_token():
    # §5.1: Qwen3.6-27B, 16 full-attention layers x (K+V) x 2 KiB = 64 KiB per token.
    assert authors_log.side_buffer_line(12, 30000, 16 * 2 * 2048) == (
        "[kvreuse] side buffer: 12 slots x 30000 tokens (21.97 GiB, 64.0 KiB/token)"
    )


# ---------------------------------------------------------------------- formatter errors


@pytest.mark.parametrize(
    "kind, values, error, message",
    [
        pytest.param("trace", {"ev": "snap", "fields": {"slot": 0, "sid": "s1", "keep": 0, "n": 1, "prev": 0}},
                     ValueError,
                     "kv6trace ev=snap: fields must be ('sid', 'slot', 'keep', 'n', 'prev'), in that order; "
                     "got ('slot', 'sid', 'keep', 'n', 'prev')",
                     id="trace-field-order"),
        pytest.param("trace", {"ev": "req", "fields": {"rid": "r"}}, ValueError,
                     "ev=req has its own template: format_line('trace_req', ...)", id="trace-req-generic"),
        pytest.param("alloc_failed", {"n": True}, TypeError, "expected an int, got True", id="int-bool"),
        pytest.param("alloc_failed", {"n": "984"}, TypeError, "expected an int, got '984'", id="int-str"),
        pytest.param("ssm_dropped", {"rid": "", "sid": "s1"}, ValueError,
                     "a word field cannot be empty", id="word-empty"),
        pytest.param("trace", {"ev": "custom", "fields": {"k": ""}}, ValueError,
                     "a word field cannot be empty", id="kvs-empty"),
    ],
)  # fmt: skip
def test_format_errors(kind, values, error, message):
    with pytest.raises(error) as info:
        format_line(kind, **values)
    assert str(info.value) == message


def test_format_requires_every_field():
    with pytest.raises(KeyError):
        format_line("alloc_failed")


def test_unknown_trace_event_keeps_its_fields():
    line = format_line("trace", ev="custom", fields={"a": 1, "b": "x", "c": None, "d": 0.5, "e": True})
    assert line == "[kvreuse] kv6trace ev=custom a=1 b=x c=None d=0.5 e=True"
    assert parse_line(line) == {"kind": "trace", "ev": "custom", "fields": {"a": 1, "b": "x", "c": None, "d": 0.5, "e": True}}


# ---------------------------------------------------------------------- the spec's own text


@pytest.mark.parametrize(
    "line, expected",
    [
        # §11.1 / H4: quoted verbatim.
        pytest.param("[kvreuse] v6.3: prefill-end snapshot hook attached to SchedulerBatchResultProcessor",
                     {"kind": "prefill_hook"}, id="prefill-hook-line"),
        # §5.1: "12 slots x 30000 tokens (21.97 GiB, 64.0 KiB/token)" (the README figure).
        pytest.param("[kvreuse] side buffer: 12 slots x 30000 tokens (21.97 GiB, 64.0 KiB/token)",
                     {"kind": "side_buffer", "slots": 12, "tokens": 30000, "gib": 21.97, "kib_per_token": 64.0},
                     id="side-buffer-readme"),
        # §9.2 / §13.3: "ssm snapshot dropped: rid=<rid> sid=<sid> finished before prefill end".
        pytest.param("[kvreuse] ssm snapshot dropped: rid=reg-tenant-s-turn2 sid=s000003 finished before prefill end",
                     {"kind": "ssm_dropped", "rid": "reg-tenant-s-turn2", "sid": "s000003"}, id="ssm-dropped"),
        # §10.2 abort reasons, verbatim.
        pytest.param("[kvreuse] v6 phase1 aborted (another request is already chunked); normal prefill of the tail [aborts=1]",
                     {"kind": "phase1_aborted", "reason": "another request is already chunked", "aborts": 1},
                     id="abort-already-chunked"),
        pytest.param("[kvreuse] v6 phase1 aborted (another request became the chunked request); normal prefill of the tail [aborts=2]",
                     {"kind": "phase1_aborted", "reason": "another request became the chunked request", "aborts": 2},
                     id="abort-became-chunked"),
        pytest.param("[kvreuse] v6 phase1 aborted (re-entered with prefix 2100 beyond |A|+|B'| 2000); normal prefill of the tail [aborts=3]",
                     {"kind": "phase1_aborted", "reason": "re-entered with prefix 2100 beyond |A|+|B'| 2000", "aborts": 3},
                     id="abort-reentered"),
    ],
)  # fmt: skip
def test_spec_lines(line, expected):
    assert parse_line(line) == expected


@pytest.mark.parametrize(
    "line",
    [
        pytest.param("", id="empty"),
        pytest.param("[2026-01-01 12:00:00] Prefill batch, #new-seq: 1, #new-token: 512", id="sglang-line"),
        pytest.param("[kvreuse] something new", id="unknown-kvreuse-line"),
        pytest.param("[kvreuse] v6 splice OK: rid=r1 sid=s1 slot=0 A+B'=x C'=1", id="malformed-splice"),
        pytest.param("[kvreuse] v6 phase2: alloc(984) failed -> normal prefill of the tail; extra", id="trailing-text"),
    ],
)
def test_not_our_lines(line):
    assert parse_line(line) is None


# ---------------------------------------------------------------------- read as the authors' report reads

# The authors' banner, written out from docs/scr.md §11.1 with Python booleans, as their overlay prints them.
AUTHORS_BANNER = (
    "[kvreuse-site] v6.10 splice-after-extend patches applied (per-request knobs via kvreuse_session_id) (v5 base) "
    "v6=True pin_only=False lead_freeze=False ssm_snap=prefill_end pid=812 no_rerotate=False max_sessions=16 "
    "fastdiff=True cdc_target=64 fastdiff_min=2048 timing=False min_extend=16 t6_guard=True trace=True "
    "evict_on_fail=True evict_margin=2048 | v6.10k multiblock=1 max_blocks=6 mb_min_gap=0 splice_retry=8"
)


@pytest.mark.parametrize("spelling", ["python", "digits"])
def test_banner_booleans_read_either_way(spelling):
    line = AUTHORS_BANNER if spelling == "python" else (
        AUTHORS_BANNER.replace("=True", "=1").replace("=False", "=0"))
    parsed = parse_line(line)
    assert parsed["kind"] == "scr_site" and (parsed["v6"], parsed["pin_only"], parsed["trace"]) == (True, False, True)
    assert (parsed["max_blocks"], parsed["splice_retry"]) == (6, 8)
    assert parse_report_line(line) == parsed


SPLICE_NONE = {"extend": None, "live": None, "spliced": None, "spliced_tokens": None, "block": None, "num_blocks": None}


@pytest.mark.parametrize(
    "line, expected",
    [
        pytest.param("[2026-01-01 12:00:00 TP0] " + AUTHORS_BANNER,
                     {"kind": "scr_site", "v6": True, "pin_only": False, "lead_freeze": False,
                      "ssm_snap": "prefill_end", "pid": 812, "no_rerotate": False, "max_sessions": 16,
                      "fastdiff": True, "cdc_target": 64, "fastdiff_min": 2048, "timing": False, "min_extend": 16,
                      "t6_guard": True, "trace": True, "evict_on_fail": True, "evict_margin": 2048, "max_blocks": 6,
                      "mb_min_gap": 0, "splice_retry": 8}, id="authors-banner"),
        pytest.param("[kvreuse-site] v6.11 patches applied (knobs via cache_salt) max_blocks=3 mode=x retry splice_retry=0",
                     {"kind": "scr_site", **{name: None for name, _ in authors_log._FIELDS["scr_site"]},
                      "max_blocks": 3, "splice_retry": 0}, id="banner-other-text-and-fields"),
        pytest.param("[kvreuse] v6 splice OK: rid=c-2 sid=s000001 slot=0 A+B'=2000 C'=984 extend=1016 live=4000 "
                     "[spliced=7 tokens=6100] blocks=1/2",
                     {"kind": "splice_ok", "rid": "c-2", "sid": "s000001", "slot": 0, "stop": 2000, "relocated": 984,
                      "extend": 1016, "live": 4000, "spliced": 7, "spliced_tokens": 6100, "block": 1, "num_blocks": 2},
                     id="splice-spec-form"),
        pytest.param("[kvreuse] v6 splice OK (multiblock): rid=c-2 lead=9 sid=s000001 slot=3 rot=-12 A+B'=2000 "
                     "kext=16 C'=984 extend=1016 live=4000 [spliced=7 tokens=6100] ssm=fork blocks=2/2",
                     {"kind": "splice_ok", "rid": "c-2", "sid": "s000001", "slot": 3, "stop": 2000, "relocated": 984,
                      **SPLICE_NONE, "spliced": 7, "spliced_tokens": 6100, "block": 2, "num_blocks": 2},
                     id="splice-fields-in-between"),
        pytest.param("[kvreuse] v6 splice OK: rid=17 sid=s000001 slot=None A+B'=2000 C'=984",
                     {"kind": "splice_ok", "rid": "17", "sid": "s000001", "slot": None, "stop": 2000, "relocated": 984,
                      **SPLICE_NONE}, id="splice-only-what-the-report-needs"),
        pytest.param("[kvreuse] kv6trace ev=req rid=c-2 sid=s000001 slot=None n_new=5321 n_old=4800 nsess=3 "
                     "tag='<|im_start|>system You are a helpful assis",
                     {"kind": "trace_req", "rid": "c-2", "sid": "s000001", "slot": None, "n_new": 5321, "n_old": 4800,
                      "nsess": None, "tag": None}, id="trace-req-tag-cut-after-repr"),
        pytest.param("[kvreuse] kv6 rid=r1 multiblock plan: K=2 stops=[2000, 3500] reloc=[984, 400] kext=16",
                     None, id="unrelated-debug-line"),
        pytest.param("[kvreuse] kv6trace ev=side_acq slot=0 sid=s000001 free=11", None, id="other-trace-event"),
        pytest.param("[kvreuse] v6 phase2: alloc(984) failed -> normal prefill of the tail", None, id="phase2-line"),
        pytest.param("[kvreuse] something new", None, id="unknown-kvreuse-line"),
        pytest.param("[2026-01-01 12:00:00] Prefill batch, #new-seq: 1, #new-token: 512", None, id="sglang-line"),
    ],
)  # fmt: skip
def test_report_reading_accepts_what_the_authors_report_accepts(line, expected):
    assert parse_report_line(line) == expected


@pytest.mark.parametrize(
    "line",
    [
        pytest.param("[kvreuse-site] v6.10 splice-after-extend patches applied max_blocks=six splice_retry=8",
                     id="banner-non-integer-K"),
        pytest.param("[kvreuse-site] v6.10 splice-after-extend patches applied max_blocks=6", id="banner-no-retry"),
        pytest.param("[kvreuse-site] splice_retry=8 max_blocks=6", id="banner-wrong-order"),
        pytest.param("[kvreuse] v6 splice OK: rid=r1 sid=s1 slot=0 A+B'=x C'=1", id="splice-non-integer-stop"),
        pytest.param("[kvreuse] v6 splice OK: rid=r1 sid=s1 slot=0 A+B'=10", id="splice-no-rows"),
        pytest.param("[kvreuse] v6 splice OK: sid=s1 rid=r1 slot=0 A+B'=10 C'=1", id="splice-wrong-order"),
        pytest.param("[kvreuse] kv6trace ev=req rid=r1 sid=s1 slot=0 n_new=10", id="trace-req-no-n_old"),
    ],
)  # fmt: skip
def test_report_reading_refuses_a_garbled_line_it_recognises(line):
    with pytest.raises(LogLineError) as info:
        parse_report_line("[2026-01-01 12:00:00 TP0] " + line + "\n")
    assert repr("[2026-01-01 12:00:00 TP0] " + line) in str(info.value)


# ---------------------------------------------------------------------- SGLang's Finish: line

# Produced by SGLang 0.5.16's own RequestLogger formatting at --log-requests-level 0
# (srt/utils/request_logger.py, _dataclass_to_string_truncated), behind the main process's
# "[%(asctime)s] " log prefix; values chosen for the test.
FINISH = (
    "[2026-01-01 12:00:00] Finish: obj=GenerateReqInput(rid='conv-7-turn2', session_id=None, mm_hashes=None, "
    "use_audio_in_video=False, return_logprob=None, logprob_start_len=None, top_logprobs_num=None, "
    "token_ids_logprob=None, return_sampling_mask=None, return_text_in_logprobs=False, stream=False, "
    "log_metrics=True, return_hidden_states=False, return_routed_experts=False, routed_experts_start_len=0, "
    "return_indexer_topk=False, modalities=None, session_params=None, lora_id=None, custom_logit_processor=None, "
    "positional_embed_overrides=None, bootstrap_host=None, bootstrap_port=None, bootstrap_room=None, "
    "bootstrap_pair_key=None, decode_tp_size=None, routed_dp_rank=None, disagg_prefill_dp_rank=None, "
    "routing_key=None, conversation_id=None, http_worker_ipc=None, background=False, require_reasoning=False, "
    "priority=None, extra_key=None, no_logs=False, custom_labels=None, return_bytes=False, return_entropy=False, "
    "return_prompt_token_ids=False, external_trace_header=None, received_time=None, need_wait_for_mm_inputs=None, "
    "num_items_assigned=None, encoder_urls=None, max_dynamic_patch=None, min_dynamic_patch=None, "
    "image_max_dynamic_patch=None, video_max_dynamic_patch=None, images_config=None, "
    "multi_item_delimiter_indices=None), out={'meta_info': {'id': 'conv-7-turn2', 'finish_reason': "
    "{'type': 'length', 'length': 48}, 'prompt_tokens': 5321, 'weight_version': 'default', 'num_retractions': 0, "
    "'completion_tokens': 48, 'cached_tokens': 4100, 'reasoning_tokens': 0, 'e2e_latency': 1.25, "
    "'response_sent_to_client_ts': 1760000000.5}}"
)


@pytest.mark.parametrize(
    "line, expected",
    [
        pytest.param(FINISH, {"kind": "finish", "rid": "conv-7-turn2", "prompt_tokens": 5321,
                              "completion_tokens": 48, "cached_tokens": 4100}, id="sglang-0.5.16-level-0"),
        pytest.param("Finish: obj=X(), out={'meta_info': {'id': 'r9', 'prompt_tokens': 12}}",
                     {"kind": "finish", "rid": "r9", "prompt_tokens": 12, "completion_tokens": 0, "cached_tokens": 0},
                     id="missing-counts-default-0"),
        pytest.param("Finish: obj=X(), out={'meta_info': {'id': \"it's\", 'prompt_tokens': 3, 'cached_tokens': 2}}",
                     {"kind": "finish", "rid": "it's", "prompt_tokens": 3, "completion_tokens": 0, "cached_tokens": 2},
                     id="double-quoted-rid"),
        pytest.param("Finish: obj=X(custom_labels={'id': 'label'}), out={'meta_info': {'id': 'r2', 'prompt_tokens': 7, "
                     "'cached_tokens_details': {'device': 5}, 'cached_tokens': 5}}",
                     {"kind": "finish", "rid": "r2", "prompt_tokens": 7, "completion_tokens": 0, "cached_tokens": 5},
                     id="reads-the-out-part-and-not-cached_tokens_details"),
        pytest.param("Finish: obj=X(), out={'meta_info': {'prompt_tokens': 12}}", None, id="no-id"),
        pytest.param("Finish: obj=X(), out={'meta_info': {'id': 'r9'}}", None, id="no-prompt_tokens"),
    ],
)  # fmt: skip
def test_finish(line, expected):
    assert parse_line(line) == expected
    assert parse_finish(line) == expected


def test_parse_finish_ignores_other_lines():
    assert parse_finish("[kvreuse] v6 phase2: alloc(984) failed -> normal prefill of the tail") is None


def test_site_banner_defaults():
    assert authors_log.site_banner(ScrConfig(), 4242) == (
        "[kvreuse-site] v6.10 splice-after-extend patches applied (per-request knobs via kvreuse_session_id) "
        "(v5 base) v6=True pin_only=False lead_freeze=False ssm_snap=prefill_end pid=4242 no_rerotate=False "
        "max_sessions=16 fastdiff=True cdc_target=64 fastdiff_min=2048 timing=False min_extend=16 t6_guard=True "
        "trace=True evict_on_fail=True evict_margin=2048 | v6.10k multiblock=1 max_blocks=6 mb_min_gap=0 "
        "splice_retry=8"
    )


def test_site_banner_round_trip_with_other_values():
    config = dataclasses.replace(ScrConfig(), max_blocks=3, splice_retry=0, ssm_snap="release", no_rerotate=True)
    parsed = parse_line(authors_log.site_banner(config, 7))
    assert (parsed["kind"], parsed["max_blocks"], parsed["splice_retry"], parsed["ssm_snap"]) == (
        "scr_site", 3, 0, "release",
    )
    assert (parsed["no_rerotate"], parsed["pid"], parsed["v6"], parsed["pin_only"]) == (True, 7, True, False)
    assert authors_log.parse_report_line(authors_log.site_banner(config, 7)) == parsed


def test_scr_start_line_prints_config_defaults_in_table_order():
    line = authors_log.scr_start_line(True, "0.5.16", {"KVREUSE_MAX_BLOCKS": "3", "OTHER": "x"})
    assert line == (
        "[scr] Suffix Cache Reuse on | sglang 0.5.16 (built for 0.5.16) | KVREUSE_ENABLED=1 KVREUSE_MAX_BLOCKS=3 "
        "KVREUSE_SPLICE_RETRY=8 KVREUSE_MB_MIN_GAP=0 KVREUSE_V6_MIN_EXTEND=16 KVREUSE_SSM_MODE=fork KVREUSE_FORCE=1 "
        "KVREUSE_MIN_EXTRA_TOKENS=1024 KVREUSE_MIN_EXTRA_FRAC=0.15 KVREUSE_MAX_SESSIONS=16 KVREUSE_SIDE_SESSIONS=12 "
        "KVREUSE_SIDE_TOKENS=30000 KVREUSE_BUDGET_FRAC=0.25 KVREUSE_TRACE=1 KVREUSE_DEBUG=1"
    )
    assert parse_line(line)["settings"]["KVREUSE_MAX_BLOCKS"] == "3"


def test_banner_starts_with_the_spec_prefix():
    prefix = (
        "[kvreuse-site] v6.10 splice-after-extend patches applied (per-request knobs via kvreuse_session_id) "
        "(v5 base) "
    )
    assert authors_log.site_banner(ScrConfig(), 1).startswith(prefix + "v6=")


def test_lines_satisfy_the_report_field_order():
    # §11.1-§11.3: what analysis/scr_report.py's regexes require of each line.
    banner = authors_log.site_banner(ScrConfig(), 1)
    assert re.search(r"\[kvreuse-site\] .*max_blocks=(\d+).*splice_retry=(\d+)", banner).groups() == ("6", "8")
    req = format_line("trace_req", rid="r1", sid="s000001", slot=None, n_new=9, n_old=4, nsess=2, tag="t")
    assert re.search(r"kv6trace ev=req rid=(\S+) sid=(\S+) slot=(\S+) n_new=(\d+) n_old=(\d+)", req).groups() == (
        "r1", "s000001", "None", "9", "4",
    )
    splice = format_line("splice_ok", rid="r1", sid="s000001", slot=0, stop=10, relocated=84, extend=16, live=200,
                         spliced=1, spliced_tokens=84, block=1, num_blocks=1)
    assert re.search(r"v6 splice OK: rid=(\S+) sid=(\S+) slot=(\S+) A\+B'=(\d+) C'=(\d+)", splice).groups() == (
        "r1", "s000001", "0", "10", "84",
    )


# ------------------------------------------------------------------------ request ids in log lines

ODD_RIDS = ["a b", "a\nFinish: rid=evil prompt_tokens=9", "q'uote\"d", "ünïcødé-日本", "50%off", "%41", "tab\there",
            "line\u2028sep", "x=y", "trail "]


@pytest.mark.parametrize("rid", ODD_RIDS)
def test_any_rid_is_one_word_that_reads_back(rid):
    """A rid with spaces, line breaks, quotes, ``%`` or non-ASCII is written as one word with no
    line break (``escape_word``) and every reader gets the same rid back."""
    line = format_line("splice_ok", rid=rid, sid="s000001", slot=2, stop=100, relocated=50, extend=10, live=1,
                       spliced=1, spliced_tokens=50, block=1, num_blocks=1)
    assert len(line.splitlines()) == 1 and " " not in line.split("rid=", 1)[1].split(" sid=", 1)[0]
    assert parse_line(line)["rid"] == rid
    assert parse_report_line(line)["rid"] == rid
    trace = format_line("trace", ev="ssm_save", fields={"rid": rid, "sid": "s1", "slot": 1, "midx": 2, "n": 3})
    assert len(trace.splitlines()) == 1 and parse_line(trace)["fields"]["rid"] == rid


@pytest.mark.parametrize("rid", ODD_RIDS)
def test_finish_lines_read_back_any_rid(rid):
    """SGLang writes the rid with ``repr``: quotes and escapes are read as Python reads them."""
    line = (f"[2026-12-03 09:00:00] Finish: obj=GenerateReqInput(rid={rid!r}), out={{'meta_info': "
            f"{{'id': {rid!r}, 'prompt_tokens': 7, 'cached_tokens': 3}}}}")
    parsed = parse_finish(line)
    assert parsed["rid"] == rid and parsed["prompt_tokens"] == 7 and parsed["cached_tokens"] == 3


def test_ordinary_rids_are_written_as_they_are():
    """The authors' report matches ``rid=(\\S+)`` with SGLang's ids: ordinary ids must not change."""
    for rid in ("bcp-17.3", "3f2a9c0d1e", "soak0xab12.c0001.4", "a_b:c/d"):
        assert escape_word(rid) == rid
    assert escape_word("a b") == "a%20b" and escape_word("%") == "%25"
