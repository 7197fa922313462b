"""Hugging Face transformers' linear-attention models on linattn's CPU ops.

transformers (5.x) binds one kernel per mechanism at import: in each modeling module, a function
such as ``torch_chunk_gated_delta_rule`` wraps fla's Triton kernel when fla imports, else its own
pure-PyTorch fallback (``use_kernel_func_from_hub_with_fallback``); the layer's ``forward`` calls
that module-level name. On the CPU the fla binding fails at its first launch ("0 active drivers")
and the fallback is slow. This module puts linattn behind those names
(``linattn.integrations._hf_kernels``: the chunk form for prefill, ``recurrent_step`` for
decoding), whichever was bound:

- ``apply(model)``: one built model, in place: its linear-attention layers' methods are rebound to
  module globals in which the kernel names are linattn's; other models keep theirs.
- ``enable()``: the modeling modules' kernel names themselves (every model, built before or after).
- ``disable()``: undoes both (``restore(model)``: one model, a copy of an applied one too).

Families (the kernel code each shares, identical in transformers 5.23): Gated DeltaNet (Qwen3-Next,
Qwen3.5, Qwen3.5-MoE, OLMo-Hybrid, Qwen4-Exp), Kimi Delta Attention (Kimi-Linear, Bailing-Hybrid,
GLM-5-Next) and Mamba-2's SSD (Mamba-2, Bamba, Falcon-H1, Granite-MoE-Hybrid, Nemotron-H, Zamba2).
The short convolution (causal-conv1d's kernel when installed, CUDA only) is replaced too. The
gated RMS norms are transformers' own PyTorch modules unless a Hub kernel is requested
(``use_kernels=True``), which is left alone.
"""

from __future__ import annotations

import importlib
import types
import weakref
from collections.abc import Callable

from torch import nn

from linattn.integrations import _hf_kernels as kernels

CONV = {
    "causal_conv1d_fn": kernels.causal_conv1d_fn,
    "causal_conv1d_update": kernels.causal_conv1d_update,
}
GATED_DELTA = {
    "torch_chunk_gated_delta_rule": kernels.chunk_gated_delta_rule,
    "torch_recurrent_gated_delta_rule": kernels.recurrent_gated_delta_rule,
    **CONV,
}
KDA = {
    "chunk_kimi_delta_attention": kernels.chunk_kda,
    "recurrent_kimi_delta_attention": kernels.recurrent_kda,
    **CONV,
}
MAMBA2 = {
    "mamba2_chunk_scan": kernels.mamba2_chunk_scan,
    "mamba2_selective_state_update": kernels.mamba2_selective_state_update,
    "mamba2_split_conv1d_scan_combined": kernels.mamba2_split_conv1d_scan_combined,
    **CONV,
}
# transformers.models.<family>.modeling_<family> -> the kernel names linattn serves there.
FAMILIES: dict[str, dict[str, Callable]] = {
    **dict.fromkeys(
        ("qwen3_next", "qwen3_5", "qwen3_5_moe", "olmo_hybrid", "qwen4_exp"), GATED_DELTA
    ),
    **dict.fromkeys(("kimi_linear", "bailing_hybrid", "glm5_next"), KDA),
    **dict.fromkeys(
        ("mamba2", "bamba", "falcon_h1", "granitemoehybrid", "nemotron_h", "zamba2"), MAMBA2
    ),
}

# enable(): module name -> {kernel name: what transformers had bound}.
_enabled: dict[str, dict[str, object]] = {}
# apply(): the layers whose methods are rebound (their instance attributes), until disable().
_applied: weakref.WeakSet[nn.Module] = weakref.WeakSet()


