"""What a generated (or recorded) trace set looks like, beside the numbers it produces.

SCR attaches a prompt to a conversation by content (``docs/scr.md`` §4.3): a session is a
candidate when its previous prompt shares at least 1,024 leading tokens with the new one, and the
winner needs an overall overlap (``quick_ratio``, below) of at least 0.5. So whether different
conversations look alike decides whether their sessions merge. Reported per set:

* **characters per token** of the rendered prompts (decoded text / ids; English with Qwen's
  tokenizer reads at about 4);
* **system-prompt tokens**: the leading tokens every conversation's first call shares (the
  system prompt and the tool section), against SCR's 1,024-token match minimum;
* **overlap between different conversations**: ``quick_ratio`` of the two conversations'
  prompts at the same call index (the longest common index), as §4.3 computes it:
  ``2 * |multiset intersection| / (|a| + |b|)``;
* **tokens per call**: prompt and completion lengths.
"""

# Spec: docs/scr.md

from __future__ import annotations

import itertools
import statistics
from collections import Counter
from typing import Sequence

from policy.tokens import common_prefix_len

SAMPLE_CALLS = 24  # calls decoded for characters per token


def quick_ratio(a: Sequence[int], b: Sequence[int]) -> float:
    """difflib's ``quick_ratio`` on token ids: an upper bound on their similarity (§4.3)."""
    if not a and not b:
        return 1.0
    common = sum((Counter(a) & Counter(b)).values())
    return 2.0 * common / (len(a) + len(b))


def distribution(values: Sequence[float]) -> dict[str, float]:
    if not values:
        return {}
    ordered = sorted(values)

    def at(q: float) -> float:
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    return {"n": len(ordered), "min": ordered[0], "median": statistics.median(ordered), "p90": at(0.9),
            "max": ordered[-1], "mean": statistics.fmean(ordered)}


def by_conversation(calls) -> dict[str, list]:
    out: dict[str, list] = {}
    for call in calls:
        out.setdefault(call.conversation, []).append(call)
    return out


def set_statistics(calls, tokenizer=None, sample: int = SAMPLE_CALLS) -> dict:
    """The statistics of the module docstring (``tokenizer``: for characters per token; None skips it)."""
    conversations = by_conversation(calls)
    firsts = [c[0].prompt_ids for c in conversations.values()]
    shared = min((common_prefix_len(a, b) for a, b in itertools.combinations(firsts, 2)), default=len(firsts[0]) if firsts else 0)
    overlaps, prefixes = [], []
    for a, b in itertools.combinations(conversations.values(), 2):
        index = min(len(a), len(b)) - 1
        overlaps.append(quick_ratio(a[index].prompt_ids, b[index].prompt_ids))
        prefixes.append(common_prefix_len(a[index].prompt_ids, b[index].prompt_ids))
    out = {
        "conversations": len(conversations),
        "calls": len(calls),
        "system_prompt_tokens": shared,
        "distinct_token_ids": len({t for c in calls for t in c.prompt_ids}),
        "cross_conversation_quick_ratio": distribution(overlaps),
        "cross_conversation_common_prefix": distribution(prefixes),
        "prompt_tokens_per_call": distribution([len(c.prompt_ids) for c in calls]),
        "completion_tokens_per_call": distribution([len(c.completion_ids) for c in calls]),
    }
    if tokenizer is not None and calls:
        step = max(1, len(calls) // sample)
        chosen = calls[::step][:sample]
        chars = sum(len(tokenizer.decode(c.prompt_ids)) for c in chosen)
        out["chars_per_token"] = chars / sum(len(c.prompt_ids) for c in chosen)
    return out


def format_statistics(stats: dict) -> str:
    def dist(name: str, digits: int = 0) -> str:
        d = stats.get(name) or {}
        if not d:
            return "n/a"
        return ", ".join(f"{k} {d[k]:.{digits}f}" for k in ("min", "median", "p90", "max"))

    lines = [
        f"characters per token: {stats['chars_per_token']:.2f}" if "chars_per_token" in stats else "",
        f"system-prompt tokens (shared by every conversation's first call): {stats['system_prompt_tokens']} "
        "(SCR's session match needs 1,024 common leading tokens)",
        f"distinct token ids in prompts: {stats['distinct_token_ids']}",
        f"quick_ratio between different conversations: {dist('cross_conversation_quick_ratio', 3)} "
        "(SCR's match needs 0.5)",
        f"common prefix between different conversations, tokens: {dist('cross_conversation_common_prefix')}",
        f"prompt tokens per call: {dist('prompt_tokens_per_call')}",
        f"completion tokens per call: {dist('completion_tokens_per_call')}",
    ]
    return "\n".join(line for line in lines if line)
