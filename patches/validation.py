"""Request validation in the tokenizer manager, before anything reaches the scheduler.

SGLang 0.5.16 lets some malformed ``/generate`` and ``/v1/chat/completions`` requests through to
the scheduler, where they raise inside the event loop: the scheduler dies and the server exits
(a token id >= the vocabulary size or < 0 fails in the embedding lookup, for one). Others fail
in the HTTP process with a ``TypeError``/``IndexError`` (a 500) or leave state behind. This
module rejects them in the main (HTTP + tokenizer manager) process with a ``ValueError``, which
SGLang's HTTP layer already turns into a 400 whose message is the error text: ``/generate``
catches ``ValueError`` (``http_server.generate_request``; a streamed request gets the error as
its one ``data:`` event), the OpenAI routes do the same in ``OpenAIServingBase.handle_request``.
Every message starts with the field it is about.

Where the checks run (hooks registered by ``install``, for every policy and without one):

| target                                         | kind   | checks                                  |
|------------------------------------------------|--------|-----------------------------------------|
| ``GenerateReqInput.normalize_batch_and_arguments`` | before | ``sampling_params`` (``n`` multiplies the request's lists; an empty list is indexed) and ``input_embeds`` (indexed); for ``n`` > 1 one rid per prompt (``align_parallel_rids``: SGLang leaks the others) |
| ``TokenizerManager._init_req_state``           | before | the whole normalized request, batch included, before any per-request state exists and before any part of a batch is sent: rids, token ids, list lengths, logprob fields, extra_key, sampling params, session_params, positional_embed_overrides; then forced decoding (``forced_output_ids``) and client ``custom_logit_processor`` (``patches/forced.py``, which attaches the forced processor) |
| ``TokenizerManager._validate_one_request``     | after  | each prompt's final token ids (text tokenized, multimodal expanded, auto-truncated): non-empty and inside the vocabulary; ``logprob_start_len`` within it |
| ``OpenAIServingChat._validate_request``,       | after  | ``cache_salt``, ``extra_key`` before SGLang joins them (a list there is a 500) |
| ``OpenAIServingCompletion._validate_request``  |        |                                         |
| ``fastapi...._validate_value_with_model_field`` | around | a request body whose pydantic ``mode="before"`` validators raise ``AttributeError``/``TypeError`` on non-dict JSON (``response_format: [1]``, ``reasoning: 5``): a 400, not a 500 |

The limits this module sets (everything else is SGLang's own range):

| limit                    | value      | why                                                          |
|--------------------------|------------|--------------------------------------------------------------|
| ``MAX_EXTRA_KEY_CHARS``  | 256        | ``extra_key`` (= ``cache_salt`` + ``extra_key`` on the OpenAI routes) is part of every radix-tree key and is written to the events file (``cache_salt``); a namespace name needs no more |
| ``MAX_N``                | 128        | ``n`` copies the request n times in the HTTP process before anything is checked (n = 1000 of 2 tokens kept the CPU server busy past a 60 s client timeout; n = 10**9 would exhaust its memory) |
| ``MAX_ABS_LOGIT_BIAS``   | 100        | OpenAI's documented range; a NaN, infinite or huge (1e308) bias made the sampler fail in the scheduler |
| ``MIN_REPETITION_PENALTY`` | 1e-3     | SGLang accepts (0, 2]; a tiny penalty divides logits into inf (scheduler crash seen at 1e-300) |
| ``MAX_TOP_K``            | 2**31 - 1  | top_k is an int32 tensor in the scheduler (crash seen at 2**40); -1 still means all |

``token_ids_logprob`` is refused on every request: in SGLang 0.5.16 any prefill or decode batch
that mixes a request asking for it with one that does not kills the scheduler
(``check_token_ids_logprob``), and which requests share a batch is not the client's choice.

Constrained decoding (``json_schema``, ``regex``, ``ebnf``, ``structural_tag``; on the OpenAI
routes also ``response_format`` and required tool calls, which become these) is refused when the
server runs SGLang's default xgrammar backend on a device it has no mask kernel for, the CPU
platform included: there the first constrained step raises in the scheduler and the server exits
(``grammar_unavailable``). llguidance applies its mask in plain torch (not exercised here).

The check functions are plain functions over plain values (dicts, lists, any object with the
request's attributes); only ``install`` and the hook bodies touch SGLang.
"""

