"""Which HTTP routes the server serves, and to whom: one verdict and one reason per route, decided
at launch. Pure data and functions (standard library only); ``patches/routes.py`` puts it in
front of SGLang's app and serves it at ``GET /cache_policy/routes``.

SGLang 0.5.16 registers 91 routes on its FastAPI app (``sglang.srt.entrypoints.http_server``) and
serves every one of them to anyone. Issue 33 found code execution (``/update_weights_from_tensor``
unpickles client bytes), other users' prompts (``/configure_logging`` dumps them where the caller
says), stop, pause and reload routes, and generating routes that build their request without the
schema, so each route here gets one verdict:

* ``validated``: the generating routes this project supports; every body goes through the request
  schema and checks (``serving/schema.py``, ``serving/route_schemas.py``, ``patches/validation.py``).
* ``open``: read-only and harmless: liveness, the model's name and limits, load counts, what this
  overlay enforces. Also what ``sglang-router`` 0.3.2 reads from a worker: measured against a
  worker that logs every call, it reads ``GET /health``, ``GET /model_info`` and
  ``GET /server_info`` (then ``/get_server_info``), and registers and routes to a worker that
  answers the last two with 401, 403 or 404 (it then names the model ``unknown``).
* ``admin``: administrative or state-changing (weights, process groups, profiling, logging,
  pausing, memory, caches, server settings). Refused with 403 unless the operator passed
  SGLang's own ``--admin-api-key``; then they need ``Authorization: Bearer <that key>`` (401
  without it or with another).
* ``closed``: everything else answers 404: SGLang's other generating routes, which the schema does
  not cover, and the features this project does not serve. A route SGLang registers that is not in
  the table (a new upstream route, or one renamed through SGLang's environment variables, such as
  ``SGLANG_OLLAMA_CHAT_ROUTE``) is closed too; ``tests/integration/test_routes.py`` fails when the
  table and SGLang's routes differ, so a new route is decided here, with its reason.

Nothing an anonymous client sends is unpickled: every route that deserializes pickles or tensors
(``/update_weights_from_tensor``, ``/update_weights_from_ipc``, ``/load_lora_adapter_from_tensors``)
is ``admin``; client logit processors on the validated routes are ``serving/forced.py``'s.

A request is matched on its method and path (the route's template, ``{name}`` one segment,
``{name:path}`` the rest); where two entries match, the stricter verdict holds. A path the table
names with other methods only gets 405 (``OPTIONS``, a browser's CORS preflight, goes on to
SGLang's CORS middleware there); a path it does not name, 404.
"""

from __future__ import annotations

import hmac
import re
from dataclasses import dataclass
from typing import Iterable, Mapping

VALIDATED, OPEN, ADMIN, CLOSED = "validated", "open", "admin", "closed"
VERDICTS = (VALIDATED, OPEN, ADMIN, CLOSED)
WEBSOCKET = "WEBSOCKET"  # the method of a WebSocket route (its handshake is not an HTTP method here)
ROUTES_PATH = "/cache_policy/routes"
SCHEMA_PATH = "/cache_policy/request_schema"
# The flag an operator passes to open the admin routes (SGLang's own, server_args.admin_api_key).
ADMIN_FLAG = "--admin-api-key"
PATH_CHARS = 200  # of a refused request's path, in the refusal's message

_STRICTNESS = {VALIDATED: 0, OPEN: 0, ADMIN: 1, CLOSED: 2}

_PARAM = re.compile(r"\{([A-Za-z_]\w*)(?::(\w+))?\}")
_CONVERTERS = {None: "[^/]+", "str": "[^/]+", "path": ".*"}


def _compile(path: str) -> re.Pattern:
    """The regular expression of a route template: Starlette's, for the converters SGLang uses."""
    if not path.startswith("/"):
        raise ValueError(f"route {path!r}: a path starts with '/'")
    out, end = [], 0
    for match in _PARAM.finditer(path):
        if match.group(2) not in _CONVERTERS:
            raise ValueError(f"route {path!r}: converter {match.group(2)!r} is not supported")
        out.append(re.escape(path[end:match.start()]))
        out.append(f"(?:{_CONVERTERS[match.group(2)]})")
        end = match.end()
    out.append(re.escape(path[end:]))
    return re.compile("".join(out))


