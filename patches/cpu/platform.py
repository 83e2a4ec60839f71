"""CPU platform support for SGLang 0.5.16: what it takes to serve a Qwen3.5 hybrid with ``--device cpu``.

Active only when CUDA is absent (``patches.plugin`` decides). SGLang's own CPU route
(``SGLANG_USE_CPU_ENGINE=1``) needs a CPU build of sgl-kernel that no registry ships, so this
uses SGLang's *generic* device path and fills its gaps (``docs/cpu.md`` §3,
``docs/cpu.md`` §4):

| gap on the generic path                                | what this module does                                   |
|--------------------------------------------------------|---------------------------------------------------------|
| Triton kernels on the GDN path (no CPU backend)        | REPLACE each with its pure-torch twin (``kernels.py``)  |
| ``from vllm._custom_ops import rotary_embedding``      | a module whose function raises if ever called: on CPU   |
|                                                        | RotaryEmbedding dispatches to ``forward_native``        |
| fused mamba slot copy (Triton)                         | ``SGLANG_DISABLE_FUSED_MAMBA_SLOT_OPS=1``               |
| ``pin_memory=True`` with no accelerator                | dropped by the tensor factories and ``Tensor.pin_memory``|
| defaults that assume CUDA (device, attention backend,  | a BEFORE hook on ``ServerArgs.__post_init__`` fills     |
| cuda graphs, extra_buffer mamba cache, multimodal)     | CPU values for settings the user left unset             |
| ``torchvision`` imported by ``import sglang``          | ``patches.cpu.preimport`` (must run before sglang)      |

Not a gap, a cost: SGLang starts its scheduler and detokenizer processes with ``spawn`` (needed
with CUDA), and each spawned process imports SGLang again (one server's start-up here: 23.0 s
under spawn, 17.5 s under fork; ``docs/cpu.md`` §4). Without CUDA nothing forbids ``fork``, so an
AFTER hook on the function that sets the start method sets ``fork`` instead
(``CACHE_POLICY_CPU_START_METHOD=spawn`` keeps SGLang's). At that point the launcher runs one
Python thread and has opened no ZMQ socket (SGLang makes its sockets after the children start)
and no CUDA context; the children inherit the imported modules and this overlay (they do not
print its installed line again) and build their own sockets, pools and policy objects as under
spawn.

extra_buffer (SGLang's default mamba strategy) copies recurrent states out of the GDN kernel's
per-chunk ``h`` tensor, which the torch kernels do not produce; it is refused on CPU with a
message, and ``auto`` resolves to no_buffer (exact copies at forward ends).
"""

from __future__ import annotations

import logging
import os
import sys
import types

import torch

from patches.cpu import kernels

logger = logging.getLogger(__name__)

# (dotted target, replacement): every Triton kernel a Qwen3.5 hybrid forward reaches on CPU.
KERNEL_REPLACEMENTS: tuple[tuple[str, object], ...] = (
    ("sglang.kernels.ops.attention.fla.chunk.chunk_gated_delta_rule", kernels.chunk_gated_delta_rule),
    (
        "sglang.kernels.ops.attention.fla.fused_sigmoid_gating_recurrent.fused_sigmoid_gating_delta_rule_update",
        kernels.fused_sigmoid_gating_delta_rule_update,
    ),
    ("sglang.kernels.ops.attention.fla.fused_gdn_gating.fused_gdn_gating", kernels.fused_gdn_gating),
    ("sglang.kernels.ops.mamba.causal_conv1d_triton.causal_conv1d_fn", kernels.causal_conv1d_fn),
    ("sglang.kernels.ops.mamba.causal_conv1d_triton.causal_conv1d_update", kernels.causal_conv1d_update),
    (
        "sglang.jit_kernel.triton.gdn_fused_proj.fused_qkvzba_split_reshape_cat_contiguous",
        kernels.fused_qkvzba_split_reshape_cat_contiguous,
    ),
    ("sglang.kernels.ops.layernorm.elementwise.fused_sigmoid_mul", kernels.fused_sigmoid_mul),
    ("sglang.kernels.ops.attention.fla.layernorm_gated.RMSNorm.forward", kernels.rms_norm_gated),
)

SERVER_ARGS_POST_INIT = "sglang.srt.server_args.ServerArgs.__post_init__"

