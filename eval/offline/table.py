"""The offline table: per arm, shares, PFLOPs, forwards and the GPU time estimate, for one trace.

Shares are of the trace's prompt tokens (prefix = reused from the tree, moved = relocated by scr,
read = run through the model). PFLOPs use Qwen3.6-27B's geometry (2·N_body·(read + decode),
``eval/accounting/flops.py``), per question (conversation), with their ratio to radix. The time
columns are ``gpu_time``'s estimate: every call's read spans cut into forwards (radix and scr at the
GPU chunk, ``--gpu-chunk``; exact's 832-token pieces stay pieces, and so do ``cut=kept``'s forwards,
which end at multiples of the GPU chunk from each read's start and, unless ``keeps=inside``, at keep
points), charged with the fitted curve;
decoding at the published rate; the read share is read / (read + write). For scr arms, how content
matching grouped the calls (``eval.accounting.causes.session_use``).
"""

from __future__ import annotations

from eval.accounting.causes import session_use
from eval.accounting.flops import QWEN36_27B, n_body, prefix_reuse_pflops
from eval.offline import gpu_time
from eval.offline.scr_arm import RUN

BODY_PARAMS = n_body(QWEN36_27B)
GPU_CHUNK = gpu_time.GPU_CHUNK


def arm_row(calls, costs, curve, gpu_chunk: int = GPU_CHUNK, decode_rate: float = gpu_time.DECODE_RATE) -> dict:
    """One arm's column (``costs`` in the order of ``calls``)."""
    questions = len({c.conversation for c in calls})
    prompt = sum(len(c.prompt_ids) for c in calls)
    decode = sum(len(c.completion_ids) for c in calls)
    prefix, moved, read = (sum(x.prefix for x in costs), sum(x.moved for x in costs), sum(x.read for x in costs))
    if prefix + moved + read != prompt:
        raise AssertionError(f"prefix {prefix} + moved {moved} + read {read} != prompt {prompt}")
    passes = [gpu_time.forwards(x.spans, gpu_chunk) for x in costs]
    read_s = sum(curve.seconds(p) for p in passes) / questions
    write_s = gpu_time.decode_seconds(decode, decode_rate) / questions
    return {"prefix": prefix / prompt, "moved": moved / prompt, "read": read / prompt,
            "pflops_per_question": prefix_reuse_pflops(read, decode, BODY_PARAMS) / questions,
            "forwards_per_question": sum(len(p) for p in passes) / questions,
            "read_s_per_question": read_s, "write_s_per_question": write_s,
            "read_time_share": read_s / (read_s + write_s) if read_s + write_s else 0.0}


def sessions(calls, costs) -> dict:
    """scr's sessions: how many, merged across conversations, calls that missed their own."""
    by_rid = {c.rid(RUN): {"read": x.read} for c, x in zip(calls, costs)}
    sids = {c.rid(RUN): x.session for c, x in zip(calls, costs) if x.session is not None}
    return session_use(calls, sids, by_rid, RUN)


def with_ratios(arms: dict[str, dict], baseline: str = "radix") -> dict[str, dict]:
    base = arms.get(baseline, {}).get("pflops_per_question")
    for row in arms.values():
        row["ratio"] = row["pflops_per_question"] / base if base else float("nan")
    return arms


LINES = (
    ("prefix / moved / read", lambda r: f"{r['prefix']:.1%} / {r['moved']:.1%} / {r['read']:.1%}"),
    ("PFLOPs per question (ratio to radix)", lambda r: f"{r['pflops_per_question']:.2f} ({r['ratio']:.3f})"),
    ("forwards per question (GPU)", lambda r: f"{r['forwards_per_question']:.0f}"),
    ("est. GPU s per question: read + write", lambda r: f"{r['read_s_per_question']:.1f} + {r['write_s_per_question']:.1f}"),
    ("est. read share of GPU time", lambda r: f"{r['read_time_share']:.1%}"),
    ("scr sessions (merged) / calls that missed their own (read points)",
     lambda r: (f"{r['sessions']['sessions']} ({r['sessions']['merged']}) / {r['sessions']['split_calls']} "
                f"({r['sessions']['split_read_points']:.1f})") if "sessions" in r else ""),
)


def format_result(result: dict) -> str:
    """One trace's markdown table, arms as columns (as the README's tables)."""
    names = list(result["arms"])
    head = (f"## {result['trace']}: {result['render']} rendering, {result['questions']} questions, {result['calls']} "
            f"calls, {result['prompt_tokens']:,} prompt tokens (arrival order: {result['concurrency']} in flight)")
    lines = [head, "", "| | " + " | ".join(names) + " |", "|---|" + "---:|" * len(names)]
    for label, cell in LINES:
        cells = [cell(result["arms"][n]) for n in names]
        if any(cells):
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
    lines += ["", f"Prefix floor: {result['floor_read_share']:.1%} of the prompt tokens lie past the longest prefix "
                  "their call shares with an earlier prompt + completion of its conversation "
                  f"({result['floor_pflops_per_question']:.2f} PFLOPs per question): radix and exact cannot read less, "
                  "scr can by moving rows.", ""]
    return "\n".join(lines)


NOTE = ("GPU seconds are an estimate, not a measurement: prefill from a curve fitted to published cold reads "
        "(eval/offline/gpu_time.py: " + gpu_time.SOURCE + "), radix and scr read in {chunk}-token chunks, exact in "
        "its 832-token pieces, exact kept in forwards ending at multiples of {chunk} from the read's start and at its "
        "keep points, exact kept inside at those multiples only (its keep points inside forwards), "
        "relocation free, per-request overhead left out; decoding at {rate:.1f} tokens/s.")
