"""SCR's steps through the one executor: ``patches/executor.py`` with ``scr/steps.py``'s carrier, on a
pure-Python engine port (no SGLang objects, no tensors).

The fake engine keeps a request's prefix length, cut and cached count as plain numbers and records
every order it is given; ``tests/integration/test_scr_runtime_replay.py`` runs the same path
behind the real SGLang glue on tensors."""

from __future__ import annotations

import random

import pytest

from types import SimpleNamespace as NS

from patches.executor import PolicyExecutor
from policy import ranks
from policy.carrier import EngineFacts, RequestFacts, Restored, Room
from scr.lines import EXECUTOR_LINES
from scr.policy import ScrPolicy
from scr.settings import ScrConfig

FALLBACK_LOG = EXECUTOR_LINES.fallback


def tokens(seed, n):
    rng = random.Random(seed)
    return [rng.randrange(100, 50000) for _ in range(n)]


DOC = tokens(1, 3000)
# Turn 2 deletes [1500, 1700) and appends 50 tokens: one block, old [1700, 2984) -> new [1500, 2784).
EDITED = DOC[:1500] + DOC[1700:] + tokens(3, 50)
ROWS = 1284


class Req:
    """The few fields of SGLang's ``Req`` the executor reads, over the plain numbers the engine moves."""

    def __init__(self, rid, prompt, salt=None):
        self.rid, self.prompt, self.output, self.extra_key = rid, list(prompt), [], salt
        self.prefix, self.cached, self.extend_end = 0, 0, len(prompt)
        self.cut_at, self.done, self.in_tree = None, False, True
        self.to_finish = self.refusal = None

    origin_input_ids = property(lambda self: self.prompt)
    output_ids = property(lambda self: self.output)
    cached_tokens = property(lambda self: self.cached)
    prefix_indices = property(lambda self: range(self.prefix))
    finished_reason = property(lambda self: NS(to_json=lambda: {"type": "stop"}) if self.done else None)

    def finished(self):
        return self.done

    def set_finish_with_abort(self, message):
        self.refusal, self.done = message, True


class Engine:
    """The runner's port over ``Req`` (``policy.carrier.EnginePort``): slots are ``("slots", n)``
    pairs; ``calls`` records orders."""

    about = EngineFacts(version="test", pid=1, environ={}, pool_slots=100_000, layers=(3, 7), rotary=True,
                        state_pool=True, side_bytes_per_token=512, shadow_bytes=2**30)

    def __init__(self):
        self.free_slots, self.evictable_slots = 50_000, 0
        self.calls, self.events, self.fail_place = [], [], False
        # A second TP rank (when either is set): the (step, rid) it fails, and whether it is at
        # another step than ours (the ranks diverged).
        self.peer_fails: set[tuple[str, str]] = set()
        self.peer_elsewhere = False
        self.exchanged: list[tuple[int, int]] = []
        self.exchange_error: Exception | None = None  # the collective itself fails

    def facts(self, req):
        return RequestFacts(req.prompt, req.prefix, len(req.prompt) + len(req.output), req.extend_end,
                            req.done, True)

    def committed(self, req):
        ids = req.prompt + req.output
        return len(ids) - 1, ids[:-1], 0

    def advance_prefix(self, req):
        self.calls.append(("advance_prefix", req.rid))

    def cut(self, req, end):
        if end is None:
            req.cut_at, req.extend_end = None, len(req.prompt) + len(req.output)
        else:
            req.cut_at = req.extend_end = end

    def attach(self, req, slots, rows, outside_tree):
        req.prefix, req.cached, req.in_tree = req.prefix + rows, req.cached + rows, not outside_tree

    def detach(self, req, prefix_len, rows):
        req.prefix, req.cached, req.in_tree = prefix_len, req.cached - rows, True

    def include_in_tree(self, req):
        req.in_tree = True

    def alloc(self, rows):
        if rows > self.free_slots:
            return None
        self.free_slots -= rows
        return ("slots", rows)

    def free(self, slots):
        self.free_slots += slots[1]

    def room(self):
        return Room(self.about.pool_slots, self.free_slots, self.evictable_slots)

    def evict(self, n):
        n = min(n, self.evictable_slots)
        self.evictable_slots -= n
        self.free_slots += n
        self.calls.append(("evict", n))

    def place(self, side_slot, old_start, new_start, slots, rerotate):
        if self.fail_place:
            raise RuntimeError("copy failed")
        self.calls.append(("place", side_slot, old_start, new_start, slots[1], rerotate))

    def restore_state(self, req, side_slot, checksums):
        self.calls.append(("restore_state", side_slot))
        return Restored(0, (1.0, 2.0, 2.0) if checksums else None, ("kept", req.rid))

    def undo_restore(self, req, restored):
        self.calls.append(("undo_restore", restored.kept))

    def save_state(self, req, side_slot):
        self.calls.append(("save_state", side_slot))
        return 0

    def store_rows(self, side_slot, pool_row, kv_len, keep, end):
        self.calls.append(("store_rows", side_slot, keep, end))

    def write(self, event):  # the executor's event writer
        self.events.append(event)

    def decode(self, ids):
        return "text"

    def exchange(self, row):
        """One rank (no peer configured), or this rank and a peer whose row the test decides."""
        self.exchanged.append(row)
        if self.exchange_error is not None:
            raise self.exchange_error
        if not self.peer_fails and not self.peer_elsewhere:
            return [row]
        fails = any(row[1] == ranks.step_digest(step, rid) for step, rid in self.peer_fails)
        digest = ranks.step_digest("elsewhere", "-") if self.peer_elsewhere else row[1]
        return [row, (int(fails), digest)]


