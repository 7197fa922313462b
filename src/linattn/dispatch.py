"""The routes from linattn's ops to fla 0.6.0's Triton kernels (``linattn.ops.backend``).

Not written by hand: the registry names each mechanism's op, gate and fla entry points
(``Entry.op_path``, ``Entry.gate``, ``Entry.fla_names``), and ``linattn.compat`` has, for each fla
entry point, a function with fla's signature that maps it onto linattn's op. Inverting that: the
op's name and the gate of its call pick the registry entry, the entry's fla names give the
kernel (chunk entry points first), and the op's arguments are passed under the names compat's
function (hence fla's) takes them; where the names alone do not say it (an argument named
otherwise, a state of parts, another return), compat's function says it (its ``op_call``,
``linattn.compat._core.OpCall``). ``tests/ops/test_backends.py`` checks that every route, run
through ``linattn.compat`` instead of fla, gives the op's own result, so a route cannot drift
from compat; ``tests/compat/test_dispatch_vs_fla.py`` runs each through fla's kernels.

What fla's kernels cannot take, which their signatures do not say, is written below as facts
about its entry points (``FLA_*``): a call a fact refuses takes another route or stays on
linattn, with the fact's reason. The registered mechanisms fla has whose ops are not routed are
in ``UNROUTED``, each with its reason.

``linattn.ops.backends`` reaches this module by name on the first call it may send to fla
(the way the registry names its ops): it reads the registry and compat, which import the ops.
"""

from __future__ import annotations

import importlib
import inspect
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

import torch
from torch import Tensor

from linattn import compat, registry
from linattn.ops import backends as _backends

# Facts about fla 0.6.0's kernels that its signatures do not say.
# Its kernels that refuse float32 q: its chunk delta rule and DeltaProduct assert "does not
# support float32"; its Parallax kernel takes bfloat16 and float16 only.
FLA_REFUSES_FLOAT32 = frozenset(
    {"chunk_delta_rule", "chunk_gated_delta_product", "parallel_parallax"}
)
# Its entry points without a backward (an autograd function whose backward raises, or none):
# a call that records gradients takes another route or stays on linattn.
FLA_NO_BACKWARD = frozenset(
    {
        "chunk_iplr_delta_rule", "fused_recurrent_dplr_delta_rule",
        "fused_recurrent_gated_delta_rule", "fused_recurrent_gdn", "fused_recurrent_comba",
        "fused_recurrent_kda", "fused_recurrent_rwkv7", "fused_recurrent_gdn2",
        "fused_recurrent_precond_gated_delta_rule", "fused_recurrent_precond_kda",
        "fused_recurrent_gated_oja_rule", "fused_recurrent_cyfa",
    }
)  # fmt: skip
# Its entry points that take grouped value heads (HV = G * H: "GVA"), each run so under the
# interpreter (tests/compat); the others need HV = H (fla's chunk GLA refuses the shapes, its
# chunk DPLR kernel aborts on them). Grouped query heads (GQA: fewer key/value heads than query
# heads) are the softmax kernels' own layout and need no entry here.
FLA_GROUPED = frozenset(
    {
        "chunk_gated_delta_rule", "fused_recurrent_gated_delta_rule", "chunk_gdn",
        "fused_recurrent_gdn", "chunk_kda", "fused_recurrent_kda", "chunk_comba",
        "fused_recurrent_comba", "fused_recurrent_gdn2", "chunk_precond_gated_delta_rule",
        "fused_recurrent_precond_gated_delta_rule", "fused_recurrent_gated_oja_rule",
    }
)  # fmt: skip
# The fewest query heads per key head its kernel takes (a power of two): NSA's asserts 16.
FLA_QUERY_GROUPS = {"parallel_nsa": 16}
# Its arguments it asserts are float32 whatever q's dtype ("to preserve precision"): the route
# passes them so.
FLA_FLOAT32 = {"parallel_path_attn": ("w", "beta", "g")}
# Its entry points that call flash-attn's CUDA kernels (a package of their own, which fla's
# module imports if it can): always (None), or when the named argument is set.
FLA_FLASH_ATTN = {"deltaformer_attn": None, "parallel_nsa": "window_size"}
# Its entry points whose state is not the op's and cannot be made from it: a call with an initial
# state or asking for the final one stays on linattn.
FLA_OTHER_STATE = {
    "chunk_log_linear_attn": "fla's log-linear state is its kernel's: the level states at the "
    "last boundary of its 64-token chunks and the raw tokens after it, where linattn's is the "
    "Fenwick levels at any position",
}


