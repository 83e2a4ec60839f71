"""Request checks: what a ``/generate`` or OpenAI request must satisfy before SGLang keeps any
state for it or sends any part of it to the scheduler.

SGLang 0.5.16 lets some malformed requests through to the scheduler, where they raise inside
the event loop and the server exits (a token id >= the vocabulary size or < 0 fails in the
embedding lookup, for one); others fail in the HTTP process with a ``TypeError``/``IndexError``
(a 500) or leave state behind. Each check here raises ``RequestError`` (a ``ValueError``, which
SGLang answers with a 400) whose message starts with the field it is about. The field rules and
the limits they set are in ``serving/field_rules.py``; ``patches/validation.py`` calls these
functions from its hooks.

The checks read plain values: dicts, lists, and any object with the request's attributes
(``GenerateReqInput`` in the server, a ``SimpleNamespace`` in the tests).
"""

from __future__ import annotations

import uuid
from typing import Iterable, Mapping

from policy.namespace import name_problem
from serving import request_limits
from serving.field_rules import (
    PROMPT_RULES,
    SAMPLING_RULES,
    Context,
    RequestError,
    check_field,
    is_int,
    mapping,
    parallel_n,
    token_position_problem,
)

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
# SGLang 0.5.16's structs -> the fields the tables above expect them to have.
STRUCT_FIELDS = {
    "SamplingParams": SAMPLING_FIELDS | SAMPLING_INTERNAL_FIELDS,
    "SessionParams": SESSION_FIELDS,
}

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

# Batch fields that ``GenerateReqInput.__getitem__`` reads as "none" when empty (``if self.modalities``).
EMPTY_MEANS_NONE = frozenset({"modalities"})


def field_table_drift(struct_fields: Mapping[str, Iterable[str]]) -> str | None:
    """Why the field tables no longer describe SGLang's structs (name -> its fields), or None."""
    for name, fields in struct_fields.items():
        theirs, ours = set(fields), STRUCT_FIELDS[name]
        if theirs != ours:
            return (f"{name} fields changed (SGLang internals changed?): {sorted(theirs ^ ours)}; "
                    "update serving/request_checks.py")
    return None


def check_token_ids(ids, vocab_size: int, field: str = "input_ids") -> None:
    """A prompt's token ids: a non-empty sequence of ints in [0, vocab_size)."""
    if ids is None:
        return
    if len(ids) == 0:
        raise RequestError(f"{field}: the prompt is empty (no token ids)")
    # Long prompts: a type pass and a min/max pass (all in C) usually settle it; the
    # per-position scan names the culprit. Every element's type is checked: [0, 2.5, 3] has
    # valid ends but must not reach the scheduler.
    if set(map(type, ids)) == {int} and 0 <= min(ids) and max(ids) < vocab_size:
        return
    problem = token_position_problem(ids, vocab_size)
    if problem is not None:
        raise RequestError(f"{field}: {problem}")


def check_rids(rids: list, in_flight: Iterable | Mapping = ()) -> None:
    """Request ids of one request (one per prompt): strings, unique, none already in flight."""
    seen = set()
    for rid in rids:
        if not isinstance(rid, str):
            raise RequestError(f"rid: must be a string, got {type(rid).__name__}")
        if rid == "":
            raise RequestError("rid: must not be empty (omit it and the server makes one)")
        if rid in seen:
            raise RequestError(f"rid: {rid!r} appears more than once in this request")
        if rid in in_flight:
            raise RequestError(f"rid: a request with rid {rid!r} is already in flight")
        seen.add(rid)


def check_request_rids(obj, in_flight: Iterable | Mapping = ()) -> None:
    """An embedding or classify request: only its rids (they key the same state as generate's)."""
    check_rids([obj.rid] if getattr(obj, "is_single", True) else list(obj.rid), in_flight)


def check_logprob_start_len(value, field: str = "logprob_start_len", prompt_len: int | None = None,
                            return_logprob=True) -> None:
    """See ``field_rules.logprob_start``; ``prompt_len`` None: not known yet (text)."""
    context = Context(prompt_len=prompt_len, return_logprob=return_logprob)
    check_field(field, value, PROMPT_RULES["logprob_start_len"], context)


def check_top_logprobs_num(value, vocab_size: int, field: str = "top_logprobs_num") -> None:
    """0 (none) .. vocab_size."""
    check_field(field, value, PROMPT_RULES["top_logprobs_num"], Context(vocab_size))


