"""The seam between the serving engine and the prefix-cache policies.

Standard library only: no torch, no sglang. ``patches/`` turns SGLang requests into the value
objects of ``policy.api`` and executes the plans that come back; the policy packages
(``exact_cache/``, ``scr/``) implement ``policy.api.CachePolicy`` (SCR, whose steps need the
engine, ``policy.carrier.StepPolicy`` and its step carrier's contract) and are listed by dotted
path in ``policy.registry`` (imported on first use); ``eval/`` reads ``policy.events``.
"""
