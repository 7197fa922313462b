"""Run fla's Triton kernels on the CPU under Triton's interpreter (a test helper).

Import this module FIRST, before fla (or transformers, which imports fla) is imported::

    fla_interpreter = pytest.importorskip("tests.fla_interpreter")  # then import fla

``tests/compat/conftest.py`` does it for the tests under ``tests/compat``. It sets
``TRITON_INTERPRET=1`` (read by ``triton.jit`` when fla's modules decorate their kernels, so fla
must not be imported before) and patches what triton 3.9's interpreter lacks for fla 0.6.0:

- autotuning: ``Autotuner.do_bench`` asks the (absent) GPU driver for a benchmarker, which fails
  with "0 active drivers"; every config is timed as 1 ms instead, so the first config runs.
- loop counters: the interpreter runs ``for i in range(n)`` / ``tl.range`` with Python's range,
  so ``i`` is a Python int and fla's ``i_t.to(tl.int64)`` (common/chunk_delta_h.py) fails with
  "'int' object has no attribute 'to'"; the rewritten kernel binds ``i`` to a triton scalar, as
  compiled triton does (``tl.static_range`` keeps its int).
- builtins bound to other names: fla binds ``gather = tl.gather`` at import, which the
  interpreter's patching of ``triton.language`` misses ("Did you forget to add @triton.jit ?"
  in KDA's chunk kernels); the kernel module's own names are patched too.
- dot precisions: KDA's safe gate asks for ``input_precision="bf16x3"``, which the
  interpreter's options do not list (its dot is a numpy matmul anyway); it is added.

Nothing else is needed: fla's ``fla.utils`` device detection warns "Triton is not supported on
current platform, roll back to CPU" and picks ``device = 'cpu'``, which is what the interpreter
wants (tensors stay on the CPU). Checked with fla 0.6.0 / triton 3.9.0 / torch 2.13.0 (CPU):
``chunk_*`` and ``fused_recurrent_*`` gated delta rule forward and backward; fla's layers
GatedDeltaNet, DeltaNet, KimiDeltaAttention, GatedLinearAttention and Mamba2 (short convolution,
fused norms, l2norm and ops) forward and backward. The interpreter is slow (seconds per call at
T = 64): keep shapes small. Known limits: bfloat16 results are wrong, and the cause is
triton 3.9's interpreter, not fla: it stores bfloat16 as its raw ``np.uint16`` bits and converts
them only in casts to and from float32 (``cast_impl``), so arithmetic on bfloat16 operands runs
on the integer bit patterns: ``tl.dot`` (``create_dot`` converts only 8-bit floats; 4e9
relative error on a 16 x 16 product), ``+``, ``*`` and ``tl.sum`` (inf / nan) alike; float32 to
bfloat16 casts truncate where compiled triton rounds to nearest even. Hence fla's
``chunk_delta_rule`` in bfloat16 returns outputs of ~1e10 (4e9 relative), while in float16
(numpy's own type) it agrees with ``linattn.compat`` to 4e-3 (float16's rounding); patching
``create_dot`` alone turns that into nan. Checked with single-op kernels (bfloat16 loads, then
``x + y``, ``x * y``, ``tl.dot``, ``tl.sum``) against torch. And
fla's chunk kernels refuse q, k in bfloat16 with v in float32 ("Both operands must be same
dtype"), as compiled triton would. ``bfloat16_dots_and_casts`` (below) repairs ``tl.dot`` and
the float32 cast, which is all that fla's MesaNet does with bfloat16. Masked-out lanes are
computed too, so numpy may warn "overflow encountered in exp" on values the kernels then discard.
"""

from __future__ import annotations

import ast
import dataclasses
import os
import sys

if "fla" in sys.modules and os.environ.get("TRITON_INTERPRET") != "1":
    raise ImportError(
        "tests.fla_interpreter must be imported before fla: TRITON_INTERPRET=1 is read when "
        "triton.jit decorates fla's kernels, and fla was imported without it"
    )
os.environ["TRITON_INTERPRET"] = "1"

from functools import partial  # noqa: E402

import triton.language as tl  # noqa: E402
from triton.runtime import autotuner, interpreter  # noqa: E402


def _fake_bench(fn, quantiles=None, **kwargs):
    """Autotuning has no GPU timer: every config 'takes' 1 ms, so the first one is kept."""
    return [1.0, 1.0, 1.0]


def _patch_autotuner() -> None:
    autotuner.Autotuner.do_bench = property(lambda self: _fake_bench)


ACTIVE = True  # for tests that want to assert the interpreter is on


