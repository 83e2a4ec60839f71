"""SCR's tensor operations: the K/V side buffer, the recurrent-state shadow, row copies with key
re-rotation, and state save/restore (``docs/scr.md`` §5, §8, §9).

Both stores live outside SGLang's paged pools (§5.1, §9.1), so they never compete with the
scheduler for slots and are invisible to its accounting and leak checks. For the same reason
SGLang never leaves room for them: they are sized first, checked against the memory still free
(the policy's ``side_stores`` decision, ``policy.carrier.SideStores``, §5.4) and allocated only when
SCR is on; a shortfall refuses to start (exit 2). Row ``r`` of side slot ``s`` is flat row ``s * tokens + r``; the state shadow is
indexed by the side slot too. Nothing here decides anything: the step carrier says which rows and
slots, through ``patches/scr_runtime.py``.
"""
# Spec: docs/scr.md

from __future__ import annotations

import logging
import math

import torch

from patches import process
from patches.rope import rotate_keys, shifted_rotation, text_rotary
from policy.carrier import SideStores, StepPolicy, StoreCosts
from serving.host_memory import host_free_memory

logger = logging.getLogger(__name__)


class SideBuffer:
    """K/V rows of each full-attention layer for ``sessions`` conversations of up to ``tokens`` rows."""

    def __init__(self, pool_kv: list[tuple[torch.Tensor, torch.Tensor]], sessions: int, tokens: int):
        self.sessions, self.tokens = sessions, tokens
        self.kv = [tuple(torch.empty((sessions * tokens, *t.shape[1:]), dtype=t.dtype, device=t.device)
                         for t in pair) for pair in pool_kv]

    @property
    def bytes_per_token(self) -> int:
        return sum(k[0].numel() * k.element_size() + v[0].numel() * v.element_size() for k, v in self.kv)

    def _rows(self, slot: int, rows: torch.Tensor) -> torch.Tensor:
        if not 0 <= slot < self.sessions:
            raise IndexError(f"side slot {slot} outside [0, {self.sessions})")
        return slot * self.tokens + rows

    def store(self, slot: int, pool_kv, src: torch.Tensor, keep: int, end: int) -> None:
        """Copy pool rows ``src[keep:end]`` into side rows ``[keep, end)`` of ``slot``, every layer."""
        if end > self.tokens:
            raise ValueError(f"{end} rows exceed the slot size {self.tokens}")
        rows = self._rows(slot, torch.arange(keep, end, device=src.device))
        for side, pool in zip(self.kv, pool_kv):
            for side_t, pool_t in zip(side, pool):
                side_t[rows] = pool_t[src[keep:end]]

    def load(self, slot: int, rows: torch.Tensor, pool_kv, dst: torch.Tensor) -> None:
        """Copy side rows ``rows`` of ``slot`` into pool rows ``dst`` (fresh slots), every layer."""
        flat = self._rows(slot, rows)
        for side, pool in zip(self.kv, pool_kv):
            for side_t, pool_t in zip(side, pool):
                pool_t[dst] = side_t[flat]


class StateShadow:
    """One saved recurrent state (every conv component + the temporal state, all linear layers) per
    side slot, copied to and from the state slots of SGLang's state pool ``pool``."""

    def __init__(self, pool, sessions: int):
        self.pool = pool
        # One tensor per live part, in the order (*conv, temporal), with the slot axis in place of the row axis.
        self.parts = [torch.zeros((t.shape[0], sessions, *t.shape[2:]), dtype=t.dtype, device=t.device)
                      for t in self._live()]

    def _live(self) -> list[torch.Tensor]:
        return [*self.pool.conv, self.pool.temporal]

    def save(self, slot: int, state_index: int) -> None:
        """§9.2: state slot ``state_index`` -> the shadow row of side slot ``slot``."""
        for shadow, live in zip(self.parts, self._live()):
            shadow[:, slot] = live[:, state_index]

    def own(self, state_index: int) -> list[torch.Tensor]:
        """A copy of state slot ``state_index`` as it is now (``put_back`` writes it back)."""
        return [t[:, state_index].clone() for t in self._live()]

    def restore(self, slot: int, state_index: int) -> None:
        """§9.4 (fork): the shadow row of ``slot`` overwrites state slot ``state_index``."""
        for shadow, live in zip(self.parts, self._live()):
            live[:, state_index] = shadow[:, slot]

    def put_back(self, state_index: int, own: list[torch.Tensor]) -> None:
        for live, saved in zip(self._live(), own):
            live[:, state_index] = saved


def row_bytes(t: torch.Tensor) -> int:
    """Bytes of one index along ``t``'s first axis (one token of a K/V buffer)."""
    return math.prod(t.shape[1:]) * t.element_size()


def slot_bytes(t: torch.Tensor) -> int:
    """Bytes of one index along ``t``'s second axis (one slot of a ``[layers, slots, ...]`` state)."""
    return t.shape[0] * math.prod(t.shape[2:]) * t.element_size()


def free_memory(device: torch.device) -> tuple[int, int] | None:
    """``(free, total)`` bytes where the stores would go: the device's own figure on CUDA (after
    returning torch's unused cached blocks, as SGLang measures before sizing its pools), else the
    host's ``MemAvailable``; None when the host does not say."""
    if device.type == "cuda":
        torch.cuda.empty_cache()
        return torch.cuda.mem_get_info(device)
    return host_free_memory()