def _head_sizes(sizes: tuple[int, ...], top: int | None = None):
    """A limit on the head sizes of q and v: one of ``sizes``, or at most ``top``."""

    def limit(kwargs: dict) -> str | None:
        for name in ("q", "v"):
            D = kwargs[name].shape[-1]
            if (top is not None and D > top) or (top is None and D not in sizes):
                allowed = f"<= {top}" if top is not None else f"in {sizes}"
                return f"its kernel takes head sizes {allowed} ({name}: {D})"
        return None

    return limit


def _log_linear(kwargs: dict) -> str | None:
    K, V, L = kwargs["k"].shape[-1], kwargs["v"].shape[-1], kwargs["level_scales"].shape[-1]
    if K % 64 or V & (V - 1):
        return f"its kernel needs K a multiple of 64 and V a power of two (K = {K}, V = {V})"
    T = kwargs["q"].shape[1]
    if L < 7 and T > 2 ** (L - 1):
        # inside a chunk it reads level_scales past L instead of weighing those levels 0
        return f"its kernel reads level_scales past its L = {L} levels at T = {T} tokens"
    return None


def _abc(kwargs: dict) -> str | None:
    T = kwargs["q"].shape[1]
    if kwargs["output_final_state"] and T % 64:
        # its last, partial chunk is normalised by z = 0 instead of z_T (compat/abc.py)
        return f"its final state is off by exp(z_T) when T = {T} is not a multiple of 64"
    return None


def _cyfa_slots(kwargs: dict) -> str | None:
    M = kwargs["readout"].shape[-1] + 1
    if M & (M - 1):
        return (
            f"its chunk kernel needs a power of two of slots (readout [H, M - 1, M - 1], M = {M})"
        )
    return None


def _query_groups(kwargs: dict) -> str | None:
    HQ, H = kwargs["q"].shape[2], kwargs["k"].shape[2]
    least = FLA_QUERY_GROUPS["parallel_nsa"]
    G = HQ // H
    if G < least or G & (G - 1):
        return f"its kernel needs a power of two >= {least} query heads per key head (got {G})"
    return None


def _ttt_backward(kwargs: dict) -> str | None:
    if kwargs["cu_seqlens"] is not None:
        return "its backward refuses packed sequences (cu_seqlens)"
    T, size = kwargs["q"].shape[1], kwargs["chunk_size"]
    if kwargs["output_final_state"] and T % size:
        # its last, partial mini-batch is padded with zero tokens whose gradients enter the
        # final bias state, and its backward does not differentiate that term as written
        return (f"its backward through the final bias state is not its forward's derivative "
                f"when the last mini-batch is partial (T = {T}, chunk_size = {size})")  # fmt: skip
    return None


