"""``ExactPolicy``: the exact cache's rules behind the ``policy.api.CachePolicy`` seam."""

from __future__ import annotations

import os
from typing import ClassVar

from exact_cache.config import ExactConfig
from exact_cache.invariance import invariance_problems
from exact_cache.rules import bound_in, keep_points_in, keeps_within, resume_point, snapshot_dump_name
from policy.api import (KEEPING_KERNEL, KERNEL_SPLIT_FAILURES, SPLIT_INVARIANCE, Arrival, Plan, PolicyDefaults, Read, Release,
                        Snapshot)


class ExactPolicy(PolicyDefaults):
    name: ClassVar[str] = "exact"
    plans_at: ClassVar[str] = "tree"
    config_class: ClassVar[type] = ExactConfig

    def __init__(self, config: ExactConfig):
        self.config = config
        self.rule = config.cut_rule() if not config.needs_token_lookup else None

    def plan(self, arrival: Arrival) -> Plan:
        """Resume at the deepest snapshot at or below A that is one of this prompt's cuts, then read
        forward by forward (``CutRule.forwards``), each followed by a snapshot at every keep point
        it keeps (``keeps_within``: its end, or with ``keeps=inside`` also the points it crosses)."""
        cfg = self.config
        rule = self.rule or cfg.cut_rule()  # raises while the message token is unresolved
        tokens = arrival.tokens
        prompt_len = len(tokens)
        cut_list = rule.cuts(tokens)
        bound = bound_in(cut_list, arrival.tree_match, prompt_len, cfg.spec_drop)
        resume = resume_point(bound, arrival.tree_states, cut_list)
        keep = keep_points_in(cut_list, prompt_len, resume, bound, cfg.retain_every, cfg.spec_drop,
                              rule.message_ends(tokens, cut_list), cfg.message_keeps)
        steps: list = []
        for start, end in rule.forwards(cut_list, resume, prompt_len, keep):
            steps.append(Read(start, end))
            steps.extend(Snapshot(k, keep[k].value) for k in keeps_within((start, end), keep))
        return Plan(rid=arrival.rid, resume=resume, steps=tuple(steps))

    def tree_keys(self, prompt, ids) -> list[int] | None:
        """The tree's keys for ``ids`` (a prefix of ``prompt``, or longer), or None: the token ids
        (``rules.CutRule.tree_keys``; with cut=messages a key also names its piece end)."""
        rule = self.rule or self.config.cut_rule()
        return rule.tree_keys(prompt, ids)

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
        for kernel, what in (settings.get(KERNEL_SPLIT_FAILURES) or {}).items():
            if kernel == KEEPING_KERNEL:
                if self.config.keeps == "inside":
                    problems.append(
                        f"keeps=inside needs the GDN prefill to keep, inside a forward, the state a forward that "
                        f"ended there leaves (docs/exact.md §5.14), and {kernel} does not here: {what}; serve "
                        "--cache-policy-set keeps=ends instead")
                continue
            problems.append(
                f"cut=kept needs kernels that give a row the same bits wherever its forward is split on the "
                f"64-token grid (docs/exact.md §5.13), and {kernel} does not here: {what}; serve "
                "--cache-policy-set cut=messages instead")
        if settings.get("enable_dp_attention"):
            problems.append("--enable-dp-attention: the ranks of one TP group would serve different requests, and "
                            "exact checks its ranks per TP group (unsupported; see docs/tensor_parallel.md)")
        return problems

    def kernel_premises(self) -> tuple[str, ...]:
        """cut=kept rests on split-invariant kernels; the launcher checks them on the device."""
        return (SPLIT_INVARIANCE,) if self.config.cut == "kept" else ()

    def snapshot_budget(self) -> int:
        """``max_snapshots``: the snapshot budget in Mamba-pool slots (0: SGLang's pool sizing)."""
        return self.config.max_snapshots

    def token_lookups(self) -> dict[str, str]:
        """cut=messages: the id of ``message_end`` in the served tokenizer (never a constant)."""
        return {"message_end_id": self.config.message_end} if self.config.needs_token_lookup else {}

    def snapshot_file(self, rid: str, position: int, tp_rank: int) -> str | None:
        """Where the tree writes this rank's shard of the state kept at ``position`` (None: the
        ``dump_snapshots`` setting is off)."""
        if not self.config.dump_snapshots:
            return None
        return os.path.join(self.config.dump_snapshots, snapshot_dump_name(rid, position, tp_rank))

    def release(self, release: Release) -> None:
        return None

    def check(self) -> None:
        return None
