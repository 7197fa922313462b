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

The route from an op's call to fla is not written by hand. The registry names each mechanism's
op, rule, gate and fla entry points (``Entry.op_path``, ``Entry.gate``, ``Entry.fla_names``), and
``linattn.compat`` has, for each fla entry point, a function with fla's signature that maps it
onto linattn's op. Inverting that: the op's name and the gate of its call pick the registry
entry, the entry's fla names give the kernel, and the op's arguments are passed under the names
the compat function (hence fla) takes. ``tests/ops/test_backends.py`` checks that every route,
run through ``linattn.compat`` instead of fla, gives the op's own result (so a route cannot drift
from compat), and ``tests/compat/test_dispatch_vs_fla.py`` runs each through fla's kernels.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import warnings
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field

import torch
from torch import Tensor

BACKENDS = ("auto", "fla", "torch", "native")
_current: ContextVar[str] = ContextVar("linattn_backend", default="auto")

# Facts about fla 0.6.0's kernels that its signatures do not say.
# Its chunk kernels that assert q is not float32 ("does not support float32").
FLA_REFUSES_FLOAT32 = frozenset({"chunk_delta_rule", "chunk_gated_delta_product"})
# Its entry points that take grouped value heads (HV = G * H: "GVA"); the others need HV = H.
FLA_GROUPED = frozenset(
    {
        "chunk_gla", "chunk_gated_delta_rule", "fused_recurrent_gated_delta_rule", "chunk_gdn",
        "fused_recurrent_gdn", "chunk_kda", "fused_recurrent_kda", "chunk_dplr_delta_rule",
        "chunk_comba", "fused_recurrent_comba", "fused_recurrent_gdn2",
    }
)  # fmt: skip
# An op's argument -> the names fla may give it, first match wins (RWKV's r and w; fla's
# recurrent GLA and DPLR call the per-channel gate gk).
ALIASES = {
    "q": ("q", "r"),
    "g": ("g", "gk", "w"),
    "use_qk_l2norm": ("use_qk_l2norm_in_kernel",),
}
# An op whose arguments compat passes under other names: fla's generalized delta rule reads the
# state with its a and writes along its b, the reverse of linattn's (compat swaps them).
SWAPPED = {"generalized_delta_rule": {"a": "b", "b": "a"}}
# The op's numerical options, not part of what is computed: fla's kernels choose their own.
NUMERICAL = frozenset({"mode", "chunk_size"})


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
    token = _current.set(name)
    try:
        yield
    finally:
        _current.reset(token)


def loop_only() -> bool:
    """Whether the fused CPU kernels are off for this call (``backend("torch")``)."""
    return _current.get() == "torch"


@dataclass(frozen=True)
class Route:
    """One op call's way to fla: the registry entry, fla's entry point and the renaming of the
    op's arguments to fla's (``names``: op argument -> fla argument)."""

    mechanism: str
    fla_name: str
    params: tuple[str, ...] = field(compare=False)  # the op's arguments, in its order
    names: dict[str, str] = field(compare=False)
    defaults: dict[str, object] = field(compare=False)  # the op's keyword defaults
    takes: frozenset[str] = field(compare=False)  # every argument fla's function takes

    def arguments(self, given: dict[str, object]) -> dict[str, object] | str:
        """fla's keyword arguments for the op's ``given`` ones, or why fla cannot take them."""
        out = {}
        for name in self.params:
            if name in NUMERICAL:
                continue
            value = given[name]
            fla = self.names.get(name)
            if fla is None:
                if name in self.defaults and _same(value, self.defaults[name]):
                    continue  # left at the op's default, which fla's kernel computes too
                return f"fla's {self.fla_name} has no argument for {name}={value!r}"
            out[fla] = value
        if out.get("normalize", False) is not False:
            # fla keeps the normaliser as a state of its own; linattn's is a column of S.
            return f"fla's {self.fla_name} keeps another normaliser state (normalize=True)"
        state = out.get("initial_state")
        if isinstance(state, Tensor) and state.dtype in (torch.float16, torch.bfloat16):
            out["initial_state"] = state.float()  # fla's kernels keep states in float32
        return out


def _same(value: object, default: object) -> bool:
    return value is default or (not isinstance(value, Tensor) and value == default)


def _op_name(entry) -> str:
    path = entry.op_path
    return path.rpartition(":")[2] if isinstance(path, str) else getattr(path, "__name__", "")


def _gate_of(g: Tensor | None) -> str:
    if g is None:
        return "none"
    return "head" if g.dim() == 3 else "channel"


def _make_route(entry, fla_name: str, op: Callable) -> Route:
    """The route to ``fla_name`` for ``entry``'s op: the names come from ``linattn.compat``'s
    function of that name (fla's signature); an op argument with no name there is one the route
    takes only at its default."""
    from linattn import compat

    takes = frozenset(inspect.signature(getattr(compat, fla_name)).parameters)
    params = inspect.signature(op).parameters
    names = dict(SWAPPED.get(_op_name(entry), {}))
    for name in params:
        if name in names:
            continue
        found = next((a for a in ALIASES.get(name, (name,)) if a in takes), None)
        if found is not None and found not in names.values():
            names[name] = found
    defaults = {n: p.default for n, p in params.items() if p.default is not inspect.Parameter.empty}
    return Route(entry.name, fla_name, tuple(params), names, defaults, takes)


