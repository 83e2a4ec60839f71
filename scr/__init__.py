"""``scr``: Suffix Cache Reuse, re-implemented from ``docs/scr.md`` (no code copied).

Pure decisions, no SGLang and no torch: server settings (``settings.py``), the authors'
``KVREUSE_*`` variables (``kvreuse_env.py``), per-request knobs (``knobs.py``), session matching
and LRU (``sessions.py``), the token diff (``diff.py``), the block relocation plan
(``planner.py``), side-slot bookkeeping (``side.py``), the memory its stores take and the
start-up check (``memory.py``), the recurrent-state gate (``gates.py``), a request's outcome
(``intercept.py``), the plan's execution as a state machine over prefix lengths (``cursor.py``), each step of a request from enqueue to release over an engine port
(``runner.py``), the rules it asks while it executes a plan (``execution.py``), its log lines
(``lines.py``), the rotary check (``rotary.py``) and the authors' log formats with their parser
(``authors_log.py``). The tensor parts live in ``patches/scr_tensors.py`` and ``patches/rope.py``;
the SGLang glue (the engine port) is ``patches/scr_runtime.py`` with its hook set
``patches/scr_hooks.py`` (named in ``policy/registry.py``).
"""
