"""scr/intercept.py and scr/cursor.py: a request's SCR outcome and the execution of its plan."""

from __future__ import annotations

import random

import pytest

from scr.cursor import Decision, NextBlock, Relocation, RelocationCursor, phase1_step
from scr.intercept import intercept
from scr.knobs import parse_request_knobs
from scr.planner import Block
from scr.sessions import SessionTable
from scr.settings import ScrConfig

CFG = ScrConfig(side_sessions=2, side_tokens=5000)


def tokens(seed, n):
    rng = random.Random(seed)
    return [rng.randrange(100, 50000) for _ in range(n)]


def served(table, prompt, reply, salt=None):
    """Serve one turn: intercept, then the release that stores prompt + reply in the side slot."""
    result = intercept(table, prompt, parse_request_knobs(salt), CFG)
    if result.admission is not None:
        table.finish(result.sid, list(prompt) + list(reply))
    return result


def test_turns_of_an_editing_conversation():
    table = SessionTable(CFG)
    doc = tokens(1, 3000)
    first = served(table, doc, tokens(2, 20))
    assert (first.kind, first.n_old) == ("cold", 0)
    # Turn 2: a 200-token section deleted from the middle, a new message appended.
    turn2 = doc[:1500] + doc[1700:] + tokens(3, 50)
    second = served(table, turn2, tokens(4, 20))
    assert second.kind == "plan" and second.sid == first.sid
    assert (second.kept, second.deleted, second.inserted) == (2800, 200, 50)
    assert second.resume_limit == 1500
    # One block: old [1700, 3000) -> new [1500, 2800), its last 16 tokens forwarded.
    assert second.blocks == (Block(old_start=1700, new_start=1500, num_rows=1284, n_c=1300, new_end=2800),)
    assert second.relocated_rows == 1284


@pytest.mark.parametrize(
    "salt, expected_kind",
    [("kvreuse:off", "off"), (None, "passthrough")],
    ids=["switch-off", "pure-append-passthrough"],
)
def test_off_and_passthrough(salt, expected_kind):
    table = SessionTable(CFG)
    doc = tokens(5, 2000)
    served(table, doc, [])
    result = served(table, doc + tokens(6, 100), [], salt=None if salt is None else salt)
    assert result.kind == expected_kind
    if salt == "kvreuse:off":
        assert result.admission is None and len(table) == 1


def test_salts_never_share_a_session():
    table = SessionTable(CFG)
    doc = tokens(7, 3000)
    served(table, doc, [], salt="tenant-a")
    edited = doc[:1500] + doc[1700:] + tokens(8, 50)
    other = served(table, edited, [], salt="tenant-b")
    assert other.kind == "cold"


def blocks_two():
    return (Block(1700, 1500, 1284, 1300, 2800), Block(3300, 3000, 400, 416, 3416))


def test_cursor_reads_to_each_stop_then_relocates():
    cursor = RelocationCursor(blocks_two(), resume_limit=1500, max_retries=8, restore=True)
    assert cursor.decide(tree_hit=1024, chunked_slot_busy=False, gate_allows=True) == Decision("phase1")
    assert cursor.at_prefix(1200) == "read"
    assert cursor.at_prefix(1500) == Relocation(blocks_two()[0], 1, arm_restore=True)
    assert cursor.after_relocation() == NextBlock(3000, blocks_two()[1], 2, 0)
    assert cursor.at_prefix(2900) == "read"
    assert cursor.at_prefix(3000) == Relocation(blocks_two()[1], 2, arm_restore=False)
    assert cursor.after_relocation() == NextBlock(None, None, 0, 0)


def test_cursor_deferrals_and_direct_relocation():
    cursor = RelocationCursor(blocks_two(), resume_limit=1500, max_retries=2, restore=False)
    assert cursor.decide(0, True, True) == Decision("retry", "chunked slot busy (1/2)")
    assert cursor.decide(0, True, True) == Decision("retry", "chunked slot busy (2/2)")
    assert cursor.decide(0, True, True) == Decision("drop", "chunked slot busy")
    late = RelocationCursor(blocks_two(), resume_limit=1500, max_retries=8, restore=False)
    assert late.decide(1600, False, True) == Decision("drop", "radix match 1600 past the lead 1500")
    gated = RelocationCursor(blocks_two(), resume_limit=1500, max_retries=8, restore=False)
    assert gated.decide(100, False, False) == Decision("gated")
    direct = RelocationCursor(blocks_two(), resume_limit=1500, max_retries=8, restore=False)
    assert direct.decide(1500, False, True) == Decision("relocate_now")