@dataclass(frozen=True)
class Route:
    """One route as SGLang registers it (a path with its methods), its verdict and why.

    ``only_when``: SGLang registers it only under this setting (absent by default), so the
    check against SGLang's app does not expect it."""

    methods: tuple[str, ...]
    path: str
    verdict: str
    reason: str
    only_when: str | None = None

    def __post_init__(self) -> None:
        if self.verdict not in VERDICTS:
            raise ValueError(f"{self.path}: verdict {self.verdict!r} is not one of {VERDICTS}")
        if not self.methods or any(m != m.upper() for m in self.methods):
            raise ValueError(f"{self.path}: methods must be upper-case and not empty")
        _compile(self.path)

    def keys(self) -> list[tuple[str, str]]:
        return [(method, self.path) for method in self.methods]

    def to_json(self) -> dict:
        return {"methods": list(self.methods), "path": self.path, "verdict": self.verdict, "reason": self.reason,
                "only_when": self.only_when}


def _r(methods: str, path: str, verdict: str, reason: str, only_when: str | None = None) -> Route:
    return Route(tuple(methods.split(",")), path, verdict, reason, only_when)


_WEIGHTS = "loads, sends or changes the model's weights"
_GROUPS = "joins or leaves a torch process group (a closed port hangs the scheduler)"
_PROFILE = "profiling: writes traces where the caller says and slows every request"
_EXPERT = "expert-distribution recording (MoE): starts, stops or dumps a recorder in the scheduler"
_HICACHE = "the hierarchical cache's storage backend: attaches, detaches, clears or describes it"
_CORPUS = "external corpora held by the server"
_UNVALIDATED = "not covered by the request schema"
_EMBEDDING = "embedding and scoring (this project serves generation); " + _UNVALIDATED
_OPENAPI = ("SGLang's API description, which lists the closed routes too; GET /cache_policy/routes and "
            "GET /cache_policy/request_schema say what this server serves")

