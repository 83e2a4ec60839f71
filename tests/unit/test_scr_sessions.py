"""``scr.sessions``: session matching at its thresholds (``docs/scr.md`` §4.3), LRU eviction (§4.4),
private-data drops (§4.5) and side-slot stores (§5.1, §5.2).

Token lists are built from disjoint integer ranges, so common prefixes and the quick-ratio
overlap ``2 * |old ∩ new| / (|old| + |new|)`` can be computed by hand; each case states them.
"""
# Spec: docs/scr.md

from __future__ import annotations

import pytest

from scr.sessions import Dropped, SessionTable, Store
from scr.settings import ScrConfig


def r(start: int, stop: int) -> list[int]:
    return list(range(start, stop))


def seed(table: SessionTable, specs) -> list[str]:
    """Create one session per ``(tokens, namespace, slotted)``, oldest first, all idle.

    All are admitted before any gets a slot, so none can match another (matching needs a slot).
    """
    sids = []
    for tokens, namespace, _ in specs:
        admission = table.admit(tokens, namespace)
        assert admission.created
        sids.append(admission.session.sid)
    for sid, (tokens, _, slotted) in zip(sids, specs):
        table.finish(sid, tokens, store=slotted)
    table.check()
    return sids


def table_with(**settings) -> SessionTable:
    return SessionTable(ScrConfig(**settings))


# ---------------------------------------------------------------------- matching (§4.3)


def test_spec_unit_test_cache_key_filter():
    # §13.1 test 1: same ids under "tenant-a" and None; the new prompt replaces 2000..2099.
    table = SessionTable(ScrConfig())
    old = r(0, 3000)
    a, b = seed(table, [(old, "tenant-a", True), (old, None, True)])
    new = r(0, 2000) + r(5000, 5100) + r(2100, 3000)
    assert table.match(new, "tenant-a").sid == a
    assert table.match(new, None).sid == b
    assert table.match(new, "tenant-c") is None
    assert (table.get(a).side_slot, table.get(b).side_slot) == (0, 1)


@pytest.mark.parametrize(
    "namespace, other, expected",
    [
        pytest.param("tenant-a", "tenant-b", None, id="salt-a-vs-salt-b"),
        pytest.param(None, "tenant-b", None, id="unsalted-vs-salted"),
        pytest.param("tenant-b", None, None, id="salted-vs-unsalted"),
        pytest.param("", None, None, id="empty-salt-is-not-None"),
        pytest.param("tenant-b", "tenant-b", "s000001", id="same-salt"),
    ],
)
def test_different_salts_never_match(namespace, other, expected):
    table = SessionTable(ScrConfig())
    seed(table, [(r(0, 3000), other, True)])
    session = table.match(r(0, 3000), namespace)
    assert (session.sid if session else None) == expected


@pytest.mark.parametrize(
    "prefix_len, expected",
    [
        # old = 0..1999; new = old with token prefix_len replaced: LCP = prefix_len, overlap 0.9995.
        pytest.param(1023, None, id="lcp-1023-short"),
        pytest.param(1024, "s000001", id="lcp-1024-enough"),
    ],
)
def test_min_common_prefix(prefix_len, expected):
    table = SessionTable(ScrConfig())
    seed(table, [(r(0, 2000), None, True)])
    new = r(0, prefix_len) + [99999] + r(prefix_len + 1, 2000)
    report = table.match_report(new, None)
    assert (report.session.sid if report.session else None) == expected
    assert report.short == (1 if expected is None else 0)


@pytest.mark.parametrize(
    "shared, expected_reason",
    [
        # old = 0..1999, new = old[:shared] + fresh: overlap = 2*shared/4000, prefix share = shared/2000.
        pytest.param(1098, "below_floor", id="overlap-0.549-below-floor"),
        pytest.param(1100, "matched", id="overlap-0.55-matches"),
    ],
)
def test_overlap_floor(shared, expected_reason):
    table = SessionTable(ScrConfig())
    seed(table, [(r(0, 2000), None, True)])
    new = r(0, shared) + r(90000, 90000 + 2000 - shared)
    report = table.match_report(new, None)
    assert report.reason == expected_reason
    assert report.best_ratio == 2 * shared / 4000
    assert (report.session is not None) == (expected_reason == "matched")


