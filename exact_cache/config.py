"""Settings of the exact policy (``--cache-policy-set key=value``)."""

from __future__ import annotations

from dataclasses import dataclass

GDN_CHUNK = 64  # the GDN chunk kernel's grid: every piece boundary must sit on it


@dataclass(frozen=True)
class ExactConfig:
    piece_tokens: int = 832  # B: every prefill forward covers one piece [c, next cut)
    retain_every: int = 6656  # R: periodic snapshot interval (13312 for long contexts)
    spec_drop: int = 0  # S: 1 when speculative decoding is on (the hit lands one piece early)
    max_snapshots: int = 0  # snapshot budget in Mamba-pool slots; 0 = SGLang's pool sizing
    dump_snapshots: str = ""  # debugging aid: write each snapshot's tensors under this directory

    def __post_init__(self):
        if self.piece_tokens <= 0 or self.piece_tokens % GDN_CHUNK:
            raise ValueError(f"piece_tokens={self.piece_tokens}: must be a positive multiple of {GDN_CHUNK}")
        if self.retain_every <= 0 or self.retain_every % self.piece_tokens:
            raise ValueError(
                f"retain_every={self.retain_every}: must be a positive multiple of piece_tokens={self.piece_tokens}"
            )
        if self.spec_drop not in (0, 1):
            raise ValueError(f"spec_drop={self.spec_drop}: must be 0 or 1")
        if self.max_snapshots < 0:
            raise ValueError(f"max_snapshots={self.max_snapshots}: must be >= 0 (0 = SGLang's pool sizing)")