def _visit_for(self, node):
    """``for i in range(n)`` binds ``i`` to a triton tensor, as compiled triton does.

    The interpreter runs the loop with Python's ``range``, so ``i`` is a Python int and
    ``i.to(tl.int64)`` (fla's chunk_delta_h) fails; ``tl.static_range`` keeps its int.
    """
    node = self.generic_visit(node)
    it = node.iter
    is_range = isinstance(it, ast.Call) and (
        (isinstance(it.func, ast.Name) and it.func.id == "range")
        or (isinstance(it.func, ast.Attribute) and it.func.attr == "range")
    )
    if is_range and isinstance(node.target, ast.Name):
        wrap = ast.Assign(
            targets=[ast.Name(id=node.target.id, ctx=ast.Store())],
            value=ast.Call(
                func=ast.Attribute(
                    value=ast.Name(id="interpreter_semantic", ctx=ast.Load()),
                    attr="to_tensor",
                    ctx=ast.Load(),
                ),
                args=[ast.Name(id=node.target.id, ctx=ast.Load()), ast.Constant(value=False)],
                keywords=[],
            ),
        )
        node.body.insert(0, ast.copy_location(wrap, node))
    return node


def _bound_builtins(patch_lang):
    """Also patch triton builtins a kernel's module binds to its own names.

    The interpreter patches the builtins of ``triton.language`` while a kernel runs, but fla's
    ``fla.ops.utils.op`` binds ``gather = tl.gather`` at import, which then still asks for the
    compiler's ``_semantic`` ("Did you forget to add @triton.jit ?", KDA's intra-chunk kernel).
    """

    def patched(fn):
        scope = patch_lang(fn)
        names = fn.__globals__
        for name, value in list(names.items()):
            if tl.core.is_builtin(value):
                names[name] = partial(_with_semantic, value)
        return scope

    return patched


def _with_semantic(member, *args, **kwargs):
    kwargs = {k: v for k, v in kwargs.items() if k != "_semantic"}
    return member(*args, **kwargs, _semantic=interpreter.interpreter_semantic)


def _dot_precisions() -> None:
    """Accept fla's ``input_precision="bf16x3"`` (KDA's safe gate); the interpreter's dot is a
    numpy matmul in the operands' precision whatever the option says."""
    builder = interpreter.interpreter_builder
    allowed = builder.options.allowed_dot_input_precisions
    extra = tuple(p for p in ("bf16x3", "bf16x6") if p not in allowed)
    builder.options = dataclasses.replace(
        builder.options, allowed_dot_input_precisions=allowed + extra
    )


def _patch_interpreter() -> None:
    _dot_precisions()
    interpreter.ASTTransformer.visit_For = _visit_for
    interpreter._patch_lang = _bound_builtins(interpreter._patch_lang)
    interpreter.InterpretedFunction.rewritten_fn.clear()


_patch_autotuner()
_patch_interpreter()


def relative(got, want) -> float:
    """||got - want|| / ||want||: how fla's runs are compared (float32 at 1e-5)."""
    return ((got - want).norm() / want.norm()).item()


# What some of fla's kernels need besides, for the tests (and the GPU benchmark's smoke run) that
# run them: each binds names with ``monkeypatch`` in a test (so that the binding ends with it),
# or for the whole process without one.


def _binder(monkeypatch):
    if monkeypatch is None:
        return setattr
    return partial(monkeypatch.setattr, raising=False)


def cyfa_on_cpu(monkeypatch=None) -> None:
    """fla's CyFA kernels refuse CPU tensors (``require_cuda``) and call
    ``libdevice.fast_cosf`` / ``fast_sinf``, which the interpreter lacks: the first lifted, the
    second bound to ``tl.cos`` / ``tl.sin`` (the interpreter's numpy cosine)."""
    import types
    from importlib import import_module

    set_attribute = _binder(monkeypatch)
    utils = import_module("fla.ops.cyfa.utils")
    validate = utils.validate_cyfa_inputs

    def on_any_device(*args, require_cuda=False, **kwargs):
        return validate(*args, **kwargs)

    for name in ("fla.ops.cyfa.chunk", "fla.ops.cyfa.fused_recurrent"):
        set_attribute(import_module(name), "validate_cyfa_inputs", on_any_device)
    cos, sin = (partial(_with_semantic, f) for f in (tl.cos, tl.sin))
    set_attribute(utils, "libdevice", types.SimpleNamespace(fast_cosf=cos, fast_sinf=sin))


def boolean_masks(monkeypatch=None) -> None:
    """triton 3.9's interpreter refuses a load/store mask of int32 or int64 ("mask has
    unsupported dtype"), which fla's kernels make where they and a mask with a comparison: int32
    in log-linear attention's ``m_t[:, None] & (7 < L)`` (a constexpr), int64 0/1 data in chunk
    HGRN's ``mask & ((i_t * BT + i) < T)`` and in ABC's backward; compiled triton types every
    mask as a boolean (``tl.store`` raises otherwise), and so does this."""
    import numpy as np

    set_attribute = _binder(monkeypatch)
    builder = interpreter.InterpreterBuilder
    load, store = builder.create_masked_load, builder.create_masked_store

    def boolean(mask):
        if mask.data.dtype == np.bool_:
            return mask
        return interpreter.TensorHandle(mask.data.astype(np.bool_), mask.dtype)

    set_attribute(builder, "create_masked_load",
                  lambda self, p, m, o, c, v: load(self, p, boolean(m), o, c, v))  # fmt: skip
    set_attribute(builder, "create_masked_store",
                  lambda self, p, x, m, c: store(self, p, x, boolean(m), c))  # fmt: skip


