"""policy/api.py ``Plan.validate``: the order of steps that cover nothing.

A ``Snapshot`` keeps the state a forward (``Read``) left where it ended; a ``Restore`` replaces
the state after a ``Relocate`` (the rows moved in had no forward over them, so the state that
goes with them must come from the side store). A Restore after a Read would overwrite the exact
state the forward just computed with an approximation; a Snapshot after a Relocate or a Restore
would keep a state no forward produced as if one had. The executor validates every plan before it
runs one (``PolicyExecutor._arm``), so these refusals are what stops such a plan."""

from __future__ import annotations

import pytest

from policy.api import Plan, Read, Relocate, Restore, Snapshot

N = 30
GOOD = {
    "read, snapshot": (Read(0, 10), Snapshot(10, "periodic"), Read(10, N)),
    "read, snapshots inside it": (Read(0, 10), Snapshot(4, "periodic"), Snapshot(10, "message"), Read(10, N)),
    "relocate, read, snapshot inside the read": (Read(0, 10), Relocate(10, 5, 40, 0), Read(15, N),
                                                 Snapshot(20, "periodic")),
    "relocate, restore, read": (Read(0, 10), Relocate(10, 5, 40, 0), Restore(15, 0), Read(15, N)),
    "relocate, read": (Read(0, 10), Relocate(10, 5, 40, 0), Read(15, N)),
    "two relocations, one restored": (Read(0, 10), Relocate(10, 5, 40, 0), Read(15, 20), Relocate(20, 5, 60, 0),
                                      Restore(25, 0), Read(25, N)),
}
BAD = {
    "restore after a read": ((Read(0, 10), Restore(10, 0), Read(10, N)), "restore at 10 does not follow a relocation"),
    "restore first": ((Restore(0, 0), Read(0, N)), "restore at 0 does not follow a relocation"),
    "restore after a snapshot": ((Read(0, 10), Snapshot(10, "periodic"), Restore(10, 0), Read(10, N)),
                                 "restore at 10 does not follow a relocation"),
    "restore twice": ((Read(0, 10), Relocate(10, 5, 40, 0), Restore(15, 0), Restore(15, 0), Read(15, N)),
                      "restore at 15 does not follow a relocation"),
    "restore off the relocation's end": ((Read(0, 10), Relocate(10, 5, 40, 0), Restore(14, 0), Read(15, N)),
                                         "restore at 14 does not follow a relocation ending there"),
    "snapshot after a relocation": ((Read(0, 10), Relocate(10, 5, 40, 0), Snapshot(15, "periodic"), Read(15, N)),
                                    "snapshot at 15 is not within the read forward before it"),
    "snapshot after a restore": ((Read(0, 10), Relocate(10, 5, 40, 0), Restore(15, 0), Snapshot(15, "periodic"),
                                  Read(15, N)), "snapshot at 15 is not within the read forward before it"),
    "snapshot first": ((Snapshot(0, "periodic"), Read(0, N)), "snapshot at 0 is not within the read forward before it"),
    "snapshot inside a read, after a relocation": ((Read(0, 10), Relocate(10, 5, 40, 0), Snapshot(5, "periodic"),
                                                   Read(15, N)), "snapshot at 5 is not within the read forward"),
    "snapshot inside a read, after a restore": ((Read(0, 10), Relocate(10, 5, 40, 0), Restore(15, 0),
                                                Snapshot(12, "periodic"), Read(15, N)),
                                               "snapshot at 12 is not within the read forward"),
}


@pytest.mark.parametrize("steps", GOOD.values(), ids=GOOD.keys())
def test_steps_in_their_order_are_accepted(steps):
    assert Plan("r", 0, steps).validate(N) is None


@pytest.mark.parametrize("steps, message", BAD.values(), ids=BAD.keys())
def test_a_step_out_of_its_order_is_refused(steps, message):
    with pytest.raises(ValueError, match=f"^plan r: {message}"):
        Plan("r", 0, steps).validate(N)
