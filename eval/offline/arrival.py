"""The order in which a replay's calls reach the server, offline.

``eval.replay`` (what ``eval.bench_policies`` serves) sends the trace's first call alone, then runs
up to N conversations at once, each one's calls in turn order, a worker taking the next
conversation when its own ends. Policies whose state is shared across conversations (scr's session
table and side slots, any tree) see the calls in that order, so the offline arms take them in it
too. Every call is taken to last as long as any other, so the N conversations in flight
interleave round-robin; the served order also depends on each call's speed, which this model
leaves out (the offline numbers are estimates of the served ones, checked against them).
"""

from __future__ import annotations

from eval.traces.format import TraceCall, by_conversation


def arrival_order(calls: list[TraceCall], concurrency: int) -> list[TraceCall]:
    """``calls`` in the order a replay with ``concurrency`` conversations in flight sends them."""
    queues = [list(queue) for queue in by_conversation(calls).values()]
    if not queues:
        return []
    order = [queues[0].pop(0)]
    waiting = iter(q for q in queues if q)
    active = [next(waiting, None) for _ in range(max(1, concurrency))]
    while any(q is not None for q in active):
        for slot, queue in enumerate(active):
            if queue is None:
                continue
            order.append(queue.pop(0))
            if not queue:
                active[slot] = next(waiting, None)
    return order