# Its limits on a call that records gradients: fla's arguments -> why not, or None.
FLA_BACKWARD_LIMITS = {"chunk_ttt_linear": _ttt_backward, "fused_chunk_ttt_linear": _ttt_backward}
# Its shape and option limits (asserts in its kernels): fla's arguments -> why not, or None.
FLA_LIMITS = {
    "parallel_path_attn": _head_sizes((16, 32, 64, 128)),
    "chunk_ttt_linear": _head_sizes((), top=128),
    "fused_chunk_ttt_linear": _head_sizes((), top=128),
    "parallel_attn": _head_sizes((), top=256),
    "parallel_forgetting_attn": _head_sizes((), top=256),
    "parallel_stickbreaking_attn": _head_sizes((), top=256),
    "parallel_wall_attn": _head_sizes((), top=256),
    "chunk_log_linear_attn": _log_linear,
    "chunk_abc": _abc,
    "chunk_cyfa": _cyfa_slots,
    "parallel_nsa": _query_groups,
}
# The registered mechanisms fla has whose op does not consult the backend choice, and why
# (``unrouted``): linattn's code on every device.
UNROUTED = {
    "titans": "fla 0.6.0 has no kernel for Titans (fla.ops.titans is PyTorch code: its naive "
    "chunk form), and its chunk_titans_linear returns the memory M without the momentum S that "
    "linattn's state carries, starts S at zero and takes no packed sequences",
    "momentum_delta": "fla 0.6.0 has no kernel for the momentum delta rule (both entry points "
    "run its PyTorch reference code, only the l2 norm in Triton); it refuses packed sequences "
    "and float32 in its chunk path",
    "mesa": "fla's chunk_mesa_net rounds q and k to float16 and keeps its per-chunk state in "
    "bfloat16 whatever the inputs' dtype, so a float32 call routed to it would lose precision "
    "unseen (tests/compat/test_mesa_net.py pins it to that rounding)",
    "moba": "fla's parallel_moba is flash-attn's CUDA kernels (no Triton kernel of fla's) and "
    "needs max_seqlen and packed sequences; nothing of it runs on the CPU or under triton's "
    "interpreter, so no route could be checked",
    "dsa": "fla 0.6.0 has DeepSeek sparse attention as PyTorch reference code only "
    "(fla.ops.dsa.naive: a dense T x T mask per sequence, no Triton kernel), so a route would "
    "run no kernel of fla's",
}
# An op's argument -> the names fla may give it, first match wins (RWKV's r and w; fla's
# recurrent GLA and DPLR call the per-channel gate gk). An op whose arguments compat passes under
# other names or as the parts of one tuple says so on compat's function
# (``linattn.compat._core.OpCall``: the generalized delta rule's a and b, TTT's state).
ALIASES = {
    "q": ("q", "r"),
    "g": ("g", "gk", "w"),
    "use_qk_l2norm": ("use_qk_l2norm_in_kernel",),
}
# The names an op gives the gate whose shape picks the mechanism (its call to ``choose``).
GATE_NAMES = ("g", "w", "gv")
# The op's numerical options, not part of what is computed: fla's kernels choose their own.
NUMERICAL = frozenset({"mode", "chunk_size"})


@dataclass(frozen=True)
class Route:
    """One op call's way to fla: the registry entry, fla's entry point and the renaming of the
    op's arguments to fla's (``names``: op argument -> fla argument; ``parts``: op argument
    holding a tuple -> fla's arguments for its parts)."""

    mechanism: str
    fla_name: str
    params: tuple[str, ...] = field(compare=False)  # the op's arguments, in its order
    names: dict[str, str] = field(compare=False)
    defaults: dict[str, object] = field(compare=False)  # the op's keyword defaults
    takes: frozenset[str] = field(compare=False)  # every argument fla's function takes
    parts: dict[str, tuple[str, ...]] = field(compare=False, default_factory=dict)
    result: Callable | None = field(compare=False, default=None)  # compat's OpCall.result
    # fla's arguments passed in float32 when given in half precision: its states, FLA_FLOAT32's
    in_float32: tuple[str, ...] = field(compare=False, default=("initial_state",))

    def arguments(self, given: dict[str, object]) -> dict[str, object] | str:
        """fla's keyword arguments for the op's ``given`` ones, or why fla cannot take them."""
        out = {}
        for name in self.params:
            if name in NUMERICAL:
                continue
            value = given[name]
            if name in self.parts:
                pieces = (None,) * len(self.parts[name]) if value is None else tuple(value)
                out.update(zip(self.parts[name], pieces, strict=True))
                continue
            fla = self.names.get(name)
            if fla is None:
                if name in self.defaults and _same(value, self.defaults[name]):
                    continue  # left at the op's default, which fla's kernel computes too
                return f"fla's {self.fla_name} has no argument for {name}={value!r}"
            out[fla] = value
        if out.get("normalize", False) is not False:
            # fla keeps the normaliser as a state of its own; linattn's is a column of S.
            return f"fla's {self.fla_name} keeps another normaliser state (normalize=True)"
        for name in self.in_float32:
            x = out.get(name)
            if isinstance(x, Tensor) and x.dtype in (torch.float16, torch.bfloat16):
                out[name] = x.float()
        return out

    def takes_call(self) -> bool:
        """Whether fla's function has an argument for each of the op's arguments without a
        default (a decoding entry point over a cache, e.g., has none for k)."""
        return all(
            name in self.names or name in self.parts or name in self.defaults or name in NUMERICAL
            for name in self.params
        )

    def returns(self, given: dict[str, object]) -> Callable:
        """fla's return -> the op's (compat's ``OpCall.result`` for the op's ``given``)."""
        if self.result is not None:
            return lambda out: self.result(out, given)
        return lambda out: out if isinstance(out, Tensor) else tuple(out)


