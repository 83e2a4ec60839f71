"""Documentation references stay inside the repository, and every ``§`` citation resolves.

``scripts/check_doc_refs.py`` is the check (the citation convention is in its docstring and in
``docs/ARCHITECTURE.md``); ``scripts/rewrite_doc_refs.py`` moves old references to the external
specification files onto ``docs/``. The first test is the repository-wide gate; the rest pin the
convention and the rewrite on small texts.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

import check_doc_refs as check  # noqa: E402
import rewrite_doc_refs as rewrite  # noqa: E402

HEADINGS = {
    "scr": {"4.3", "6.5", "7", "7.5", "9.2", "9.6", "11.2"},
    "eval": {"1.1", "1.3", "1.5", "2", "5.6", "5.7"},
    "model": {"4", "6.4"},
    "cpu": {"1", "2", "3", "4"},
    "sglang": {"6.4", "7.2"},
    "exact": {"1", "5"},
}


def test_repository_has_no_outside_reference_and_no_dangling_citation():
    problems = check.check_texts(check.read_texts(ROOT))
    assert [str(p) for p in problems] == []


def test_rewrite_covers_every_reference_in_the_repository():
    """The rewrite, applied to the tree as it is, leaves nothing for the check to report."""
    problems = check.check_texts(rewrite.rewritten_tree(check.read_texts(ROOT)))
    assert [str(p) for p in problems] == []


@pytest.mark.parametrize(
    "line, default, expected",
    [
        pytest.param("§7.5 and §9.6", "scr", [("scr", "7.5"), ("scr", "9.6")], id="bare-uses-default"),
        pytest.param("§7.5", None, [(None, "7.5")], id="bare-without-default"),
        pytest.param("docs/eval.md §5.6-5.7", None, [("eval", "5.6"), ("eval", "5.7")], id="range-second-end-bare"),
        pytest.param("§6.1–§6.3", "scr", [("scr", "6.1"), ("scr", "6.3")], id="range-en-dash"),
        pytest.param("(docs/model.md §4, docs/eval.md §5.7)", "scr", [("model", "4"), ("eval", "5.7")], id="nearest-before"),
        pytest.param("§2 then docs/eval.md §3 and §1", "scr", [("scr", "2"), ("eval", "3"), ("eval", "1")], id="doc-binds-what-follows"),
        pytest.param("`../docs/scr.md` §7", None, [("scr", "7")], id="relative-path"),
        pytest.param("§7.5 steps 1-5", "scr", [("scr", "7.5")], id="steps-are-not-citations"),
        pytest.param("(§1.9).", "eval", [("eval", "1.9")], id="trailing-period"),
        pytest.param("nothing cited", "scr", [], id="no-citation"),
    ],
)
def test_citation_binding(line, default, expected):
    assert check.citations(line, default) == expected


@pytest.mark.parametrize(
    "path, text, expected",
    [
        pytest.param("scr/m.py", '"""Plan.\n\nSpec: docs/scr.md\n"""\n', "scr", id="docstring-line"),
        pytest.param("eval/m.py", '"""Plan."""\n# Spec: docs/eval.md\n', "eval", id="comment-line"),
        pytest.param("exact_cache/README.md", "Spec: `docs/exact.md` §1 and §5.\n", "exact", id="markdown-with-citations"),
        pytest.param("docs/scr.md", "## §7 Plan\n", "scr", id="docs-file-is-its-own-default"),
        pytest.param("scr/m.py", '"""Plan (§7)."""\n', None, id="none"),
    ],
)
def test_default_doc(path, text, expected):
    assert check.default_doc(path, text) == expected


@pytest.mark.parametrize(
    "path, text, expected",
    [
        pytest.param("a.py", "# docs/scr.md §7.5\n", [], id="resolves"),
        pytest.param("a.py", "# see scr_spec.md\n", ["reference outside the repository: 'scr_spec.md'"], id="spec-file"),
        pytest.param("a.md", "see /work/shared/docs/\n", ["reference outside the repository: 'shared/docs'"], id="shared-folder"),
        pytest.param("a.py", "# style.md\n", ["reference outside the repository: 'style.md'"], id="style-guide"),
        pytest.param(
            "a.py", "# (eval_spec §2.1)\n",
            ["reference outside the repository: 'eval_spec'", "§2.1 cites no doc (add a 'Spec: docs/<name>.md' line)"],
            id="bare-stem-before-citation",
        ),
        pytest.param("a.py", "# the sglang_cpu test tier\n", [], id="bare-stem-without-citation"),
        pytest.param("a.py", "# §7.5\n", ["§7.5 cites no doc (add a 'Spec: docs/<name>.md' line)"], id="no-default"),
        pytest.param("a.py", "# docs/nope.md §1\n", ["§1 cites docs/nope.md, which does not exist"], id="unknown-doc"),
        pytest.param("a.py", "# docs/scr.md §8.1\n", ["§8.1 has no heading in docs/scr.md"], id="missing-heading"),
        pytest.param("a.py", "# docs/eval.md §5.6-5.9\n", ["§5.9 has no heading in docs/eval.md"], id="range-end-checked"),
        pytest.param("scripts/check_doc_refs.py", "# scr_spec.md §99\n", [], id="exempt-file"),
    ],
)
def test_check_text(path, text, expected):
    problems = check.check_text(path, text, HEADINGS)
    assert [p.message for p in problems] == expected


def test_headings_are_read_from_markdown():
    text = "# Title\n\n## §7 Plan\n### §7.5 Relocation, exact order\n#### §2.6.3: server side\n§8 is not a heading\n"
    assert check.section_headings(text) == {"7", "7.5", "2.6.3"}


@pytest.mark.parametrize(
    "path, text, expected",
    [
        pytest.param("a.py", "# See scr_spec.md §7.5.\n", "# See docs/scr.md §7.5.\n", id="spec-name"),
        pytest.param("a.py", "# /work/shared/docs/model_spec.md §6.4\n", "# docs/model.md §6.4\n", id="absolute-path"),
        pytest.param("a.md", "`../../shared/docs/exact_cache_spec.md` §1\n", "`docs/exact.md` §1\n", id="relative-path"),
        pytest.param("a.py", "# shared/docs/scr_spec.md\n", "# docs/scr.md\n", id="shared-folder"),
        pytest.param("a.py", "# spec ``docs/scr_spec.md`` §7\n", "# spec ``docs/scr.md`` §7\n", id="docs-spelling"),
        pytest.param("a.py", "# (eval_spec §1.5)\n", "# (docs/eval.md §1.5)\n", id="stem-before-citation"),
        pytest.param("a.py", "# sglang_internals §6.4\n", "# docs/sglang.md §6.4\n", id="internals"),
        pytest.param("a.py", "# sglang516_cpu.md §2\n", "# docs/cpu.md §4\n", id="cpu-516-section-moves"),
        pytest.param("a.txt", "# sglang516_cpu.md §1\n", "# docs/cpu.md §1\n", id="cpu-516-install"),
        pytest.param("a.py", "# (sglang516_cpu.md B4-B7)\n", "# (docs/cpu.md §4 B4-B7)\n", id="cpu-516-item"),
        pytest.param("a.py", "# ``sglang_cpu.md`` blocker 10\n", "# ``docs/cpu.md`` §3 blocker 10\n", id="cpu-523-blocker"),
        pytest.param("a.py", "# sglang_cpu.md §2\n", "# docs/cpu.md §2\n", id="cpu-523-section"),
        pytest.param("a.py", "# the sglang_cpu tier\n", "# the sglang_cpu tier\n", id="marker-untouched"),
        pytest.param(
            "scr/m.py", '"""Plan (§6.5)."""\nimport os\n', '"""Plan (§6.5)."""\n# Spec: docs/scr.md\nimport os\n',
            id="spec-line-after-docstring",
        ),
        pytest.param(
            "eval/bcp/README.md", "# Title\n\nRun files (§1.3).\n",
            "# Title\n\nSpec: docs/eval.md\n\nRun files (§1.3).\n", id="spec-line-under-title",
        ),
        pytest.param(
            "eval/bcp/x.yaml", "# keys (§1.5)\n", "# Spec: docs/eval.md\n# keys (§1.5)\n", id="spec-line-on-top",
        ),
        pytest.param(
            "eval/x.py",
            '"""Rules (``scr_spec.md`` §7.5; ``scr_spec.md`` §9.6), sizes (``eval_spec.md``\n§5.6).\n\nAlso §7.5.\n"""\n',
            '"""Rules (``docs/scr.md`` §7.5; ``docs/scr.md`` §9.6), sizes (``docs/eval.md``\n'
            'docs/eval.md §5.6).\n\nAlso §7.5.\n"""\n# Spec: docs/scr.md\n',
            id="sentence-broken-after-name-keeps-its-doc",
        ),
        pytest.param(
            "scr/x.py", '"""Sizes (``eval_spec.md``\nand more, §7.5).\n"""\n',
            '"""Sizes (``docs/eval.md``\nand more, §7.5).\n"""\n# Spec: docs/scr.md\n',
            id="name-at-line-end-binds-only-a-line-starting-with-a-citation",
        ),
    ],
)
def test_rewrite_text(path, text, expected):
    assert rewrite.rewrite_text(path, text, HEADINGS) == expected
    assert rewrite.rewrite_text(path, expected, HEADINGS) == expected


@pytest.mark.parametrize(
    "path, text, expected",
    [
        pytest.param("patches/scr_x.py", "# (sglang_internals §6.4)\n# §7.5 then §9.2\n", "scr", id="headings-decide"),
        pytest.param("eval/accounting/x.py", "# (``scr_spec.md`` §11.2)\n# §11.2\n", "scr", id="named-beats-path"),
        pytest.param("tests/unit/test_bcp_x.py", "# §1.3\n", "eval", id="path-only"),
        pytest.param("somewhere/x.py", "# §1.3\n", None, id="unknown"),
    ],
)
def test_main_doc(path, text, expected):
    assert rewrite.main_doc(path, text, HEADINGS) == expected