def check_model(model: object) -> nn.Module:
    """model itself, checked to be a module (the argument of ``apply`` and ``restore``).

    Raises:
        TypeError: model is not a torch.nn.Module.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    return model


def module_name(family: str) -> str:
    """The modeling module of a family: ``transformers.models.F.modeling_F``.

    Raises:
        TypeError: family is not a str.
        ValueError: family is not one of ``FAMILIES``.
    """
    if not isinstance(family, str):
        raise TypeError(f"family must be a str, got {type(family).__name__}")
    if family not in FAMILIES:
        raise ValueError(f"family must be one of {', '.join(sorted(FAMILIES))}; got {family!r}")
    return f"transformers.models.{family}.modeling_{family}"


def family_of(cls: type) -> str | None:
    """The family whose modeling module defines cls, or None.

    Raises:
        TypeError: cls is not a class.
    """
    if not isinstance(cls, type):
        raise TypeError(f"cls must be a class, got {type(cls).__name__}")
    prefix, _, family = cls.__module__.rpartition(".modeling_")
    return family if family in FAMILIES and prefix.endswith(f"models.{family}") else None


class Globals(dict):
    """A modeling module's globals seen through linattn's kernels: overrides, then the module."""

    def __init__(self, module_globals: dict, overrides: dict[str, Callable]) -> None:
        super().__init__(overrides, __builtins__=module_globals["__builtins__"])
        self.module_globals = module_globals

    def __missing__(self, name: str) -> object:
        return self.module_globals[name]


def names_used(fn: types.FunctionType, seen: set[int] | None = None) -> set[str]:
    """The global names a function (and the functions in its closure, e.g. a decorator's) reads."""
    seen = set() if seen is None else seen
    seen.add(id(fn))
    names = set(fn.__code__.co_names)
    for cell in fn.__closure__ or ():
        try:
            inner = cell.cell_contents
        except ValueError:  # an empty cell
            continue
        if isinstance(inner, types.FunctionType) and id(inner) not in seen:
            names |= names_used(inner, seen)
    return names


def rebind(
    fn: types.FunctionType, module_globals: dict, new_globals: dict, memo: dict | None = None
) -> types.FunctionType:
    """A copy of fn reading new_globals where it read module_globals, its closure's too.

    The layer's ``forward`` may be wrapped by a decorator defined elsewhere (transformers'
    ``force_accelerate_hooks``): the wrapper keeps its own globals and the function in its closure
    is rebound, so that the layer runs transformers' own code with linattn's kernels. Closure
    cells are new (the original function keeps its own); memo ends cycles (a recursive closure).
    """
    memo = {} if memo is None else memo
    if id(fn) in memo:
        return memo[id(fn)]
    scope = new_globals if fn.__globals__ is module_globals else fn.__globals__
    cells = None if fn.__closure__ is None else tuple(types.CellType() for _ in fn.__closure__)
    copy = types.FunctionType(fn.__code__, scope, fn.__name__, fn.__defaults__, cells)
    memo[id(fn)] = copy
    for old, new in zip(fn.__closure__ or (), cells or (), strict=True):
        try:
            inner = old.cell_contents
        except ValueError:  # an empty cell (a name not yet assigned in the enclosing scope)
            continue
        if isinstance(inner, types.FunctionType):
            inner = rebind(inner, module_globals, new_globals, memo)
        new.cell_contents = inner  # e.g. the __class__ cell of zero-argument super() as it was
    copy.__kwdefaults__ = fn.__kwdefaults__
    copy.__dict__.update(fn.__dict__)
    copy.__qualname__ = fn.__qualname__
    return copy


def kernel_methods(cls: type, names: set[str]) -> dict[str, types.FunctionType]:
    """The methods of cls (its MRO) that call one of the kernel names."""
    methods: dict[str, types.FunctionType] = {}
    for klass in reversed(cls.__mro__):
        for attr, value in vars(klass).items():
            if isinstance(value, types.FunctionType) and names & names_used(value):
                methods[attr] = value
            elif attr in methods:
                del methods[attr]  # overridden by a method that calls no kernel
    return methods


def apply(model: nn.Module) -> nn.Module:
    """Make a built transformers model's linear-attention layers run on linattn, in place.

    Every layer of a known family (``FAMILIES``) whose methods call a bound kernel gets those
    methods rebound as instance attributes, reading linattn's kernels (prefill: the chunk form;
    decoding: ``recurrent_step``); the rest of the model is untouched and other models keep
    transformers' binding. Returns the model. ``disable()`` undoes it.

    Raises:
        TypeError: model is not a torch.nn.Module.
        ValueError: the model has no layer linattn serves.
    """
    check_model(model)
    layers = [(m, family_of(type(m))) for m in model.modules()]
    layers = [(m, f) for m, f in layers if f is not None and patch_layer(m, FAMILIES[f])]
    if not layers:
        families = ", ".join(sorted(FAMILIES))
        raise ValueError(
            f"model ({type(model).__name__}) has no linear-attention layer linattn serves; "
            f"known families: {families}"
        )
    return model


def patch_layer(layer: nn.Module, overrides: dict[str, Callable]) -> bool:
    """Rebind layer's kernel-calling methods as instance attributes; True when there were any.

    A layer with accelerate's hooks (``device_map``, offloading) keeps them: its instance
    ``forward`` is accelerate's wrapper, which calls ``_old_forward``, and that is what is
    rebound. The instance attributes replaced are saved for ``restore``.
    """
    methods = kernel_methods(type(layer), set(overrides))
    if not methods:
        return False
    restore(layer)  # applying twice rebinds from the class again
    module_globals = importlib.import_module(type(layer).__module__).__dict__
    scope = Globals(module_globals, overrides)
    saved = {}
    for attr, fn in methods.items():
        target = "_old_forward" if attr == "forward" and "_old_forward" in vars(layer) else attr
        saved[target] = vars(layer).get(target)
        setattr(layer, target, types.MethodType(rebind(fn, module_globals, scope), layer))
    layer._linattn_saved = saved
    _applied.add(layer)
    return True


def restore(model: nn.Module) -> nn.Module:
    """Undo ``apply`` on model (a copy of an applied model included); returns the model.

    Raises:
        TypeError: model is not a torch.nn.Module (as ``apply``).
    """
    check_model(model)
    for layer in model.modules():
        for attr, value in layer.__dict__.pop("_linattn_saved", {}).items():
            if value is None:
                layer.__dict__.pop(attr, None)
            else:
                setattr(layer, attr, value)
    return model


def enable() -> None:
    """Make every model of the known families use linattn (those built later too).

    Imports each family's modeling module that this transformers has and sets its kernel names
    to linattn's; ``disable()`` puts transformers' bindings back. Calling it twice is harmless.

    Raises:
        ImportError: transformers is not installed (the ``linattn[integrations]`` extra).
    """
    importlib.import_module("transformers")
    for family, overrides in FAMILIES.items():
        name = module_name(family)
        if name in _enabled:
            continue
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue  # a family this transformers does not have
        _enabled[name] = {k: module.__dict__[k] for k in overrides if k in module.__dict__}
        for kernel_name in _enabled[name]:
            setattr(module, kernel_name, overrides[kernel_name])


def disable() -> None:
    """Undo ``enable()`` and every ``apply(model)``: transformers' own bindings again."""
    for name, originals in _enabled.items():
        module = importlib.import_module(name)
        for kernel_name, original in originals.items():
            setattr(module, kernel_name, original)
    _enabled.clear()
    for layer in list(_applied):
        restore(layer)
    _applied.clear()


def is_enabled() -> bool:
    """Whether ``enable()`` is in effect."""
    return bool(_enabled)
