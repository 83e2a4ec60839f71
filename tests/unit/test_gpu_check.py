"""``eval.gpu_check`` without a server or a GPU: the summary and exit status on fake step results,
the argument parsing, the rotary comparison at Qwen3.6's real geometry on CPU (and that a wrong
re-rotation fails it), and the constants the check copies (exact's expected reuse against the
spec's oracle, the refusal messages against the policies' own).
"""

from __future__ import annotations

import json

import pytest
import torch

from eval.gpu_check import __main__ as entry
from eval.gpu_check import cli, rotary, runner, servers, steps
from eval.gpu_check.exact_cases import SETUPS, TURN_EXPECTED, prompt_ids
from eval.gpu_check.report import FAIL, PASS, SKIP, Checks, StepResult, exit_status, table, write_json

# ----------------------------------------------------------------------------------------------
# Summary and exit status


def test_exit_status_is_1_when_any_step_failed_and_skips_do_not_count():
    assert exit_status([StepResult("a", PASS), StepResult("b", SKIP)]) == 0
    assert exit_status([StepResult("a", PASS), StepResult("b", FAIL), StepResult("c", SKIP)]) == 1
    assert exit_status([StepResult("a", SKIP)]) == 0
    assert exit_status([]) == 1  # nothing ran: nothing was shown


def test_unknown_status_is_refused():
    with pytest.raises(ValueError, match="status 'OK'"):
        StepResult("a", "OK")


def test_checks_fail_with_the_first_broken_expectation():
    checks = Checks()
    checks.expect(True, "first holds")
    checks.expect(False, "second broke")
    checks.expect(False, "third broke")
    result = checks.result("step")
    assert result.status == FAIL
    assert result.detail.startswith("2 of 3 checks failed: second broke")
    assert result.checks == [[True, "first holds"], [False, "second broke"], [False, "third broke"]]


def test_checks_that_checked_nothing_fail():
    assert Checks().result("empty").status == FAIL


def test_checks_pass_with_the_summary():
    checks = Checks()
    checks.expect(1 == 1, "one")
    checks.note("x", 3)
    result = checks.result("step", "all good")
    assert (result.status, result.detail, result.data) == (PASS, "all good", {"x": 3})


def test_table_has_a_row_per_step_and_the_verdict():
    rows = [StepResult("radix", PASS, 12.3, 75, "turn 2 hit"), StepResult("scr", FAIL, 130.0, 120, "no relocation"),
            StepResult("rotary", SKIP, 0.0, None, "not on cpu")]
    text = table(rows)
    lines = text.splitlines()
    assert lines[0].split()[:3] == ["step", "result", "seconds"]
    assert any(line.startswith("radix") and " PASS " in line and "turn 2 hit" in line for line in lines)
    assert any(line.startswith("scr") and " FAIL " in line and "(over budget)" in line for line in lines)
    assert lines[-1] == "FAILED: scr"
    assert table([StepResult("radix", PASS)]).splitlines()[-1] == "PASSED"


def test_json_report_carries_every_step_and_the_exit_status(tmp_path):
    path = write_json(tmp_path / "r" / "report.json", [StepResult("a", PASS), StepResult("b", FAIL, detail="x")],
                      {"device": "cpu"})
    body = json.loads(path.read_text())
    assert body["exit_status"] == 1 and body["device"] == "cpu"
    assert [(s["name"], s["status"]) for s in body["steps"]] == [("a", PASS), ("b", FAIL)]


def _ctx(tmp_path, device="cpu", **kw):
    return runner.Context(device=device, out=tmp_path, **kw)


def test_a_step_that_raises_is_its_own_fail_and_the_next_step_still_runs(tmp_path):
    def broken(ctx):
        raise RuntimeError("server exited with 1")

    def fine(ctx):
        checks = Checks()
        checks.expect(True, "ok")
        return checks.result("fine")

    results = runner.run_steps(_ctx(tmp_path), [runner.Step("broken", broken, 10, ""), runner.Step("fine", fine, 10, "")],
                               progress=lambda line: None)
    assert [(r.name, r.status) for r in results] == [("broken", FAIL), ("fine", PASS)]
    assert results[0].detail == "RuntimeError: server exited with 1"
    assert "Traceback" in results[0].data["traceback"]


