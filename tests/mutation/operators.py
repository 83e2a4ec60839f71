"""Mutation operators on Python source, standard library only (``ast``).

A mutant is one change in one function. ``enumerate_mutants(source)`` lists every mutant of a
module in source order; ``apply(source, mutant)`` returns the mutated source. A mutant replaces
the source span of a single expression node with the unparsed mutated node (in parentheses,
padded with newlines so that every other line keeps its number), so comments, formatting and line
numbers of the rest of the file are unchanged.

Operators (name: what changes):

* ``compare``: ``<`` <-> ``<=``, ``>`` <-> ``>=``, ``==`` <-> ``!=``, ``in`` <-> ``not in``,
  ``is`` <-> ``is not`` (one comparison operator of a chain at a time).
* ``arith``: ``+`` <-> ``-``, ``*`` <-> ``//`` in binary operations and augmented assignments
  (not when an operand is a string literal: that is formatting or concatenation).
* ``const``: an integer literal ``n`` -> ``n + 1`` and ``n - 1`` (booleans excluded; a literal that
  is itself a slice bound is left to ``slice``).
* ``boolop``: ``and`` <-> ``or``.
* ``not``: ``not x`` -> ``x``.
* ``return``: ``return x`` -> ``return None`` (every return with a value other than ``None``).
* ``minmax``: ``min(...)`` <-> ``max(...)``.
* ``slice``: a slice bound ``e`` -> ``e + 1`` and ``e - 1``.

Not mutated: code outside functions (module and class bodies), ``__repr__``, docstrings and every
string, annotations, f-strings, arguments of logging calls (``log.info(...)``, ``print``,
``"...".format``, ``"..." % x``), and any node that starts on a line carrying
``# pragma: no mutate``.
"""

from __future__ import annotations

import ast
from dataclasses import asdict, dataclass

PRAGMA = "pragma: no mutate"
OPERATORS = ("compare", "arith", "const", "boolop", "not", "return", "minmax", "slice")
SKIPPED_FUNCTIONS = frozenset({"__repr__"})
LOG_METHODS = frozenset({"debug", "info", "warning", "warn", "error", "exception", "critical", "log"})

_COMPARE_SWAP = {ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt, ast.Eq: ast.NotEq,
                 ast.NotEq: ast.Eq, ast.In: ast.NotIn, ast.NotIn: ast.In, ast.Is: ast.IsNot, ast.IsNot: ast.Is}
_ARITH_SWAP = {ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.FloorDiv, ast.FloorDiv: ast.Mult}
_OP_TEXT = {ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=", ast.Eq: "==", ast.NotEq: "!=",
            ast.In: "in", ast.NotIn: "not in", ast.Is: "is", ast.IsNot: "is not", ast.Add: "+", ast.Sub: "-",
            ast.Mult: "*", ast.FloorDiv: "//", ast.And: "and", ast.Or: "or"}


@dataclass(frozen=True)
class Mutant:
    """One planted bug. ``index`` numbers the module's mutants in source order (stable while the
    module's source is unchanged); ``node`` is the position of the mutated node in ``ast.walk``."""

    index: int
    operator: str
    line: int
    col: int
    function: str
    node: int
    variant: str  # operator-specific: which replacement (e.g. "+1", "-1", the new operator)
    original: str
    mutated: str

    def to_dict(self) -> dict:
        return asdict(self)


def _is_str(node: ast.AST) -> bool:
    return (isinstance(node, ast.Constant) and isinstance(node.value, (str, bytes))) or isinstance(node, ast.JoinedStr)


def _is_log_call(node: ast.AST) -> bool:
    if not isinstance(node, ast.Call):
        return False
    func = node.func
    if isinstance(func, ast.Name) and func.id == "print":
        return True
    if isinstance(func, ast.Attribute):
        if func.attr in LOG_METHODS and isinstance(func.value, ast.Name) and "log" in func.value.id.lower():
            return True
        if func.attr == "format" and _is_str(func.value):
            return True
    return False