class Log:
    def __init__(self):
        self.lines = []

    def _add(self, level, msg, *args):
        self.lines.append((level, msg % args if args else msg))

    def info(self, msg, *args):
        self._add("INFO", msg, *args)

    def warning(self, msg, *args):
        self._add("WARNING", msg, *args)

    def error(self, msg, *args):
        self._add("ERROR", msg, *args)

    def exception(self, msg, *args):
        self._add("EXCEPTION", msg, *args)

    def has(self, text):
        return any(text in line for _, line in self.lines)


class Run:
    """The executor with SCR's carrier over ``Engine``, and the scheduling points the tests drive."""

    def __init__(self, leader=True, **config):
        self.policy = ScrPolicy(ScrConfig(**config))
        self.engine, self.logger = Engine(), Log()
        self.steps = self.policy.step_carrier(self.engine, self.logger, leader)
        self.startup = [line for _, line in self.logger.lines]  # printed when the carrier is built
        self.logger.lines.clear()
        self.scheduler = NS(chunked_req=None, waiting_queue=[], is_fully_idle=lambda: True)
        self.executor = PolicyExecutor(self.policy, self.engine, steps=self.steps, log=self.logger,
                                       scheduler=self.scheduler)
        self.counters, self.say, self.on_every_rank = self.steps.counters, self.steps.say, self.steps.on_every_rank

    @property
    def requests(self):
        return self.executor._tracked

    def progress(self, rid):
        return self.requests[rid].progress

    def admit(self, req):
        """Enqueue: returns the refusal message (None: queued)."""
        self.executor.on_enqueue(self.scheduler, req)
        return req.refusal

    def after_round(self, req, waiting_queue, chunk_busy=False):
        self.scheduler.chunked_req = object() if chunk_busy else None
        self.executor.init_round(lambda *args, **kwargs: None, req, object() if waiting_queue else None)

    def admission(self, req, admitted=True, chunk_taken=False):
        """One admission pass over ``req``: True when it became the round's forced chunked request."""
        from patches.executor import FORCED

        adder = NS(can_run_list=[], new_chunked_req=None)

        def original(a, r, *args, **kwargs):
            if admitted:
                a.can_run_list.append(r)

        self.executor.add_one_req(original, adder, req, has_chunked_req=chunk_taken)
        return getattr(adder, FORCED, False)

    def after_prefill(self, req):
        self.executor.after_prefill(None, None, NS(reqs=[req]))

    def release(self, req):
        self.executor.on_release(req)

    def not_admitted(self, req):
        """A round another request owns: ``req`` is passed over."""
        from patches.executor import FORCED

        adder = NS(can_run_list=[], new_chunked_req=None)
        setattr(adder, FORCED, True)
        self.executor.add_one_req(None, adder, req)

    def keeps_chunk(self, req, prefix_len):
        req.prefix = prefix_len
        marker = object()
        return self.executor.add_chunked_req(lambda adder, r: marker, NS(), req) is req


def runner(**config):
    return Run(**config)


def first_turn(run):
    """Turn 1, a cold read of DOC: state saved at prefill end, rows stored at release."""
    req = Req("a.1", DOC)
    assert run.admit(req) is None
    req.prefix = 3000
    run.after_prefill(req)
    req.output, req.done = [7, 8], True
    run.release(req)
    return req


def second_turn(run, tree_hit=1024):
    """Turn 2 up to its first waiting-queue pass: SGLang's tree served ``tree_hit`` tokens."""
    first_turn(run)
    run.engine.calls.clear()
    req = Req("a.2", EDITED)
    run.admit(req)
    req.prefix = req.cached = tree_hit
    run.after_round(req, waiting_queue=True)
    return req


