"""scr/lines.py: the step carrier's lines, byte for byte (the accounting and the tests parse them)."""

from __future__ import annotations

import pytest

from scr import lines
from scr.cursor import NextBlock, Relocation, RelocationCursor
from scr.execution import Counters, RelocationProgress
from scr.gates import Gate
from scr.intercept import Intercept
from scr.memory import GIB, ScrMemory
from scr.planner import Block
from scr.sessions import SessionAdmission, MatchReport, Session
from scr.settings import ScrConfig

B1 = Block(1700, 1500, 1284, 1300, 2800)
B2 = Block(3300, 3000, 400, 416, 3416)


@pytest.fixture
def state():
    session = Session("s000001", None, side_slot=2, state_tokens=1500)
    admission = SessionAdmission(session, False, tuple(range(10)), 3, (), MatchReport(session, "matched"))
    outcome = Intercept("plan", ScrConfig(), admission, kept=2800, blocks=(B1, B2), resume_limit=1500, side_slot=2)
    request = RelocationProgress("s000001", outcome, gate=Gate(True, restore=True), tree_hit=1024)
    request.cursor = RelocationCursor(outcome.blocks, 1500, 8, True)
    return request


def test_startup_lines():
    got = lines.startup_lines(ScrConfig(), "0.5.16", 42, {}, bytes_per_token=128, shadow_gib=0.5, layers=[3, 7],
                              rotary=True, pool_slots=10000)
    assert got[2:] == [
        "[kvreuse] side buffer: 12 slots x 30000 tokens (0.04 GiB, 0.1 KiB/token)",
        "[kvreuse] ssm shadow: 12 sessions, 0.50 GiB private (outside the mamba pool)",
        "[kvreuse] init: full_attn_layers=2 rotary=True layers=[3, 7] pool_slots=10000 snapshot_budget=360000 "
        "evict_floor=2000",
    ]
    assert got[0].startswith("[scr] Suffix Cache Reuse on | sglang 0.5.16") and "KVREUSE_MAX_BLOCKS=6" in got[0]
    assert "pid=42" in got[1]
    dense = lines.startup_lines(ScrConfig(), "0.5.16", 42, {}, bytes_per_token=128, shadow_gib=None, layers=[3],
                                rotary=True, pool_slots=100)
    assert len(dense) == 4 and not any("ssm shadow" in line for line in dense)
    off = lines.startup_lines(ScrConfig(enabled=False), "0.5.16", 42, {}, bytes_per_token=None, shadow_gib=None,
                              layers=[3], rotary=True, pool_slots=100)
    assert off[0].startswith("[scr] Suffix Cache Reuse off") and not any("side buffer" in line for line in off)
    assert len(off) == 3


def test_memory_lines():
    memory = ScrMemory(12, 30000, 65536, 153_944_064)
    assert lines.memory_fits(memory, 40 * GIB, 3 * GIB, "cuda:0") == (
        "scr: allocating 23.69 GiB on cuda:0 outside SGLang's pools (side buffer 21.97 GiB = 12 slots x 30000 tokens "
        "x 64.0 KiB/token, state shadow 1.72 GiB = 12 slots x 146.8 MiB); 40.00 GiB free, 3.00 GiB kept for "
        "activations")
    assert lines.memory_off(memory) == ("scr: switched off (enabled=False): no side buffer or state shadow allocated "
                                        "(switched on, they would take 23.69 GiB)")
    assert lines.memory_unknown(ScrMemory(2, 10, 1024), "cpu").endswith(
        "(side buffer 0.00 GiB = 2 slots x 10 tokens x 1.0 KiB/token) unchecked: the free memory there is unknown")


def test_authors_env_prefers_settings_over_the_environment():
    env = lines.authors_env(ScrConfig(max_blocks=3, trace=False), {"KVREUSE_MAX_BLOCKS": "9", "OTHER": "x"})
    assert (env["KVREUSE_MAX_BLOCKS"], env["KVREUSE_TRACE"], env["OTHER"]) == ("3", "0", "x")


def test_plan_lines(state):
    assert lines.multiblock_plan("r1", state.outcome, 4000) == (
        "[kvreuse] kv6 rid=r1 multiblock plan: K=2 stops=[1500, 3000] reloc=[1284, 400] kext=16 maxb=6 cands=2 live=4000")
    assert lines.phase1("r1", state, 4000, True, True) == (
        "[kvreuse] kv6 rid=r1 phase1 radix_a=1024 chunk1=476 tail=1300 total=4000 ssm_restore=True ssm_mode=fork "
        "ssm_na=False ssm_obj=True")
    assert lines.trace_request("r1", state.outcome, 4000, "hello") == (
        "[kvreuse] kv6trace ev=req rid=r1 sid=s000001 slot=2 n_new=4000 n_old=10 nsess=3 tag='hello'")


def test_relocation_lines(state):
    assert lines.relocated("r1", state, Relocation(B1, 1, True), 1500, 4000, Counters(1, 1284)) == [
        "[kvreuse] kv6 rid=r1 phase2 prefilled_chunk1=476 reused_tail=1284 extend2=1216 total=4000 rot_delta=-200",
        "[kvreuse] v6 splice OK: rid=r1 sid=s000001 slot=2 A+B'=1500 C'=1284 extend=1216 live=4000 "
        "[spliced=1 tokens=1284] blocks=1/2",
    ]
    second = lines.relocated("r1", state, Relocation(B2, 2, False), 3000, 4000, Counters(2, 1684))
    assert "prefilled_chunk1=0 " in second[0] and "blocks=2/2" in second[1]
    assert lines.next_block("r1", NextBlock(3000, B2, 2, 0), 2, 2784) == (
        "[kvreuse] kv6 rid=r1 multiblock next: block 2/2 extend=[2784,3000) then splice 400 rows")
    assert lines.next_block("r1", NextBlock(None, B2, 2, 1), 2, 2784) == (
        "[kvreuse] kv6 rid=r1 multiblock DROP: block 2/2 stop=3000 <= prefix=2784 (or empty); 1 block(s) abandoned, "
        "tail re-prefilled")
    assert lines.slot_stolen("r1", state, 1700, 1284, "s000009", False, 3) == (
        "[kvreuse] v6 SIDE SLOT STOLEN: rid=r1 slot=2 owner=s000009 sess=s000001 rows=1700:2984 ids_match=False "
        "guard=True -> normal prefill of the tail [stolen=3]")
