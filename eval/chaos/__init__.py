"""``python -m eval.chaos``: faults survived, checked.

```
python -m eval.chaos [--policies radix,exact,scr] [--setups alone,router] [--conversations 4] [--turns 6]
    [--no-mount] [--out DIR]
```

Per policy and setup (one after the other, never two servers of different runs at once) it replays
an editing trace (``trace.py``) through one server or through ``eval.cluster``'s router with two
workers, and injects the faults of ``run.py`` at set turns: a full disk under the events file
(a real tmpfs where the machine allows the mount, else an injected ENOSPC: ``disk.py``), a server
killed between turns and restarted on the same events file with a shrunk KV pool, a worker killed
with a call in flight and restarted. The client retries a call only when its server is gone
(``eval/replay/retry.py`` says which retries are safe and why; ``eval.replay --router`` uses the same rule). Then ``judge.py`` ingests every events file
and ``checks.py`` judges: every call answered once, forced ids equal the trace, every identity
holds, no event lost or doubled beyond what the faults explain, restarts said, exact equal to its
replay per server start and to a cold read bit for bit, scr never relocating rows it lost, the
router re-pinning the dead worker's conversations. ``OUT/chaos.json`` and ``OUT/table.md``; exit 1
on any failed check.
"""