def test_the_first_turn_saves_the_state_and_stores_its_rows():
    run = runner()
    first_turn(run)
    assert run.engine.calls == [("save_state", 0), ("store_rows", 0, 0, 3001)]
    (event,) = run.engine.events
    assert (event.rid, event.moved, event.read, event.blocks) == ("a.1", 0, 3000, 0)
    assert run.requests == {}


@pytest.mark.parametrize("in_tree", [True, False], ids=["relocated-in-tree (default)", "relocated_in_tree=0"])
def test_a_block_is_read_to_its_stop_then_relocated(in_tree):
    run = runner(relocated_in_tree=in_tree)
    req = second_turn(run)
    assert (req.cut_at, run.progress("a.2").phase1) == (1500, True)
    assert run.admission(req) is True
    req.prefix = 1500  # phase 1 read [1024, 1500)
    run.after_round(req, waiting_queue=False)
    assert run.engine.calls == [("place", 0, 1700, 1500, ROWS, True), ("restore_state", 0)]
    assert (req.prefix, req.cut_at, req.in_tree) == (1500 + ROWS, None, in_tree)  # the rest is read
    assert run.logger.has("splice OK")
    req.cached += ROWS  # SGLang counts the attached rows again in prepare_for_extend
    req.done = True
    run.release(req)
    event = run.engine.events[-1]
    assert (event.prefix_reused, event.moved, event.read, event.blocks) == (1024, ROWS, len(EDITED) - 1024 - ROWS, 1)


def test_a_failed_copy_frees_the_slots_and_reads_the_rest():
    run = runner()
    req = second_turn(run)
    run.admission(req)
    req.prefix, run.engine.fail_place = 1500, True
    free = run.engine.free_slots
    run.after_round(req, waiting_queue=False)
    record = run.requests["a.2"]
    assert run.engine.free_slots == free and req.prefix == 1500 and req.cut_at is None
    assert (record.progress.cursor, record.moved, record.fallback) == (None, 0, "round: RuntimeError: copy failed")
    assert ("ERROR", FALLBACK_LOG % ("a.2", "round", "plain_read", record.fallback)) in run.logger.lines


def test_a_relocation_on_the_waiting_queue_is_undone_when_the_request_waits():
    run = runner()
    req = second_turn(run, tree_hit=1500)  # the match ends at the stop: relocated before admission
    record = run.requests["a.2"]
    state = record.progress
    assert state.direct is not None and req.prefix == 1500 + ROWS and state.held_lines
    assert not run.logger.has("splice OK")  # held until the request is admitted
    free = run.engine.free_slots
    assert run.admission(req, admitted=False) is False
    assert run.engine.free_slots == free + ROWS and (req.prefix, req.cached, req.in_tree) == (1500, 1500, True)
    assert (state.direct, record.moved, record.blocks, state.cursor.index) == (None, 0, 0, 0)  # planned again
    assert not run.logger.has("splice OK") and run.counters.relocated_blocks == 0


@pytest.mark.parametrize(
    "evictable, relocated, line",
    [
        pytest.param(30_000, True, "evict-before-fail: requested", id="evicted-then-allocated"),
        pytest.param(100, False, "evict-before-fail: declined", id="declined-above-the-floor"),
    ],
)
def test_evict_then_retry(evictable, relocated, line):
    run = runner()
    req = second_turn(run)
    run.admission(req)
    run.engine.free_slots, run.engine.evictable_slots, req.prefix = 100, evictable, 1500
    run.after_round(req, waiting_queue=False)
    assert run.requests["a.2"].moved == (ROWS if relocated else 0)
    assert run.counters.evict_retries == (1 if relocated else 0)
    assert run.logger.has(line)


def test_a_retracted_request_is_read_again_without_relocation():
    run = runner()
    req = second_turn(run, tree_hit=1500)
    run.admission(req)
    run.release(req)  # not finished: SGLang retracted it
    record = run.requests["a.2"]
    assert req.in_tree and (record.retractions, record.progress.cursor, record.progress.outside_tree) == (1, None, False)
    assert record.fallback == "retracted: read again without relocation"
    assert ("WARNING", FALLBACK_LOG % ("a.2", "retract", "plain_read", "retracted or preempted")) in run.logger.lines


def test_a_retraction_before_any_step_says_nothing_in_the_event():
    run = runner()
    first_turn(run)
    req = Req("a.3", DOC)
    run.admit(req)
    run.release(req)
    assert (run.requests["a.3"].retractions, run.requests["a.3"].fallback) == (1, None)


