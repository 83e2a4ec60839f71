"""An independent pure-torch reference of the tiny hybrid (Gated DeltaNet + gated attention) model with
explicit, caller-controlled caches, for value-by-value checks of what a cache policy makes the server compute.

Independence: this file imports nothing from the repo's ``patches``, ``scr``, ``exact_cache``, ``policy`` or
``eval`` packages. It loads the checkpoint with transformers (fp32, CPU, eval, no grad) and uses only the
weights and the trivial submodules (``nn.Linear`` projections, the zero-centred ``(1 + w)`` RMSNorms, the
SwiGLU MLP, the embedding); the attention math, partial NeoX RoPE, the GDN causal conv with carried state,
the gates, the gated delta rule and the gated output norm are written out here from
docs/model.md §2 and checked against transformers' own forward (tests).

Caches (what a server holds between requests):

* attention layers: ``keys[i]`` / ``values[i]`` ``[n, kv_heads, head_dim]``, keys after ``k_norm`` and AFTER
  RoPE; row index = RoPE position (positions are contiguous from 0, as in SGLang).
* GDN layers: ``conv[i]`` ``[conv_dim, kernel - 1]`` = the last ``kernel - 1`` raw ``in_proj_qkv`` rows
  (pre-conv, pre-SiLU, channels ``[q | k | v]``; the SGLang convention, transformers keeps ``kernel``
  columns), and ``recurrent[i]`` ``[value_heads, k_dim, v_dim]`` fp32 (FLA / transformers K-major layout,
  ``o_t = S_t^T q_t``; docs/model.md §2.2 says SGLang's pool may be V-major ``[.., v_dim, k_dim]``: check
  the layout, and transpose, when comparing).

Split invariance: with ``gdn="recurrent"`` (default, the per-token delta rule) each token's computation does
not depend on how the sequence is split into reads: projections are row-wise matmuls (``_linear``),
attention is done one query at a time over exactly its visible rows, elementwise transcendentals are
evaluated in float64 and rounded (``_f64``), and ``read`` runs on one intra-op thread. So reading a prompt
in pieces, or decoding token by token, gives bit-identical logits, K/V and GDN states to one read (observed;
the tests allow 1e-5 / 1e-6). ``gdn="chunk"`` runs the chunked (WY/UT) form with chunks of 64 aligned to
the start of each read, as FLA and transformers do for a prefill: 2x faster on long reads, the same function
up to fp32 rounding (~1e-6 in states, ~2e-5 in logits), but not split-invariant.
"""
# Spec: docs/model.md

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

__all__ = ["Cache", "Reference", "rerotate", "rope", "inv_freq_fp64"]


# ---------------------------------------------------------------------------------------------------------
# RoPE (NeoX half-split, partial)


def inv_freq_fp64(rotary_dim: int, theta: float) -> torch.Tensor:
    """theta^(-2i/rotary_dim), i = 0 .. rotary_dim/2 - 1, in float64."""
    i = torch.arange(0, rotary_dim, 2, dtype=torch.float64)
    return 1.0 / (float(theta) ** (i / rotary_dim))


def _f64(fn, x: torch.Tensor) -> torch.Tensor:
    """An elementwise transcendental function (exp, sigmoid, silu, softplus, cos, sin) of an fp32 tensor,
    evaluated in float64 and rounded to fp32 (i.e. correctly rounded, barring ties). In fp32, torch evaluates
    the SIMD body and the tail of a tensor with different approximations (1-ulp differences), so an element's
    value would depend on how many elements are computed with it, i.e. on how a prompt is split into reads."""
    return fn(x.to(torch.float64)).to(torch.float32)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, rotary_dim: int) -> torch.Tensor:
    """Rotate NeoX pairs (i, i + rotary_dim/2) of the first rotary_dim channels of ``x [n, heads, d]`` by the
    angles whose cos/sin are ``[n, rotary_dim/2]``; the other channels are returned untouched."""
    half = rotary_dim // 2
    x1, x2, rest = x[..., :half], x[..., half:rotary_dim], x[..., rotary_dim:]
    cos, sin = cos[:, None, :], sin[:, None, :]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin, rest], dim=-1)