def test_blocked_and_out_of_time_steps_fail_without_running(tmp_path):
    ran = []

    def step(ctx):
        ran.append(ctx)
        return StepResult("x", PASS)

    ctx = _ctx(tmp_path, blocked="preflight: torch sees no GPU")
    (result,) = runner.run_steps(ctx, [runner.Step("radix", step, 10, "")], progress=lambda line: None)
    assert (result.status, result.detail) == (FAIL, "not run: preflight: torch sees no GPU")
    late = _ctx(tmp_path, device="cuda", time_limit_s=0.0)
    (result,) = runner.run_steps(late, [runner.Step("radix", step, 10, "")], progress=lambda line: None)
    assert result.status == FAIL and "time limit" in result.detail
    assert ran == []


def test_the_time_row_fails_on_cuda_over_the_limit_and_is_informative_on_cpu(tmp_path):
    assert runner.time_row(_ctx(tmp_path), []).status == SKIP
    assert runner.time_row(_ctx(tmp_path, device="cuda", time_limit_s=600), []).status == PASS
    over = runner.time_row(_ctx(tmp_path, device="cuda", time_limit_s=0.0), [StepResult("scr", PASS, 9, 5)])
    assert over.status == FAIL and "over their budget: scr" in over.detail


def _fake_steps(monkeypatch, statuses):
    def make(name, status):
        def run(ctx):
            checks = Checks()
            checks.expect(status == PASS, f"{name} checked")
            return checks.result(name)
        return runner.Step(name, run, 10, f"fake {name}")

    fakes = [make(f"s{i}", status) for i, status in enumerate(statuses)]
    monkeypatch.setattr(steps, "select", lambda only: fakes)


def test_main_exits_1_when_a_step_fails_and_writes_the_report(tmp_path, monkeypatch, capsys):
    _fake_steps(monkeypatch, [PASS, FAIL, PASS])
    assert entry.main(["--device", "cpu", "--out", str(tmp_path)]) == 1
    body = json.loads((tmp_path / "report.json").read_text())
    assert body["exit_status"] == 1
    assert [s["status"] for s in body["steps"]] == [PASS, FAIL, PASS, SKIP]  # the CPU time row is a SKIP
    assert "FAILED: s1" in capsys.readouterr().out


def test_main_exits_0_when_every_step_passes(tmp_path, monkeypatch):
    _fake_steps(monkeypatch, [PASS, PASS])
    assert entry.main(["--device", "cpu", "--out", str(tmp_path)]) == 0


# ----------------------------------------------------------------------------------------------
# Arguments


def test_defaults():
    args = cli.parse_args([])
    assert (args.device, args.out, args.only, args.quick, args.time_limit) == ("cuda", cli.DEFAULT_OUT, None, False, 600.0)


def test_options():
    args = cli.parse_args(["--device", "cpu", "--out", "/tmp/x", "--only", "scr, rotary", "--quick", "--time-limit", "900"])
    assert (args.device, str(args.out), args.only, args.quick, args.time_limit) == ("cpu", "/tmp/x", ["scr", "rotary"], True, 900.0)


@pytest.mark.parametrize("argv, message", [
    (["--only", "radix,bogus"], "choose from preflight, startup, model,"), (["--only", ","], "choose from preflight, startup, model,"),
    (["--device", "rocm"], "invalid choice: 'rocm'"), (["--time-limit", "-3"], "'-3': must be > 0")])
def test_bad_arguments_exit_2(argv, message, capsys):
    with pytest.raises(SystemExit) as exc:
        cli.parse_args(argv)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_only_keeps_the_checks_order():
    assert [s.name for s in steps.select(["scr", "preflight", "exact-64"])] == ["preflight", "exact-64", "scr"]
    assert [s.name for s in steps.select(None)] == list(steps.NAMES)


