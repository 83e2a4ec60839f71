"""``python -m eval.bench_cuts``: what exact's cut rule and the rendering change, offline, on a trace.

Exact's reuse is a function of the token sequences alone: ``exact_cache.replay`` predicts the
server's reused length for every call (100 % of the 280 calls of the served benchmark, and every
engine test). So its arms can be measured on a whole trace without a server: the grid rule
(B = 832, R = 6,656), ``cut=messages`` at several ``min_piece`` and ``cut=kept`` (B = the serving
chunk, 8,192 by default, the one radix's forwards are counted in, chunk ends counted from each
read's start; with and without keep points at message ends, both ending a forward at every keep
point, ``keeps=ends``; and ``keeps=inside``, where the engine keeps each state inside a forward
and forwards end only at chunk ends and the prompt end; the forwards by what ended them,
``forward_ends``), each under the default and the
stable (``preserve``) rendering of the same questions, beside radix's offline estimate
(``eval.traces.synth.radix_prefix_estimate``, 512-token chunks: 71.9 % offline and served on the
default set). This module studies exact's variants (cut rules, state budgets); the three policies
side by side, scr included, offline, with a GPU time estimate, are ``python -m eval.offline``.

Per arm: prefix / read shares, PFLOPs per question (2·N_body·(read + decode), Qwen3.6-27B), the
forwards per question, the piece-length distribution, and a GPU estimate of what smaller pieces
cost: each forward charged a fixed overhead of ``o`` token-equivalents, fitted to the exact
cache's measured cold-read penalty for 832-token pieces (+16 % at 30 K tokens gives o ≈ 150, +27 %
at 120 K gives o ≈ 250, against SGLang's 8,192-token chunks). It is an estimate from two
published points, not a measurement. Memory: the recurrent states the run keeps (no eviction)
times a Qwen3.6-27B state (153,944,064 bytes, 48 GDN layers at TP1), and the curve of PFLOPs per
question against a state budget (``ReplayTree``'s LRU model of SGLang's state pool; the budget is
per cache namespace, and synthesized traces have one).

The lower bound printed beside exact: no policy that reuses only prompt prefixes can skip the
tokens new to a conversation (the part of each prompt that is not a prefix of the previous prompt
+ completion: ``docs/eval.md`` read floor) nor, for exact, the previous completion, which exact
never keeps (``exact_cache/README.md``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import Counter
from pathlib import Path

from eval.accounting.flops import QWEN36_27B, n_body, prefix_reuse_pflops
from eval.offline import gpu_time
from eval.traces.format import read_trace, trace_render
from exact_cache.config import ExactConfig
from exact_cache.replay import ReplayTree
from exact_cache.rules import GRID, KeepKind
from policy.tokens import common_prefix_len

BODY_PARAMS = n_body(QWEN36_27B)  # 24,353,201,664 (eval/accounting/flops.py)
PIECE, RETAIN = ExactConfig().piece_tokens, ExactConfig().retain_every  # exact's defaults: 832, 6,656
STATE_BYTES = 153_944_064  # one Qwen3.6-27B recurrent state at TP1 (docs/exact.md §5.7)
SCR_SIDE_BYTES = 12 * 30_000 * 64 * 1024  # the authors' side buffer: 12 slots x 30,000 rows x 64 KiB
OVERHEAD_TOKENS = (150, 250)  # per-forward cost in token-equivalents, fitted (module docstring)
RADIX_CHUNK = 512
GPU_CHUNK = gpu_time.GPU_CHUNK  # the baseline of the overhead fit
KEPT_PIECE = GPU_CHUNK  # cut=kept on a GPU: B = the serving chunk, the one radix reads in (--kept-piece)


def qwen_message_end() -> int:
    """``<|im_end|>`` in Qwen3.6's tokenizer (built offline, ``eval/qwen_tokenizer.py``)."""
    from eval.traces.synth import load_tokenizer

    return load_tokenizer("qwen").convert_tokens_to_ids("<|im_end|>")


