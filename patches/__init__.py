"""The overlay on pinned SGLang 0.5.16: the only package that touches SGLang internals.

Importing it has no side effects; ``patches.plugin.install`` (the ``sglang.srt.plugins`` entry
point) does the work in every SGLang process.
"""
