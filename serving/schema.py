"""Request schemas: what each field of a request body may hold, derived from the Python types
SGLang declares for its requests, and checked on the raw JSON before SGLang parses it.

Why: SGLang 0.5.16 types its top-level request fields (pydantic parses them), but leaves the
insides of ``Dict[str, Any]`` fields untyped (``sampling_params``, ``session_params``,
``custom_params``, ``chat_template_kwargs``), never checks that a string is valid Unicode (a lone
surrogate fails in the tokenizer or the log writer, a 500), and recurses without limit into
nested values (a ``RecursionError``, a 500). Values of the wrong type inside those dicts reach
the scheduler, where a ``TypeError`` stops the server. A schema built from the same type
annotations SGLang uses (``from_type``) closes all of that in one walk (``check``), and the
same schema drives the fuzz that proves it (``wrong_values``).

Nodes: ``Scalar`` (int / float / bool / str), ``ListOf``, ``MapOf`` (JSON object with string keys),
``OneOf`` (a union), ``Literal``, ``Struct`` (an object with named ``Field``s) and ``Json`` (any
JSON value). Every value, whatever its node, is also held to the limits below.

| limit            | value        | why                                                               |
|------------------|--------------|-------------------------------------------------------------------|
| ``MAX_DEPTH``    | 32 levels    | SGLang's validators and ``msgspec`` recurse per level; hundreds of levels raised ``RecursionError`` (a 500) |
| ``INT_RANGE``    | signed 64-bit | integers become int64 tensors or C ints in the scheduler            |
| ``MAX_STEPS``    | 200,000 values | a bound on one check's work: unions of structs nested in each other (the OpenAI ``response_format`` tags) could otherwise cost exponential time; each container is judged once per node, and a struct option whose ``type`` is a literal is only tried for a value of that ``type`` |
| strings, keys    | valid UTF-8  | a lone surrogate (``"\\ud800"``) cannot be encoded: the tokenizer, the IPC encoder and the log writer all fail on it |

Typing is strict, as OpenAI's own API is: an integer field takes a JSON integer (not ``"5"``, not
``true``), a number field takes an integer or a float, a string field only a string. A ``null``
(Python ``None``) for a field whose type is not ``Optional`` but which has a default means
"unset": ``without_unset_nulls`` removes it, so SGLang's default applies (``"n": null`` used to
reach ``n > 1`` and fail with a ``TypeError``). A field that SGLang pre-processes with its own
validator (pydantic ``mode="before"``) is typed by that validator alone: its node is ``Json``.
"""

from __future__ import annotations

import dataclasses
import enum
import types
import typing
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping

MAX_DEPTH = 32
MAX_STEPS = 200_000
INT_RANGE = (-(2**63), 2**63 - 1)


class SchemaError(ValueError):
    """A value that breaks its schema: ``path`` names the field (``("sampling_params", "n")``)."""

    def __init__(self, path: tuple, problem: str):
        self.path = tuple(path)
        self.problem = problem
        super().__init__(f"{format_path(self.path) or 'body'}: {problem}")


def format_path(path: tuple) -> str:
    """``("messages", 0, "content")`` -> ``messages[0].content``."""
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


# ----------------------------------------------------------------------------------------- nodes


class Node:
    """One kind of JSON value."""

    def describe(self) -> str:
        raise NotImplementedError


@dataclass(frozen=True)
class Json(Node):
    """Any JSON value (``Any``, a bare ``dict``, a class with no JSON shape)."""

    def describe(self) -> str:
        return "any JSON value"


@dataclass(frozen=True)
class Null(Node):
    """JSON ``null``, inside a list or an object whose items are ``Optional``."""

    def describe(self) -> str:
        return "null"


@dataclass(frozen=True)
class Scalar(Node):
    kind: str  # "int" | "float" | "bool" | "str"

    def describe(self) -> str:
        return {"int": "an integer", "float": "a number", "bool": "true or false", "str": "a string"}[self.kind]


@dataclass(frozen=True)
class ListOf(Node):
    item: Node

    def describe(self) -> str:
        return f"a list of {_plural(self.item)}"


