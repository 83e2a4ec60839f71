"""SCR's private storage beside SGLang's pools: the K/V side buffer and the recurrent-state shadow.

Both live outside SGLang's paged pools (``scr_spec.md`` §5.1, §9.1), so they never compete with
the scheduler for slots and are invisible to its accounting and leak checks. Row ``r`` of side
slot ``s`` is flat row ``s * tokens + r``; the state shadow is indexed by the side slot too.
Plain torch; the SGLang pool tensors are passed in.
"""

from __future__ import annotations

import torch


class SideBuffer:
    """K/V rows of each full-attention layer for ``sessions`` conversations of up to ``tokens`` rows."""

    def __init__(self, pool_kv: list[tuple[torch.Tensor, torch.Tensor]], sessions: int, tokens: int):
        self.sessions, self.tokens = sessions, tokens
        self.kv = [
            (torch.empty((sessions * tokens, *k.shape[1:]), dtype=k.dtype, device=k.device),
             torch.empty((sessions * tokens, *v.shape[1:]), dtype=v.dtype, device=v.device))
            for k, v in pool_kv
        ]

    @property
    def bytes_per_token(self) -> int:
        return sum(k[0].numel() * k.element_size() + v[0].numel() * v.element_size() for k, v in self.kv)

    def start_line(self) -> str:
        """The authors' start-up line (§5.1): ``side buffer: S slots x T tokens (G GiB, K KiB/token)``."""
        total = self.bytes_per_token * self.sessions * self.tokens
        return (f"side buffer: {self.sessions} slots x {self.tokens} tokens "
                f"({total / 2**30:.2f} GiB, {self.bytes_per_token / 1024:.1f} KiB/token)")

    def _rows(self, slot: int, rows: torch.Tensor) -> torch.Tensor:
        if not 0 <= slot < self.sessions:
            raise IndexError(f"side slot {slot} outside [0, {self.sessions})")
        return slot * self.tokens + rows

    def store(self, slot: int, pool_kv, src: torch.Tensor, keep: int, end: int) -> None:
        """Copy pool rows ``src[keep:end]`` into side rows ``[keep, end)`` of ``slot``, every layer."""
        if end > self.tokens:
            raise ValueError(f"{end} rows exceed the slot size {self.tokens}")
        rows = self._rows(slot, torch.arange(keep, end, device=src.device))
        for (side_k, side_v), (pool_k, pool_v) in zip(self.kv, pool_kv):
            side_k[rows] = pool_k[src[keep:end]]
            side_v[rows] = pool_v[src[keep:end]]

    def load(self, slot: int, rows: torch.Tensor, pool_kv, dst: torch.Tensor) -> None:
        """Copy side rows ``rows`` of ``slot`` into pool rows ``dst`` (fresh slots), every layer."""
        flat = self._rows(slot, rows)
        for (side_k, side_v), (pool_k, pool_v) in zip(self.kv, pool_kv):
            pool_k[dst] = side_k[flat]
            pool_v[dst] = side_v[flat]


class StateShadow:
    """One saved recurrent state (every conv component + the SSM state, all linear layers) per side slot."""

    def __init__(self, conv: list[torch.Tensor], temporal: torch.Tensor, sessions: int):
        self.sessions = sessions
        self.conv = [torch.zeros((c.shape[0], sessions, *c.shape[2:]), dtype=c.dtype, device=c.device) for c in conv]
        self.temporal = torch.zeros((temporal.shape[0], sessions, *temporal.shape[2:]),
                                    dtype=temporal.dtype, device=temporal.device)

    def save(self, slot: int, conv: list[torch.Tensor], temporal: torch.Tensor, state_index: int) -> None:
        for shadow, live in zip(self.conv, conv):
            shadow[:, slot] = live[:, state_index]
        self.temporal[:, slot] = temporal[:, state_index]

    def restore(self, slot: int, conv: list[torch.Tensor], temporal: torch.Tensor, state_index: int) -> None:
        for shadow, live in zip(self.conv, conv):
            live[:, state_index] = shadow[:, slot]
        temporal[:, state_index] = self.temporal[:, slot]

    @staticmethod
    def copy_row(conv: list[torch.Tensor], temporal: torch.Tensor, state_index: int):
        """A copy of one live state row (every conv component + the SSM state), to put back."""
        return [c[:, state_index].clone() for c in conv], temporal[:, state_index].clone()

    @staticmethod
    def put_row(row, conv: list[torch.Tensor], temporal: torch.Tensor, state_index: int) -> None:
        conv_rows, temporal_row = row
        for live, saved in zip(conv, conv_rows):
            live[:, state_index] = saved
        temporal[:, state_index] = temporal_row