def test_idle_forgets_requests_the_engine_no_longer_has():
    run = runner()
    second_turn(run)
    run.executor.on_idle(run.scheduler)
    assert run.requests == {} and run.logger.has("dropped state of 1 request(s)")
    assert run.policy.sessions.get("s000001").inflight == 0


def test_an_unsupported_knob_refuses_the_request():
    run = runner()
    req = Req("k", DOC, "kvreuse:knobs:pin=1")
    assert run.admit(req).startswith("cache_salt: ")
    assert run.requests == {}


# ---------------------------------------------------------------- two TP ranks (docs/tensor_parallel.md §4)


def test_one_rank_exchanges_its_own_row_at_every_tensor_step():
    run = runner()
    req = second_turn(run)
    run.admission(req)
    req.prefix = 1500
    run.after_round(req, waiting_queue=False)
    steps = [("save_state", "a.1"), ("side_store", "a.1"), ("place_rows", "a.2"), ("restore_copy", "a.2")]
    assert run.engine.exchanged == [(0, ranks.step_digest(step, rid)) for step, rid in steps]


@pytest.mark.parametrize("step", ["place_rows", "restore_copy"])
def test_a_relocation_step_failing_on_the_other_rank_ends_in_the_same_plain_read(step):
    """This rank copied (and maybe restored) fine; the peer failed: the slots go back, a restore
    made here is undone (the state and staged copy it found come back), nothing is attached, the
    rest is read (as on the failing rank), the reason names the rank."""
    run = runner()
    req = second_turn(run)
    run.admission(req)
    run.engine.peer_fails = {(step, "a.2")}
    req.prefix, free = 1500, run.engine.free_slots
    run.after_round(req, waiting_queue=False)
    record = run.requests["a.2"]
    assert run.engine.free_slots == free and (req.prefix, req.cut_at, req.in_tree) == (1500, None, True)
    assert (record.progress.cursor, record.moved, record.blocks) == (None, 0, 0)
    assert record.fallback == f"round: PeerFailed: {step} failed on TP rank(s) 1"
    restore = [call for call in run.engine.calls if call[0] in ("restore_state", "undo_restore")]
    # A restore runs only after every rank placed its rows, and is undone when a peer's failed.
    assert restore == ([("restore_state", 0), ("undo_restore", ("kept", "a.2"))]
                       if step == "restore_copy" else [])


def session_fields(run):
    s = run.policy.sessions.get("s000001")
    return s.side_slot, s.n_side, s.state_tokens, len(s.token_ids)


def test_a_side_store_failing_on_the_other_rank_drops_the_session_here_too():
    run = runner()
    run.engine.peer_fails = {("side_store", "a.1")}
    first_turn(run)
    assert session_fields(run) == (None, 0, -1, 0)  # as on the failing rank (one rank: (0, 3001, 3000, 3000))
    assert run.engine.events[-1].fallback == "store: PeerFailed: side_store failed on TP rank(s) 1"
    req = Req("a.2", EDITED)
    run.admit(req)
    assert run.progress("a.2").outcome.kind == "cold"  # nothing to relocate from


def test_a_state_save_failing_on_the_other_rank_is_not_recorded_here_either():
    run = runner()
    run.engine.peer_fails = {("save_state", "a.1")}
    first_turn(run)
    assert session_fields(run) == (0, 3001, -1, 3000)  # rows stored, no usable state snapshot
    assert run.engine.events[-1].fallback == "save_state: PeerFailed: save_state failed on TP rank(s) 1"
    req = Req("a.2", EDITED)
    run.admit(req)
    assert (run.progress("a.2").outcome.kind, run.progress("a.2").gate.reason) == ("plan", "no_snapshot")


def test_ranks_at_different_steps_stop_the_scheduler():
    """Diverged decisions cannot be contained: the error leaves the runner (SGLang stops)."""
    run = runner()
    run.engine.peer_elsewhere = True
    req = Req("a.1", DOC)
    run.admit(req)
    req.prefix = 3000
    with pytest.raises(ranks.RanksDisagree, match="step save_state of rid=a.1: rank"):
        run.after_prefill(req)


def relocation_round(run):
    """Turn 2 admitted in phase 1 and read to its stop: the next pass relocates."""
    req = second_turn(run)
    run.admission(req)
    req.prefix = 1500
    return req


def test_ranks_at_different_steps_of_a_relocation_stop_the_scheduler():
    run = runner()
    req = relocation_round(run)
    run.engine.peer_elsewhere = True
    with pytest.raises(ranks.RanksDisagree, match="step place_rows of rid=a.2"):
        run.after_round(req, waiting_queue=False)


