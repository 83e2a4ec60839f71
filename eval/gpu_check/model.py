"""The tiny model in bf16 on the device: the checkpoint is bf16, and plain torch runs it there.

``eval/tiny_model.py`` always saves the weights in bf16 (like the real Qwen3.6 checkpoint), so the
step reads the safetensors header and ``config.json`` rather than building a variant. It then runs
the model with transformers in bf16 on the device and compares the next-token logprobs with the
fp32 reference on CPU: this measures, on the GPU at hand, the bf16 distance that
``reference.BF16_TOL`` allows the served answers (and shows torch's bf16 path works there before
any server starts).
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

from eval.gpu_check.exact_cases import prompt_ids
from eval.gpu_check.reference import BF16_TOL, Reference, bf16_distance
from eval.gpu_check.report import Checks

PROMPTS = ((151, 300), (170, 1700))  # (seed, length): a neighbour prompt and the piece-832 base


def safetensors_dtypes(path: Path) -> dict[str, int]:
    """dtype -> number of tensors, from the file's JSON header (no tensor is read)."""
    with open(path, "rb") as handle:
        size = struct.unpack("<Q", handle.read(8))[0]
        header = json.loads(handle.read(size))
    counts: dict[str, int] = {}
    for name, entry in header.items():
        if name != "__metadata__":
            counts[entry["dtype"]] = counts.get(entry["dtype"], 0) + 1
    return counts


def run(ctx):
    checks = Checks()
    path = ctx.model_dir()
    config = json.loads((path / "config.json").read_text())
    counts = safetensors_dtypes(path / "model.safetensors")
    checks.note("tensor_dtypes", counts)
    checks.expect(set(counts) == {"BF16"}, f"every checkpoint tensor is bf16 ({counts})")
    declared = config.get("dtype") or config.get("torch_dtype")
    checks.expect(declared == "bfloat16", f"config.json declares bfloat16 ({declared})")
    prompts = [prompt_ids(seed, length) for seed, length in PROMPTS]
    distance = bf16_distance(Reference(path), "cuda" if ctx.cuda else "cpu", prompts)
    checks.note("bf16_vs_fp32", distance)
    if checks.expect(distance["finite"], "bf16 logits are finite"):
        checks.expect(distance["max"] <= BF16_TOL,
                      f"bf16 on {ctx.device} vs fp32: max |Δ logprob| {distance['max']:.3f} <= {BF16_TOL} "
                      f"(mean {distance['mean']:.3f}, argmax agrees {100 * distance['argmax_agree']:.1f}%)")
    summary = (f"{path.name}: bf16 weights; bf16 on {ctx.device} vs fp32 max |Δ logprob| "
               f"{distance.get('max', float('nan')):.3f}, mean {distance.get('mean', float('nan')):.3f}")
    return checks.result("model", summary)
