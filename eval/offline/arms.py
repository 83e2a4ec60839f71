"""The arms of the offline table, each a list of per-call costs (``scr_arm.CallCost``) in arrival order.

* ``radix``: SGLang's hybrid radix cache, ``eval.traces.tree_model`` at the served 512-token chunks;
* ``exact`` and ``exact messages``: ``exact_cache.replay`` (the prediction every served exact call
  equals), the 832-token grid and ``cut=messages`` (min_piece 64, the server's default), one tree
  per cache namespace; a call reads its pieces;
* ``scr`` and ``scr rid``: ``scr_arm`` with the authors' defaults (content matching) and with a
  session per conversation (``session_identity=rid``).

More arms come from ``--arm NAME=POLICY[:KEY=VALUE,...]`` (``from_option``): an exact arm's
``piece_tokens``, ``retain_every``, ``cut`` and ``min_piece``, any scr setting (``scr.settings``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from eval.offline.scr_arm import CHUNK, CallCost, scr_costs
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
                ArmSpec("scr", "scr"), ArmSpec("scr rid", "scr", {"session_identity": "rid"}))


def radix_costs(calls, chunk: int = CHUNK) -> list[CallCost]:
    from eval.traces.tree_model import radix_prefix_estimate

    return [CallCost(r, 0, [(r, len(c.prompt_ids))]) for c, r in zip(calls, radix_prefix_estimate(calls, chunk))]


def exact_costs(calls, message_end: int | None = None, min_piece: int = 1,
                piece: int = PIECE, retain: int = RETAIN) -> list[CallCost]:
    from eval.bench_cuts import replay_arm

    run = replay_arm(calls, piece=piece, retain_every=retain, message_end=message_end, min_piece=min_piece)
    return [CallCost(r, 0, [tuple(p) for p in pieces]) for r, pieces in zip(run["reused"], run["pieces"])]


def from_option(text: str) -> ArmSpec:
    """``--arm NAME=POLICY[:KEY=VALUE,...]`` (``eval.arms``' spelling, its checks) as an offline arm."""
    from eval.arms import parse_arm

    arm = parse_arm(text)
    if arm.policy not in ("radix", "exact", "scr"):
        raise ValueError(f"--arm {text!r}: no offline model of policy {arm.policy!r}")
    return ArmSpec(arm.name, arm.policy, dict(arm.settings))


def costs(spec: ArmSpec, calls, message_end: int | None) -> list[CallCost]:
    """One arm's costs; ``message_end``: the trace tokenizer's ``<|im_end|>`` (for ``cut=messages``)."""
    if spec.policy == "radix":
        return radix_costs(calls)
    if spec.policy == "exact":
        settings = spec.settings
        sizes = dict(piece=int(settings.get("piece_tokens", PIECE)), retain=int(settings.get("retain_every", RETAIN)))
        if settings.get("cut") == "messages":
            return exact_costs(calls, message_end, int(settings.get("min_piece", MIN_PIECE)), **sizes)
        return exact_costs(calls, **sizes)
    if spec.policy == "scr":
        return scr_costs(calls, merge(ScrConfig(), spec.settings))
    raise ValueError(f"no offline model of policy {spec.policy!r}")