def test_a_failing_exchange_is_not_contained():
    """A dead peer or a timeout in the collective: no fallback can keep the ranks in step."""
    run = runner()
    req = Req("a.1", DOC)
    run.admit(req)
    req.prefix = 3000
    run.engine.exchange_error = RuntimeError("gloo: connection closed by peer")
    with pytest.raises(ranks.ExchangeFailed, match="exchange at step save_state of rid=a.1 failed: gloo"):
        run.after_prefill(req)
    req.output, req.done = [7, 8], True
    with pytest.raises(ranks.ExchangeFailed, match="step side_store of rid=a.1"):
        run.release(req)


def test_keeps_chunk_while_phase_1_is_short_of_its_stop():
    run = runner()
    req = second_turn(run)
    run.admission(req)
    stop = run.progress("a.2").cursor.stop
    assert [run.keeps_chunk(req, p) for p in (1024, stop - 1, stop)] == [True, True, False]
    assert run.keeps_chunk(Req("no-such-request", DOC), 0) is False


def test_a_request_left_waiting_gives_back_the_rows_it_relocated_on_the_waiting_queue():
    run = runner()
    req = second_turn(run, tree_hit=1500)  # relocated before admission
    state = run.progress("a.2")
    free = run.engine.free_slots
    run.not_admitted(req)
    assert state.direct is None and run.engine.free_slots == free + ROWS and req.prefix == 1500


def test_the_carrier_prints_the_start_up_lines_from_the_engines_facts_on_the_leader_only():
    run = runner()
    assert run.startup[2:] == ["[kvreuse] side buffer: 12 slots x 30000 tokens (0.17 GiB, 0.5 KiB/token)",
                               "[kvreuse] ssm shadow: 12 sessions, 1.00 GiB private (outside the mamba pool)",
                               "[kvreuse] init: full_attn_layers=2 rotary=True layers=[3, 7] pool_slots=100000 "
                               "snapshot_budget=360000 evict_floor=20000"]
    assert run.startup[0].startswith("[scr] Suffix Cache Reuse on | sglang test (built for 0.5.16)")
    assert Run(leader=False).startup == []


def test_a_traced_restore_prints_the_checksums_the_engine_read():
    run = runner()
    req = relocation_round(run)
    run.after_round(req, waiting_queue=False)
    assert run.logger.has("ev=ssm_restore rid=a.2 slot=0 midx=0 sid=s000001 before=1.0 shadow=2.0 after=2.0")
    quiet = runner(trace=False)
    req = relocation_round(quiet)
    quiet.after_round(req, waiting_queue=False)
    assert ("restore_state", 0) in quiet.engine.calls and not quiet.logger.has("ev=ssm_restore")


@pytest.mark.parametrize("debug", [False, True])
def test_say_prints_debug_lines_only_with_debug_and_only_on_the_leader(debug):
    run = runner(debug=debug)
    run.say("plain")
    run.say("detail", debug=True)
    assert [line for _, line in run.logger.lines] == (["plain", "detail"] if debug else ["plain"])
    follower = Run(leader=False, debug=debug)
    follower.say("plain")
    assert follower.logger.lines == []


def test_on_every_rank_returns_the_steps_result():
    run = runner()
    marker = object()
    assert run.on_every_rank("place_rows", "r", lambda: marker) is marker


def test_side_rows_that_no_longer_hold_the_new_ids_are_not_relocated():
    """The guard compares the side slot's rows ``[old_start, old_start + n)`` with the new prompt's
    ``[stop, stop + n)``; rows overwritten since the plan fail it and the rest is read."""
    run = runner()
    req = second_turn(run)
    run.admission(req)
    record = run.requests["a.2"]
    session = run.policy.sessions.get(record.progress.sid)
    session.side_ids = tuple(i + 1 for i in session.side_ids)
    req.prefix = 1500
    run.after_round(req, waiting_queue=False)
    assert not [call for call in run.engine.calls if call[0] == "place"]
    assert (record.moved, run.counters.stolen, req.cut_at) == (0, 1, None)


def test_a_turn_that_changes_no_stored_row_copies_nothing():
    """docs/scr.md §5.2: the store copies the rows that changed; the same prompt and reply again change
    none."""
    run = runner()
    first_turn(run)
    stored = run.policy.sessions.get("s000001").side_ids
    run.engine.calls.clear()
    first_turn(run)
    assert run.policy.sessions.get("s000001").side_ids == stored
    assert [call for call in run.engine.calls if call[0] == "store_rows"] == []
