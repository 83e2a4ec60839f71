"""SGLang 0.5.16's own Triton kernels, imported under the Triton interpreter so they run on this CPU.

``triton.jit`` decides at decoration time whether a kernel is compiled or interpreted
(``TRITON_INTERPRET=1``), so the kernel modules must be imported with the variable set. The rest of
the process must not see that: the engine tier starts SGLang servers that inherit ``os.environ``, and
the integration tier imports the same modules as compiled kernels. So :func:`load` imports a fresh
copy of each kernel module (and of every kernel module it depends on) with the variable set, then
puts ``sys.modules`` and ``os.environ`` back as they were: the interpreted copies live only in the
namespace it returns.

The interpreter runs SGLang's kernel source unchanged. Five small shims, all here and none in the
venv, stand in for what a CPU process lacks (the first four applied by :func:`load`, the fifth by
:func:`interpreting`):

1. the fla utils' device context (``custom_device_ctx``: ``torch.cpu`` has no ``device`` class), and
   ``layernorm_gated``'s ``device_context`` for the same reason: both become a null context;
2. the autotuner's benchmark (``Autotuner._bench`` times each config with the missing GPU driver's
   benchmarker), on the interpreted kernels' autotuners only: every config ties, so the first of
   each list is chosen, unless a test picks another with :func:`prefer_configs`;
3. module-level aliases of Triton builtins (``fla/op.py``'s ``exp = tl.exp``): the interpreter patches
   the attributes of ``triton.language`` while a kernel runs, not names bound to them earlier, so the
   aliases are rebound to forwarders that look the builtin up at call time;
4. the SM count the persistent (batch-invariant) matmul sizes its grid with (0 on a CPU, which would
   launch no program) and the gated RMSNorm its row blocks with (a CUDA call): an H100's 132;
5. bf16 arithmetic (:class:`_Bf16Arithmetic`): the interpreter stores bf16 as raw 16-bit integers and
   would add and multiply those; operations on two bf16 operands are evaluated on their values.

:func:`interpreting` also interprets ``triton.language``'s own library functions (``tl.sum``,
``tl.sigmoid``, ...) for the duration of a test: Triton fixed their kind when the process first
imported it, usually compiled, and an interpreted kernel cannot call a compiled function.

What the interpreter shows: the kernels' tiling, grids and reduction order, executed with numpy in
the kernels' own dtypes (``tl.dot`` is ``np.matmul``). What it cannot show: a GPU's instruction-level
rounding (MMA fragment order, fast math) and timing-driven autotuning; ``eval/gpu_check`` runs the
self-test (``patches/kernel_selftest.py``) on the real kernels for that.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
from types import SimpleNamespace

# Every module that defines a Triton kernel the tier runs, or one such a module imports: a fresh
# copy of each is made, so no interpreted kernel calls a compiled one.
FRESH_PREFIXES = (
    "sglang.kernels.ops.attention.fla.",
    "sglang.kernels.ops.attention.extend_attention",
    "sglang.kernels.ops.attention.decode_attention",
    "sglang.kernels.ops.attention.prefill_attention",
    "sglang.kernels.ops.attention.fused_qk_rmsnorm_rope_gate",
    "sglang.kernels.ops.attention.rotary_triton",
    "sglang.kernels.ops.mamba.causal_conv1d_triton",
    "sglang.srt.batch_invariant_ops",
    "patches.gdn_keeps_cuda",  # ours: SGLang's GDN chunk forward keeping fp32 states inside it
)

# name in the returned namespace -> module
MODULES = {
    "chunk": "sglang.kernels.ops.attention.fla.chunk",
    "chunk_fwd": "sglang.kernels.ops.attention.fla.chunk_fwd",
    "fused_recurrent": "sglang.kernels.ops.attention.fla.fused_recurrent",
    "sigmoid_gating": "sglang.kernels.ops.attention.fla.fused_sigmoid_gating_recurrent",
    "gdn_gating": "sglang.kernels.ops.attention.fla.fused_gdn_gating",
    "layernorm_gated": "sglang.kernels.ops.attention.fla.layernorm_gated",
    "conv1d": "sglang.kernels.ops.mamba.causal_conv1d_triton",
    "extend_attention": "sglang.kernels.ops.attention.extend_attention",
    "decode_attention": "sglang.kernels.ops.attention.decode_attention",
    "qk_norm_rope": "sglang.kernels.ops.attention.fused_qk_rmsnorm_rope_gate",
    "mrope": "sglang.kernels.ops.attention.rotary_triton",
    "batch_invariant": "sglang.srt.batch_invariant_ops.batch_invariant_ops",
    "keeping": "patches.gdn_keeps_cuda",
}

H100_SM_COUNT = 132
INTERPRET_ENV = "TRITON_INTERPRET"

_PREFERENCE: list = []  # the active prefer_configs predicate, if any


def _fresh(name: str) -> bool:
    return any(name == p.rstrip(".") or name.startswith(p) for p in FRESH_PREFIXES)


def load() -> SimpleNamespace:
    """The kernel modules of :data:`MODULES`, interpreted, with the shims applied. Their kernels run
    only inside :func:`interpreting` (the tier's conftest enters it around every test)."""
    import triton  # noqa: F401  (imported as the rest of the process sees it: compiled)
    import triton.experimental.gluon  # noqa: F401  (imported lazily by a first launch; it checks tl's kind)
    import triton.language  # noqa: F401

    saved_modules = {name: mod for name, mod in sys.modules.items() if _fresh(name)}
    saved_env = os.environ.get(INTERPRET_ENV)
    for name in saved_modules:
        del sys.modules[name]
    os.environ[INTERPRET_ENV] = "1"
    fresh: dict = {}
    try:
        loaded = {key: importlib.import_module(name) for key, name in MODULES.items()}
        fresh = {name: mod for name, mod in sys.modules.items() if _fresh(name)}
    finally:
        if saved_env is None:
            os.environ.pop(INTERPRET_ENV, None)
        else:
            os.environ[INTERPRET_ENV] = saved_env
        for name in [n for n in sys.modules if _fresh(n)]:
            del sys.modules[name]
        sys.modules.update(saved_modules)
        _restore_parent_attributes(fresh, saved_modules)
    _shim(loaded, fresh)
    for mod in fresh.values():  # a helper kernel imported from a module outside FRESH_PREFIXES
        for attr, value in list(vars(mod).items()):
            if _is_compiled(value):
                setattr(mod, attr, _as_interpreted(value))
    return SimpleNamespace(**loaded)


def _restore_parent_attributes(fresh: dict, saved_modules: dict) -> None:
    """An import binds a submodule on its parent package (``from package import module`` reads that
    first): point each parent back at what it had, or at nothing."""
    for name, mod in fresh.items():
        parent, _, child = name.rpartition(".")
        package = sys.modules.get(parent)
        if package is None or getattr(package, child, None) is not mod:
            continue
        if name in saved_modules:
            setattr(package, child, saved_modules[name])
        else:
            delattr(package, child)


def _shim(loaded: dict, fresh: dict) -> None:
    import triton.language as tl

    null_context = lambda *args, **kwargs: contextlib.nullcontext()  # noqa: E731
    fresh["sglang.kernels.ops.attention.fla.utils"].custom_device_ctx = null_context  # shim 1
    loaded["layernorm_gated"].device_context = null_context
    for mod in fresh.values():
        for attr, value in list(vars(mod).items()):
            tuner = autotuner_of(value)
            if tuner is not None:  # shim 2
                tuner._bench = _bench
            builtin = _triton_builtin_name(tl, value)
            if builtin:  # shim 3
                setattr(mod, attr, _forwarder(*builtin))
    loaded["batch_invariant"].get_device_core_count = lambda *args: H100_SM_COUNT  # shim 4
    loaded["layernorm_gated"]._get_sm_count = lambda *args: H100_SM_COUNT


def autotuner_of(kernel):
    """The ``triton.autotune`` object inside ``kernel`` (through ``triton.heuristics``), or None."""
    from triton.runtime.autotuner import Autotuner

    seen = 0
    while kernel is not None and seen < 4:
        if isinstance(kernel, Autotuner):
            return kernel
        kernel, seen = getattr(kernel, "fn", None), seen + 1
    return None


def _triton_builtin_name(tl, value):
    if isinstance(value, type) or not callable(value) or not tl.core.is_builtin(value):
        return None
    for namespace in (tl, tl.math):
        if getattr(namespace, value.__name__, None) is value:
            return namespace, value.__name__
    return None


def _forwarder(namespace, name):
    def forward(*args, **kwargs):
        return getattr(namespace, name)(*args, **kwargs)

    forward.__name__ = name
    return forward


def _bench(*args, config, **meta):
    """Shim 2, in place of ``Autotuner._bench`` on the interpreted kernels only: nothing is run to
    time a config; every config ties (the autotuner keeps the first of its list) unless
    :func:`prefer_configs` is active, whose chosen config times fastest."""
    return [0.0] * 3 if _PREFERENCE and _PREFERENCE[-1](config) else [1.0] * 3


@contextlib.contextmanager
def prefer_configs(kernel, predicate):
    """Within the block, ``kernel``'s autotuner picks the first config for which ``predicate(config)``
    holds (as if it had timed fastest). Its per-key choices are forgotten before and after, so the
    block's calls tune afresh and later calls get the default again."""
    tuner = autotuner_of(kernel)
    assert tuner is not None, f"{kernel} is not autotuned"
    tuner.cache.clear()
    _PREFERENCE.append(predicate)
    try:
        yield tuner
    finally:
        _PREFERENCE.pop()
        tuner.cache.clear()


@contextlib.contextmanager
def interpreting():
    """Within the block, ``triton.language``'s own ``triton.jit`` functions (``tl.sum``, ``tl.max``,
    ``tl.sigmoid``, ``tl.cdiv``, ...) are interpreted too. Triton decided their kind when it was first
    imported, usually compiled (the rest of the process imports it without the interpreter), and an
    interpreted kernel cannot call a compiled function. Restored on exit."""
    import triton.language as tl
    import triton.language.random as tl_random
    import triton.language.standard as tl_standard

    from triton.runtime.interpreter import interpreter_builder

    swapped = []
    for namespace in (tl_standard, tl_random, tl):
        for attr, value in list(vars(namespace).items()):
            if _is_compiled(value):
                swapped.append((namespace, attr, value))
                setattr(namespace, attr, _as_interpreted(value))
    bf16 = _Bf16Arithmetic(interpreter_builder)  # shim 5
    own = vars(interpreter_builder)
    before = {attr: own[attr] for attr in _Bf16Arithmetic.PATCHED if attr in own}
    for attr in _Bf16Arithmetic.PATCHED:
        setattr(interpreter_builder, attr, getattr(bf16, attr))
    try:
        yield
    finally:
        for attr in _Bf16Arithmetic.PATCHED:
            if attr in before:
                setattr(interpreter_builder, attr, before[attr])
            else:
                delattr(interpreter_builder, attr)
        for namespace, attr, value in reversed(swapped):
            setattr(namespace, attr, value)


def _is_compiled(value) -> bool:
    from triton.runtime.jit import JITFunction

    return isinstance(value, JITFunction)


_CONVERTED: dict = {}


def _as_interpreted(kernel):
    """The interpreted twin of a compiled ``triton.jit`` function (one per function, so the
    interpreter's identity checks on ``tl.standard``'s combine functions still hold)."""
    from triton.runtime.interpreter import InterpretedFunction

    if id(kernel) not in _CONVERTED:
        _CONVERTED[id(kernel)] = (kernel, InterpretedFunction(kernel.fn))
    return _CONVERTED[id(kernel)][1]


class _Bf16Arithmetic:
    """Shim 5: the interpreter keeps a bf16 value as its raw 16 bits (``np.uint16``) and converts it
    only in a cast, so an add, a product or a ``tl.dot`` of two bf16 operands would work on the raw
    integers. Here such an operation is evaluated on the operands' fp32 values: a dot as tensor cores
    do it (exact products, fp32 accumulator, result in the accumulator's dtype), an elementwise result
    rounded back to bf16 (round to nearest even), a comparison compared. fp32 is untouched."""

    PATCHED = ("binary_op", "unary_op", "create_dot", "create_fma")

    def __init__(self, builder):
        self.builder = builder
        self.cls = type(builder)

    @staticmethod
    def _is_bf16(handle) -> bool:
        import triton.language as tl

        return handle.dtype.scalar == tl.bfloat16

    @staticmethod
    def _to_f32(data):
        import numpy as np

        return (data.astype(np.uint32) << 16).view(np.float32)

    @staticmethod
    def _to_bf16(data):
        import numpy as np
        import torch

        rounded = torch.from_numpy(np.ascontiguousarray(data, dtype=np.float32)).to(torch.bfloat16)
        return rounded.view(torch.int16).numpy().view(np.uint16).reshape(np.shape(data))

    def _handle(self, data, dtype):
        from triton.runtime.interpreter import TensorHandle

        return TensorHandle(data, dtype)

    def binary_op(self, lhs, rhs, op):
        if not (self._is_bf16(lhs) and self._is_bf16(rhs)):
            return self.cls.binary_op(self.builder, lhs, rhs, op)
        import numpy as np
        import triton.language as tl

        out = op(self._to_f32(lhs.data), self._to_f32(rhs.data))
        if out.dtype == np.bool_:
            return self._handle(out, tl.int1)
        return self._handle(self._to_bf16(out), lhs.dtype.scalar)

    def unary_op(self, arg, op):
        if not self._is_bf16(arg):
            return self.cls.unary_op(self.builder, arg, op)
        return self._handle(self._to_bf16(op(self._to_f32(arg.data))), arg.dtype.scalar)

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        if not (self._is_bf16(a) and self._is_bf16(b)):
            return self.cls.create_dot(self.builder, a, b, d, input_precision, max_num_imprecise_acc)
        import numpy as np

        acc = d.data if not self._is_bf16(d) else self._to_f32(d.data)
        out = np.matmul(self._to_f32(a.data), self._to_f32(b.data), dtype=np.float32) + acc
        return self._handle(out if not self._is_bf16(d) else self._to_bf16(out), d.dtype.scalar)

    def create_fma(self, x, y, z):
        if not (self._is_bf16(x) and self._is_bf16(y) and self._is_bf16(z)):
            return self.cls.create_fma(self.builder, x, y, z)
        out = self._to_f32(x.data) * self._to_f32(y.data) + self._to_f32(z.data)
        return self._handle(self._to_bf16(out), z.dtype.scalar)
