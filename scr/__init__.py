"""``scr``: Suffix Cache Reuse, re-implemented from ``shared/docs/scr_spec.md`` (no code copied).

Pure decisions, no SGLang and no torch: settings and the authors' ``KVREUSE_*`` variables
(``config.py``), session matching and LRU (``sessions.py``), the token diff (``diff.py``), the
K-span relocation plan (``planner.py``), side-slot bookkeeping (``side.py``) and the authors'
log lines with their parser (``log_lines.py``). The tensor parts live in ``patches/``
(``rope.py``: key re-rotation; ``scr_store.py``: side buffer and state shadow). Not yet built:
the scheduler-side execution of a plan (two-phase splice, ``scr_spec.md`` §7) and the
``--cache-policy scr`` registration.
"""
