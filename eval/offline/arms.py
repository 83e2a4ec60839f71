"""The arms of the offline table, each a list of per-call costs (``scr_arm.CallCost``) in arrival order.

* ``radix``: SGLang's hybrid radix cache, ``eval.traces.tree_model`` at the served 512-token chunks;
* ``exact`` and ``exact messages``: ``exact_cache.replay`` (the prediction every served exact call
  equals), the 832-token grid and ``cut=messages`` (min_piece 64, the server's default), one tree
  per cache namespace; a call reads its pieces;
* ``exact kept``: ``cut=kept`` (``docs/exact.md`` §5.13) with B = the GPU chunk (``--gpu-chunk``,
  8,192: exact sets SGLang's chunked prefill to B, so it reads in radix's chunks) and keep points
  at message ends; its forwards end at multiples of B from each read's start and at its keep points;
* ``exact kept inside``: the same with ``keeps=inside`` (the same states and reuse; the engine keeps
  each state inside a forward, so forwards end only at the chunk ends and the prompt end);
* ``scr`` and ``scr rid``: ``scr_arm`` with the authors' defaults (content matching) and with a
  session per conversation (``session_identity=rid``).

More arms come from ``--arm NAME=POLICY[:KEY=VALUE,...]`` (``from_option``): an exact arm's
``piece_tokens``, ``retain_every``, ``cut``, ``min_piece`` and ``keeps``, any scr setting (``scr.settings``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from eval.offline.scr_arm import CHUNK, CallCost, scr_costs
from eval.offline.table import GPU_CHUNK
from exact_cache.config import ExactConfig
from scr.settings import ScrConfig, merge

PIECE, RETAIN, MIN_PIECE = ExactConfig().piece_tokens, ExactConfig().retain_every, ExactConfig().min_piece


@dataclass(frozen=True)
class ArmSpec:
    name: str
    policy: str
    settings: dict = field(default_factory=dict)


DEFAULT_ARMS = (ArmSpec("radix", "radix"), ArmSpec("exact", "exact"),
                ArmSpec("exact messages", "exact", {"cut": "messages"}),
                ArmSpec("exact kept", "exact", {"cut": "kept"}),
                ArmSpec("exact kept inside", "exact", {"cut": "kept", "keeps": "inside"}),
                ArmSpec("scr", "scr"), ArmSpec("scr rid", "scr", {"session_identity": "rid"}))


def radix_costs(calls, chunk: int = CHUNK) -> list[CallCost]:
    from eval.traces.tree_model import radix_prefix_estimate

    return [CallCost(r, 0, [(r, len(c.prompt_ids))]) for c, r in zip(calls, radix_prefix_estimate(calls, chunk))]


def exact_costs(calls, message_end: int | None = None, min_piece: int = 1,
                piece: int = PIECE, retain: int = RETAIN, kept: bool = False, inside: bool = False) -> list[CallCost]:
    from eval.bench_cuts import replay_arm

    run = replay_arm(calls, piece=piece, retain_every=retain, message_end=message_end, min_piece=min_piece, kept=kept,
                     inside=inside)
    return [CallCost(r, 0, [tuple(p) for p in pieces]) for r, pieces in zip(run["reused"], run["pieces"])]


def exact_arm_costs(settings: dict, calls, message_end: int | None, gpu_chunk: int) -> list[CallCost]:
    """An exact arm's costs from its settings (``piece_tokens``, ``retain_every``, ``cut``,
    ``min_piece``; under ``cut=kept`` ``message_end=""`` drops the message keep points and
    ``keeps=inside`` keeps states inside forwards)."""
    cut = settings.get("cut", "grid")
    piece = int(settings.get("piece_tokens", gpu_chunk if cut == "kept" else PIECE))
    sizes = dict(piece=piece, retain=int(settings.get("retain_every", RETAIN)))
    if cut == "messages":
        return exact_costs(calls, message_end, int(settings.get("min_piece", MIN_PIECE)), **sizes)
    if cut == "kept":
        return exact_costs(calls, None if settings.get("message_end") == "" else message_end, kept=True,
                           inside=settings.get("keeps", "ends") == "inside", **sizes)
    return exact_costs(calls, **sizes)


def from_option(text: str) -> ArmSpec:
    """``--arm NAME=POLICY[:KEY=VALUE,...]`` (``eval.arms``' spelling, its checks) as an offline arm."""
    from eval.arms import parse_arm

    arm = parse_arm(text)
    if arm.policy not in ("radix", "exact", "scr"):
        raise ValueError(f"--arm {text!r}: no offline model of policy {arm.policy!r}")
    return ArmSpec(arm.name, arm.policy, dict(arm.settings))


def costs(spec: ArmSpec, calls, message_end: int | None, gpu_chunk: int = GPU_CHUNK) -> list[CallCost]:
    """One arm's costs; ``message_end``: the trace tokenizer's ``<|im_end|>`` (for ``cut=messages``
    and ``cut=kept``); ``gpu_chunk``: ``cut=kept``'s B unless the arm sets ``piece_tokens``."""
    if spec.policy == "radix":
        return radix_costs(calls)
    if spec.policy == "exact":
        return exact_arm_costs(spec.settings, calls, message_end, gpu_chunk)
    if spec.policy == "scr":
        return scr_costs(calls, merge(ScrConfig(), spec.settings))
    raise ValueError(f"no offline model of policy {spec.policy!r}")