@dataclass(frozen=True)
class MapOf(Node):
    value: Node

    def describe(self) -> str:
        return f"an object with {_plural(self.value)} as values" if not isinstance(self.value, Json) else "an object"


@dataclass(frozen=True)
class OneOf(Node):
    options: tuple[Node, ...]

    def describe(self) -> str:
        return " or ".join(option.describe() for option in self.options)


@dataclass(frozen=True)
class Literal(Node):
    values: tuple

    def describe(self) -> str:
        return "one of " + ", ".join(repr(v) for v in self.values)


@dataclass(frozen=True)
class Field:
    """One named field of a ``Struct``: ``nullable`` (its type is ``Optional``: ``null`` is a
    value), ``required`` (no default: it must be present, and ``null`` is refused unless nullable)."""

    node: Node
    nullable: bool = True
    required: bool = False


@dataclass(eq=False)
class Struct(Node):
    """A JSON object with named fields. ``closed``: other keys are refused (SGLang's msgspec
    structs would fail on them or let them skip normalisation); open structs ignore them, as
    pydantic does, but still hold them to the depth and string limits."""

    name: str
    fields: dict[str, Field] = field(default_factory=dict)
    closed: bool = False

    def describe(self) -> str:
        return f"an object ({self.name})"


def _plural(node: Node) -> str:
    """``node``'s description for many values: "integers", "lists of strings"."""
    if isinstance(node, Scalar):
        return {"int": "integers", "float": "numbers", "bool": "booleans", "str": "strings"}[node.kind]
    if isinstance(node, ListOf):
        return f"lists of {_plural(node.item)}"
    if isinstance(node, (MapOf, Json, Null)):
        return {MapOf: "objects", Json: "JSON values", Null: "nulls"}[type(node)]
    if isinstance(node, Struct):
        return f"{node.name} objects"
    return f"({node.describe()})"


# --------------------------------------------------------------------------- from Python types

Refine = Mapping[tuple[str, str], Node]  # (struct name, field) -> the node SGLang means there


def from_type(tp, refine: Refine = {}, _seen: dict | None = None) -> tuple[Node, bool]:
    """A Python type annotation -> (node, nullable). ``refine`` replaces the node of a struct's
    field, for fields SGLang types as ``Dict[str, Any]`` but reads as one of its own structs."""
    seen = {} if _seen is None else _seen
    origin = typing.get_origin(tp)
    if tp is type(None):
        return Json(), True
    if origin is typing.Annotated:
        return from_type(typing.get_args(tp)[0], refine, seen)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        nullable = type(None) in args
        nodes = []
        for arg in args:
            if arg is type(None):
                continue
            node, inner_null = from_type(arg, refine, seen)
            nullable = nullable or inner_null
            if node not in nodes:
                nodes.append(node)
        if any(isinstance(n, Json) for n in nodes):
            return Json(), nullable
        return (nodes[0] if len(nodes) == 1 else OneOf(tuple(nodes))), nullable
    if origin is typing.Literal:
        values = typing.get_args(tp)
        return Literal(tuple(v for v in values if v is not None)), None in values
    if tp in (int,):
        return Scalar("int"), False
    if tp is float:
        return Scalar("float"), False
    if tp is bool:
        return Scalar("bool"), False
    if tp in (str, bytes):
        return Scalar("str"), False
    if origin in (list, set, frozenset, tuple) or tp in (list, set, tuple):
        args = [a for a in typing.get_args(tp) if a is not Ellipsis]
        if not args:
            return ListOf(Json()), False
        items = [_item(a, refine, seen) for a in args]
        item = items[0] if all(i == items[0] for i in items) else OneOf(tuple(dict.fromkeys(items)))
        return ListOf(item), False
    if origin is dict or tp is dict:
        args = typing.get_args(tp)
        return MapOf(_item(args[1], refine, seen) if len(args) == 2 else Json()), False
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return Literal(tuple(member.value for member in tp)), False
    if isinstance(tp, type) and _fields_of(tp) is not None:
        return struct_of(tp, refine, seen), False
    return Json(), False  # Any, object, classes JSON cannot express (images, tensors)