def test_lcp_is_measured_in_the_first_8192_tokens_only():
    # Both share more than 8192 leading tokens with the new prompt (9000 vs 8500), so both count
    # 8192 and the larger overlap decides: B (2*8500/18600 = 0.914) over A (2*9000/29000 = 0.621).
    new = r(0, 9000) + r(20000, 21000)
    table = SessionTable(ScrConfig())
    a, b = seed(table, [(r(0, 9000) + r(30000, 40000), None, True), (r(0, 8500) + r(40000, 40100), None, True)])
    assert table.match(new, None).sid == b


def test_a_longer_window_lets_the_longer_prefix_win():
    new = r(0, 9000) + r(20000, 21000)
    table = SessionTable(ScrConfig(match_window=10000))
    a, b = seed(table, [(r(0, 9000) + r(30000, 40000), None, True), (r(0, 8500) + r(40000, 40100), None, True)])
    assert table.match(new, None).sid == a


@pytest.mark.parametrize(
    "window, expected",
    [
        # old = 0..19999; new = 0..9999 + 12000 fresh: overlap 2*10000/42000 = 0.476 (< 0.5).
        # The LCP counts 8192 of the 10000: prefix share 8192/20000 = 0.41 -> weak.
        pytest.param(8192, ("no_candidate", 1), id="capped-lcp-weak"),
        # Uncapped: share 10000/20000 = 0.5 -> not weak; competes, then fails the 0.55 floor.
        pytest.param(10000, ("below_floor", 0), id="wider-window-not-weak"),
    ],
)
def test_window_cap_makes_a_candidate_weak(window, expected):
    table = table_with(match_window=window)
    seed(table, [(r(0, 20000), None, True)])
    report = table.match_report(r(0, 10000) + r(50000, 62000), None)
    assert (report.reason, report.weak) == expected


def test_weak_candidate_is_skipped_so_a_shorter_prefix_wins():
    # new = 0..1499 + 60000..61499.
    # A: LCP 1500, share 1500/5500 = 0.27, overlap 3000/8500 = 0.35 -> weak, skipped.
    # B: LCP 1200, share 1200/2700 = 0.44, overlap 5400/5700 = 0.95 -> competes and wins.
    new = r(0, 1500) + r(60000, 61500)
    table = SessionTable(ScrConfig())
    a, b = seed(table, [(r(0, 1500) + r(80000, 84000), None, True), (r(0, 1200) + r(60000, 61500), None, True)])
    report = table.match_report(new, None)
    assert report.session.sid == b
    assert (report.candidates, report.weak, report.slotted) == (2, 1, 1)


def test_not_weak_but_low_overlap_winner_fails_the_floor():
    # A: LCP 1500, share 1500/2500 = 0.6 (not weak), overlap 3000/7000 = 0.43; largest LCP wins,
    # then fails the 0.55 floor, although B (LCP 1200, overlap 0.97) would pass: no match.
    new = r(0, 1500) + r(60000, 63000)
    table = SessionTable(ScrConfig())
    seed(table, [(r(0, 1500) + r(80000, 81000), None, True), (r(0, 1200) + r(60000, 63000), None, True)])
    report = table.match_report(new, None)
    assert (report.session, report.reason, report.slotted) == (None, "below_floor", 2)
    assert report.best_ratio == 3000 / 7000


