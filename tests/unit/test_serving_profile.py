"""serving/profile.py and its use by the launcher: every arm gets the same settings, so arms differ
in the policy alone (issue: one serving profile for every arm)."""

from __future__ import annotations

import pytest

from patches.launch_server import parse, with_profile
from policy import registry
from policy.api import CHECKPOINT_QUANTIZATION
from serving import checkpoint, profile
from serving.launch_args import LaunchError, apply_profile, given, on_cuda

POLICIES = ("radix", "exact", "scr")


def served_argv(policy: str, cuda: bool, *extra: str, profile_name: str = "matched") -> list[str]:
    argv = ["--model-path", "m", "--cache-policy", policy, "--serving-profile", profile_name, *extra]
    spec, rest = parse(argv)
    return with_profile(spec, argv, rest, cuda)[1]


def compared_values(argv: list[str], cuda: bool) -> dict:
    """The value each compared field has on ``argv`` (True for a bare flag, None when absent)."""
    out = {}
    for field in profile.COMPARED_FIELDS:
        present, value = given(argv, "--" + field.replace("_", "-"))
        out[field] = (value if value is not None else True) if present else None
    return out


@pytest.mark.parametrize("name", list(profile.PROFILES))
@pytest.mark.parametrize("cuda", [True, False], ids=["cuda", "cpu"])
def test_no_policy_contradicts_a_profile(name, cuda):
    for policy in registry.names():
        needs = registry.PolicySpec.resolve(policy, [], None).build().server_settings()
        assert profile.conflicts(profile.get(name), needs, cuda) == [], policy


@pytest.mark.parametrize("name", ["matched", "matched-graphs"])
@pytest.mark.parametrize("cuda", [True, False], ids=["cuda", "cpu"])
def test_every_arm_gets_the_same_shared_settings(name, cuda):
    """The defect: on CUDA SGLang picks flashinfer sampling for radix/scr but pytorch under exact's
    deterministic mode, and the README's arms differed in attention, graphs and overlap."""
    seen = {policy: compared_values(served_argv(policy, cuda, profile_name=name), cuda) for policy in POLICIES}
    assert seen["radix"] == seen["exact"] == seen["scr"]
    expected = {k: (True if v is True else str(v)) for k, v in profile.get(name).settings(cuda).items()}
    assert {k: v for k, v in seen["radix"].items() if v is not None} == expected
    if cuda:
        assert seen["radix"]["sampling_backend"] == "pytorch"
        assert seen["radix"]["enable_deterministic_inference"] is True


def test_the_profiles_differ_in_graphs_only():
    matched, graphs = profile.get("matched").settings(True), profile.get("matched-graphs").settings(True)
    assert {k for k in matched if matched[k] != graphs[k]} == {"cuda_graph_backend_decode"}
    assert (matched["cuda_graph_backend_decode"], graphs["cuda_graph_backend_decode"]) == ("disabled", "full")
    assert profile.get("matched").settings(False) == profile.get("matched-graphs").settings(False)


def test_none_adds_nothing():
    assert served_argv("radix", True, profile_name="none") == ["--model-path", "m"]
    assert profile.get("none").environment(True) == {}


def test_the_matched_profile_meets_exacts_gpu_requirements():
    """exact's invariance checks pass on CUDA with nothing but the profile and exact's own settings."""
    chosen = profile.get("matched")
    policy = registry.PolicySpec.resolve("exact", ["piece_tokens=832"], None).build()
    resolved = {**chosen.settings(True), **policy.server_settings(), "kv_cache_dtype": "auto",
                CHECKPOINT_QUANTIZATION: None}
    assert policy.startup_problems(resolved, chosen.environment(True), True) == []
    assert policy.startup_problems({**resolved, "enable_deterministic_inference": False},
                                   chosen.environment(True), True) != []