from __future__ import annotations

import math
import re
import uuid
from typing import Iterable, Mapping

from patches import forced

MAX_EXTRA_KEY_CHARS = 256
MAX_N = 128
MAX_ABS_LOGIT_BIAS = 100.0
MIN_REPETITION_PENALTY = 1e-3
MAX_TOP_K = 2**31 - 1
# Devices on which SGLang 0.5.16's xgrammar backend can apply its token mask.
XGRAMMAR_DEVICES = frozenset({"cuda", "xpu", "musa", "npu"})

# SamplingParams fields a client may set (sglang/srt/sampling/sampling_params.py). The other
# struct fields are filled by SamplingParams itself; a client value for them skips its
# normalisation (``is_normalized``) or is overwritten.
SAMPLING_FIELDS = frozenset({
    "max_new_tokens", "stop", "stop_token_ids", "stop_regex", "temperature", "top_p", "top_k",
    "min_p", "frequency_penalty", "presence_penalty", "repetition_penalty", "min_new_tokens", "n",
    "json_schema", "regex", "ebnf", "structural_tag", "ignore_eos", "skip_special_tokens",
    "spaces_between_special_tokens", "no_stop_trim", "custom_params", "stream_interval",
    "logit_bias", "sampling_seed",
})
SAMPLING_INTERNAL_FIELDS = frozenset({
    "stop_strs", "stop_regex_strs", "stop_str_max_len", "stop_regex_max_len", "is_normalized",
})
SESSION_FIELDS = frozenset({"id", "rid", "offset", "replace", "drop_previous_output"})

_BOOL_SAMPLING = ("ignore_eos", "skip_special_tokens", "spaces_between_special_tokens", "no_stop_trim")
_GRAMMAR_SAMPLING = ("json_schema", "regex", "ebnf", "structural_tag")
_INT_SAMPLING = ("max_new_tokens", "top_k", "n")
_NUMBER_SAMPLING = ("temperature", "top_p", "min_p", "frequency_penalty", "presence_penalty", "repetition_penalty")

# Attributes of a normalized batch GenerateReqInput that ``GenerateReqInput.__getitem__`` indexes
# per request when they are lists.
BATCH_INDEXED_FIELDS = (
    "text", "input_ids", "input_embeds", "image_data", "video_data", "audio_data", "sampling_params",
    "return_logprob", "logprob_start_len", "top_logprobs_num", "token_ids_logprob",
    "return_sampling_mask", "return_hidden_states", "modalities", "lora_path", "lora_id",
    "custom_logit_processor", "positional_embed_overrides", "bootstrap_host", "bootstrap_port",
    "bootstrap_room", "bootstrap_pair_key", "decode_tp_size", "extra_key",
    "multi_item_delimiter_indices",
)


class RequestError(ValueError):
    """A request the server refuses; SGLang's HTTP layer answers a ``ValueError`` with a 400."""


# ---------------------------------------------------------------------- pure checks


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def check_token_ids(ids, vocab_size: int, field: str = "input_ids") -> None:
    """A prompt's token ids: a non-empty sequence of ints in [0, vocab_size)."""
    if ids is None:
        return
    if len(ids) == 0:
        raise RequestError(f"{field}: the prompt is empty (no token ids)")
    try:
        low, high = min(ids), max(ids)
    except TypeError:
        low = high = None
    if _is_int(low) and _is_int(high) and 0 <= low and high < vocab_size:
        return
    for position, token in enumerate(ids):
        if not _is_int(token):
            raise RequestError(f"{field}: position {position} is {token!r}, not an integer token id")
        if not 0 <= token < vocab_size:
            raise RequestError(
                f"{field}: token id {token} at position {position} is outside the vocabulary "
                f"[0, {vocab_size})"
            )


