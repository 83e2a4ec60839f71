"""Start-up self-test of the premise of exact's kept rule (``docs/exact.md`` §5.13, §6): SGLang's
GDN chunk kernel and its unified (deterministic) extend attention give a row the same bits whether
its sequence is read in one forward or in forwards split on the 64-token grid.

On CPU the premise is shown by the kernel tier (``tests/kernels``), which runs these same kernels
under the Triton interpreter. What the interpreter cannot show is a GPU's own rounding (tensor-core
fragment order, fast math, timing-driven autotuning), so a CUDA server checks it where it serves:
:func:`split_invariance_failures` runs split and unsplit forwards of both kernels on random data at
the served dtype, on the given device, and names each kernel whose split forward is not
bit-identical; a server must not serve the kept rule when the answer is not empty. A third check,
``gdn_keeping``, is the premise of keeping states inside a forward (``keeps=inside``;
``patches/gdn_keeps_cuda.py``): the keeping forward is SGLang's, bit for bit, and each state it keeps
is the final state of a forward that ended there; its failure refuses ``keeps=inside`` only.

Pure: random inputs in, a verdict out; no server state is read or written, and SGLang's kernel
modules are imported only when a check runs (``kernels=None``), so importing this module costs
nothing. The tier passes its interpreted copies of the same modules as ``kernels``.

``python -m patches.kernel_selftest [--device cuda] [--dtype bfloat16]`` prints one line,
``KERNEL_SELFTEST {json}`` (``grid_failures``: the verdict at the 64-token grid; ``off_grid``: what
a split at 37 and 100 does, which on the interpreter changes the GDN chunk kernel's bits and not
the attention's; asked of the two split kernels only, a keep being on the grid) and exits 1 when the grid verdict names a kernel; ``eval/gpu_check``'s ``kernels``
step runs it.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass
from types import SimpleNamespace
from typing import Sequence

from policy.api import KEEPING_KERNEL

GRID = 64  # the GDN chunk kernel's chunk (sglang.kernels.ops.attention.fla.chunk.CHUNK_SIZE)
GRID_CUTS = (64, 128, 192)  # each alone, then all together
OFF_GRID_CUTS = (37, 100)
GDN_CHUNK = "gdn_chunk"
EXTEND_ATTENTION = "extend_attention"
GDN_KEEPING = KEEPING_KERNEL  # keeps=inside's premise, not the split invariance: refuses keeps=inside only
KERNELS = {
    GDN_CHUNK: "sglang.kernels.ops.attention.fla.chunk.chunk_gated_delta_rule",
    EXTEND_ATTENTION: "sglang.kernels.ops.attention.extend_attention.extend_attention_fwd_unified",
    GDN_KEEPING: "patches.gdn_keeps_cuda.chunk_gated_delta_rule_keeping",
}
SPLIT_KERNELS = (GDN_CHUNK, EXTEND_ATTENTION)  # what a split off the grid is asked of
KEEPING_NEIGHBOUR = GRID + 37  # tokens of the sequence before the kept one (its chunks end ragged)
RESULT_PREFIX = "KERNEL_SELFTEST "


@dataclass(frozen=True)
class Geometry:
    """Per-rank shapes of the test forwards. The defaults are Qwen3.6's head dims (which choose the
    kernels' tiles) with few heads; :meth:`of_model` takes the served model's."""

    tokens: int = 256
    gdn_k_heads: int = 1
    gdn_v_heads: int = 3
    gdn_k_dim: int = 128
    gdn_v_dim: int = 128
    attn_q_heads: int = 6
    attn_kv_heads: int = 1
    attn_head_dim: int = 256

    @classmethod
    def of_model(cls, text_config, tp_size: int = 1, tokens: int = 256) -> "Geometry":
        """The shapes one tensor-parallel rank of a Qwen3.5/3.6-style hybrid model runs."""
        c = text_config
        return cls(tokens=tokens,
                   gdn_k_heads=max(1, c.linear_num_key_heads // tp_size),
                   gdn_v_heads=max(1, c.linear_num_value_heads // tp_size),
                   gdn_k_dim=c.linear_key_head_dim, gdn_v_dim=c.linear_value_head_dim,
                   attn_q_heads=max(1, c.num_attention_heads // tp_size),
                   attn_kv_heads=max(1, c.num_key_value_heads // tp_size),
                   attn_head_dim=getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads)


def split_invariance_failures(device="cuda", dtype="bfloat16", *, geometry: Geometry = Geometry(),
                              cuts: Sequence[int] = GRID_CUTS, seed: int = 0, kernels=None,
                              checked: Sequence[str] = tuple(KERNELS)) -> dict[str, str]:
    """``{kernel: what differed}`` for each kernel of ``checked`` (names of :data:`KERNELS`) whose
    forwards split at ``cuts`` (each cut alone, then all of them) are not bit-identical to one
    unsplit forward: the outputs, and for the GDN kernel the final recurrent state too; and, for
    ``gdn_keeping``, when keeping the states at the cuts on the grid inside one forward
    (:func:`gdn_keeping_difference`) is not exact. Empty when all hold. ``dtype``: a torch dtype or
    its name; in fp32 ``gdn_keeping`` has nothing to check (SGLang's chunk wrapper, which the GDN
    extend calls, refuses fp32 inputs). ``kernels``: a namespace with the modules ``chunk``,
    ``extend_attention`` and ``keeping`` (``patches.gdn_keeps_cuda``); None imports SGLang's and ours."""
    import torch

    kernels = kernels or sglang_kernels()
    dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
    generator = torch.Generator(device=device).manual_seed(seed)
    splits = [(cut,) for cut in cuts] + ([tuple(cuts)] if len(cuts) > 1 else [])
    keep_offsets = [cut for cut in cuts if cut % GRID == 0 and 0 < cut < geometry.tokens]
    keeping = GDN_KEEPING in checked and keep_offsets and dtype != torch.float32
    reads = {}
    if GDN_CHUNK in checked or keeping:
        gdn = gdn_inputs(geometry, geometry.tokens, dtype, device, generator)
    if GDN_CHUNK in checked:
        reads[GDN_CHUNK] = (lambda split: gdn_chunk_pieces(kernels.chunk, gdn, split, geometry),
                            ("output", "final state"))
    if EXTEND_ATTENTION in checked:
        q, k_pool, v_pool = attention_inputs(geometry, geometry.tokens, dtype, device, generator)
        slots = list(range(geometry.tokens))
        reads[EXTEND_ATTENTION] = (lambda split: (extend_pieces(kernels.extend_attention, q, slots, split, k_pool,
                                                                v_pool),), ("output",))
    failures = {}
    for name, (read, parts) in reads.items():
        whole = read(())
        for split in splits:
            problem = difference(whole, read(split), parts)
            if problem:
                failures[name] = f"split at {', '.join(map(str, split))}: {problem}"
                break
    if keeping:
        problem = gdn_keeping_difference(kernels, gdn, keep_offsets, geometry)
        if problem:
            failures[GDN_KEEPING] = problem
    return failures