@pytest.mark.parametrize(
    "unslotted, expected_reason",
    [
        # new = 0..1999 + 60000..61999 (4000). S (slotted): 0..1999 + 60000..60399 + 80000..81599,
        # LCP 2000, overlap 4800/8000 = 0.6. U (no slot), LCP 1500:
        pytest.param(r(0, 1500) + r(60000, 61500) + r(85000, 86000), "matched", id="unslotted-0.75-equal-margin"),
        pytest.param(r(0, 1500) + r(60000, 61504) + r(85000, 86000), "ambiguous", id="unslotted-0.7506-beyond"),
    ],
)
def test_ambiguity_against_an_unslotted_session(unslotted, expected_reason):
    new = r(0, 2000) + r(60000, 62000)
    slotted = r(0, 2000) + r(60000, 60400) + r(80000, 81600)
    table = SessionTable(ScrConfig())
    s, _ = seed(table, [(slotted, None, True), (unslotted, None, False)])
    report = table.match_report(new, None)
    assert report.reason == expected_reason
    assert report.best_ratio == 0.6
    assert report.session == (table.get(s) if expected_reason == "matched" else None)


def test_unslotted_session_alone_never_matches():
    table = SessionTable(ScrConfig())
    seed(table, [(r(0, 3000), None, False)])
    report = table.match_report(r(0, 3000), None)
    assert (report.session, report.reason, report.best_unslotted) == (None, "no_candidate", 1.0)


def test_full_tie_keeps_the_older_session():
    table = SessionTable(ScrConfig())
    a, b = seed(table, [(r(0, 3000), None, True), (r(0, 3000), None, True)])
    assert table.match(r(0, 3000) + [7], None).sid == a


def test_equal_prefix_larger_overlap_wins():
    # Both LCP 2000; B keeps more of the new prompt's tokens.
    new = r(0, 2000) + r(60000, 61000)
    table = SessionTable(ScrConfig())
    a, b = seed(table, [(r(0, 2000) + r(70000, 71000), None, True), (r(0, 2000) + r(60000, 60500), None, True)])
    assert table.match(new, None).sid == b


def test_empty_table_and_dropped_sessions_are_no_candidates():
    table = SessionTable(ScrConfig())
    assert table.match_report(r(0, 2000), None).reason == "no_candidate"
    (sid,) = seed(table, [(r(0, 2000), None, True)])
    table.drop_private(sid)
    report = table.match_report(r(0, 2000), None)
    assert (report.reason, report.candidates) == ("no_candidate", 0)


def test_match_is_pure():
    table = SessionTable(ScrConfig())
    a, b = seed(table, [(r(0, 3000), None, True), (r(10000, 13000), None, True)])
    table.match(r(0, 3000), None)
    assert [s.sid for s in table] == [a, b]
    assert table.get(a).token_ids == tuple(r(0, 3000))


# ---------------------------------------------------------------------- admit (§4.2)


def test_admit_creates_then_continues_a_conversation():
    table = SessionTable(ScrConfig())
    first = table.admit(r(0, 2000), None)
    assert (first.created, first.session.sid, first.previous_tokens, first.num_sessions) == (True, "s000001", (), 1)
    assert first.session.inflight == 1
    table.finish("s000001", r(0, 2100))
    second = table.admit(r(0, 2100) + r(5000, 5050), None)
    assert (second.created, second.session.sid) == (False, "s000001")
    assert second.previous_tokens == tuple(r(0, 2000))
    assert second.session.token_ids == tuple(r(0, 2100) + r(5000, 5050))
    assert second.match.reason == "matched"


def test_admit_without_a_slot_starts_a_new_session():
    # §15.6: a conversation whose session holds no slot cannot be matched; the next turn is new.
    table = SessionTable(ScrConfig())
    table.admit(r(0, 2000), None)
    second = table.admit(r(0, 2000) + [1], None)
    assert (second.created, second.session.sid, second.previous_tokens) == (True, "s000002", ())


# ---------------------------------------------------------------------- LRU (§4.4)


def conversations(count: int) -> list[list[int]]:
    return [r(100000 * (i + 1), 100000 * (i + 1) + 2000) for i in range(count)]


def fill(table: SessionTable, prompts) -> list[str]:
    """One finished turn per prompt, in order (each gets a slot while any is free)."""
    sids = []
    for tokens in prompts:
        sid = table.admit(tokens, None).session.sid
        table.finish(sid, tokens)
        sids.append(sid)
    return sids