def check_rids(rids: list, in_flight: Iterable | Mapping = ()) -> None:
    """Request ids of one request (one per prompt): strings, unique, none already in flight."""
    seen = set()
    for rid in rids:
        if not isinstance(rid, str):
            raise RequestError(f"rid: must be a string, got {type(rid).__name__}")
        if rid in seen:
            raise RequestError(f"rid: {rid!r} appears more than once in this request")
        if rid in in_flight:
            raise RequestError(f"rid: a request with rid {rid!r} is already in flight")
        seen.add(rid)


def check_logprob_start_len(value, field: str = "logprob_start_len", prompt_len: int | None = None,
                            return_logprob=True) -> None:
    """-1 (no prompt logprobs) or a prompt position in [0, prompt length] (the length itself: no
    prompt logprobs). Below -1 failed an assertion in the scheduler. Past the prompt's end SGLang's
    scheduler refuses it too, but only once the request is there: the other requests of a batch
    were sent already and are computed for nobody. Not used unless ``return_logprob``."""
    if value is None:
        return
    if not _is_int(value):
        raise RequestError(f"{field}: must be an integer, got {value!r}")
    if value < -1:
        raise RequestError(f"{field}: must be -1 (none) or a prompt position >= 0, got {value}")
    if prompt_len is not None and return_logprob and value > prompt_len:
        raise RequestError(f"{field}: {value} is past the end of the prompt ({prompt_len} tokens)")


def check_top_logprobs_num(value, vocab_size: int, field: str = "top_logprobs_num") -> None:
    """0 (none) .. vocab_size."""
    if value is None:
        return
    if not _is_int(value):
        raise RequestError(f"{field}: must be an integer, got {value!r}")
    if not 0 <= value <= vocab_size:
        raise RequestError(f"{field}: must be in [0, {vocab_size}] (the vocabulary size), got {value}")


def check_token_ids_logprob(value, field: str = "token_ids_logprob") -> None:
    """Refused outright. SGLang 0.5.16 keeps these logprobs as tensors and a request without
    them as ``[]`` in the same batch lists; a prefill or decode batch that mixes the two (any
    concurrent request without ``token_ids_logprob``, once one of them returns logprobs) fails
    in the scheduler with ``AttributeError: 'list' object has no attribute 'tolist'`` and the
    server exits. A per-request check cannot keep such requests apart. (SGLang turns a single
    request's ``[]`` into None; a batch entry ``[]`` reaches the scheduler as a request with them.)"""
    if value is None:
        return
    raise RequestError(
        f"{field}: not accepted by this server: SGLang 0.5.16's scheduler fails on a batch that mixes "
        "requests with and without token_ids_logprob (the server exits); use top_logprobs_num"
    )


def check_extra_key(value, field: str = "extra_key") -> None:
    """The cache namespace: a string of at most MAX_EXTRA_KEY_CHARS characters, or None."""
    if value is None:
        return
    if not isinstance(value, str):
        raise RequestError(f"{field}: must be a string, got {type(value).__name__}")
    if len(value) > MAX_EXTRA_KEY_CHARS:
        raise RequestError(f"{field}: {len(value)} characters, at most {MAX_EXTRA_KEY_CHARS} are allowed")


def check_before_normalization(obj) -> None:
    """What ``GenerateReqInput.normalize_batch_and_arguments`` indexes or multiplies without
    checking: ``sampling_params`` (a list's first entry, ``n``) and ``input_embeds``."""
    check_parallel_n(obj.sampling_params)
    embeds = getattr(obj, "input_embeds", None)
    if embeds is not None and getattr(obj, "text", None) is None and getattr(obj, "input_ids", None) is None:
        if not isinstance(embeds, list) or not embeds or not isinstance(embeds[0], list) or not embeds[0]:
            raise RequestError("input_embeds: must be a non-empty list of embedding vectors")


