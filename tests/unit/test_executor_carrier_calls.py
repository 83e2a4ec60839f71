"""patches/executor.py: the step carrier is called only for a request it carries out steps for.

Around SGLang's round (``init_round``) and after each prefill forward (``after_prefill``) the
executor calls the carrier for a tracked request whose record has progress (a plan with engine
steps under way), and for nothing else: an untracked request (refused, or planned by nobody) and
a request without progress pass through untouched, and SGLang's own result is handed back."""

from __future__ import annotations

from types import SimpleNamespace

from patches.executor import PolicyExecutor
from policy.carrier import CarrierDefaults
from policy.radix import RadixConfig, RadixPolicy
from tests.unit.test_executor import FakeReq


class Carrier(CarrierDefaults):
    def __init__(self):
        self.calls: list[tuple] = []

    def before_round(self, req, record, chunked_path):
        self.calls.append(("before_round", req.rid, chunked_path))

    def after_round(self, req, record, waiting_queue, chunk_busy):
        self.calls.append(("after_round", req.rid, waiting_queue, chunk_busy))

    def after_prefill(self, req, record):
        self.calls.append(("after_prefill", req.rid))


def executor_with(progress_of: dict[str, object]) -> tuple[PolicyExecutor, Carrier, dict]:
    carrier = Carrier()
    executor = PolicyExecutor(RadixPolicy(RadixConfig()), None, steps=carrier,
                              scheduler=SimpleNamespace(chunked_req=None))
    reqs = {rid: FakeReq(rid, list(range(8))) for rid in ("steps", "plain", "untracked")}
    for rid, progress in progress_of.items():
        executor.on_matched(reqs[rid])
        executor._tracked[rid].progress = progress
    return executor, carrier, reqs


def test_the_round_calls_the_carrier_only_for_a_request_with_progress():
    executor, carrier, reqs = executor_with({"steps": "under way", "plain": None})
    rounds = []

    def original(req, tree_cache, cow_mamba, *args, **kwargs):
        rounds.append(req.rid)
        return f"matched {req.rid}"

    for rid in ("steps", "plain", "untracked"):
        assert executor.init_round(original, reqs[rid], None, None) == f"matched {rid}"
    assert rounds == ["steps", "plain", "untracked"]
    assert carrier.calls == [("before_round", "steps", True), ("after_round", "steps", False, False)]


def test_after_a_prefill_the_carrier_sees_only_a_request_with_progress():
    executor, carrier, reqs = executor_with({"steps": "under way", "plain": None})
    batch = SimpleNamespace(reqs=[reqs["untracked"], reqs["plain"], reqs["steps"]])
    assert executor.after_prefill("result", None, batch) == "result"
    assert carrier.calls == [("after_prefill", "steps")]
    assert executor._tracked["plain"].fallback is None