class Chosen(NamedTuple):
    """fla's function for a call, its keyword arguments, and fla's return -> the op's."""

    function: Callable
    kwargs: dict[str, object]
    returns: Callable


def _same(value: object, default: object) -> bool:
    return value is default or (not isinstance(value, Tensor) and value == default)


def _op_name(entry) -> str:
    path = entry.op_path
    return path.rpartition(":")[2] if isinstance(path, str) else getattr(path, "__name__", "")


def _gate_of(g: Tensor | None) -> str:
    if g is None:
        return "none"
    return "head" if g.dim() == 3 else "channel"


def _gate_argument(entry) -> str | None:
    """The name of the op's argument that is ``entry``'s gate (``GATE_NAMES``), or None for a
    mechanism without one (TTT's w is its layer norm's weight, not a gate)."""
    if entry.gate == "none":
        return None
    params = inspect.signature(entry.op).parameters
    return next((name for name in GATE_NAMES if name in params), None)


def _make_route(entry, fla_name: str, op: Callable) -> Route:
    """The route to ``fla_name`` for ``entry``'s op: the names come from ``linattn.compat``'s
    function of that name (fla's signature) and its ``op_call``; an op argument with no name
    there is one the route takes only at its default."""
    function = getattr(compat, fla_name)
    op_call = getattr(function, "op_call", None)
    takes = frozenset(inspect.signature(function).parameters)
    params = inspect.signature(op).parameters
    names = dict(op_call.names) if op_call else {}
    parts = dict(op_call.parts) if op_call else {}
    for name in params:
        if name in names or name in parts:
            continue
        found = next((a for a in ALIASES.get(name, (name,)) if a in takes), None)
        if found is not None and found not in names.values():
            names[name] = found
    defaults = {n: p.default for n, p in params.items() if p.default is not inspect.Parameter.empty}
    result = op_call.result if op_call else None
    in_float32 = ("initial_state", *FLA_FLOAT32.get(fla_name, ()))
    return Route(
        entry.name, fla_name, tuple(params), names, defaults, takes, parts, result, in_float32
    )


def _candidates(entry) -> tuple[Route, ...]:
    """``entry``'s routes: fla's chunk kernels, then its recurrent ones (its fused_chunk_ and
    parallel_ variants of a recurrence are the same computation: no route of their own); a
    mechanism fla has in other forms only (softmax variants, DeltaFormer) routes to each of
    them that takes the op's call."""
    names = [p for prefix in ("chunk_", "fused_recurrent_") for p in entry.fla_names
             if p.startswith(prefix)]  # fmt: skip
    found = (_make_route(entry, name, entry.op) for name in names or entry.fla_names)
    return tuple(route for route in found if route.takes_call())


def _without_gate(entry) -> tuple[Route, ...]:
    """``entry``'s routes that take its gate as None (fla's default), when its first route
    does: an op call without the gate (PaTH without its forget gate) is then ``entry``'s
    mechanism too; else none."""
    gate = _gate_argument(entry)
    taking = []
    for route in _candidates(entry) if gate is not None else ():
        fla = route.names.get(gate)
        signature = inspect.signature(getattr(compat, route.fla_name)).parameters
        if fla is not None and signature[fla].default is None:
            taking.append(route)
        elif not taking:
            return ()
    return tuple(taking)


_ROUTES: dict[tuple[str, str], tuple[Route, ...]] = {}


