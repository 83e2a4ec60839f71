"""eval/chaos: what a killed and restarted server excuses, and what it does not.

* ``no event twice``: a second event for one rid is a retried call only when each copy is in its
  own server start and every copy but the last finished in a start that has since ended (the
  server died with the answer on the wire). Two copies in one start are the server writing an
  event twice, whether or not that start later ended.
* ``re-pinned``: the router must move the killed worker's conversations to another worker. The
  killed worker's own later starts (its restart) serving them again is no re-pinning
  (``judge.after_kill``), or the check would pass on a router that never re-pins.
"""

from __future__ import annotations

from eval.chaos import checks
from eval.chaos.judge import after_kill


def event(rid: str, finished: float = 0.0) -> dict:
    return {"rid": rid, "finished_ts": finished, "queued_ts": 0.0, "moved": 0, "prompt_tokens": 10}


def seg(file: str, start: int, rids: list[str], last: bool) -> checks.Segment:
    return checks.Segment(file, start, {"restart": start > 1}, tuple(event(r, i) for i, r in enumerate(rids)), last)


def test_two_copies_in_one_ended_start_are_an_event_twice():
    ended = seg("w1.events.jsonl", 1, ["r.a.1", "r.a.1"], last=False)
    verdict = checks.no_event_twice([ended, seg("w1.events.jsonl", 2, [], last=True)], {"r.a.1"})
    assert not verdict.ok and "r.a.1" in verdict.detail
    # ... also when a third copy was written after the restart (a retry on top of the double write)
    after = seg("w1.events.jsonl", 2, ["r.a.1"], last=True)
    assert not checks.no_event_twice([ended, after], {"r.a.1"}).ok


def test_one_copy_per_start_across_a_restart_is_a_retry():
    ended = seg("w1.events.jsonl", 1, ["r.a.1"], last=False)
    after = seg("w1.events.jsonl", 2, ["r.a.1"], last=True)
    verdict = checks.no_event_twice([ended, after], {"r.a.1"})
    assert verdict.ok and verdict.detail.startswith("1 retried")


def test_a_restarted_worker_serving_its_own_conversations_is_no_re_pinning():
    killed = "w1.events.jsonl"
    segs = [seg(killed, 1, ["r.a.0", "r.b.0"], last=False), seg(killed, 2, ["r.a.1"], last=True),  # its restart
            seg("w0.events.jsonl", 1, ["r.c.0", "r.b.1"], last=True)]
    served = after_kill(segs, killed)
    assert served == {"b": {"w0.events.jsonl#1"}, "c": {"w0.events.jsonl#1"}}
    verdict = checks.re_pinned({"a", "b"}, served)
    assert not verdict.ok and "never: ['a']" in verdict.detail
    assert checks.re_pinned({"b"}, served).ok
