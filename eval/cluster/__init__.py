"""``python -m eval.cluster``: data parallelism behind ``sglang-router``, with conversation affinity.

```
python -m eval.cluster --workers 2 --policy exact [--router-policy manual] [SERVER FLAGS...]
python -m eval.cluster bench --out DIR [--trace FILE | --questions N] [--policies exact,scr]
    [--workers 2] [--router-policies manual,cache_aware]
```

The first form starts N patched servers on loopback ports and the router in front of them, waits
until the router reports every worker ready, prints the router's URL on stdout and serves until
Ctrl-C or SIGTERM, then kills every process group (``eval/cluster/cluster.py``). The second
compares one server with the cluster on the same trace (``eval/cluster/bench.py``).

Affinity (``eval/cluster/affinity.py``): both policies keep per-server state (SCR's sessions, side
buffer and state shadow; the exact cache's tree), so every call of a conversation must reach the
worker that served its previous call. The clients send ``x-smg-routing-key: <run>.<conversation>``
(the rid without its last ``.<turn>``) and the router runs its ``manual`` policy, which pins a key
to one worker. The router's ``cache_aware`` policy routes by the longest cached prefix *of the
text*; ``bench`` measures how often it splits conversations (see docs/cluster.md).

Per-worker events (``OUT/worker-<i>/events.jsonl``) are merged by ``python -m eval.report ingest
--events A --events B`` (finishing order; a rid in two files fails).
"""
