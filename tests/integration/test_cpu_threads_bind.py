"""The CPU default for tensor parallelism: one core range per TP rank in SGLang's
``SGLANG_CPU_OMP_THREADS_BIND`` format (without it SGLang 0.5.16 allows one rank per NUMA node)."""

from __future__ import annotations

import pytest

from patches.cpu.platform import threads_bind

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("cores, tp, expected", [
    ([0, 1], 2, "0|1"),
    ([1, 0], 2, "0|1"),  # sorted first
    (range(8), 2, "0-3|4-7"),
    (range(8), 4, "0-1|2-3|4-5|6-7"),
    (range(7), 2, "0-2|3-5"),  # the spare core is left out
    ([0, 2, 4, 6], 2, "0,2|4,6"),  # not contiguous: a comma list
    ([0, 1], 1, None),  # one rank: SGLang's own default applies
    ([0], 2, None),  # fewer cores than ranks: SGLang's message stands
])
def test_threads_bind(cores, tp, expected):
    assert threads_bind(cores, tp) == expected