def check_token_ids_logprob(value, field: str = "token_ids_logprob") -> None:
    """Refused outright: see ``field_rules.refused_token_ids_logprob``."""
    check_field(field, value, PROMPT_RULES["token_ids_logprob"])


def check_extra_key(value, field: str = "extra_key") -> None:
    """The cache namespace (``field_rules.namespace_key``), or None."""
    check_field(field, value, PROMPT_RULES["extra_key"])


def check_before_normalization(obj) -> None:
    """What ``GenerateReqInput.normalize_batch_and_arguments`` indexes or multiplies without
    checking: ``sampling_params`` (a list's first entry, ``n``) and ``input_embeds``."""
    check_parallel_n(obj.sampling_params)
    embeds = getattr(obj, "input_embeds", None)
    if embeds is not None and getattr(obj, "text", None) is None and getattr(obj, "input_ids", None) is None:
        if not isinstance(embeds, list) or not embeds or not isinstance(embeds[0], list) or not embeds[0]:
            raise RequestError("input_embeds: must be a non-empty list of embedding vectors")


def check_request_limits(obj, limits: request_limits.RequestLimits) -> None:
    """What one not yet normalized ``GenerateReqInput`` may cost (``serving/request_limits.py``):
    its prompts, prompts x ``n``, and its ``stop_regex`` patterns, before SGLang copies the request
    per sequence or parses any pattern. Runs after ``check_before_normalization`` (``n`` is valid)."""
    prompts = _prompt_count(obj)
    if prompts is not None:
        params = obj.sampling_params
        first = params[0] if isinstance(params, list) and params else params
        n = first.get("n") if isinstance(first, Mapping) else None
        field = next(name for name in ("text", "input_ids", "input_embeds") if getattr(obj, name, None) is not None)
        problem = request_limits.batch_problem(prompts, n if is_int(n) else 1, limits, field)
        if problem is not None:
            raise RequestError(problem)
    problem = request_limits.stop_regex_problem(request_limits.stop_regexes_of(obj.sampling_params), limits)
    if problem is not None:
        raise RequestError(problem)


def _prompt_count(obj) -> int | None:
    """How many prompts a not yet normalized request holds (None: no prompt given)."""
    return request_limits.prompt_count(obj.text, obj.input_ids, getattr(obj, "input_embeds", None))


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
    if not is_int(n) or n <= 1 or isinstance(obj.rid, list):
        return
    prompts = _prompt_count(obj)
    if prompts is None:
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
        if isinstance(params, Mapping):
            check_field(f"{name}.n", params.get("n"), (parallel_n,))


def grammar_unavailable(backend: str | None, device: str | None) -> str | None:
    """Why this server cannot run constrained decoding, or None. SGLang 0.5.16's xgrammar backend
    applies its token mask with a CUDA/XPU/MUSA/NPU kernel only; on any other device (the CPU
    platform included) the scheduler raises ``RuntimeError: Unsupported device`` at the first
    masked step and exits. llguidance applies its mask in plain torch (not exercised here)."""
    if backend == "xgrammar" and device not in XGRAMMAR_DEVICES:
        return (f"constrained decoding with the xgrammar backend is not available on device {device} "
                f"(SGLang 0.5.16 has no kernel there to apply its token mask)")
    return None


def _check_known_fields(field: str, value, allowed: frozenset, noun: str) -> None:
    """``value`` is an object whose keys are all in ``allowed``."""
    check_field(field, value, (mapping,))
    unknown = sorted(str(k) for k in value if k not in allowed)
    if unknown:
        raise RequestError(f"{field}: unknown {noun}(s) {', '.join(unknown)}")


def check_sampling_params(params, vocab_size: int, field: str = "sampling_params",
                          allowed: frozenset = SAMPLING_FIELDS, no_grammar: str | None = None,
                          regex_problem=None) -> None:
    """The sampling-params dict of one request, where SGLang's own ``SamplingParams.verify``
    does not look or fails with something other than a ``ValueError`` (``SAMPLING_RULES``).
    ``no_grammar``: why the server cannot constrain decoding (``grammar_unavailable``), if it cannot;
    ``regex_problem``: the server's verdict on a stop regex (``Context.regex_problem``)."""
    if params is None:
        return
    _check_known_fields(field, params, allowed, "parameter")
    context = Context(vocab_size, no_grammar, regex_problem=regex_problem)
    for name, rule in SAMPLING_RULES:
        check_field(f"{field}.{name}", params.get(name), (rule,), context)


