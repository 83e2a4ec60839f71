"""Prefill attention on CPU for long contexts, without the quadratic waste of SGLang's torch-native path.

SGLang 0.5.16's ``TorchNativeAttnBackend._run_sdpa_forward_extend`` runs, for each request of an
extend batch, causal SDPA over a query as long as the whole KV (prefix + chunk; the prefix rows of
the query are left uninitialised) and keeps only the chunk's rows. A chunk of L new tokens after a
prefix of P tokens then costs O((P + L)^2) instead of O(L (P + L)), and reading a long prompt in
fixed chunks costs O(n^3): measured on the 2-core box, a 512-token chunk after a 17,700-token
prefix took about 45 s (10 tokens/s), which made BrowseComp-Plus-shaped traces (prompts up to
26,000 tokens) impossible to replay on CPU.

``around_forward_extend`` computes a request whose KV is longer than ``LONG_KV`` tokens with SDPA
over the chunk's own queries and a bottom-right causal mask (query i of the chunk sees keys
0 .. P + i), the same attention without the wasted rows. Requests up to ``LONG_KV`` tokens, and
anything that is not plain causal self-attention (cross-attention, encoder-only, sliding window),
go to SGLang's own function, one request at a time when the batch mixes both kinds. So every
prompt the engine tests compare bit for bit with stock SGLang (radix, all under 8,192 tokens) takes
stock's path; and the choice depends only on the request's own KV length, never on what else is
in the batch, so exact's cached = cold guarantee (the same piece computed the same way) holds.

Split invariance (``tile_every_prefill``, switched on for ``exact`` on CPU by ``patches/hook_sets.py``):
SGLang's function, and ``chunk_attention`` too, give a row other bits depending on where the forward
that reads it starts and ends. torch's CPU flash attention picks its query block (32, 64 or 256 rows)
by the query length and cuts its key blocks at the causal limit of the query block, so a row's sums
run in another order. Measured on the tiny model (``exact`` ``cut=kept``, docs/exact.md §5.10): rows
128..191 read by a forward [128, 192) differed from the same rows read by [128, 256) in the first
attention layer's output by up to 8e-7 while every input of the layer was bit-identical, and the
first logprob of the request by 6e-7. ``tiled_attention`` computes every row in a call of fixed
shape: the 64 query rows of its tile of absolute positions [a, a + 64) over the keys [0, a + 64),
rows and keys outside the forward padded and masked out. A row's bits then depend on its position
and the KV before it only: the same whether its forward started or ended anywhere (any split, not
only on the 64-token grid) and whatever other requests share the batch. It costs nothing: the
tiles skip SGLang's redundant query rows. Measured as the CPU time of the server's processes for a
cold read under ``cut=kept`` (B = 832, 2-core box, best of 4, before / after): 0.18 / 0.14 s for 600
tokens, 0.54 / 0.34-0.44 s for 2,000, 1.23 / 0.69-0.98 s for 4,000, 4.3 / 1.8-1.9 s for 8,000 (wall
times on the shared box varied 4x run to run). Radix keeps SGLang's path, bit for bit.

Hook: AROUND ``TorchNativeAttnBackend._run_sdpa_forward_extend`` (``patches/cpu/platform.py``).
"""

from __future__ import annotations

import torch
from torch.nn.functional import scaled_dot_product_attention

TARGET = "sglang.srt.layers.attention.torch_native_backend.TorchNativeAttnBackend._run_sdpa_forward_extend"
LONG_KV = 8192  # tokens of KV (prefix + chunk) above which a request takes the chunk-only path
TILE = 64  # query rows per call of tiled_attention, aligned to absolute position 0 (the GDN chunk grid)

_TILED = {"on": False}  # set once per process at hook installation, before any forward


def tile_every_prefill() -> None:
    """From now on every plain causal request of an extend batch goes through ``tiled_attention``."""
    _TILED["on"] = True


def chunk_attention(query, k_cache, v_cache, tokens, scaling, enable_gqa: bool) -> torch.Tensor:
    """Causal attention of a chunk's queries over the request's whole KV.

    ``query``: [L, H, d] (the chunk), ``tokens``: the KV slots of positions 0 .. S-1 (S >= L); the
    chunk holds positions S-L .. S-1. Returns [L, H, d_v]."""
    length, total = query.shape[0], tokens.shape[0]
    q = query.movedim(0, 1)  # [H, L, d]
    k = k_cache[tokens].movedim(0, 1)  # [H_kv, S, d]
    v = v_cache[tokens].movedim(0, 1)
    if not (q.dtype == k.dtype == v.dtype):
        k, v = k.to(q.dtype), v.to(q.dtype)
    visible = torch.ones(length, total, dtype=torch.bool).tril(diagonal=total - length)
    out = scaled_dot_product_attention(q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0), attn_mask=visible,
                                       enable_gqa=enable_gqa, scale=scaling)
    return out.squeeze(0).movedim(1, 0)