def test_budgets_fit_ten_minutes():
    assert sum(step.budget_s for step in steps.STEPS) <= cli.TIME_LIMIT_S


# ----------------------------------------------------------------------------------------------
# Rotary at Qwen3.6's geometry, on CPU (the torch rotator; SGLang's kernels need the server's imports)


def test_geometry_is_qwen36():
    g = rotary.QWEN36
    assert (g.head_dim, g.rotary_dim, g.rope_theta, g.num_kv_heads) == (256, 64, 10_000_000, 4)
    assert sum(g.mrope_section) == g.rotary_dim // 2
    theta = g.theta64()
    assert theta[0] == 1.0 and theta[-1] == pytest.approx(1e7 ** (-31 / 32))


SMALL_MOVES = [rotary.Move(131_071 - 63, 3, 64), rotary.Move(0, 131_071 - 63, 64), rotary.Move(500, 500, 8)]
SMALL_SINGLE = ([131_071, 0, 131_072, 77_777], [0, 131_071, 131_071, 77_000])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_re_rotation_equals_rotating_at_the_new_position(dtype):
    result = rotary.compare(rotary.TorchRotator(rotary.QWEN36, dtype), SMALL_MOVES, SMALL_SINGLE)
    assert result.ok, result.summary()
    assert result.passthrough_equal and result.zero_shift_equal
    assert result.rows == 64 + 64 + 8 + 4
    # bf16: moved and fresh differ by a few roundings at most, and often not at all.
    if dtype == torch.bfloat16:
        assert result.moved_vs_fresh_units <= 3.0 and result.bit_identical > 0.3


def _flipped(keys, old_pos, new_pos, table):
    """A re-rotation by −Δ instead of Δ."""
    return rotary.rerotate_keys_from_cache(keys, new_pos, old_pos, table)


def _rounded_table(keys, old_pos, new_pos, table):
    """The re-rotation with a bf16 cos/sin table (what a table cast by a bf16 forward would give)."""
    return rotary.rerotate_keys_from_cache(keys, old_pos, new_pos, table.to(torch.bfloat16))


@pytest.mark.parametrize("wrong", [_flipped, _rounded_table], ids=["sign", "bf16-table"])
def test_a_wrong_re_rotation_fails(wrong):
    single = ([0, 5, 131_071, 1_000, 64, 9], [131_071, 0, 2, 1_001, 0, 900])
    result = rotary.compare(rotary.TorchRotator(rotary.QWEN36, torch.float32), [], single, rerotate=wrong)
    assert not result.ok
    assert result.moved_vs_fresh > 1.0


def test_moves_reach_131072_with_both_signs():
    blocks = rotary.moves()
    ends = [max(m.old_start, m.new_start) + m.rows - 1 for m in blocks]
    assert max(ends) == rotary.MAX_POSITION
    shifts = [m.new_start - m.old_start for m in blocks]
    assert min(shifts) < 0 < max(shifts) and 0 in shifts
    old, new = rotary.scattered(64)
    assert {0, rotary.MAX_POSITION - 1, rotary.MAX_POSITION} <= set(old) | set(new)
    assert max(old + new) <= rotary.MAX_POSITION


# ----------------------------------------------------------------------------------------------
# What the check copies from elsewhere stays in step with it


def test_exact_expected_reuse_is_the_oracles():
    from tests.reference.exact_oracle import expected_reuse

    for setup in SETUPS.values():
        for case in setup.cases:
            got = expected_reuse([list(p) for p in case.prompts], piece=setup.piece_tokens, retain_every=setup.retain_every,
                                 kept=setup.kept)
            assert tuple(got) == case.expected, case.name


