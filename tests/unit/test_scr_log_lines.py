"""``scr.log_lines``: the start-up lines built from ``scr.config``, and the re-export of every
format and parser from ``policy.log_lines`` (the scr glue imports them from ``scr.log_lines``)."""

from __future__ import annotations

import dataclasses
import re

import pytest

import policy.log_lines
from scr import log_lines
from scr.config import ScrConfig
from scr.log_lines import format_line, parse_line


@pytest.mark.parametrize("name", [
    "SGLANG_TARGET", "TEMPLATES", "TRACE_FIELDS", "format_line", "parse_line", "parse_finish", "trace_tag",
    "side_buffer_line", "_KINDS", "_PATTERNS", "_FIELDS", "_parts", "_compile", "_SITE_HEAD",
    "parse_report_line", "LogLineError", "REPORT_LINES",
])
def test_reexports_the_policy_module(name):
    assert getattr(log_lines, name) is getattr(policy.log_lines, name)


def test_policy_module_is_standard_library_only():
    source = open(policy.log_lines.__file__).read()
    assert "import scr" not in source and "from scr" not in source


def test_site_banner_defaults():
    assert log_lines.site_banner(ScrConfig(), 4242) == (
        "[kvreuse-site] v6.10 splice-after-extend patches applied (per-request knobs via kvreuse_session_id) "
        "(v5 base) v6=True pin_only=False lead_freeze=False ssm_snap=prefill_end pid=4242 no_rerotate=False "
        "max_sessions=16 fastdiff=True cdc_target=64 fastdiff_min=2048 timing=False min_extend=16 t6_guard=True "
        "trace=True evict_on_fail=True evict_margin=2048 | v6.10k multiblock=1 max_blocks=6 mb_min_gap=0 "
        "splice_retry=8"
    )


def test_site_banner_round_trip_with_other_values():
    config = dataclasses.replace(ScrConfig(), max_blocks=3, splice_retry=0, ssm_snap="release", no_rerotate=True)
    parsed = parse_line(log_lines.site_banner(config, 7))
    assert (parsed["kind"], parsed["max_blocks"], parsed["splice_retry"], parsed["ssm_snap"]) == (
        "scr_site", 3, 0, "release",
    )
    assert (parsed["no_rerotate"], parsed["pid"], parsed["v6"], parsed["pin_only"]) == (True, 7, True, False)
    assert log_lines.parse_report_line(log_lines.site_banner(config, 7)) == parsed


def test_scr_start_line_prints_config_defaults_in_table_order():
    line = log_lines.scr_start_line(True, "0.5.16", {"KVREUSE_MAX_BLOCKS": "3", "OTHER": "x"})
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
    assert log_lines.site_banner(ScrConfig(), 1).startswith(prefix + "v6=")


def test_lines_satisfy_the_report_field_order():
    # §11.1-§11.3: what analysis/scr_report.py's regexes require of each line.
    banner = log_lines.site_banner(ScrConfig(), 1)
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
