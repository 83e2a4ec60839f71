"""exact on the GPU's kernels: every warm answer equals the cold one bit for bit.

One server per step: piece 64 with R = 256, piece 832 with its default R = 6656 (both cut=grid),
and the kept rule (``cut=kept``, chunks of 128, R = 256: forwards end only at chunk ends and keep
points, so a warm read runs other forwards than the cold read; docs/exact.md §5.13), each under
``--serving-profile matched`` (on CUDA: deterministic inference, Triton attention and GDN prefill,
the 64-token Triton truncation grid). On it, as the engine tests do on CPU:

* the case matrix: the prompts of a case are served in order on a flushed cache (warm), then each
  prompt again alone after ``/flush_cache`` (cold: ``cached_tokens`` 0); token ids AND output
  logprobs must be equal with ``==``, and each warm read must reuse what the spec's rules say
  (``exact_cases``);
* beside neighbours: a cached prompt is read warm while 1 or 3 other requests (each in its own
  namespace) decode in the same batches, which the per-step decode log must show; its answer must
  equal, bit for bit, the cold answer decoded alone. This is the batch invariance that
  ``--enable-deterministic-inference`` promises and that the CPU suite cannot test for CUDA;
* no forward off the planned pieces (events ``forwards_off_plan`` 0, no ``read [`` log line),
  no traceback or leak report.
Under cut=kept the launcher first runs the rule's guard (``split_invariance_failures``: on CUDA
``patches.kernel_selftest`` on SGLang's GDN chunk kernel and unified extend attention at the served
dtype and the model's shapes; a kernel whose 64-grid split changes bits makes it exit 2), and the
step checks its start-up line (``PREMISE_LINE``) before the cases: the warm = cold cases then show
the premise end to end on the served kernels. The cold answers are also compared with the fp32 reference (``reference.py``: 1e-4 on a fp32 CPU
server, ``BF16_TOL`` on a bf16 GPU server), so a kernel that is wrong the same way warm and cold
does not pass.
"""

from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor

from eval.gpu_check import servers
from eval.gpu_check.exact_cases import (DECODE_TOKENS, NEIGHBOUR_TOKENS, NEIGHBOUR_WARM_TOKENS, SETUPS, TURN_EXPECTED,
                                        TURN_FIRST, TURN_SEEDS, Case, PieceSetup, cases_for, neighbour_prompts,
                                        prompt_ids)
from eval.gpu_check.reference import Reference, served_distance, tolerance
from eval.gpu_check.report import Checks
from eval.server import ServerProcess, output_record, request_events

PROFILE = "matched"
# The launcher's start-up line when cut=kept's premise held on the serving device
# (patches/launch_server.py PREMISE_HELD; eval/ does not import patches/): group 1 the device
# (CUDA or CPU), group 2 what answered (on CUDA "patches.kernel_selftest, <dtype>").
PREMISE_LINE = re.compile(r"cut=kept: split invariance checked on (CUDA|CPU) \((.*?)\): no kernel's bits change")
NEIGHBOUR_COUNTS = (1, 3)
REFERENCE_ANSWERS = 3  # cold answers compared with the fp32 reference per server


def difference(warm: dict, cold: dict) -> str:
    """Where two answers first differ, for the failure message."""
    if warm["output_ids"] != cold["output_ids"]:
        first = next((i for i, (a, b) in enumerate(zip(warm["output_ids"], cold["output_ids"])) if a != b),
                     min(len(warm["output_ids"]), len(cold["output_ids"])))
        return f"ids differ from token {first}"
    deltas = [abs(a - b) for a, b in zip(warm["logprobs"], cold["logprobs"])]
    first = next(i for i, d in enumerate(deltas) if d)
    return f"same ids, logprobs differ from token {first} (max |Δ| {max(deltas):.3g})"


def same_bits(warm: dict, cold: dict) -> bool:
    return warm["output_ids"] == cold["output_ids"] and warm["logprobs"] == cold["logprobs"]


