"""linattn in the signatures of the kernels transformers binds (fla, mamba-ssm, causal-conv1d).

Each function here takes exactly what a transformers modeling module passes to its bound kernel
(the pure-PyTorch fallback's signature, e.g. ``torch_chunk_gated_delta_rule(query, key, value, g,
beta, chunk_size, initial_state, output_final_state, use_qk_l2norm_in_kernel)``), returns what that
fallback returns, and computes it with the public ops ``linattn.ops.delta_rule``,
``linear_attention`` (the chunk form, for prefill) and ``recurrent_step`` (the decoding step).

Every mechanism is one row of the spec's table (docs/design.md, "The mechanism table"):

- Gated DeltaNet (Qwen3-Next, Qwen3.5, OLMo-Hybrid, ...): S_t = alpha_t (I - beta_t k_t k_t^T)
  S_{t-1} + beta_t k_t v_t^T, g [B, T, HV] (sections 7, 8, 10);
- Kimi Delta Attention (Kimi-Linear, Bailing-Hybrid, GLM-5-Next): the same with Diag(alpha_t),
  g [B, T, H, K];
- Mamba-2's SSD (Mamba-2, Bamba, Falcon-H1, Nemotron-H, Granite-MoE-Hybrid, Zamba2): linear
  attention with a scalar decay per head (section 10), q = C, k = dt B, v = x, g = dt A, scale 1;
  the D skip (o + D x) and the dt scaling live outside the kernel, here.

Compute dtype: float64 inputs stay float64 (the ops' float64 path), every other dtype computes in
float32 as transformers' fallbacks do; outputs come back in the caller's dtype as theirs do.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from linattn.dtypes import compute_dtype
from linattn.ops import delta_rule, linear_attention, recurrent_step
from linattn.ops.functional import causal_conv1d, conv_activation, l2norm, step_size


def grouped_heads(x: Tensor, heads: int, name: str) -> Tensor:
    """x [B, T, H, D] itself, checked to serve `heads` value heads: value head j pairs with
    query/key head j // G (G = heads // H), as transformers' ``repeat_interleave(G, dim=2)``;
    linattn's ops read grouped value heads in place (no copy of q and k)."""
    H = x.shape[2]
    if H == 0 or heads % H != 0:
        raise ValueError(f"{name} has {H} heads, which do not divide the {heads} value heads")
    return x


def state_in(initial_state: Tensor | None, dtype: torch.dtype) -> Tensor | None:
    """The caller's state in the compute dtype (a copy: the fallbacks never write their input)."""
    return None if initial_state is None else initial_state.to(dtype, copy=True)


def _gated_delta(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    g: Tensor,
    beta: Tensor,
    chunk_size: int,
    initial_state: Tensor | None,
    output_final_state: bool,
    use_qk_l2norm_in_kernel: bool,
    cu_seqlens: Tensor | None,
    *,
    divide: bool,
    step: bool,
) -> tuple[Tensor, Tensor | None]:
    """Gated DeltaNet (g [B, T, HV]) or KDA (g [B, T, HV, K]) as transformers' kernels compute
    them: in the compute dtype, scale 1 / sqrt(K), o back in query's dtype.

    q, k are normalised first with use_qk_l2norm_in_kernel (``divide``: ``x / sqrt``, the KDA
    fallbacks' rounding; else ``x * rsqrt``). ``step``: one token (T = 1, no cu_seqlens) is one
    ``linattn.ops.recurrent_step`` from the state into a new one (``out``: the caller's state
    kept); anything else takes the chunk form.
    """
    dtype = compute_dtype(query.dtype)
    heads = value.shape[2]
    q = grouped_heads(query, heads, "query").to(dtype)
    k = grouped_heads(key, heads, "key").to(dtype)
    if use_qk_l2norm_in_kernel:
        q, k = l2norm(q, divide=divide), l2norm(k, divide=divide)
    v, beta, g = value.to(dtype), beta.to(dtype), g.to(dtype)
    if step and query.shape[1] == 1 and cu_seqlens is None:
        q, k, v, beta, g = (x[:, 0] for x in (q, k, v, beta, g))  # the one token: [B, H, ...]
        S0, S = step_state(initial_state, q, value, dtype)
        o = recurrent_step(S0, q, k, v, beta, g, out=S)
        S = S0 if S is None else S  # zeros stepped in place, or the new state
        return o.unsqueeze(1).to(query.dtype), S if output_final_state else None
    o, S = delta_rule(
        q,
        k,
        v,
        beta,
        g,
        scale=q.shape[-1] ** -0.5,
        mode="chunk",
        chunk_size=chunk_size,
        initial_state=state_in(initial_state, dtype),
        output_final_state=output_final_state,
        cu_seqlens=cu_seqlens,
    )
    return o.to(query.dtype), S