def align_parallel_rids(obj, new_rid=lambda: uuid.uuid4().hex) -> None:
    """For ``n`` > 1, give the request one rid per prompt before SGLang normalizes it.

    Not a check: SGLang 0.5.16 turns a missing or string ``rid`` into n x prompts rids, records
    state for all of them, but its parallel-sampling path removes only one per prompt; the rest
    stay in the tokenizer manager forever and a SIGTERM then waits for them until the process is
    killed. A list of one rid per prompt (what SGLang requires of a client's list) avoids that;
    the names are the ones SGLang gives the first prompts (``{rid}_{i}``, or fresh uuids)."""
    params = obj.sampling_params
    first = params[0] if isinstance(params, list) and params else params
    n = first.get("n") if isinstance(first, Mapping) else None
    if not _is_int(n) or n <= 1 or isinstance(obj.rid, list):
        return
    text, ids, embeds = obj.text, obj.input_ids, getattr(obj, "input_embeds", None)
    if text is not None:
        prompts = 1 if isinstance(text, str) else len(text)
    elif ids is not None:
        prompts = 1 if not ids or not isinstance(ids[0], list) else len(ids)
    elif embeds is not None:
        prompts = 1 if embeds and embeds[0] and not isinstance(embeds[0][0], list) else len(embeds)
    else:
        return
    obj.rid = [new_rid() for _ in range(prompts)] if obj.rid is None else [f"{obj.rid}_{i}" for i in range(prompts)]


def check_parallel_n(sampling_params, field: str = "sampling_params") -> None:
    """``n`` in every sampling-params dict, checked before SGLang's normalization uses it."""
    if isinstance(sampling_params, Mapping):
        items = [(field, sampling_params)]
    elif isinstance(sampling_params, list):
        if not sampling_params:
            raise RequestError(f"{field}: an empty list (give one object, or one per prompt)")
        items = [(f"{field}[{i}]", p) for i, p in enumerate(sampling_params)]
    else:
        return
    for name, params in items:
        if not isinstance(params, Mapping) or params.get("n") is None:
            continue
        n = params["n"]
        if not _is_int(n) or not 1 <= n <= MAX_N:
            raise RequestError(f"{name}.n: must be an integer in [1, {MAX_N}], got {n!r}")


def _check_str_or_str_list(value, name: str) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return value
    raise RequestError(f"{name}: must be a string or a list of strings, got {value!r:.80}")


def grammar_unavailable(backend: str | None, device: str | None) -> str | None:
    """Why this server cannot run constrained decoding, or None. SGLang 0.5.16's xgrammar backend
    applies its token mask with a CUDA/XPU/MUSA/NPU kernel only; on any other device the
    scheduler raises ``RuntimeError: Unsupported device`` at the first masked step and exits."""
    if backend == "xgrammar" and device not in XGRAMMAR_DEVICES:
        return (f"constrained decoding with the xgrammar backend is not available on device {device} "
                f"(SGLang 0.5.16 has no kernel there to apply its token mask)")
    return None