def test_seventeenth_session_evicts_the_oldest():
    table = SessionTable(ScrConfig())
    prompts = conversations(17)
    sids = fill(table, prompts[:16])
    # 12 slots: sessions 13-16 found none at release and were dropped (§5.2 step 4).
    assert [table.get(s).side_slot for s in sids] == list(range(12)) + [None] * 4
    assert [bool(table.get(s).token_ids) for s in sids] == [True] * 12 + [False] * 4
    admission = table.admit(prompts[16], None)
    assert admission.num_sessions == 17
    assert admission.evicted == (Dropped("s000001", 0, 2000, True),)
    assert [s.sid for s in table] == sids[1:] + ["s000017"]
    assert table.free_slots == (0,)
    table.finish("s000017", prompts[16])
    assert table.get("s000017").side_slot == 0
    table.check()


def test_matched_session_moves_to_the_end_and_survives():
    table = SessionTable(ScrConfig())
    prompts = conversations(17)
    sids = fill(table, prompts[:16])
    turn2 = prompts[0] + [7, 8, 9]
    assert table.admit(turn2, None).session.sid == "s000001"
    table.finish("s000001", turn2)
    admission = table.admit(prompts[16], None)
    assert admission.evicted == (Dropped("s000002", 1, 2000, True),)
    assert [s.sid for s in table] == sids[2:] + ["s000001", "s000017"]


def test_sessions_in_flight_are_skipped():
    table = SessionTable(ScrConfig())
    prompts = conversations(18)
    fill(table, prompts[:16])
    table.admit(prompts[0] + [7], None)  # s000001 has a request in flight
    admission = table.admit(prompts[16], None)
    assert [d.sid for d in admission.evicted] == ["s000002"]
    admission = table.admit(prompts[17], None)  # s000017 is in flight too
    assert [d.sid for d in admission.evicted] == ["s000003"]
    assert len(table) == 16


def test_cap_is_exceeded_while_every_older_session_is_busy():
    table = SessionTable(ScrConfig())
    prompts = conversations(17)
    for tokens in prompts[:16]:
        table.admit(tokens, None)  # none finished
    admission = table.admit(prompts[16], None)
    # The new session is never evicted on admission (the spec's order could evict it).
    assert (admission.evicted, len(table), admission.session.sid) == ((), 17, "s000017")
    table.finish("s000001", prompts[0])
    admission = table.admit(prompts[0] + [1], None)  # s000001 is idle but has a slot: matched
    assert admission.session.sid == "s000001"
    admission = table.admit(conversations(18)[17], None)
    assert [d.sid for d in admission.evicted] == []
    assert len(table) == 18


def test_eviction_walks_oldest_first_until_at_the_cap():
    table = table_with(max_sessions=3, side_sessions=3)
    prompts = conversations(5)
    fill(table, prompts[:3])
    table.admit(prompts[1] + [1], None)  # s000002 busy, now newest
    admission = table.admit(prompts[3], None)
    assert [d.sid for d in admission.evicted] == ["s000001"]
    assert [s.sid for s in table] == ["s000003", "s000002", "s000004"]


# ---------------------------------------------------------------------- side slots and stores (§5)


def test_first_store_acquires_a_slot_and_copies_everything():
    table = SessionTable(ScrConfig())
    sid = table.admit(r(0, 2000), None).session.sid
    store = table.finish(sid, r(0, 2100))
    assert store == Store(sid, 0, 0, 2100, 0, True, None, "stored")
    assert (table.held, table.owner(0), table.get(sid).inflight) == (2100, sid, 0)


def test_second_store_copies_only_rows_past_the_identical_prefix():
    table = SessionTable(ScrConfig())
    sid = table.admit(r(0, 2000), None).session.sid
    table.finish(sid, r(0, 2100))
    turn2 = r(0, 1500) + r(7000, 7700)
    table.admit(turn2, None)
    store = table.finish(sid, turn2 + r(8000, 8100))
    assert store == Store(sid, 0, 1500, 2300, 2100, False, None, "stored")
    assert table.held == 2300
    assert table.get(sid).side_ids == tuple(turn2 + r(8000, 8100))


