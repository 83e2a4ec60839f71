"""Forced decoding: the server answers with exactly the token ids the client gives.

A request asks for it in its sampling params, with no server flag::

    {"input_ids": [...], "sampling_params": {"custom_params": {"forced_output_ids": [ids...]},
     "max_new_tokens": len(ids), "ignore_eos": true, "temperature": 0}}

``python -m eval.replay`` uses it to replay a recorded trace: the cache decisions depend only on
the token sequences, so a trace recorded once with the real model can be replayed under every
policy on any model with the same vocabulary and the cost side measured exactly.

The rules (this module; ``patches/forced.py`` holds the SGLang processor that applies them):

* at the request entry ``prepare_request`` checks ``forced_output_ids`` (a 400 naming
  ``sampling_params.custom_params.forced_output_ids``), fills ``max_new_tokens`` and
  ``ignore_eos`` when absent, and sets the request's ``custom_logit_processor`` to the forced
  processor; a client-supplied ``custom_logit_processor`` (dill-pickled code, run in the
  scheduler) is refused unless the operator enabled them;
* in the scheduler each sampled row whose custom params force ids gets its next forced id
  (``forced_targets``): every logit but that one becomes -inf, that one 0, before any sampling.

What forcing does not change: the prompt, the prefill, the radix tree (the forced ids are
inserted exactly as a model's own output is), events and ``cached_tokens``. Stop conditions
still apply: a forced id that is a stop token ends the answer there unless ``ignore_eos``
(filled as true when absent) and no ``stop``/``stop_token_ids`` match it.

Logprobs: SGLang computes output logprobs from the processed logits, so each forced token has
logprob 0.0 and every other token -inf (top logprobs included), at any temperature. They say
nothing about the model; to score the model's probability of a forced text, send prompt +
completion as the prompt with ``return_logprob`` and ``logprob_start_len`` (prompt logprobs are
computed before any processor).

Through a router: ``sglang-router`` re-encodes ``/generate`` bodies through its own typed request
and drops ``sampling_params.custom_params`` (it keeps ``custom_logit_processor``, ``rid`` and
``extra_key``). A request may therefore carry the same ids as a JSON object in the processor field,
``"custom_logit_processor": "{\"forced_output_ids\": [ids...]}"`` (``envelope(ids)``). Such a
string is read as data, never unpickled: ``prepare_request`` moves the ids into the request's
custom params and replaces the field with the forced processor, and every rule above applies
(errors name ``custom_logit_processor.forced_output_ids``). Any other client string there is
still a client processor (refused unless the operator allowed them).

Limits: one custom processor per request, so ``forced_output_ids`` cannot be combined with a
client processor; ``n`` must be 1 (n forced answers would be identical); speculative decoding is
not supported (the processor forces one token per row).
"""

from __future__ import annotations

import json
import os
from typing import Any, Callable, Mapping

from serving.field_rules import RequestError, is_int, shown, token_position_problem
from serving.request_checks import per_request

FORCED_KEY = "forced_output_ids"
FIELD = f"sampling_params.custom_params.{FORCED_KEY}"
ENVELOPE_FIELD = f"custom_logit_processor.{FORCED_KEY}"
# Set by the launcher (``patches.forced.enable``): "1" when the operator passed
# --enable-custom-logit-processor, which our launcher then turns on for every server.
CLIENT_PROCESSORS_ENV = "CACHE_POLICY_CLIENT_LOGIT_PROCESSORS"


def client_processors_allowed(sglang_flag: bool) -> bool:
    """Whether a client may send its own ``custom_logit_processor``. Without our launcher (no
    env var) SGLang's ``enable_custom_logit_processor`` (``sglang_flag``) says it, as in stock SGLang."""
    flag = os.environ.get(CLIENT_PROCESSORS_ENV)
    return bool(sglang_flag) if flag is None else flag == "1"


def forced_ids(params) -> Any:
    """The raw ``forced_output_ids`` of a sampling-params dict, or None when it asks for none."""
    if not isinstance(params, Mapping):
        return None
    custom = params.get("custom_params")
    if not isinstance(custom, Mapping):
        return None
    return custom.get(FORCED_KEY)


def envelope(ids) -> str:
    """The router-safe spelling of forced ids: a JSON object for the ``custom_logit_processor`` field."""
    return json.dumps({FORCED_KEY: list(ids)}, separators=(",", ":"))


class EnvelopeError(ValueError):
    """A ``custom_logit_processor`` string that starts as JSON but cannot be read as data at all."""


def unwrap_envelope(value) -> Any:
    """The ids of a ``custom_logit_processor`` string that is an ``envelope``; None for anything
    else (no value, a serialized processor, JSON that is not exactly ``{"forced_output_ids": ...}``).
    JSON nested deeper than Python's parser recurses (a 100,000-deep envelope: ``RecursionError``,
    which used to escape as a 500) raises ``EnvelopeError``."""
    if not isinstance(value, str) or not value.lstrip().startswith("{"):
        return None
    try:
        data = json.loads(value)
    except ValueError:
        return None
    except RecursionError:
        raise EnvelopeError("JSON nested deeper than the server parses; an envelope is "
                            '{"forced_output_ids": [ids...]}') from None
    return data[FORCED_KEY] if isinstance(data, dict) and set(data) == {FORCED_KEY} else None