def _item(tp, refine: Refine, seen: dict) -> Node:
    """The node of a list item or an object value: ``null`` is one of its options where ``tp`` is
    Optional (a struct field keeps that in ``Field.nullable`` instead)."""
    node, nullable = from_type(tp, refine, seen)
    if not nullable or isinstance(node, Json):
        return node
    return OneOf((*(node.options if isinstance(node, OneOf) else (node,)), Null()))


def struct_of(cls, refine: Refine = {}, _seen: dict | None = None) -> Struct:
    """A dataclass, a ``msgspec.Struct`` or a pydantic model -> its ``Struct`` (built once per
    class: models that refer to themselves end in the same object)."""
    seen = {} if _seen is None else _seen
    if cls in seen:
        return seen[cls]
    struct = Struct(cls.__name__, closed=_is_closed(cls))
    seen[cls] = struct
    for name, (annotation, required, typed_by_sglang) in _fields_of(cls).items():
        if (cls.__name__, name) in refine:
            node, nullable = refine[(cls.__name__, name)], True
        elif typed_by_sglang:
            node, nullable = Json(), True
        else:
            node, nullable = from_type(annotation, refine, seen)
        struct.fields[name] = Field(node, nullable=nullable, required=required)
    return struct


def _is_closed(cls) -> bool:
    if hasattr(cls, "__struct_fields__"):  # msgspec
        return True
    config = getattr(cls, "model_config", None)
    return isinstance(config, Mapping) and config.get("extra") == "forbid"


def _fields_of(cls) -> dict[str, tuple[Any, bool, bool]] | None:
    """JSON key -> (annotation, required, typed by SGLang's own validator), or None for a class
    that is none of the three kinds. Duck-typed: this module imports none of the libraries."""
    if isinstance(getattr(cls, "model_fields", None), Mapping):  # pydantic v2
        pre = _pre_validated(cls)
        return {(info.alias or name): (info.annotation, info.is_required(), name in pre)
                for name, info in cls.model_fields.items()}
    hints = _hints(cls)
    if hints is None:
        return None
    if dataclasses.is_dataclass(cls):
        return {f.name: (hints.get(f.name, Any), f.default is dataclasses.MISSING
                         and f.default_factory is dataclasses.MISSING, False)
                for f in dataclasses.fields(cls) if f.init}
    names = getattr(cls, "__struct_fields__", None)
    if names is not None:  # msgspec: defaults align with the last fields
        defaults = getattr(cls, "__struct_defaults__", ())
        first_default = len(names) - len(defaults)
        return {name: (hints.get(name, Any), i < first_default, False) for i, name in enumerate(names)}
    return None


def _hints(cls) -> dict | None:
    try:
        return typing.get_type_hints(cls)
    except Exception:  # noqa: BLE001 - an unresolvable forward reference: the class is opaque
        return None if not (dataclasses.is_dataclass(cls) or hasattr(cls, "__struct_fields__")) else {}


def _pre_validated(cls) -> set[str]:
    """Fields of a pydantic model that a ``mode="before"`` field validator pre-processes."""
    decorators = getattr(cls, "__pydantic_decorators__", None)
    found: set[str] = set()
    for validator in getattr(decorators, "field_validators", {}).values():
        if getattr(validator.info, "mode", None) in ("before", "plain", "wrap"):
            found.update(validator.info.fields)
    return found


# --------------------------------------------------------------------------------------- check


def check(value, node: Node, path: tuple = ()) -> None:
    """Raise ``SchemaError`` for the first part of ``value`` that ``node`` (or a limit) refuses."""
    problem = _Walk().problem(value, node, path, 0)
    if problem is not None:
        raise SchemaError(*problem)


def fits(value, node: Node) -> bool:
    return _Walk().problem(value, node, (), 0) is None


Problem = tuple[tuple, str]


def _show(value) -> str:
    text = repr(value) if isinstance(value, (int, float, bool, str)) or value is None else type(value).__name__
    text = {"dict": "an object", "list": "a list", "None": "null"}.get(text, text)
    return text if len(text) <= 60 else text[:57] + "..."


