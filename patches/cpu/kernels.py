"""Pure-torch stand-ins for the Triton kernels SGLang 0.5.16 runs for a Qwen3.5 hybrid model.

Why: on a host without CUDA the only way to run SGLang's Triton kernels is Triton's numpy
interpreter, which is ~100x slower and mis-computes bf16 (it stores bf16 as raw uint16 and does
arithmetic on the bit patterns, ``docs/cpu.md`` §3 blocker 10). Replacing every kernel on the
GDN path with plain torch removes the interpreter from the CPU path altogether, so neither the
interpreter patches nor ``TRITON_INTERPRET`` are needed, and an engine test takes well under a
second per request instead of ~5 s.

Each function keeps the signature and the in-place side effects of the kernel it replaces (the
SGLang call sites are untouched) and computes in fp32, rounding to the storage dtype exactly
where the Triton kernel stores. Arguments that only serve GPU-only features (speculative
verify, ReplaySSM, circular conv buffers) are rejected loudly instead of being ignored.

Layouts (SGLang 0.5.16):
  * recurrent state pool ``[slots, HV, V, K]`` fp32 (note: V before K);
  * conv state pool ``[slots, dim, width - 1]``;
  * value head ``hv`` reads key/query head ``hv // (HV // H)``.

The GDN prefill here is chunked on a 64-token grid that restarts at each forward's first
token, like FLA's ``chunk_gated_delta_rule``; ``tests/reference`` checks it against a
token-by-token recurrence.
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch
import torch.nn.functional as F

from patches import state_keeps

GDN_CHUNK = 64
L2NORM_EPS = 1e-6
PAD_SLOT_ID = -1


def _no_gpu_only(**kwargs) -> None:
    used = sorted(name for name, value in kwargs.items() if value is not None)
    if used:
        raise NotImplementedError(
            f"CPU kernel does not implement {', '.join(used)} (GPU-only feature: "
            "speculative decoding / ReplaySSM / circular conv state)"
        )


# --------------------------------------------------------------------------- projections


def fused_qkvzba_split_reshape_cat_contiguous(
    mixed_qkvz: torch.Tensor,
    mixed_ba: torch.Tensor,
    num_heads_qk: int,
    num_heads_v: int,
    head_qk: int,
    head_v: int,
):
    """Split ``[all_q | all_k | all_v | all_z]`` and ``[all_b | all_a]`` (Qwen3.5 layout)."""
    qkv_dim = 2 * num_heads_qk * head_qk + num_heads_v * head_v
    mixed_qkv = mixed_qkvz[:, :qkv_dim].contiguous()
    z = mixed_qkvz[:, qkv_dim:].reshape(-1, num_heads_v, head_v).contiguous()
    b = mixed_ba[:, :num_heads_v].contiguous()
    a = mixed_ba[:, num_heads_v:].contiguous()
    return mixed_qkv, z, b, a


def fused_sigmoid_mul(attn_output: torch.Tensor, gate: torch.Tensor, inplace: bool = False):
    """``attn_output * sigmoid(gate)``; ``gate`` may be a strided 3-D view ``[T, heads, dim]``."""
    gate = gate.reshape(attn_output.shape)
    out = (attn_output.float() * torch.sigmoid(gate.float())).to(attn_output.dtype)
    if inplace:
        attn_output.copy_(out)
        return attn_output
    return out


def rms_norm_gated(module, x: torch.Tensor, z: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Forward of FLA's ``layernorm_gated.RMSNorm``: ``norm(x) * silu(z)`` (norm before gate).

    Bound as the module's ``forward``; reads ``weight``, ``bias``, ``eps``, ``group_size``,
    ``norm_before_gate`` and ``activation`` from it.
    """
    if module.activation not in ("swish", "silu", "sigmoid"):
        raise NotImplementedError(f"gated RMSNorm activation {module.activation!r}")
    shape = x.shape
    xf = x.reshape(-1, shape[-1]).float()
    zf = None if z is None else z.reshape(-1, shape[-1]).float()

    def gate(t: torch.Tensor) -> torch.Tensor:
        return t * (torch.sigmoid(zf) if module.activation == "sigmoid" else F.silu(zf))

    if zf is not None and not module.norm_before_gate:
        xf = gate(xf)
    group = module.group_size or shape[-1]
    grouped = xf.view(xf.shape[0], -1, group)
    rstd = torch.rsqrt(grouped.pow(2).mean(-1, keepdim=True) + module.eps)
    y = (grouped * rstd).view_as(xf) * module.weight.float()
    if module.bias is not None:
        y = y + module.bias.float()
    if zf is not None and module.norm_before_gate:
        y = gate(y)
    return y.to(x.dtype).view(shape)