def gdn_keeping_difference(kernels, inputs, offsets: Sequence[int], geometry: Geometry) -> str:
    """'' when keeping states inside a forward is exact, else what differs first. One forward of two
    sequences (a ragged neighbour, then ``inputs``), with keeps of ``inputs``' state at ``offsets``:
    its outputs, ``h`` and final states are SGLang's forward's without keeps, and each kept state
    is the final state of SGLang's forward over ``inputs`` cut at its offset."""
    from patches.state_keeps import StateKeep

    device = inputs[0].device
    sequences = [tuple(x[:, :min(KEEPING_NEIGHBOUR, x.shape[1])] for x in inputs), inputs]
    keeps = [StateKeep(1, offset, 2 + i) for i, offset in enumerate(offsets)]
    results, kept = [], None
    for with_keeps in (False, True):
        pool = gdn_state_pool(geometry, 2 + len(keeps), device)
        call = gdn_call(sequences, pool, [0, 1])
        if with_keeps:
            out, _, h = kernels.keeping.chunk_gated_delta_rule_keeping(**call, keeps=keeps)
            kept = pool
        else:
            out, _, h = kernels.chunk.chunk_gated_delta_rule(**call, head_first=False, use_qk_l2norm_in_kernel=True)
        results.append((out, h, pool[:2]))
    problem = difference(*results, ("output", "h", "final states"))
    if problem:
        return f"keeping at {', '.join(map(str, offsets))}: {problem}"
    for keep in keeps:
        ended = gdn_chunk_pieces(kernels.chunk, tuple(x[:, :keep.offset] for x in inputs), (), geometry)[1]
        problem = difference((ended,), (kept[keep.slot],), (f"the state kept at {keep.offset}",))
        if problem:
            return problem
    return ""


def sglang_kernels() -> SimpleNamespace:
    """SGLang's own kernel modules, and ours that keeps states with them (imported here, when a
    check runs)."""
    from sglang.kernels.ops.attention import extend_attention
    from sglang.kernels.ops.attention.fla import chunk

    from patches import gdn_keeps_cuda

    return SimpleNamespace(chunk=chunk, extend_attention=extend_attention, keeping=gdn_keeps_cuda)