def chunk_gated_delta_rule(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    g: Tensor,
    beta: Tensor,
    chunk_size: int = 64,
    initial_state: Tensor | None = None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    cu_seqlens: Tensor | None = None,
    **kwargs: object,
) -> tuple[Tensor, Tensor | None]:
    """Gated DeltaNet, the chunk form: transformers' ``torch_chunk_gated_delta_rule`` (prefill).

    S_t = exp(g_t) (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T, o_t = S_t^T q_t / sqrt(K)
    (spec sections 7, 8, 10). query, key [B, T, H, K]; value [B, T, HV, V]; g, beta [B, T, HV]
    (HV a multiple of H: grouped value heads); state [B, HV, K, V]. Keywords transformers adds
    (``use_cache``, ...) are ignored, as its kernel wrapper drops them.
    """
    return _gated_delta(
        query, key, value, g, beta, chunk_size, initial_state, output_final_state,
        use_qk_l2norm_in_kernel, cu_seqlens, divide=False, step=False,
    )  # fmt: skip


def recurrent_gated_delta_rule(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    g: Tensor,
    beta: Tensor,
    initial_state: Tensor | None = None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    cu_seqlens: Tensor | None = None,
    **kwargs: object,
) -> tuple[Tensor, Tensor | None]:
    """Gated DeltaNet token by token: transformers' ``torch_recurrent_gated_delta_rule`` (decoding).

    The same recurrence as ``chunk_gated_delta_rule``; one token (T = 1, no cu_seqlens) is one
    ``linattn.ops.recurrent_step`` into a new state, longer inputs take the chunk form.
    """
    return _gated_delta(
        query, key, value, g, beta, 64, initial_state, output_final_state,
        use_qk_l2norm_in_kernel, cu_seqlens, divide=False, step=True,
    )  # fmt: skip


def step_state(
    initial_state: Tensor | None, q: Tensor, value: Tensor, dtype: torch.dtype
) -> tuple[Tensor, Tensor | None]:
    """(the state a step reads, the tensor it writes): the caller's state in ``dtype`` and a new
    tensor (``recurrent_step``'s ``out``: the caller's state is kept, and the fused step reads
    it and writes the new one in one pass, no copy first), or zeros [B, HV, K, V] and None (the
    step in place)."""
    if initial_state is not None:
        S0 = initial_state.to(dtype)
        return S0, torch.empty(S0.shape, dtype=dtype, device=S0.device)
    B, _, K = q.shape  # q [B, H, K]; value [B, 1, HV, V]
    zeros = torch.zeros(B, value.shape[2], K, value.shape[-1], dtype=dtype, device=q.device)
    return zeros, None


def chunk_kda(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    g: Tensor,
    beta: Tensor,
    chunk_size: int = 64,
    initial_state: Tensor | None = None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    cu_seqlens: Tensor | None = None,
    **kwargs: object,
) -> tuple[Tensor, Tensor | None]:
    """Kimi Delta Attention, the chunk form: transformers' ``chunk_kimi_delta_attention``.

    S_t = (I - beta_t k_t k_t^T) Diag(exp g_t) S_{t-1} + beta_t k_t v_t^T, o_t = S_t^T q_t /
    sqrt(K) (sections 7, 8, 10). query, key, value, g [B, T, H, K]; beta [B, T, H]; state
    [B, H, K, V].
    """
    return _gated_delta(
        query, key, value, g, beta, chunk_size, initial_state, output_final_state,
        use_qk_l2norm_in_kernel, cu_seqlens, divide=True, step=False,
    )  # fmt: skip