def test_cpu_gets_no_gpu_settings_and_no_environment():
    argv = served_argv("radix", False)
    assert not given(argv, "--enable-deterministic-inference")[0]
    assert not given(argv, "--attention-backend")[0]
    assert profile.get("matched").environment(False) == {}
    assert profile.get("matched").environment(True) == {"SGLANG_TRITON_PREFILL_TRUNCATION_ALIGN_SIZE": "64"}


@pytest.mark.parametrize("extra, fragment", [
    (["--page-size", "16"], "--serving-profile matched (every arm's shared settings) needs --page-size 1; "
                            "the command line gives --page-size 16"),
    (["--sampling-backend", "flashinfer"], "needs --sampling-backend pytorch"),
    (["--attention-backend", "fa3"], "needs --attention-backend triton"),
])
def test_a_command_line_that_contradicts_the_profile_exits_2(extra, fragment, capsys):
    with pytest.raises(SystemExit) as exit_info:
        served_argv("radix", True, *extra)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert fragment in err and "--serving-profile none" in err


def test_a_contradiction_is_allowed_without_a_profile():
    assert served_argv("radix", True, "--page-size", "16", profile_name="none") == ["--model-path", "m", "--page-size", "16"]


def test_the_environment_must_agree(monkeypatch, capsys):
    monkeypatch.setenv("SGLANG_TRITON_PREFILL_TRUNCATION_ALIGN_SIZE", "4096")
    with pytest.raises(SystemExit):
        served_argv("radix", True)
    assert "SGLANG_TRITON_PREFILL_TRUNCATION_ALIGN_SIZE=4096 in the environment" in capsys.readouterr().err
    assert served_argv("radix", False)  # CPU: the profile sets no environment


def test_apply_profile_refuses_a_profile_that_contradicts_the_policy():
    broken = profile.ServingProfile("broken", "test", {"page_size": 16})
    with pytest.raises(LaunchError, match="contradicts --cache-policy scr: page_size: profile broken gives 16"):
        apply_profile(broken, "scr", {"page_size": 1}, [], False)


def test_unknown_profile_names_the_valid_ones(capsys):
    with pytest.raises(SystemExit):
        parse(["--serving-profile", "fast"])
    assert "matched-graphs" in capsys.readouterr().err
    with pytest.raises(profile.ProfileError, match="valid: matched, matched-graphs, none"):
        profile.get("fast")


@pytest.mark.parametrize("argv, available, expected, asked", [
    (["--device", "cpu"], True, False, False),
    (["--device", "cuda"], False, True, False),
    (["--device=cuda:1"], False, True, False),
    ([], True, True, True),
    ([], False, False, True),
])
def test_on_cuda(argv, available, expected, asked):
    calls = []
    assert on_cuda(argv, lambda: calls.append(1) or available) is expected
    assert bool(calls) is asked


@pytest.mark.parametrize("resolved, expected", [
    ({"device": "cuda", **profile.get("matched").settings(True)}, "matched"),
    ({"device": "cuda", **profile.get("matched-graphs").settings(True)}, "matched-graphs"),
    ({"device": "cpu", **profile.get("matched").settings(False)}, "matched"),
    ({"device": "cuda", **profile.get("matched").settings(True), "sampling_backend": "flashinfer"}, None),
    ({"device": "cuda", **profile.get("matched").settings(False)}, None),  # a GPU server without the GPU half
])
def test_identify(resolved, expected):
    assert profile.identify(resolved) == expected


def test_compared_fields_cover_the_defects():
    assert {"sampling_backend", "attention_backend", "disable_overlap_schedule", "page_size",
            "mamba_radix_cache_strategy", "cuda_graph_backend_decode", "cuda_graph_backend_prefill",
            "enable_deterministic_inference", "linear_attn_prefill_backend"} <= set(profile.COMPARED_FIELDS)


