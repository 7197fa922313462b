"""Which code computes an op's call: ``backend("auto" | "fla" | "torch" | "native")``.

A context manager rather than a keyword on every op: the choice is made where a model is run
(around a training step, a layer, a whole ``generate``), and the ops, the layers and the models
built on them all follow it without a new argument in each signature. It is held in a
``ContextVar``, so threads and asyncio tasks each see their own.

- ``"auto"`` (the default): on a CUDA tensor, fla's Triton kernel when fla and Triton import and
  the mechanism has an fla entry point; otherwise linattn's own path (the fused CPU kernels where
  they serve the call, else the PyTorch loop), said once per reason with a warning when a CUDA
  call falls back. On any other device linattn's own path, silently.
- ``"fla"``: fla's kernel on any device (on CPU tensors it needs ``TRITON_INTERPRET=1`` set
  before fla is imported); a call fla cannot take is refused with an error naming why.
- ``"torch"``: linattn's PyTorch loop only (the fused CPU kernels off, as ``LINATTN_NATIVE=0``).
- ``"native"``: linattn's own path, never fla (the fused CPU kernels where they serve the call).

float64 always stays on linattn's path, whatever the choice: fla's kernels compute in float32.
Inside a ``torch.compile``'d function the ops take linattn's own path whatever the choice (dynamo
cannot trace a ``ContextVar``): choose the backend for code run eagerly.

The routes from an op's call to fla's kernels are inverted from the registry and
``linattn.compat`` (``linattn.dispatch``), so that they cannot drift from compat.
"""

from __future__ import annotations

import contextlib
import importlib
import threading
import warnings
from collections.abc import Iterator
from contextvars import ContextVar

import torch
from torch import Tensor

BACKENDS = ("auto", "fla", "torch", "native")
DISPATCH = "linattn.dispatch"  # the routes to fla (module docstring)
# The ops that consult the backend choice: each calls ``choose`` with its own name. A registered
# mechanism computed by another op (fla has no kernel for it, or none linattn can check:
# ``linattn.dispatch.UNROUTED``) always runs linattn's code, and the dispatch table
# (``linattn.dispatch.table``) has no row for it.
ROUTED_OPS = frozenset({
    "linear_attention", "delta_rule", "generalized_delta_rule", "gated_delta_product", "rwkv6",
    "comba", "rwkv7", "gated_deltanet2", "precond_delta_rule", "gated_oja_rule",
    "cyfa", "ttt_linear", "gated_slot_attention", "abc_attention", "log_linear_attention",
    "deltaformer", "path_attention", "forgetting_attention", "stickbreaking_attention",
    "parallax_attention", "wall_attention", "native_sparse_attention",
})  # fmt: skip
_current: ContextVar[str] = ContextVar("linattn_backend", default="auto")
# The backend blocks open in any thread or task. While there are none every call is "auto", and
# the per-call decision reads this count, not the ContextVar: cheaper, and a plain global that
# torch.compile traces (it cannot trace ContextVar.get).
_open = [0]
_open_lock = threading.Lock()


def current() -> str:
    """The backend in force here (``"auto"`` outside any ``backend(...)`` block)."""
    return _current.get()


@contextlib.contextmanager
def backend(name: str) -> Iterator[None]:
    """Run the ops called inside the block on ``name``'s code (the module docstring).

    Args:
        name: "auto", "fla", "torch" or "native".

    Raises:
        ValueError: name is not one of those.
    """
    if name not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {name!r}")
    with _open_lock:
        _open[0] += 1
    token = _current.set(name)
    try:
        yield
    finally:
        _current.reset(token)
        with _open_lock:
            _open[0] -= 1


def loop_only() -> bool:
    """Whether the fused CPU kernels are off for this call (``backend("torch")``)."""
    if not _open[0]:
        return False
    if torch.compiler.is_compiling():  # dynamo cannot trace ContextVar.get (module docstring)
        return False
    return _current.get() == "torch"


def on_gpu(q: Tensor) -> bool:
    """Whether "auto" sends q's call to fla (a CUDA tensor); a name of its own so that tests
    without a GPU can stand in for the device."""
    return q.is_cuda  # a property read in C: cheaper than building q.device


_WARNED: set[str] = set()


def _fall_back(why: str, op_name: str) -> None:
    text = f"linattn.ops.{op_name} on CUDA runs linattn's PyTorch loop, not fla's kernel: {why}"
    if text not in _WARNED:
        _WARNED.add(text)
        warnings.warn(text, RuntimeWarning, stacklevel=4)


def wanted(q: Tensor) -> bool:
    """Whether this call may go to fla: the decision the ops make on every call, so it reads the
    backend, q's dtype and (for "auto") its device only. float64 never goes: fla computes in
    float32, and float64 stays exact on linattn's loop."""
    if not _open[0]:  # no block open anywhere: "auto"
        return on_gpu(q) and q.dtype != torch.float64 and not torch.compiler.is_compiling()
    if torch.compiler.is_compiling():  # dynamo cannot trace ContextVar.get (module docstring)
        return False
    name = _current.get()
    if name == "auto":
        return on_gpu(q) and q.dtype != torch.float64
    return name == "fla" and q.dtype != torch.float64


def choose(op_name: str, q: Tensor, g: Tensor | None, given: dict[str, object]):
    """fla's function, keyword arguments and return conversion for this call (after ``wanted``;
    ``linattn.dispatch.Chosen``), or None where "auto" falls back to linattn's path; with
    ``backend("fla")`` a call fla cannot take raises.

    ``given`` is the op's arguments by name (the call's q, k, v, gates, options); ``g`` the
    tensor whose shape names the gate (None: no gate).
    """
    if op_name not in ROUTED_OPS:
        raise ValueError(f"choose: {op_name!r} is not one of the ROUTED_OPS {sorted(ROUTED_OPS)}")
    name = _current.get()
    why = _dispatch().resolve(op_name, q, g, given)
    if isinstance(why, str):
        if name == "fla":
            raise ValueError(f"backend('fla'): linattn.ops.{op_name} cannot run on fla: {why}")
        _fall_back(why, op_name)
        return None
    return why


def _dispatch():
    """``linattn.dispatch``, by name: it imports the registry and compat, which import the ops
    (a static import would close a circle), and only a call that may go to fla needs it."""
    return importlib.import_module(DISPATCH)


def run(chosen, out_dtype: torch.dtype):
    """Call fla's function as ``choose`` picked it and return what the op returns (o, or o and
    its states), o in ``out_dtype``, as the op's own path returns it."""
    out = chosen.returns(chosen.function(**chosen.kwargs))
    if isinstance(out, Tensor):
        return out.to(out_dtype)
    return (out[0].to(out_dtype), *out[1:])
