"""How much memory SCR's own stores take, and whether they fit (``docs/scr.md`` §5.4).

The side buffer (§5.1) and the state shadow (§9.1) are allocated outside SGLang's pools, once the
scheduler has sized those pools, so SGLang never counts them: at the authors' defaults on
Qwen3.6-27B they take 23.69 GiB, which an 80 GB card at ``--mem-fraction-static 0.75`` does not
have left. Allocating regardless fails inside the scheduler with a CUDA out-of-memory traceback,
or succeeds and leaves the first forward without room for its activations. So the glue
(``patches/scr_tensors.py``) measures the free memory first and, when it is short, refuses to
start with ``memory_problem``'s message (the launcher exits 2 with it).

Plain numbers in, plain numbers or text out (no torch, no SGLang): the sizes the glue reads off
the pool tensors, and the geometry formulas that give the same sizes from a model's config
(``docs/model.md`` §1; the unit tests check the authors' Qwen3.6-27B figures with them).
"""
# Spec: docs/scr.md

from __future__ import annotations

import math
from dataclasses import dataclass

from scr.settings import ScrConfig

GIB = 2**30
MIB = 2**20

# SGLang 0.5.16's own estimate of the memory a scheduler needs free for activations once its
# pools are sized (``ServerArgs.mamba_pre_capture_reserve_mb``, the runtime reserve it keeps for
# hybrid models): 512 MiB of constant metadata, 1.5 MiB per token of the larger of the chunk and
# 2048 tokens, and 1/8 GiB per rank of the TP x PP group. Its 10 GiB floor on large cards is left
# out: that floor sets SGLang's default ``--mem-fraction-static``, it is not a need of the forward.
_ACTIVATION_BASE_MIB = 512
_ACTIVATION_MIB_PER_TOKEN = 1.5
_ACTIVATION_MIN_TOKENS = 2048
_ACTIVATION_MIB_PER_RANK = 1024 / 8


@dataclass(frozen=True)
class ScrMemory:
    """What SCR allocates on one scheduler (one TP rank): ``slots`` side slots of ``tokens`` rows of
    ``kv_bytes_per_token`` (K and V of every full-attention layer on this rank), and one saved
    recurrent state of ``state_bytes_per_slot`` per slot (0: no shadow, a dense model or ``ssm`` off)."""

    slots: int
    tokens: int
    kv_bytes_per_token: int
    state_bytes_per_slot: int = 0

    @property
    def side_bytes(self) -> int:
        return self.slots * self.tokens * self.kv_bytes_per_token

    @property
    def shadow_bytes(self) -> int:
        return self.slots * self.state_bytes_per_slot

    @property
    def total_bytes(self) -> int:
        return self.side_bytes + self.shadow_bytes