def _plain_causal(encoder_lens, causal, is_cross_attn, sliding_window_size) -> bool:
    return (encoder_lens is None and causal and not is_cross_attn
            and (sliding_window_size is None or sliding_window_size <= -1))


def tiled_attention(query, k_cache, v_cache, tokens, scaling, enable_gqa: bool) -> torch.Tensor:
    """``chunk_attention``'s result, computed one tile of ``TILE`` absolute positions at a time.

    The tile [a, a + TILE) is one SDPA call of fixed shape: ``TILE`` query rows (those of the chunk,
    zeros elsewhere) over the keys [0, a + TILE) (zeros past the request's KV), key j visible to the
    row at position a + r iff j <= a + r. Padded rows are dropped and padded keys are always
    masked (they lie after every real row of the tile), so a row's bits do not depend on the chunk's
    extent (module docstring)."""
    length, total = query.shape[0], tokens.shape[0]
    prefix = total - length
    padded = -(-total // TILE) * TILE
    k, v = k_cache[tokens], v_cache[tokens]  # [S, H_kv, d]
    if not (query.dtype == k.dtype == v.dtype):
        k, v = k.to(query.dtype), v.to(query.dtype)
    if padded > total:
        k = torch.cat([k, k.new_zeros(padded - total, *k.shape[1:])])
        v = torch.cat([v, v.new_zeros(padded - total, *v.shape[1:])])
    out = query.new_empty(length, query.shape[1], v.shape[-1])
    for a in range(prefix // TILE * TILE, total, TILE):
        lo, hi = max(a, prefix), min(a + TILE, total)  # the tile's rows in this chunk
        q = query.new_zeros(TILE, *query.shape[1:])
        q[lo - a:hi - a] = query[lo - prefix:hi - prefix]
        keys = a + TILE
        visible = torch.ones(TILE, keys, dtype=torch.bool).tril(diagonal=a)
        o = scaled_dot_product_attention(q.movedim(0, 1).unsqueeze(0), k[:keys].movedim(0, 1).unsqueeze(0),
                                         v[:keys].movedim(0, 1).unsqueeze(0), attn_mask=visible,
                                         enable_gqa=enable_gqa, scale=scaling)
        out[lo - prefix:hi - prefix] = o.squeeze(0).movedim(1, 0)[lo - a:hi - a]
    return out


def around_forward_extend(original, backend, query, output, k_cache, v_cache, req_to_token, req_pool_indices,
                          seq_lens, extend_prefix_lens, extend_seq_lens, encoder_lens=None, scaling=None,
                          enable_gqa=False, causal=False, is_cross_attn=False, sliding_window_size=None):
    """Every request by ``tiled_attention`` once ``tile_every_prefill`` was called; otherwise long
    requests by ``chunk_attention`` and the others by SGLang's function (see the module docstring)."""
    rest = dict(scaling=scaling, enable_gqa=enable_gqa, causal=causal, is_cross_attn=is_cross_attn,
                sliding_window_size=sliding_window_size)
    lengths = seq_lens.tolist()
    tiled = _TILED["on"]
    if not _plain_causal(encoder_lens, causal, is_cross_attn, sliding_window_size) or (
            not tiled and max(lengths) <= LONG_KV):
        return original(backend, query, output, k_cache, v_cache, req_to_token, req_pool_indices, seq_lens,
                        extend_prefix_lens, extend_seq_lens, encoder_lens, **rest)
    start = 0
    for i, (total, length) in enumerate(zip(lengths, extend_seq_lens.tolist())):
        rows = slice(start, start + length)
        if tiled or total > LONG_KV:
            tokens = req_to_token[req_pool_indices[i], :total]
            own = tiled_attention if tiled else chunk_attention
            output[rows] = own(query[rows], k_cache, v_cache, tokens, scaling, enable_gqa)
        else:
            one = slice(i, i + 1)
            original(backend, query[rows], output[rows], k_cache, v_cache, req_to_token, req_pool_indices[one],
                     seq_lens[one], extend_prefix_lens[one], extend_seq_lens[one], None, **rest)
        start += length
    return output
