"""``ExactPolicy``: the exact cache's rules behind the ``policy.api.CachePolicy`` seam."""

from __future__ import annotations

from typing import ClassVar

from exact_cache.config import ExactConfig
from exact_cache.invariance import invariance_problems
from exact_cache.rules import keep_points, pieces, resume_bound, resume_point
from policy.api import Arrival, Extend, Plan, PolicyDefaults, Release, Snapshot


class ExactPolicy(PolicyDefaults):
    name: ClassVar[str] = "exact"
    config_class: ClassVar[type] = ExactConfig

    def __init__(self, config: ExactConfig):
        self.config = config

    def plan(self, arrival: Arrival) -> Plan:
        """Resume at the deepest snapshot at or below A, then read piece by piece, snapshotting
        after each piece that ends at a keep point."""
        cfg = self.config
        prompt_len = len(arrival.tokens)
        bound = resume_bound(arrival.tree_match, prompt_len, cfg.piece_tokens, cfg.spec_drop)
        resume = resume_point(bound, arrival.tree_states)
        keep = keep_points(prompt_len, resume, bound, cfg.piece_tokens, cfg.retain_every, cfg.spec_drop)
        steps: list = []
        for start, end in pieces(resume, prompt_len, cfg.piece_tokens):
            steps.append(Extend(start, end))
            if end in keep:
                steps.append(Snapshot(end, keep[end].value))
        return Plan(rid=arrival.rid, resume=resume, steps=tuple(steps))

    def server_settings(self) -> dict[str, object]:
        """SGLang settings the rules need (the launcher enforces them; see patches/exact_tree.py)."""
        settings: dict[str, object] = {
            "chunked_prefill_size": self.config.piece_tokens,  # one piece per forward
            "prefill_max_requests": 1,  # exclusive prefill forwards: same batch shape cold and warm
            "enable_mixed_chunk": False,
            "page_size": 1,
            "mamba_radix_cache_strategy": "no_buffer",  # exact copies of the state at forward ends
            "disable_overlap_schedule": True,
            "radix_cache_backend": "exact",
        }
        return settings

    def startup_problems(self, settings, env, on_cuda: bool) -> list[str]:
        """Settings of the resolved server that would break bit-identity or the ranks' agreement check
        (the launcher refuses them)."""
        problems = invariance_problems(settings, env, on_cuda, self.config.piece_tokens)
        if settings.get("enable_dp_attention"):
            problems.append("--enable-dp-attention: the ranks of one TP group would serve different requests, and "
                            "exact checks its ranks per TP group (unsupported; see docs/tensor_parallel.md)")
        return problems

    def snapshot_budget(self) -> int:
        """``max_snapshots``: the snapshot budget in Mamba-pool slots (0: SGLang's pool sizing)."""
        return self.config.max_snapshots

    def release(self, release: Release) -> None:
        return None

    def check(self) -> None:
        return None