def check_sampling_params(params, vocab_size: int, field: str = "sampling_params",
                          allowed: frozenset = SAMPLING_FIELDS, no_grammar: str | None = None) -> None:
    """The sampling-params dict of one request, where SGLang's own ``SamplingParams.verify``
    does not look or fails with something other than a ``ValueError``. ``no_grammar``: why the
    server cannot constrain decoding (``grammar_unavailable``), if it cannot."""
    if params is None:
        return
    if not isinstance(params, Mapping):
        raise RequestError(f"{field}: must be an object, got {type(params).__name__}")
    unknown = sorted(str(k) for k in params if k not in allowed)
    if unknown:
        raise RequestError(f"{field}: unknown parameter(s) {', '.join(unknown)}")

    def get(name):
        return params.get(name)

    for name in _INT_SAMPLING:
        if get(name) is not None and not _is_int(get(name)):
            raise RequestError(f"{field}.{name}: must be an integer, got {get(name)!r}")
    for name in _NUMBER_SAMPLING:
        if get(name) is not None and not _is_number(get(name)):
            raise RequestError(f"{field}.{name}: must be a number, got {get(name)!r}")
    for name in _BOOL_SAMPLING:
        if get(name) is not None and not isinstance(get(name), bool):
            raise RequestError(f"{field}.{name}: must be true or false, got {get(name)!r}")
    for name in _GRAMMAR_SAMPLING:
        if get(name) is not None and not isinstance(get(name), str):
            raise RequestError(f"{field}.{name}: must be a string, got {type(get(name)).__name__}")

    if no_grammar:
        for name in _GRAMMAR_SAMPLING:
            if get(name) is not None:
                raise RequestError(f"{field}.{name}: {no_grammar}")

    top_k = get("top_k")
    if top_k is not None and top_k > MAX_TOP_K:
        raise RequestError(f"{field}.top_k: must be -1 (all) or in [1, {MAX_TOP_K}], got {top_k}")
    penalty = get("repetition_penalty")
    if penalty is not None and 0 < penalty < MIN_REPETITION_PENALTY:
        raise RequestError(
            f"{field}.repetition_penalty: must be in [{MIN_REPETITION_PENALTY}, 2], got {penalty}"
        )

    _check_str_or_str_list(get("stop"), f"{field}.stop")
    for pattern in _check_str_or_str_list(get("stop_regex"), f"{field}.stop_regex"):
        try:
            re.compile(pattern)
        except Exception as exc:  # noqa: BLE001 - re.error, RecursionError, OverflowError
            raise RequestError(f"{field}.stop_regex: {pattern!r:.80} is not a valid regular expression: {exc}") from None

    stop_ids = get("stop_token_ids")
    if stop_ids is not None:
        if not (isinstance(stop_ids, list) and all(_is_int(t) for t in stop_ids)):
            raise RequestError(f"{field}.stop_token_ids: must be a list of integer token ids, got {stop_ids!r:.80}")
        for token in stop_ids:  # min_new_tokens indexes the logits with them (crash seen at 10**9)
            if not 0 <= token < vocab_size:
                raise RequestError(f"{field}.stop_token_ids: token id {token} is outside the vocabulary "
                                   f"[0, {vocab_size})")

    bias = get("logit_bias")
    if bias is not None:
        if not isinstance(bias, Mapping):
            raise RequestError(f"{field}.logit_bias: must be an object mapping token ids to numbers, "
                               f"got {type(bias).__name__}")
        for token, value in bias.items():
            if not _is_number(value) or not math.isfinite(value) or abs(value) > MAX_ABS_LOGIT_BIAS:
                raise RequestError(
                    f"{field}.logit_bias: the bias of token {token} must be a number in "
                    f"[-{MAX_ABS_LOGIT_BIAS:g}, {MAX_ABS_LOGIT_BIAS:g}], got {value!r}"
                )
            try:
                token_id = int(token)
            except (TypeError, ValueError):
                raise RequestError(f"{field}.logit_bias: key {token!r} is not a token id") from None
            if not 0 <= token_id < vocab_size:
                raise RequestError(f"{field}.logit_bias: token id {token_id} is outside the vocabulary "
                                   f"[0, {vocab_size})")


def check_session_params(value, allowed: frozenset = SESSION_FIELDS) -> None:
    if value is None:
        return
    if not isinstance(value, Mapping):
        raise RequestError(f"session_params: must be an object, got {type(value).__name__}")
    unknown = sorted(str(k) for k in value if k not in allowed)
    if unknown:
        raise RequestError(f"session_params: unknown field(s) {', '.join(unknown)}")


def check_positional_embed_overrides(value, embeds_type: type | None) -> None:
    """Only the Python engine can pass these (tensors); anything a JSON body can hold is refused."""
    if value is None:
        return
    items = value if isinstance(value, list) else [value]
    for item in items:
        if item is not None and (embeds_type is None or not isinstance(item, embeds_type)):
            raise RequestError("positional_embed_overrides: not accepted in a request body "
                               "(PositionalEmbeds objects from the Python engine only)")


def check_batch_lengths(obj, count: int, fields: Iterable[str] = BATCH_INDEXED_FIELDS) -> None:
    """Every per-request list of a batch holds at least one entry per request (SGLang indexes
    them without checking and answers a short one with an IndexError, a 500)."""
    for name in fields:
        value = getattr(obj, name, None)
        if isinstance(value, list) and len(value) < count:
            raise RequestError(f"{name}: {len(value)} entries for a batch of {count} requests")


