"""``TokenMixer``, the base class of every mixer, and the state types it shares with them.

A token mixer maps ``x: [B, T, d_model]`` to ``y: [B, T, d_model]``. For generation it also takes
and returns a *state*: a dict of tensors whose sizes are fixed for the recurrent mixers (spec
sections 5 and 9) and grow with t only for softmax attention's KV cache.

``TokenMixer`` validates the input, holds the state specification (``state_spec``), allocates
empty states (``new_state``), and picks the op's mode: ``"chunk"`` for training and prefill,
``"recurrent"`` for a one-token decoding step with a state.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from linattn.dtypes import compute_dtype
from linattn.ops.tuning import DECODE_TOKENS

State = dict[str, Tensor]
# name -> (shape, dtype); a 0 on axis 1 of a name listed in ``TokenMixer.growing`` is the time axis.
StateSpec = dict[str, tuple[tuple[int, ...], torch.dtype]]


def state_dtype(dtype: torch.dtype) -> torch.dtype:
    """States accumulate in float32, or in float64 when the model is float64 (docs/design.md,
    "Layout and dtypes")."""
    return compute_dtype(dtype)


def check_positive(name: str, value: int) -> None:
    """A ValueError naming ``name`` unless ``value`` is an integer >= 1."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")


def resolve_head_dim(d_model: int, n_heads: int, head_dim: int | None) -> int:
    """``head_dim``, or d_model / n_heads when None (d_model must then be divisible), checked."""
    check_positive("n_heads", n_heads)
    if head_dim is None:
        if d_model % n_heads:
            raise ValueError(f"d_model ({d_model}) must be divisible by n_heads ({n_heads})")
        head_dim = d_model // n_heads
    check_positive("head_dim", head_dim)
    return head_dim


def resolve_kv_heads(n_heads: int, num_kv_heads: int | None) -> int:
    """``num_kv_heads`` (grouped-query attention's key and value heads), or n_heads when None;
    a ValueError naming it unless it is an integer >= 1 that divides n_heads."""
    kv_heads = n_heads if num_kv_heads is None else num_kv_heads
    if isinstance(kv_heads, bool) or not isinstance(kv_heads, int) or kv_heads < 1:
        raise ValueError(f"num_kv_heads must divide n_heads ({n_heads}), got {num_kv_heads!r}")
    if n_heads % kv_heads:
        raise ValueError(f"num_kv_heads must divide n_heads ({n_heads}), got {num_kv_heads!r}")
    return kv_heads


class TokenMixer(nn.Module):
    """Base of every mixer: ``forward(x, state=None) -> (y, new_state)``.

    Subclasses set ``d_model`` and implement ``mix`` and ``state_spec``. ``growing`` names the state
    tensors whose axis 1 is time (softmax attention's keys and values); all others are fixed-size.
    Setting ``mixer.mode`` to ``"parallel"``, ``"recurrent"`` or ``"chunk"`` forces one form of the
    op (for cross-checks); ``None``, the default, lets ``pick_mode`` choose.
    """

    growing: tuple[str, ...] = ()
    # True: ``mix`` also takes ``shared``, a dict the model passes along its blocks in one forward
    # pass (RWKV-7's value residual: the first layer's values); the others never see it.
    shares_values: bool = False

    def __init__(self, d_model: int, chunk_size: int = 64) -> None:
        super().__init__()
        check_positive("d_model", d_model)
        check_positive("chunk_size", chunk_size)
        self.d_model = d_model
        self.chunk_size = chunk_size
        # None: chunk for T > 1 or without state, recurrent for a one-token step with state.
        self.mode: str | None = None

    def state_spec(self, batch_size: int, dtype: torch.dtype) -> StateSpec:
        """Shapes and dtypes of the generation state of this mixer (before any token)."""
        raise NotImplementedError

    def new_state(
        self, batch_size: int, dtype: torch.dtype, device: torch.device | str | None = None
    ) -> State:
        """Zero state for ``batch_size`` sequences: what the mixer holds before the first token."""
        spec = self.state_spec(batch_size, dtype)
        return {
            name: torch.zeros(shape, dtype=dt, device=device) for name, (shape, dt) in spec.items()
        }

    def pick_mode(self, T: int, state: State | None) -> str:
        """The op's mode: recurrent for a decoding step (T = 1 with a state, or a few tokens:
        T <= ``tuning.DECODE_TOKENS``, the fused step token by token; under torch.compile, T = 1
        only), chunk otherwise."""
        if self.mode is not None:
            return self.mode
        # The state first: without one, no guard on a traced T (torch.export's dynamic length).
        if state is None:
            return "chunk"
        if torch.compiler.is_compiling():
            # Traced: the fused step is not used, and a few tokens stepped one by one would be a
            # graph per T; one token is the step, more one chunk graph for every length.
            return "recurrent" if T == 1 else "chunk"
        return "recurrent" if T <= DECODE_TOKENS else "chunk"

    def forward(
        self, x: Tensor, state: State | None = None, shared: dict[str, Tensor] | None = None
    ) -> tuple[Tensor, State | None]:
        """x: [B, T, d_model] -> (y: [B, T, d_model], the advanced state or None without one).
        ``shared``: values passed between the blocks of one forward pass (``shares_values``)."""
        if not isinstance(x, Tensor) or x.dim() != 3 or x.shape[-1] != self.d_model:
            shape = tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__
            raise ValueError(f"x must have shape [B, T, {self.d_model}], got {shape}")
        if x.shape[1] < 1:
            raise ValueError("x must hold at least one token (T >= 1)")
        if state is not None:
            self.check_state(state, x.shape[0], x.dtype)
        if self.shares_values:
            return self.mix(x, state, shared)
        return self.mix(x, state)

    def mix(self, x: Tensor, state: State | None) -> tuple[Tensor, State | None]:
        raise NotImplementedError

    def check_state(self, state: State, batch_size: int, dtype: torch.dtype) -> None:
        """A ValueError naming the first state tensor whose name, shape or dtype is unexpected."""
        spec = self.state_spec(batch_size, dtype)
        if not isinstance(state, dict) or set(state) != set(spec):
            got = sorted(state) if isinstance(state, dict) else type(state).__name__
            raise ValueError(f"state must hold the tensors {sorted(spec)}, got {got}")
        for name, (shape, dt) in spec.items():
            tensor = state[name]
            if not isinstance(tensor, Tensor):
                raise ValueError(f"state[{name!r}] must be a tensor, got {type(tensor).__name__}")
            got = list(tensor.shape)
            want = list(shape)
            if name in self.growing and len(got) == len(want):
                want[1] = got[1]  # any number of cached tokens
            if got != want:
                raise ValueError(
                    f"state[{name!r}] has shape {got}, expected {want} (batch size {batch_size}); "
                    "was the state made for another model or batch size?"
                )
            if tensor.dtype != dt:
                raise ValueError(f"state[{name!r}] has dtype {tensor.dtype}, expected {dt}")
