"""``patches.plugin`` and ``patches.process`` without SGLang (its hook registry is the stub of
``conftest.fake_sglang``): a hook is in place when its target changed, by our own record, and the
policy is built once per process and handed down (issue 36)."""

from __future__ import annotations

import os
import sys
from types import SimpleNamespace

import pytest

from patches import plugin, process, targets
from policy.registry import SPEC_ENV, PolicySpec


@pytest.fixture
def builds(monkeypatch):
    """Every ``PolicySpec.build`` call, by policy name."""
    calls: list[str] = []
    original = PolicySpec.build
    monkeypatch.setattr(PolicySpec, "build", lambda spec: calls.append(spec.policy) or original(spec))
    return calls


def scheduler(attn_tp_rank: int = 0):
    """What the scheduler-start hook reads of a Scheduler (its ``ps`` ranks); nothing else is built."""
    return SimpleNamespace(ps=SimpleNamespace(attn_tp_rank=attn_tp_rank, attn_cp_rank=0, pp_rank=0,
                                              tp_rank=attn_tp_rank))


def start_hooks(registry) -> list:
    return [hook for target, hook, _ in registry.hooks if target == targets.SCHEDULER_INIT]


def test_every_registered_hook_in_place_installs(fake_sglang, monkeypatch):
    monkeypatch.setenv(SPEC_ENV, PolicySpec.resolve("radix").to_json())
    plugin.install()
    assert plugin._state["installed"] is True
    assert set(plugin.installed_targets()) == {target for target, _, _ in fake_sglang.hooks}
    assert {targets.REQ_MATCHED, targets.RELEASE_KV, targets.SCHEDULER_INIT} <= set(plugin.installed_targets())


def test_a_hook_sglang_did_not_apply_stops_the_process_naming_it(fake_sglang, monkeypatch):
    """The target still names what it named before ``apply_hooks``: the check is ours (the stub
    registry has no record of what it patched to read)."""
    monkeypatch.setenv(SPEC_ENV, PolicySpec.resolve("radix").to_json())
    fake_sglang.skip = {targets.RELEASE_KV}
    with pytest.raises(SystemExit) as stopped:
        plugin.install()
    assert str(stopped.value) == ("cache-policy overlay: these hooks are not in place (SGLang internals changed?): "
                                  f"{targets.RELEASE_KV}; policy 'radix' cannot run")
    assert plugin._state["installed"] is False


@pytest.mark.parametrize("policy", ["radix", "exact"])
def test_a_scheduler_process_builds_its_policy_once(fake_sglang, monkeypatch, builds, policy):
    """The plugin builds the policy (a bad spec stops every process) and the scheduler's start
    hook hands that same object to the executor: one build per process."""
    monkeypatch.setenv(SPEC_ENV, PolicySpec.resolve(policy).to_json())
    monkeypatch.setattr(sys.modules["patches.exact_tree"], "attach", lambda *args: None, raising=False)
    plugin.install()
    [start] = start_hooks(fake_sglang)
    start(None, scheduler())
    assert builds == [policy]
    assert process.executor().policy is process.policy_for(PolicySpec.resolve(policy))
    assert builds == [policy]


def test_a_spec_that_cannot_be_built_stops_the_process(fake_sglang, monkeypatch):
    monkeypatch.setenv(SPEC_ENV, PolicySpec("exact", {"piece_tokens": -1}).to_json())
    with pytest.raises(SystemExit, match=r"^cache-policy overlay: cannot build policy 'exact': piece_tokens"):
        plugin.install()


def test_another_spec_is_built_anew():
    """``policy_for`` answers the held policy only for the spec it was built from."""
    radix, exact = PolicySpec.resolve("radix"), PolicySpec.resolve("exact")
    first = process.policy_for(radix)
    assert process.policy_for(PolicySpec.resolve("radix")) is first
    assert process.policy_for(exact).name == "exact" and process.policy_for(radix) is not first


@pytest.mark.parametrize("policy", ["radix", "exact", "scr"])
def test_the_launcher_builds_the_policy_once(fake_sglang, monkeypatch, builds, tmp_path, policy):
    """``parse`` builds it; the serving profile, the plugin loaded in the launcher's own process and
    the start-up refusals ask ``patches.process`` for it and build none."""
    from patches import launch_server
    for key in [key for key in os.environ if key.startswith("KVREUSE_")]:  # the calling shell's
        monkeypatch.delenv(key)
    monkeypatch.setattr(launch_server, "_torch_sees_a_gpu", lambda: False)
    monkeypatch.setattr(launch_server, "split_invariance_failures", lambda args, cuda: {})
    argv = ["--cache-policy", policy, "--model-path", str(tmp_path)]
    spec, sglang_argv = launch_server.parse(argv)
    chosen, sglang_argv, env = launch_server.with_profile(spec, argv, sglang_argv, False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv(SPEC_ENV, spec.to_json())
    plugin.install()
    (tmp_path / "config.json").write_text("{}")
    resolved = {"model_path": str(tmp_path), "revision": None, "chunked_prefill_size": 512, "tp_size": 1,
                "prefill_max_requests": 1, "kv_cache_dtype": "auto", **chosen.settings(False),
                **process.policy_for(spec).server_settings()}  # what SGLang would resolve for this command line
    launch_server._refuse_unsafe_settings(spec, SimpleNamespace(**resolved), chosen, False)
    assert builds == [policy]