def recurrent_kda(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    g: Tensor,
    beta: Tensor,
    initial_state: Tensor | None = None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    cu_seqlens: Tensor | None = None,
    **kwargs: object,
) -> tuple[Tensor, Tensor | None]:
    """KDA token by token: transformers' ``recurrent_kimi_delta_attention`` (decoding).

    One token is one ``recurrent_step`` (g [B, H, K]: the per-channel decay) on a copy of the
    state; longer inputs take the chunk form.
    """
    return _gated_delta(
        query, key, value, g, beta, 64, initial_state, output_final_state,
        use_qk_l2norm_in_kernel, cu_seqlens, divide=True, step=True,
    )  # fmt: skip


def mamba2_dt(dt: Tensor, dt_bias: Tensor | None, dt_softplus: bool) -> Tensor:
    """Mamba-2's step sizes, as transformers computes them: dt + dt_bias, then softplus."""
    bias = None if dt_bias is None else dt_bias.to(dt.dtype)
    return step_size(dt, bias, softplus=dt_softplus)


def mamba2_chunk_scan(
    hidden_states: Tensor,
    dt: Tensor,
    A: Tensor,
    B: Tensor,
    C: Tensor,
    chunk_size: int,
    D: Tensor | None = None,
    dt_bias: Tensor | None = None,
    initial_states: Tensor | None = None,
    dt_softplus: bool = False,
    dt_limit: tuple[float, float] = (0.0, float("inf")),
    return_final_states: bool = False,
    **kwargs: object,
) -> Tensor | tuple[Tensor, Tensor]:
    """Mamba-2's SSD, the chunk form: transformers' ``mamba2_chunk_scan`` (prefill).

    Linear attention with a scalar decay per head (spec section 10): with the step sizes dt
    (softplus(dt + dt_bias), clamped to dt_limit), S_t = exp(dt_t A) S_{t-1} + B_t (dt_t x_t)^T
    and y_t = S_t^T C_t + D x_t, i.e. ``linear_attention(q=C, k=B, v=dt x, g=dt A, scale=1)``.
    hidden_states x [B, T, H, P]; dt [B, T, H]; A, D, dt_bias [H]; B, C [B, T, G, N] (head h reads
    group h // (H / G)); states [B, H, P, N] as transformers keeps them (linattn's [B, H, N, P]
    transposed). Returns y [B, T, H, P] in the compute dtype (float32 unless float64), as the
    fallback does, and the final state when asked. ``z`` is ignored, as the fallback ignores it.
    """
    heads = hidden_states.shape[2]
    dt = mamba2_dt(dt, dt_bias, dt_softplus).clamp(min=dt_limit[0], max=dt_limit[1])
    dtype = compute_dtype(hidden_states.dtype)
    x, dt = hidden_states.to(dtype), dt.to(dtype)
    q = grouped_heads(C, heads, "C").to(dtype)  # [B, T, G, N]
    k = grouped_heads(B, heads, "B").to(dtype)
    S0 = None if initial_states is None else initial_states.to(dtype).transpose(-1, -2)
    y, S = linear_attention(
        q,
        k,
        x * dt.unsqueeze(-1),
        A.to(dtype) * dt,
        scale=1.0,
        mode="chunk",
        chunk_size=chunk_size,
        initial_state=S0,
        output_final_state=return_final_states,
    )
    if D is not None:
        y = y + D.unsqueeze(-1) * x  # the D skip: [H, 1] * [B, T, H, P]
    if not return_final_states:
        return y
    return y, S.transpose(-1, -2).contiguous()  # [B, H, N, P] -> transformers' [B, H, P, N]


def per_head(x: Tensor, dims: int, name: str) -> Tensor:
    """x [..., H, *rest] with `dims` trailing dims constant -> [..., H]; refuse what varies there.

    Transformers expands Mamba-2's per-head dt, A, D and dt_bias over the head and state
    dimensions before its step; a decay that varies along P is no linattn mechanism.
    """
    head = x[(...,) + (0,) * dims]
    if any(x.stride(-1 - d) != 0 for d in range(dims)):
        if not bool((x == head[(...,) + (None,) * dims]).all()):
            raise ValueError(f"Mamba-2 step: {name} must be one value per head")
    return head


