"""Request validation in the tokenizer manager, before anything reaches the scheduler: the hooks
that run ``serving/request_checks.py`` (why each check exists, its limits), for every policy and
without one. Its ``ValueError`` becomes a 400 carrying the text (``http_server.generate_request``;
the OpenAI routes: ``OpenAIServingBase.handle_request``).

| target                                             | kind   | checks                              |
|----------------------------------------------------|--------|-------------------------------------|
| ``GenerateReqInput.normalize_batch_and_arguments`` | before | ``n``, ``input_embeds``; the request limits (prompts, prompts x ``n``, ``stop_regex`` count and length: ``serving/request_limits.py``); one rid per prompt for ``n`` > 1 |
| ``TokenizerManager._init_req_state``               | before | the whole normalized request, batch included, before any state exists; forced decoding |
| ``TokenizerManager._validate_one_request``         | after  | each prompt's final token ids; ``logprob_start_len`` |
| ``OpenAIServing{Chat,Completion}._validate_request`` | after | ``cache_salt``, ``extra_key`` before SGLang joins them |
| ``fastapi...._validate_value_with_model_field``    | around | the body schema of ``/generate`` and the OpenAI routes (``serving/route_schemas.py``, built from SGLang's own request types) on the raw JSON; validators that crash on non-dict JSON: a 400, not a 500 |
| ``OpenAIServingBase._compute_extra_key``           | around | the namespace of ``cache_salt`` and ``extra_key``, injective (``policy/namespace.py``) instead of concatenated |
| ``starlette.requests.Request.json``                | around | a body nested past the JSON parser: a 400 saying so (``patches/request_bodies.py``, which also bounds the generating routes' body size) |

The schema is also served, as JSON, at ``GET /cache_policy/request_schema`` (``serve_schema``), so
a client (``eval.soak``'s fuzz) can walk exactly what this server enforces.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect

from patches import forced, request_bodies, stop_regex
from policy import namespace
from serving import forced as forced_rules
from serving import request_checks as checks
from serving import request_limits
from serving import route_schemas as route_schema_rules
from serving import schema
from serving.log_lines import one_line

NORMALIZE = "sglang.srt.managers.io_struct.GenerateReqInput.normalize_batch_and_arguments"
INIT_REQ_STATE = "sglang.srt.managers.tokenizer_manager.TokenizerManager._init_req_state"
VALIDATE_ONE = "sglang.srt.managers.tokenizer_manager.TokenizerManager._validate_one_request"
CHAT_VALIDATE = "sglang.srt.entrypoints.openai.serving_chat.OpenAIServingChat._validate_request"
COMPLETION_VALIDATE = "sglang.srt.entrypoints.openai.serving_completions.OpenAIServingCompletion._validate_request"
BODY_VALIDATION = "fastapi.dependencies.utils._validate_value_with_model_field"
EXTRA_KEY = "sglang.srt.entrypoints.openai.serving_base.OpenAIServingBase._compute_extra_key"
TARGETS = (NORMALIZE, INIT_REQ_STATE, VALIDATE_ONE, CHAT_VALIDATE, COMPLETION_VALIDATE, BODY_VALIDATION, EXTRA_KEY,
           request_bodies.REQUEST_JSON)
SCHEMA_PATH = "/cache_policy/request_schema"
_JSON_TYPES = (dict, list, str, int, float)


@functools.lru_cache(maxsize=1)
def route_schemas() -> dict:
    """Route -> ``RouteSchema``, built once from SGLang 0.5.16's request types."""
    from sglang.srt.entrypoints.openai.protocol import ChatCompletionRequest, CompletionRequest
    from sglang.srt.managers.io_struct import GenerateReqInput, SessionParams
    from sglang.srt.sampling.sampling_params import SamplingParams
    from transformers import PreTrainedTokenizerBase

    parameters = inspect.signature(PreTrainedTokenizerBase.apply_chat_template).parameters.values()
    template_arguments = [p.name for p in parameters if p.name != "self" and p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)]
    return route_schema_rules.build_routes(GenerateReqInput, SamplingParams, SessionParams, CompletionRequest,
                                           ChatCompletionRequest, [*template_arguments, *template_render_arguments()])


# What transformers' renderer passes to the chat template besides the client's kwargs: found in its
# source (below); these must be among them, or the renderer changed and the list is not trusted.
RENDER_ARGUMENTS_EXPECTED = frozenset({"messages", "add_generation_prompt"})


def template_render_arguments() -> list[str]:
    """The keyword arguments transformers' ``render_jinja_template`` gives the template itself
    (``compiled_template.render(messages=chat, tools=..., **kwargs)``): a ``chat_template_kwargs``
    key among them raised "got multiple values for keyword argument 'messages'" (a 500). Read from
    the renderer's source, so a renamed or added argument is found; stops the process if the
    expected ones are missing (transformers changed)."""
    import textwrap

    from transformers.utils import chat_template_utils

    renderer = chat_template_utils.render_jinja_template
    tree = ast.parse(textwrap.dedent(inspect.getsource(renderer)))
    found = {keyword.arg for node in ast.walk(tree) if isinstance(node, ast.Call) and _calls_a_template(node.func)
             for keyword in node.keywords if keyword.arg is not None}
    if not RENDER_ARGUMENTS_EXPECTED <= found:
        raise SystemExit(f"cache-policy overlay: transformers' render_jinja_template no longer passes "
                         f"{sorted(RENDER_ARGUMENTS_EXPECTED - found)} to the template (transformers changed?)")
    own = [name for name, p in inspect.signature(renderer).parameters.items() if p.kind is not p.VAR_KEYWORD]
    return sorted(found | set(own))


