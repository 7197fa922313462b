"""fla's CyclicFlowAttention entry points: ``chunk_cyfa``, ``fused_recurrent_cyfa``.

CyFA (``linattn.ops.cyfa``, oracle ``linattn.reference.cyfa``) keeps a key memory [N, H, K, M], a
value memory [N, H, M, V] and a clock [N, H]: fla's state is the tuple ``(H^k, H^v, lambda)``, in
float32 (float64 for float64 inputs). ``readout`` [H, M - 1, M - 1] sets the M slots; q and k are
RMS-normalised with ``q_norm_weight``, ``k_norm_weight`` inside the op, as fla's kernels do.

fla's two kernels compute the same recurrence; the chunk form runs here as linattn's chunk form and
the recurrent one token by token. Where fla's ``naive_recurrent_cyfa`` and its kernels differ,
these follow the kernels: the normalised q and k stay in the compute dtype (the naive reference
rounds them to the input dtype first), and the phases are reduced in whole periods before the
cosine (``linattn.ops.cyfa.phases``). fla's ``fused_recurrent_cyfa`` refuses inputs that require
gradients ("inference-only"); linattn's recurrent form has autograd gradients and computes them.
Both kernels need CUDA in fla; here they run on any device.
"""

from __future__ import annotations

from torch import Tensor

from linattn.compat import _core
from linattn.dtypes import compute_dtype
from linattn.ops.cyfa import CyFAState, cyfa


def _run(mode, q, k, v, g, delta, beta, readout, q_norm_weight, k_norm_weight, q_norm_eps,
         k_norm_eps, scale, initial_state, output_final_state, cu_seqlens):  # fmt: skip
    _core.check(q, k, v, g=(g, ("[B, T, H]",)), delta=(delta, ("[B, T, H]",)),
                beta=(beta, ("[B, T, H]",)))  # fmt: skip
    weights = {"readout": readout, "q_norm_weight": q_norm_weight, "k_norm_weight": k_norm_weight}
    for name, x in {"g": g, "delta": delta, "beta": beta, **weights}.items():
        _core.check_tensor(name, x)
    if cu_seqlens is not None and q.shape[0] != 1:
        raise ValueError("cu_seqlens: packed variable-length inputs must have batch size 1")
    dtype = _core.promote(q, k, v)
    state_dtype = compute_dtype(dtype)
    if initial_state is not None:
        if not isinstance(initial_state, (tuple, list)) or len(initial_state) != 3:
            raise ValueError("initial_state must contain (k, v, lambda)")
        for i, x in enumerate(initial_state):
            _core.check_tensor(f"initial_state[{i}]", x)
        initial_state = tuple(x.to(state_dtype) for x in initial_state)
    o, S = cyfa(
        q.to(dtype), k.to(dtype), v.to(dtype), g, delta, beta, readout, q_norm_weight,
        k_norm_weight, q_norm_eps=q_norm_eps, k_norm_eps=k_norm_eps, scale=scale, mode=mode,
        chunk_size=_core.CHUNK, initial_state=initial_state,
        output_final_state=output_final_state, cu_seqlens=cu_seqlens,
    )  # fmt: skip
    if S is not None:
        S = tuple(x.to(state_dtype) for x in S)
    return o.to(dtype), S


def chunk_cyfa(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor,
    delta: Tensor,
    beta: Tensor,
    readout: Tensor,
    q_norm_weight: Tensor,
    k_norm_weight: Tensor,
    q_norm_eps: float,
    k_norm_eps: float,
    scale: float | None = None,
    initial_state: CyFAState | None = None,
    output_final_state: bool = False,
    cu_seqlens: Tensor | None = None,
    cu_seqlens_cpu: Tensor | None = None,
    checkpoint_level: int = 0,
) -> tuple[Tensor, CyFAState | None]:
    """fla's ``chunk_cyfa``: CyFA (``linattn.ops.cyfa``) in chunks of 64.

    ``o_t = H^v_t^T R_t^T E^T softmax(E R_t H^k_t^T (scale q~_t))`` with
    ``H^k_t = exp(g_t) H^k_{t-1} + k~_t w_t^T``, ``H^v_t = exp(g_t) H^v_{t-1} + w_t v_t^T``,
    ``w_t = beta_t a(lambda_t)``, ``lambda_t = lambda_{t-1} + delta_t``. ``checkpoint_level``
    (0 or 1) is fla's memory option and changes nothing computed.
    """
    if checkpoint_level not in (0, 1):
        raise ValueError("`checkpoint_level` must be either 0 or 1.")
    return _run(
        "chunk", q, k, v, g, delta, beta, readout, q_norm_weight, k_norm_weight, q_norm_eps,
        k_norm_eps, scale, initial_state, output_final_state, cu_seqlens,
    )  # fmt: skip


def fused_recurrent_cyfa(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor,
    delta: Tensor,
    beta: Tensor,
    readout: Tensor,
    q_norm_weight: Tensor,
    k_norm_weight: Tensor,
    q_norm_eps: float,
    k_norm_eps: float,
    scale: float | None = None,
    initial_state: CyFAState | None = None,
    output_final_state: bool = False,
    cu_seqlens: Tensor | None = None,
) -> tuple[Tensor, CyFAState | None]:
    """fla's ``fused_recurrent_cyfa``: CyFA (``linattn.ops.cyfa``) token by token (the
    recurrence of ``chunk_cyfa``)."""
    return _run(
        "recurrent", q, k, v, g, delta, beta, readout, q_norm_weight, k_norm_weight, q_norm_eps,
        k_norm_eps, scale, initial_state, output_final_state, cu_seqlens,
    )  # fmt: skip
