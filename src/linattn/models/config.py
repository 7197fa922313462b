"""``LMConfig``: the configuration of ``CausalLM``, validated when it is made."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, fields

from linattn.layers.modules import check_dt_range
from linattn.ops.checks import flag

# One name per mechanism of the spec (the mechanism table, docs/design.md);
# ``linattn.models.mixers`` builds them.
MIXERS = (
    "softmax",
    "linear",
    "taylor",
    "scalar_decay",
    "gla",
    "deltanet",
    "gated_deltanet",
    "kda",
    "deltaproduct",
    "mla",
    "gated_attention",
    "mamba2",
    "rwkv7",
    "comba",
    "gdn2",
    "log_linear_mamba2",
)
# The mixers whose state is a KV cache that grows with t: softmax attention and its variants.
ATTENTION_MIXERS = ("softmax", "mla", "gated_attention")
# Blocks that are not a mechanism of the spec: ``"conv"``, the gated short convolution
# (``linattn.layers.GatedConvolution``, Zoology's BaseConv) that the MQAR models put in front.
AUXILIARY_MIXERS = ("conv",)


def known_mixers() -> tuple[str, ...]:
    """``MIXERS``, ``AUXILIARY_MIXERS`` and the mixer names of mechanisms registered since
    (``linattn.registry.register``: a user's rule, built as ``linattn.layers.RuleMixer``)."""
    from linattn import registry  # the registry's entries name layers: imported when needed

    extra = tuple(m for m in registry.mixers() if m not in MIXERS + AUXILIARY_MIXERS)
    return MIXERS + AUXILIARY_MIXERS + extra


# Fields that change neither the parameters' shapes nor what the state means.
_NOT_IN_FINGERPRINT = ("max_seq_len", "chunk_size", "init_std", "dt_init_range")


def _positive_int(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"LMConfig.{name} must be an integer >= 1, got {value!r}")


@dataclass
class LMConfig:
    """A causal language model: embeddings, ``len(mixers)`` blocks (pre-norm mixer + SwiGLU MLP),
    final norm, LM head.

    Args:
        vocab_size: number of token ids.
        d_model: width of the residual stream.
        n_heads: heads of every mixer.
        head_dim: value (and key) dimension per head; default ``d_model // n_heads``, which then
            must divide evenly.
        mixers: one mechanism name per block, from ``MIXERS``, a registered mechanism's mixer
            (``linattn.registry``: ``"log_linear_gated_deltanet"``, ``"mesa"``, ``"path"``,
            ``"forgetting"``, built by their layers' ``from_config``) or ``"conv"`` (a gated short
            convolution); e.g. ``("kda", "kda", "kda", "mla")`` for Kimi Linear's hybrid (spec
            section 10; ``linattn.models.preset("kimi_linear")``), ``("conv", "deltanet")`` for
            Zoology's MQAR model.
        mlp: a SwiGLU MLP after the mixer of every block (default); False gives blocks of the
            mixer alone, as Zoology's MQAR models.
        mlp_ratio: hidden width of the SwiGLU MLP as a multiple of d_model.
        tie_embeddings: the LM head shares the embedding matrix.
        max_seq_len: longest context (prompt plus generated tokens) the model accepts; None for no
            limit (the recurrent mixers need none; rotary embeddings need none either).
        short_conv, conv_size: causal depthwise convolution (kernel 4) + SiLU on q, k, v of the
            recurrent mixers; None (default): each mixer's own, its paper's and fla's (on, but
            off in ``"gla"``).
        output_gate: the recurrent mixers multiply their normed output by a gate computed from
            x; False keeps the per-head RMSNorm alone; None (default): each mixer's own, its
            paper's and fla's (on, but off in ``"deltanet"``, DeltaNet's layer).
        gated_conv_size: kernel of the ``"conv"`` blocks (3, as Zoology's BaseConv).
        chunk_size: block length C of the chunk form; None (default): each mixer's own (64; 32
            for ``"rwkv7"``, ``"comba"`` and ``"gdn2"``, the generalized delta rule's
            ``dplr.CHUNK_SIZE``, at which its kernels run fastest); an integer: that C for every
            mixer.
        rope, rope_base: rotary position embeddings in the attention blocks (``"softmax"``,
            ``"mla"``, ``"gated_attention"``).
        softmax_short_conv: the same short convolution (kernel ``conv_size``) + SiLU on q, k, v
            of the softmax blocks; off by default (plain attention, the spec's section 2). (The
            MQAR models put a ``"conv"`` block in front instead, as Zoology does; with both,
            softmax attention did not leave the MQAR plateau in 800 steps.)
        taylor_dim: key dimension of the ``"taylor"`` mixer before its feature map (1 + K + K^2
            features: 273 for 16), independent of head_dim so that its state stays modest.
        allow_neg_eigval: beta in (0, 2) instead of (0, 1) in the delta-rule mixers.
        expand_v: value dimension per head of ``"gated_deltanet"`` as a multiple of its key
            dimension ``head_dim`` (fla's and the paper's 2; ``"kda"`` keeps 1, as fla's KDA).
        num_v_heads: value heads of ``"gated_deltanet"``, ``"kda"`` and ``"deltaproduct"``
            (default n_heads; a multiple of it: grouped value heads, Qwen3-Next's layout).
        num_householder: delta-rule writes per token n_h of ``"deltaproduct"`` (Gated
            DeltaProduct; default 2), whose value width follows ``expand_v`` as Gated DeltaNet's.
        forget_gate: the decay alpha_t of ``"deltaproduct"`` (default True, Gated DeltaProduct;
            False: DeltaProduct, the product of the n_h Householder matrices alone, as Siems et
            al. define it before adding the gate).
        num_key_value_heads: key/value heads of ``"gated_attention"`` (default n_heads; a divisor
            of it: grouped-query attention).
        partial_rotary_factor: fraction of each ``"gated_attention"`` head that RoPE rotates
            (Qwen3-Next: 0.25).
        kv_lora_rank, q_lora_rank, qk_rope_head_dim: ``"mla"``'s latent rank, its query's
            low-rank projection (None: a full projection, as Kimi Linear) and its shared
            positional key channels; its per-head dimensions are ``head_dim``. ``rope`` decides
            whether those channels are rotated (False: NoPE, Kimi Linear's MLA).
        gate_rank: rank of GLA's low-rank decay projection (16 in the paper).
        state_size, expand, n_groups: the ``"mamba2"`` mixer's state size N per head, its inner
            width ``expand * d_model`` and its number of B/C groups (transformers' Mamba2Config
            names; the layer's ``d_state``, ``expand``, ``n_groups``). Its heads are ``head_dim``
            wide when that is given (``expand * d_model / head_dim`` heads, as fla infers
            them), else ``expand * d_model / n_heads`` (``n_heads`` heads).
        dt_init_range: the initial step sizes softplus(dt_bias) of every data-dependent decay
            (``"scalar_decay"``, ``"gated_deltanet"``, ``"kda"``, ``"deltaproduct"``,
            ``"mamba2"``), log-uniform in (lo, hi), and FoX's forget gates (``"forgetting"``:
            initial gates exp(-dt), dt spread over the heads from lo to hi); None (default):
            each layer's own, Mamba-2's and fla's (1e-3, 1e-1), FoX's zero bias (a gate of 1/2).
            The initial decay per token is exp(-A dt) (A up to 16): with
            few heads every head may start forgetting fast (the MQAR ``cpu`` preset's models,
            two heads, use (1e-4, 1e-2)).
        norm_eps: epsilon of every RMSNorm.
        init_std: standard deviation of the normal initialisation of linear and embedding weights.
    """

    vocab_size: int
    d_model: int = 128
    n_heads: int = 2
    head_dim: int | None = None
    mixers: tuple[str, ...] = ("deltanet", "deltanet")
    mlp: bool = True
    mlp_ratio: float = 4.0
    tie_embeddings: bool = True
    max_seq_len: int | None = 2048
    short_conv: bool | None = None
    conv_size: int = 4
    output_gate: bool | None = None
    gated_conv_size: int = 3
    chunk_size: int | None = None
    rope: bool = True
    rope_base: float = 10000.0
    softmax_short_conv: bool = False
    taylor_dim: int = 16
    allow_neg_eigval: bool = False
    expand_v: float = 2.0
    num_v_heads: int | None = None
    num_householder: int = 2
    forget_gate: bool = True
    num_key_value_heads: int | None = None
    partial_rotary_factor: float = 0.25
    kv_lora_rank: int = 64
    q_lora_rank: int | None = None
    qk_rope_head_dim: int = 16
    gate_rank: int = 16
    state_size: int = 64
    expand: int = 2
    n_groups: int = 1
    dt_init_range: tuple[float, float] | None = None
    norm_eps: float = 1e-6
    init_std: float = 0.02

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            optional = f.type in ("bool | None", bool | None)  # None: the mixer's own default
            if f.type in ("bool", bool) or (optional and value is not None):
                # a truthy string ("no") would switch a feature on
                setattr(self, f.name, flag(f"LMConfig.{f.name}", value))
        names = ("vocab_size", "d_model", "n_heads", "conv_size", "gated_conv_size", "taylor_dim")
        for name in names:
            _positive_int(name, getattr(self, name))
        if self.chunk_size is not None:  # None: each mixer's own
            _positive_int("chunk_size", self.chunk_size)
        for name in ("gate_rank", "state_size", "expand", "n_groups", "num_householder"):
            _positive_int(name, getattr(self, name))
        self._check_head_layout()
        if self.head_dim is None:
            if self.d_model % self.n_heads:
                raise ValueError(
                    f"LMConfig.d_model ({self.d_model}) must be divisible by n_heads "
                    f"({self.n_heads}), or give head_dim"
                )
        else:
            _positive_int("head_dim", self.head_dim)
        if self.max_seq_len is not None:
            _positive_int("max_seq_len", self.max_seq_len)
        if isinstance(self.mixers, str):
            raise ValueError(
                f"LMConfig.mixers must be a sequence of names, got the string {self.mixers!r}"
            )
        self.mixers = tuple(self.mixers)
        if not self.mixers:
            raise ValueError("LMConfig.mixers must name at least one mixer")
        known = known_mixers()
        for i, name in enumerate(self.mixers):
            if name not in known:
                raise ValueError(
                    f"LMConfig.mixers[{i}] is {name!r}, an unknown mixer; choose from {known}"
                )
        if "mamba2" in self.mixers:
            self._check_mamba2()
        if self.dt_init_range is not None:
            self.dt_init_range = check_dt_range("LMConfig.dt_init_range", self.dt_init_range)
        if not self.mlp_ratio > 0:
            raise ValueError(f"LMConfig.mlp_ratio must be > 0, got {self.mlp_ratio!r}")
        if not (self.norm_eps > 0 and self.init_std > 0 and self.rope_base > 0):
            raise ValueError("LMConfig.norm_eps, init_std and rope_base must be > 0")

    def _check_head_layout(self) -> None:
        """Value heads, key/value heads, value expansion, rotary fraction and MLA sizes."""
        _positive_int("kv_lora_rank", self.kv_lora_rank)
        for name in ("num_v_heads", "num_key_value_heads", "q_lora_rank"):
            if getattr(self, name) is not None:
                _positive_int(name, getattr(self, name))
        rope_dim = self.qk_rope_head_dim
        if isinstance(rope_dim, bool) or not isinstance(rope_dim, int) or rope_dim < 0:
            raise ValueError(f"LMConfig.qk_rope_head_dim must be an integer >= 0, got {rope_dim!r}")
        if self.num_v_heads is not None and self.num_v_heads % self.n_heads:
            raise ValueError(
                f"LMConfig.num_v_heads ({self.num_v_heads}) must be a multiple of n_heads "
                f"({self.n_heads})"
            )
        if self.num_key_value_heads is not None and self.n_heads % self.num_key_value_heads:
            raise ValueError(
                f"LMConfig.num_key_value_heads ({self.num_key_value_heads}) must divide n_heads "
                f"({self.n_heads})"
            )
        if isinstance(self.expand_v, bool) or not self.expand_v > 0:
            raise ValueError(f"LMConfig.expand_v must be a number > 0, got {self.expand_v!r}")
        if not 0 <= self.partial_rotary_factor <= 1:
            raise ValueError(
                f"LMConfig.partial_rotary_factor must lie in [0, 1], got "
                f"{self.partial_rotary_factor!r}"
            )

    def _check_mamba2(self) -> None:
        inner, P = self.expand * self.d_model, self.mamba2_head_dim
        name, width = ("n_heads", self.n_heads) if self.head_dim is None else ("head_dim", P)
        if inner % width:
            raise ValueError(
                f"LMConfig: the mamba2 mixer needs expand * d_model ({inner}) divisible by "
                f"{name} ({width})"
            )
        if (inner // P) % self.n_groups:
            raise ValueError(
                f"LMConfig: the mamba2 mixer's {inner // P} heads are not divisible by n_groups "
                f"({self.n_groups})"
            )

    @property
    def mamba2_head_dim(self) -> int:
        """The ``"mamba2"`` mixer's head dimension P: ``head_dim``, or ``expand * d_model /
        n_heads`` without one."""
        if self.head_dim is not None:
            return self.head_dim
        return self.expand * self.d_model // self.n_heads

    @property
    def n_layers(self) -> int:
        return len(self.mixers)

    @property
    def head_size(self) -> int:
        """The head dimension in use: ``head_dim`` or ``d_model // n_heads``."""
        return self.head_dim if self.head_dim is not None else self.d_model // self.n_heads

    @property
    def mlp_hidden(self) -> int:
        return max(1, round(self.mlp_ratio * self.d_model))

    def to_dict(self) -> dict:
        """A plain dict (JSON-serialisable); ``LMConfig(**d)`` rebuilds the config."""
        d = asdict(self)
        d["mixers"] = list(self.mixers)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> LMConfig:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"unknown LMConfig fields: {unknown}")
        return cls(**d)

    def fingerprint(self) -> str:
        """A short hash of the fields that shape the model's generation state (all but max_seq_len,
        chunk_size and init_std): caches carry it, so that a cache made for another model
        configuration is recognised."""
        d = {k: v for k, v in self.to_dict().items() if k not in _NOT_IN_FINGERPRINT}
        text = json.dumps(d, sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]