def log1p_on_cpu(monkeypatch=None) -> None:
    """The interpreter leaves triton's libdevice functions unimplemented (they return None:
    "'NoneType' object has no attribute 'dtype'"); fla's ``logaddexp`` (``fla.ops.utils.op``,
    in the GSA gate kernel ``fla.ops.gsa.gate`` that GSA and LightNet call) needs
    ``libdevice.log1p``: bound to numpy's, in the operand's precision."""
    import numpy as np
    from triton.language.extra import libdevice

    def log1p(x):
        data = np.log1p(x.handle.data)
        return tl.tensor(interpreter.TensorHandle(data, x.handle.dtype), x.type)

    _binder(monkeypatch)(libdevice, "log1p", log1p)


FLASH_ATTN_MODULES = (  # fla's modules that read o (or a window) with flash-attn
    "fla.ops.deltaformer.parallel", "fla.ops.nsa.parallel", "fla.ops.nsa.naive",
)  # fmt: skip


def flash_attn_on_cpu(monkeypatch=None) -> None:
    """fla's DeltaFormer reads o, and NSA its sliding window, with flash-attn (CUDA only; absent
    here): linattn's CPU flash attention stands in (tests/integrations/test_fla_attention.py
    pins it to torch's SDPA)."""
    from importlib import import_module

    from linattn.integrations import _fla_attention

    set_attribute = _binder(monkeypatch)
    for name in FLASH_ATTN_MODULES:
        module = import_module(name)
        set_attribute(module, "flash_attn_func", _fla_attention.flash_attn_func)
        set_attribute(module, "flash_attn_varlen_func", _fla_attention.flash_attn_varlen_func)


def bfloat16_dots_and_casts(monkeypatch=None) -> None:
    """Give bfloat16 the two operations fla's MesaNet kernels apply to it, as compiled triton does.

    triton 3.9's interpreter keeps bfloat16 as its raw ``np.uint16`` bits (module docstring), and
    two of its operations then differ from compiled triton (a single-op kernel each, against torch):

    - ``tl.dot`` of bfloat16 tiles multiplies the bit patterns as integers (``create_dot``
      converts only 8-bit floats): 4e9 relative error on a 16 x 16 product. Here bfloat16
      operands are widened to float32 first, which is exact (a bfloat16 is a float32 whose low 16
      bits are zero), so the product is the bfloat16 product accumulated in the accumulator's
      dtype, as the GPU's bfloat16 MMA computes it (up to the order of the sums).
    - ``x.to(tl.bfloat16)`` from float32 truncates the low 16 bits (``_convert_float`` without a
      rounding mode) where compiled triton's ``fp_trunc`` rounds to nearest even (torch's
      ``.bfloat16()`` too): here it rounds to nearest even, NaN kept NaN.

    Other arithmetic on bfloat16 operands (``+``, ``*``, ``tl.sum``) stays wrong: kernels that do it
    are not served. fla's MesaNet does none: its state kernel stores h_kv with a cast, its CG kernel
    casts x to bfloat16 and takes one dot with h_kv, and its backward widens h_kv to float32.
    """
    import numpy as np

    set_attribute = _binder(monkeypatch)
    builder = interpreter.InterpreterBuilder
    dot, cast = builder.create_dot, builder.cast_impl

    def widened(x):
        if x.dtype.scalar != tl.bfloat16:
            return x
        bits = x.data.astype(np.uint32) << np.uint32(16)
        return interpreter.TensorHandle(bits.view(np.float32), tl.float32)

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        return dot(self, widened(a), widened(b), d, input_precision, max_num_imprecise_acc)

    def cast_impl(self, src, dst_type):
        if src.dtype.scalar != tl.float32 or dst_type.scalar != tl.bfloat16:
            return cast(self, src, dst_type)
        bits = np.ascontiguousarray(src.data, dtype=np.float32).view(np.uint32)
        even = (bits >> np.uint32(16)) & np.uint32(1)
        rounded = (bits + np.uint32(0x7FFF) + even) >> np.uint32(16)
        quiet = (bits >> np.uint32(16)) | np.uint32(0x40)  # NaN stays NaN (rounding could carry)
        out = np.where(np.isnan(src.data), quiet, rounded).astype(np.uint16)
        return interpreter.TensorHandle(out, tl.bfloat16)

    set_attribute(builder, "create_dot", create_dot)
    set_attribute(builder, "cast_impl", cast_impl)  # create_fp_trunc calls self.cast_impl
