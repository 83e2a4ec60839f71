"""Forced decoding on SGLang's custom-logit-processor path (the rules: ``serving/forced.py``).

``patches.launch_server`` calls ``enable``; the request entry hook (``patches/validation.py``)
attaches ``processor_string()``, and SGLang's sampler calls ``ForcedLogitProcessor`` on those rows'
logits before any sampling. Importing this module does not import SGLang: the class is built on
first access (module ``__getattr__``); dill pickles it by reference, so the scheduler resolves it
the same way.
"""

from __future__ import annotations

import functools
import os

from serving.forced import CLIENT_PROCESSORS_ENV, forced_targets


def enable(server_args) -> None:
    """Launcher side: turn on SGLang's custom logit processors, remembering whether the operator
    allowed client-supplied processors themselves (they run arbitrary code)."""
    os.environ[CLIENT_PROCESSORS_ENV] = "1" if server_args.enable_custom_logit_processor else "0"
    server_args.enable_custom_logit_processor = True


def mask_forced(logits, custom_param_list):
    """In place: in each forced row every logit but the forced next one is -inf, that one 0."""
    import torch

    targets = forced_targets(custom_param_list)
    if targets:
        rows, ids = zip(*targets)
        row_index = torch.tensor(rows, device=logits.device)
        logits[row_index] = float("-inf")
        logits[row_index, torch.tensor(ids, device=logits.device)] = 0.0
    return logits


@functools.lru_cache(maxsize=None)
def _processor_class():
    """The ``CustomLogitProcessor`` subclass, named so that dill pickles it by reference."""
    from sglang.srt.sampling.custom_logit_processor import CustomLogitProcessor

    class ForcedLogitProcessor(CustomLogitProcessor):
        """Forces each row's next token to its request's next ``forced_output_ids`` entry."""

        def __call__(self, logits, custom_param_list=None):
            return mask_forced(logits, custom_param_list)

    ForcedLogitProcessor.__module__ = __name__
    ForcedLogitProcessor.__qualname__ = "ForcedLogitProcessor"
    return ForcedLogitProcessor


def __getattr__(name: str):
    if name == "ForcedLogitProcessor":
        return _processor_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@functools.lru_cache(maxsize=None)
def processor_string() -> str:
    """The serialized processor a forced request carries (SGLang's ``CustomLogitProcessor.to_str``)."""
    return _processor_class().to_str()