def replay_arm(calls, *, piece: int, retain_every: int, message_end: int | None = None, min_piece: int = 1,
               max_snapshots: int = 0, kept: bool = False, inside: bool = False) -> dict:
    """Serve ``calls`` in order through one replay tree per cache namespace; per call the reused
    length, the pieces (forwards) read and the keep points (position -> ``KeepKind``), and the
    states kept. ``kept``: the ``cut=kept`` rule (``piece`` is then the serving chunk B); ``inside``:
    with ``keeps=inside`` (the same states, fewer forwards)."""
    trees: dict = {}
    reused, pieces, keeps = [], [], []
    for call in calls:
        tree = trees.get(call.cache_salt)
        if tree is None:
            tree = trees[call.cache_salt] = ReplayTree(piece, retain_every, message_end=message_end,
                                                       min_piece=min_piece, max_snapshots=max_snapshots, kept=kept,
                                                       inside=inside)
        resume, keep = tree.serve(call.prompt_ids)
        reused.append(resume)
        pieces.append(tree.pieces[-1])
        keeps.append(keep)
    held = sum(len(t.snapshots) for t in trees.values())
    return {"reused": reused, "pieces": pieces, "keeps": keeps, "states_held": held,
            "evicted": sum(t.evicted for t in trees.values())}


def forward_ends(pieces, keeps, piece: int) -> dict[str, int]:
    """What ended each forward of a ``cut=kept`` run (``replay_arm``'s ``pieces`` and ``keeps``):
    ``prompt`` (a read's last forward, which every call runs, radix too), ``chunk`` (``start + jB``
    from the read's start, where any chunked prefill ends a forward), else the kind of the keep
    point it ended at (``prompt_end``: the prompt end floored to the 64-token grid, ``message``,
    ``junction``, ``periodic``): the forwards a keep point adds. A keep point on a chunk end counts
    as ``chunk`` (it adds nothing); under ``keeps=inside`` every forward is ``prompt`` or ``chunk``."""
    counts: Counter[str] = Counter()
    for call_pieces, keep in zip(pieces, keeps):
        counts["prompt"] += 1
        start = call_pieces[0][0]
        for _, end in call_pieces[:-1]:
            counts["chunk" if (end - start) % piece == 0 else KeepKind(keep[end]).value] += 1
    return dict(counts)


def kept_inside(pieces, keeps) -> int:
    """Keep points that fall strictly inside a forward (``a < k < b``): the states the engine must
    keep mid-forward (none under ``keeps=ends``, where every keep point ends one)."""
    return sum(1 for call_pieces, keep in zip(pieces, keeps) for a, b in call_pieces for k in keep if a < k < b)


def floors(calls) -> tuple[int, int]:
    """Tokens no prefix policy can skip (new to the conversation: past the longest prefix shared
    with any earlier prompt + completion of it, so a rollback to an older call counts as shared)
    and, of the shared ones, those that came from a completion (exact re-reads them: it keeps
    nothing made while decoding)."""
    earlier: dict[str, list[tuple[list, list]]] = {}
    new = completions = 0
    for call in calls:
        best, from_completion = 0, 0
        for prompt, completion in earlier.get(call.conversation, []):
            shared = common_prefix_len(call.prompt_ids, list(prompt) + list(completion))
            if shared > best:
                best, from_completion = shared, max(0, shared - len(prompt))
        new += len(call.prompt_ids) - best
        completions += from_completion
        earlier.setdefault(call.conversation, []).append((call.prompt_ids, call.completion_ids))
    return new, completions


