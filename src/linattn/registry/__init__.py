"""The registry of mechanisms: every memory the library computes, one entry each.

A mechanism is one row of the table in docs/design.md: a rule (how a token writes the memory),
a gate (none, one log-decay per head, one per key channel) and a parametrisation of the rule's
inputs. Its entry names everything a user or a tool needs to find it:

    name, title            the registry key ("gated_delta") and the name readers know
    rule, gate             the rule (``linattn.ops.rules``) and the gate; rule None: no rule of
                           ``linattn.ops.rules`` (softmax attention, whose state is the KV
                           cache; a memory with an op of its own: CyFA, TTT-Linear, Titans)
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
    cyfa_case,
    delta_case,
    delta_product_case,
    deltaformer_case,
    dplr_case,
    dsa_case,
    forgetting_case,
    gated_oja_case,
    gdn2_case,
    hgrn2_case,
    hgrn_case,
    kernel_case,
    lightnet_case,
    lightning_case,
    log_linear_case,
    mesa_case,
    moba_case,
    momentum_case,
    nsa_case,
    parallax_case,
    path_case,
    precond_case,
    retention_case,
    rule_case,
    rwkv4_case,
    rwkv6_case,
    rwkv7_case,
    slots_case,
    softmax_case,
    stickbreaking_case,
    titans_case,
    ttt_case,
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
            "parallel_simple_gla",
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
        layer_path="linattn.layers:IPLR", mixer="iplr",
        paper="Yang et al. (2024b); Peng et al. (2025)", section="8, 10",
    ),
    Entry(
        "dplr", "generalized delta rule, diagonal plus low rank (DPLR)", "dplr", "channel",
        "Diag(alpha_t) + a_t b_t^T", "v_t", f"{_OPS}:generalized_delta_rule", _DPLR,
        dplr_case("channel"),
        fla_names=("chunk_dplr_delta_rule", "fused_recurrent_dplr_delta_rule"),
        layer_path="linattn.layers:DPLR", mixer="dplr",
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
        layer_path="linattn.layers:RWKV6", mixer="rwkv6",
        paper="Peng et al. (2024)", section=_SEC10,
    ),
    # test-time-training memories and CyFA
    Entry(
        "cyfa", "CyclicFlowAttention (CyFA)", None, "head",
        "alpha_t I on H^k (K x M) and H^v (M x V); softmax readout over M clock slots",
        "k~_t w_t^T and w_t v_t^T, w_t = beta_t a(lambda_t)", "linattn.ops.cyfa:cyfa",
        "linattn.reference.cyfa:cyfa", cyfa_case(),
        fla_names=("chunk_cyfa", "fused_recurrent_cyfa"),
        layer_path="linattn.layers:CyclicFlowAttention",
        paper="Chen (2026), CyFA (fla 0.6.0, fla.ops.cyfa)", section=_SEC10,
        nearest="scalar_decay",
    ),
    Entry(
        "ttt_linear", "TTT-Linear (test-time training)", None, "none",
        "W_0 for every token of a mini-batch of b; W_0 - eta_b sum_s k_s^T grad_s at its end",
        "-eta_t sum_{s <= t} k_s^T grad_s, grad_s through LN(k_s W_0 + h_0) - (v_s - k_s)",
        "linattn.ops.ttt:ttt_linear", "linattn.reference.ttt:ttt_linear", ttt_case(),
        forms=("recurrent", "chunk"),
        fla_names=("chunk_ttt_linear", "fused_chunk_ttt_linear"),
        layer_path="linattn.layers:TTTLinear",
        paper="Sun et al. (2024), Learning to (Learn at Test Time)", section="7.1",
        nearest="delta",
    ),
    Entry(
        "titans", "Titans (linear memory, momentum and forgetting)", None, "head",
        "M_t = (1 - alpha_t) M_{t-1} + S_t, S_t = eta_t S_{t-1} + (write)",
        "-2 theta_t k_t^T u_t, u_t fla's surprise at the chunk's first M",
        "linattn.ops.titans:titans_linear", "linattn.reference.titans:titans_linear",
        titans_case(), forms=("recurrent", "chunk"),
        fla_names=("chunk_titans_linear",), layer_path="linattn.layers:Titans",
        paper="Behrouz, Zhong and Mirrokni (2024), Titans", section="7.1",
        nearest="ttt_linear",
    ),
    # two passes of the additive rule over m memory slots, a softmax between them
    Entry(
        "gsa", "gated slot attention (GSA)", "additive", "channel",
        "Diag(alpha_t) on the slots of S_k (K x m) and S_v (m x V)",
        "k_t s_t^T, then s_t v_t^T (p_t = softmax(S_k^T q_t) reads S_v)",
        f"{_OPS}:gated_slot_attention", "linattn.reference.gsa:gated_slot_attention",
        slots_case(gated=True), fla_names=("chunk_gsa", "fused_recurrent_gsa"),
        layer_path="linattn.layers:GatedSlotAttention", paper="Zhang et al. (2024)",
        section=_SEC10, nearest="gla",
    ),
    Entry(
        "abc", "ABC (attention with bounded-memory control)", "additive", "none",
        "Diag(exp(z_{t-1} - z_t)) on the slots (z_t = log sum_{i<=t} exp s_i)",
        "k_t exp(s_t - z_t)^T, then exp(s_t - z_t) v_t^T (softmax over the slots between)",
        f"{_OPS}:abc_attention", "linattn.reference.abc:abc", slots_case(gated=False),
        fla_names=("chunk_abc",), layer_path="linattn.layers:ABCAttention",
        paper="Peng et al. (2022)", section="4, 5, 10",
        nearest="gla",
    ),
    # reparametrisations of existing mechanisms (computed by their op), and RWKV-4
    Entry(
        "retention", "retention (RetNet)", "additive", "head",
        "gamma_h I, gamma_h = 1 - 2^(-5 - h)", "v_t", f"{_OPS}:linear_attention",
        "linattn.reference.retention:constant_decay", retention_case(),
        fla_names=(
            "chunk_retention", "fused_chunk_retention", "fused_recurrent_retention",
            "parallel_retention",
        ),
        layer_path="linattn.layers:MultiScaleRetention",
        paper="Sun et al. (2023)", section=_SEC10, nearest="scalar_decay",
    ),
    Entry(
        "lightning", "lightning attention", "additive", "head",
        "gamma_h I, gamma_h = exp(-(8 / H) (1 - l / L) h)", "v_t", f"{_OPS}:linear_attention",
        "linattn.reference.retention:constant_decay", lightning_case(),
        fla_names=("chunk_lightning_attn", "fused_recurrent_lightning_attn"),
        layer_path="linattn.layers:LightningAttention", mixer="lightning",
        paper="Qin et al. (2024)", section=_SEC10, nearest="scalar_decay",
    ),
    Entry(
        "hgrn", "HGRN (element-wise gated recurrence)", "additive", "head",
        "exp(g_t) per channel (a head of K = V = 1 each)", "x_t", f"{_OPS}:linear_attention",
        "linattn.reference.hgrn:hgrn", hgrn_case(),
        fla_names=("chunk_hgrn", "fused_recurrent_hgrn"),
        layer_path="linattn.layers:HGRN", mixer="hgrn",
        paper="Qin, Yang and Zhong (2023)", section=_SEC10, nearest="scalar_decay",
    ),
    Entry(
        "hgrn2", "HGRN2 (GLA with keys 1 - f_t)", "additive", "channel",
        "Diag(f_t)", "v_t (key 1 - f_t)", f"{_OPS}:linear_attention",
        "linattn.reference.hgrn:hgrn2", hgrn2_case(), layer_path="linattn.layers:HGRN2",
        paper="Qin et al. (2024b)", section=_SEC10, nearest="gla",
    ),
    Entry(
        "lightnet", "LightNet (GLA with keys a softmax over time)", "additive", "channel",
        "Diag(exp(z_{t-1} - z_t))", "v_t (key exp(k_t - z_t))", f"{_OPS}:linear_attention",
        "linattn.reference.lightnet:lightnet", lightnet_case(),
        fla_names=("chunk_lightnet", "fused_recurrent_lightnet"),
        layer_path="linattn.layers:LightNet",
        paper="Qin et al. (2024c)", section=_SEC10, nearest="gla",
    ),
    Entry(
        "based", "Based (Taylor feature map, normalised)", "additive", "none", "I",
        "v_t and 1 (the normaliser), keys phi(k_t)", f"{_OPS}:linear_attention",
        "linattn.reference.based:based", kernel_case("based"),
        fla_names=("fused_chunk_based", "parallel_based"),
        layer_path="linattn.layers:Based", mixer="based",
        paper="Arora et al. (2024)", section="3, 4", nearest="linear",
    ),
    Entry(
        "rebased", "ReBased (squared kernel, normalised)", "additive", "none", "I",
        "v_t and 1 (the normaliser), keys vec(k_t k_t^T)", f"{_OPS}:linear_attention",
        "linattn.reference.based:rebased", kernel_case("rebased"),
        fla_names=("parallel_rebased",),
        layer_path="linattn.layers:ReBased", mixer="rebased",
        paper="Aksenov et al. (2024)", section="3, 4", nearest="linear",
    ),
    Entry(
        "rwkv4", "RWKV-4 (WKV)", "additive", "channel",
        "exp(-exp(w)) per channel", "exp(k_t) v_t and exp(k_t) (read before, bonus exp(u))",
        f"{_OPS}:rwkv6", "linattn.reference.rwkv4:wkv", rwkv4_case(),
        fla_names=("fused_recurrent_rwkv4",),
        layer_path="linattn.layers:RWKV4", mixer="rwkv4",
        paper="Peng et al. (2023)", section=_SEC10, nearest="rwkv6",
    ),
    # log-linear attention (a Fenwick tree of level states over Mamba-2's memory)
    Entry(
        "log_linear_mamba2", "log-linear Mamba-2", "additive", "head",
        "alpha_t I per level; Fenwick merge of levels 1 .. z at each step",
        "v_t, read with a weight lambda_t^(l) per level", f"{_OPS}:log_linear_attention",
        "linattn.reference.log_linear:recurrence", log_linear_case(),
        fla_names=("chunk_log_linear_attn",),
        layer_path="linattn.layers:LogLinearMamba2", mixer="log_linear_mamba2",
        paper="Guo, Yang et al. (2025)", section=_SEC10, nearest="scalar_decay",
    ),
    Entry(
        "log_linear_gated_delta", "log-linear Gated DeltaNet", "delta", "head",
        "alpha_t (I - beta_t k_t k_t^T) summed over the levels; Fenwick merge at each step",
        "beta_t v_t, read with a weight lambda_t^(l) per level", f"{_OPS}:log_linear_attention",
        "linattn.reference.log_linear:recurrence", log_linear_case(delta=True),
        layer_path="linattn.layers:LogLinearGatedDeltaNet", mixer="log_linear_gated_deltanet",
        paper="Guo, Yang et al. (2025)", section=_SEC10, nearest="gated_delta",
    ),
    # MesaNet, DeltaFormer, PaTH attention
    Entry(
        "mesa", "MesaNet", None, "head",
        "none: two memories, H_t = gamma_t H_{t-1} + beta_t k_t k_t^T and G_t likewise",
        "o_t = G_t^T (H_t + Diag(lambda))^{-1} q_t (a CG solve per token)",
        f"{_OPS}.mesa:mesa_net", "linattn.reference.mesa:mesa_net", mesa_case(),
        fla_names=("chunk_mesa_net", "mesa_net_decoding_one_step"),
        layer_path="linattn.layers:MesaNet", mixer="mesa",
        paper="von Oswald et al. (2025)", section="7.3", nearest="gated_delta",
    ),
    Entry(
        "deltaformer", "DeltaFormer", None, "none",
        "none: the pseudo-values u_t are cached (a KV cache of k and u)",
        "u_t = v_t - beta_t sum_{s<t} softmax_s(q_t.k_s) u_s; o = softmax attention over (k, u)",
        f"{_OPS}.deltaformer:deltaformer", "linattn.reference.deltaformer:deltaformer",
        deltaformer_case(), fla_names=("deltaformer_attn",),
        layer_path="linattn.layers:DeltaFormer",
        paper="Zhong et al. (2025)", section="8", nearest="delta",
    ),
    Entry(
        "path", "PaTH attention", None, "head",
        "none: the KV cache, each key carried through H_i = I - beta_i w_i w_i^T",
        "(k_t, v_t) appended; scores q_t^T H_t ... H_{s+1} k_s inside softmax",
        f"{_OPS}.path:path_attention", "linattn.reference.path:path_attention", path_case(),
        fla_names=("parallel_path_attn",), layer_path="linattn.layers:PaTHAttention",
        mixer="path", paper="Yang et al. (2025)", section="2", nearest="softmax",
    ),
    # the delta rule's descendants with a second state
    Entry(
        "precond_gated_delta", "Preconditioned Gated DeltaNet", "dplr", "head",
        "alpha_t (I - beta_t kp_t k_t^T), kp_t = x^(-s(A_t)) k_t",
        "beta_t v_t along kp_t (A_t = exp(g_atk_t) A_{t-1} + beta_atk_t k_t^2)",
        "linattn.ops.precond_delta_rule:precond_delta_rule",
        "linattn.reference.precond_delta:recurrence", precond_case("head"),
        fla_names=(
            "chunk_precond_gated_delta_rule", "fused_recurrent_precond_gated_delta_rule",
        ),
        layer_path="linattn.layers:PrecondGatedDeltaNet",
        paper="Preconditioned DeltaNet (arXiv:2604.21100)", section=_SEC10,
        nearest="gated_delta",
    ),
    Entry(
        "precond_kda", "Preconditioned KDA", "dplr", "channel",
        "(I - beta_t kp_t k_t^T) Diag(alpha_t), kp_t = x^(-s(A_t)) k_t",
        "beta_t v_t along kp_t (A_t = exp(g_atk_t) A_{t-1} + beta_atk_t k_t^2)",
        "linattn.ops.precond_delta_rule:precond_delta_rule",
        "linattn.reference.precond_delta:recurrence", precond_case("channel"),
        fla_names=("chunk_precond_kda", "fused_recurrent_precond_kda"),
        layer_path="linattn.layers:PrecondKDA",
        paper="Preconditioned DeltaNet (arXiv:2604.21100)", section=_SEC10, nearest="kda",
    ),
    Entry(
        "momentum_delta", "Momentum DeltaNet (the momentum delta rule)", None, "head",
        "[S; M]: [[alpha_t, -beta_t mu_t], [0, mu_t]] (x) I + [-beta_t; 1] eta_t k_t p_t^T",
        "[-beta_t; 1] eta_t k_t (-v_t)^T: M_t = mu_t M - eta_t k_t (v_t - S^T p_t)^T, S_t = "
        "alpha_t S - beta_t M_t",
        "linattn.ops.momentum_delta_rule:momentum_delta_rule",
        "linattn.reference.momentum_delta:recurrence", momentum_case(),
        fla_names=("chunk_momentum_delta_rule", "fused_recurrent_momentum_delta_rule"),
        layer_path="linattn.layers:MomentumDeltaNet",
        paper="Momentum DeltaNet (arXiv:2605.05838)", section=_SEC10, nearest="gated_delta",
    ),
    Entry(
        "gated_oja", "gated Oja rule", None, "channel",
        "S <- S Diag(exp gv_t) (I - beta_t v_t v_t^T) (acting on the value side)",
        "beta_t v_t along k_t: S_t = S' + beta_t (k_t - S' v_t) v_t^T",
        "linattn.ops.gated_oja_rule:gated_oja_rule", "linattn.reference.gated_oja:recurrence",
        gated_oja_case(),
        fla_names=("chunk_gated_oja_rule", "fused_recurrent_gated_oja_rule"),
        layer_path="linattn.layers:GatedOja",
        paper="Oja (1982); fla 0.6.0 (fla.ops.gated_oja_rule)", section=_SEC10, nearest="kda",
    ),
    # softmax attention with a forget gate (FoX), and stick-breaking attention
    Entry(
        "forgetting", "forgetting attention (FoX)", None, "head",
        "none: the KV cache grows with t; logit of key s decayed by prod_{s<i<=t} f_i",
        "(k_t, v_t) appended to the cache", "linattn.ops.softmax_variants:forgetting_attention",
        "linattn.reference.forgetting:forgetting_attention", forgetting_case(),
        forms=("parallel", "chunk"), fla_names=("parallel_attn", "parallel_forgetting_attn"),
        layer_path="linattn.layers.forgetting:ForgettingAttention", mixer="forgetting",
        paper="Lin et al. (2025)", section="2", nearest="softmax",
    ),
    Entry(
        "stickbreaking", "stick-breaking attention", None, "none",
        "none: the KV cache grows with t", "(k_t, v_t) appended to the cache",
        "linattn.ops.softmax_variants:stickbreaking_attention",
        "linattn.reference.stickbreaking:stickbreaking_attention", stickbreaking_case(),
        forms=("parallel", "chunk"), fla_names=("parallel_stickbreaking_attn",),
        layer_path="linattn.layers:StickBreakingAttention", mixer="stickbreaking",
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
    Entry(
        "dsa", "DeepSeek sparse attention (DSA)", None, "none",
        "none: the KV cache grows with t (read through the indexer's top-k tokens)",
        "(k_t, v_t) and the index key k^I_t appended to the cache",
        "linattn.ops.dsa:deepseek_sparse_attention",
        "linattn.reference.dsa:deepseek_sparse_attention",
        dsa_case(), forms=("parallel",), fla_names=("naive_dsa", "naive_dsa_indexer"),
        paper="DeepSeek-AI (2025), DeepSeek-V3.2", section="2", nearest="softmax",
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
