"""The registry of mechanisms: every memory the library computes, one entry each.

A mechanism is one row of the table in docs/design.md: a rule (how a token writes the memory),
a gate (none, one log-decay per head, one per key channel) and a parametrisation of the rule's
inputs. Its entry names everything a user or a tool needs to find it:

    name, title            the registry key ("gated_delta") and the name readers know
    rule, gate             the rule (``linattn.ops.rules``) and the gate; rule None: no fixed
                           memory (softmax attention, whose state is the KV cache)
    transition, write      A_t and w_t of S_t = A_t S_{t-1} + k_t w_t^T, as text
    op, reference          the public op and the float64 oracle it is checked against
    forms                  the forms the op computes ("parallel", "recurrent", "chunk")
    fla_names              fla 0.6.0's entry points that ``linattn.compat`` serves with it
    transformers_names     transformers' model types whose layers run on it
    layer, mixer, preset   the ``nn.Module`` layer, its ``LMConfig.mixers`` name, a preset (a
                           user's entry with a mixer name and no layer is built as
                           ``linattn.layers.RuleMixer`` of its rule and gate)
    paper, section         where it is defined: the paper, and the spec section
    nearest                the registered mechanism it is closest to (a reparametrisation's
                           base, or the rule a new family extends): the baseline of its speed
                           line and the "nearest rule" column of the docs' tables

The tools read this table and nothing else: ``linattn accuracy`` has a row per entry and form,
``linattn bench`` a case per entry, the property tests of ``tests/test_registry.py`` run every
entry's forms against its oracle, and the documentation site has a page per entry. How an entry
makes its inputs, calls its op and runs its oracle is its ``case`` (``linattn.registry.cases``).

A mechanism defined outside the package joins the table with ``register`` (see
docs/adding-a-mechanism.md); the files named in the environment's ``LINATTN_PLUGINS`` are run when
this module is first imported (``load_plugins``), so that the commands see their mechanisms.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from linattn.registry.cases import (
    Case,
    additive_case,
    comba_case,
    delta_case,
    delta_product_case,
    dplr_case,
    forgetting_case,
    gdn2_case,
    moba_case,
    nsa_case,
    parallax_case,
    rule_case,
    rwkv6_case,
    rwkv7_case,
    softmax_case,
    stickbreaking_case,
    wall_case,
)

GATES = ("none", "head", "channel")
FORMS = ("parallel", "recurrent", "chunk")


def _resolve(path: str | Any) -> Any:
    """The object at "package.module:attribute" (imported on first use); a non-string (the
    object itself, as a user's file registers it, or None) as it is."""
    if not isinstance(path, str):
        return path
    module, _, attribute = path.partition(":")
    return getattr(importlib.import_module(module), attribute)


@dataclass(frozen=True)
class Entry:
    """One mechanism of the registry (the module docstring lists the fields)."""

    name: str
    title: str
    rule: str | None
    gate: str
    transition: str
    write: str
    op_path: str | Any  # "package.module:attribute", or the callable itself
    reference_path: str | Any
    case: Case = field(repr=False, compare=False)
    forms: tuple[str, ...] = FORMS
    fla_names: tuple[str, ...] = ()
    transformers_names: tuple[str, ...] = ()
    layer_path: str | Any = None
    mixer: str | None = None
    preset: str | None = None
    paper: str = ""
    section: str = ""
    nearest: str | None = None

    def __post_init__(self) -> None:
        if self.gate not in GATES:
            raise ValueError(f"gate must be one of {GATES}, got {self.gate!r}")
        unknown = [form for form in self.forms if form not in FORMS]
        if unknown or not self.forms:
            raise ValueError(f"forms must be a non-empty subset of {FORMS}, got {self.forms!r}")

    @property
    def op(self) -> Any:
        """The public op (a callable of ``linattn.ops`` or of the module that registered it)."""
        return _resolve(self.op_path)

    @property
    def reference(self) -> Any:
        """The float64 oracle the op is checked against (a NumPy function of one head)."""
        return _resolve(self.reference_path)

    @property
    def layer(self) -> Any:
        """The ``nn.Module`` layer built on the op, or None."""
        return _resolve(self.layer_path)


_ENTRIES: dict[str, Entry] = {}


def register(entry: Entry, *, replace: bool = False) -> Entry:
    """Add ``entry`` to the registry (an existing name only with ``replace``); returns it."""
    if not isinstance(entry, Entry):
        raise TypeError(f"entry must be a linattn.registry.Entry, got {type(entry).__name__}")
    if entry.name in _ENTRIES and not replace:
        raise ValueError(f"a mechanism named {entry.name!r} is registered already")
    _ENTRIES[entry.name] = entry
    return entry


def unregister(name: str) -> None:
    """Remove the mechanism ``name`` (a user's, registered for a test or a session)."""
    _ENTRIES.pop(get(name).name)


def get(name: str) -> Entry:
    """The entry of the mechanism ``name``."""
    try:
        return _ENTRIES[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown mechanism {name!r}; registered: {names()}") from None


def names() -> tuple[str, ...]:
    """Every registered mechanism's name, in the table's order."""
    return tuple(_ENTRIES)


def mechanisms() -> tuple[Entry, ...]:
    """Every registered entry, in the table's order (a user's registrations at the end)."""
    return tuple(_ENTRIES.values())


def with_mixer(mixer: str) -> Entry | None:
    """The entry whose ``mixer`` is ``mixer`` (an ``LMConfig.mixers`` name), or None."""
    return next((e for e in _ENTRIES.values() if e.mixer == mixer), None)


def mixers() -> tuple[str, ...]:
    """The ``LMConfig.mixers`` names of the registered mechanisms that have one."""
    return tuple(e.mixer for e in _ENTRIES.values() if e.mixer is not None)


def with_fla_name(fla_name: str) -> Entry | None:
    """The entry whose ``fla_names`` holds ``fla_name``, or None."""
    return next((e for e in _ENTRIES.values() if fla_name in e.fla_names), None)


_OPS = "linattn.ops"
_GATED = "linattn.reference.gated:recurrence"
_DPLR = "linattn.reference.dplr:recurrence"
_SEC10 = "10"

for _entry in (
    Entry(
        "softmax", "softmax attention", None, "none",
        "none: the KV cache grows with t", "(k_t, v_t) appended to the cache",
        f"{_OPS}:softmax_attention", "linattn.reference.softmax:softmax_attention",
        softmax_case(), forms=("parallel",),
        layer_path="linattn.layers:SoftmaxAttention", mixer="softmax",
        paper="Vaswani et al. (2017)", section="2",
    ),
    Entry(
        "linear", "linear attention", "additive", "none", "I", "v_t",
        f"{_OPS}:linear_attention", _GATED, additive_case("none"),
        fla_names=("chunk_linear_attn", "fused_chunk_linear_attn", "fused_recurrent_linear_attn"),
        layer_path="linattn.layers:LinearAttention", mixer="linear",
        paper="Katharopoulos et al. (2020)", section="4, 5, 5.1",
    ),
    Entry(
        "scalar_decay", "scalar decay (Mamba-2, RetNet)", "additive", "head",
        "alpha_t I", "v_t", f"{_OPS}:linear_attention", _GATED, additive_case("head"),
        fla_names=(
            "chunk_simple_gla", "fused_chunk_simple_gla", "fused_recurrent_simple_gla",
            "parallel_simple_gla", "chunk_retention", "fused_chunk_retention",
            "fused_recurrent_retention", "parallel_retention", "chunk_lightning_attn",
            "fused_recurrent_lightning_attn", "fused_recurrent_hgrn",
        ),
        transformers_names=(
            "mamba2", "bamba", "falcon_h1", "granitemoehybrid", "nemotron_h", "zamba2",
        ),
        layer_path="linattn.layers:Mamba2", mixer="scalar_decay", preset="mamba2",
        paper="Dao and Gu (2024)", section=_SEC10,
    ),
    Entry(
        "gla", "per-channel decay (GLA)", "additive", "channel",
        "Diag(alpha_t)", "v_t", f"{_OPS}:linear_attention", _GATED, additive_case("channel"),
        fla_names=("chunk_gla", "fused_recurrent_gla"),
        layer_path="linattn.layers:GatedLinearAttention", mixer="gla", preset="gla",
        paper="Yang et al. (2024a)", section=_SEC10,
    ),
    Entry(
        "delta", "delta rule (DeltaNet)", "delta", "none",
        "I - beta_t k_t k_t^T", "beta_t v_t", f"{_OPS}:delta_rule", _GATED, delta_case("none"),
        fla_names=("chunk_delta_rule", "fused_recurrent_delta_rule"),
        layer_path="linattn.layers:DeltaNet", mixer="deltanet", preset="deltanet",
        paper="Schlag et al. (2021); Yang et al. (2024b)", section="7, 8",
    ),
    Entry(
        "gated_delta", "Gated DeltaNet", "delta", "head",
        "alpha_t (I - beta_t k_t k_t^T)", "beta_t v_t", f"{_OPS}:delta_rule", _GATED,
        delta_case("head"),
        fla_names=(
            "chunk_gated_delta_rule", "fused_recurrent_gated_delta_rule", "chunk_gdn",
            "fused_recurrent_gdn",
        ),
        transformers_names=("qwen3_next", "qwen3_5", "qwen3_5_moe", "olmo_hybrid", "qwen4_exp"),
        layer_path="linattn.layers:GatedDeltaNet", mixer="gated_deltanet",
        preset="gated_deltanet", paper="Yang, Kautz and Hatamizadeh (2025)", section=_SEC10,
    ),
    Entry(
        "kda", "Kimi Delta Attention (KDA)", "delta", "channel",
        "(I - beta_t k_t k_t^T) Diag(alpha_t)", "beta_t v_t", f"{_OPS}:delta_rule", _GATED,
        delta_case("channel"),
        fla_names=("chunk_kda", "fused_recurrent_kda"),
        transformers_names=("kimi_linear", "bailing_hybrid", "glm5_next"),
        layer_path="linattn.layers:KimiDeltaAttention", mixer="kda", preset="kimi_linear",
        paper="Kimi Team (2025)", section=_SEC10,
    ),
    Entry(
        "delta_product", "Gated DeltaProduct", "delta", "head",
        "alpha_t prod_j (I - beta_tj k_tj k_tj^T)", "n_h writes beta_tj v_tj",
        f"{_OPS}:gated_delta_product", "linattn.reference.gated:delta_product",
        delta_product_case(),
        fla_names=("chunk_gated_delta_product",),
        layer_path="linattn.layers:GatedDeltaProduct", mixer="deltaproduct",
        paper="Siems et al. (2025)", section=_SEC10,
    ),
    Entry(
        "iplr", "generalized delta rule, identity plus low rank (IPLR)", "dplr", "none",
        "I + a_t b_t^T", "v_t", f"{_OPS}:generalized_delta_rule", _DPLR, dplr_case("none"),
        fla_names=("chunk_iplr_delta_rule", "fused_recurrent_iplr_delta_rule"),
        paper="Yang et al. (2024b); Peng et al. (2025)", section="8, 10",
    ),
    Entry(
        "dplr", "generalized delta rule, diagonal plus low rank (DPLR)", "dplr", "channel",
        "Diag(alpha_t) + a_t b_t^T", "v_t", f"{_OPS}:generalized_delta_rule", _DPLR,
        dplr_case("channel"),
        fla_names=("chunk_dplr_delta_rule", "fused_recurrent_dplr_delta_rule"),
        paper="Peng et al. (2025)", section="8, 10",
    ),
    Entry(
        "comba", "Comba", "dplr", "head",
        "alpha_t I - beta_t k_t p_t^T", "beta_t v_t", f"{_OPS}:comba", _DPLR, comba_case(),
        fla_names=("chunk_comba", "fused_recurrent_comba"),
        layer_path="linattn.layers:Comba", mixer="comba",
        paper="Hu et al. (2025)", section=_SEC10,
    ),
    Entry(
        "rwkv7", "RWKV-7", "dplr", "channel",
        "Diag(exp w_t) + b_t a_t^T", "v_t", f"{_OPS}:rwkv7", _DPLR, rwkv7_case(),
        fla_names=("chunk_rwkv7", "fused_recurrent_rwkv7", "fused_mul_recurrent_rwkv7"),
        layer_path="linattn.layers:RWKV7", mixer="rwkv7",
        paper="Peng et al. (2025)", section=_SEC10,
    ),
    Entry(
        "gdn2", "Gated DeltaNet-2", "dplr", "channel",
        "(I - k_t (b_t * k_t)^T) Diag(alpha_t)", "w_t * v_t", f"{_OPS}:gated_deltanet2", _DPLR,
        gdn2_case(),
        fla_names=("chunk_gdn2", "fused_recurrent_gdn2"),
        layer_path="linattn.layers:GatedDeltaNet2", mixer="gdn2",
        paper="fla 0.6.0 (fla.ops.gdn2)", section=_SEC10,
    ),
    Entry(
        "rwkv6", "RWKV-6", "additive", "channel",
        "Diag(exp w_t)", "v_t (read before the write, with the bonus u)", f"{_OPS}:rwkv6",
        "linattn.reference.rwkv6:recurrence", rwkv6_case(),
        fla_names=("chunk_rwkv6", "fused_recurrent_rwkv6"),
        paper="Peng et al. (2024)", section=_SEC10,
    ),
    # issue 52: softmax attention with a forget gate (FoX), and stick-breaking attention
    Entry(
        "forgetting", "forgetting attention (FoX)", None, "head",
        "none: the KV cache grows with t; logit of key s decayed by prod_{s<i<=t} f_i",
        "(k_t, v_t) appended to the cache", "linattn.ops.softmax_variants:forgetting_attention",
        "linattn.reference.forgetting:forgetting_attention", forgetting_case(),
        forms=("parallel", "chunk"), fla_names=("parallel_attn", "parallel_forgetting_attn"),
        layer_path="linattn.layers.forgetting:ForgettingAttention",
        paper="Lin et al. (2025)", section="2", nearest="softmax",
    ),
    Entry(
        "stickbreaking", "stick-breaking attention", None, "none",
        "none: the KV cache grows with t", "(k_t, v_t) appended to the cache",
        "linattn.ops.softmax_variants:stickbreaking_attention",
        "linattn.reference.stickbreaking:stickbreaking_attention", stickbreaking_case(),
        forms=("parallel", "chunk"), fla_names=("parallel_stickbreaking_attn",),
        paper="Tan et al. (2024)", section="2", nearest="softmax",
    ),
    Entry(
        "parallax", "Parallax attention", None, "none",
        "none: the KV cache grows with t", "(r-corrected softmax weights) (k_t, v_t) appended",
        "linattn.ops.softmax_variants:parallax_attention", "linattn.reference.parallax:parallax",
        parallax_case(), forms=("parallel",), fla_names=("parallel_parallax",),
        paper="fla 0.6.0 (fla.ops.parallax; arXiv 2605.29157)", section="2", nearest="softmax",
    ),
    Entry(
        "wall", "Wall attention", None, "channel",
        "none: the KV cache grows with t; key channel n decayed by prod_{s<i<=t} exp(g_in)",
        "(k_t, v_t) appended to the cache", "linattn.ops.softmax_variants:wall_attention",
        "linattn.reference.wall:wall_attention", wall_case(), forms=("parallel",),
        fla_names=("parallel_wall_attn", "parallel_wall_attn_decode"),
        paper="fla 0.6.0 (fla.ops.wall_attn, Tilde Research)", section="2", nearest="forgetting",
    ),
    Entry(
        "nsa", "native sparse attention (NSA)", None, "none",
        "none: the KV cache grows with t (read through pooled, selected and recent blocks)",
        "(k_t, v_t) appended to the cache", "linattn.ops.nsa:native_sparse_attention",
        "linattn.reference.nsa:native_sparse_attention", nsa_case(), forms=("parallel",),
        fla_names=("parallel_nsa",), paper="Yuan et al. (2025)", section="2", nearest="softmax",
    ),
    Entry(
        "moba", "mixture of block attention (MoBA)", None, "none",
        "none: the KV cache grows with t (read through the best-matching blocks)",
        "(k_t, v_t) appended to the cache", "linattn.ops.moba:mixture_of_block_attention",
        "linattn.reference.moba:mixture_of_block_attention", moba_case(), forms=("parallel",),
        fla_names=("parallel_moba",), paper="Lu et al. (2025)", section="2", nearest="softmax",
    ),
):  # fmt: skip
    register(_entry)

__all__ = [
    "Case",
    "Entry",
    "rule_case",
    "FORMS",
    "GATES",
    "get",
    "mechanisms",
    "names",
    "load_plugins",
    "mixers",
    "register",
    "unregister",
    "with_fla_name",
    "with_mixer",
]

PLUGINS_VARIABLE = "LINATTN_PLUGINS"
_LOADED: set[str] = set()


def load_plugins(paths: str | None = None) -> list[str]:
    """Run the Python files named in ``paths`` (default: the environment's ``LINATTN_PLUGINS``,
    separated by ``os.pathsep``), once each, and call each one's ``register()`` if it defines
    one; returns the files run now. A plugin is how a rule written outside the package reaches
    the ``linattn`` commands and their worker processes, which import this module and so run it
    too: ``LINATTN_PLUGINS=my_rule.py linattn accuracy`` has the rule's rows."""
    paths = os.environ.get(PLUGINS_VARIABLE, "") if paths is None else paths
    loaded = []
    for path in filter(None, paths.split(os.pathsep)):
        file = Path(path).expanduser().resolve()
        if str(file) in _LOADED:
            continue
        if not file.is_file():
            raise ValueError(f"{PLUGINS_VARIABLE}: {path!r} is not a file")
        spec = importlib.util.spec_from_file_location(f"linattn_plugin_{file.stem}", file)
        module = importlib.util.module_from_spec(spec)
        _LOADED.add(str(file))  # before running it: a plugin that imports linattn runs once
        spec.loader.exec_module(module)
        if callable(getattr(module, "register", None)):
            module.register()
        loaded.append(str(file))
    return loaded


load_plugins()


def __getattr__(name: str) -> Any:
    # MECHANISMS is the table as it is when read (a user's registrations included).
    if name == "MECHANISMS":
        return mechanisms()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