# Settings the CPU path needs, applied only where the user left SGLang's default.
# (field, SGLang default, CPU value)
CPU_SERVER_DEFAULTS: tuple[tuple[str, object, object], ...] = (
    ("device", None, "cpu"),
    ("attention_backend", None, "torch_native"),
    ("sampling_backend", None, "pytorch"),
    ("disable_cuda_graph", False, True),
    ("enable_multimodal", None, False),
    ("mamba_radix_cache_strategy", "auto", "no_buffer"),
    # bf16 matmuls on a CPU without native bf16 take ~500x longer than fp32 (3.5 ms vs 6.5 us
    # for a 1x64 @ 64x256 linear here); pass --dtype bfloat16 to serve in bf16 anyway.
    ("dtype", "auto", "float32"),
)

# What the CPU engine does to exact's kept rule (docs/exact.md §5.13): kernel -> why a row's bits
# would depend on where its prefill forward is split on the 64-token grid; the launcher refuses
# cut=kept while this names anything. Empty: under exact the prefill attention runs in 64-position
# tiles from position 0 (patches/cpu/attention.py), the one op that broke it (torch's CPU flash
# attention blocks by query length); every other prefill op is pinned on the grid by
# tests/reference/test_split_invariance.py, and tests/engine/test_exact_kept.py checks warm = cold.
SPLIT_INVARIANCE_FAILURES: dict[str, str] = {}

# Where SGLang sets its multiprocessing start method (``mp.set_start_method("spawn", force=True)``
# at its end), called once by the launcher before any child process starts.
ENGINE_CONFIG = "sglang.srt.entrypoints.engine._set_envs_and_config"
START_METHOD_ENV = "CACHE_POLICY_CPU_START_METHOD"
START_METHODS = ("fork", "spawn")  # the first is the default on CPU

# The recurrent conv window is stored in this dtype (SGLang defaults it to bf16); keeping it
# in the activation dtype makes a state saved at a forward end lossless on CPU, as bf16 is on GPU.
CONV_STATE_DTYPE_ENV = "SGLANG_MAMBA_CONV_DTYPE"


def cuda_available() -> bool:
    return torch.cuda.is_available()


THREADS_BIND_ENV = "SGLANG_CPU_OMP_THREADS_BIND"


def threads_bind(cores, tp_size: int) -> str | None:
    """SGLang's per-rank core binding for ``tp_size`` ranks: ``cores`` split evenly in order, one
    ``a-b`` range (or comma list) per rank, ``|`` between ranks; None for one rank or fewer cores
    than ranks. Without it SGLang's CPU path allows only one rank per NUMA node (docs/tensor_parallel.md §1)."""
    cores = sorted(cores)
    if tp_size < 2 or len(cores) < tp_size:
        return None
    per = len(cores) // tp_size
    groups = [cores[rank * per:(rank + 1) * per] for rank in range(tp_size)]
    return "|".join(f"{g[0]}-{g[-1]}" if g == list(range(g[0], g[-1] + 1)) and len(g) > 1 else ",".join(map(str, g))
                    for g in groups)


def apply_cpu_server_defaults(server_args) -> list[str]:
    """Fill CPU values into unset fields of a ``ServerArgs``; returns what was changed.

    Raises ``ValueError`` for settings the CPU path cannot honour.
    """
    if getattr(server_args, "mamba_radix_cache_strategy", "auto") in ("extra_buffer", "extra_buffer_lazy"):
        raise ValueError(
            "--mamba-radix-cache-strategy extra_buffer is not available on CPU: it snapshots recurrent "
            "states from the Triton GDN kernel's per-chunk states, which the CPU kernels do not "
            "produce. Use no_buffer (the CPU default)."
        )
    changed = []
    for field, upstream_default, cpu_value in CPU_SERVER_DEFAULTS:
        if getattr(server_args, field) == upstream_default:
            setattr(server_args, field, cpu_value)
            changed.append(f"{field}={cpu_value}")
    if server_args.dtype in ("float32", "float") and CONV_STATE_DTYPE_ENV not in os.environ:
        # Inherited by the scheduler processes, which build the pools.
        os.environ[CONV_STATE_DTYPE_ENV] = "float32"
        changed.append(f"{CONV_STATE_DTYPE_ENV}=float32")
    bind = threads_bind(os.sched_getaffinity(0), getattr(server_args, "tp_size", 1) or 1)
    if bind is not None and THREADS_BIND_ENV not in os.environ:
        os.environ[THREADS_BIND_ENV] = bind  # read by every TP scheduler process
        changed.append(f"{THREADS_BIND_ENV}={bind}")
    if server_args.mamba_radix_cache_strategy == "no_buffer" and not server_args.disable_overlap_schedule:
        # SGLang asserts that no_buffer runs without the overlap scheduler.
        server_args.disable_overlap_schedule = True
        changed.append("disable_overlap_schedule=True")
    return changed


