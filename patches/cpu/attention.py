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
prompt the engine tests compare bit for bit with stock SGLang (all under 8,192 tokens) takes
stock's path; and the choice depends only on the request's own KV length, never on what else is
in the batch, so exact's cached = cold guarantee (the same piece computed the same way) holds.

Hook: AROUND ``TorchNativeAttnBackend._run_sdpa_forward_extend`` (``patches/cpu/platform.py``).
"""

from __future__ import annotations

import torch
from torch.nn.functional import scaled_dot_product_attention

TARGET = "sglang.srt.layers.attention.torch_native_backend.TorchNativeAttnBackend._run_sdpa_forward_extend"
LONG_KV = 8192  # tokens of KV (prefix + chunk) above which a request takes the chunk-only path


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


def around_forward_extend(original, backend, query, output, k_cache, v_cache, req_to_token, req_pool_indices,
                          seq_lens, extend_prefix_lens, extend_seq_lens, encoder_lens=None, scaling=None,
                          enable_gqa=False, causal=False, is_cross_attn=False, sliding_window_size=None):
    """Long requests by ``chunk_attention``, the others by SGLang's function (see the module docstring)."""
    rest = dict(scaling=scaling, enable_gqa=enable_gqa, causal=causal, is_cross_attn=is_cross_attn,
                sliding_window_size=sliding_window_size)
    lengths = seq_lens.tolist()
    if not _plain_causal(encoder_lens, causal, is_cross_attn, sliding_window_size) or max(lengths) <= LONG_KV:
        return original(backend, query, output, k_cache, v_cache, req_to_token, req_pool_indices, seq_lens,
                        extend_prefix_lens, extend_seq_lens, encoder_lens, **rest)
    start = 0
    for i, (total, length) in enumerate(zip(lengths, extend_seq_lens.tolist())):
        rows = slice(start, start + length)
        if total > LONG_KV:
            tokens = req_to_token[req_pool_indices[i], :total]
            output[rows] = chunk_attention(query[rows], k_cache, v_cache, tokens, scaling, enable_gqa)
        else:
            one = slice(i, i + 1)
            original(backend, query[rows], output[rows], k_cache, v_cache, req_to_token, req_pool_indices[one],
                     seq_lens[one], extend_prefix_lens[one], extend_seq_lens[one], None, **rest)
        start += length
    return output
