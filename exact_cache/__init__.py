"""``exact``: an exact checkpointed prefix cache for hybrid GDN + attention models.

Pure planning logic (no SGLang, no torch): piece cuts, the hit rule, keep points, the replay
model. ``patches/exact_tree.py`` executes it inside SGLang. The rules are in ``README.md``.
"""
