"""``scr``: Suffix Cache Reuse, re-implemented from ``docs/scr.md`` (no code copied).

Pure decisions, no SGLang and no torch: server settings (``settings.py``), the authors'
``KVREUSE_*`` variables (``kvreuse_env.py``), per-request knobs (``knobs.py``), session matching
and LRU (``sessions.py``), the token diff (``diff.py``), the block relocation plan
(``planner.py``), side-slot bookkeeping (``side.py``), the memory its stores take (``memory.py``),
the recurrent-state gate (``gates.py``), a request's outcome (``intercept.py``), the plan as
``policy.api`` steps and the rules its carrier asks (``execution.py``), the relocations as a state
machine over prefix lengths (``cursor.py``), the step carrier that carries them out over an
engine port (``steps.py``), its log lines and the start-up stores decision (``lines.py``) and the
authors' log formats with their parser (``authors_log.py``). ``ScrPolicy`` (``policy.py``) plans
at enqueue; the one executor (``patches/executor.py``, hook set ``install_enqueue`` in
``patches/hook_sets.py``) drives the carrier; the engine port is ``patches/scr_runtime.py``, the
tensors ``patches/scr_tensors.py`` and ``patches/rope.py``.
"""