def check_session_params(value, allowed: frozenset = SESSION_FIELDS) -> None:
    if value is not None:
        _check_known_fields("session_params", value, allowed, "field")


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
    them without checking and answers a short one with an IndexError, a 500). An empty list
    where SGLang reads empty as "none" (``EMPTY_MEANS_NONE``) is not a batch list: the OpenAI
    chat route sends ``modalities: []`` with ``n`` > 1."""
    for name in fields:
        value = getattr(obj, name, None)
        if value == [] and name in EMPTY_MEANS_NONE:
            continue
        if isinstance(value, list) and len(value) < count:
            raise RequestError(f"{name}: {len(value)} entries for a batch of {count} requests")


def per_request(value, single: bool, count: int) -> list:
    """A request attribute as one entry per prompt (a batch's scalar applies to every prompt)."""
    if single:
        return [value]
    return (list(value) if isinstance(value, list) else [value] * count)[:count]


def _generate_rids(obj, single: bool) -> list:
    if not single:
        rids = list(obj.rid)
        check_batch_lengths(obj, len(rids))
        return rids
    if not isinstance(obj.rid, str):
        raise RequestError(f"rid: must be a string for a single prompt, got {type(obj.rid).__name__}")
    return [obj.rid]


def _prompt_contexts(obj, single: bool, count: int, vocab_size: int, no_grammar) -> list[Context]:
    """One ``Context`` per prompt; checks the token ids of prompts given as ids on the way."""
    ids = obj.input_ids
    prompts = [None] * count  # text is tokenized later: ``check_tokenized_prompt``
    if ids is not None and obj.text is None and getattr(obj, "input_embeds", None) is None:
        prompts = per_request(ids, single, count)
        for i, prompt in enumerate(prompts):
            check_token_ids(prompt, vocab_size, "input_ids" if single else f"input_ids[{i}]")
    lengths = [None if prompt is None else len(prompt) for prompt in prompts]
    wants = per_request(getattr(obj, "return_logprob", True), single, count)
    return [Context(vocab_size, no_grammar, lengths[i], wants[i]) for i in range(count)]


def check_generate_request(obj, vocab_size: int, in_flight: Iterable | Mapping = (),
                           embeds_type: type | None = None, no_grammar: str | None = None,
                           regex_problem=None) -> None:
    """A normalized ``GenerateReqInput`` (single, a batch, or one request of a batch), before
    SGLang records its state and sends anything to the scheduler. Each field is checked for
    every prompt before the next field (``PROMPT_RULES`` order, then the sampling params)."""
    single = getattr(obj, "is_single", True)
    rids = _generate_rids(obj, single)
    check_rids(rids, in_flight)
    count = len(rids)
    contexts = _prompt_contexts(obj, single, count, vocab_size, no_grammar)

    def named(name: str, i: int) -> str:
        return name if single else f"{name}[{i}]"

    for name, rules in PROMPT_RULES.items():
        for i, value in enumerate(per_request(getattr(obj, name, None), single, count)):
            check_field(named(name, i), value, rules, contexts[i])
    for i, params in enumerate(per_request(obj.sampling_params, single, count)):
        check_sampling_params(params, vocab_size, named("sampling_params", i), no_grammar=no_grammar,
                              regex_problem=regex_problem)
    check_session_params(getattr(obj, "session_params", None))
    check_positional_embed_overrides(getattr(obj, "positional_embed_overrides", None), embeds_type)


def check_tokenized_prompt(obj, input_ids, vocab_size: int) -> None:
    """One prompt's final token ids (text tokenized, multimodal expanded, auto-truncated):
    non-empty and inside the vocabulary; ``logprob_start_len`` within them."""
    if input_ids is None or getattr(obj, "input_embeds", None) is not None:
        return
    field = "input_ids" if getattr(obj, "input_ids", None) is not None else "text (tokenized)"
    check_token_ids(input_ids, vocab_size, field)
    check_logprob_start_len(getattr(obj, "logprob_start_len", None), "logprob_start_len", len(input_ids),
                            getattr(obj, "return_logprob", False))


def check_openai_request(request) -> str | None:
    """``cache_salt``/``extra_key`` of an OpenAI chat or completion request, before SGLang makes
    them one namespace (``policy.namespace.namespace``); the error message, or None. (The body
    schema refused them already on the HTTP routes; this also covers other callers. Everything
    else reaches ``check_generate_request`` once the request is converted.)"""
    for key in ("cache_salt", "extra_key"):
        problem = name_problem(getattr(request, key, None))
        if problem is not None:
            return f"{key}: {problem}"
    return None