def rope(x: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor, rotary_dim: int) -> torch.Tensor:
    """Apply RoPE at ``positions [n]`` to ``x [n, heads, head_dim]`` with the angle position * inv_freq formed
    in inv_freq's dtype (fp32 inv_freq gives transformers' / SGLang's fp32 angles; fp64 an exact reference)."""
    angle = positions.to(inv_freq.dtype)[:, None] * inv_freq[None, :]
    return _rotate(x, _f64(torch.cos, angle).to(x.dtype), _f64(torch.sin, angle).to(x.dtype), rotary_dim)


def rerotate(
    keys: torch.Tensor,
    old_positions: torch.Tensor,
    new_positions: torch.Tensor,
    rotary_dim: int,
    theta: float,
) -> torch.Tensor:
    """Move post-RoPE ``keys [n, heads, head_dim]`` from ``old_positions`` to ``new_positions`` (both ``[n]``, or
    scalars): R(new) = R(new - old) R(old), so rotate pair (i, i + rotary_dim/2) by (new - old) * theta^(-2i/rd).
    The angle is formed in float64 (exact integer delta times float64 inv_freq), cos/sin are cast to fp32 and
    the rotation is done in fp32; channels >= rotary_dim are returned bit-identical. Returns a new fp32 tensor."""
    keys = keys.to(torch.float32)
    n = keys.shape[0]
    old = torch.as_tensor(old_positions, dtype=torch.int64).reshape(-1).expand(n)
    new = torch.as_tensor(new_positions, dtype=torch.int64).reshape(-1).expand(n)
    delta = (new - old).to(torch.float64)
    angle = delta[:, None] * inv_freq_fp64(rotary_dim, theta)[None, :]
    return _rotate(keys, angle.cos().to(torch.float32), angle.sin().to(torch.float32), rotary_dim)


# ---------------------------------------------------------------------------------------------------------
# Cache