def summary(calls, reused: list[int], pieces: list | None, questions: int, forwards: int | None = None) -> dict:
    """Shares and PFLOPs per question; with ``pieces`` (or a forward count) the forwards, the piece
    lengths and the GPU estimate."""
    prompt = sum(len(c.prompt_ids) for c in calls)
    decode = sum(len(c.completion_ids) for c in calls)
    read = prompt - sum(reused)
    row = {"prefix": sum(reused) / prompt, "read": read / prompt,
           "pflops_per_question": prefix_reuse_pflops(read, decode, BODY_PARAMS) / questions}
    if pieces is not None:
        lengths = [b - a for call_pieces in pieces for a, b in call_pieces]
        forwards = len(lengths)
        quartiles = statistics.quantiles(lengths, n=4) if len(lengths) > 1 else [lengths[0]] * 3
        row["piece_p25_median_p75"] = [round(q) for q in quartiles]
        row["pieces_under_128"] = sum(n < 128 for n in lengths) / forwards
    if forwards is not None:
        row["forwards_per_question"] = forwards / questions
        row["gpu_estimate_pflops_per_question"] = [
            prefix_reuse_pflops(read + o * forwards, decode, BODY_PARAMS) / questions for o in OVERHEAD_TOKENS]
    return row


def measure(trace: Path, min_pieces: list[int], budgets: list[int], kept_piece: int = KEPT_PIECE) -> dict:
    calls = read_trace(trace)
    questions = len({c.conversation for c in calls})
    end = qwen_message_end()
    arms = {"radix (offline, 512)": radix_row(calls, questions)}
    grid = replay_arm(calls, piece=PIECE, retain_every=RETAIN)
    arms["exact"] = {**summary(calls, grid["reused"], grid["pieces"], questions),
                     "states_held": grid["states_held"]}
    for min_piece in min_pieces:
        run = replay_arm(calls, piece=PIECE, retain_every=RETAIN, message_end=end, min_piece=min_piece)
        arms[f"exact cut=messages min_piece={min_piece}"] = {
            **summary(calls, run["reused"], run["pieces"], questions), "states_held": run["states_held"]}
    arms.update(kept_arms(calls, questions, end, kept_piece))
    curve = {}
    for budget in budgets:
        run = replay_arm(calls, piece=PIECE, retain_every=RETAIN, message_end=end, min_piece=min_pieces[0],
                         max_snapshots=budget)
        curve[budget] = summary(calls, run["reused"], None, questions)["pflops_per_question"]
    return {"trace": str(trace), "render": trace_render(calls), "calls": len(calls), "questions": questions,
            "prompt_tokens": sum(len(c.prompt_ids) for c in calls), "arms": arms,
            "budget_curve": {"min_piece": min_pieces[0], "pflops": curve}, "kept_piece": kept_piece,
            **floor_row(calls, questions)}


def radix_row(calls, questions: int) -> dict:
    """Radix's offline reuse; its forwards as a GPU reads them, SGLang's default 8,192-token chunks."""
    radix = radix_reuse(calls)
    radix_forwards = len(gpu_time.forwards([(r, len(c.prompt_ids)) for c, r in zip(calls, radix)], GPU_CHUNK))
    return summary(calls, radix, None, questions, forwards=radix_forwards)


KEPT_VARIANTS = (("", True, False), (", no message keeps", False, False), (" keeps=inside", True, True))


def kept_arms(calls, questions: int, end: int | None, piece: int) -> dict[str, dict]:
    """``cut=kept`` (B = ``piece``, R = 6,656): keep points at message ends (the server's default,
    ``message_end`` set) and without (``message_end=""``), each keep point ending a forward
    (``keeps=ends``); and with message keep points kept inside forwards (``keeps=inside``: the same
    states and reuse, forwards ending at chunk ends and prompt ends only). Each with its forwards
    by what ended them (``forward_ends``) and the states kept inside a forward (``kept_inside``),
    per question."""
    arms = {}
    for label, messages, inside in KEPT_VARIANTS:
        run = replay_arm(calls, piece=piece, retain_every=RETAIN, message_end=end if messages else None, kept=True,
                         inside=inside)
        ends = forward_ends(run["pieces"], run["keeps"], piece)
        arms[f"exact cut=kept B={piece}{label}"] = {
            **summary(calls, run["reused"], run["pieces"], questions), "states_held": run["states_held"],
            "forward_ends_per_question": {kind: n / questions for kind, n in ends.items()},
            "kept_inside_per_question": kept_inside(run["pieces"], run["keeps"]) / questions}
    return arms