def start_method(environ=os.environ) -> str:
    """The start method for SGLang's child processes on CPU, from ``CACHE_POLICY_CPU_START_METHOD``
    (default ``fork``); raises ``ValueError`` naming the variable for any other value."""
    value = environ.get(START_METHOD_ENV, START_METHODS[0])
    if value not in START_METHODS:
        raise ValueError(f"{START_METHOD_ENV}={value!r}: choose one of {', '.join(START_METHODS)}")
    return value


def register_start_method(register, environ=os.environ) -> list[str]:
    """Under ``fork``, the AFTER hook where SGLang sets ``spawn``; under ``spawn``, nothing.
    Returns the targets registered."""
    if start_method(environ) != "fork":
        return []
    register(ENGINE_CONFIG, _fork_after_engine_config, "after")
    return [ENGINE_CONFIG]


def _fork_after_engine_config(result, *args, **kwargs):
    """AFTER ``_set_envs_and_config``: replace the ``spawn`` it set with ``fork``."""
    import multiprocessing

    multiprocessing.set_start_method("fork", force=True)
    return None


def _server_args_before_post_init(self, *args, **kwargs):
    changed = apply_cpu_server_defaults(self)
    if changed:
        logger.info("CPU platform defaults applied: %s", ", ".join(changed))
    return None


def _install_vllm_rotary_module() -> None:
    """Satisfy ``from vllm._custom_ops import rotary_embedding`` in ``RotaryEmbedding.__init__``."""
    if "vllm._custom_ops" in sys.modules:
        return

    def rotary_embedding(*args, **kwargs):
        raise RuntimeError(
            "vllm rotary_embedding was called on CPU; RotaryEmbedding should dispatch to "
            "forward_native here (patches/cpu/platform.py)"
        )

    package = types.ModuleType("vllm")
    package.__path__ = []
    ops = types.ModuleType("vllm._custom_ops")
    ops.rotary_embedding = rotary_embedding
    package._custom_ops = ops
    sys.modules.setdefault("vllm", package)
    sys.modules["vllm._custom_ops"] = ops


def _drop_pin_memory() -> None:
    """Make ``pin_memory=True`` a no-op: pinned host memory needs an accelerator runtime."""
    if getattr(torch, "_cache_policy_pin_memory_dropped", False):
        return

    def factory(original):
        def wrapper(*args, **kwargs):
            kwargs.pop("pin_memory", None)
            return original(*args, **kwargs)

        wrapper.__wrapped__ = original
        return wrapper

    for name in ("tensor", "empty", "zeros", "ones", "full", "as_tensor"):
        setattr(torch, name, factory(getattr(torch, name)))
    torch.Tensor.pin_memory = lambda self, *a, **k: self
    torch._cache_policy_pin_memory_dropped = True


def install(register) -> list[str]:
    """Install CPU support; ``register(target, hook, kind)`` registers a HookRegistry hook.

    Returns the dotted targets registered, for ``patches.verify``. Raises ``ValueError`` for a
    start method other than fork or spawn (``start_method``).
    """
    os.environ["SGLANG_DISABLE_FUSED_MAMBA_SLOT_OPS"] = "1"
    _install_vllm_rotary_module()
    _drop_pin_memory()
    targets = []
    for target, replacement in KERNEL_REPLACEMENTS:
        register(target, replacement, "replace")
        targets.append(target)
    register(SERVER_ARGS_POST_INIT, _server_args_before_post_init, "before")
    targets.append(SERVER_ARGS_POST_INIT)
    from patches.cpu import attention  # long prompts: prefill attention without the O(n^2) query rows

    register(attention.TARGET, attention.around_forward_extend, "around")
    targets.append(attention.TARGET)
    targets += register_start_method(register)
    return targets


def after_hooks_applied() -> None:
    """Settings that are class attributes rather than callables (HookRegistry cannot set them)."""
    from sglang.srt.layers.attention.linear.kernels.gdn_triton import TritonGDNKernel

    # The packed decode path is one fused Triton kernel with no torch twin; the unpacked
    # path reaches fused_sigmoid_gating_delta_rule_update, which is replaced above.
    TritonGDNKernel.supports_packed_decode = False