@dataclass
class Cache:
    keys: list[torch.Tensor]  # per attention layer [n, kv_heads, head_dim], post k_norm, post RoPE
    values: list[torch.Tensor]  # per attention layer [n, kv_heads, head_dim]
    conv: list[torch.Tensor]  # per GDN layer [conv_dim, kernel - 1]: last raw in_proj_qkv rows, oldest first
    recurrent: list[torch.Tensor]  # per GDN layer [value_heads, k_dim, v_dim] fp32 (K-major)
    length: int = 0  # number of K/V rows = next position

    def clone(self) -> "Cache":
        return Cache(
            keys=[t.clone() for t in self.keys],
            values=[t.clone() for t in self.values],
            conv=[t.clone() for t in self.conv],
            recurrent=[t.clone() for t in self.recurrent],
            length=self.length,
        )

    def linear_state(self) -> tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...]]:
        """A deep copy ``(conv, recurrent)`` of the GDN state (a snapshot)."""
        return tuple(t.clone() for t in self.conv), tuple(t.clone() for t in self.recurrent)

    def with_linear_state(self, snapshot) -> None:
        """Overwrite the GDN state with (copies of) a snapshot from ``linear_state()``; K/V rows untouched."""
        conv, recurrent = snapshot
        if len(conv) != len(self.conv) or len(recurrent) != len(self.recurrent):
            raise ValueError("snapshot has a different number of GDN layers")
        for old, new in zip(self.conv, conv):
            if old.shape != new.shape:
                raise ValueError(f"conv state shape {tuple(new.shape)} != {tuple(old.shape)}")
        for old, new in zip(self.recurrent, recurrent):
            if old.shape != new.shape:
                raise ValueError(f"recurrent state shape {tuple(new.shape)} != {tuple(old.shape)}")
        self.conv = [t.detach().clone().to(torch.float32) for t in conv]
        self.recurrent = [t.detach().clone().to(torch.float32) for t in recurrent]

    def append_rows(self, keys: list[torch.Tensor], values: list[torch.Tensor]) -> None:
        """Append K/V rows as given (per attention layer, ``[m, kv_heads, head_dim]``, keys already rotated
        to the positions they will occupy: length .. length + m - 1). GDN state untouched."""
        if len(keys) != len(self.keys) or len(values) != len(self.values):
            raise ValueError("need one key and one value tensor per attention layer")
        m = keys[0].shape[0]
        for k, v, k0 in zip(keys, values, self.keys):
            if k.shape != v.shape or k.shape[0] != m or k.shape[1:] != k0.shape[1:]:
                raise ValueError(f"bad row shapes {tuple(k.shape)} / {tuple(v.shape)}")
        self.keys = [torch.cat([a, b.to(torch.float32)]) for a, b in zip(self.keys, keys)]
        self.values = [torch.cat([a, b.to(torch.float32)]) for a, b in zip(self.values, values)]
        self.length += m

    def replace_rows(self, start: int, keys: list[torch.Tensor], values: list[torch.Tensor]) -> None:
        """Overwrite K/V rows ``[start, start + m)`` with the given ones (already at those positions);
        the GDN state is untouched."""
        m = keys[0].shape[0]
        if not 0 <= start <= start + m <= self.length:
            raise IndexError(f"rows [{start}, {start + m}) outside [0, {self.length})")
        for layer, (k, v) in enumerate(zip(keys, values)):
            self.keys[layer][start:start + m] = k.to(torch.float32)
            self.values[layer][start:start + m] = v.to(torch.float32)

    def rows(self, start: int, end: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Copies of K/V rows [start, end) of every attention layer."""
        if not 0 <= start <= end <= self.length:
            raise IndexError(f"rows [{start}, {end}) outside [0, {self.length})")
        return [k[start:end].clone() for k in self.keys], [v[start:end].clone() for v in self.values]

    def check(self) -> None:
        for t in (*self.keys, *self.values):
            if t.shape[0] != self.length:
                raise AssertionError(f"K/V layer has {t.shape[0]} rows, cache length is {self.length}")


# ---------------------------------------------------------------------------------------------------------
# Model


def _rms_norm_gated(x: torch.Tensor, z: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """GDN output norm: RMSNorm over the last dim with a plain weight (not 1 + w), then * silu(z)."""
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight * _f64(F.silu, z)


@contextlib.contextmanager
def _one_thread():
    """Run on one intra-op thread (restored afterwards): the tensors are tiny, so threads only add OpenMP
    overhead (badly so on a busy 2-core box), and the result cannot depend on the thread count."""
    before = torch.get_num_threads()
    if before != 1:
        torch.set_num_threads(1)
    try:
        yield
    finally:
        if before != 1:
            torch.set_num_threads(before)


def _linear(x: torch.Tensor, linear: torch.nn.Linear) -> torch.Tensor:
    """``linear(x)`` for ``x [T, in]`` computed one row at a time (a batch of T [1, in] @ [in, out] products),
    so a row's result does not depend on how many rows are computed with it: a plain GEMM picks its blocking
    from T, which moves results by ~1e-6 and would make the logits depend on how a prompt is split into reads."""
    if linear.bias is not None:
        raise ValueError("biased projections are not expected in this model")
    return torch.matmul(x[:, None, :], linear.weight.t()[None]).squeeze(1)


def _mlp(x: torch.Tensor, mlp) -> torch.Tensor:
    """SwiGLU: down(silu(gate(x)) * up(x))."""
    return _linear(_f64(F.silu, _linear(x, mlp.gate_proj)) * _linear(x, mlp.up_proj), mlp.down_proj)


def _l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + eps)


def gated_delta_recurrent(q, k, v, g, beta, state):
    """Per-token gated delta rule. q, k ``[T, H, dk]`` (normalised, q scaled), v ``[T, H, dv]``, g, beta
    ``[T, H]``, state ``[H, dk, dv]``. Returns (o ``[T, H, dv]``, new state)."""
    S = state.clone()
    out = torch.empty(v.shape, dtype=torch.float32)
    decay = _f64(torch.exp, g)
    for t in range(q.shape[0]):
        S = S * decay[t][:, None, None]
        kv_mem = torch.einsum("hkv,hk->hv", S, k[t])
        delta = (v[t] - kv_mem) * beta[t][:, None]
        S = S + k[t][:, :, None] * delta[:, None, :]
        out[t] = torch.einsum("hkv,hk->hv", S, q[t])
    return out, S


def gated_delta_chunk(q, k, v, g, beta, state, chunk_size: int = 64):
    """Chunked (WY/UT) form of the same rule, chunks aligned to the first row (docs/model.md §2.2)."""
    S = state.clone()
    T = q.shape[0]
    out = torch.empty(v.shape, dtype=torch.float32)
    for s in range(0, T, chunk_size):
        e = min(T, s + chunk_size)
        c = e - s
        Q, K, V = q[s:e].transpose(0, 1), k[s:e].transpose(0, 1), v[s:e].transpose(0, 1)  # [H, c, d]
        G = g[s:e].transpose(0, 1).cumsum(-1)  # [H, c]
        B = beta[s:e].transpose(0, 1)  # [H, c]
        lower = torch.ones(c, c, dtype=torch.bool).tril()
        diff = (G[:, :, None] - G[:, None, :]).masked_fill(~lower, float("-inf"))
        D = diff.exp()  # [H, c, c], exp(G_i - G_j) for i >= j else 0
        A = torch.eye(c) + ((B[:, :, None] * (K @ K.transpose(1, 2))) * D).tril(-1)
        U = torch.linalg.solve_triangular(A, B[:, :, None] * V, upper=False, unitriangular=True)
        W = torch.linalg.solve_triangular(
            A, (B * G.exp())[:, :, None] * K, upper=False, unitriangular=True
        )
        Vnew = U - W @ S
        O = G.exp()[:, :, None] * (Q @ S) + ((Q @ K.transpose(1, 2)) * D) @ Vnew
        S = G[:, -1, None, None].exp() * S + ((G[:, -1:] - G).exp()[:, :, None] * K).transpose(1, 2) @ Vnew
        out[s:e] = O.transpose(0, 1)
    return out, S


class Reference:
    """The tiny Qwen3.5-architecture model, driven layer by layer with explicit caches (fp32, CPU)."""

    def __init__(self, model_dir, gdn: str = "recurrent"):
        from transformers import Qwen3_5ForConditionalGeneration

        if gdn not in ("recurrent", "chunk"):
            raise ValueError(f"gdn must be 'recurrent' or 'chunk', not {gdn!r}")
        self.gdn = gdn
        model = Qwen3_5ForConditionalGeneration.from_pretrained(
            str(Path(model_dir)), dtype=torch.float32, local_files_only=True
        ).eval()
        model.requires_grad_(False)
        self.hf_model = model  # kept for comparisons in tests (never used by read/decode)
        self.text = model.model.language_model
        self.lm_head = model.lm_head
        cfg = self.text.config
        self.config = cfg

        self.attention_layers = [i for i, t in enumerate(cfg.layer_types) if t == "full_attention"]
        self.linear_layers = [i for i, t in enumerate(cfg.layer_types) if t == "linear_attention"]
        if len(self.attention_layers) + len(self.linear_layers) != cfg.num_hidden_layers:
            raise ValueError(f"unexpected layer types {cfg.layer_types}")

        rp = cfg.rope_parameters
        if rp.get("rope_type", "default") != "default":
            raise ValueError(f"only default RoPE is mirrored, got {rp}")
        # (An mrope_section, if any, is irrelevant: for text all MRoPE streams equal the token index, §2.1.)
        self.head_dim = cfg.head_dim
        self.num_heads = cfg.num_attention_heads
        self.num_kv_heads = cfg.num_key_value_heads
        self.rotary_dim = int(self.head_dim * rp.get("partial_rotary_factor", 1.0))
        self.rope_theta = float(rp["rope_theta"])
        # fp32 inv_freq formed the way transformers (and SGLang) form it, for fresh RoPE at the real positions.
        self.inv_freq = 1.0 / (
            self.rope_theta
            ** (torch.arange(0, self.rotary_dim, 2, dtype=torch.int64).to(torch.float32) / self.rotary_dim)
        )
        if not torch.equal(self.inv_freq, self.text.rotary_emb.inv_freq.float()):
            raise AssertionError("inv_freq differs from transformers' rotary embedding")

        self.conv_kernel = cfg.linear_conv_kernel_dim
        self.k_heads = cfg.linear_num_key_heads
        self.v_heads = cfg.linear_num_value_heads
        self.k_dim = cfg.linear_key_head_dim
        self.v_dim = cfg.linear_value_head_dim
        self.conv_dim = 2 * self.k_heads * self.k_dim + self.v_heads * self.v_dim
        self.eps = cfg.rms_norm_eps
        if cfg.hidden_act != "silu" or getattr(cfg, "attention_bias", False):
            raise ValueError("only the SiLU, bias-free Qwen3.5 layout is mirrored")
        self.vocab_size = cfg.vocab_size

    # -- caches ---------------------------------------------------------------------------------------
    def empty(self) -> Cache:
        return Cache(
            keys=[torch.zeros(0, self.num_kv_heads, self.head_dim) for _ in self.attention_layers],
            values=[torch.zeros(0, self.num_kv_heads, self.head_dim) for _ in self.attention_layers],
            conv=[torch.zeros(self.conv_dim, self.conv_kernel - 1) for _ in self.linear_layers],
            recurrent=[torch.zeros(self.v_heads, self.k_dim, self.v_dim) for _ in self.linear_layers],
            length=0,
        )

    # -- layers ---------------------------------------------------------------------------------------
    def pre_rope_keys(self, layer: int, hidden: torch.Tensor) -> torch.Tensor:
        """k_norm(k_proj(hidden)) of attention layer ``layer`` for ``hidden [n, hidden_size]`` (pre-RoPE)."""
        attn = self.text.layers[layer].self_attn
        return attn.k_norm(attn.k_proj(hidden).view(hidden.shape[0], self.num_kv_heads, self.head_dim))

    def _attention(self, layer: int, x: torch.Tensor, cache: Cache, slot: int, start: int) -> torch.Tensor:
        attn = self.text.layers[layer].self_attn
        T, H, G, D = x.shape[0], self.num_heads, self.num_kv_heads, self.head_dim
        qg = _linear(x, attn.q_proj).view(T, H, 2 * D)  # per head [query | gate]
        q, gate = qg[..., :D], qg[..., D:].reshape(T, H * D)
        q = attn.q_norm(q)
        k = attn.k_norm(_linear(x, attn.k_proj).view(T, G, D))
        v = _linear(x, attn.v_proj).view(T, G, D)
        positions = torch.arange(start, start + T)
        q = rope(q, positions, self.inv_freq, self.rotary_dim)
        k = rope(k, positions, self.inv_freq, self.rotary_dim)
        keys = torch.cat([cache.keys[slot], k])  # [start + T, G, D]
        values = torch.cat([cache.values[slot], v])
        cache.keys[slot], cache.values[slot] = keys, values

        # GQA: query head h reads KV head h // rep, i.e. query heads grouped [G, rep]. One query at a time over
        # exactly its visible rows 0 .. p (causal), so its result does not depend on how the prompt was split.
        rep = H // G
        kt = keys.permute(1, 2, 0)  # [G, D, N]
        vt = values.transpose(0, 1)  # [G, N, D]
        qh = q.view(T, G, rep, D)
        o = torch.empty(T, G, rep, D)
        for t in range(T):
            n = start + t + 1
            scores = torch.matmul(qh[t], kt[:, :, :n]) * attn.scaling  # [G, rep, n]
            probs = torch.softmax(scores, dim=-1, dtype=torch.float32)
            o[t] = torch.matmul(probs, vt[:, :n])
        o = o.reshape(T, H * D)
        return _linear(o * _f64(torch.sigmoid, gate), attn.o_proj)

    def _gdn(self, layer: int, x: torch.Tensor, cache: Cache, slot: int) -> torch.Tensor:
        m = self.text.layers[layer].linear_attn
        T, Kc = x.shape[0], self.conv_kernel
        qkv = _linear(x, m.in_proj_qkv)  # [T, conv_dim], channels [q (Hk*dk) | k (Hk*dk) | v (Hv*dv)]
        z = _linear(x, m.in_proj_z).view(T, self.v_heads, self.v_dim)
        b = _linear(x, m.in_proj_b)  # [T, Hv]
        a = _linear(x, m.in_proj_a)

        # depthwise causal conv over [carried state ; new rows]; w[:, Kc-1] multiplies the current row
        xin = torch.cat([cache.conv[slot].transpose(0, 1), qkv])  # [Kc - 1 + T, conv_dim]
        cache.conv[slot] = xin[-(Kc - 1):].transpose(0, 1).contiguous()
        w = m.conv1d.weight[:, 0, :]  # [conv_dim, Kc]
        windows = xin.unfold(0, Kc, 1)  # [T, conv_dim, Kc], window t = rows t .. t + Kc - 1
        y = _f64(F.silu, (windows * w[None]).sum(-1))

        kd = self.k_heads * self.k_dim
        q = y[:, :kd].reshape(T, self.k_heads, self.k_dim)
        k = y[:, kd : 2 * kd].reshape(T, self.k_heads, self.k_dim)
        v = y[:, 2 * kd :].reshape(T, self.v_heads, self.v_dim)
        q = _l2norm(q) * (self.k_dim**-0.5)
        k = _l2norm(k)
        rep = self.v_heads // self.k_heads  # value head j reads q/k head j // rep
        q = q.repeat_interleave(rep, dim=1)
        k = k.repeat_interleave(rep, dim=1)
        g = -_f64(torch.exp, m.A_log) * _f64(F.softplus, a + m.dt_bias)  # log decay <= 0
        beta = _f64(torch.sigmoid, b)

        rule = gated_delta_recurrent if self.gdn == "recurrent" else gated_delta_chunk
        o, cache.recurrent[slot] = rule(q, k, v, g, beta, cache.recurrent[slot])
        o = _rms_norm_gated(o, z, m.norm.weight, m.norm.variance_epsilon)
        return _linear(o.reshape(T, self.v_heads * self.v_dim), m.out_proj)

    # -- public ---------------------------------------------------------------------------------------
    @torch.no_grad()
    def read(self, cache: Cache, token_ids) -> torch.Tensor:
        """Run ``token_ids`` at positions cache.length .. cache.length + len - 1 on top of ``cache`` (updated in
        place: K/V rows appended, GDN states advanced). Returns fp32 logits ``[len, vocab]``."""
        ids = torch.as_tensor(list(token_ids), dtype=torch.int64).reshape(-1)
        if ids.numel() == 0:
            return torch.zeros(0, self.vocab_size)
        cache.check()
        with _one_thread():
            return self._read(cache, ids)

    def _read(self, cache: Cache, ids: torch.Tensor) -> torch.Tensor:
        start = cache.length
        h = self.text.embed_tokens(ids)
        for i, layer in enumerate(self.text.layers):
            x = layer.input_layernorm(h)
            if i in self.attention_layers:
                h = h + self._attention(i, x, cache, self.attention_layers.index(i), start)
            else:
                h = h + self._gdn(i, x, cache, self.linear_layers.index(i))
            h = h + _mlp(layer.post_attention_layernorm(h), layer.mlp)
        cache.length = start + ids.numel()
        return _linear(self.text.norm(h), self.lm_head).float()

    @torch.no_grad()
    def decode(self, cache: Cache, first_logits: torch.Tensor, output_ids) -> tuple[list[float], list[int]]:
        """Teacher-forced scoring of ``output_ids``: step 0 scores output_ids[0] with ``first_logits`` (the
        prompt's last row), step i > 0 reads output_ids[i-1] (one token) and scores output_ids[i]. Returns
        (log_softmax logprob of each output id, argmax id at each step); leaves output_ids[:-1] in the cache."""
        output_ids = [int(t) for t in output_ids]
        logprobs, argmax = [], []
        logits = first_logits.reshape(-1).float()
        for i, tok in enumerate(output_ids):
            if i > 0:
                logits = self.read(cache, [output_ids[i - 1]])[0]
            logprobs.append(float(torch.log_softmax(logits, dim=-1)[tok]))
            argmax.append(int(torch.argmax(logits)))
        return logprobs, argmax

    @torch.no_grad()
    def hf_forward(self, token_ids, **kwargs):
        """transformers' own forward of ``token_ids`` (batch 1, positions from 0): the ground truth for tests."""
        ids = torch.as_tensor(list(token_ids), dtype=torch.int64).reshape(1, -1)
        with _one_thread():
            return self.hf_model(input_ids=ids, **kwargs)

    def hf_logits(self, token_ids) -> torch.Tensor:
        """transformers' full forward without cache, fp32 logits ``[len, vocab]``."""
        return self.hf_forward(token_ids).logits[0].float()