def routes(op_name: str, gate: str) -> tuple[Route, ...]:
    """The registered mechanism computed by the op ``op_name`` with a gate ``gate`` as fla
    routes, chunk entry points first, then the recurrent ones (empty where fla has none)."""
    key = (op_name, gate)
    found = _ROUTES.get(key)
    if found is None:
        # Several mechanisms share an op (linear attention: linear, scalar decay, GLA): the
        # call's gate picks one; a call whose gate no entry has (Comba without g) has no route,
        # unless the op's mechanism takes its gate as None in fla (PaTH, FoX, GSA).
        mine = [
            e for e in registry.mechanisms() if _op_name(e) == op_name and e.fla_names and routed(e)
        ]
        entries = [e for e in mine if e.gate == gate]
        found = _candidates(entries[0]) if entries else ()
        if not entries and gate == "none":
            found = next(filter(None, (_without_gate(e) for e in mine)), ())
        _ROUTES[key] = found
    return found


def routed(entry) -> bool:
    """Whether ``entry``'s op consults the backend choice (``ops.backends.ROUTED_OPS``): only
    those ops can send a call to fla's kernels."""
    return _op_name(entry) in _backends.ROUTED_OPS


def served_by(entry) -> str | None:
    """The name of the earlier registered mechanism with fla names whose op, gate and rule are
    ``entry``'s, or None: a reparametrisation (retention, HGRN, Based, ...) computed by another
    mechanism's op is dispatched as that mechanism, whose routes the op's call takes (only a
    routed op has routes to share). Another rule on the same op (log-linear Gated DeltaNet on
    log-linear attention's) is not served: its call has an argument fla's route lacks."""
    if not routed(entry):
        return None
    for e in registry.mechanisms():
        if e is entry:
            return None
        if (
            e.fla_names
            and _op_name(e) == _op_name(entry)
            and e.gate == entry.gate
            and e.rule == entry.rule
        ):
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
    (``UNROUTED`` says why for each of the package's own)."""
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


def flash_attn_ready(function: Callable) -> bool:
    """Whether fla's module of ``function`` found flash-attn when it was imported (it binds
    ``flash_attn_func`` to None otherwise, and its entry point raises)."""
    module = sys.modules.get(getattr(function, "__module__", ""), None)
    return getattr(module, "flash_attn_func", None) is not None


def refusal(route: Route, q: Tensor, given: dict[str, object]) -> dict[str, object] | str:
    """fla's keyword arguments for the op's call ``given`` (q its query) on ``route``, or why
    fla's kernel cannot take it by the facts above (whether fla and flash-attn import aside)."""
    name = route.fla_name
    if name in FLA_REFUSES_FLOAT32 and q.dtype == torch.float32:
        return f"{name} refuses float32"
    if name not in FLA_GROUPED and given["v"].shape[2] > q.shape[2]:  # grouped value heads
        return f"{name} needs as many value heads as query heads"
    kwargs = route.arguments(given)
    if isinstance(kwargs, str):
        return kwargs
    backward = FLA_BACKWARD_LIMITS.get(name)
    grads = (name in FLA_NO_BACKWARD or backward is not None) and _records_grad(given)
    if grads and name in FLA_NO_BACKWARD:
        return f"{name} has no backward"
    if name in FLA_OTHER_STATE and (
        given.get("initial_state") is not None or given.get("output_final_state")
    ):
        return f"{name} cannot take or give the op's state: {FLA_OTHER_STATE[name]}"
    limit = FLA_LIMITS.get(name)
    why = None if limit is None else limit(kwargs)
    if why is None and grads:
        why = backward(kwargs)
    return kwargs if why is None else f"{name}: {why}"


def _records_grad(given: dict[str, object]) -> bool:
    """Whether the call records gradients: grad mode on, and an argument (or a part of a
    state) that requires them. Asked only where fla's route has a fact about backwards."""
    return torch.is_grad_enabled() and _requires_grad(given.values())


def _requires_grad(values) -> bool:
    for value in values:
        if isinstance(value, Tensor):
            if value.requires_grad:
                return True
        elif isinstance(value, (tuple, list)) and _requires_grad(value):
            return True
    return False


def resolve(op_name: str, q: Tensor, g: Tensor | None, given: dict[str, object]):
    """fla's function, keyword arguments and return conversion for this op call (a ``Chosen``),
    or why fla cannot take it (a string). ``given``: the op's arguments by name; ``g``: the
    tensor whose shape names the gate (None: no gate)."""
    ready = fla_ready()
    if ready is not True:
        return ready
    candidates = routes(op_name, _gate_of(g))
    if not candidates:
        return f"fla has no kernel for this mechanism (gate {_gate_of(g)!r})"
    if given.get("mode", "chunk") == "recurrent":  # a decoding step: fla's recurrent kernel first
        candidates = sorted(candidates, key=lambda r: not r.fla_name.startswith("fused_recurrent_"))
    reasons = []
    for route in candidates:
        kwargs = refusal(route, q, given)
        if isinstance(kwargs, str):
            reasons.append(kwargs)
            continue
        function = fla_function(route.fla_name)
        needs = FLA_FLASH_ATTN.get(route.fla_name, False)
        if (needs is None or (needs and kwargs.get(needs))) and not flash_attn_ready(function):
            reasons.append(f"{route.fla_name} needs flash-attn, which does not import")
            continue
        return Chosen(function, kwargs, route.returns(given))
    return "; ".join(reasons)


def _flat(values) -> list[object]:
    """The values, the parts of tuples and lists among them taken out (recursively)."""
    out = []
    for value in values:
        if isinstance(value, (tuple, list)):
            out.extend(_flat(value))
        else:
            out.append(value)
    return out


def tensors(result: object) -> list[Tensor]:
    """The tensors of an op's return, in order (o first, then its states' parts), Nones left
    out: ops return a tensor, (o, S), (o, (S_k, S_v)), a NamedTuple state, ..."""
    return [t for t in _flat([result]) if isinstance(t, Tensor)]


def op_name(entry) -> str:
    """The name of ``entry``'s op in ``linattn.ops`` ("delta_rule" for Gated DeltaNet)."""
    return _op_name(entry)


def query_groups(entry) -> int:
    """The query heads per key head ``entry``'s first route needs (``FLA_QUERY_GROUPS``; 1)."""
    found = routes(_op_name(entry), entry.gate)
    return FLA_QUERY_GROUPS.get(found[0].fla_name, 1) if found else 1


def arguments(entry, inputs: dict[str, Tensor | None], **extra: object) -> dict[str, object]:
    """The op's arguments by name for a registry case's ``inputs`` (``Entry.case.inputs``): the
    op's defaults, the case's tensors, its state as the initial state ("S0", or its parts
    "S0_<part>" as one tuple), the final state asked for, then ``extra``."""
    params = inspect.signature(entry.op).parameters
    out = {n: p.default for n, p in params.items() if p.default is not inspect.Parameter.empty}
    out.update({n: t for n, t in inputs.items() if n in params})
    if "initial_state" in params:
        parts = tuple(t for n, t in inputs.items() if n.startswith("S0_"))
        out["initial_state"] = inputs["S0"] if "S0" in inputs else (parts or None)
    if "output_final_state" in params:
        out["output_final_state"] = True
    out.update(extra)
    return out


def call(entry, given: dict[str, object]):
    """``entry``'s op called with the arguments ``given`` by name (positional ones in order)."""
    params = inspect.signature(entry.op).parameters
    positional = [given[n] for n, p in params.items() if p.kind is p.POSITIONAL_OR_KEYWORD]
    keywords = {n: given[n] for n, p in params.items() if p.kind is p.KEYWORD_ONLY}
    return entry.op(*positional, **keywords)


def resolve_call(entry, given: dict[str, object]):
    """``resolve`` for ``entry``'s op called with ``given``: its query (q, or RWKV-7's r) and
    its gate (``GATE_NAMES``: g, RWKV-7's w, the gated Oja rule's gv; none for a mechanism
    without a gate) found by name."""
    params = inspect.signature(entry.op).parameters
    query = next(iter(params))
    gate = _gate_argument(entry)
    return resolve(_op_name(entry), given[query], given.get(gate), given)