def _skipped_subtrees(tree: ast.AST) -> set[int]:
    """ids of nodes never mutated: docstrings, annotations, f-strings, logging/formatting."""
    skipped: set[int] = set()

    def mark(node: ast.AST | None) -> None:
        if node is not None:
            skipped.update(id(n) for n in ast.walk(node))

    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Module)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and _is_str(body[0].value):
                mark(body[0])
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            mark(node.returns)
            args = node.args
            for arg in [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg]:
                if arg is not None:
                    mark(arg.annotation)
        elif isinstance(node, ast.AnnAssign):
            mark(node.annotation)
        elif isinstance(node, ast.JoinedStr) or _is_log_call(node):
            mark(node)
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod) and _is_str(node.left):
            mark(node)
    return skipped


def _function_of(tree: ast.AST) -> dict[int, str]:
    """id(node) -> qualified name of the innermost function holding it (absent outside functions)."""
    owner: dict[int, str] = {}

    def visit(node: ast.AST, prefix: str, function: str | None) -> None:
        if function is not None:
            owner[id(node)] = function
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            name = f"{prefix}{node.name}"
            inner = None if node.name in SKIPPED_FUNCTIONS else name
            for deco in node.decorator_list:  # evaluated where the function is defined
                visit(deco, prefix, function)
            visit(node.args, f"{name}.", inner)
            for stmt in node.body:
                visit(stmt, f"{name}.", inner)
        elif isinstance(node, ast.ClassDef):
            for child in ast.iter_child_nodes(node):
                visit(child, f"{prefix}{node.name}.", function)
        else:
            for child in ast.iter_child_nodes(node):
                visit(child, prefix, function)

    visit(tree, "", None)
    return owner


