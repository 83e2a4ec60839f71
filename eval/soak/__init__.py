"""``python -m eval.soak``: a bounded multi-tenant soak of a running (loopback) server, then checks.

```
python -m eval.soak --server http://127.0.0.1:30000 --out runs/soak \
    [--requests N | --minutes M] [--seed S] [--concurrency C] [--events FILE] [--log FILE] \
    [--policy radix|exact|scr] [--exact-sample K] [--malformed none|safe|all] [--tenants T] \
    [--max-latency-ratio R|none] [--no-bounds]
```

A load bounded by ``--requests`` alone sends the same quota of each kind whatever the machine's
speed (``run.py``); the request limits are probed by ``bounds.py``.

Start the server with ``SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_IDLE=1`` (SGLang's idle pool check
then raises instead of warning; 0.5.16's default, set it anyway), ``--cache-events FILE``, its
output captured in ``--log FILE`` and ``--admin-api-key KEY`` with ``CACHE_POLICY_ADMIN_KEY=KEY``
exported here (``/abort_request`` and ``/flush_cache`` are admin routes of the patched server). What it sends, checks and writes: ``eval/soak/run.py``;
edit kinds: ``eval/soak/conversation.py``; malformed kinds: ``eval/soak/malformed.py``; checks:
``eval/soak/checks.py``. Exit status 0 = every check passed (or was skipped), 1 = a check failed
(or the server did not answer), 2 = usage error (bad flag, a server that is not loopback, a
missing ``--log`` file). ``run_soak(url, out_dir, **settings)`` is the same run in-process.
"""

from eval.soak.run import SoakConfig, UsageError, format_table, run_soak

__all__ = ["SoakConfig", "UsageError", "format_table", "run_soak"]
