"""The repository's imports read from the source (``ast``; nothing is imported): which module
imports which, and the circles among them.

Every ``import`` statement counts, at module level or inside a function: a function-level import
is an arrow too (it runs when called, and the two modules still cannot be understood apart).
``tests/unit/test_import_rules.py`` (which package may import which) and
``tests/unit/test_import_cycles.py`` (no circle) read the source through this module.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def module_name(path: Path, root: Path = ROOT) -> str:
    """``patches/cpu/platform.py`` -> ``patches.cpu.platform``; a package's ``__init__.py`` -> the package."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_names(source: str, module: str, is_package: bool = False) -> set[str]:
    """What a module's import statements name: ``import a.b`` -> ``a.b``; ``from m import n`` ->
    ``m:n`` (``n`` may be a submodule of ``m`` or a name defined in it: ``graph`` tells them apart).
    Relative imports are resolved against ``module``: ``from . import x`` in ``a.b`` -> ``a:x``, and
    in the package ``a`` itself (``is_package``) too."""
    package = module.split(".") if is_package else module.split(".")[:-1]
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[:len(package) - node.level + 1]
                origin = ".".join([*base, *([node.module] if node.module else [])])
            else:
                origin = node.module or ""
            if origin:
                found.update(f"{origin}:{alias.name}" for alias in node.names)
    return found


def top_level(names: set[str]) -> set[str]:
    """The first part of each name: the package or library imported."""
    return {name.split(":")[0].split(".")[0] for name in names}


def modules(packages: tuple[str, ...], root: Path = ROOT) -> dict[str, Path]:
    return {module_name(p, root): p for pkg in packages for p in sorted((root / pkg).rglob("*.py"))}


def graph(packages: tuple[str, ...], root: Path = ROOT) -> dict[str, set[str]]:
    """Module -> the modules of ``packages`` it imports. A name that is not a module (``from m
    import function``) is an arrow to ``m``; importing ``a.b.c`` is an arrow to ``a.b.c`` only (its
    packages' ``__init__`` run too, but an arrow to them would make every package a circle with
    its own modules)."""
    known = modules(packages, root)
    arrows: dict[str, set[str]] = {}
    for name, path in known.items():
        targets = set()
        for named in imported_names(path.read_text(), name, path.name == "__init__.py"):
            origin, _, member = named.partition(":")
            target = f"{origin}.{member}" if f"{origin}.{member}" in known else origin
            if target in known and target != name:
                targets.add(target)
        arrows[name] = targets
    return arrows


def circles(arrows: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted; sorted, so
    a failure message is stable."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(arrows.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(arrows):
        if node not in index:
            visit(node)
    return sorted(found)
