"""SCR's contract as ``policy/`` names it (``policy.api.CachePolicy``, ``policy.carrier``): the
interfaces' members, that each implementation has all of them, that ``patches/`` reaches a policy
and its carrier through nothing else, and that the count docs/ARCHITECTURE.md states is the count.

``patches/scr_runtime.py`` imports SGLang, so its ``ScrEngine`` is read from the source (``ast``)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from policy.api import CachePolicy, PolicyDefaults
from policy.carrier import CarrierDefaults, EnginePort, KvSlots, RequestPrefix, StepCarrier, StepPolicy, StoredStates
from scr.policy import ScrPolicy
from scr.steps import ScrSteps
from tests.unit.test_scr_steps import Engine as FakeScrEngine
from tests.unit.toy_shift_policy import ShiftPolicy, ShiftSteps

ROOT = Path(__file__).resolve().parents[2]


def members(protocol) -> set[str]:
    """The public names a protocol declares, its protocol bases' included."""
    names: set[str] = set()
    for cls in protocol.__mro__:
        if getattr(cls, "_is_protocol", False) and cls.__module__.startswith("policy."):
            names |= {n for n in vars(cls) if not n.startswith("_")} | set(vars(cls).get("__annotations__", {}))
    return names


CACHE_POLICY = {"name", "plans_at", "plan", "release", "check", "server_settings", "server_defaults",
                "startup_problems", "kernel_premises", "snapshot_budget", "token_lookups", "tree_keys", "snapshot_file"}
CARRIER = {"lines", "armed", "before_round", "after_round", "before_admission", "after_admission", "not_admitted",
           "keeps_chunk", "after_prefill", "retracted", "store", "forget", "undo"}
PORT = {"room", "alloc", "free", "evict"} | {"facts", "committed", "advance_prefix", "cut", "attach", "detach",
                                              "include_in_tree"} | {"place", "store_rows", "save_state",
                                                                    "restore_state", "undo_restore"} | {
    "about", "decode", "exchange"}


def test_the_interfaces_declare_these_members_and_no_others():
    assert members(CachePolicy) == CACHE_POLICY
    assert members(StepPolicy) == CACHE_POLICY | {"side_stores", "step_carrier"}
    assert members(StepCarrier) == CARRIER
    assert members(EnginePort) == PORT
    assert members(KvSlots) | members(RequestPrefix) | members(StoredStates) | {"about", "decode", "exchange"} == PORT


@pytest.mark.parametrize("implementation, protocol", [
    (ScrPolicy, StepPolicy), (ShiftPolicy, StepPolicy), (ScrSteps, StepCarrier), (ShiftSteps, StepCarrier),
    (CarrierDefaults, StepCarrier), (FakeScrEngine, EnginePort),
], ids=lambda x: x.__name__)
def test_every_implementation_has_every_member(implementation, protocol):
    assert sorted(m for m in members(protocol) if not hasattr(implementation, m)) == []


def test_policy_defaults_give_every_optional_member():
    assert {m for m in CACHE_POLICY if hasattr(PolicyDefaults, m)} == CACHE_POLICY - {"name", "plan", "release",
                                                                                      "check"}


def engine_members(path: Path, cls: str) -> set[str]:
    """Methods of ``cls`` and the attributes its ``__init__`` sets on ``self``."""
    [node] = [n for n in ast.parse(path.read_text()).body if isinstance(n, ast.ClassDef) and n.name == cls]
    names = {f.name for f in node.body if isinstance(f, ast.FunctionDef)}
    init = next(f for f in node.body if isinstance(f, ast.FunctionDef) and f.name == "__init__")
    for stmt in ast.walk(init):
        targets = stmt.targets if isinstance(stmt, ast.Assign) else []
        for target in targets:
            for t in (target.elts if isinstance(target, ast.Tuple) else [target]):
                if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self":
                    names.add(t.attr)
    return names


def test_the_sglang_engine_port_has_every_member():
    assert sorted(PORT - engine_members(ROOT / "patches" / "scr_runtime.py", "ScrEngine")) == []


def reached(names: tuple[str, ...]) -> dict[str, set[str]]:
    """``patches/`` file -> the attributes it reads of an object named ``names[i]`` (``policy.x``,
    ``self.policy.x``, ``executor.policy.x``)."""
    found: dict[str, set[str]] = {}
    for path in sorted((ROOT / "patches").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Attribute):
                continue
            owner = node.value
            owner_name = owner.id if isinstance(owner, ast.Name) else owner.attr if isinstance(owner, ast.Attribute) else None
            if owner_name in names:
                found.setdefault(str(path.relative_to(ROOT)), set()).add(node.attr)
    return found


def test_patches_reads_nothing_of_a_policy_outside_its_interface():
    outside = {f: sorted(attrs - members(StepPolicy)) for f, attrs in reached(("policy",)).items()}
    assert {f: attrs for f, attrs in outside.items() if attrs} == {}
    assert reached(("policy",))  # the scan sees the executor's calls


def test_patches_calls_nothing_of_a_carrier_outside_its_interface():
    outside = {f: sorted(attrs - CARRIER) for f, attrs in reached(("steps",)).items()}
    assert {f: attrs for f, attrs in outside.items() if attrs} == {}
    assert "armed" in reached(("steps",))["patches/executor.py"]


def test_the_architecture_doc_states_this_count():
    text = (ROOT / "docs" / "ARCHITECTURE.md").read_text()
    stated = re.search(r"In all (\d+) members \((\d+) policy \+ (\d+) carrier \+ (\d+) engine port\)", text)
    assert stated, "docs/ARCHITECTURE.md no longer states the contract's member count"
    counts = (len(members(StepPolicy)), len(members(StepCarrier)), len(members(EnginePort)))
    assert tuple(int(n) for n in stated.groups()) == (sum(counts), *counts)
