"""SGLang 0.5.16's own rotary kernels as rotators for ``rotary.compare``, built the way the
Qwen3.5/3.6 attention builds its rotary.

* ``SglangFusedGate``: ``fused_qk_gemma_rmsnorm_rope_gate``, what Qwen3.6's gated attention runs on
  CUDA (q/k RMSNorm + RoPE in one Triton kernel, bf16 out), reading the model's fp32 table;
* ``SglangMRope``: ``MRotaryEmbedding.forward`` with [3, n] positions (the Triton MRoPE kernel) on
  CUDA, ``forward_native`` (SGLang's torch path) on CPU, in fp32 and bf16.

With ``rotary.py`` and ``reference.py`` the modules of ``eval/`` that import engine code (here SGLang
itself); the layering rule (``tests/unit/test_import_rules.py``) lists them.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch

from eval.gpu_check.rotary import MAX_POSITION, U16, U32, UNIT, Geometry, dtype_name


class SglangMRope:
    """``MRotaryEmbedding`` as SGLang builds it for Qwen3.6: ``forward`` on CUDA (the Triton MRoPE
    kernel, which casts its table to the key dtype first), ``forward_native`` on CPU (bf16 there:
    the table is built in bf16 and the products and sums are bf16 too). Three equal position streams."""

    def __init__(self, rope, table: torch.Tensor, geometry: Geometry, dtype: torch.dtype, device: str):
        kind = "triton MRoPE" if device == "cuda" else "torch-native MRoPE"
        self.name = f"sglang {kind} {dtype_name(dtype)}"
        self.rope, self.table, self.geometry, self.dtype, self.device = rope, table, geometry, dtype, torch.device(device)
        self.unit = UNIT[dtype]
        # bf16: the table cast to bf16 (u), two products and a difference rounded to bf16 (1 + √2 of u)
        # -> 3.5 u; fp32: the same three roundings in fp32.
        self.rounding = 4 * self.unit if dtype == torch.bfloat16 else 4 * U32

    def rotate(self, raw: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        g = self.geometry
        n = raw.shape[0]
        streams = positions.view(1, -1).expand(3, -1).contiguous()
        query = torch.zeros(n, g.num_q_heads * g.head_dim, dtype=self.dtype, device=self.device)
        key = raw.reshape(n, -1).clone()
        forward = self.rope.forward if self.device.type == "cuda" else self.rope.forward_native
        _, key = forward(streams, query, key)
        return key.view_as(raw)


class SglangFusedGate:
    """``fused_qk_gemma_rmsnorm_rope_gate``: the kernel Qwen3.5/3.6's gated attention runs on CUDA
    (``Qwen3_5*Attention.forward_prepare_cuda_fused``): per-head (1 + w) RMSNorm of q and k, rounded
    to bf16, then NeoX RoPE in fp32 from the model's fp32 table, stored in bf16. Norm weights 0."""

    def __init__(self, rope, geometry: Geometry):
        from sglang.kernels.ops.attention.fused_qk_rmsnorm_rope_gate import fused_qk_gemma_rmsnorm_rope_gate

        self.kernel = fused_qk_gemma_rmsnorm_rope_gate
        self.name = "sglang fused qk-norm+RoPE bf16 (Qwen3.6 on CUDA)"
        self.rope, self.geometry, self.dtype, self.device = rope, geometry, torch.bfloat16, torch.device("cuda")
        self.table = rope.cos_sin_cache  # fp32 on CUDA: the table the model and SCR both read
        self.unit = U16
        self.rounding = U16 + 4 * U32  # fp32 rotation of the bf16 normalised key, one cast
        self.q_weight = torch.zeros(geometry.head_dim, dtype=torch.bfloat16, device=self.device)
        self.k_weight = torch.zeros(geometry.head_dim, dtype=torch.bfloat16, device=self.device)

    def rotate(self, raw: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        g = self.geometry
        n = raw.shape[0]
        q_gate = torch.zeros(n, g.num_q_heads * 2 * g.head_dim, dtype=torch.bfloat16, device=self.device)
        _, key, _ = self.kernel(q_gate, raw.reshape(n, -1).contiguous(), self.q_weight, self.k_weight,
                                self.table, positions.contiguous(), 1e-6, g.num_q_heads, g.num_kv_heads,
                                g.head_dim, g.rotary_dim, has_gate=True)
        return key.view_as(raw)


def sglang_rope(geometry: Geometry, dtype: torch.dtype, device: str):
    """SGLang's rotary embedding for ``geometry``, built the way the Qwen3.5/3.6 attention builds it
    (``get_rope(head_dim, head_dim, max_position_embeddings, rope_theta, neox, rope_parameters,
    partial_rotary_factor)``) under the target device, as SGLang's model loader does."""
    _prepare_sglang(device)
    from sglang.srt.layers.rotary_embedding import get_rope

    with torch.device(device):
        return get_rope(head_size=geometry.head_dim, rotary_dim=geometry.head_dim,
                        max_position=geometry.max_position_embeddings, base=geometry.rope_theta,
                        is_neox_style=True, rope_scaling=geometry.rope_parameters(), dtype=dtype,
                        partial_rotary_factor=geometry.partial_rotary_factor)


def _prepare_sglang(device: str) -> None:
    """What building a rotary outside a server needs: a published ``ServerArgs`` (the rotary
    reads two fields), and on CPU the overlay's stand-in for the vllm module SGLang imports there."""
    if device == "cpu":
        from patches.cpu.platform import _install_vllm_rotary_module

        _install_vllm_rotary_module()
    from sglang.srt.runtime_context import get_context

    try:
        get_context().server_args
    except ValueError:  # none published in this process
        get_context().override_server_args().install()


def sglang_rotators(geometry: Geometry, device: str) -> tuple[list, dict]:
    """The SGLang rotators for ``device`` and the facts of the production rotary (bf16 model dtype)."""
    production = sglang_rope(geometry, torch.bfloat16, device)
    fp32 = sglang_rope(geometry, torch.float32, device)
    facts = rotary_facts(production, geometry)
    fp32_table = fp32.cos_sin_cache  # never cast: only the fp32 forwards read it
    if device == "cuda":
        # The MRoPE forward casts its instance's table to bf16: give it its own instance, so the
        # production one (read by the fused kernel and the re-rotation) stays as the model holds it.
        bf16_mrope = _fresh_rope(geometry, torch.bfloat16, device)
        rotators = [SglangFusedGate(production, geometry),
                    SglangMRope(fp32, fp32_table, geometry, torch.float32, device),
                    SglangMRope(bf16_mrope, fp32_table, geometry, torch.bfloat16, device)]
    else:
        rotators = [SglangMRope(fp32, fp32_table, geometry, torch.float32, device),
                    SglangMRope(production, fp32_table, geometry, torch.bfloat16, device)]
    return rotators, facts


def _fresh_rope(geometry: Geometry, dtype: torch.dtype, device: str):
    """A second instance (``get_rope`` caches one per configuration)."""
    from sglang.srt.layers.rotary_embedding import MRotaryEmbedding

    with torch.device(device):
        return MRotaryEmbedding(geometry.head_dim, geometry.rotary_dim, geometry.max_position_embeddings,
                                geometry.rope_theta, True, dtype, mrope_section=list(geometry.mrope_section),
                                mrope_interleaved=geometry.mrope_interleaved)


def rotary_facts(rope, geometry: Geometry) -> dict:
    """What the SCR start-up check reads off the model's rotary, and its verdict
    (``patches.rope.rotary_problem``: None means SCR would re-rotate with this table)."""
    from patches.rope import expected_text_rotary, rotary_problem

    config = SimpleNamespace(head_dim=geometry.head_dim, hidden_size=5120, num_attention_heads=geometry.num_q_heads,
                             rope_parameters=geometry.rope_parameters())
    expected_dim, expected_base = expected_text_rotary(config)
    table = rope.cos_sin_cache
    problem = rotary_problem(rotary_dim=rope.rotary_dim, base=float(rope.base), table_width=table.shape[-1],
                             table_rows=table.shape[0], neox=rope.is_neox_style, expected_dim=expected_dim,
                             expected_base=expected_base, context_len=MAX_POSITION)
    return {"class": type(rope).__name__, "rotary_dim": rope.rotary_dim, "base": float(rope.base),
            "mrope_section": list(getattr(rope, "mrope_section", []) or []),
            "mrope_interleaved": bool(getattr(rope, "mrope_interleaved", False)),
            "table_shape": list(table.shape), "table_dtype": str(table.dtype).replace("torch.", ""),
            "scr_gate_problem": problem}