def test_the_kept_cases_resume_where_no_cold_read_ends_a_forward():
    """The kept step's point: in some case a warm read resumes at a point the cold read of the same
    prompt ends no forward at (not a chunk end of B = 128, not a keep point of the cold read), so
    warm = cold needs the kernels' split invariance."""
    from tests.reference.exact_oracle import ExactOracle

    setup = SETUPS["kept"]
    assert (setup.cut, setup.piece_tokens, setup.retain_every) == ("kept", 128, 256)
    split = []
    for case in setup.cases:
        for prompt, resume in zip(case.prompts, case.expected):
            cold_keeps = ExactOracle(setup.piece_tokens, setup.retain_every, kept=True).serve(prompt)[1]
            if resume and resume % setup.piece_tokens and resume not in cold_keeps:
                split.append((case.name, resume))
    assert ("append", 576) in split and ("resume_at_a_junction", 320) in split
    assert {case.name for case in setup.cases if case.quick} >= {"append", "resume_at_a_junction"}


def test_each_exact_step_starts_its_server_with_its_cut_rule(tmp_path, monkeypatch):
    """The server each exact step asks for (stopped before it starts): the kept step's has cut=kept."""
    from contextlib import contextmanager

    from eval.gpu_check import exact

    asked = {}

    class Started(Exception):
        pass

    @contextmanager
    def serving(ctx, name, args, total_tokens, **kw):
        asked[name] = args
        raise Started
        yield

    monkeypatch.setattr(servers, "serving", serving)
    for run in (exact.run_64, exact.run_832, exact.run_kept):
        with pytest.raises(Started):
            run(_ctx(tmp_path))

    def setting(args, key):
        return [v.split("=", 1)[1] for f, v in zip(args, args[1:]) if f == "--cache-policy-set" and v.startswith(key + "=")]

    assert sorted(asked) == ["exact-64", "exact-832", "exact-kept"]
    assert [setting(asked["exact-kept"], k) for k in ("cut", "piece_tokens", "retain_every")] == [["kept"], ["128"], ["256"]]
    assert setting(asked["exact-64"], "cut") == setting(asked["exact-832"], "cut") == ["grid"]
    for args in asked.values():
        assert args[args.index("--serving-profile") + 1] == "matched"


@pytest.mark.parametrize("cuda", [True, False], ids=["cuda", "cpu"])
def test_the_kept_step_reads_the_launchers_premise_line(cuda):
    """The step's pattern parses the line the launcher logs (``PREMISE_HELD``), and fails on a log
    without it or with the other device's."""
    import types

    from eval.gpu_check import exact
    from patches import launch_server

    args = types.SimpleNamespace(dtype="bfloat16")
    line = launch_server.PREMISE_HELD % ("CUDA" if cuda else "CPU", launch_server.premise_source(args, cuda))
    found = exact.PREMISE_LINE.search(f"[2026-01-01 00:00:00] {line}\n")
    assert found.groups() == (("CUDA", "patches.kernel_selftest, bfloat16") if cuda
                              else ("CPU", "the CPU engine, patches/cpu/platform.py"))
    other = launch_server.PREMISE_HELD % ("CPU" if cuda else "CUDA", launch_server.premise_source(args, not cuda))
    for log, ok in ((line, True), ("cache policy exact", False), (other, False)):
        checks = Checks()
        exact.check_premise(checks, types.SimpleNamespace(log_text=lambda log=log: log), cuda)
        assert checks.result("exact-kept").status == (PASS if ok else FAIL), log


def test_the_cases_are_the_engine_tests_prompts():
    from tests.engine.prompts import prompt_ids as engine_prompt_ids

    assert prompt_ids(100, 600) == engine_prompt_ids(100, 600)
    assert TURN_EXPECTED == (0, 256, 384)


@pytest.mark.parametrize("case", [c for c in __import__("eval.gpu_check.refusals", fromlist=["CASES"]).CASES],
                         ids=lambda c: c.name)