def test_oversize_conversation_is_dropped():
    table = table_with(side_tokens=2000)
    sid = table.admit(r(0, 1500), None).session.sid
    store = table.finish(sid, r(0, 2001))
    assert store == Store(sid, None, 0, 2000, 0, True, Dropped(sid, 0, 2000, False), "oversize")
    session = table.get(sid)
    assert (session.side_slot, session.n_side, session.token_ids) == (None, 0, ())
    assert (table.held, table.free_slots[-1], table.owner(0)) == (0, 0, None)
    table.check()


def test_no_free_slot_drops_the_session():
    table = table_with(side_sessions=1)
    a, b = (table.admit(t, None).session.sid for t in conversations(2))
    table.finish(a, conversations(2)[0])
    store = table.finish(b, conversations(2)[1])
    assert store == Store(b, None, 0, 0, 0, False, Dropped(b, None, 0, False), "no_free_slot")
    assert table.get(b).token_ids == ()
    table.check()


def test_finish_without_side_buffer_only_counts_out():
    table = SessionTable(ScrConfig())
    sid = table.admit(r(0, 2000), None).session.sid
    assert table.finish(sid, r(0, 2000), store=False) is None
    assert (table.get(sid).inflight, table.get(sid).side_slot, table.held) == (0, None, 0)


def test_slots_are_reused_first_in_first_out():
    table = table_with(side_sessions=3, max_sessions=3)
    prompts = conversations(4)
    fill(table, prompts[:3])
    assert table.free_slots == ()
    table.drop_private("s000003")
    table.drop_private("s000001")
    assert table.free_slots == (2, 0)
    admission = table.admit(prompts[3], None)
    assert admission.evicted == (Dropped("s000001", None, 0, True),)
    assert table.acquire_slot(admission.session.sid) == 2
    assert table.free_slots == (0,)
    table.check()


def test_acquire_slot_keeps_an_existing_slot():
    table = SessionTable(ScrConfig())
    sid = table.admit(r(0, 2000), None).session.sid
    assert table.acquire_slot(sid) == 0
    assert table.acquire_slot(sid) == 0
    assert table.free_slots == tuple(range(1, 12))


def test_dropped_session_with_a_request_in_flight_reacquires_at_release():
    # §4.5: drop clears the prompt, not the conversation; a later release stores again. ``keep``
    # is capped by n_side (0 after the drop), although side_ids still share 2000 tokens.
    table = SessionTable(ScrConfig())
    sid = table.admit(r(0, 2000), None).session.sid
    table.finish(sid, r(0, 2000))
    table.admit(r(0, 2000) + [1], None)
    table.drop_private(sid)
    store = table.finish(sid, r(0, 2001))
    assert (store.slot, store.keep, store.end, store.acquired) == (1, 0, 2001, True)
    table.check()


def test_state_tokens():
    table = SessionTable(ScrConfig())
    sid = table.admit(r(0, 2000), None).session.sid
    assert table.get(sid).state_tokens == -1
    table.set_state_tokens(sid, 2000)
    assert table.get(sid).state_tokens == 2000
    table.set_state_tokens(sid, -1)
    assert table.get(sid).state_tokens == -1


# ---------------------------------------------------------------------- tenant isolation (pinned slots)


def test_drop_forgets_what_described_the_slot():
    """A dropped session keeps no side ids and no saved-state count: a slot it later takes again
    was written by someone else, and stale ids would let the relocation guard pass."""
    table = SessionTable(ScrConfig())
    sid = table.admit(r(0, 2000), None).session.sid
    table.finish(sid, r(0, 2100))
    table.set_state_tokens(sid, 2000)
    table.drop_private(sid)
    session = table.get(sid)
    assert (session.side_ids, session.state_tokens, session.n_side) == ((), -1, 0)