def _per_request(value, single: bool, count: int) -> list:
    if single:
        return [value]
    return value if isinstance(value, list) else [value] * count


def check_generate_request(obj, vocab_size: int, in_flight: Iterable | Mapping = (),
                           embeds_type: type | None = None, no_grammar: str | None = None) -> None:
    """A normalized ``GenerateReqInput`` (single, a batch, or one request of a batch), before
    SGLang records its state and sends anything to the scheduler."""
    single = getattr(obj, "is_single", True)
    rid = obj.rid
    if single:
        if not isinstance(rid, str):
            raise RequestError(f"rid: must be a string for a single prompt, got {type(rid).__name__}")
        rids = [rid]
    else:
        rids = list(rid)
        check_batch_lengths(obj, len(rids))
    check_rids(rids, in_flight)
    count = len(rids)

    ids = obj.input_ids
    if ids is not None and obj.text is None and getattr(obj, "input_embeds", None) is None:
        for i, seq in enumerate(_per_request(ids, single, count)[:count]):
            check_token_ids(seq, vocab_size, "input_ids" if single else f"input_ids[{i}]")

    def named(name, i):
        return name if single else f"{name}[{i}]"

    prompts = [None] * count  # token ids when given (text is tokenized later: after_validate_one)
    if ids is not None and obj.text is None and getattr(obj, "input_embeds", None) is None:
        prompts = _per_request(ids, single, count)[:count]
    wants = _per_request(getattr(obj, "return_logprob", True), single, count)[:count]
    for i, value in enumerate(_per_request(obj.logprob_start_len, single, count)[:count]):
        prompt = prompts[i] if i < len(prompts) else None
        check_logprob_start_len(value, named("logprob_start_len", i), None if prompt is None else len(prompt),
                                wants[i] if i < len(wants) else True)
    for i, value in enumerate(_per_request(obj.top_logprobs_num, single, count)[:count]):
        check_top_logprobs_num(value, vocab_size, named("top_logprobs_num", i))
    for i, value in enumerate(_per_request(getattr(obj, "token_ids_logprob", None), single, count)[:count]):
        check_token_ids_logprob(value, named("token_ids_logprob", i))
    for i, value in enumerate(_per_request(obj.extra_key, single, count)[:count]):
        check_extra_key(value, named("extra_key", i))
    for i, value in enumerate(_per_request(obj.sampling_params, single, count)[:count]):
        check_sampling_params(value, vocab_size, named("sampling_params", i), no_grammar=no_grammar)
    check_session_params(getattr(obj, "session_params", None))
    check_positional_embed_overrides(getattr(obj, "positional_embed_overrides", None), embeds_type)


def check_openai_request(request) -> str | None:
    """``cache_salt``/``extra_key`` of an OpenAI chat or completion request, before SGLang joins
    them into one ``extra_key``; the error message, or None. (Everything else reaches
    ``check_generate_request`` once the request is converted.)"""
    try:
        total = 0
        for key in ("cache_salt", "extra_key"):
            value = getattr(request, key, None)
            check_extra_key(value, key)
            total += len(value or "")
        if total > MAX_EXTRA_KEY_CHARS:
            raise RequestError(f"cache_salt + extra_key: {total} characters together, at most "
                               f"{MAX_EXTRA_KEY_CHARS} are allowed")
    except RequestError as exc:
        return str(exc)
    return None


# ---------------------------------------------------------------------- SGLang glue

NORMALIZE = "sglang.srt.managers.io_struct.GenerateReqInput.normalize_batch_and_arguments"
INIT_REQ_STATE = "sglang.srt.managers.tokenizer_manager.TokenizerManager._init_req_state"
VALIDATE_ONE = "sglang.srt.managers.tokenizer_manager.TokenizerManager._validate_one_request"
CHAT_VALIDATE = "sglang.srt.entrypoints.openai.serving_chat.OpenAIServingChat._validate_request"
COMPLETION_VALIDATE = "sglang.srt.entrypoints.openai.serving_completions.OpenAIServingCompletion._validate_request"
BODY_VALIDATION = "fastapi.dependencies.utils._validate_value_with_model_field"
TARGETS = (NORMALIZE, INIT_REQ_STATE, VALIDATE_ONE, CHAT_VALIDATE, COMPLETION_VALIDATE, BODY_VALIDATION)