def mamba2_selective_state_update(
    state: Tensor,
    hidden_states: Tensor,
    dt: Tensor,
    A: Tensor,
    B: Tensor,
    C: Tensor,
    D: Tensor | None = None,
    dt_bias: Tensor | None = None,
    dt_softplus: bool = False,
    z: Tensor | None = None,
    **kwargs: object,
) -> Tensor:
    """One Mamba-2 token: transformers' ``mamba2_selective_state_update`` (decoding), in place.

    S <- exp(dt A) S + B (dt x)^T, y = S^T C + D x, times silu(z) when z is given; one
    ``recurrent_step`` (additive rule, g = dt A one per head, scale 1) on the state [B, H, P, N],
    read as linattn's [B, H, N, P] through a transposed view. hidden_states, z [B, H, P]; dt
    [B, H, P] and dt_bias, D [H, P] and A [H, P, N] expanded from one value per head; B, C
    [B, G, N]. Returns y [B, H, P] in hidden_states' dtype.
    """
    heads = hidden_states.shape[1]
    bias = None if dt_bias is None else per_head(dt_bias, 1, "dt_bias")
    dt = mamba2_dt(per_head(dt, 1, "dt"), bias, dt_softplus)
    work = state if state.dtype in (torch.float32, torch.float64) else state.float()
    dtype = work.dtype
    x, dt = hidden_states.to(dtype), dt.to(dtype)
    q = grouped_heads(C.unsqueeze(1), heads, "C")[:, 0].to(dtype)  # [B, G, N]
    k = grouped_heads(B.unsqueeze(1), heads, "B")[:, 0].to(dtype)
    g = per_head(A, 2, "A").to(dtype) * dt  # [B, H]
    y = recurrent_step(work.transpose(-1, -2), q, k, x * dt.unsqueeze(-1), None, g, scale=1.0)
    if work is not state:
        state.copy_(work)
    if D is not None:
        y = y + x * D.to(dtype)
    if z is not None:
        y = y * F.silu(z.to(dtype))
    return y.to(hidden_states.dtype)


def mamba2_split_conv1d_scan_combined(*args: object, **kwargs: object) -> None:
    """The fused training kernel (mamba-ssm's, CUDA only): None sends the mixer to its unfused path.

    transformers' own fallback returns None too; the unfused path then calls the conv and
    ``mamba2_chunk_scan`` above.
    """
    return None


def refuse_packed(kwargs: dict) -> None:
    """A depthwise conv over packed sequences would mix them: refused, as transformers does."""
    for name in ("cu_seqlens", "seq_idx"):
        if kwargs.get(name) is not None:
            raise ValueError(
                f"causal_conv1d_fn cannot keep packed sequences apart ({name} given): linattn "
                "serves the short convolution for unpacked batches only"
            )


def conv_act(y: Tensor, activation: str | None) -> Tensor:
    """The short convolution's activation as transformers' own convolution applies it: none, or
    any name its ``ACT2FN`` knows (``"silu"`` / ``"swish"``, the usual one, through linattn's;
    Mamba-2-family models may set ``hidden_act`` to another, e.g. ``"gelu"``)."""
    if activation in (None, "silu", "swish"):
        return conv_activation(y, activation)
    from transformers.activations import ACT2FN  # only a transformers model calls these kernels

    return ACT2FN[activation](y)


def causal_conv1d_fn(
    hidden_states: Tensor,
    weight: Tensor,
    bias: Tensor | None = None,
    activation: str | None = None,
    **kwargs: object,
) -> Tensor:
    """The causal depthwise short convolution: out[:, c, t] = sum_j w[c, j] x[:, c, t - W + 1 + j].

    hidden_states [B, D, T]; weight [D, W]; bias [D] or None. The conv runs in weight's dtype and
    the result comes back in hidden_states' dtype, as transformers' fallback; activation: any
    transformers knows (``conv_act``).
    """
    refuse_packed(kwargs)
    out, _ = causal_conv1d(hidden_states.to(weight.dtype), weight, bias)  # zeros before t = 0
    return conv_act(out, activation).to(hidden_states.dtype)


def causal_conv1d_update(
    hidden_states: Tensor,
    conv_state: Tensor,
    weight: Tensor,
    bias: Tensor | None = None,
    activation: str | None = None,
    **kwargs: object,
) -> Tensor:
    """The short convolution's decoding step: conv_state [B, D, S] takes the newest S inputs.

    hidden_states [B, D, T] (T new tokens, usually 1); conv_state is updated in place.
    """
    x, state = hidden_states.to(weight.dtype), conv_state.to(weight.dtype)
    out, new_state = causal_conv1d(x, weight, bias, state)
    conv_state.copy_(new_state)
    return conv_act(out, activation).to(hidden_states.dtype)
