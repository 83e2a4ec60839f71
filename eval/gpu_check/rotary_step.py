"""The rotary step: the production rotary's facts, then each SGLang rotary kernel of the device
against SCR's re-rotation (``rotary.compare``; SGLang's kernels on CUDA, its torch path on CPU)."""

from __future__ import annotations

from eval.gpu_check.report import Checks


def run(ctx):
    checks = Checks()
    run_checks(checks, ctx.device, ctx.quick)
    compared = checks.data.get("comparisons", [])
    worst = max((c["moved_vs_fresh_units"] for c in compared if "bf16" in c["name"]), default=float("nan"))
    reach = checks.data.get("bounds", {}).get("max_position", 0)
    return checks.result("rotary", f"{len(compared)} kernels to {reach:,}: moved = fresh within "
                                   f"{worst:.1f} bf16 roundings at worst (bound per kernel in the JSON)")


def run_checks(checks: Checks, device: str, quick: bool, geometry=None) -> None:
    """The production rotary's facts, then every rotator of ``device`` compared. (Imported here:
    torch and SGLang load when the step runs, not with the command line.)"""
    from eval.gpu_check.rotary import (MAX_POSITION, QWEN36, REROTATION_ARITH, TABLE_ANGLE_REL, TABLE_ENTRY_ABS, U16,
                                       U32, compare, moves, scattered)
    from eval.gpu_check.rotary_kernels import sglang_rotators

    geometry = geometry or QWEN36
    rotators, facts = sglang_rotators(geometry, device)
    checks.note("production_rotary", facts)
    checks.expect(facts["class"] == "MRotaryEmbedding" and facts["mrope_section"] == list(geometry.mrope_section)
                  and facts["mrope_interleaved"] == geometry.mrope_interleaved,
                  f"SGLang builds Qwen3.6's rotary as interleaved MRoPE {list(geometry.mrope_section)}: "
                  f"{facts['class']} {facts['mrope_section']} interleaved={facts['mrope_interleaved']}")
    checks.expect(facts["rotary_dim"] == geometry.rotary_dim and facts["table_shape"] ==
                  [geometry.max_position_embeddings, geometry.rotary_dim],
                  f"rotary_dim {facts['rotary_dim']} and table {facts['table_shape']} match the geometry")
    if device == "cuda":  # on CPU SGLang builds a bf16 model's table in bf16 (not what a GPU serves)
        checks.expect(facts["table_dtype"] == "float32", f"the model's cos/sin table is fp32 ({facts['table_dtype']})")
    checks.expect(facts["scr_gate_problem"] is None,
                  f"SCR's start-up check accepts the table for a 131,072 context: {facts['scr_gate_problem'] or 'yes'}")
    blocks = moves(quick)
    single = scattered(128 if quick else 512)
    results = []
    for rotator in rotators:
        result = compare(rotator, blocks, single)
        results.append(result)
        checks.expect(result.ok, result.summary())
    checks.note("comparisons", [vars(r) for r in results])
    checks.note("bounds", {"u_bf16": U16, "u_fp32": U32, "table_angle_rel": TABLE_ANGLE_REL,
                           "table_entry_abs": TABLE_ENTRY_ABS, "rerotation_arith": REROTATION_ARITH,
                           "max_position": MAX_POSITION, "moves": [vars(m) for m in blocks],
                           "single_rows": len(single[0])})