def _calls_a_template(func) -> bool:
    """``template.render(...)`` or ``_render_with_assistant_indices(...)``."""
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
    return name == "render" or name.startswith("_render")


@functools.lru_cache(maxsize=1)
def _schema_by_class() -> dict:
    from sglang.srt.entrypoints.openai.protocol import ChatCompletionRequest, CompletionRequest
    from sglang.srt.managers.io_struct import GenerateReqInput

    routes = route_schemas()
    return {GenerateReqInput: routes[route_schema_rules.GENERATE], CompletionRequest: routes[route_schema_rules.COMPLETIONS],
            ChatCompletionRequest: routes[route_schema_rules.CHAT]}


def _route_of(field):
    """The ``RouteSchema`` of a body field whose model is one of SGLang's generating requests."""
    model = getattr(getattr(field, "field_info", None), "annotation", None)
    if not str(getattr(model, "__module__", "")).startswith("sglang."):
        return None
    return _schema_by_class().get(model)


def _refuse(problem):
    """A 400 whose message is the problem itself (``"<field>: <problem>"``), as every other check
    answers; raised from inside FastAPI's body validation, SGLang's handler for ``HTTPException``
    writes it (the OpenAI error shape on the OpenAI routes)."""
    from fastapi import HTTPException

    raise HTTPException(status_code=400, detail=one_line(str(problem)))


# Route -> (its prompt fields in SGLang's order, the path to n): the request limits read on the raw
# body, before its schema is walked (``request_limits.body_batch_problem``).
BATCH_FIELDS = {
    route_schema_rules.GENERATE: (("text", "input_ids", "input_embeds"), "sampling_params.n"),
    route_schema_rules.COMPLETIONS: (("prompt",), "n"),
    route_schema_rules.CHAT: (("messages",), "n"),
}


def around_body_validation(original, *args, **kwargs):
    """FastAPI's validation of a request body against its model. First, on the routes that start
    a generation, the batch size against the request limits (before walking millions of prompts),
    then the raw JSON against the route's schema (a 400 naming the field; ``null`` for a defaulted
    field removed). Then SGLang's models, whose ``mode="before"`` validators assume
    dicts (``ChatCompletionRequest.set_json_schema`` calls ``response_format.get``): on other JSON
    they raise ``AttributeError``/``TypeError``, which pydantic does not turn into a validation
    error. Here they become one (a 400)."""
    value = kwargs.get("value")
    route = _route_of(kwargs.get("field"))
    if route is not None and tuple(kwargs.get("loc") or ()) == ("body",) and isinstance(value, _JSON_TYPES):
        if isinstance(value, dict):
            problem = request_limits.body_batch_problem(value, *BATCH_FIELDS[route.route], request_limits.current())
            if problem is not None:
                _refuse(problem)
        try:
            kwargs["value"] = route.check(value)
        except schema.SchemaError as exc:
            _refuse(exc)
    try:
        return original(*args, **kwargs)
    except (AttributeError, TypeError, KeyError, IndexError) as exc:
        loc = tuple(kwargs.get("loc") or ("body",))
        if not loc or loc[0] != "body":
            raise
        return None, [{"type": "value_error", "loc": loc, "msg": f"malformed request body: {exc}", "input": None}]


def around_compute_extra_key(original, serving, request, *args, **kwargs):
    """The request's namespace from its two names, injective (SGLang joined them with nothing)."""
    try:
        return namespace.namespace(getattr(request, "cache_salt", None), getattr(request, "extra_key", None))
    except ValueError as exc:
        raise checks.RequestError(f"cache_salt / extra_key: {exc}") from None


def serve_schema(app) -> None:
    """``GET /cache_policy/request_schema``: every route's body schema as JSON (``schema.to_json``),
    the rules beside it, and this server's request limits (``serving/request_limits.py``)."""

    async def request_schema():
        routes = route_schemas()
        return {"routes": {path: schema.to_json(route.body) for path, route in routes.items()},
                "rules": {path: route.rules_json() for path, route in routes.items()},
                "limits": {"max_depth": schema.MAX_DEPTH, "int_range": list(schema.INT_RANGE)},
                "request_limits": dataclasses.asdict(request_limits.current())}

    app.add_api_route(SCHEMA_PATH, request_schema, methods=["GET"])


def before_normalize(obj, *args, **kwargs):
    checks.check_before_normalization(obj)
    checks.check_request_limits(obj, request_limits.current())
    checks.align_parallel_rids(obj)


def before_init_req_state(tokenizer_manager, obj, *args, **kwargs):
    from sglang.srt.managers.embed_types import PositionalEmbeds
    from sglang.srt.managers.io_struct import GenerateReqInput

    if not isinstance(obj, GenerateReqInput):  # embedding / classify requests
        checks.check_request_rids(obj, tokenizer_manager.rid_to_state)
        return
    args, vocab_size = tokenizer_manager.server_args, tokenizer_manager.model_config.vocab_size
    checks.check_generate_request(obj, vocab_size, tokenizer_manager.rid_to_state, PositionalEmbeds,
                                  checks.grammar_unavailable(args.grammar_backend, args.device),
                                  stop_regex.pattern_problem)
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
    try:
        stop_regex.install()
    except RuntimeError as exc:
        raise SystemExit(f"cache-policy overlay: {exc}") from None
    request_bodies.install(register)  # a body nested past the parser: a 400 saying so
    register(NORMALIZE, before_normalize, "before")
    register(INIT_REQ_STATE, before_init_req_state, "before")
    register(VALIDATE_ONE, after_validate_one, "after")
    register(CHAT_VALIDATE, after_openai_validate, "after")
    register(COMPLETION_VALIDATE, after_openai_validate, "after")
    register(BODY_VALIDATION, around_body_validation, "around")
    register(EXTRA_KEY, around_compute_extra_key, "around")
