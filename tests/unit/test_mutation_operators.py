"""The mutation pass's operators (``tests/mutation/operators.py``, ``docs/mutation.md``).

Each mutant is checked by running the mutated function and comparing with the value the changed
expression gives when written out by hand here.
"""

from __future__ import annotations

import textwrap

import pytest

from tests.mutation.operators import apply, enumerate_mutants
from tests.mutation.runner import imported_modules, select

SOURCE = textwrap.dedent('''\
    """Module docstring with 1 + 2."""
    import logging

    log = logging.getLogger(__name__)
    LIMIT = 10


    def f(a, b=3):
        """Docstring: 4 < 5."""
        log.info("x %d", a + 1)
        if a < b and not a == 0:
            return a + b * 2
        return min(a, b)


    def g(xs):
        total = 0
        for x in xs[1:]:
            total += x  # a comment that must survive
        return total


    class C:
        WIDTH = 7

        def __repr__(self):
            return f"C({1 + 1})"

        def h(self, xs):
            return xs[: len(xs) - 1] if 2 in xs else []  # pragma: no mutate
''')


def _namespace(source: str) -> dict:
    ns: dict = {}
    exec(compile(source, "<mutant>", "exec"), ns)
    return ns


def _by(operator: str, function: str | None = None):
    return [m for m in enumerate_mutants(SOURCE) if m.operator == operator and function in (None, m.function)]


def test_every_mutant_compiles_changes_the_source_and_keeps_line_numbers():
    mutants = enumerate_mutants(SOURCE)
    assert mutants
    for mutant in mutants:
        mutated = apply(SOURCE, mutant)
        assert mutated != SOURCE
        assert mutated.count("\n") == SOURCE.count("\n")
        assert "# a comment that must survive" in mutated


def test_only_function_bodies_outside_repr_logging_docstrings_and_pragma_lines_are_mutated():
    lines = SOURCE.splitlines()
    mutated_lines = {m.line for m in enumerate_mutants(SOURCE)}
    skipped = {i for i, text in enumerate(lines, 1)
               if "LIMIT" in text or "WIDTH" in text or "log.info" in text or '"""' in text or "C({" in text
               or "no mutate" in text}
    assert mutated_lines and not mutated_lines & skipped
    assert {m.function for m in enumerate_mutants(SOURCE)} == {"f", "g"}


@pytest.mark.parametrize("a, b", [(1, 3), (3, 3), (0, 3), (5, 2)])
def test_compare_and_boolean_mutants_evaluate_the_changed_condition(a, b):
    def reference(cond_index: int) -> int:
        conditions = [a <= b and not a == 0, a < b and not a != 0, a < b or not a == 0, a < b and a == 0]
        return a + b * 2 if conditions[cond_index] else min(a, b)

    cases = {("compare", "a < b"): 0, ("compare", "a == 0"): 1, ("boolop", "and"): 2, ("not", "not a == 0"): 3}
    seen = 0
    for mutant in enumerate_mutants(SOURCE):
        key = (mutant.operator, mutant.original)
        if mutant.function == "f" and key in cases:
            assert _namespace(apply(SOURCE, mutant))["f"](a, b) == reference(cases[key])
            seen += 1
    assert seen == 4


def test_arithmetic_constant_return_and_minmax_mutants():
    a, b = 2, 5
    results = {(m.operator, m.original, m.mutated): _namespace(apply(SOURCE, m))["f"](a, b) for m in _by_f()}
    assert results[("arith", "a + b * 2", "a - b * 2")] == a - b * 2
    assert results[("arith", "b * 2", "b // 2")] == a + b // 2
    assert results[("const", "2", "3")] == a + b * 3
    assert results[("const", "2", "1")] == a + b * 1
    assert results[("return", "return a + b * 2", "return None")] is None
    assert _namespace(apply(SOURCE, _one("minmax", "f")))["f"](7, 5) == max(7, 5)
    assert _namespace(apply(SOURCE, _one("compare", "f", "a == 0")))["f"](0, 5) == 0 + 5 * 2


def test_default_argument_is_mutated_as_part_of_the_function():
    plus = [m for m in _by("const", "f") if m.original == "3" and m.mutated == "4"]
    assert len(plus) == 1
    assert _namespace(apply(SOURCE, plus[0]))["f"](9) == min(9, 4)


def test_augmented_assignment_and_slice_bounds():
    xs = [4, 7, 11]
    aug = [m for m in _by("arith", "g") if m.original == "+="]
    assert len(aug) == 1 and _namespace(apply(SOURCE, aug[0]))["g"](xs) == -(7 + 11)
    got = {m.variant: _namespace(apply(SOURCE, m))["g"](xs) for m in _by("slice", "g")}
    assert got == {"lower+1": sum(xs[2:]), "lower-1": sum(xs[0:])}
    # the literal 1 that is a slice bound is left to the slice operator
    assert not [m for m in _by("const", "g") if m.line == 18]


def test_select_is_a_stable_seeded_sample_in_source_order():
    mutants = enumerate_mutants(SOURCE)
    first = select(mutants, 5, 0, "m")
    assert len(first) == 5 and first == select(mutants, 5, 0, "m")
    assert [m.index for m in first] == sorted(m.index for m in first)
    assert select(mutants, None, 0, "m") == mutants


def test_imported_modules_sees_from_imports_of_submodules():
    source = "import scr.diff\nfrom policy import ranks\ndef f():\n    from eval.accounting.flops import QWEN\n"
    assert {"scr.diff", "policy.ranks", "eval.accounting.flops"} <= imported_modules(source)


def _by_f():
    return [m for m in enumerate_mutants(SOURCE) if m.function == "f" and m.line == 12]


def _one(operator: str, function: str, original: str | None = None):
    found = [m for m in _by(operator, function) if original in (None, m.original)]
    assert len(found) == 1, found
    return found[0]