def kv_bytes_per_token(attention_layers: int, kv_heads: int, head_dim: int, element_size: int,
                       tp_size: int = 1) -> int:
    """K + V bytes of one token over all full-attention layers on one TP rank. SGLang splits the KV
    heads over the ranks and replicates them when there are fewer heads than ranks."""
    heads_per_rank = max(1, kv_heads // tp_size)
    return attention_layers * 2 * heads_per_rank * head_dim * element_size


def state_bytes_per_slot(linear_layers: int, conv_dim: int, conv_kernel: int, value_heads: int,
                         key_head_dim: int, value_head_dim: int, conv_element_size: int,
                         state_element_size: int, tp_size: int = 1) -> int:
    """One saved recurrent state on one TP rank: per linear layer, the conv state (the last
    ``conv_kernel - 1`` inputs of each conv channel, in SGLang's conv dtype) and the temporal state
    (``value_head_dim x key_head_dim`` per value head, in ``mamba_ssm_dtype``); both split over TP."""
    conv = conv_dim // tp_size * (conv_kernel - 1) * conv_element_size
    temporal = value_heads // tp_size * value_head_dim * key_head_dim * state_element_size
    return linear_layers * (conv + temporal)


def activation_margin_bytes(chunked_prefill_size: int | None, tp_size: int = 1, pp_size: int = 1,
                            on_gpu: bool = True) -> int:
    """Memory left free for SGLang's forward passes after SCR allocates: on a GPU, SGLang's own
    runtime estimate (see ``_ACTIVATION_*``). On the CPU the stores come out of host memory, which
    the kernel can reclaim and SGLang does not carve up, and the CPU serves tiny test models: only
    the constant 512 MiB is kept."""
    if not on_gpu:
        return _ACTIVATION_BASE_MIB * MIB
    tokens = max(chunked_prefill_size or 0, _ACTIVATION_MIN_TOKENS)
    mib = _ACTIVATION_BASE_MIB + tokens * _ACTIVATION_MIB_PER_TOKEN + tp_size * pp_size * _ACTIVATION_MIB_PER_RANK
    return int(mib * MIB)


def fits(memory: ScrMemory, free: int, margin: int) -> bool:
    """The stores fit when ``margin`` stays free after them; exactly ``margin`` left is enough."""
    return memory.total_bytes + margin <= free


def max_side_tokens(memory: ScrMemory, free: int, margin: int) -> int:
    """The most rows per slot that fit with the current slot count (0: none)."""
    room = free - margin - memory.shadow_bytes
    per_token = memory.slots * memory.kv_bytes_per_token
    return max(0, room // per_token) if per_token else 0


def max_side_sessions(memory: ScrMemory, free: int, margin: int) -> int:
    """The most slots that fit with the current rows per slot (0: none)."""
    per_slot = memory.tokens * memory.kv_bytes_per_token + memory.state_bytes_per_slot
    return max(0, (free - margin) // per_slot) if per_slot else 0


def fraction_that_fits(memory: ScrMemory, free: int, margin: int, mem_fraction_static: float,
                       device_total: int) -> float | None:
    """A ``--mem-fraction-static`` that leaves room, rounded down to 0.01, or None when none does.

    SGLang keeps ``(1 - mem_fraction_static)`` of the device out of its pools (of the memory free
    before the model loads, which is about the device total), so lowering the fraction by ``d``
    frees about ``d x device_total``: hence "about" in the message."""
    short = memory.total_bytes + margin - free
    lowered = math.floor((mem_fraction_static - short / device_total) * 100) / 100
    return lowered if lowered > 0 else None


def _gib(n: int) -> str:
    return f"{n / GIB:.2f} GiB"


def _flag(name: str) -> str:
    """A side-buffer setting by its ``--cache-policy-set`` key and the authors' variable."""
    env = ScrConfig.__dataclass_fields__[name].metadata["env"]
    return f"{name} (--cache-policy-set {name}=N, or {env})"


def sizes_text(memory: ScrMemory) -> str:
    """``side buffer ... [+ state shadow ...]``: what the stores are made of."""
    text = (f"side buffer {_gib(memory.side_bytes)} = {memory.slots} slots x {memory.tokens} tokens x "
            f"{memory.kv_bytes_per_token / 1024:.1f} KiB/token")
    if memory.shadow_bytes:
        text += (f", state shadow {_gib(memory.shadow_bytes)} = {memory.slots} slots x "
                 f"{memory.state_bytes_per_slot / MIB:.1f} MiB")
    return text


def memory_problem(memory: ScrMemory, free: int, margin: int, where: str, *,
                   mem_fraction_static: float | None = None, device_total: int | None = None) -> str | None:
    """None when the stores fit in ``free`` bytes with ``margin`` to spare; else the refusal: what is
    needed, what is free, by how much it is short, and the settings that would make it fit."""
    if fits(memory, free, margin):
        return None
    short = memory.total_bytes + margin - free
    tokens, sessions = max_side_tokens(memory, free, margin), max_side_sessions(memory, free, margin)
    lower = [
        f"{_flag('side_tokens')}: " + (f"at most {tokens} fit with {memory.slots} slots" if tokens
                                       else f"none fits with {memory.slots} slots"),
        f"{_flag('side_sessions')}: " + (f"at most {sessions} fit with {memory.tokens} tokens" if sessions
                                         else f"none fits with {memory.tokens} tokens"),
    ]
    if mem_fraction_static is not None and device_total:
        lowered = fraction_that_fits(memory, free, margin, mem_fraction_static, device_total)
        if lowered is not None:
            lower.append(f"--mem-fraction-static (now {mem_fraction_static:g}; about {lowered:.2f} leaves room)")
    return (f"SCR needs {_gib(memory.total_bytes)} on {where} outside SGLang's pools ({sizes_text(memory)}) "
            f"and keeps {_gib(margin)} free for SGLang's activations, but only {_gib(free)} is free after "
            f"SGLang sized its pools: short by {_gib(short)}. Lower " + "; or ".join(lower))