def test_each_refusal_needle_is_in_the_policys_own_message(case):
    """The text each refusal case looks for is what the policy says for those settings on CUDA."""
    from policy import registry

    args = dict(zip(case.args[::2], case.args[1::2]))
    policy = registry.PolicySpec.resolve(args["--cache-policy"], [], None).build()
    settings = {**policy.server_settings(), "quantization": args.get("--quantization"),
                "mamba_ssm_dtype": args.get("--mamba-ssm-dtype"), "kv_cache_dtype": args.get("--kv-cache-dtype", "auto"),
                "mamba_radix_cache_strategy": args.get("--mamba-radix-cache-strategy", "no_buffer"),
                "chunked_prefill_size": 256, "enable_deterministic_inference": args.get("--serving-profile") != "none",
                "attention_backend": "triton", "linear_attn_prefill_backend": "triton"}
    env = {"SGLANG_TRITON_PREFILL_TRUNCATION_ALIGN_SIZE": "64"}
    problems = policy.startup_problems(settings, env, True)
    assert any(case.needle.lower() in p.lower() for p in problems), problems


# ----------------------------------------------------------------------------------------------
# Log reading


def test_decode_log_lines_give_batch_sizes_and_graph_use():
    log = ("[2026-01-01 00:00:00] Decode batch, #running-req: 4, #token: 900, token usage: 0.01, cuda graph: True, "
           "gen throughput (token/s): 10.00, #queue-req: 0\n"
           "[2026-01-01 00:00:01] Decode batch, #running-req: 1, #token: 300, token usage: 0.00, cuda graph: False, "
           "gen throughput (token/s): 9.00, #queue-req: 0\n")
    assert servers.decode_batch_sizes(log) == {1, 4}
    assert servers.graph_flags(log) == [True, False]
    assert servers.decode_batch_sizes("Prefill batch, #new-seq: 1") == set()


# ----------------------------------------------------------------------------------------------
# The reference comparison and the checkpoint reader


class _FixedReference:
    """Log-probabilities fixed in advance: position i prefers token i % 3."""

    def log_softmax(self, ids, model=None):
        table = torch.full((len(ids), 4), -5.0, dtype=torch.float64)
        for i in range(len(ids)):
            table[i, i % 3] = -0.1
        return table


def test_served_distance_measures_logprobs_and_greedy_shortfall():
    from eval.gpu_check.reference import served_distance

    prompt = [7, 7, 7]  # the answer's first token is predicted at position 2, which prefers token 2
    delta, shortfall = served_distance(_FixedReference(), prompt, [2, 0], [-0.1, -0.3])
    assert delta == pytest.approx(0.2) and shortfall == 0.0
    delta, shortfall = served_distance(_FixedReference(), prompt, [1, 0], [-5.0, -0.1])
    assert delta == pytest.approx(0.0) and shortfall == pytest.approx(4.9)  # greedy took a far worse token


def test_tolerance_is_bf16s_on_cuda_and_the_engine_tests_on_cpu():
    from eval.gpu_check.reference import BF16_TOL, FP32_TOL, tolerance

    assert (tolerance(True), tolerance(False)) == (BF16_TOL, FP32_TOL) == (0.5, 1e-4)


def test_safetensors_dtypes_reads_the_header(tmp_path):
    import struct

    from eval.gpu_check.model import safetensors_dtypes

    header = {"a": {"dtype": "BF16", "shape": [2], "data_offsets": [0, 4]},
              "b": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}, "__metadata__": {"format": "pt"}}
    raw = json.dumps(header).encode()
    path = tmp_path / "m.safetensors"
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + bytes(8))
    assert safetensors_dtypes(path) == {"BF16": 1, "F32": 1}


# ----------------------------------------------------------------------------------------------
# The start-up step is untimed; the CUDA toolkit is found as SGLang's JIT finds it