_ROUTES: dict[tuple[str, str], tuple[Route, ...]] = {}


def routes(op_name: str, gate: str) -> tuple[Route, ...]:
    """The registered mechanism computed by the op ``op_name`` with a gate ``gate`` as fla
    routes, chunk entry points first, then the recurrent ones (empty where fla has none)."""
    key = (op_name, gate)
    found = _ROUTES.get(key)
    if found is None:
        from linattn import registry

        # Several mechanisms share an op (linear attention: linear, scalar decay, GLA): the
        # call's gate picks one; a call whose gate no entry has (Comba without g) has no route.
        entries = [
            e
            for e in registry.mechanisms()
            if _op_name(e) == op_name and e.gate == gate and e.fla_names
        ]
        found = tuple(
            _make_route(entry, name, entry.op)
            for entry in entries[:1]
            for prefix in ("chunk_", "fused_recurrent_")
            for name in entry.fla_names
            if name.startswith(prefix)
        )
        _ROUTES[key] = found
    return found


def table() -> dict[str, tuple[Route, ...]]:
    """Every registered mechanism that fla has -> its routes (the dispatch table)."""
    from linattn import registry

    return {e.name: routes(_op_name(e), e.gate) for e in registry.mechanisms() if e.fla_names}


def gaps() -> tuple[str, ...]:
    """The registered mechanisms fla has no entry point for (they always run on linattn)."""
    from linattn import registry

    return tuple(e.name for e in registry.mechanisms() if not e.fla_names)


_FLA: dict[str, object] = {}


def fla_ready() -> bool | str:
    """True when fla's ops and Triton import; else why not (tried once)."""
    if "ready" not in _FLA:
        try:
            importlib.import_module("triton")
            importlib.import_module("fla.ops")
            _FLA["ready"] = True
        except Exception as error:  # noqa: BLE001 - any failure to import means no fla path
            _FLA["ready"] = f"fla or triton does not import ({type(error).__name__}: {error})"
    return _FLA["ready"]


def fla_function(fla_name: str) -> Callable:
    """fla's own function ``fla_name`` (its Triton kernel), not a wrapper that
    ``linattn.integrations.fla.enable()`` put in its place."""
    from linattn import compat

    module = compat.FLA_SUBMODULE_ENTRY_POINTS.get(fla_name, "fla.ops")
    function = getattr(importlib.import_module(module), fla_name)
    while hasattr(function, "linattn_cpu"):  # enable()'s device dispatch: fla's is wrapped
        function = function.__wrapped__
    return function


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
    name = _current.get()
    if name == "auto":
        return on_gpu(q) and q.dtype != torch.float64
    return name == "fla" and q.dtype != torch.float64


def choose(op_name: str, q: Tensor, g: Tensor | None, given: dict[str, object]):
    """fla's function and keyword arguments for this call (after ``wanted``), or None where
    "auto" falls back to linattn's path; with ``backend("fla")`` a call fla cannot take raises.

    ``given`` is the op's arguments by name (the call's q, k, v, gates, options); ``g`` the
    tensor whose shape names the gate (None: no gate).
    """
    name = _current.get()
    why = _why_not(op_name, q, g, given)
    if isinstance(why, str):
        if name == "fla":
            raise ValueError(f"backend('fla'): linattn.ops.{op_name} cannot run on fla: {why}")
        _fall_back(why, op_name)
        return None
    return why


def _why_not(op_name, q, g, given):
    ready = fla_ready()
    if ready is not True:
        return ready
    candidates = routes(op_name, _gate_of(g))
    if not candidates:
        return f"fla has no kernel for this mechanism (gate {_gate_of(g)!r})"
    grouped = given["v"].shape[2] != q.shape[2]
    reasons = []
    mode = given.get("mode", "chunk")
    if mode == "recurrent":  # a decoding step: fla's recurrent kernel first
        candidates = sorted(candidates, key=lambda r: not r.fla_name.startswith("fused_"))
    for route in candidates:
        if q.dtype == torch.float32 and route.fla_name in FLA_REFUSES_FLOAT32:
            reasons.append(f"{route.fla_name} refuses float32")
            continue
        if grouped and route.fla_name not in FLA_GROUPED:
            reasons.append(f"{route.fla_name} needs as many value heads as query heads")
            continue
        kwargs = route.arguments(given)
        if isinstance(kwargs, str):
            reasons.append(kwargs)
            continue
        return fla_function(route.fla_name), kwargs
    return "; ".join(reasons)


def run(chosen, out_dtype: torch.dtype) -> tuple[Tensor, Tensor | None]:
    """Call fla's function as ``choose`` picked it; o in ``out_dtype``, as the op returns it."""
    function, kwargs = chosen
    o, S = function(**kwargs)[:2]
    return o.to(out_dtype), S
