"""Pure request-serving rules that do not belong to any one cache policy: what a valid request
is, how a forced (replayed) completion is laid out, what a trace record holds.

Standard library only, no SGLang and no torch: ``patches/`` calls these functions from its hooks
and turns their answers into SGLang actions, so the rules are unit-testable without an engine.
"""