def test_cursor_abort_and_multiblock_drop():
    cursor = RelocationCursor(blocks_two(), resume_limit=1500, max_retries=8, restore=True)
    cursor.decide(0, False, True)
    assert cursor.at_prefix(1600) == "abort"
    overlapping = (Block(1700, 1500, 1284, 1300, 2800), Block(2900, 2700, 300, 316, 3016))
    cursor = RelocationCursor(overlapping, resume_limit=1500, max_retries=8, restore=True)
    cursor.decide(0, False, True)
    assert isinstance(cursor.at_prefix(1500), Relocation)
    # The next stop 2700 <= 1500 + 1284: block 2 is abandoned.
    assert cursor.after_relocation() == NextBlock(None, overlapping[1], 2, 1)


def test_cursor_needs_a_block():
    with pytest.raises(ValueError, match="at least one block"):
        RelocationCursor((), resume_limit=0, max_retries=0, restore=False)


@pytest.mark.parametrize(
    "prefix, waiting_queue, expected",
    [
        pytest.param(1200, False, ("read", None), id="below-stop-chunked"),
        pytest.param(1200, True, ("read", None), id="below-stop-queue"),
        pytest.param(1500, False, ("relocate", Relocation(blocks_two()[0], 1, arm_restore=True)), id="at-stop-chunked"),
        pytest.param(1500, True, ("abort", "prefix 1500 reached the stop on the waiting queue"), id="at-stop-queue"),
        pytest.param(1600, False, ("abort", "re-entered with prefix 1600 beyond |A|+|B'| 1500"), id="past-stop"),
        pytest.param(1600, True, ("abort", "re-entered with prefix 1600 beyond |A|+|B'| 1500"), id="past-stop-queue"),
    ],
)
def test_phase1_step(prefix, waiting_queue, expected):
    cursor = RelocationCursor(blocks_two(), resume_limit=1500, max_retries=8, restore=True)
    assert phase1_step(cursor, prefix, waiting_queue) == expected


def test_cursor_walks_three_blocks_in_order():
    """With three blocks each relocation hands over the next one in plan order (a cursor over two
    blocks cannot tell ``blocks[i + 1]`` from ``blocks[i - 1]``: index -1 is the last block)."""
    blocks = (Block(1700, 1500, 1284, 1300, 2800), Block(3300, 3000, 400, 416, 3416), Block(4000, 3600, 100, 116, 3716))
    cursor = RelocationCursor(blocks, resume_limit=1500, max_retries=8, restore=False)
    for number, block in enumerate(blocks, start=1):
        assert cursor.at_prefix(block.new_start) == Relocation(block, number, arm_restore=False)
        following = blocks[number] if number < len(blocks) else None
        expected = NextBlock(following.new_start, following, number + 1, 0) if following else NextBlock(None, None, 0, 0)
        assert cursor.after_relocation() == expected


def test_cursor_drops_a_next_block_that_starts_where_the_relocated_rows_end():
    """The next stop must be strictly ahead of the rows just relocated; at their end it is not."""
    first = Block(1700, 1500, 1284, 1300, 2800)
    adjacent = Block(3300, first.new_start + first.num_rows, 300, 316, 3100)
    cursor = RelocationCursor((first, adjacent), resume_limit=1500, max_retries=8, restore=False)
    assert isinstance(cursor.at_prefix(1500), Relocation)
    assert cursor.after_relocation() == NextBlock(None, adjacent, 2, 1)


def test_n_old_is_the_previous_turn_length_or_zero_without_an_admission():
    table = SessionTable(CFG)
    doc = tokens(1, 3000)
    reply = tokens(2, 20)
    served(table, doc, reply)
    second = served(table, doc[:1500] + doc[1700:] + tokens(3, 50), [])
    assert second.kind == "plan" and second.n_old == len(second.admission.previous_tokens) > 0
    off = served(table, doc, [], salt="kvreuse:off")
    assert off.admission is None and off.n_old == 0


def test_a_session_without_a_side_slot_is_served_cold():
    """The first turn was admitted but never stored (no ``finish``): the session knows its tokens
    but holds no side slot, so there are no rows to relocate and the next turn is cold."""
    table = SessionTable(CFG)
    doc = tokens(1, 3000)
    intercept(table, doc, parse_request_knobs(None), CFG, identity="conversation-1")
    second = intercept(table, doc[:1500] + doc[1700:] + tokens(3, 50), parse_request_knobs(None), CFG,
                       identity="conversation-1")
    assert second.admission.previous_tokens == tuple(doc) and second.admission.session.side_slot is None
    assert second.kind == "cold" and second.blocks == ()