# --------------------------------------------------------------------------- conv1d


def _activate(y: torch.Tensor, activation) -> torch.Tensor:
    if activation in (True, "silu", "swish"):
        return F.silu(y)
    if activation in (None, False):
        return y
    raise ValueError(f"unsupported conv activation {activation!r}")


def _depthwise_conv(window: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
    """Valid depthwise conv of ``window [dim, L + width - 1]`` with ``weight [dim, width]``, fp32.

    Written as unfold + weighted sum: ``F.conv1d(groups=dim)`` takes ~20 ms per call on CPU
    for these shapes, this ~20 us.
    """
    width = weight.shape[1]
    y = (window.unfold(-1, width, 1) * weight.float().unsqueeze(1)).sum(-1)
    return y if bias is None else y + bias.float().unsqueeze(-1)


def causal_conv1d_fn(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: Optional[torch.Tensor],
    conv_states: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens_cpu: Sequence[int],
    cache_indices: Optional[torch.Tensor] = None,
    has_initial_state: Optional[torch.Tensor] = None,
    activation: Optional[str] = "silu",
    pad_slot_id: int = PAD_SLOT_ID,
    **_unused,
) -> torch.Tensor:
    """Varlen causal depthwise conv over ``x [dim, total_tokens]``; updates ``conv_states`` in place.

    Sequence ``i`` starts from ``conv_states[cache_indices[i]]`` when ``has_initial_state[i]``
    (zeros otherwise) and leaves the last ``width - 1`` inputs of (state ++ x) there.
    """
    width = weight.shape[1]
    out = torch.empty_like(x)
    starts = query_start_loc.tolist()
    slots = cache_indices.tolist() if cache_indices is not None else list(range(len(starts) - 1))
    has_init = (
        has_initial_state.tolist() if has_initial_state is not None else [False] * len(slots)
    )
    for i, (start, end) in enumerate(zip(starts[:-1], starts[1:])):
        slot = slots[i]
        if slot == pad_slot_id:
            continue
        if has_init[i]:
            history = conv_states[slot, :, -(width - 1):].float()
        else:
            history = x.new_zeros(x.shape[0], width - 1, dtype=torch.float32)
        window = torch.cat([history, x[:, start:end].float()], dim=-1)
        y = _depthwise_conv(window, weight, bias)
        out[:, start:end] = _activate(y, activation).to(x.dtype)
        conv_states[slot, :, -(width - 1):] = window[:, -(width - 1):].to(conv_states.dtype)
    return out


def causal_conv1d_update(
    x: torch.Tensor,
    conv_state: torch.Tensor,
    weight: torch.Tensor,
    bias: Optional[torch.Tensor] = None,
    activation=None,
    cache_seqlens: Optional[torch.Tensor] = None,
    conv_state_indices: Optional[torch.Tensor] = None,
    num_accept_tokens: Optional[torch.Tensor] = None,
    intermediate_conv_window: Optional[torch.Tensor] = None,
    intermediate_state_indices: Optional[torch.Tensor] = None,
    retrieve_next_token: Optional[torch.Tensor] = None,
    retrieve_next_sibling: Optional[torch.Tensor] = None,
    retrieve_parent_token: Optional[torch.Tensor] = None,
    pad_slot_id: int = PAD_SLOT_ID,
    **_unused,
) -> torch.Tensor:
    """Decode step of the causal conv: ``x [batch, dim]`` or ``[batch, dim, seqlen]``."""
    _no_gpu_only(
        cache_seqlens=cache_seqlens,
        num_accept_tokens=num_accept_tokens,
        intermediate_conv_window=intermediate_conv_window,
        intermediate_state_indices=intermediate_state_indices,
        retrieve_next_token=retrieve_next_token,
        retrieve_next_sibling=retrieve_next_sibling,
        retrieve_parent_token=retrieve_parent_token,
    )
    squeeze = x.dim() == 2
    xs = x.unsqueeze(-1) if squeeze else x
    slots = conv_state_indices.tolist() if conv_state_indices is not None else list(range(xs.shape[0]))
    out = _conv_update_rows(xs, conv_state, weight, bias, activation, slots, pad_slot_id)
    return out.squeeze(-1) if squeeze else out


def _conv_update_rows(xs, conv_state, weight, bias, activation, slots, pad_slot_id: int) -> torch.Tensor:
    """``causal_conv1d_update``'s rows: each row's window = its slot's state + its new tokens;
    the slot keeps the window's last ``state_len`` columns."""
    seqlen, width, state_len = xs.shape[-1], weight.shape[1], conv_state.shape[-1]
    out = torch.empty_like(xs)
    for i, slot in enumerate(slots):
        if slot == pad_slot_id:
            continue
        window = torch.cat([conv_state[slot].float(), xs[i].float()], dim=-1)
        y = _depthwise_conv(window[:, -(width - 1 + seqlen):], weight, bias)
        out[i] = _activate(y, activation).to(xs.dtype)
        conv_state[slot] = window[:, -state_len:].to(conv_state.dtype)
    return out


# --------------------------------------------------------------------------- gated delta rule


def fused_gdn_gating(
    A_log: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    dt_bias: torch.Tensor,
    beta: float = 1.0,
    threshold: float = 20.0,
):
    """``g = -exp(A_log) * softplus(a + dt_bias)`` and ``beta = sigmoid(b)``, both ``[1, T, H]`` fp32."""
    g = _log_decay(A_log, a, dt_bias, beta, threshold)
    # The Triton kernel rounds beta to b's dtype before storing it into an fp32 tensor.
    beta_out = torch.sigmoid(b.float()).to(b.dtype).float()
    return g.unsqueeze(0), beta_out.unsqueeze(0)


def _log_decay(A_log, a, dt_bias, beta: float, threshold: float) -> torch.Tensor:
    """The per-token, per-head log decay ``-exp(A_log) * softplus(a + dt_bias)``, fp32."""
    return -torch.exp(A_log.float()) * F.softplus(a.float() + dt_bias.float(), beta=beta, threshold=threshold)


def _l2norm_fp32(x: torch.Tensor) -> torch.Tensor:
    xf = x.float()
    return xf / torch.sqrt((xf * xf).sum(-1, keepdim=True) + L2NORM_EPS)


def _l2norm(x: torch.Tensor) -> torch.Tensor:
    """FLA's l2norm: fp32 math, result stored back in the input dtype."""
    return _l2norm_fp32(x).to(x.dtype)


def _expand_heads(t: torch.Tensor, num_v_heads: int) -> torch.Tensor:
    """Query/key heads ``[..., H, K]`` -> one per value head (value head hv uses hv // (HV // H))."""
    return t.repeat_interleave(num_v_heads // t.shape[-2], dim=-2)


def gdn_chunk_forward(q, k, v, g, beta, state, scale: float, chunk: int = GDN_CHUNK, keep_at=None):
    """Gated delta rule over one sequence, in fp32, on a ``chunk``-token grid from its first token.

    q, k: ``[T, HV, K]`` (already l2-normalised and expanded), v: ``[T, HV, V]``,
    g, beta: ``[T, HV]``, state: ``[HV, K, V]``. Returns ``(o [T, HV, V], state [HV, K, V])``.
    ``keep_at(offset, state)``, when given, is called at each chunk boundary strictly inside the
    sequence with the fp32 state there: the bits a forward ending at that offset returns.

    Per token (the recurrence this solves chunk-wise)::

        S_t = a_t S_{t-1} + k_t u_t^T,   u_t = beta_t (v_t - (a_t S_{t-1})^T k_t),   o_t = S_t^T q_t

    with a_t = exp(g_t). Inside a chunk, with gc = cumsum(g) and G[i, j] = exp(gc_i - gc_j),
    the u's solve the unit lower-triangular system
    ``(I + tril(beta_i G_ij k_i.k_j, -1)) U = beta (V - exp(gc) K S0)``.
    """
    q, k, v, g, beta = (t.float() for t in (q, k, v, g, beta))
    state = state.float()
    seq_len = q.shape[0]
    out = torch.empty_like(v)
    q = q * scale
    for start in range(0, seq_len, chunk):
        if keep_at is not None and start:
            keep_at(start, state)
        end = min(start + chunk, seq_len)
        qc, kc, vc = (t[start:end].transpose(0, 1) for t in (q, k, v))  # [HV, C, *]
        gc = g[start:end].transpose(0, 1).cumsum(-1)  # [HV, C]
        bc = beta[start:end].transpose(0, 1)  # [HV, C]
        size = end - start
        causal = torch.ones(size, size, dtype=torch.bool).tril()
        log_decay = (gc.unsqueeze(-1) - gc.unsqueeze(-2)).masked_fill(~causal, float("-inf"))
        decay = log_decay.exp()  # [HV, C, C], zero above the diagonal
        lower = (bc.unsqueeze(-1) * decay * (kc @ kc.transpose(-1, -2))).tril(-1)
        system = lower + torch.eye(size)
        rhs = bc.unsqueeze(-1) * (vc - gc.exp().unsqueeze(-1) * (kc @ state))
        u = torch.linalg.solve_triangular(system, rhs, upper=False, unitriangular=True)
        inter = gc.exp().unsqueeze(-1) * (qc @ state)
        intra = (decay * (qc @ kc.transpose(-1, -2))) @ u
        out[start:end] = (inter + intra).transpose(0, 1)
        tail = (gc[:, -1:] - gc).exp().unsqueeze(-1)  # [HV, C, 1]
        state = gc[:, -1].exp()[:, None, None] * state + (kc * tail).transpose(-1, -2) @ u
    return out, state


def gdn_recurrent_step(q, k, v, g, beta, state, scale: float):
    """One token of the gated delta rule; q, k ``[HV, K]``, v ``[HV, V]``, state ``[HV, K, V]``."""
    state = state * g.exp()[:, None, None]
    delta = beta[:, None] * (v - torch.einsum("hkv,hk->hv", state, k))
    state = state + k[:, :, None] * delta[:, None, :]
    return torch.einsum("hkv,hk->hv", state, q * scale), state


def chunk_gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: Optional[float] = None,
    initial_state: Optional[torch.Tensor] = None,
    initial_state_indices: Optional[torch.Tensor] = None,
    cu_seqlens: Optional[torch.Tensor] = None,
    head_first: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    keeps=(),
):
    """Varlen GDN prefill; reads and writes ``initial_state[initial_state_indices[i]]`` in place.

    Returns ``(o, None, None)``: there are no per-chunk states ``h``, so SGLang's extra_buffer
    tracking (which copies from ``h``) is unavailable on CPU; the platform forces no_buffer.
    """
    if head_first:
        raise NotImplementedError("head_first layout")
    if initial_state is None or initial_state_indices is None or cu_seqlens is None:
        raise NotImplementedError("CPU GDN prefill needs a state pool, slot indices and cu_seqlens")
    if scale is None:
        scale = k.shape[-1] ** -0.5
    if use_qk_l2norm_in_kernel:
        q, k = _l2norm(q), _l2norm(k)
    num_v_heads = v.shape[-2]
    q, k = _expand_heads(q[0], num_v_heads), _expand_heads(k[0], num_v_heads)
    out = _prefill_sequences(q, k, v, g, beta, scale, initial_state, initial_state_indices, cu_seqlens, keeps)
    return out, None, None


def chunk_gated_delta_rule_keeping(q, k, v, g, beta, *, initial_state, initial_state_indices, cu_seqlens, keeps,
                                   scale: Optional[float] = None, head_first: bool = False,
                                   use_qk_l2norm_in_kernel: bool = False):
    """``chunk_gated_delta_rule`` that also writes, for each ``patches.state_keeps.StateKeep``, the
    fp32 state after ``offset`` tokens of its sequence into ``initial_state[slot]`` (the state a
    forward ending there would write: the same loop, read at a chunk boundary)."""
    state_keeps.check(keeps, cu_seqlens.tolist(), GDN_CHUNK)
    return chunk_gated_delta_rule(q, k, v, g, beta, scale, initial_state, initial_state_indices, cu_seqlens,
                                  head_first, use_qk_l2norm_in_kernel, keeps=tuple(keeps))


def _prefill_sequences(q, k, v, g, beta, scale: float, states, slots, cu_seqlens, keeps=()) -> torch.Tensor:
    """``chunk_gated_delta_rule``'s sequences, one after the other: each reads its slot's state
    and writes the final state back (pool layout ``[HV, V, K]``), and the states ``keeps`` asks
    for at its chunk boundaries into theirs."""
    out = torch.empty_like(v)
    bounds = cu_seqlens.tolist()
    for i, slot in enumerate(slots.tolist()):
        start, end = bounds[i], bounds[i + 1]
        if slot == PAD_SLOT_ID or end == start:
            continue
        state = states[slot].transpose(-1, -2)  # [HV, V, K] -> [HV, K, V]
        wanted = state_keeps.for_sequence(keeps, i)

        def keep_at(offset, kept, wanted=wanted):
            if offset in wanted:
                states[wanted[offset]] = kept.transpose(-1, -2).to(states.dtype)

        o, state = gdn_chunk_forward(
            q[start:end], k[start:end], v[0, start:end], g[0, start:end], beta[0, start:end],
            state, scale, keep_at=keep_at if wanted else None,
        )
        out[0, start:end] = o.to(v.dtype)
        states[slot] = state.transpose(-1, -2).to(states.dtype)
    return out


def fused_sigmoid_gating_delta_rule_update(
    A_log: torch.Tensor,
    a: torch.Tensor,
    dt_bias: torch.Tensor,
    softplus_beta: float,
    softplus_threshold: float,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    b: torch.Tensor,
    initial_state_source: torch.Tensor,
    initial_state_indices: torch.Tensor,
    scale: Optional[float] = None,
    use_qk_l2norm_in_kernel: bool = False,
    cu_seqlens: Optional[torch.Tensor] = None,
    is_kda: bool = False,
    disable_state_update: bool = False,
    intermediate_states_buffer: Optional[torch.Tensor] = None,
    intermediate_state_indices: Optional[torch.Tensor] = None,
    cache_steps: Optional[int] = None,
    retrieve_parent_token: Optional[torch.Tensor] = None,
    **_unused,
) -> torch.Tensor:
    """GDN decode: gating + token-by-token delta rule, state pool updated in place.

    q, k ``[1, T, H, K]``, v ``[1, T, HV, V]``, a, b ``[T, HV]``; returns ``[1, T, HV, V]``.
    """
    _no_gpu_only(intermediate_states_buffer=intermediate_states_buffer, retrieve_parent_token=retrieve_parent_token)
    if is_kda or disable_state_update:
        raise NotImplementedError("KDA / verify mode of the fused recurrent kernel")
    if cu_seqlens is None:
        raise NotImplementedError("CPU GDN decode needs cu_seqlens")
    scale = k.shape[-1] ** -0.5 if scale is None else scale
    gating = (A_log, dt_bias, softplus_beta, softplus_threshold)
    return _decode_sequences(q, k, v, a, b, gating, scale, use_qk_l2norm_in_kernel, initial_state_source,
                             initial_state_indices, cu_seqlens)


def _decode_sequences(q, k, v, a, b, gating, scale: float, l2norm: bool, states, slots, cu_seqlens) -> torch.Tensor:
    """The fused decode kernel's sequences: token by token from each slot's state (fp32), the
    final state written back in the pool's dtype; rows of a negative slot stay zero.

    Everything, the gating included, is computed on one sequence's rows at a time. Why: torch
    runs an elementwise op's vector body over whole SIMD chunks of the flattened tensor and a
    scalar loop over the tail, and the two round ``softplus``/``sigmoid`` differently. Over the
    batch's ``[T, HV]`` gates a sequence's row would land in the body or the tail depending on
    its neighbours, so a request decoded beside others would get other bits than alone
    (``exact`` promises the same bits, ``patches/row_invariance.py``).
    """
    A_log, dt_bias, softplus_beta, softplus_threshold = gating
    out = torch.zeros_like(v)
    bounds = cu_seqlens.tolist()
    for i, slot in enumerate(slots.tolist()):
        if slot < 0:
            continue
        rows = slice(bounds[i], bounds[i + 1])
        g = _log_decay(A_log, a[rows], dt_bias, softplus_beta, softplus_threshold)
        beta = torch.sigmoid(b[rows].float())  # the fused kernel keeps beta in fp32 (no storage rounding)
        # The fused kernel normalises q and k in fp32 registers: no rounding to the input dtype.
        qf, kf = (_expand_heads(t[0, rows].float(), v.shape[-2]) for t in (q, k))
        if l2norm:
            qf, kf = _l2norm_fp32(qf), _l2norm_fp32(kf)
        vf = v[0, rows].float()
        state = states[slot].float().transpose(-1, -2)
        for t in range(rows.stop - rows.start):
            o, state = gdn_recurrent_step(qf[t], kf[t], vf[t], g[t], beta[t], state, scale)
            out[0, rows.start + t] = o.to(v.dtype)
        states[slot] = state.transpose(-1, -2).to(states.dtype)
    return out
