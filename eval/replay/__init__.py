"""``python -m eval.replay``: replay a recorded trace against a running server with forced decoding.

```
python -m eval.replay --server http://127.0.0.1:30000 --trace trace.jsonl --out runs/radix \
    [--run-id NAME] [--concurrency N]
```

A trace (``eval/traces/format.py``) fixes the token sequences of an agent run, and the cache's
decisions depend only on them; replaying it under each policy measures the cost side exactly,
with any model of the same vocabulary (the tiny one on CPU included). Each call goes to
``/generate`` with ``input_ids`` = its ``prompt_ids``, its ``completion_ids`` forced
(``sampling_params.custom_params.forced_output_ids``, ``patches/forced.py``; needs a server
started with ``python -m patches.launch_server``), greedy with EOS ignored, rid
``<run>.<conversation>.<turn>``, ``extra_key`` = its ``cache_salt`` when not null. A call with
an empty completion is sent with ``max_new_tokens`` 0: the prompt is read and cached, nothing is
generated.

Order: the calls of one conversation strictly in turn order, each after the previous one's
answer; up to ``--concurrency`` conversations in flight (default 1), taken in order of first
appearance in the trace. (So the original interleaving of conversations is not reproduced; with
``--concurrency 1`` conversations run one after the other.)

Writes ``OUT/client.jsonl``, one line per answered call in ``eval.workload``'s shape (``rid``,
``conversation``, ``turn``, ``kind``, ``usage`` with ``prompt_tokens``/``completion_tokens``/
``cached_tokens``, ``cached_tokens``, ``seconds``), which ``python -m eval.report ingest --client``
joins with the server's events (check C1). A progress line (calls done/total, rate, ETA) goes to
stderr every 5 s.

Resumable: run again with the same ``--out`` and ``--run-id`` and the calls already in
``client.jsonl`` are skipped; a conversation whose first calls are done resumes at its next turn.
The server's cache is then not what it was when the run stopped (a restart, other traffic,
evictions), so the resumed calls may reuse less than an uninterrupted run would, and a call that
was in flight when the run was killed is sent again (the server then has two rows for its rid and
the accounting's check L1/C1 fails): for a reportable run, replay the whole trace against a fresh
server.

Exit status: 0 all calls answered with the trace's ids; 1 an answer whose ids differ from the
trace's (a failed check: the message names the rid; the replay stops: calls in flight finish, no
new one is sent, the mismatched call is not written) or the server refused or failed a call; 2 a
usage error (bad flag, unreadable or malformed trace, a server that is not loopback or not
reachable).
``run_replay(...)`` is the same run in-process; ``replay(send, trace, out, ...)`` takes any transport.
"""

from eval.replay.run import Mismatch, ServerError, UsageError, replay, run_replay

__all__ = ["Mismatch", "ServerError", "UsageError", "replay", "run_replay"]
