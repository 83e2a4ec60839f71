"""The body schema of each HTTP route that starts a generation, built from SGLang's own request
types (``serving/schema.py``), and the few rules a type annotation cannot state.

``build_routes`` takes SGLang's classes as arguments (``patches/validation.py`` passes them), so
this module stays free of SGLang; the schema is derived from their annotations, not from a list
kept by hand. What is added here, each with the reason SGLang gives or the failure it caused:

* **Refinements**: fields SGLang types as ``Dict[str, Any]`` but reads as one of its own structs
  get that struct's schema: ``sampling_params`` (``SamplingParams``, one object or one per
  prompt; closed: an unknown key is refused), ``session_params`` (``SessionParams``, closed; a
  list as ``id`` made the scheduler raise ``unhashable type``), OpenAI ``custom_params``
  (``SamplingParams.custom_params``). ``SamplingParams``' internal fields (``INTERNAL_SAMPLING``,
  set by its own normalisation) are not part of the API.
* **At most one of** ``text`` / ``input_ids`` / ``input_embeds`` (SGLang's comment says "either";
  its check let two through and used one silently) and ``session_id`` / ``session_params``.
* **Not empty**: a prompt list (``text: []`` answered 200 with ``[]``: no prompt at all).
* **Server-only fields** of ``GenerateReqInput`` (``SERVER_ONLY``): SGLang sets them itself
  (its comments mark them internal); a client value is refused instead of being trusted. SGLang's
  own default is accepted: the router spells every field of the request out (``return_bytes:
  false``), and the default is what the server would have set.
* **Namespace names**: ``extra_key`` (and ``cache_salt`` on the OpenAI routes) non-empty, without
  control characters, at most 256 characters (``policy/namespace.py``: what keeps namespaces apart).
* **Template arguments**: ``chat_template_kwargs`` may not name a parameter of the tokenizer's
  ``apply_chat_template`` (``tools`` there raised "multiple values for keyword argument", a 500;
  ``chat_template`` would replace the server's template), nor an argument the template renderer
  passes to the template itself (``messages``: "multiple values", a 500; ``patches/validation.py``
  reads them from transformers' ``render_jinja_template``).
* **No server-side fetch** (``REFUSED_INPUTS``, ``REFUSED_PARTS``): the multimodal inputs, which
  SGLang loads from whatever a string names (``http(s)://`` URLs with a GET from the server, local
  paths and ``file://`` with an ``open``, base64 data decoded as an image), are refused on this
  text-only server: ``image_data`` / ``video_data`` / ``audio_data`` on ``/generate``, and
  ``image_url`` / ``video_url`` / ``audio_url`` content parts of chat messages. (Qwen3.5/3.6
  checkpoints are ``*ForConditionalGeneration``: SGLang turns their multimodal loading on.)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Mapping

from policy.namespace import name_problem
from serving.schema import (
    Json,
    ListOf,
    MapOf,
    Node,
    OneOf,
    SchemaError,
    Struct,
    check,
    from_json,
    struct_of,
    without_unset_nulls,
)

GENERATE, COMPLETIONS, CHAT = "/generate", "/v1/completions", "/v1/chat/completions"

# SamplingParams fields its normalisation fills (SGLang: "Internal fields ... not API-facing").
INTERNAL_SAMPLING = frozenset({"stop_strs", "stop_regex_strs", "stop_str_max_len", "stop_regex_max_len",
                               "is_normalized"})

# GenerateReqInput fields SGLang sets itself -> why a client may not.
SERVER_ONLY: dict[str, str] = {
    "http_worker_ipc": "set by the HTTP server to route answers between its workers",
    "lora_id": "set by the tokenizer manager from lora_path",
    "received_time": "set by the server when the request arrives",
    "return_bytes": "internal to image generation",
    "need_wait_for_mm_inputs": "set by encoder disaggregation",
    "num_items_assigned": "set by encoder disaggregation",
    "mm_data_mooncake": "set by encoder disaggregation",
    "encoder_urls": "set by encoder disaggregation",
}

# Inputs SGLang loads from a client-named URL or local path -> why they are refused.
FETCHES = ("this server serves text only, and SGLang would load it from what the string names: "
           "a GET to an http(s) URL from the server, an open() of a local path")
REFUSED_INPUTS: dict[str, str] = {"image_data": FETCHES, "video_data": FETCHES, "audio_data": FETCHES}
# Chat message content parts (by their ``type``) loaded the same way.
REFUSED_PARTS: dict[str, str] = {"image_url": FETCHES, "video_url": FETCHES, "audio_url": FETCHES}

EXCLUSIVE: dict[str, tuple[tuple[str, ...], ...]] = {
    "GenerateReqInput": (("text", "input_ids", "input_embeds"), ("session_id", "session_params")),
}
NON_EMPTY: dict[str, tuple[str, ...]] = {
    "GenerateReqInput": ("text", "input_ids", "input_embeds", "rid"),
    "CompletionRequest": ("prompt",),
    "ChatCompletionRequest": ("messages",),
}


@dataclass(frozen=True)
class RouteSchema:
    """One route's body: the schema and the rules around it (module docstring)."""

    route: str
    body: Struct
    exclusive: tuple[tuple[str, ...], ...] = ()
    non_empty: tuple[str, ...] = ()
    server_only: Mapping[str, str] = field(default_factory=dict)
    server_defaults: Mapping[str, object] = field(default_factory=dict)  # SGLang's defaults of those fields
    reserved_keys: Mapping[str, frozenset] = field(default_factory=dict)
    names: tuple[str, ...] = ()  # cache namespace names (policy/namespace.py); a list on /generate
    refused: Mapping[str, str] = field(default_factory=dict)  # field -> why any value is refused
    refused_parts: Mapping[str, str] = field(default_factory=dict)  # chat content part type -> why

    def rules_json(self) -> dict:
        """The rules beside the schema, as JSON (served with it)."""
        return {"exclusive": [list(g) for g in self.exclusive], "non_empty": list(self.non_empty),
                "server_only": dict(self.server_only), "server_defaults": dict(self.server_defaults),
                "names": list(self.names),
                "reserved_keys": {k: sorted(v) for k, v in self.reserved_keys.items()},
                "refused": dict(self.refused), "refused_parts": dict(self.refused_parts)}

    @classmethod
    def from_json(cls, route: str, body_json: Mapping, rules_json: Mapping) -> "RouteSchema":
        """Inverse of ``schema.to_json`` + ``rules_json``: what a client rebuilds from the server's
        ``GET /cache_policy/request_schema``."""
        body = from_json(body_json)
        if not isinstance(body, Struct):
            raise ValueError(f"{route}: the body schema is not an object")
        return cls(route, body, tuple(tuple(g) for g in rules_json.get("exclusive", ())),
                   tuple(rules_json.get("non_empty", ())), dict(rules_json.get("server_only", {})),
                   dict(rules_json.get("server_defaults", {})),
                   {k: frozenset(v) for k, v in rules_json.get("reserved_keys", {}).items()},
                   tuple(rules_json.get("names", ())), dict(rules_json.get("refused", {})),
                   dict(rules_json.get("refused_parts", {})))

    def check(self, body) -> object:
        """The body with unset nulls removed (``schema.without_unset_nulls``); raises
        ``SchemaError`` naming the first field it refuses."""
        check(body, self.body)
        for name, why in self.server_only.items():
            value = body.get(name)
            if value is not None and value != self.server_defaults.get(name):
                raise SchemaError((name,), f"not accepted in a request: {why}")
        for group in self.exclusive:
            given = [name for name in group if body.get(name) is not None]
            if len(given) > 1:
                raise SchemaError((given[1],), f"give only one of {', '.join(group)} (got {' and '.join(given)})")
        for name in self.non_empty:
            if body.get(name) == []:
                raise SchemaError((name,), "must not be an empty list")
        for name in self.names:
            value = body.get(name)
            items = enumerate(value) if isinstance(value, list) and self.route == GENERATE else [(None, value)]
            for i, item in items:
                problem = name_problem(item)
                if problem is not None:
                    raise SchemaError((name,) if i is None else (name, i), problem)
        for name, keys in self.reserved_keys.items():
            taken = sorted(set(body.get(name) or {}) & keys)
            if taken:
                raise SchemaError((name, taken[0]), "is an argument the server passes to the chat template "
                                                    "itself; it cannot be set here")
        self.check_fetches(body)
        return without_unset_nulls(body, self.body)

    def check_fetches(self, body: Mapping) -> None:
        """Refuse the inputs SGLang would load from a client-named URL or path (``REFUSED_INPUTS``,
        and ``REFUSED_PARTS`` in chat messages); runs after the schema, so the shapes are known."""
        for name, why in self.refused.items():
            if body.get(name) is not None:
                raise SchemaError((name,), f"not accepted by this server: {why}")
        if not self.refused_parts:
            return
        for i, message in enumerate(body.get("messages") or ()):
            content = message.get("content") if isinstance(message, Mapping) else None
            for j, part in enumerate(content if isinstance(content, list) else ()):
                kind = part.get("type") if isinstance(part, Mapping) else None
                if kind in self.refused_parts:
                    raise SchemaError(("messages", i, "content", j),
                                      f"{kind} parts are not accepted by this server: {self.refused_parts[kind]}")