def floor_row(calls, questions: int) -> dict:
    """The read floors (``floors``) as PFLOPs per question and shares of the prompt tokens."""
    new, completions = floors(calls)
    prompt = sum(len(c.prompt_ids) for c in calls)
    decode = sum(len(c.completion_ids) for c in calls)
    return {"floor_pflops_per_question": prefix_reuse_pflops(new, decode, BODY_PARAMS) / questions,
            "exact_floor_pflops_per_question": prefix_reuse_pflops(new + completions, decode, BODY_PARAMS) / questions,
            "floor_read_share": new / prompt, "completion_share": completions / prompt}


def radix_reuse(calls) -> list[int]:
    from eval.traces.synth import radix_prefix_estimate

    return radix_prefix_estimate(calls, chunk=RADIX_CHUNK)


def format_report(results: list[dict]) -> str:
    lines = ["Exact's cut rule and the rendering, offline (exact_cache.replay; Qwen3.6-27B geometry; the "
             "GPU column is an estimate)", ""]
    for result in results:
        lines += arm_table(result) + floor_lines(result) + forward_end_table(result) + budget_table(result)
    return "\n".join(lines)


def arm_table(result: dict) -> list[str]:
    """The arms' table: shares, PFLOPs and their ratio, forwards, pieces, the GPU estimate, states."""
    radix = result["arms"]["radix (offline, 512)"]["pflops_per_question"]
    lines = [f"## {result['render']} rendering: {result['trace']} ({result['calls']} calls, "
             f"{result['questions']} questions, {result['prompt_tokens']:,} prompt tokens)", "",
             "| arm | prefix / read | PFLOPs per question | ratio to radix | forwards per question | "
             f"piece tokens p25 / median / p75 | pieces < 128 | GPU estimate (o = {OVERHEAD_TOKENS[0]} / "
             f"{OVERHEAD_TOKENS[1]}) | states held (GiB) |",
             "|---|---|---:|---:|---:|---|---:|---|---:|"]
    for name, row in result["arms"].items():
        pf = row["pflops_per_question"]
        forwards = f"{row['forwards_per_question']:.0f}" if "forwards_per_question" in row else ""
        spread = " / ".join(map(str, row["piece_p25_median_p75"])) if "piece_p25_median_p75" in row else ""
        under = f"{row['pieces_under_128']:.0%}" if "pieces_under_128" in row else ""
        gpu = " / ".join(f"{x:.2f}" for x in row["gpu_estimate_pflops_per_question"]) \
            if "gpu_estimate_pflops_per_question" in row else ""
        held = f"{row['states_held']} ({row['states_held'] * STATE_BYTES / 2**30:.0f})" if "states_held" in row else ""
        lines.append(f"| {name} | {row['prefix']:.1%} / {row['read']:.1%} | {pf:.2f} | {pf / radix:.3f} | "
                     f"{forwards} | {spread} | {under} | {gpu} | {held} |")
    return lines


def floor_lines(result: dict) -> list[str]:
    return ["", f"Floor (tokens new to each conversation, no prefix policy reads less): "
                f"{result['floor_pflops_per_question']:.2f} PFLOPs per question "
                f"({result['floor_read_share']:.1%} of prompt tokens); exact's floor adds the previous "
                f"completion it never keeps ({result['completion_share']:.1%}): "
                f"{result['exact_floor_pflops_per_question']:.2f}."]


