"""The GDN layer's side of states kept inside a forward (``patches/state_keeps.py``).

Two AROUND hooks, both idle unless the running forward has keeps (``state_keeps.pending()``):

* ``GDNAttnBackend.forward_extend``: before the layer runs, the conv window at each keep point is
  copied from the layer's input rows (``mixed_qkv``, ``[tokens, dim]``) into the keep's slot of
  the layer's conv pool: the last ``width - 1`` inputs before the point, which is what the conv
  kernel leaves in a sequence's slot when its forward ends there (a copy, in the pool's dtype).
* ``TritonGDNKernel.extend`` (the prefill kernel call): runs ``keeping``, a
  ``chunk_gated_delta_rule`` that also writes the fp32 state at each keep point into its slot
  (CPU: ``patches.cpu.kernels.chunk_gated_delta_rule_keeping``; CUDA:
  ``patches.gdn_keeps_cuda.chunk_gated_delta_rule_keeping``).

Speculative verify and a strided (page-major) state pool are refused while keeps are pending:
neither is served by exact (``ExactPolicy.server_settings``).
"""

from __future__ import annotations

import torch

from patches import state_keeps

FORWARD_EXTEND = "sglang.srt.layers.attention.linear.gdn_backend.GDNAttnBackend.forward_extend"
KERNEL_EXTEND = "sglang.srt.layers.attention.linear.kernels.gdn_triton.TritonGDNKernel.extend"


def keep_conv_windows(mixed_qkv: torch.Tensor, conv_states: torch.Tensor, starts, keeps) -> None:
    """``conv_states[slot] = mixed_qkv[start + offset - w : start + offset].T`` for each keep
    (``w = conv_states.shape[-1]``, the window the conv kernel keeps; ``starts``: the forward's
    ``query_start_loc`` as ints)."""
    width = conv_states.shape[-1]
    for keep in keeps:
        end = starts[keep.sequence] + keep.offset
        conv_states[keep.slot] = mixed_qkv[end - width:end].transpose(0, 1).to(conv_states.dtype)


def keeping_prefill(on_cuda: bool):
    """The GDN prefill that also keeps states: SGLang's Triton kernels with an fp32 state write on
    CUDA, the CPU engine's chunk loop elsewhere (imported at the first forward with keeps)."""
    if on_cuda:
        from patches.gdn_keeps_cuda import chunk_gated_delta_rule_keeping
    else:
        from patches.cpu.kernels import chunk_gated_delta_rule_keeping
    return chunk_gated_delta_rule_keeping


def install(register, on_cuda: bool) -> None:
    """Register both hooks (idle until a forward has keeps)."""

    def forward_extend(original, backend, layer, forward_batch, mixed_qkv, a, b, **kwargs):
        keeps = state_keeps.pending()
        if keeps:
            if forward_batch.forward_mode.is_target_verify():
                raise RuntimeError("states kept inside a forward: not under speculative verify")
            starts = state_keeps.forward_starts(backend.forward_metadata.query_start_loc.tolist)
            cache = backend.req_to_token_pool.mamba2_layer_cache(layer.layer_id)
            if not cache.conv[0].is_contiguous() or not cache.temporal.is_contiguous():
                raise RuntimeError("states kept inside a forward: the state pool is not contiguous")
            keep_conv_windows(mixed_qkv, cache.conv[0], starts, keeps)
        return original(backend, layer, forward_batch, mixed_qkv, a, b, **kwargs)

    def kernel_extend(original, kernel, q, k, v, g, beta, *, ssm_states, cache_indices, query_start_loc, **kwargs):
        keeps = state_keeps.pending()
        if not keeps:
            return original(kernel, q, k, v, g, beta, ssm_states=ssm_states, cache_indices=cache_indices,
                            query_start_loc=query_start_loc, **kwargs)
        return keeping_prefill(on_cuda)(q=q, k=k, v=v, g=g, beta=beta, initial_state=ssm_states,
                                        initial_state_indices=cache_indices, cu_seqlens=query_start_loc,
                                        keeps=keeps, head_first=False, use_qk_l2norm_in_kernel=True)

    register(FORWARD_EXTEND, forward_extend, "around")
    register(KERNEL_EXTEND, kernel_extend, "around")
