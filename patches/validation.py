"""Request validation in the tokenizer manager, before anything reaches the scheduler: the hooks
that run ``serving/request_checks.py`` (why each check exists, its limits), for every policy and
without one. Its ``ValueError`` becomes a 400 carrying the text (``http_server.generate_request``;
the OpenAI routes: ``OpenAIServingBase.handle_request``).

| target                                             | kind   | checks                              |
|----------------------------------------------------|--------|-------------------------------------|
| ``GenerateReqInput.normalize_batch_and_arguments`` | before | ``n``, ``input_embeds``; one rid per prompt for ``n`` > 1 |
| ``TokenizerManager._init_req_state``               | before | the whole normalized request, batch included, before any state exists; forced decoding |
| ``TokenizerManager._validate_one_request``         | after  | each prompt's final token ids; ``logprob_start_len`` |
| ``OpenAIServing{Chat,Completion}._validate_request`` | after | ``cache_salt``, ``extra_key`` before SGLang joins them |
| ``fastapi...._validate_value_with_model_field``    | around | validators that crash on non-dict JSON: a 400, not a 500 |
"""

from __future__ import annotations

from patches import forced
from serving import forced as forced_rules
from serving import request_checks as checks

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
    calls ``response_format.get``); on other JSON they raise ``AttributeError``/``TypeError``,
    which pydantic does not turn into a validation error. Here they become one (a 400)."""
    try:
        return original(*args, **kwargs)
    except (AttributeError, TypeError, KeyError, IndexError) as exc:
        loc = tuple(kwargs.get("loc") or ("body",))
        if not loc or loc[0] != "body":
            raise
        return None, [{"type": "value_error", "loc": loc, "msg": f"malformed request body: {exc}", "input": None}]


def before_normalize(obj, *args, **kwargs):
    checks.check_before_normalization(obj)
    checks.align_parallel_rids(obj)


def before_init_req_state(tokenizer_manager, obj, *args, **kwargs):
    from sglang.srt.managers.embed_types import PositionalEmbeds
    from sglang.srt.managers.io_struct import GenerateReqInput

    if not isinstance(obj, GenerateReqInput):  # embedding / classify requests
        checks.check_request_rids(obj, tokenizer_manager.rid_to_state)
        return
    args, vocab_size = tokenizer_manager.server_args, tokenizer_manager.model_config.vocab_size
    checks.check_generate_request(obj, vocab_size, tokenizer_manager.rid_to_state, PositionalEmbeds,
                                  checks.grammar_unavailable(args.grammar_backend, args.device))
    processors_on = bool(args.enable_custom_logit_processor)
    forced_rules.prepare_request(obj, vocab_size, forced_rules.client_processors_allowed(processors_on), processors_on,
                            forced.processor_string)


def after_validate_one(result, tokenizer_manager, obj, input_ids, *args, **kwargs):
    checks.check_tokenized_prompt(obj, input_ids, tokenizer_manager.model_config.vocab_size)
    return result


def after_openai_validate(result, route, request, *args, **kwargs):
    return result if result is not None else checks.check_openai_request(request)


def _check_field_tables() -> None:
    """Stop the process if SGLang's request structs no longer match ``serving``'s field tables."""
    from sglang.srt.managers.io_struct import SessionParams
    from sglang.srt.sampling.sampling_params import SamplingParams

    problem = checks.field_table_drift({s.__name__: s.__struct_fields__ for s in (SamplingParams, SessionParams)})
    if problem:
        raise SystemExit(f"cache-policy overlay: {problem}")


def install(register) -> None:
    """Register the validation hooks (every process; they act where a tokenizer manager runs)."""
    _check_field_tables()
    register(NORMALIZE, before_normalize, "before")
    register(INIT_REQ_STATE, before_init_req_state, "before")
    register(VALIDATE_ONE, after_validate_one, "after")
    register(CHAT_VALIDATE, after_openai_validate, "after")
    register(COMPLETION_VALIDATE, after_openai_validate, "after")
    register(BODY_VALIDATION, around_body_validation, "around")