def string_problem(text: str) -> str | None:
    """Why ``text`` cannot be encoded as UTF-8 (a lone surrogate), or None."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return f"is not valid Unicode (lone surrogate U+{ord(text[exc.start]):04X} at index {exc.start})"
    return None


def _scalar_problem(value, kind: str, path: tuple) -> Problem | None:
    if kind == "str":
        if not isinstance(value, str):
            return path, f"must be a string, got {_show(value)}"
        problem = string_problem(value)
        return None if problem is None else (path, problem)
    if kind == "bool":
        return None if isinstance(value, bool) else (path, f"must be true or false, got {_show(value)}")
    if isinstance(value, bool) or not isinstance(value, (int, float) if kind == "float" else int):
        return path, f"must be {Scalar(kind).describe()}, got {_show(value)}"
    if isinstance(value, int) and not INT_RANGE[0] <= value <= INT_RANGE[1]:
        return path, f"{value} is outside the signed 64-bit range"
    return None


def _key_problem(key, path: tuple) -> Problem | None:
    if not isinstance(key, str):
        return path, f"keys must be strings, got {_show(key)}"
    problem = string_problem(key)
    return None if problem is None else ((*path, key.encode("utf-8", "backslashreplace").decode()), f"key {problem}")


def _same_shape(value, node: Node) -> bool:
    """``value`` has the JSON type ``node`` takes (its problem is then deeper or a limit)."""
    if isinstance(node, Scalar):
        return _scalar_problem(value, node.kind, ()) is None or (
            node.kind in ("str", "int") and type(value) is {"str": str, "int": int}[node.kind])
    if isinstance(node, ListOf):
        return isinstance(value, list)
    if isinstance(node, (MapOf, Struct)):
        return isinstance(value, Mapping)
    return False


def _tag_matches(value: Mapping, node: Node) -> bool:
    """A struct option whose ``type`` field is a literal is a candidate only for a value with that
    ``type`` (pydantic's discriminated unions): what keeps nested unions of structs linear."""
    if not isinstance(node, Struct) or "type" not in value:
        return True
    tag = node.fields.get("type")
    return tag is None or not isinstance(tag.node, Literal) or value["type"] in tag.node.values


class _Walk:
    """One check of one value: the depth limit, and a bound on the work (``MAX_STEPS`` nodes
    visited) so that unions of structs nested in each other cannot cost exponential time."""

    def __init__(self):
        self.steps = 0
        self.seen: dict[tuple[int, int], Problem | None] = {}  # (container, node) -> its verdict

    def problem(self, value, node: Node, path: tuple, depth: int) -> Problem | None:
        """Containers are judged once per node: a union tries several options on the same value, and
        nested unions would otherwise judge the same inner value again for every combination."""
        if not isinstance(value, (list, Mapping)):
            return self.judge(value, node, path, depth)
        key = (id(value), id(node))
        if key not in self.seen:
            self.seen[key] = self.judge(value, node, path, depth)
        return self.seen[key]

    def judge(self, value, node: Node, path: tuple, depth: int) -> Problem | None:
        self.steps += 1
        if self.steps > MAX_STEPS:
            return path, f"too complex to check (more than {MAX_STEPS} values)"
        if depth > MAX_DEPTH:
            return path, f"nested deeper than {MAX_DEPTH} levels"
        if isinstance(node, Json):
            return self.json_problem(value, path, depth)
        if isinstance(node, Null):
            return None if value is None else (path, f"must be null, got {_show(value)}")
        if isinstance(node, Scalar):
            return _scalar_problem(value, node.kind, path)
        if isinstance(node, Literal):
            ok = any(value == v and type(value) is type(v) for v in node.values)
            return None if ok else (path, f"must be {node.describe()}, got {_show(value)}")
        if isinstance(node, ListOf):
            return self.list_problem(value, node, path, depth)
        if isinstance(node, MapOf):
            return self.map_problem(value, node, path, depth)
        if isinstance(node, Struct):
            return self.struct_problem(value, node, path, depth)
        if isinstance(node, OneOf):
            return self.union_problem(value, node, path, depth)
        raise TypeError(f"unknown schema node {node!r}")

    def list_problem(self, value, node: ListOf, path: tuple, depth: int) -> Problem | None:
        if not isinstance(value, list):
            return path, f"must be {node.describe()}, got {_show(value)}"
        if node.item == Scalar("int") and all(type(v) is int for v in value):  # token ids: one C pass
            if not value or INT_RANGE[0] <= min(value) and max(value) <= INT_RANGE[1]:
                return None
        for i, item in enumerate(value):
            problem = self.problem(item, node.item, (*path, i), depth + 1)
            if problem is not None:
                return problem
        return None

    def map_problem(self, value, node: MapOf, path: tuple, depth: int) -> Problem | None:
        if not isinstance(value, Mapping):
            return path, f"must be {node.describe()}, got {_show(value)}"
        for key, item in value.items():
            problem = _key_problem(key, path) or self.problem(item, node.value, (*path, key), depth + 1)
            if problem is not None:
                return problem
        return None

    def struct_problem(self, value, node: Struct, path: tuple, depth: int) -> Problem | None:
        if not isinstance(value, Mapping):
            return path, f"must be {node.describe()}, got {_show(value)}"
        for key, item in value.items():
            problem = _key_problem(key, path)
            if problem is not None:
                return problem
            spec = node.fields.get(key)
            if spec is None:
                if node.closed:
                    return (*path, key), f"unknown field (known: {', '.join(sorted(node.fields))})"
                problem = self.json_problem(item, (*path, key), depth + 1)
            elif item is None:
                problem = None if spec.nullable or not spec.required else ((*path, key), "must not be null")
            else:
                problem = self.problem(item, spec.node, (*path, key), depth + 1)
            if problem is not None:
                return problem
        missing = [name for name, spec in node.fields.items() if spec.required and name not in value]
        return ((*path, missing[0]), "is required") if missing else None

    def union_problem(self, value, node: OneOf, path: tuple, depth: int) -> Problem | None:
        options = node.options
        if isinstance(value, Mapping):
            tagged = [o for o in options if _tag_matches(value, o)]
            options = tagged or options
        problems = []
        for option in options:
            problem = self.problem(value, option, path, depth)
            if problem is None:
                return None
            if problem[1].startswith("too complex"):
                return problem
            problems.append((option, problem))
        # Name the deepest field when the value has the shape of exactly one option (a list for the
        # list option: report the bad element, not "must be a string or a list of strings").
        shaped = [p for option, p in problems if _same_shape(value, option)]
        if len(shaped) == 1 and (len(shaped[0][0]) > len(path) or isinstance(value, (str, int, float))):
            return shaped[0]
        deepest = max((p for _, p in problems), key=lambda p: len(p[0]))
        if deepest[1].startswith("nested deeper"):
            return deepest
        return path, f"must be {node.describe()}, got {_show(value)}"

    def json_problem(self, value, path: tuple, depth: int) -> Problem | None:
        if depth > MAX_DEPTH:
            return path, f"nested deeper than {MAX_DEPTH} levels"
        if isinstance(value, str):
            problem = string_problem(value)
            return None if problem is None else (path, problem)
        if isinstance(value, list):
            for i, item in enumerate(value):
                problem = self.json_problem(item, (*path, i), depth + 1)
                if problem is not None:
                    return problem
        elif isinstance(value, Mapping):
            for key, item in value.items():
                problem = _key_problem(key, path) or self.json_problem(item, (*path, key), depth + 1)
                if problem is not None:
                    return problem
        return None


# ------------------------------------------------------------------------------ null as "unset"


def without_unset_nulls(value, node: Node):
    """``value`` with every ``null`` removed where it stands for a field whose type is not
    ``Optional`` but which has a default (SGLang's default then applies). Returns a new object
    only where something changed; ``check`` should run first."""
    if isinstance(node, Struct) and isinstance(value, Mapping):
        out, changed = {}, False
        for key, item in value.items():
            spec = node.fields.get(key)
            if spec is not None and item is None and not spec.nullable and not spec.required:
                changed = True
                continue
            new = item if spec is None else without_unset_nulls(item, spec.node)
            changed = changed or new is not item
            out[key] = new
        return out if changed else value
    if isinstance(node, OneOf):
        for option in node.options:
            if fits(value, option):
                return without_unset_nulls(value, option)
        return value
    if isinstance(node, ListOf) and isinstance(value, list):
        new = [without_unset_nulls(item, node.item) for item in value]
        return new if any(a is not b for a, b in zip(new, value)) else value
    return value


# ------------------------------------------------------------------------- serialised form (JSON)


def to_json(node: Node) -> dict:
    """The schema as plain JSON (what ``GET /cache_policy/request_schema`` serves); structs are
    written once under ``definitions`` and referred to by name."""
    definitions: dict[str, dict] = {}
    root = _node_json(node, definitions)
    return {"root": root, "definitions": definitions}


def _node_json(node: Node, definitions: dict) -> dict:
    if isinstance(node, Struct):
        if node.name not in definitions:
            definitions[node.name] = {}  # placeholder: a self-reference ends here
            definitions[node.name] = {
                "closed": node.closed,
                "fields": {name: {"node": _node_json(f.node, definitions), "nullable": f.nullable,
                                  "required": f.required} for name, f in node.fields.items()},
            }
        return {"kind": "struct", "name": node.name}
    if isinstance(node, Scalar):
        return {"kind": node.kind}
    if isinstance(node, ListOf):
        return {"kind": "list", "item": _node_json(node.item, definitions)}
    if isinstance(node, MapOf):
        return {"kind": "map", "value": _node_json(node.value, definitions)}
    if isinstance(node, OneOf):
        return {"kind": "one_of", "options": [_node_json(o, definitions) for o in node.options]}
    if isinstance(node, Literal):
        return {"kind": "literal", "values": list(node.values)}
    if isinstance(node, Null):
        return {"kind": "null"}
    return {"kind": "json"}


def from_json(data: Mapping) -> Node:
    """Inverse of ``to_json``."""
    structs: dict[str, Struct] = {}
    definitions = data["definitions"]

    def build(item: Mapping) -> Node:
        kind = item["kind"]
        if kind == "struct":
            name = item["name"]
            if name not in structs:
                spec = definitions[name]
                structs[name] = Struct(name, closed=spec["closed"])
                for key, f in spec["fields"].items():
                    structs[name].fields[key] = Field(build(f["node"]), f["nullable"], f["required"])
            return structs[name]
        simple: dict[str, Callable[[], Node]] = {
            "int": lambda: Scalar("int"), "float": lambda: Scalar("float"), "bool": lambda: Scalar("bool"),
            "str": lambda: Scalar("str"), "json": Json, "null": Null,
            "list": lambda: ListOf(build(item["item"])), "map": lambda: MapOf(build(item["value"])),
            "one_of": lambda: OneOf(tuple(build(o) for o in item["options"])),
            "literal": lambda: Literal(tuple(item["values"])),
        }
        return simple[kind]()

    return build(data["root"])


# ------------------------------------------------------------------------------ fuzzing values

HUGE_STRING_CHARS = 100_000


def nested(levels: int = MAX_DEPTH + 8):
    """A list nested past ``MAX_DEPTH``."""
    value: list = []
    for _ in range(levels):
        value = [value]
    return value


def wrong_values() -> list[tuple[str, Any]]:
    """The kinds of value the fuzz sends to every field: each is wrong for most fields, and a
    field that accepts one (``null`` where the type is Optional, a string for a string field)
    must still get an answer that is not a 5xx."""
    return [
        ("string", "x"),
        ("list", [1, "x"]),
        ("object", {"x": 1}),
        ("null", None),
        ("huge int", 10**30),
        ("huge string", "x" * HUGE_STRING_CHARS),
        ("nested", nested()),
        ("lone surrogate", "\ud800"),
        ("bool", True),
    ]


def walk_fields(node: Node, path: tuple = (), max_depth: int = 2) -> Iterator[tuple[tuple, Field]]:
    """Every field of ``node``'s structs reachable through objects and unions (not through lists),
    up to ``max_depth`` levels of structs: ``(path, field)``."""
    seen: set[int] = set()

    def walk(current: Node, at: tuple, level: int):
        if isinstance(current, OneOf):
            for option in current.options:
                yield from walk(option, at, level)
        elif isinstance(current, Struct) and level < max_depth and id(current) not in seen:
            seen.add(id(current))
            for name, spec in current.fields.items():
                yield (*at, name), spec
                yield from walk(spec.node, (*at, name), level + 1)
            seen.discard(id(current))

    yield from walk(node, path, 0)
