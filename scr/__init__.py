"""``scr``: Suffix Cache Reuse, re-implemented from ``shared/docs/scr_spec.md`` (no code copied).

Pure decisions, no SGLang and no torch: settings and the authors' ``KVREUSE_*`` variables
(``config.py``), session matching and LRU (``sessions.py``), the token diff (``diff.py``), the
K-span relocation plan (``planner.py``), side-slot bookkeeping (``side.py``), the recurrent-state
gate and fallback rule (``gates.py``), a request's outcome (``intercept.py``), the plan's execution
as a state machine over prefix lengths (``cursor.py``) and the authors' log lines with their
parser (``log_lines.py``). The tensor parts live in ``patches/``
(``rope.py``: key re-rotation with the language model's rotary; ``scr_store.py``: side buffer and
state shadow) and the SGLang glue that drives ``SpliceCursor`` is ``patches/scr_runtime.py``
(``--cache-policy scr``, registered in ``policy/registry.py``).
"""