def _int_const(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and type(node.value) is int


def _candidates(node: ast.AST, parent: ast.AST | None) -> list[tuple[str, str]]:
    """(operator, variant) pairs that apply to ``node``."""
    out: list[tuple[str, str]] = []
    if isinstance(node, ast.Compare):
        for i, op in enumerate(node.ops):
            if type(op) in _COMPARE_SWAP:
                out.append(("compare", str(i)))
    elif isinstance(node, ast.BinOp) and type(node.op) in _ARITH_SWAP:
        if not (_is_str(node.left) or _is_str(node.right)):
            out.append(("arith", ""))
    elif isinstance(node, ast.AugAssign) and type(node.op) in _ARITH_SWAP:
        if not _is_str(node.value):
            out.append(("arith", ""))
    elif _int_const(node):
        is_slice_bound = isinstance(parent, ast.Slice) and (node is parent.lower or node is parent.upper)
        if not is_slice_bound:
            out += [("const", "+1"), ("const", "-1")]
    elif isinstance(node, ast.BoolOp):
        out.append(("boolop", ""))
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        out.append(("not", ""))
    elif isinstance(node, ast.Return):
        if node.value is not None and not (isinstance(node.value, ast.Constant) and node.value.value is None):
            out.append(("return", ""))
    elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("min", "max"):
        out.append(("minmax", ""))
    if isinstance(node, ast.Slice):
        for bound in ("lower", "upper"):
            if getattr(node, bound) is not None:
                out += [("slice", f"{bound}+1"), ("slice", f"{bound}-1")]
    return out


def _mutate(node: ast.AST, operator: str, variant: str) -> tuple[ast.AST, ast.AST, str, str]:
    """(node whose span is replaced, its replacement, original text, mutated text)."""
    if operator == "compare":
        i = int(variant)
        new = ast.Compare(left=node.left, ops=list(node.ops), comparators=node.comparators)
        old_op = type(node.ops[i])
        new.ops[i] = _COMPARE_SWAP[old_op]()
        left = ast.unparse(node.left if i == 0 else node.comparators[i - 1])
        right = ast.unparse(node.comparators[i])
        return (node, new, f"{left} {_OP_TEXT[old_op]} {right}",
                f"{left} {_OP_TEXT[type(new.ops[i])]} {right}")
    if operator == "arith":
        old_op = type(node.op)
        if isinstance(node, ast.AugAssign):
            new = ast.AugAssign(target=node.target, op=_ARITH_SWAP[old_op](), value=node.value)
            return node, new, _OP_TEXT[old_op] + "=", _OP_TEXT[_ARITH_SWAP[old_op]] + "="
        new = ast.BinOp(left=node.left, op=_ARITH_SWAP[old_op](), right=node.right)
        return node, new, ast.unparse(node), ast.unparse(new)
    if operator == "const":
        value = node.value + (1 if variant == "+1" else -1)
        return node, ast.Constant(value), repr(node.value), repr(value)
    if operator == "boolop":
        new = ast.BoolOp(op=ast.Or() if isinstance(node.op, ast.And) else ast.And(), values=node.values)
        return node, new, _OP_TEXT[type(node.op)], _OP_TEXT[type(new.op)]
    if operator == "not":
        return node, node.operand, ast.unparse(node), ast.unparse(node.operand)
    if operator == "return":
        return node.value, ast.Constant(None), f"return {ast.unparse(node.value)}", "return None"
    if operator == "minmax":
        name = "max" if node.func.id == "min" else "min"
        new = ast.Call(func=ast.Name(id=name, ctx=ast.Load()), args=node.args, keywords=node.keywords)
        return node.func, new.func, node.func.id, name
    if operator == "slice":
        bound, sign = variant[:-2], variant[-2:]
        old = getattr(node, bound)
        new = ast.BinOp(left=old, op=ast.Add() if sign == "+1" else ast.Sub(), right=ast.Constant(1))
        return old, new, ast.unparse(old), ast.unparse(new)
    raise ValueError(operator)


def _mutate_text(node: ast.AugAssign) -> tuple[str, str]:
    old_op = type(node.op)
    return _OP_TEXT[old_op] + "=", _OP_TEXT[_ARITH_SWAP[old_op]] + "="


def _walk_with_parents(tree: ast.AST) -> list[tuple[ast.AST, ast.AST | None]]:
    parents: dict[int, ast.AST] = {}
    for node in ast.walk(tree):
        for child in ast.iter_child_nodes(node):
            parents[id(child)] = node
    return [(node, parents.get(id(node))) for node in ast.walk(tree)]


def _pragma_lines(source: str) -> set[int]:
    return {i for i, line in enumerate(source.splitlines(), start=1) if PRAGMA in line}


def enumerate_mutants(source: str, operators: tuple[str, ...] = OPERATORS) -> list[Mutant]:
    tree = ast.parse(source)
    skipped = _skipped_subtrees(tree)
    owner = _function_of(tree)
    pragma = _pragma_lines(source)
    mutants: list[Mutant] = []
    for position, (node, parent) in enumerate(_walk_with_parents(tree)):
        if id(node) in skipped or id(node) not in owner or not hasattr(node, "lineno"):
            continue
        if node.lineno in pragma:
            continue
        for operator, variant in _candidates(node, parent):
            if operator not in operators:
                continue
            _, _, original, mutated = _mutate(node, operator, variant)
            mutants.append(Mutant(0, operator, node.lineno, node.col_offset, owner[id(node)], position, variant,
                                  original, mutated))
    mutants.sort(key=lambda m: (m.line, m.col, m.node, m.operator, m.variant))
    return [Mutant(i, *list(asdict(m).values())[1:]) for i, m in enumerate(mutants)]


def _offset(lines: list[str], line: int, col: int) -> int:
    """Character offset of (1-based line, UTF-8 byte column) in the joined source."""
    text = lines[line - 1]
    return sum(len(x) for x in lines[: line - 1]) + len(text.encode()[:col].decode())


def apply(source: str, mutant: Mutant) -> str:
    """The source with ``mutant`` planted; every other line keeps its text and its number."""
    tree = ast.parse(source)
    node, _parent = _walk_with_parents(tree)[mutant.node]
    span, replacement, _, _ = _mutate(node, mutant.operator, mutant.variant)
    lines = source.splitlines(keepends=True)
    start = _offset(lines, span.lineno, span.col_offset)
    end = _offset(lines, span.end_lineno, span.end_col_offset)
    if isinstance(span, ast.AugAssign):  # rewrite only the operator token between target and value
        op_start = _offset(lines, span.target.end_lineno, span.target.end_col_offset)
        op_end = _offset(lines, span.value.lineno, span.value.col_offset)
        between = source[op_start:op_end]
        old, new = _mutate_text(span)
        mutated = source[:op_start] + between.replace(old, new, 1) + source[op_end:]
    else:
        newlines = "\n" * (span.end_lineno - span.lineno)
        mutated = source[:start] + f"({ast.unparse(replacement)}{newlines})" + source[end:]
    ast.parse(mutated)  # a mutant always compiles
    return mutated