def take_envelope(params, processor, processor_field: str) -> tuple[Any, Any, bool]:
    """(params, processor, from_envelope) for one prompt: an envelope's ids moved into
    ``params.custom_params`` and the processor cleared; anything else unchanged. Ids given both
    ways, or an envelope that cannot be parsed (``EnvelopeError``), are a ``RequestError`` naming
    the field (``processor_field``, e.g. ``custom_logit_processor[1]``)."""
    field = f"{processor_field}.{FORCED_KEY}"
    try:
        ids = unwrap_envelope(processor)
    except EnvelopeError as exc:
        raise RequestError(f"{processor_field}: {exc}") from None
    if ids is None:
        return params, processor, False
    if forced_ids(params) is not None:
        raise RequestError(f"{field}: forced ids given twice (here and in {FIELD}); give one")
    params = dict(params) if isinstance(params, Mapping) else {}  # a batch may share one dict
    custom = params.get("custom_params")
    params["custom_params"] = {**(custom if isinstance(custom, Mapping) else {}), FORCED_KEY: ids}
    return params, None, True


def check_forced(params, vocab_size: int, field: str = FIELD) -> list[int] | None:
    """Check one request's ``forced_output_ids`` against its other sampling params; the ids, or
    None when the request forces nothing. Raises ``RequestError`` (message starts with ``field``)."""
    ids = forced_ids(params)
    if ids is None:
        return None
    if not isinstance(ids, list) or not ids:
        raise RequestError(f"{field}: must be a non-empty list of token ids, got {shown(ids)}")
    problem = token_position_problem(ids, vocab_size)
    if problem is not None:
        raise RequestError(f"{field}: {problem}")
    limit = params.get("max_new_tokens")
    if limit is not None and limit != len(ids):
        raise RequestError(f"{field}: {len(ids)} ids, but max_new_tokens is {limit!r} (give the same "
                           "number, or leave max_new_tokens out)")
    n = params.get("n")
    if n is not None and n != 1:
        raise RequestError(f"{field}: needs n = 1 (n forced answers would be the same), got n = {n!r}")
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
        raise RequestError(f"{field}: client-supplied logit processors are not accepted by this server "
                           "(start it with --enable-custom-logit-processor to allow them)")
    if forcing:
        raise RequestError(f"{field}: cannot be combined with {FIELD} (one processor per request)")


def prepare_request(obj, vocab_size: int, allowed: bool, available: bool, processor: Callable[[], str]) -> None:
    """A normalized ``GenerateReqInput`` (single or batch) at the request entry: check each
    prompt's forcing and client processor, fill its params, attach ``processor()`` (the
    serialized forced processor). ``allowed``: client processors are; ``available``: SGLang's
    processors are on at all (off on a server not started by our launcher). Mutates ``obj``."""
    single = getattr(obj, "is_single", True)
    count = 1 if single else len(obj.rid)
    params = per_request(obj.sampling_params, single, count)
    processors = per_request(obj.custom_logit_processor, single, count)
    forcing, enveloped = [], False
    for i in range(count):
        processor_name = "custom_logit_processor" if single else f"custom_logit_processor[{i}]"
        params[i], given, from_envelope = take_envelope(params[i], processors[i] if i < len(processors) else None,
                                                        processor_name)
        enveloped |= from_envelope
        name = (f"{processor_name}.{FORCED_KEY}" if from_envelope
                else FIELD if single else f"sampling_params[{i}].custom_params.{FORCED_KEY}")
        ids = check_forced(params[i], vocab_size, name)
        check_client_processor(given, allowed, ids is not None, processor_name)
        forcing.append(ids)
    if enveloped:
        obj.sampling_params = params[0] if single else params
    if all(ids is None for ids in forcing):
        return
    if not available:
        raise RequestError(f"{FIELD}: forced decoding needs a server started with python -m "
                           "patches.launch_server (or --enable-custom-logit-processor)")
    for i, ids in enumerate(forcing):
        if ids is not None:
            fill_params(params[i], ids)
            processors[i] = processor()
    obj.custom_logit_processor = processors[0] if single else processors


def next_index(req) -> int:
    """Which output position the row being sampled is for. ``len(output_ids)`` without overlap
    scheduling; with it the previous step's token is not appended yet when the next step samples,
    so the position also comes from the KV rows committed (``kv_committed_len``, advanced before
    each forward): committed - prompt. On an intermediate prefill chunk that is negative and the
    output length stands (SGLang discards that sample)."""
    done = len(req.output_ids)
    committed = getattr(req, "kv_committed_len", None)
    if is_int(committed):
        done = max(done, committed - len(req.origin_input_ids))
    return done


def forced_targets(custom_param_list) -> list[tuple[int, int]]:
    """(row, forced id) for each sampled row whose custom params force its next id; rows past
    their forced ids, or forcing nothing, are left out. Each row's custom params carry the
    request itself as ``"__req__"`` (SGLang's ``Req.__init__`` puts it there)."""
    targets = []
    for row, custom in enumerate(custom_param_list or ()):
        ids = custom.get(FORCED_KEY) if isinstance(custom, Mapping) else None
        req = custom.get("__req__") if ids else None
        if req is None:
            continue
        index = next_index(req)
        if 0 <= index < len(ids):
            targets.append((row, ids[index]))
    return targets
