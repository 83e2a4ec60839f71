"""Settings of the exact policy (``--cache-policy-set key=value``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from exact_cache.rules import GRID, CutRule

GDN_CHUNK = GRID  # the GDN chunk kernel's grid: every grid piece boundary sits on it
UNRESOLVED = -1  # message_end_id before the launcher looked the token up in the tokenizer


@dataclass(frozen=True)
class ExactConfig:
    piece_tokens: int = 832  # B: the longest prefill forward; under cut=grid every piece but the tail
    retain_every: int = 6656  # R: periodic snapshot interval (13312 for long contexts)
    spec_drop: int = 0  # S: 1 when speculative decoding is on (the hit lands one piece early)
    max_snapshots: int = 0  # snapshot budget in Mamba-pool slots; 0 = SGLang's pool sizing
    dump_snapshots: str = ""  # debugging aid: write each snapshot's tensors under this directory
    # where forwards end: the B grid; also after message ends; or (kept) only at chunk ends and keep points
    cut: Literal["grid", "messages", "kept"] = "grid"
    message_end: str = "<|im_end|>"  # cut=messages/kept: the token that ends a message (a piece may end after it)
    message_end_id: int = UNRESOLVED  # its id; the launcher looks it up in the served tokenizer
    min_piece: int = 64  # cut=messages: a message end cuts only a piece of at least this many tokens
    message_keeps: int = 0  # cut=messages: keep states at the deepest N message ends of a read (0: all)
    # cut=kept: a keep point ends a forward (ends), or the engine keeps the state inside the forward
    # that crosses it (inside): forwards then end only at chunk ends from the read's start and the prompt end
    keeps: Literal["ends", "inside"] = "ends"

    def __post_init__(self):
        if self.piece_tokens <= 0 or self.piece_tokens % GDN_CHUNK:
            raise ValueError(f"piece_tokens={self.piece_tokens}: must be a positive multiple of {GDN_CHUNK}")
        step = GRID if self.cut == "kept" else self.piece_tokens
        if self.retain_every <= 0 or self.retain_every % step:
            what = f"{GRID} (cut=kept)" if self.cut == "kept" else f"piece_tokens={self.piece_tokens}"
            raise ValueError(f"retain_every={self.retain_every}: must be a positive multiple of {what}")
        if self.spec_drop not in (0, 1):
            raise ValueError(f"spec_drop={self.spec_drop}: must be 0 or 1")
        if self.max_snapshots < 0:
            raise ValueError(f"max_snapshots={self.max_snapshots}: must be >= 0 (0 = SGLang's pool sizing)")
        if not 1 <= self.min_piece <= self.piece_tokens:
            raise ValueError(f"min_piece={self.min_piece}: must be in [1, piece_tokens={self.piece_tokens}]")
        if self.cut not in ("grid", "messages", "kept"):
            raise ValueError(f"cut={self.cut!r}: must be grid, messages or kept")
        if self.keeps not in ("ends", "inside"):
            raise ValueError(f"keeps={self.keeps!r}: must be ends or inside")
        if self.keeps == "inside" and self.cut != "kept":
            raise ValueError(f"keeps=inside: only with cut=kept (a state kept inside a forward rests on its "
                             f"split invariance), not cut={self.cut}")
        if self.message_keeps < 0:
            raise ValueError(f"message_keeps={self.message_keeps}: must be >= 0 (0 = every message end)")
        if self.message_end_id < UNRESOLVED:
            raise ValueError(f"message_end_id={self.message_end_id}: a token id, or -1 to look it up")
        if self.cut == "messages" and not self.message_end and self.message_end_id == UNRESOLVED:
            raise ValueError("cut=messages needs message_end (or message_end_id)")

    @property
    def needs_token_lookup(self) -> bool:
        """cut=messages (or kept with a message_end) whose token id is still to be looked up in the
        tokenizer (the launcher does)."""
        wants = self.cut == "messages" or (self.cut == "kept" and bool(self.message_end))
        return wants and self.message_end_id == UNRESOLVED

    def cut_rule(self) -> CutRule:
        """The rule that cuts this config's prompts into pieces."""
        if self.cut == "grid":
            return CutRule(self.piece_tokens)
        if self.needs_token_lookup:
            raise ValueError(f"cut={self.cut}: the id of {self.message_end!r} was never looked up "
                             "(start the server with python -m patches.launch_server, or set message_end_id)")
        if self.cut == "kept":
            end = None if self.message_end_id == UNRESOLVED else self.message_end_id
            return CutRule(self.piece_tokens, end, kept=True, inside=self.keeps == "inside")
        return CutRule(self.piece_tokens, self.message_end_id, self.min_piece)
