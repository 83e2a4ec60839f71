"""What a Suffix Cache Reuse server computes for one conversation, on the independent reference model.

Built on ``tests/reference/hybrid_reference.py`` (transformers weights, our own explicit-cache
forward) and, like it, imports nothing from ``scr/``, ``patches/``, ``policy/`` or ``eval/``: the
numbers come from the relocation rules alone (``docs``: docs/scr.md §5.2, §7, §8, §9), not from the
code under test. Given the server's *decisions* for a request (where each relocated block starts
in the new prompt, where its rows sat in the previous sequence, how many), ``Conversation.serve``
returns the logprobs and greedy ids the server must produce:

* the attention K/V up to block 1's stop is a cold read of the new prompt (the radix tree and the
  phase-1 read hold exact values; with relocated rows kept out of the tree nothing else enters it);
* each block's rows are the conversation's side rows ``[old_start, old_start + rows)`` (the K/V the
  server stored when the previous request of the conversation finished: its own, possibly
  relocated, rows), keys re-rotated from old to new positions with the *text* RoPE in fp32;
* the recurrent (GDN conv + SSM) state entering the read after block 1 is, under ``fork``, the
  state saved at the end of the previous request's prompt, under ``none`` the request's own state
  at block 1's stop (the linear layers never see relocated spans); later blocks change no state;
* the tail (each block's last re-read tokens, new text) is read on top; the prompt's last row
  gives the first token, then the server's own output ids are scored one by one (teacher forcing).

After serving, the conversation keeps what the server keeps: the side rows (rows whose token ids
did not change are kept, the rest copied from this request, as the server's incremental store
does) and the prompt-end state.

Relocated rows in the tree (``relocated_in_tree``, the authors' code, the default): a relocated
request is cached like any other, so the tree then holds its relocated rows under its token ids.
A later request that reads a stretch whose tokens the tree already holds (past the last recurrent
state the tree has, so the tree could not serve it) computes fresh rows, and SGLang's insert at
the end of each prefill forward keeps the tree's rows and points the request at them (it frees
the duplicates): from the next forward on, attention reads the tree's (relocated) rows there.
``serve(read_from=h, chunk=c)`` models that: the read from the server's tree hit ``h`` runs in
forwards of ``c`` tokens (SGLang's chunked prefill, cut at each block stop; or, given
``forward_starts``, where the server's log says each forward began), and after each forward the
rows the tree holds along the request's token path replace the request's own, over the whole
sequence so far: the rows it read, and a placed row too when its block starts on a token the
tree's path also has there (a diff run that begins one token before the edit, by coincidence of
ids, found by the four-conversation engine test). Only relocated requests' rows differ from a
fresh read, so only theirs replace anything.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from tests.reference.hybrid_reference import Cache, Reference, rerotate


@dataclass(frozen=True)
class Relocation:
    """One relocated block as the server reports it (new position, old position, row count)."""

    stop: int
    old_start: int
    rows: int


@dataclass
class Served:
    logprobs: list[float]
    argmax: list[int]
    cache: Cache  # after the prompt and output_ids[:-1]: what the request's KV held at its end


@dataclass
class Conversation:
    """The reference's copy of what one SCR session holds between requests."""

    ref: Reference
    side_ids: list[int] = field(default_factory=list)
    side_keys: list[torch.Tensor] | None = None
    side_values: list[torch.Tensor] | None = None
    snapshot: tuple | None = None  # GDN state at the end of the previous request's prompt
    relocated_in_tree: bool = True  # the server's setting: relocated requests enter the tree
    tree: list[tuple[list[int], Cache, bool]] = field(default_factory=list)  # served sequences in insertion
    # order: (ids, rows, relocated rows among them); the first to insert a path keeps its rows

    def serve(self, prompt, output_ids, relocations=(), ssm_mode: str = "fork", rerotate_keys: bool = True,
              prefix: Cache | None = None, read_from: int = 0, chunk: int | None = None,
              forward_starts=None) -> Served:
        """The request as the server computes it; updates the conversation like the server does.

        ``prefix``: a cache the request resumes from (a radix match on rows that a relocated request
        left in the tree); its length is where the read starts. Without it the read starts at 0.
        ``read_from``/``chunk``: the server's tree hit and prefill chunk, for the tree's rows
        replacing re-read ones (module docstring); without ``chunk`` nothing is replaced.
        ``forward_starts``: instead of the chunk grid, the positions where the server began each
        forward (its ``phase1 re-entry ... prefix=`` lines): with other requests in the round the
        chunk budget is shared, so forwards end off the grid."""
        starts = None if forward_starts is None else sorted(set(forward_starts))
        prompt, output_ids = list(prompt), list(output_ids)
        cache = prefix.clone() if prefix is not None else self.ref.empty()
        position = cache.length
        for index, block in enumerate(sorted(relocations, key=lambda b: b.stop)):
            if block.stop < position:
                raise ValueError(f"block at {block.stop} starts before the read position {position}")
            self._read(cache, prompt, position, block.stop, read_from, chunk, starts)
            self._place(cache, block, rerotate_keys)
            if index == 0 and ssm_mode == "fork":
                if self.snapshot is None:
                    raise ValueError("fork needs the previous prompt's state")
                cache.with_linear_state(self.snapshot)
            elif ssm_mode not in ("fork", "none"):
                raise ValueError(f"unknown ssm mode {ssm_mode!r}")
            position = block.stop + block.rows
        if position >= len(prompt):
            raise ValueError("a relocation must leave at least one prompt token to read")
        logits = self._read(cache, prompt, position, len(prompt), read_from, chunk, starts)
        prompt_end_state = cache.linear_state()
        logprobs, argmax = self.ref.decode(cache, logits[-1], output_ids)
        self._store(prompt + output_ids[:-1], cache)
        self.snapshot = prompt_end_state
        committed = prompt + output_ids[:-1]
        if relocations and not self.relocated_in_tree:  # only what phase 1 read exactly enters the tree
            committed = committed[:min(b.stop for b in relocations)]
        self.tree.append((committed, cache, bool(relocations) and self.relocated_in_tree))
        return Served(logprobs, argmax, cache)

    def _read(self, cache: Cache, prompt: list[int], start: int, end: int, read_from: int,
              chunk: int | None, starts: list[int] | None = None) -> torch.Tensor:
        """Read ``prompt[start:end]``: in one go, or (``chunk``) in the server's forwards (counted
        from ``read_from``, the tree hit), each followed by the tree's rows replacing re-read ones."""
        if chunk is None and starts is None:
            return self.ref.read(cache, prompt[start:end])
        logits = []
        position = start
        while position < end:
            if starts is not None:
                stop = min([p for p in starts if p > position] + [end])
            else:
                grid = read_from + ((position - read_from) // chunk + 1) * chunk if position >= read_from else read_from
                stop = min(end, grid)
            logits.append(self.ref.read(cache, prompt[position:stop]))
            # SGLang's insert after the forward covers the request's whole sequence so far, so a
            # placed (relocated) row whose position and token path the tree already holds is
            # replaced too, not only the rows this forward read.
            self._tree_rows(cache, prompt, stop)
            position = stop
        return torch.cat(logits)

    def _tree_rows(self, cache: Cache, prompt: list[int], stop: int) -> None:
        """Rows ``[0, stop)`` the tree holds for the same tokens replace the request's own: each
        position's rows are those of the first served sequence that inserted its path; a request
        without relocated rows holds what a fresh read computes, so only relocated ones change values."""
        done = 0
        for sequence, held, relocated in self.tree:
            shared = min(common_prefix(sequence, prompt), len(sequence), held.length, stop)
            if shared > done:
                if relocated:
                    keys, values = held.rows(done, shared)
                    cache.replace_rows(done, keys, values)
                done = shared

    def _place(self, cache: Cache, block: Relocation, rerotate_keys: bool) -> None:
        if self.side_keys is None or block.old_start + block.rows > len(self.side_ids):
            raise ValueError(f"side rows [{block.old_start}, {block.old_start + block.rows}) not stored")
        if cache.length != block.stop:
            raise ValueError(f"cache length {cache.length} != block stop {block.stop}")
        end = block.old_start + block.rows
        keys = [k[block.old_start:end] for k in self.side_keys]
        values = [v[block.old_start:end].clone() for v in self.side_values]
        if rerotate_keys:
            old = torch.arange(block.old_start, end)
            new = torch.arange(block.stop, block.stop + block.rows)
            keys = [rerotate(k, old, new, self.ref.rotary_dim, self.ref.rope_theta) for k in keys]
        else:
            keys = [k.clone() for k in keys]
        cache.append_rows(keys, values)

    def _store(self, committed: list[int], cache: Cache) -> None:
        """The server's incremental side store: rows of unchanged token ids stay, the rest are copied."""
        keep = 0
        limit = min(len(self.side_ids), len(committed))
        while keep < limit and self.side_ids[keep] == committed[keep]:
            keep += 1
        new_keys, new_values = cache.rows(keep, len(committed))
        if self.side_keys is None:
            self.side_keys, self.side_values = new_keys, new_values
        else:
            self.side_keys = [torch.cat([old[:keep], new]) for old, new in zip(self.side_keys, new_keys)]
            self.side_values = [torch.cat([old[:keep], new]) for old, new in zip(self.side_values, new_values)]
        self.side_ids = list(committed)


def common_prefix(a, b) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def cold(ref: Reference, prompt, output_ids) -> Served:
    """A plain read of the prompt (what radix serves with nothing cached)."""
    return Conversation(ref).serve(prompt, output_ids)


def distance(served_logprobs, served_ids, reference: Served) -> tuple[float, bool]:
    """(max |Δ logprob|, greedy ids equal) between a server answer and the reference."""
    delta = max(abs(a - b) for a, b in zip(served_logprobs, reference.logprobs))
    return delta, list(served_ids) == list(reference.argmax)
