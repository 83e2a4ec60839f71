"""Forced decoding: the server answers with exactly the token ids the client gives.

A request asks for it in its sampling params, with no server flag::

    {"input_ids": [...], "sampling_params": {"custom_params": {"forced_output_ids": [ids...]},
     "max_new_tokens": len(ids), "ignore_eos": true, "temperature": 0}}

``python -m eval.replay`` uses it to replay a recorded trace: the cache decisions depend only on
the token sequences, so a trace recorded once with the real model can be replayed under every
policy on any model with the same vocabulary and the cost side measured exactly.

How it hooks in (SGLang's own custom-logit-processor mechanism, nothing else is touched):

* ``patches.launch_server`` turns on SGLang's ``enable_custom_logit_processor`` (``enable``) and
  records in ``CLIENT_PROCESSORS_ENV`` whether the operator passed ``--enable-custom-logit-processor``.
* The request-entry hook (``patches.validation.before_init_req_state``) calls ``prepare_request``:
  a client-supplied ``custom_logit_processor`` (dill-pickled code, run in the scheduler) is refused
  with a 400 unless the operator enabled it; ``forced_output_ids`` is checked (a 400 naming
  ``sampling_params.custom_params.forced_output_ids``), ``max_new_tokens`` and ``ignore_eos`` are
  filled when absent, and the request's ``custom_logit_processor`` becomes ``processor_string()``.
* In the scheduler SGLang's ``Req.__init__`` adds the request itself to its custom params
  (``"__req__"``) and the sampler calls ``ForcedLogitProcessor`` on the logits of those rows before
  any sampling (greedy argmax included, on every device): every logit but the forced next one
  becomes -inf, the forced one 0.

What forcing does not change: the prompt, the prefill, the radix tree (the forced ids are
inserted exactly as a model's own output is), events and ``cached_tokens``. Stop conditions
still apply: a forced id that is a stop token ends the answer there unless ``ignore_eos``
(filled as true when absent) and no ``stop``/``stop_token_ids`` match it.

Logprobs: SGLang computes output logprobs from the processed logits, so each forced token has
logprob 0.0 and every other token -inf (top logprobs included), at any temperature. They say
nothing about the model; to score the model's probability of a forced text, send prompt +
completion as the prompt with ``return_logprob`` and ``logprob_start_len`` (prompt logprobs are
computed before any processor).

Limits: one custom processor per request, so ``forced_output_ids`` cannot be combined with a
client processor; ``n`` must be 1 (n forced answers would be identical); speculative decoding is
not supported (the processor forces one token per row).

Importing this module does not import SGLang (9 s, and the unit tests do without it): the
processor class is built on first access through the module's ``__getattr__``; dill serializes
it by reference (``patches.forced.ForcedLogitProcessor``), so the scheduler resolves it the same way.
"""

from __future__ import annotations

import functools
import os
from typing import Any, Mapping

FORCED_KEY = "forced_output_ids"
FIELD = f"sampling_params.custom_params.{FORCED_KEY}"
# Set by ``enable`` in the launcher: "1" when the operator passed --enable-custom-logit-processor.
CLIENT_PROCESSORS_ENV = "CACHE_POLICY_CLIENT_LOGIT_PROCESSORS"


class ForcedRequestError(ValueError):
    """A request the server refuses (SGLang's HTTP layer answers a ``ValueError`` with a 400)."""


# ---------------------------------------------------------------------- server side: launcher


def enable(server_args) -> None:
    """Turn on SGLang's custom logit processors so forced decoding needs no flag, and remember
    whether the operator allowed client-supplied processors themselves (they run arbitrary code)."""
    os.environ[CLIENT_PROCESSORS_ENV] = "1" if server_args.enable_custom_logit_processor else "0"
    server_args.enable_custom_logit_processor = True


def client_processors_allowed(server_args) -> bool:
    """Whether a client may send its own ``custom_logit_processor``. Without our launcher (no
    env var) SGLang's flag says it, as in stock SGLang."""
    flag = os.environ.get(CLIENT_PROCESSORS_ENV)
    if flag is None:
        return bool(getattr(server_args, "enable_custom_logit_processor", False))
    return flag == "1"


# ---------------------------------------------------------------------- request checks (pure)


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def forced_ids(params) -> Any:
    """The raw ``forced_output_ids`` of a sampling-params dict, or None when it asks for none."""
    if not isinstance(params, Mapping):
        return None
    custom = params.get("custom_params")
    if not isinstance(custom, Mapping):
        return None
    return custom.get(FORCED_KEY)


def check_forced(params, vocab_size: int, field: str = FIELD) -> list[int] | None:
    """Check one request's ``forced_output_ids`` against its other sampling params; the ids, or
    None when the request forces nothing. Raises ``ForcedRequestError`` (message starts with ``field``)."""
    ids = forced_ids(params)
    if ids is None:
        return None
    if not isinstance(ids, list) or not ids:
        raise ForcedRequestError(f"{field}: must be a non-empty list of token ids, got {ids!r:.80}")
    for position, token in enumerate(ids):
        if not _is_int(token):
            raise ForcedRequestError(f"{field}: position {position} is {token!r}, not an integer token id")
        if not 0 <= token < vocab_size:
            raise ForcedRequestError(f"{field}: token id {token} at position {position} is outside the "
                                     f"vocabulary [0, {vocab_size})")
    limit = params.get("max_new_tokens")
    if limit is not None and limit != len(ids):
        raise ForcedRequestError(f"{field}: {len(ids)} ids, but max_new_tokens is {limit!r} (give the same "
                                 "number, or leave max_new_tokens out)")
    n = params.get("n")
    if n is not None and n != 1:
        raise ForcedRequestError(f"{field}: needs n = 1 (n forced answers would be the same), got n = {n!r}")
    return ids