def test_a_reacquired_slot_no_longer_holds_the_plans_pin():
    """Tenant A's plan pins (slot 0, generation 1); A loses the slot, tenant B writes it, A takes
    a slot again: same owner and slot number can come back, the generation cannot."""
    table = table_with(side_sessions=1)
    a = table.admit(r(0, 2000), "tenant-a").session.sid
    table.finish(a, r(0, 2000))
    pin = (table.get(a).side_slot, table.generation(0))
    assert table.holds(a, *pin)
    table.drop_private(a)
    assert not table.holds(a, *pin)
    b = table.admit(r(0, 2000), "tenant-b").session.sid
    table.finish(b, r(0, 2000))
    assert table.owner(0) == b and not table.holds(a, *pin)
    table.drop_private(b)
    assert table.acquire_slot(a) == 0  # the same slot number, re-acquired by A
    assert table.owner(0) == a and table.get(a).side_ids == () and table.get(a).state_tokens == -1
    assert not table.holds(a, *pin)
    assert table.holds(a, 0, table.generation(0))
    table.check()


def test_a_plan_pins_its_side_slot_and_generation():
    from scr.knobs import RequestKnobs
    from scr.intercept import intercept

    config = ScrConfig()
    table = SessionTable(config)
    first = r(0, 2400)
    sid = table.admit(first, "t").session.sid
    table.finish(sid, first)
    second = first[:1400] + first[1600:] + r(9000, 9040)
    outcome = intercept(table, second, RequestKnobs(namespace="t"), config)
    assert outcome.kind == "plan"
    assert (outcome.side_slot, outcome.slot_generation) == (0, 1)
    assert table.holds(sid, outcome.side_slot, outcome.slot_generation)


# ---------------------------------------------------------------- session identity from the request (ours)

from scr.sessions import request_identity  # noqa: E402


def test_conversations_the_requests_name_never_merge():
    """Identical content under two names: two sessions (content matching would merge them)."""
    table = table_with()
    a = table.admit(r(0, 2000), None, "run.q0001")
    table.finish(a.session.sid, r(0, 2000))
    b = table.admit(r(0, 2000), None, "run.q0002")
    assert b.created and b.session.sid != a.session.sid and b.match.reason == "no_candidate"
    by_content = table.admit(r(0, 2000) + [1], None)  # no name: content matching, named sessions excluded
    assert by_content.created


def test_a_named_conversation_continues_whatever_its_content():
    table = table_with()
    first = table.admit(r(0, 2000), None, "run.q0001")
    table.finish(first.session.sid, r(0, 2000))
    again = table.admit(r(9000, 9100), None, "run.q0001")  # shares nothing: content matching would refuse
    assert not again.created and again.session.sid == first.session.sid and again.match.reason == "identity"
    assert again.previous_tokens == tuple(r(0, 2000))
    other_salt = table.admit(r(0, 2000), "tenant", "run.q0001")  # a name is per namespace
    assert other_salt.created


@pytest.mark.parametrize("mode, rid, session_id, expected", [
    ("content", "run.q1.3", "s", None),
    ("session_id", "run.q1.3", "conv-7", "conv-7"),
    ("session_id", "run.q1.3", None, None),
    ("session_id", "run.q1.3", "", None),
    ("rid", "run.q1.3", None, "run.q1"),
    ("rid", "plainrid", None, None),
    ("rid", "a b.c.0", None, "a b.c"),
])
def test_request_identity(mode, rid, session_id, expected):
    assert request_identity(mode, rid, session_id) == expected


def test_a_named_session_is_found_by_its_identity_as_the_one_candidate():
    table = SessionTable(ScrConfig())
    for name in ("conversation-a", "conversation-b"):
        table.admit([1, 2, 3], None, name)
    named = [s for s in table._sessions.values() if s.identity == "conversation-b"]
    report = table.by_identity(None, "conversation-b")
    assert (report.session, report.reason, report.candidates) == (named[0], "identity", len(named))
    assert table.by_identity(None, "conversation-c").session is None