def store_costs(pool_kv, state, device: torch.device, server_args, measure=free_memory) -> StoreCosts:
    """What the policy sizes its side stores from, read off the pools' shapes (one side row per
    pool row of every layer, one shadow row per state slot), the free memory there and SGLang's
    settings (``server_args`` None on the test doubles: margin at its minimum)."""
    return StoreCosts(
        kv_bytes_per_token=sum(row_bytes(k) + row_bytes(v) for k, v in pool_kv),
        state_bytes_per_slot=sum(slot_bytes(t) for t in [*state.conv, state.temporal]) if state is not None else 0,
        where=str(device), free_memory=lambda: measure(device), on_gpu=device.type == "cuda",
        chunked_prefill_size=getattr(server_args, "chunked_prefill_size", None),
        tp_size=getattr(server_args, "tp_size", 1), pp_size=getattr(server_args, "pp_size", 1),
        mem_fraction_static=getattr(server_args, "mem_fraction_static", None))


def decide_stores(policy: StepPolicy, costs: StoreCosts) -> SideStores:
    """The policy's ``side_stores`` decision for ``costs``. A refusal stops the start
    (``process.refuse``: the launcher exits 2 with the message); the figures are logged."""
    decision = policy.side_stores(costs)
    if decision.problem is not None:
        raise process.refuse(decision.problem)
    (logger.warning if decision.warn else logger.info)(decision.line)
    return decision


class ScrTensors:
    """The tensors of one scheduler that SCR reads and writes: SGLang's full-attention K/V pool,
    its recurrent-state pool (None on a dense model), and SCR's side buffer and state shadow
    (None while SCR is switched off: ``enabled`` false allocates nothing)."""

    def __init__(self, scheduler, policy: StepPolicy, measure=free_memory):
        kv_pool = scheduler.token_to_kv_pool_allocator.get_kvcache()
        mapping = getattr(kv_pool, "full_attention_layer_id_mapping", None)
        self.layers = sorted(mapping) if mapping else list(range(kv_pool.start_layer, kv_pool.end_layer))
        self.pool_kv = [kv_pool.get_kv_buffer(layer) for layer in self.layers]
        self.req_to_token = scheduler.req_to_token_pool.req_to_token
        mamba_pool = getattr(scheduler.req_to_token_pool, "mamba_pool", None)
        self.state = mamba_pool.mamba_cache if mamba_pool is not None else None
        model_config = scheduler.model_config
        # Raises RotaryMismatch (``patches.hook_sets`` turns it into a refusal to start, exit 2), before any
        # memory is taken.
        self.rotary = text_rotary(scheduler.tp_worker.model_runner.model, self.layers,
                                  model_config.hf_text_config, getattr(model_config, "context_len", None))
        costs = store_costs(self.pool_kv, self.state, self.pool_kv[0][0].device,
                            getattr(scheduler, "server_args", None), measure)
        self.stores = decision = decide_stores(policy, costs)
        self.kv_bytes_per_token = costs.kv_bytes_per_token
        self.shadow_bytes = decision.slots * costs.state_bytes_per_slot if decision.states else 0
        self.side = self.shadow = None
        if not decision.allocate:
            return
        self.side = SideBuffer(self.pool_kv, decision.slots, decision.tokens)
        self.shadow = StateShadow(self.state, decision.slots) if decision.states else None

    def prefix_rows(self, pool_index: int, end: int) -> torch.Tensor:
        """Pool slots of a request's first ``end`` tokens."""
        return self.req_to_token[pool_index, :end].to(torch.int64)

    def place(self, slot: int, old_start: int, new_start: int, dst: torch.Tensor, rerotate: bool) -> None:
        """§5.3 + §8.3: side rows ``[old_start, old_start + len(dst))`` -> fresh pool slots ``dst``;
        keys re-rotated from the old positions to ``[new_start, ...)`` with the model's own table."""
        rows = torch.arange(old_start, old_start + dst.numel(), device=dst.device)
        self.side.load(slot, rows, self.pool_kv, dst)
        if not rerotate or old_start == new_start:
            return
        # One rotation for every layer (they share the positions), its positions checked on the
        # host: nothing below reads back from the device, so the layers queue without a sync.
        rotation = shifted_rotation(old_start, new_start, dst.numel(), self.rotary.cos_sin_cache, dst.device)
        for keys, _values in self.pool_kv:
            keys[dst] = rotate_keys(keys[dst], rotation)

    def store(self, slot: int, pool_index: int, kv_len: int, keep: int, end: int) -> None:
        """§5.2: rows ``[keep, end)`` of a request's K/V -> the same rows of side slot ``slot``."""
        self.side.store(slot, self.pool_kv, self.prefix_rows(pool_index, kv_len), keep, end)

    def state_sum(self, state_index: int | None = None, slot: int | None = None) -> float:
        """Checksum of a state slot or a shadow row, for the trace (a device sync on GPU)."""
        if slot is not None:
            return float(self.shadow.parts[-1][:, slot].abs().sum())
        return float(self.state.temporal[:, state_index].abs().sum())
