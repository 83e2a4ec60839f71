"""FLOP formulas, one function each, with their sources (``docs/model.md`` §4, ``docs/eval.md`` §5.7).

Units: FLOPs (multiply-add = 2), per token unless the name says otherwise; PFLOPs = 1e15 FLOPs.

* body FLOPs per token = 2 x (matmul weights of the layers): MLP + attention projections + GDN
  projections. Qwen3.6-27B: 34.23 + 3.36 + 11.12 = 48.70 GFLOPs.
* N_body = all body parameters (the matmul weights plus the small conv, norm, A_log and dt_bias
  parameters): 24,353,201,664 for Qwen3.6-27B; the paper's per-token cost is 2 x N_body.
* attention per query-key pair = 4 x full-attention layers x query heads x head_dim
  (QK^T and PV, 2·D each): 393,216 for Qwen3.6-27B. GQA does not reduce it.
"""

from __future__ import annotations

from dataclasses import MISSING, dataclass, fields
from typing import Mapping


@dataclass(frozen=True)
class Geometry:
    """The shapes the formulas need, as named in a Qwen3.5/3.6 ``text_config``."""

    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    full_attention_interval: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    linear_num_key_heads: int
    linear_key_head_dim: int
    linear_num_value_heads: int
    linear_value_head_dim: int
    linear_conv_kernel_dim: int
    attn_output_gate: bool = True

    @property
    def full_layers(self) -> int:
        return self.num_hidden_layers // self.full_attention_interval

    @property
    def gdn_layers(self) -> int:
        return self.num_hidden_layers - self.full_layers

    @property
    def _key_dim(self) -> int:
        return self.linear_num_key_heads * self.linear_key_head_dim

    @property
    def _value_dim(self) -> int:
        return self.linear_num_value_heads * self.linear_value_head_dim

    # ---- matmul weights per layer

    def mlp_weights(self) -> int:
        return 3 * self.hidden_size * self.intermediate_size  # gate, up, down

    def attention_weights(self) -> int:
        q_out = self.num_attention_heads * self.head_dim * (2 if self.attn_output_gate else 1)  # q and its gate
        kv_out = 2 * self.num_key_value_heads * self.head_dim
        o_in = self.num_attention_heads * self.head_dim
        return self.hidden_size * (q_out + kv_out) + o_in * self.hidden_size

    def gdn_weights(self) -> int:
        qkv = self.hidden_size * (2 * self._key_dim + self._value_dim)
        z = self.hidden_size * self._value_dim
        ba = 2 * self.hidden_size * self.linear_num_value_heads
        out = self._value_dim * self.hidden_size
        return qkv + z + ba + out

    def small_params(self) -> int:
        """Parameters outside the matmuls: conv weights, norms, A_log + dt_bias, GDN output norm."""
        conv = self.gdn_layers * (2 * self._key_dim + self._value_dim) * self.linear_conv_kernel_dim
        norms = 2 * self.num_hidden_layers * self.hidden_size + self.hidden_size
        qk_norms = self.full_layers * 2 * self.head_dim
        gates = self.gdn_layers * 2 * self.linear_num_value_heads
        gdn_norm = self.gdn_layers * self.linear_value_head_dim
        return conv + norms + qk_norms + gates + gdn_norm


def mlp_flops_per_token(g: Geometry) -> int:
    return 2 * g.num_hidden_layers * g.mlp_weights()


def attention_projection_flops_per_token(g: Geometry) -> int:
    return 2 * g.full_layers * g.attention_weights()


def gdn_projection_flops_per_token(g: Geometry) -> int:
    return 2 * g.gdn_layers * g.gdn_weights()


def body_flops_per_token(g: Geometry) -> int:
    """The paper's per-token constant (48.70 GFLOPs for Qwen3.6-27B)."""
    return mlp_flops_per_token(g) + attention_projection_flops_per_token(g) + gdn_projection_flops_per_token(g)


def n_body(g: Geometry) -> int:
    """Body parameters: matmul weights plus the small ones (24,353,201,664 for Qwen3.6-27B)."""
    matmul = g.num_hidden_layers * g.mlp_weights() + g.full_layers * g.attention_weights() + g.gdn_layers * g.gdn_weights()
    return matmul + g.small_params()


def flops_per_pair(g: Geometry) -> int:
    """Attention FLOPs per query-key pair: QK^T and PV, 2·head_dim each, per query head and full layer."""
    return 4 * g.full_layers * g.num_attention_heads * g.head_dim


def prefix_reuse_pflops(read: int, decode: int, body_params: float) -> float:
    """Primary count (docs/eval.md §5.7): 2·N_body·(read + decode) / 1e15."""
    return 2 * body_params * (read + decode) / 1e15


def naive_pflops(prompt: int, decode: int, body_params: float) -> float:
    """No caching at all, an upper bound: 2·N_body·(prompt + decode) / 1e15."""
    return 2 * body_params * (prompt + decode) / 1e15


def attention_pairs(prompt: int, read: int, decode: int) -> float:
    """Query-key pairs of one request, approximate: prefill (P² − (P − F)²)/2 treats the read
    tokens as a suffix over everything before it (exact for radix and exact, an upper bound for
    scr); decode D·P + D²/2."""
    return (prompt**2 - (prompt - read) ** 2) / 2 + decode * prompt + decode**2 / 2


def with_attention_pflops(prompt: int, read: int, decode: int, body_params: float, pair_flops: int) -> float:
    """Primary + attention (labelled approximate in reports)."""
    return prefix_reuse_pflops(read, decode, body_params) + pair_flops * attention_pairs(prompt, read, decode) / 1e15


def geometry_from_config(config: Mapping) -> Geometry:
    """A ``Geometry`` from a model ``config.json`` (its ``text_config`` when present): each field
    read under its own name; a field with a default (``attn_output_gate``) may be absent."""
    text = config.get("text_config", config)
    return Geometry(**{f.name: text[f.name] if f.default is MISSING else text.get(f.name, f.default)
                       for f in fields(Geometry)})


# Qwen3.6-27B text_config shapes (docs/model.md §1): 64 layers, one full-attention layer in four.
QWEN36_27B = Geometry(
    hidden_size=5120, intermediate_size=17408, num_hidden_layers=64, full_attention_interval=4,
    num_attention_heads=24, num_key_value_heads=4, head_dim=256,
    linear_num_key_heads=16, linear_key_head_dim=128, linear_num_value_heads=48, linear_value_head_dim=128,
    linear_conv_kernel_dim=4,
)