def difference(expected, got, names) -> str:
    """'' when each tensor of ``got`` has the bits of its twin in ``expected``, else what differs
    first (by ``names``)."""
    for name, a, b in zip(names, expected, got):
        if a.shape != b.shape or a.dtype != b.dtype:
            return f"{name} is {b.dtype} {tuple(b.shape)}, not {a.dtype} {tuple(a.shape)}"
        differ = int((_bits(a) != _bits(b)).sum())
        if differ:
            worst = (a.float() - b.float()).abs().nan_to_num(float("inf")).max().item()
            return f"{name} differs in {differ} of {a.numel()} values (max |diff| {worst:.3g})"
    return ""


def bit_equal(a, b) -> bool:
    """The same shape, dtype and bits (a NaN equals the same NaN, -0.0 differs from 0.0)."""
    import torch

    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(_bits(a), _bits(b))


def _bits(tensor):
    import torch

    view = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[tensor.element_size()]
    return tensor.contiguous().view(view)


# --- the kernels as SGLang's backends call them ------------------------------------------------


def gdn_inputs(geometry: Geometry, tokens: int, dtype, device, generator) -> tuple:
    """Random ``(q, k, v, g, beta)`` for one sequence, shaped and typed as SGLang's GDN backend
    passes them: q, k ``[1, T, Hk, K]`` and v ``[1, T, Hv, V]`` in ``dtype``, and the gates from
    ``fused_gdn_gating`` in fp32 (``g`` a log decay, ``beta`` in (0, 1))."""
    import torch

    g_ = geometry

    def randn(*shape):
        return torch.randn(*shape, generator=generator, device=device, dtype=torch.float32)

    q = randn(1, tokens, g_.gdn_k_heads, g_.gdn_k_dim).to(dtype)
    k = randn(1, tokens, g_.gdn_k_heads, g_.gdn_k_dim).to(dtype)
    v = randn(1, tokens, g_.gdn_v_heads, g_.gdn_v_dim).to(dtype)
    g = torch.nn.functional.logsigmoid(randn(1, tokens, g_.gdn_v_heads) + 2.0)
    beta = torch.sigmoid(randn(1, tokens, g_.gdn_v_heads))
    return q, k, v, g, beta


def gdn_state_pool(geometry: Geometry, slots: int, device):
    """SGLang's recurrent-state pool layout: fp32 ``[slots, Hv, V, K]``, zero (no prefix)."""
    import torch

    return torch.zeros(slots, geometry.gdn_v_heads, geometry.gdn_v_dim, geometry.gdn_k_dim,
                       dtype=torch.float32, device=device)


def gdn_chunk(chunk, sequences, pool, slots):
    """One forward of the GDN chunk kernel over ``sequences`` (each a ``gdn_inputs`` tuple), packed
    as SGLang's GDN backend packs an extend batch (``cu_seqlens``), each reading and writing its
    state in ``pool[slots[i]]``; q and k L2-normalised in the kernel, as the model runs it. Returns
    each sequence's output. In bf16 this is the backend's own entry point
    (``chunk_gated_delta_rule``); that wrapper refuses fp32, so in fp32 it is the same L2 norm and
    forward (``chunk_gated_delta_rule_fwd``) without the wrapper."""
    import torch

    call = gdn_call(sequences, pool, slots)
    q, k, v, g, beta, cu_seqlens, indices = (call[name] for name in ("q", "k", "v", "g", "beta", "cu_seqlens",
                                                                       "initial_state_indices"))
    lengths = [s[0].shape[1] for s in sequences]
    if q.dtype == torch.float32:
        chunk_indices = chunk.prepare_chunk_indices(cu_seqlens, chunk.CHUNK_SIZE)
        _, out, *_ = chunk.chunk_gated_delta_rule_fwd(
            q=chunk.l2norm_fwd(q), k=chunk.l2norm_fwd(k), v=v, g=g, beta=beta, scale=q.shape[-1] ** -0.5,
            initial_state=pool, initial_state_indices=indices, cu_seqlens=cu_seqlens, chunk_indices=chunk_indices)
    else:
        out, _, _ = chunk.chunk_gated_delta_rule(**call, head_first=False, use_qk_l2norm_in_kernel=True)
    return list(out.split(lengths, dim=1))


def gdn_call(sequences, pool, slots) -> dict:
    """The keyword arguments SGLang's GDN backend passes ``chunk_gated_delta_rule`` for one forward
    over ``sequences`` (packed, ``cu_seqlens``), each in its state slot ``slots[i]`` of ``pool``
    (but ``head_first`` and ``use_qk_l2norm_in_kernel``, which it sets to False and True)."""
    import torch

    q, k, v, g, beta = (torch.cat([s[i] for s in sequences], dim=1) for i in range(5))
    lengths = [s[0].shape[1] for s in sequences]
    cu_seqlens = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.long, device=q.device)
    return dict(q=q, k=k, v=v, g=g, beta=beta, initial_state=pool, cu_seqlens=cu_seqlens,
                initial_state_indices=torch.tensor(slots, dtype=torch.long, device=q.device))