def around_body_validation(original, *args, **kwargs):
    """FastAPI's validation of a request body against its pydantic model. SGLang's models run
    ``mode="before"`` validators that assume dicts (``ChatCompletionRequest.set_json_schema``
    calls ``response_format.get``, ``normalize_reasoning_inputs`` ``reasoning.get``); on other
    JSON they raise ``AttributeError``/``TypeError``, which pydantic does not turn into a
    validation error, so the client got a 500. Here they become one: FastAPI raises
    ``RequestValidationError`` and SGLang answers 400."""
    try:
        return original(*args, **kwargs)
    except (AttributeError, TypeError, KeyError, IndexError) as exc:
        loc = tuple(kwargs.get("loc") or ("body",))
        if not loc or loc[0] != "body":
            raise
        return None, [{"type": "value_error", "loc": loc, "msg": f"malformed request body: {exc}", "input": None}]


def _vocab_size(tokenizer_manager) -> int:
    return tokenizer_manager.model_config.vocab_size


def before_normalize(obj, *args, **kwargs):
    check_before_normalization(obj)
    align_parallel_rids(obj)


def before_init_req_state(tokenizer_manager, obj, *args, **kwargs):
    from sglang.srt.managers.embed_types import PositionalEmbeds
    from sglang.srt.managers.io_struct import GenerateReqInput

    if isinstance(obj, GenerateReqInput):
        args = tokenizer_manager.server_args
        check_generate_request(obj, _vocab_size(tokenizer_manager), tokenizer_manager.rid_to_state,
                               PositionalEmbeds, grammar_unavailable(args.grammar_backend, args.device))
        # Forced decoding and client logit processors (patches/forced.py): checked, then attached.
        forced.prepare_request(obj, _vocab_size(tokenizer_manager), forced.client_processors_allowed(args),
                               bool(args.enable_custom_logit_processor))
    else:  # embedding / classify requests: their ids key the same state dict
        rids = [obj.rid] if getattr(obj, "is_single", True) else list(obj.rid)
        check_rids(rids, tokenizer_manager.rid_to_state)


def after_validate_one(result, tokenizer_manager, obj, input_ids, *args, **kwargs):
    if input_ids is not None and getattr(obj, "input_embeds", None) is None:
        field = "input_ids" if getattr(obj, "input_ids", None) is not None else "text (tokenized)"
        check_token_ids(input_ids, _vocab_size(tokenizer_manager), field)
        check_logprob_start_len(getattr(obj, "logprob_start_len", None), "logprob_start_len", len(input_ids),
                                getattr(obj, "return_logprob", False))
    return result


def after_openai_validate(result, serving, request, *args, **kwargs):
    return result if result is not None else check_openai_request(request)


def _check_field_tables() -> None:
    """The field tables above are SGLang 0.5.16's; stop the process if they no longer match."""
    from sglang.srt.managers.io_struct import SessionParams
    from sglang.srt.sampling.sampling_params import SamplingParams

    for struct, ours in ((SamplingParams, SAMPLING_FIELDS | SAMPLING_INTERNAL_FIELDS), (SessionParams, SESSION_FIELDS)):
        theirs = set(struct.__struct_fields__)
        if theirs != ours:
            raise SystemExit(
                f"cache-policy overlay: {struct.__name__} fields changed (SGLang internals changed?): "
                f"{sorted(theirs ^ ours)}; update patches/validation.py"
            )


def install(register) -> None:
    """Register the validation hooks (every process; they act where a tokenizer manager runs)."""
    _check_field_tables()
    register(NORMALIZE, before_normalize, "before")
    register(INIT_REQ_STATE, before_init_req_state, "before")
    register(VALIDATE_ONE, after_validate_one, "after")
    register(CHAT_VALIDATE, after_openai_validate, "after")
    register(COMPLETION_VALIDATE, after_openai_validate, "after")
    register(BODY_VALIDATION, around_body_validation, "around")