def fill_params(params: dict, ids: list[int]) -> None:
    """``max_new_tokens`` = len(ids) and ``ignore_eos`` = true where the client left them out."""
    params.setdefault("max_new_tokens", len(ids))
    params.setdefault("ignore_eos", True)


def check_client_processor(value, allowed: bool, forcing: bool, field: str = "custom_logit_processor") -> None:
    """A client's own processor: refused unless the operator allowed them, and never with forcing."""
    if value is None:
        return
    if not allowed:
        raise ForcedRequestError(f"{field}: client-supplied logit processors are not accepted by this server "
                                 "(start it with --enable-custom-logit-processor to allow them)")
    if forcing:
        raise ForcedRequestError(f"{field}: cannot be combined with {FIELD} (one processor per request)")


def _entries(value, single: bool, count: int) -> list:
    if single:
        return [value]
    return list(value) if isinstance(value, list) else [value] * count


def prepare_request(obj, vocab_size: int, allowed: bool, available: bool = True) -> None:
    """A normalized ``GenerateReqInput`` (single or batch) at the request entry: check each
    prompt's forcing and client processor, fill its params, attach the forced processor.
    ``allowed``: client processors are (``client_processors_allowed``); ``available``: SGLang's
    processors are on at all (off on a server not started by our launcher)."""
    single = getattr(obj, "is_single", True)
    count = 1 if single else len(obj.rid)
    params = _entries(obj.sampling_params, single, count)[:count]
    processors = _entries(obj.custom_logit_processor, single, count)[:count]
    forcing = []
    for i in range(count):
        name = FIELD if single else f"sampling_params[{i}].custom_params.{FORCED_KEY}"
        ids = check_forced(params[i], vocab_size, name)
        check_client_processor(processors[i] if i < len(processors) else None, allowed, ids is not None,
                               "custom_logit_processor" if single else f"custom_logit_processor[{i}]")
        forcing.append(ids)
    if not any(ids is not None for ids in forcing):
        return
    if not available:
        raise ForcedRequestError(f"{FIELD}: forced decoding needs a server started with python -m "
                                 "patches.launch_server (or --enable-custom-logit-processor)")
    for i, ids in enumerate(forcing):
        if ids is not None:
            fill_params(params[i], ids)
            processors[i] = processor_string()
    obj.custom_logit_processor = processors[0] if single else processors


# ---------------------------------------------------------------------- scheduler side


def next_index(req) -> int:
    """Which output position the row being sampled is for. ``len(output_ids)`` without overlap
    scheduling; with it the previous step's token is not appended yet when the next step samples,
    so the position also comes from the KV rows committed (``kv_committed_len``, advanced before
    each forward): committed - prompt. On an intermediate prefill chunk that is negative and the
    output length stands (SGLang discards that sample)."""
    done = len(req.output_ids)
    committed = getattr(req, "kv_committed_len", None)
    if _is_int(committed):
        done = max(done, committed - len(req.origin_input_ids))
    return done


def mask_forced(logits, custom_param_list) -> Any:
    """In place: in each row whose params force ids, every logit but the forced next one is -inf
    and that one 0. Rows past their forced ids, or forcing nothing, are left alone."""
    import torch

    rows, targets = [], []
    for row, custom in enumerate(custom_param_list or ()):  # each row's custom_params (not sampling params)
        ids = custom.get(FORCED_KEY) if isinstance(custom, Mapping) else None
        req = custom.get("__req__") if ids else None
        if req is None:
            continue
        index = next_index(req)
        if 0 <= index < len(ids):
            rows.append(row)
            targets.append(ids[index])
    if rows:
        row_index = torch.tensor(rows, device=logits.device)
        logits[row_index] = float("-inf")
        logits[row_index, torch.tensor(targets, device=logits.device)] = 0.0
    return logits


def _build_processor_class():
    """The ``CustomLogitProcessor`` subclass, named so that dill pickles it by reference."""
    from sglang.srt.sampling.custom_logit_processor import CustomLogitProcessor

    class ForcedLogitProcessor(CustomLogitProcessor):
        """Forces each row's next token to its request's next ``forced_output_ids`` entry."""

        def __call__(self, logits, custom_param_list=None):
            return mask_forced(logits, custom_param_list)

    ForcedLogitProcessor.__module__ = __name__
    ForcedLogitProcessor.__qualname__ = "ForcedLogitProcessor"
    return ForcedLogitProcessor


@functools.lru_cache(maxsize=None)
def _processor_class():
    return _build_processor_class()


def __getattr__(name: str):
    if name == "ForcedLogitProcessor":
        return _processor_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@functools.lru_cache(maxsize=None)
def processor_string() -> str:
    """The serialized processor a forced request carries (SGLang's ``CustomLogitProcessor.to_str``)."""
    return _processor_class().to_str()