def warm_then_cold(server: ServerProcess, prompts, label: str, decode: int = DECODE_TOKENS):
    """Warm records (served in order on a flushed cache) and the cold record of each prompt."""
    server.flush_cache()
    warm = [output_record(server.generate(list(p), decode, rid=f"{label}.w{i}")) for i, p in enumerate(prompts)]
    cold = []
    for i, prompt in enumerate(prompts):
        server.flush_cache()
        cold.append(output_record(server.generate(list(prompt), decode, rid=f"{label}.c{i}")))
    return warm, cold


def check_case(checks: Checks, server: ServerProcess, case: Case, setup: str, kept: list) -> None:
    warm, cold = warm_then_cold(server, case.prompts, f"{setup}.{case.name}")
    reused = tuple(w["cached_tokens"] for w in warm)
    checks.expect(reused == case.expected, f"{case.name}: reuse {list(reused)} == the spec's {list(case.expected)}")
    wrong = [f"prompt {i}: {difference(w, c)}" for i, (w, c) in enumerate(zip(warm, cold)) if not same_bits(w, c)]
    cold_read = all(c["cached_tokens"] == 0 for c in cold)
    checks.expect(not wrong and cold_read, f"{case.name}: warm = cold bit for bit over {len(warm)} prompts"
                  + (f"; {'; '.join(wrong)}" if wrong else "") + ("" if cold_read else "; a cold read hit the cache"))
    kept.append((case.prompts[-1], cold[-1]))


def check_turns(checks: Checks, server: ServerProcess, setup: str) -> None:
    """Three turns of one conversation, each appending the answer and a new message."""
    server.flush_cache()
    prompts, records = [], []
    prompt = prompt_ids(*TURN_FIRST)
    for seed in TURN_SEEDS:
        prompts.append(prompt)
        records.append(output_record(server.generate(prompt, DECODE_TOKENS, rid=f"{setup}.turn{len(prompts)}")))
        prompt = prompt + records[-1]["output_ids"] + prompt_ids(seed, 80)
    reused = tuple(r["cached_tokens"] for r in records)
    checks.expect(reused == TURN_EXPECTED, f"turns: reuse {list(reused)} == {list(TURN_EXPECTED)}")
    warm, cold = warm_then_cold(server, prompts, f"{setup}.turns")
    wrong = [f"turn {i + 1}: {difference(w, c)}" for i, (w, c) in enumerate(zip(warm, cold)) if not same_bits(w, c)]
    checks.expect(not wrong, "turns: warm = cold bit for bit" + (f"; {'; '.join(wrong)}" if wrong else ""))


def check_neighbours(checks: Checks, server: ServerProcess, setup: PieceSetup, count: int, kept: list) -> None:
    prompt, others = neighbour_prompts(setup, count)
    server.flush_cache()
    server.generate(prompt, 2)  # cached: its next read is warm
    log_start = len(server.log_text())

    def ask(ids, key, tokens):
        return output_record(server.generate(ids, tokens, extra_key=key))

    # The neighbours are sent first and decode four times longer, so the warm request decodes beside them.
    with ThreadPoolExecutor(count + 1) as pool:
        futures = [pool.submit(ask, ids, f"neighbour-{n}", NEIGHBOUR_TOKENS) for n, ids in enumerate(others)]
        warm = pool.submit(ask, prompt, None, NEIGHBOUR_WARM_TOKENS).result()
        [f.result() for f in futures]
    sizes = servers.decode_batch_sizes(server.log_text()[log_start:])
    server.flush_cache()
    cold = output_record(server.generate(prompt, NEIGHBOUR_WARM_TOKENS))
    label = f"beside {count} neighbour{'s' if count > 1 else ''}"
    checks.expect(count + 1 in sizes, f"{label}: decoded {count + 1} rows together (batch sizes seen {sorted(sizes)})")
    checks.expect(warm["cached_tokens"] > 0 and cold["cached_tokens"] == 0,
                  f"{label}: warm read reused {warm['cached_tokens']}, cold read {cold['cached_tokens']}")
    checks.expect(same_bits(warm, cold), f"{label}: warm = cold solo bit for bit over {len(warm['output_ids'])} tokens"
                  + ("" if same_bits(warm, cold) else f"; {difference(warm, cold)}"))
    kept.append((prompt, cold))


