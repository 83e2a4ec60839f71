"""Which test files the mutation pass runs for a module (``tests/mutation/runner.py``,
``docs/mutation.md``): direct imports, ``importorskip``, helpers of the test folders, the tier
order, and the slow files left out; on a small repository made in a temporary folder."""

from __future__ import annotations

from pathlib import Path

from tests.mutation import runner


def write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_tests_are_found_through_imports_importorskip_and_test_helpers_in_tier_order(tmp_path, monkeypatch):
    body = "def f(x):\n    return x + 1\n"
    write(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/glue.py": "import torch\n\n\ndef g(x):\n    return x - 1\n",
        "pkg/pure.py": "def h():\n    import sglang\n    return 1 + 1\n",
        "pkg/rule.py": body,
        "tests/unit/test_rule.py": "from pkg import rule\n",
        "tests/unit/test_other.py": "import pkg.rule\n",
        "tests/reference/test_ref.py": "from pkg.rule import f\n",
        "tests/integration/fake_engine.py": "def drive():\n    from pkg import glue\n",
        "tests/integration/test_driven.py": "from tests.integration import fake_engine\n",
        "tests/integration/test_skip.py": "import pytest\nglue = pytest.importorskip('pkg.glue')\nimport pkg.rule\n",
        "tests/integration/test_slow.py": "from pkg import rule, glue\n",
    })
    monkeypatch.setattr(runner, "SLOW_TESTS", {"tests/integration/test_slow.py": "too slow"})
    found = {m.name: m for m in runner.discover(tmp_path, ("pkg",))}
    assert found["pkg.rule"].tests == ["tests/unit/test_rule.py", "tests/unit/test_other.py",
                                       "tests/reference/test_ref.py", "tests/integration/test_skip.py"]
    assert found["pkg.glue"].tests == ["tests/integration/test_driven.py", "tests/integration/test_skip.py"]
    assert (found["pkg.glue"].engine, found["pkg.glue"].skipped) == (["torch"], "")
    assert (found["pkg.pure"].engine, found["pkg.pure"].skipped) == ([], "no test file imports it")
    assert found["pkg"].skipped == "no mutable code"


def test_a_target_is_a_package_folder_or_one_file(tmp_path):
    write(tmp_path, {"a/x.py": "", "a/y.py": "", "a/sub/z.py": "", "b/w.py": "", "b/v.py": ""})
    files = runner.target_files(tmp_path, ("a", "b/w.py"))
    assert [str(p.relative_to(tmp_path)) for p in files] == ["a/x.py", "a/y.py", "b/w.py"]


def test_the_repositorys_targets_exist_and_the_slow_files_are_real():
    for target in runner.TARGETS:
        assert (runner.ROOT / target).exists(), target
    for path in runner.SLOW_TESTS:
        assert (runner.ROOT / path).is_file(), path
