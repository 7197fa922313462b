"""The routes from linattn's ops to fla 0.6.0's Triton kernels (``linattn.ops.backend``).

Not written by hand: the registry names each mechanism's op, gate and fla entry points
(``Entry.op_path``, ``Entry.gate``, ``Entry.fla_names``), and ``linattn.compat`` has, for each fla
entry point, a function with fla's signature that maps it onto linattn's op. Inverting that: the
op's name and the gate of its call pick the registry entry, the entry's fla names give the
kernel (chunk entry points first), and the op's arguments are passed under the names compat's
function (hence fla's) takes them. ``tests/ops/test_backends.py`` checks that every route, run
through ``linattn.compat`` instead of fla, gives the op's own result, so a route cannot drift
from compat; ``tests/compat/test_dispatch_vs_fla.py`` runs each through fla's kernels.

``linattn.ops.backends`` reaches this module by name on the first call it may send to fla
(the way the registry names its ops): it reads the registry and compat, which import the ops.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import Tensor

from linattn import compat, registry
from linattn.ops import backends as _backends

# Facts about fla 0.6.0's kernels that its signatures do not say.
# Its chunk kernels that assert q is not float32 ("does not support float32").
FLA_REFUSES_FLOAT32 = frozenset({"chunk_delta_rule", "chunk_gated_delta_product"})
# Its entry points without a backward (an autograd function whose backward raises, or none):
# a call that records gradients takes another route or stays on linattn.
FLA_NO_BACKWARD = frozenset(
    {
        "chunk_iplr_delta_rule", "fused_recurrent_dplr_delta_rule",
        "fused_recurrent_gated_delta_rule", "fused_recurrent_gdn", "fused_recurrent_comba",
        "fused_recurrent_kda", "fused_recurrent_rwkv7", "fused_recurrent_gdn2",
        "fused_recurrent_precond_gated_delta_rule", "fused_recurrent_precond_kda",
        "fused_recurrent_gated_oja_rule",
    }
)  # fmt: skip
# Its entry points that take grouped value heads (HV = G * H: "GVA"), each run so under the
# interpreter (tests/compat); the others need HV = H (fla's chunk GLA refuses the shapes, its
# chunk DPLR kernel aborts on them).
FLA_GROUPED = frozenset(
    {
        "chunk_gated_delta_rule", "fused_recurrent_gated_delta_rule", "chunk_gdn",
        "fused_recurrent_gdn", "chunk_kda", "fused_recurrent_kda", "chunk_comba",
        "fused_recurrent_comba", "fused_recurrent_gdn2", "chunk_precond_gated_delta_rule",
        "fused_recurrent_precond_gated_delta_rule", "fused_recurrent_gated_oja_rule",
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
# The names an op gives the gate whose shape picks the mechanism (its call to ``choose``).
GATE_NAMES = ("g", "w", "gv")
# The op's numerical options, not part of what is computed: fla's kernels choose their own.
NUMERICAL = frozenset({"mode", "chunk_size"})


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
        # Several mechanisms share an op (linear attention: linear, scalar decay, GLA): the
        # call's gate picks one; a call whose gate no entry has (Comba without g) has no route.
        entries = [
            e
            for e in registry.mechanisms()
            if _op_name(e) == op_name and e.gate == gate and e.fla_names and routed(e)
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


def routed(entry) -> bool:
    """Whether ``entry``'s op consults the backend choice (``ops.backends.ROUTED_OPS``): only
    those ops can send a call to fla's kernels."""
    return _op_name(entry) in _backends.ROUTED_OPS


def served_by(entry) -> str | None:
    """The name of the earlier registered mechanism with fla names whose op and gate are
    ``entry``'s, or None: a reparametrisation (retention, HGRN, Based, ...) computed by another
    mechanism's op is dispatched as that mechanism, whose routes the op's call takes (only a
    routed op has routes to share)."""
    if not routed(entry):
        return None
    for e in registry.mechanisms():
        if e is entry:
            return None
        if e.fla_names and _op_name(e) == _op_name(entry) and e.gate == entry.gate:
            return e.name
    return None


def table() -> dict[str, tuple[Route, ...]]:
    """Every registered mechanism that fla has and whose op is routed -> its routes (the
    dispatch table); a reparametrisation served by another's routes (``served_by``) is that
    one's row."""
    return {
        e.name: routes(_op_name(e), e.gate)
        for e in registry.mechanisms()
        if e.fla_names and routed(e) and served_by(e) is None
    }


def unrouted() -> tuple[str, ...]:
    """The registered mechanisms fla has whose op is not routed: linattn's code on every device
    (families with an op of their own)."""
    return tuple(e.name for e in registry.mechanisms() if e.fla_names and not routed(e))


def gaps() -> tuple[str, ...]:
    """The registered mechanisms fla has no entry point for (they always run on linattn)."""
    return tuple(e.name for e in registry.mechanisms() if not e.fla_names and served_by(e) is None)


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


def resolve(op_name: str, q: Tensor, g: Tensor | None, given: dict[str, object]):
    """fla's function and keyword arguments for this op call, or why fla cannot take it (a
    string). ``given``: the op's arguments by name; ``g``: the tensor whose shape names the gate
    (None: no gate)."""
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
    grads = torch.is_grad_enabled() and any(
        isinstance(t, Tensor) and t.requires_grad for t in given.values()
    )
    for route in candidates:
        if grads and route.fla_name in FLA_NO_BACKWARD:
            reasons.append(f"{route.fla_name} has no backward")
            continue
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


def op_name(entry) -> str:
    """The name of ``entry``'s op in ``linattn.ops`` ("delta_rule" for Gated DeltaNet)."""
    return _op_name(entry)


def arguments(entry, inputs: dict[str, Tensor | None], **extra: object) -> dict[str, object]:
    """The op's arguments by name for a registry case's ``inputs`` (``Entry.case.inputs``): the
    op's defaults, the case's tensors, its state "S0" as the initial state, the final state
    asked for, then ``extra``."""
    params = inspect.signature(entry.op).parameters
    out = {n: p.default for n, p in params.items() if p.default is not inspect.Parameter.empty}
    out.update({n: t for n, t in inputs.items() if n in params})
    out.update(initial_state=inputs["S0"], output_final_state=True, **extra)
    return out


def call(entry, given: dict[str, object]):
    """``entry``'s op called with the arguments ``given`` by name (positional ones in order)."""
    params = inspect.signature(entry.op).parameters
    positional = [given[n] for n, p in params.items() if p.kind is p.POSITIONAL_OR_KEYWORD]
    keywords = {n: given[n] for n, p in params.items() if p.kind is p.KEYWORD_ONLY}
    return entry.op(*positional, **keywords)


def resolve_call(entry, given: dict[str, object]):
    """``resolve`` for ``entry``'s op called with ``given``: its query (q, or RWKV-7's r) and
    its gate (``GATE_NAMES``: g, RWKV-7's w, the gated Oja rule's gv) found by name."""
    params = inspect.signature(entry.op).parameters
    query = next(iter(params))
    gate = next((name for name in GATE_NAMES if name in params), None)
    return resolve(_op_name(entry), given[query], given.get(gate), given)