def check_reference(checks: Checks, ctx, kept: list) -> None:
    reference = Reference(ctx.model_dir())
    tol = tolerance(ctx.cuda)
    distances = []
    for prompt, cold in kept[:REFERENCE_ANSWERS]:
        delta, shortfall = served_distance(reference, list(prompt), cold["output_ids"], cold["logprobs"])
        distances.append({"prompt_tokens": len(prompt), "max_delta": delta, "greedy_shortfall": shortfall})
    checks.note("reference", {"tolerance": tol, "answers": distances})
    worst = max(d["max_delta"] for d in distances)
    short = max(d["greedy_shortfall"] for d in distances)
    checks.expect(worst <= tol and short <= tol,
                  f"cold answers vs the fp32 reference: max |Δ logprob| {worst:.3g}, greedy shortfall {short:.3g} "
                  f"<= {tol:g} ({'bf16' if ctx.cuda else 'fp32'} server)")


def check_premise(checks: Checks, server: ServerProcess, cuda: bool) -> None:
    """cut=kept: the launcher checked the rule's premise on this device and it held (its start-up
    line); on CUDA that is ``patches.kernel_selftest`` run inside the launcher, which would have
    refused to start (exit 2) had a kernel failed."""
    found = PREMISE_LINE.search(server.log_text())
    device = "CUDA" if cuda else "CPU"
    checks.expect(bool(found) and found.group(1) == device,
                  f"the launcher checked the kept rule's premise on {device} and it held: "
                  + (f"{found.group(2)}" if found else "no start-up line"))


def run_setup(ctx, name: str):
    """The step ``exact-<name>`` (a key of ``SETUPS``) on its own server."""
    setup = SETUPS[name]
    checks = Checks()
    events_path = ctx.out / f"exact-{name}-events.jsonl"
    args = ["--cache-policy", "exact", "--serving-profile", PROFILE, "--cache-events", str(events_path),
            "--cache-policy-set", f"piece_tokens={setup.piece_tokens}",
            "--cache-policy-set", f"retain_every={setup.retain_every}", "--cache-policy-set", f"cut={setup.cut}",
            "--decode-log-interval", "1"]
    if setup.kept:
        args += ["--cache-policy-set", f"keeps={setup.keeps}"]
    kept: list = []
    cases = cases_for(setup, ctx.quick)
    with servers.serving(ctx, f"exact-{name}", args, total_tokens=32768) as server:
        servers.check_profile(checks, servers.server_info(server), PROFILE, ctx.cuda)
        if setup.kept:
            check_premise(checks, server, ctx.cuda)
        for case in cases:
            check_case(checks, server, case, name, kept)
        if setup.turns and not ctx.quick:
            check_turns(checks, server, name)
        for count in NEIGHBOUR_COUNTS:
            check_neighbours(checks, server, setup, count, kept)
        rows = request_events(events_path)
        off_plan = [row["rid"] for row in rows if row.get("forwards_off_plan")]
        checks.expect(not off_plan and "read [" not in server.log_text(),
                      f"every forward was a planned piece ({len(rows)} events)" + (f"; off plan: {off_plan[:3]}" if off_plan else ""))
        servers.check_clean_log(checks, server)
    check_reference(checks, ctx, kept[-REFERENCE_ANSWERS:])
    identical = sum(1 for ok, message in checks.items if ok and "bit for bit" in message)
    return checks.result(f"exact-{name}", f"{identical} warm = cold comparisons bit for bit "
                                          f"({len(cases)} case{'s' * (len(cases) != 1)}, neighbours "
                                          f"{', '.join(map(str, NEIGHBOUR_COUNTS))})")


def run_64(ctx):
    return run_setup(ctx, "64")


def run_832(ctx):
    return run_setup(ctx, "832")


def run_kept(ctx):
    return run_setup(ctx, "kept")