@pytest.mark.parametrize("config, expected", [
    ({}, None),
    (None, None),
    ({"quantization_config": {"quant_method": "FP8"}}, "fp8"),
    ({"text_config": {"quantization_config": {"quant_method": "awq"}}}, "awq"),
    ({"quantization_config": {"quant_algo": "NVFP4"}}, "nvfp4"),
    ({"quantization_config": {}}, "unknown"),
])
def test_checkpoint_quantization(config, expected):
    assert checkpoint.quantization(config) == expected


def test_checkpoint_config_from_a_local_directory(tmp_path):
    (tmp_path / "config.json").write_text('{"quantization_config": {"quant_method": "fp8"}}')
    assert checkpoint.quantization(checkpoint.config_json(str(tmp_path))) == "fp8"
    assert checkpoint.config_json(str(tmp_path / "absent")) is None


def test_the_bcp_manifest_refuses_arms_that_differ_in_a_profile_field():
    """eval.bcp.compare compares ``comparable``: an arm on SGLang's CUDA defaults (flashinfer
    sampling) beside a matched arm differs in ``server_args``; two matched arms do not."""
    from eval.bcp.manifest import comparable

    matched = {"device": "cuda", "model_path": "m", **profile.get("matched").settings(True)}

    def manifest(policy, args):
        return {"policy": policy, "server": {"args": args}}

    assert comparable(manifest("radix", matched)) == comparable(manifest("exact", dict(matched)))
    for field in profile.COMPARED_FIELDS:
        other = {**matched, field: "something else"}
        assert comparable(manifest("radix", other))["server_args"] != comparable(manifest("exact", matched))["server_args"], field


def test_checkpoint_config_from_the_hub_cache(tmp_path, monkeypatch):
    snapshot = tmp_path / "models--Org--Model-FP8" / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text('{"quantization_config": {"quant_method": "fp8"}}')
    (tmp_path / "models--Org--Model-FP8" / "refs").mkdir()
    (tmp_path / "models--Org--Model-FP8" / "refs" / "main").write_text("abc123\n")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    assert checkpoint.quantization(checkpoint.config_json("Org/Model-FP8")) == "fp8"
    assert checkpoint.cached_file("Org/Model-FP8", "config.json", revision="abc123") == str(snapshot / "config.json")
    assert checkpoint.config_json("Org/Other") is None
    assert checkpoint.config_json("Org/Model-FP8", revision="v2") is None
    assert checkpoint.hub_cache({"HF_HOME": "/h"}) == "/h/hub"


@pytest.mark.parametrize("files, text_only", [((), True), (("preprocessor_config.json",), False),
                                              (("processor_config.json",), False),
                                              (("video_preprocessor_config.json",), False)])
def test_a_checkpoint_without_processor_configs_is_text_only(tmp_path, files, text_only):
    from serving import checkpoint

    (tmp_path / "config.json").write_text('{"architectures": ["Qwen3_5ForConditionalGeneration"]}')
    for name in files:
        (tmp_path / name).write_text("{}")
    assert checkpoint.is_text_only(str(tmp_path)) is text_only
    assert checkpoint.is_text_only(str(tmp_path / "absent")) is None  # not on this machine: no decision


def test_the_text_only_rule_leaves_a_users_choice_and_unknown_checkpoints_alone(tmp_path):
    import types

    from patches import text_only

    (tmp_path / "config.json").write_text("{}")
    args = types.SimpleNamespace(model_path=str(tmp_path), revision=None, enable_multimodal=None)
    line = text_only.text_only_default(args)
    assert args.enable_multimodal is False and line.startswith(f"[cache-policy] text-only checkpoint {tmp_path}: no ")
    chosen = types.SimpleNamespace(model_path=str(tmp_path), revision=None, enable_multimodal=True)
    assert text_only.text_only_default(chosen) is None and chosen.enable_multimodal is True
    hub = types.SimpleNamespace(model_path="Org/NotHere", revision=None, enable_multimodal=None)
    assert text_only.text_only_default(hub) is None and hub.enable_multimodal is None