def sampling_struct(sampling_cls, refine: Mapping = {}) -> Struct:
    """``SamplingParams`` as a client may send it: its API fields only, unknown keys refused."""
    full = struct_of(sampling_cls, refine)
    return Struct(full.name, {k: f for k, f in full.fields.items() if k not in INTERNAL_SAMPLING}, closed=True)


def field_defaults(cls, names: Iterable[str]) -> dict[str, object]:
    """``cls``'s plain (JSON) defaults of the dataclass fields ``names``; a field whose default is
    None (what an absent field means anyway) or not plain JSON is left out."""
    import dataclasses

    defaults = {f.name: f.default for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else {}
    plain = (bool, int, float, str, type(None))
    return {n: defaults[n] for n in names if isinstance(defaults.get(n), plain) and defaults.get(n) is not None}


def build_routes(generate_cls, sampling_cls, session_cls, completion_cls, chat_cls,
                 template_arguments: Iterable[str]) -> dict[str, RouteSchema]:
    """Route -> its schema, from SGLang's classes and the arguments of the chat template call
    (``template_arguments``: ``apply_chat_template``'s parameters and what the renderer passes)."""
    sampling = sampling_struct(sampling_cls)
    session = struct_of(session_cls)
    custom = sampling.fields["custom_params"].node
    refine: dict[tuple[str, str], Node] = {
        (generate_cls.__name__, "sampling_params"): OneOf((ListOf(sampling), sampling)),
        (generate_cls.__name__, "session_params"): session,
    }
    for cls in (completion_cls, chat_cls):
        refine[(cls.__name__, "session_params")] = session
        refine[(cls.__name__, "custom_params")] = custom
    refine[(chat_cls.__name__, "chat_template_kwargs")] = MapOf(Json())

    def route(path: str, cls, **rules) -> RouteSchema:
        return RouteSchema(path, struct_of(cls, refine), EXCLUSIVE.get(cls.__name__, ()),
                           NON_EMPTY.get(cls.__name__, ()), **rules)

    openai_names = ("cache_salt", "extra_key")
    return {
        GENERATE: route(GENERATE, generate_cls, server_only=dict(SERVER_ONLY),
                        server_defaults=field_defaults(generate_cls, SERVER_ONLY), names=("extra_key",),
                        refused=dict(REFUSED_INPUTS)),
        COMPLETIONS: route(COMPLETIONS, completion_cls, names=openai_names),
        CHAT: route(CHAT, chat_cls, reserved_keys={"chat_template_kwargs": frozenset(template_arguments)},
                    names=openai_names, refused_parts=dict(REFUSED_PARTS)),
    }


def field_count(struct: Struct) -> int:
    """Fields of a route's body, its refined structs' fields included (for the closing numbers)."""
    seen: set[int] = set()

    def count(node) -> int:
        if isinstance(node, OneOf):
            return sum(count(o) for o in node.options)
        if isinstance(node, ListOf):
            return count(node.item)
        if isinstance(node, MapOf):
            return count(node.value)
        if isinstance(node, Struct) and id(node) not in seen:
            seen.add(id(node))
            return sum(1 + count(f.node) for f in node.fields.values())
        return 0

    return count(struct)