def gdn_chunk_pieces(chunk, inputs, cuts, geometry: Geometry):
    """One sequence read in forwards that end at ``cuts`` (the state carried in its pool slot):
    ``(output, final state)``."""
    import torch

    tokens = inputs[0].shape[1]
    pool = gdn_state_pool(geometry, 1, inputs[0].device)
    outputs = []
    for start, end in zip((0, *cuts), (*cuts, tokens)):
        piece = tuple(x[:, start:end] for x in inputs)
        outputs += gdn_chunk(chunk, [piece], pool, [0])
    return torch.cat(outputs, dim=1), pool[0]


def attention_inputs(geometry: Geometry, tokens: int, dtype, device, generator, pool_slots: int | None = None):
    """Random queries ``[T, Hq, D]`` and a KV pool ``[slots, Hkv, D]`` (keys and values as the
    cache holds them, in ``dtype``)."""
    import torch

    g_ = geometry
    slots = pool_slots or tokens

    def randn(*shape):
        return torch.randn(*shape, generator=generator, device=device, dtype=torch.float32).to(dtype)

    return (randn(tokens, g_.attn_q_heads, g_.attn_head_dim), randn(slots, g_.attn_kv_heads, g_.attn_head_dim),
            randn(slots, g_.attn_kv_heads, g_.attn_head_dim))


def extend_attention(module, sequences, k_pool, v_pool):
    """One call of ``extend_attention_fwd_unified`` (what the Triton backend runs under
    ``--enable-deterministic-inference``) over ``sequences``, each ``(q [n, Hq, D], prefix_slots,
    extend_slots)``: the KV of both already in the pool (the backend writes the extend's KV before
    the call), indices built as ``build_unified_kv_indices`` builds them (prefix, then extend).
    Causal within the extend, full over the prefix. Returns each sequence's output."""
    import torch

    device = k_pool.device
    q = torch.cat([s[0] for s in sequences])
    extend_lens = [s[0].shape[0] for s in sequences]
    prefix_lens = [len(s[1]) for s in sequences]

    def indptr(lengths):
        return torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device=device)

    kv_indices = torch.tensor([slot for s in sequences for slot in (*s[1], *s[2])], dtype=torch.int64, device=device)
    out = torch.empty_like(q)
    module.extend_attention_fwd_unified(
        q, out, k_pool, v_pool, 1.0, 1.0, indptr(extend_lens),
        indptr([p + e for p, e in zip(prefix_lens, extend_lens)]), kv_indices,
        torch.tensor(prefix_lens, dtype=torch.int32, device=device), max(extend_lens),
        sm_scale=q.shape[-1] ** -0.5, is_causal=True)
    return list(out.split(extend_lens))


def extend_pieces(module, q, slots, cuts, k_pool, v_pool):
    """One sequence's queries read in forwards that end at ``cuts``, each later forward reading the
    earlier tokens' KV as its cached prefix: the concatenated output."""
    import torch

    outputs = []
    for start, end in zip((0, *cuts), (*cuts, len(slots))):
        outputs += extend_attention(module, [(q[start:end], list(slots[:start]), list(slots[start:end]))],
                                    k_pool, v_pool)
    return torch.cat(outputs)


# --- command line --------------------------------------------------------------------------------


def model_geometry(model_dir, tp_size: int = 1) -> Geometry:
    """:meth:`Geometry.of_model` of a checkpoint's ``config.json`` (its ``text_config`` if it has one)."""
    from pathlib import Path

    config = json.loads((Path(model_dir) / "config.json").read_text())
    return Geometry.of_model(SimpleNamespace(**config.get("text_config", config)), tp_size)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m patches.kernel_selftest", description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"))
    parser.add_argument("--model", help="a checkpoint directory: test at its shapes (default: Qwen3.6's head dims)")
    parser.add_argument("--tp-size", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    geometry = model_geometry(args.model, args.tp_size) if args.model else Geometry()
    grid = split_invariance_failures(args.device, args.dtype, geometry=geometry, seed=args.seed)
    off_grid = split_invariance_failures(args.device, args.dtype, geometry=geometry, cuts=OFF_GRID_CUTS, seed=args.seed,
                                         checked=SPLIT_KERNELS)
    print(RESULT_PREFIX + json.dumps({"device": args.device, "dtype": args.dtype, "geometry": asdict(geometry),
                                      "grid_cuts": list(GRID_CUTS), "grid_failures": grid,
                                      "off_grid_cuts": list(OFF_GRID_CUTS), "off_grid": off_grid}), flush=True)
    return 1 if grid else 0


if __name__ == "__main__":
    sys.exit(main())