END_COLUMNS = (("prompt", "the read's last"), ("chunk", "chunk ends"), ("prompt_end", "prompt end (floored)"),
               ("message", "message ends"), ("junction", "junctions"), ("periodic", "every R"))


def forward_end_table(result: dict) -> list[str]:
    """The kept arms' forwards per question by what ended them (``forward_ends``), beside radix's,
    and the states each kept inside a forward (``kept_inside``: ``keeps=inside``'s keep points)."""
    radix = result["arms"]["radix (offline, 512)"]["forwards_per_question"]
    kept = {name: row for name, row in result["arms"].items() if "forward_ends_per_question" in row}
    if not kept:
        return []
    lines = ["", f"Forwards of cut=kept per question by what ended them (radix: {radix:.1f} at {GPU_CHUNK:,}, "
                 "chunks from each read's start, as cut=kept's; under keeps=ends a keep point not on a chunk end "
                 "adds one, under keeps=inside none):", "",
             "| arm | forwards | ratio to radix | " + " | ".join(label for _, label in END_COLUMNS)
             + " | states kept inside a forward |",
             "|---|---:|---:|" + "---:|" * (len(END_COLUMNS) + 1)]
    for name, row in kept.items():
        ends = row["forward_ends_per_question"]
        cells = " | ".join(f"{ends.get(kind, 0):.1f}" for kind, _ in END_COLUMNS)
        lines.append(f"| {name} | {row['forwards_per_question']:.1f} | "
                     f"{row['forwards_per_question'] / radix:.2f} | {cells} | "
                     f"{row.get('kept_inside_per_question', 0):.1f} |")
    return lines


def budget_table(result: dict) -> list[str]:
    min_piece = result["budget_curve"]["min_piece"]
    lines = ["", f"State budget (cut=messages, min_piece={min_piece}; GiB of Qwen3.6-27B states -> PFLOPs per "
                 f"question; scr's side buffer is {SCR_SIDE_BYTES / 2**30:.0f} GiB):",
             "", "| states | GiB | PFLOPs per question |", "|---:|---:|---:|"]
    held = result["arms"][f"exact cut=messages min_piece={min_piece}"]["states_held"]
    for budget, pf in result["budget_curve"]["pflops"].items():
        states = int(budget) or held
        lines.append(f"| {states}{'' if int(budget) else ' (all, no eviction)'} | "
                     f"{states * STATE_BYTES / 2**30:.0f} | {pf:.2f} |")
    return lines + [""]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m eval.bench_cuts", description=__doc__.split("\n\n")[0])
    parser.add_argument("--trace", type=Path, action="append", required=True,
                        help="a trace in Qwen3.6 token ids (repeat: one per rendering)")
    parser.add_argument("--min-piece", type=int, action="append", default=None,
                        help="cut=messages arms (repeatable; default 64 and 256)")
    parser.add_argument("--budget", type=int, action="append", default=None,
                        help="state budgets for the curve (repeatable; default 24, 48, 96, 144, 288, 0 = none)")
    parser.add_argument("--kept-piece", type=int, default=KEPT_PIECE,
                        help="cut=kept's B, the serving chunk (a multiple of 64; default 8192, radix's GPU chunk)")
    parser.add_argument("--out", type=Path, default=None, help="write REPORT.md and cuts.json here")
    args = parser.parse_args(argv)
    if args.kept_piece <= 0 or args.kept_piece % GRID:
        parser.error(f"--kept-piece {args.kept_piece}: must be a positive multiple of {GRID}")
    min_pieces = args.min_piece or [64, 256]
    budgets = args.budget or [24, 48, 96, 144, 288, 0]
    results = []
    for trace in args.trace:
        print(f"replaying {trace} ...", file=sys.stderr, flush=True)
        results.append(measure(trace, min_pieces, budgets, args.kept_piece))
    text = format_report(results)
    print(text)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "REPORT.md").write_text(text)
        (args.out / "cuts.json").write_text(json.dumps(results, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