def test_an_untimed_step_has_no_budget_and_is_left_out_of_the_time_limit(tmp_path, monkeypatch):
    now = [0.0]
    monkeypatch.setattr(runner.time, "monotonic", lambda: now[0])

    def taking(seconds, name):
        def run(ctx):
            now[0] += seconds
            return StepResult(name, PASS)
        return run

    ctx = runner.Context(device="cuda", out=tmp_path, time_limit_s=100.0, started=0.0)
    warm = runner.Step("startup", taking(300.0, "startup"), 0, "", timed=False)
    timed = runner.Step("radix", taking(30.0, "radix"), 60, "")
    first, second = runner.run_steps(ctx, [warm, timed], progress=lambda line: None)
    assert (first.budget_s, first.seconds, second.budget_s, second.seconds) == (None, 300.0, 60, 30.0)
    assert second.status == PASS  # 330 s of wall time, but only 30 count against the 100 s limit
    assert ctx.untimed_s == 300.0 and ctx.elapsed() == 30.0
    assert "untimed start-up 300 s not counted" in runner.time_row(ctx, [first, second]).detail
    assert steps.STEPS[1].name == "startup" and not steps.STEPS[1].timed
    assert all(step.timed for step in steps.STEPS if step.name != "startup")


@pytest.mark.parametrize("env, on_path, home, how", [
    ({"CUDA_HOME": "/opt/cuda-13.0", "CUDA_PATH": "/x"}, "/usr/bin/nvcc", "/opt/cuda-13.0", "$CUDA_HOME"),
    ({"CUDA_PATH": "/opt/cp"}, "/usr/bin/nvcc", "/opt/cp", "$CUDA_PATH"),
    ({}, "/usr/local/cuda-13.1/bin/nvcc", "/usr/local/cuda-13.1", "nvcc on PATH"),
    ({}, None, "/usr/local/cuda", "the default /usr/local/cuda"),
], ids=["cuda-home", "cuda-path", "nvcc-on-path", "default"])
def test_the_toolkit_is_looked_for_in_tvm_ffis_order(env, on_path, home, how):
    from eval.gpu_check import toolkit

    assert toolkit.cuda_home(env, which=lambda name: on_path) == (home, how)


def test_nvcc_release_and_the_problem_named_with_what_to_install():
    from eval.gpu_check import toolkit

    assert toolkit.nvcc_release("nvcc: NVIDIA (R) Cuda compiler driver\nCuda compilation tools, release 13.0, V13.0.48") == "13.0"
    assert toolkit.nvcc_release("bash: nvcc: command not found") is None
    assert toolkit.problem("/usr/local/cuda", "the default /usr/local/cuda", "13.1", "13.0") is None
    missing = toolkit.problem("/usr/local/cuda", "the default /usr/local/cuda", None, "13.0")
    assert missing.startswith("no CUDA toolkit: no working nvcc at /usr/local/cuda/bin/nvcc (the default /usr/local/cuda)")
    assert "cuda-toolkit-13-0" in missing and "CUDA_HOME=/usr/local/cuda-13.0" in missing
    other = toolkit.problem("/opt/c", "$CUDA_HOME", "12.4", "13.0")
    assert other.startswith("the CUDA toolkit at /opt/c ($CUDA_HOME) is 12.4, torch is built with CUDA 13.0")


def test_find_runs_the_nvcc_it_finds(tmp_path):
    from eval.gpu_check import toolkit

    nvcc = tmp_path / "bin" / "nvcc"
    nvcc.parent.mkdir()
    nvcc.write_text("#!/bin/sh\necho 'Cuda compilation tools, release 13.0, V13.0.48'\n")
    nvcc.chmod(0o755)
    found = toolkit.find({"CUDA_HOME": str(tmp_path)}, torch_cuda="13.0")
    assert found == {"home": str(tmp_path), "how": "$CUDA_HOME", "nvcc_release": "13.0", "problem": None}
    assert toolkit.find({"CUDA_HOME": str(tmp_path / "none")}, torch_cuda="13.0")["problem"].startswith("no CUDA toolkit")


def test_preflight_names_the_kernel_wheel_0_5_16_ships():
    import inspect

    from eval.gpu_check import preflight

    source = inspect.getsource(preflight.check_probe)
    assert '"sglang-kernel"' in source and '"sgl-kernel"' not in source
