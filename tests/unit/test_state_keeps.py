"""``patches.state_keeps``: what a forward's GDN layers are told to keep, and its one check per forward."""

from __future__ import annotations

import pytest

from patches import state_keeps
from patches.state_keeps import StateKeep


@pytest.fixture(autouse=True)
def no_pending():
    yield
    state_keeps.clear()


def test_a_forward_reads_its_starts_once_and_checks_its_keeps_against_them():
    reads = []

    def read():
        reads.append(1)
        return [0, 200, 350]

    state_keeps.set_pending([StateKeep(0, 128, 5), StateKeep(1, 64, 6)])
    assert [state_keeps.forward_starts(read) for _ in range(3)] == [[0, 200, 350]] * 3
    assert len(reads) == 1  # the first GDN layer reads it; the others reuse it
    state_keeps.set_pending([StateKeep(1, 64, 6)])  # the next forward reads its own
    assert state_keeps.forward_starts(lambda: [0, 100, 300]) == [0, 100, 300]


@pytest.mark.parametrize("keep, field", [(StateKeep(1, 192, 5), "offset"), (StateKeep(2, 64, 5), "sequence")])
def test_a_keep_outside_the_forward_is_refused_at_its_first_layer(keep, field):
    state_keeps.set_pending([keep])
    with pytest.raises(ValueError, match=f"StateKeep.{field}"):
        state_keeps.forward_starts(lambda: [0, 200, 350])


def test_one_sequences_keeps_by_offset():
    keeps = [StateKeep(0, 64, 2), StateKeep(1, 64, 3), StateKeep(0, 128, 4)]
    assert state_keeps.for_sequence(keeps, 0) == {64: 2, 128: 4}
    assert state_keeps.for_sequence(keeps, 2) == {}