ROUTES: tuple[Route, ...] = (
    # ---------------------------------------------------------------------------- validated
    _r("POST,PUT", "/generate", VALIDATED, "SGLang's native generation; the body schema of GenerateReqInput"),
    _r("POST", "/v1/completions", VALIDATED, "OpenAI completions; the body schema of CompletionRequest"),
    _r("POST", "/v1/chat/completions", VALIDATED, "OpenAI chat; the body schema of ChatCompletionRequest"),
    # ---------------------------------------------------------------------------- open
    _r("GET", "/health", OPEN, "liveness (sglang-router checks it on every worker)"),
    _r("GET", "/health_generate", OPEN, "liveness, the same handler as /health"),
    _r("GET", "/ping", OPEN, "liveness (SageMaker's name): an empty 200"),
    _r("GET", "/", OPEN, "liveness: the text 'SGLang is running'"),
    _r("HEAD", "/", OPEN, "liveness: the text 'SGLang is running'"),
    _r("GET", "/model_info", OPEN, "the model's type, architecture and name (sglang-router reads it); its "
       "model_path is the name /v1/models also gives unless --served-model-name is set"),
    _r("GET", "/get_model_info", OPEN, "the deprecated name of /model_info"),
    _r("GET", "/v1/models", OPEN, "OpenAI model list: the served name and the context length"),
    _r("GET", "/v1/models/{model:path}", OPEN, "OpenAI model lookup by name"),
    _r("GET", "/v1/loads", OPEN, "load counts per data-parallel rank (the soak waits for idle with it)"),
    _r("GET", "/get_load", OPEN, "the deprecated load counts, from /v1/loads"),
    _r("GET", "/metrics", OPEN, "Prometheus counters (SGLang exempts it from its own keys)",
       only_when="--enable-metrics (SGLang mounts it at start-up)"),
    # ---------------------------------------------------------------------------- admin
    _r("GET", "/server_info", ADMIN, "every server setting (paths, ports, --api-key and --admin-api-key "
       "included) and each scheduler's internal state; sglang-router works without it"),
    _r("GET", "/get_server_info", ADMIN, "the deprecated name of /server_info"),
    _r("POST,PUT", "/set_internal_state", ADMIN, "changes server settings of a running server"),
    _r("GET,POST", "/flush_cache", ADMIN, "empties every tenant's prefix cache"),
    _r("POST", "/add_external_corpus", ADMIN, _CORPUS + ": adds one"),
    _r("POST", "/remove_external_corpus", ADMIN, _CORPUS + ": removes one (500 on junk)"),
    _r("GET", "/list_external_corpora", ADMIN, _CORPUS + ": lists them"),
    _r("GET,POST", "/clear_hicache_storage_backend", ADMIN, _HICACHE),
    _r("POST", "/hicache/storage-backend/clear", ADMIN, _HICACHE),
    _r("PUT", "/hicache/storage-backend", ADMIN, _HICACHE),
    _r("DELETE", "/hicache/storage-backend", ADMIN, _HICACHE),
    _r("GET", "/hicache/storage-backend", ADMIN, _HICACHE),
    _r("GET,POST", "/start_profile", ADMIN, _PROFILE),
    _r("GET,POST", "/stop_profile", ADMIN, _PROFILE + " (500 on junk)"),
    _r("GET,POST", "/set_trace_level", ADMIN, "changes the tracing level of the running server"),
    _r("GET,POST", "/freeze_gc", ADMIN, "freezes the garbage collector of every process"),
    _r("GET,POST", "/start_expert_distribution_record", ADMIN, _EXPERT),
    _r("GET,POST", "/stop_expert_distribution_record", ADMIN, _EXPERT),
    _r("GET,POST", "/dump_expert_distribution_record", ADMIN, _EXPERT),
    _r("POST", "/update_weights_from_disk", ADMIN, _WEIGHTS + " from any directory; its errors say which "
       "paths exist"),
    _r("POST", "/init_weights_send_group_for_remote_instance", ADMIN, _GROUPS),
    _r("POST", "/send_weights_to_remote_instance", ADMIN, _WEIGHTS + " to another server"),
    _r("GET", "/get_remote_instance_transfer_engine_info", ADMIN, "the weight-transfer engine's addresses"),
    _r("GET", "/remote_instance_transfer_engine_info", ADMIN, "the weight-transfer engine's addresses"),
    _r("POST", "/init_weights_update_group", ADMIN, _GROUPS),
    _r("POST", "/destroy_weights_update_group", ADMIN, _GROUPS),
    _r("POST", "/update_weights_from_tensor", ADMIN, _WEIGHTS + ": unpickles the client's bytes in the "
       "scheduler (SafeUnpickler allows builtins.open: code execution)"),
    _r("POST", "/update_weights_from_distributed", ADMIN, _WEIGHTS + " over a process group"),
    _r("POST", "/update_weights_from_ipc", ADMIN, _WEIGHTS + " from serialized CUDA IPC handles"),
    _r("POST", "/update_weight_version", ADMIN, "renames the weights' version (and may abort every request)"),
    _r("GET,POST", "/get_weights_by_name", ADMIN, "reads parameters of the model"),
    _r("GET,POST", "/release_memory_occupation", ADMIN, "frees the weights and the KV cache: the server stops "
       "serving until resumed"),
    _r("GET,POST", "/resume_memory_occupation", ADMIN, "reloads what /release_memory_occupation freed"),
    _r("GET,POST", "/weights_checker", ADMIN, "snapshots and compares the weights in the scheduler"),
    _r("GET,POST", "/slow_down", ADMIN, "sleeps in every forward (NaN ended the scheduler)"),
    _r("POST", "/load_lora_adapter", ADMIN, "loads a LoRA adapter from a path the caller names"),
    _r("POST", "/load_lora_adapter_from_tensors", ADMIN, "loads a LoRA adapter from serialized tensors "
       "(deserialized in the server)"),
    _r("POST", "/unload_lora_adapter", ADMIN, "unloads a LoRA adapter other clients may use"),
    _r("GET,POST", "/configure_logging", ADMIN, "request logging: dumped other clients' prompts into a folder "
       "the caller chose"),
    _r("POST", "/abort_request", ADMIN, "aborts every request whose rid starts with the rid sent (SGLang's "
       "scheduler matches prefixes), or all with abort_all; a client ends its own request by closing the "
       "connection"),
    _r("POST", "/pause_generation", ADMIN, "stalls (or aborts) every request"),
    _r("POST", "/continue_generation", ADMIN, "resumes after /pause_generation"),
    _r("POST", "/scale_elastic_ep", ADMIN, "rescales elastic expert parallelism"),
    _r("GET", "/is_scaling_elastic_ep", ADMIN, "elastic expert parallelism's state"),
    _r("POST", "/dumper/{method}", ADMIN, "tensor dumper control in the scheduler",
       only_when="DUMPER_SERVER_PORT=reuse (SGLang registers it at import)"),
    # ---------------------------------------------------------------------------- closed
    _r("POST", "/vertex_generate", CLOSED, "Vertex AI generation: builds GenerateReqInput without the schema "
       "(a list session_params.id or a string stream_interval ended the scheduler)"),
    _r("POST", "/invocations", CLOSED, "SageMaker's alias of /v1/chat/completions; one spelling of a route is "
       "enough"),
    _r("POST", "/api/chat", CLOSED, "Ollama chat: " + _UNVALIDATED + " (500 even on a valid body)"),
    _r("POST", "/api/generate", CLOSED, "Ollama generation: " + _UNVALIDATED + " (500 on junk)"),
    _r("GET", "/api/tags", CLOSED, "Ollama's model list; the Ollama API is not served"),
    _r("POST", "/api/show", CLOSED, "Ollama's model details; the Ollama API is not served"),
    _r("POST", "/v1/messages", CLOSED, "Anthropic messages: " + _UNVALIDATED + " (500 on junk)"),
    _r("POST", "/v1/messages/count_tokens", CLOSED, "Anthropic token count; the Anthropic API is not served"),
    _r("POST", "/v1/responses", CLOSED, "OpenAI responses: the stored id is the client's request_id, so one "
       "client reads or overwrites another's stored response, and the store has no bound"),
    _r("GET", "/v1/responses/{response_id}", CLOSED, "reads a stored response by its client-chosen id"),
    _r("POST", "/v1/responses/{response_id}/cancel", CLOSED, "cancels a stored response by its client-chosen id"),
    _r("POST", "/tokenize", CLOSED, "tokenization: " + _UNVALIDATED + " (500 on junk); the tools tokenize "
       "locally"),
    _r("POST", "/v1/tokenize", CLOSED, "tokenization: " + _UNVALIDATED + " (500 on junk)"),
    _r("POST", "/detokenize", CLOSED, "detokenization: " + _UNVALIDATED + " (500 on junk)"),
    _r("POST", "/v1/detokenize", CLOSED, "detokenization: " + _UNVALIDATED + " (500 on junk)"),
    _r("POST", "/parse_function_call", CLOSED, "a parsing utility: " + _UNVALIDATED + " (500 on junk)"),
    _r("POST", "/separate_reasoning", CLOSED, "a parsing utility: " + _UNVALIDATED + " (500 on junk)"),
    _r("POST,PUT", "/encode", CLOSED, _EMBEDDING),
    _r("POST,PUT", "/classify", CLOSED, _EMBEDDING),
    _r("POST", "/v1/embeddings", CLOSED, _EMBEDDING),
    _r("POST", "/v1/classify", CLOSED, _EMBEDDING),
    _r("POST", "/v1/score", CLOSED, _EMBEDDING),
    _r("POST,PUT", "/v1/rerank", CLOSED, _EMBEDDING),
    _r("POST", "/v1/audio/transcriptions", CLOSED, "audio transcription (a text model is served)"),
    _r(WEBSOCKET, "/v1/realtime", CLOSED, "realtime audio transcription (a text model is served)"),
    _r("GET,POST", "/open_session", CLOSED, "SGLang's streaming sessions: a client-chosen session id that any "
       "client can use or close, holding KV memory until closed; this project does not use them"),
    _r("GET,POST", "/close_session", CLOSED, "closes a session by its client-chosen id (see /open_session)"),
    _r("GET", "/weight_version", CLOSED, "deprecated: SGLang answers 404 itself"),
    _r("GET", "/get_weight_version", CLOSED, "deprecated: SGLang answers 404 itself"),
    _r("GET,HEAD", "/openapi.json", CLOSED, _OPENAPI, only_when="unless DISABLE_OPENAPI_DOC is set"),
    _r("GET,HEAD", "/docs", CLOSED, _OPENAPI + "; the page loads scripts from a CDN",
       only_when="unless DISABLE_OPENAPI_DOC is set"),
    _r("GET,HEAD", "/docs/oauth2-redirect", CLOSED, _OPENAPI, only_when="unless DISABLE_OPENAPI_DOC is set"),
    _r("GET,HEAD", "/redoc", CLOSED, _OPENAPI + "; the page loads scripts from a CDN",
       only_when="unless DISABLE_OPENAPI_DOC is set"),
)

