"""The GPU check's ``kernels`` step (``eval/gpu_check/kernels.py``): how it judges the start-up
self-test's report, and that it speaks the self-test's language (``patches/kernel_selftest.py``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from eval.gpu_check import kernels, steps
from eval.gpu_check.report import FAIL, PASS, SKIP, Checks
from eval.gpu_check.runner import Context
from patches import kernel_selftest

GOOD = {"grid_failures": {}, "off_grid": {"gdn_chunk": "split at 37: output differs in 900 of 1000 values"}}


def _judged(report):
    checks = Checks()
    kernels.judge(checks, report)
    return checks.result("kernels")


def test_a_good_report_passes_and_is_kept():
    result = _judged(GOOD)
    assert result.status == PASS and result.data["selftest"] == GOOD
    assert result.data["attention_off_grid"].startswith("identical")


@pytest.mark.parametrize("report, needle", [
    ({**GOOD, "grid_failures": {"extend_attention": "split at 64: output differs in 3 of 9 values"}},
     "extend_attention: split at 64"),
    ({**GOOD, "off_grid": {}}, "the comparison can see a split): identical"),
    ({"error": "ImportError: no sglang"}, "did not report: ImportError"),
], ids=["grid-fails", "blind", "no-report"])
def test_a_bad_report_fails_naming_why(report, needle):
    result = _judged(report)
    assert result.status == FAIL and needle in result.detail


def test_the_step_is_skipped_on_cpu(tmp_path):
    result = kernels.run(Context(device="cpu", out=Path(tmp_path)))
    assert result.status == SKIP and "tests/kernels" in result.detail


def test_the_step_speaks_the_self_tests_language():
    assert kernels.RESULT_PREFIX == kernel_selftest.RESULT_PREFIX
    names = (kernel_selftest.GDN_CHUNK, kernel_selftest.EXTEND_ATTENTION)
    assert (kernels.GDN_CHUNK, kernels.EXTEND_ATTENTION) == names


def test_the_step_runs_after_the_kernels_are_built_and_before_the_policies():
    names = [step.name for step in steps.STEPS]
    assert names.index("startup") < names.index("kernels") < names.index("radix")
    assert names.index("kernels") < names.index("exact-kept")  # the premise on its own, then end to end
