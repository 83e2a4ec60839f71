"""docs/ARCHITECTURE.md "How to add a policy", followed twice: ``tests/unit/toy_policy.py`` keeps
states only at message starts (``plans_at = "tree"``), ``tests/unit/toy_shift_policy.py`` moves rows
(``plans_at = "enqueue"``). Each is registered by name and served by the executor and hook set that
exist, with no new executor code: these tests drive the first through the same ``PolicyExecutor``
calls the tree makes for exact; ``tests/integration/test_toy_shift_policy.py`` drives the second
through the engine port SCR uses."""

from __future__ import annotations

import pytest

from patches import hook_sets, plugin
from patches.executor import PolicyExecutor
from policy import registry
from policy.api import Read, Plan, Snapshot
from policy.events import read_events
from serving.event_writer import EventWriter
from tests.unit.toy_policy import MessageStartsConfig, MessageStartsPolicy

S = 1  # the message-start token
PROMPT = [7, 8, S, 9, 9, 9, S, 5, 5, S, 4, 4]  # messages start at 2, 6 and 9


class Req:
    def __init__(self, rid, ids):
        self.rid, self.origin_input_ids, self.output_ids = rid, list(ids), []
        self.extra_key, self.prefix_indices, self.cached_tokens = None, [], 0
        self.finished_reason = self.to_finish = None

    def finished(self):
        return self.finished_reason is not None


@pytest.fixture
def shift():
    registry.register("shift", "tests.unit.toy_shift_policy:ShiftPolicy")
    try:
        yield "shift"
    finally:
        registry._IMPLEMENTATIONS.pop("shift", None)


@pytest.fixture
def toy():
    registry.register("message_starts", "tests.unit.toy_policy:MessageStartsPolicy")
    try:
        yield "message_starts"
    finally:
        registry._IMPLEMENTATIONS.pop("message_starts", None)


def test_registered_by_name_with_its_settings_and_its_way_of_planning(toy):
    assert toy in registry.names() and registry.plans_at(toy) == "tree"
    spec = registry.PolicySpec.resolve(toy, ["message_start=3"])
    assert spec.build().config == MessageStartsConfig(message_start=3)
    with pytest.raises(registry.PolicyError, match="message_start must be a token id"):
        registry.PolicySpec.resolve(toy, ["message_start=-1"])


def test_the_plugin_installs_the_existing_tree_hook_set_for_it(toy, monkeypatch):
    """The plugin picks the hook set by ``plans_at``: the tree set, with the same hooks as exact's."""
    chosen = []
    monkeypatch.setattr(hook_sets, "install_tree", lambda register, spec, policy: chosen.append(spec.policy))
    plugin._install_policy_hooks(lambda *args: None, registry.PolicySpec.resolve(toy))
    assert chosen == [toy]


def test_a_cold_prompt_is_read_message_by_message_keeping_a_state_at_each_start(tmp_path):
    executor = PolicyExecutor(MessageStartsPolicy(MessageStartsConfig()), EventWriter(str(tmp_path / "e.jsonl")))
    req = Req("t1", PROMPT)
    plan = executor.plan_in_tree(req, 0, ())
    assert plan == Plan("t1", 0, (Read(0, 2), Snapshot(2, "message_start"), Read(2, 6),
                                  Snapshot(6, "message_start"), Read(6, 9), Snapshot(9, "message_start"),
                                  Read(9, 12)))
    assert [executor.piece_done(req, end) for end in (2, 6, 9, 13)] == ["message_start"] * 3 + [None]
    for position in (2, 6, 9):
        executor.snapshot_written(req, position, "message_start")
    req.finished_reason, req.output_ids = "stop", [3]
    executor.on_release(req)
    [event] = read_events(str(tmp_path / "e.jsonl"))
    assert (event.policy, event.prefix_reused, event.read, event.forwards_off_plan) == ("message_starts", 0, 12, 0)
    assert event.snapshots == [[2, "message_start"], [6, "message_start"], [9, "message_start"]]
    assert event.pieces == [[0, 2], [2, 6], [6, 9], [9, 12]]


def test_a_later_prompt_resumes_at_the_deepest_message_start_the_tree_holds():
    executor = PolicyExecutor(MessageStartsPolicy(MessageStartsConfig()))
    req = Req("t2", PROMPT[:9] + [S, 6, 6, 6])  # the last message edited
    # The tree holds KV to 10 and states at 2, 6 and 9 (and one at 4 that is not a message start).
    plan = executor.plan_in_tree(req, 10, (2, 4, 6, 9))
    assert (plan.resume, plan.forwards()) == (9, [(9, 13)])
    req.prefix_indices = list(range(9))
    executor.on_matched(req)  # the tree served the plan's resume: nothing to say
    assert req.to_finish is None
    assert executor.piece_done(req, 13) is None and executor._tracked["t2"].forwards_off_plan == 0


def test_the_relocating_toy_is_registered_and_gets_the_enqueue_hook_set(shift, monkeypatch):
    from tests.unit.toy_shift_policy import ShiftConfig

    assert registry.plans_at(shift) == "enqueue"
    assert registry.PolicySpec.resolve(shift, ["offset=2"]).build().config == ShiftConfig(offset=2)
    chosen = []
    monkeypatch.setattr(hook_sets, "install_enqueue", lambda register, spec, policy: chosen.append(spec.policy))
    plugin._install_policy_hooks(lambda *args: None, registry.PolicySpec.resolve(shift))
    assert chosen == [shift]