# This overlay's own routes, added to SGLang's app at launch.
OWN_ROUTES: tuple[Route, ...] = (
    _r("GET", ROUTES_PATH, OPEN, "this table"),
    _r("GET", SCHEMA_PATH, OPEN, "the body schema of each validated route (patches/validation.py)"),
)


def table() -> tuple[Route, ...]:
    """Every route the server can have: SGLang's and this overlay's."""
    return ROUTES + OWN_ROUTES


def counts(routes: Iterable[Route] = ROUTES) -> dict[str, int]:
    """Verdict -> number of (method, path) pairs."""
    out = dict.fromkeys(VERDICTS, 0)
    for route in routes:
        out[route.verdict] += len(route.methods)
    return out


# ------------------------------------------------------------------------------------ matching


@dataclass(frozen=True)
class _Template:
    route: Route
    pattern: re.Pattern


def _templates(routes: tuple[Route, ...]) -> tuple[_Template, ...]:
    return tuple(_Template(route, _compile(route.path)) for route in routes)


_TABLE = _templates(table())


@dataclass(frozen=True)
class Match:
    """What the table says of one path: the strictest entry for the method (None: no entry for
    it), and the methods other entries of the path allow."""

    route: Route | None
    allowed: tuple[str, ...]


def lookup(method: str, path: str, templates: tuple[_Template, ...] = _TABLE) -> Match:
    """The table's entry for ``method`` and ``path`` (a request's path, its root path removed)."""
    best, allowed = None, set()
    for template in templates:
        if template.pattern.fullmatch(path) is None:
            continue
        if method in template.route.methods:
            if best is None or _STRICTNESS[template.route.verdict] > _STRICTNESS[best.verdict]:
                best = template.route
        elif template.route.verdict != CLOSED:
            allowed.update(m for m in template.route.methods if m != WEBSOCKET)
    return Match(best, tuple(sorted(allowed)))


# ------------------------------------------------------------------------------------ decisions


@dataclass(frozen=True)
class Refusal:
    """The answer to a request the table does not let through."""

    status: int
    message: str
    allow: tuple[str, ...] = ()  # for a 405: the methods that are served

    @property
    def kind(self) -> str:
        return {401: "Unauthorized", 403: "Forbidden", 404: "Not Found", 405: "Method Not Allowed"}[self.status]

    def to_json(self) -> dict:
        """SGLang's error shape (``ErrorResponse``), so clients read it as any other error."""
        return {"object": "error", "message": self.message, "type": self.kind, "param": None, "code": self.status}


def bearer_token(authorization: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header (scheme case-insensitive), or None."""
    if not authorization:
        return None
    scheme, _, token = authorization.partition(" ")
    return token if scheme.lower() == "bearer" and token else None


def decide(method: str, path: str, admin_key: str | None, authorization: str | None,
           found: Match | None = None) -> Refusal | None:
    """None when the request may go on to SGLang; otherwise the refusal, naming why."""
    found = lookup(method, path) if found is None else found
    shown = path if len(path) <= PATH_CHARS else path[:PATH_CHARS] + "..."
    route, where = found.route, f"{method} {shown}"
    if route is None:
        if method == "OPTIONS" and found.allowed:
            return None  # a CORS preflight of a served route: SGLang's CORS middleware answers it
        if found.allowed:
            return Refusal(405, f"{where}: this route is served for {', '.join(found.allowed)} only",
                           found.allowed)
        return Refusal(404, f"{where}: no such route on this server (GET {ROUTES_PATH} lists the routes)")
    if route.verdict in (VALIDATED, OPEN):
        return None
    if route.verdict == CLOSED:
        return Refusal(404, f"{where}: closed on this server ({route.reason}); GET {ROUTES_PATH} lists the routes")
    if not admin_key:
        return Refusal(403, f"{where}: an administrative route ({route.reason}); this server was started without "
                            f"{ADMIN_FLAG}, so it is refused to everyone")
    token = bearer_token(authorization)
    if token is None:
        return Refusal(401, f"{where}: an administrative route; send the server's {ADMIN_FLAG} as "
                            "'Authorization: Bearer <key>' (no bearer token was sent)")
    if not hmac.compare_digest(token.encode(), admin_key.encode()):
        return Refusal(401, f"{where}: an administrative route; the bearer token sent is not the server's "
                            f"{ADMIN_FLAG}")
    return None


# ------------------------------------------------------------------------------------ the check


def registered_problems(registered: Iterable[tuple[str, str]], routes: tuple[Route, ...] = ROUTES) -> list[str]:
    """How the table and the (method, path) pairs SGLang registered differ: a registered route the
    table does not name (it is closed, but nobody decided so), and a route the table names that
    SGLang does not register (unless it is registered only under a setting)."""
    registered = set(registered)
    named = {key for route in routes for key in route.keys()}
    problems = [f"{method} {path}: registered by SGLang, not in the route table (serving/route_policy.py)"
                for method, path in sorted(registered - named)]
    problems += [f"{method} {path}: in the route table, not registered by SGLang"
                 for route in routes if route.only_when is None
                 for method, path in route.keys() if (method, path) not in registered]
    return problems


def unlisted(registered: Iterable[tuple[str, str]], routes: tuple[Route, ...] = ROUTES + OWN_ROUTES) -> list[tuple[str, str]]:
    """Registered (method, path) pairs the table does not name: closed, as anything unnamed."""
    named = {key for route in routes for key in route.keys()}
    return sorted(set(registered) - named)


def to_json(admin_key_configured: bool, registered: Iterable[tuple[str, str]]) -> dict:
    """``GET /cache_policy/routes``: the table, which of its routes this server registered, and
    what it registered that the table does not name (closed)."""
    registered = set(registered)
    return {
        "admin_key_configured": admin_key_configured,
        "admin_routes": ("need 'Authorization: Bearer <--admin-api-key>'" if admin_key_configured
                         else f"refused to everyone (the server was started without {ADMIN_FLAG})"),
        "counts": counts(table()),
        "routes": [{**route.to_json(), "registered": all(key in registered for key in route.keys())}
                   for route in table()],
        "unlisted": [{"method": method, "path": path, "verdict": CLOSED} for method, path in unlisted(registered)],
    }


def launch_problems(settings: Mapping) -> list[str]:
    """Server settings under which requests would reach SGLang around the route table (and the
    request checks), which run in the one HTTP process of ``python -m patches.launch_server``."""
    problems = []
    workers = settings.get("tokenizer_worker_num") or 1
    if workers != 1:
        problems.append(f"--tokenizer-worker-num {workers}: each extra tokenizer worker is its own HTTP "
                        "process, without the route table and the request checks; use 1")
    if settings.get("grpc_port") is not None:
        problems.append(f"--grpc-port {settings['grpc_port']} (or SGLANG_GRPC_PORT): the gRPC listener serves "
                        "requests around the route table and the request checks")
    for flag in ("smg_grpc_mode", "grpc_mode"):
        if settings.get(flag):
            problems.append(f"--{flag.replace('_', '-')}: a gRPC server instead of the checked HTTP one")
    return problems
