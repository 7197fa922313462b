"""The chunk form, written once: section 8's loop over chunks and its gradient (spec 5.1, 8).

For a chunk of C tokens entering with state S (K x V), with its terms (``_chunk_terms.Terms``: the
cumulative log-gate G, Qd = Q exp(G), Ke = K exp(G_C - G), D = exp(G_C), the decayed causal
product A_qk = Q K^T * L_C, and the rule's pseudo-values U, ``rules``):

    1. U = pseudo_values(S)           additive rule: U = V; delta rule: U = U0 - W S, from
                                      (I + L) U = diag(beta) (V - Kd S) (the UT transform)
    2. S_next = D S + Ke^T U          the only sequential step, chunk after chunk
    3. O = Qd S + A_qk U              every chunk at once, from the states entering them

``forward_chunks`` runs these steps over a batch of chunks ``[n, P, C, ...]`` and
``backward_chunks`` their gradient, once, for every caller:

- the group loop (``loop_forward``, ``loop_backward``: the op ``linattn::chunk_forward``'s PyTorch
  kernels, for float64, GPUs and ``LINATTN_NATIVE=0``): groups of chunks sized to stay in the
  cache, each group's terms in reused buffers; the forward keeps the state entering every chunk
  and the backward recomputes each group's terms from them;
- the all-blocks form (``chunk_forward``: every chunk at once, terms that autograd records): the
  parallel form (one chunk of T tokens) and the gradients that must be differentiable again
  (``differentiable_backward``, for ``create_graph=True``);
- the affine maps (``affine``) and so context parallelism: the loop without outputs (q None).

The gradient, chunk by chunk backwards (``_state_gradients``), then every term at once:

    dU_j = A_qk_j^T dO_j + Ke_j dS_{j+1};   dS_j = D_j dS_{j+1} + Qd_j^T dO_j + [U_j's share]

where U_j's share is the rule's (``state_gradient_``: -W_j^T dU_j for the delta rule, none for
the additive rule, whose U does not read the state).

Internal layout (``_layout``): q, k [B, H, T, K]; v [B, HV, T, V]; beta [B, HV, T] or None; g
None, [B, HV, T, 1 | K]; states [B, HV, K, V]; HV = groups H grouped value heads.
"""

from __future__ import annotations

import torch
from torch import Tensor

from linattn.ops import _native, tuning
from linattn.ops._blockmath import differentiable
from linattn.ops._chunk_terms import Buffers, Terms
from linattn.ops._layout import chunks, gather, scatter
from linattn.ops.mechanism import Mechanism


def forward_chunks(
    terms: Terms, S: Tensor, states: Tensor | None = None
) -> tuple[Tensor | None, Tensor, Tensor]:
    """Steps 1-3 over the chunks of ``terms`` [n, P, C, ...] from S [P, K, V].

    ``states``: a buffer [n, P, K, V] for the state entering each chunk, or None: new stacked
    tensors that autograd records. Returns (O [n, P, C, V], or None without q; the states; the
    state leaving the last chunk).
    """
    rule, n = terms.rule, terms.U0.shape[0]
    kept = [S] if states is None else None
    if states is not None:
        states[0] = S
    outs = [None] * n if states is None else [*states[1:].unbind(0), torch.empty_like(S)]
    KeT = terms.Ke.transpose(-1, -2)  # [n, P, K, C]
    D = [None] * n if terms.D is None else terms.D
    if rule.READS_STATE:
        U, N = terms.buffers("U", terms.U0), [None] * n
        Us = [None] * n if U is None else list(U.unbind(0))
    else:  # U does not depend on S: every chunk's write Ke^T U in one batched product
        U, N, Us = terms.U0, KeT @ terms.U0, None  # N: [n, P, K, V]
    for j in range(n):
        if Us is not None:
            Us[j] = rule.pseudo_values(terms, S, j, out=Us[j])  # step 1
        S = _next_state(S, D[j], KeT[j], None if Us is None else Us[j], N[j], outs[j])  # step 2
        if kept is not None:
            kept.append(S)
    if kept is not None:  # differentiable: the states and U as new stacks
        states = torch.stack(kept[:-1])  # [n, P, K, V]
        U = U if Us is None else torch.stack(Us)
    if terms.q is None:
        return None, states, S
    O = torch.matmul(terms.A_qk, U, out=terms.buffers("o", terms.v))  # step 3: [n, P, C, V]
    O.flatten(0, 1).baddbmm_(terms.Qd.flatten(0, 1), states.flatten(0, 1))
    return O, states, S


def _next_state(S, D_j, KeT_j, U_j, N_j, out) -> Tensor:
    """S_{j+1} = D_j S_j + Ke_j^T U_j (into ``out``); N_j = Ke_j^T U_j where already formed.

    Two small batched products a chunk (the affine form S_{j+1} = M_j S_j + N_j would need one,
    but M = D - Ke^T W costs one more product a chunk, which the saved one does not repay).
    """
    if N_j is not None:
        return torch.add(N_j, S, out=out) if D_j is None else torch.addcmul(N_j, D_j, S, out=out)
    if D_j is None:
        return torch.baddbmm(S, KeT_j, U_j, out=out)
    return torch.mul(S, D_j, out=out).baddbmm_(KeT_j, U_j)


def backward_chunks(terms: Terms, states: Tensor, dO: Tensor, dS: Tensor) -> tuple[tuple, Tensor]:
    """The gradient of ``forward_chunks``: ((dq, dk, dv, dbeta, dg) of the chunks, the gradient
    of the entering state) from dO [n, P, C, V] and dS [P, K, V], that of the leaving state."""
    n, P, K, V = states.shape
    U = terms.rule.pseudo_values(terms, states)  # [n, P, C, V]
    dS_next = dO.new_empty(n, P, K, V)  # gradient of the state leaving each chunk
    dU, dS = _state_gradients(terms, dO, dS, dS_next)
    dQd = dO @ states.transpose(-1, -2)  # [n, P, C, K]
    dA_qk = dO @ U.transpose(-1, -2)  # [n, P, C, C]
    dKe = U @ dS_next.transpose(-1, -2)  # [n, P, C, K]
    dD = None
    if terms.mech.decays:
        dD = (dS_next * states).sum(-1, keepdim=True)  # [n, P, K, 1]
        if terms.mech.gate == "head":
            dD = dD.sum(-2, keepdim=True)
    return terms.gradients(dQd, dA_qk, dKe, dD, dU, states), dS


def _state_gradients(
    terms: Terms, dO: Tensor, dS: Tensor, dS_next: Tensor
) -> tuple[Tensor, Tensor]:
    """Run the state gradient backwards through the chunks; fill ``dS_next`` [n, P, K, V] (the
    gradient of the state leaving each chunk); return dU and the gradient of the entering state."""
    n, rule = dO.shape[0], terms.rule
    dU = terms.A_qk.transpose(-1, -2) @ dO  # [n, P, C, V]: the part that does not need dS
    dS_local = terms.Qd.transpose(-1, -2) @ dO  # [n, P, K, V]
    dS_next[n - 1] = dS
    dS_in = torch.empty_like(dS)
    for j in range(n - 1, -1, -1):
        out = dS_next[j - 1] if j > 0 else dS_in
        dS_j = dS_next[j]
        if rule.READS_STATE:
            dU[j].baddbmm_(terms.Ke[j], dS_j)
            rule.state_gradient_(terms, j, dU[j], dS_local[j])
        if terms.D is None:
            torch.add(dS_local[j], dS_j, out=out)
        else:
            torch.addcmul(dS_local[j], terms.D[j], dS_j, out=out)
    if not rule.READS_STATE:
        dU.add_(terms.Ke @ dS_next)
    return dU, dS_in


def chunk_terms(
    q: Tensor | None,
    k: Tensor,
    v: Tensor,
    beta: Tensor | None,
    g: Tensor | None,
    C: int,
    mech: Mechanism,
) -> Terms:
    """The terms of every chunk of C tokens at once, [N, B HV, C, ...] each, that autograd
    records. q None: no output terms (Qd, A_qk), as for the affine maps."""
    groups = v.shape[1] // max(k.shape[1], 1)  # grouped value heads: q, k broadcast
    inputs = (chunks(x, C, groups if i < 2 else 1) for i, x in enumerate((q, k, v, beta, g)))
    return Terms(*inputs, mech, differentiable, groups)


def chunk_forward(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    beta: Tensor | None,
    g: Tensor | None,
    initial_state: Tensor | None,
    chunk_size: int,
    mech: Mechanism,
) -> tuple[Tensor, Tensor]:
    """The all-blocks form, any chunk_size >= 1, through plain autograd: o [B, HV, T, V] and the
    final state. q already scaled; ``mech``: the mechanism the public op resolved."""
    B, _, T, K = k.shape
    HV, V = v.shape[1], v.shape[-1]
    terms = chunk_terms(q, k, v, beta, g, min(chunk_size, T), mech)
    S0 = initial_state if initial_state is not None else k.new_zeros(B, HV, K, V)
    O, _, S = forward_chunks(terms, S0.reshape(B * HV, K, V))  # O: [N, B HV, C, V]
    # [N, B HV, C, V] -> [B HV, N C, V] -> [B, HV, T, V]
    o = O.transpose(0, 1).reshape(B, HV, -1, V)[:, :, :T]
    return o, S.view(B, HV, K, V)


def _groups(T: int, C: int, P: int):
    """(first chunk, t0, t1, chunks) of each group of whole chunks covering T tokens."""
    n_chunks = -(-T // C)
    per_group = _chunks_per_group(C, P)
    for c0 in range(0, n_chunks, per_group):
        n = min(per_group, n_chunks - c0)
        yield c0, c0 * C, min(T, (c0 + n) * C), n


def _chunks_per_group(C: int, P: int) -> int:
    """Chunks per group for chunks of C tokens of P heads (``tuning.GROUP_ROWS_PER_THREAD``
    token-heads per thread: a group's terms stay in the cache)."""
    return max(1, tuning.GROUP_ROWS_PER_THREAD * torch.get_num_threads() // (C * P))


class _GroupTerms:
    """The terms of one group of chunks at a time, from inputs copied into reused buffers (one
    strided copy each, q scaled, q and k broadcast over their value heads) and terms written into
    reused buffers (``Buffers``): a fresh tensor per group would be fresh pages to fault in."""

    def __init__(self, inputs: tuple, C: int, scale: float, mech: Mechanism) -> None:
        self.inputs, self.C, self.scale, self.mech = inputs, C, scale, mech
        B, HV = inputs[2].shape[:2]  # v: the value heads
        self.groups = HV // max(inputs[0].shape[1], 1)
        n = _chunks_per_group(C, B * HV)
        self.copies = [
            None if x is None else x.new_empty(n, B * HV, C, *x.shape[3:]) for x in inputs
        ]
        self.buffers = Buffers()

    def __call__(self, t0: int, t1: int, n: int) -> tuple[Terms, Tensor | None]:
        """The terms of tokens [t0, t1) (n chunks), and d_o's chunks where the inputs have it."""
        q, k, v, beta, g, *d_o = (
            gather(x, t0, t1, n, self.C, out, self.scale if i == 0 else None, self._groups(i))
            for i, (x, out) in enumerate(zip(self.inputs, self.copies, strict=True))
        )
        terms = Terms(q, k, v, beta, g, self.mech, self.buffers, self.groups)
        return terms, (d_o[0] if d_o else None)

    def _groups(self, i: int) -> int:
        return self.groups if i < 2 else 1  # q and k: broadcast over their value heads


@torch.no_grad()
def loop_forward(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    beta: Tensor | None,
    g: Tensor | None,
    S0: Tensor,
    scale: float,
    C: int,
    mech: Mechanism,
    keep: bool,
) -> tuple[Tensor, Tensor, Tensor]:
    """The group loop's forward: (o [B, HV, T, V], a view of a [B, T, HV, V] tensor; the final
    state [B, HV, K, V]; the state entering every chunk [n_chunks, B HV, K, V] where ``keep``,
    else an empty tensor). q unscaled (``scale`` multiplies each group's copy). C may exceed T:
    the chunks are min(C, T) long (one chunk either way), as in the fused loop."""
    B, _, T, K = k.shape
    C = min(C, max(T, 1))
    HV, V = v.shape[1], v.shape[-1]
    P = B * HV
    # The states entering the chunks are kept for the backward pass only; without it a
    # group-sized buffer is reused, which spares a fresh T / C x K x V allocation (its page
    # faults) and keeps the states in cache.
    if keep:
        states = _native.empty((-(-T // C), P, K, V), q)
    else:
        states = q.new_empty(_chunks_per_group(C, P), P, K, V)
    # Allocated in the public layout [B, T, HV, V] and written through its [B, HV, T, V] view,
    # so that the caller gets a contiguous output (a layer's reshape to [B, T, HV V] is free).
    o = _native.empty((B, T, HV, V), q).transpose(1, 2)
    S = S0.reshape(P, K, V)
    group_terms = _GroupTerms((q, k, v, beta, g), C, scale, mech)
    for c0, t0, t1, n in _groups(T, C, P):
        terms, _ = group_terms(t0, t1, n)
        O, _, S = forward_chunks(terms, S, states[c0 : c0 + n] if keep else states[:n])
        scatter(o, O, t0, t1)
    S = S.clone() if S.data_ptr() == S0.data_ptr() else S  # an op's output is no input
    return o, S.view(B, HV, K, V), (states if keep else q.new_empty(0))


@torch.no_grad()
def loop_backward(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    beta: Tensor | None,
    g: Tensor | None,
    states: Tensor,
    d_o: Tensor,
    dS: Tensor | None,
    scale: float,
    C: int,
    mech: Mechanism,
    needs: tuple[bool, ...],
) -> tuple[Tensor | None, ...]:
    """The group loop's backward, groups in reverse: (dq, dk, dv, dbeta, dg, dS0), each of q, k,
    v, beta, g None where ``needs`` (q, k, v, beta, g, S0) does not mark it (or the input is None).
    C may exceed T, as in ``loop_forward``.
    """
    B, _, T, K = k.shape
    C = min(C, max(T, 1))
    HV, V = v.shape[1], v.shape[-1]
    P = B * HV
    inputs = (q, k, v, beta, g)
    grads = [
        _empty_like(x) if x is not None and needed else None
        for x, needed in zip(inputs, needs[:5], strict=True)
    ]
    dS = q.new_zeros(P, K, V) if dS is None else dS.reshape(P, K, V).clone()
    group_terms = _GroupTerms((*inputs, d_o), C, scale, mech)
    for c0, t0, t1, n in reversed(list(_groups(T, C, P))):
        terms, dO = group_terms(t0, t1, n)
        chunk_grads, dS = backward_chunks(terms, states[c0 : c0 + n], dO, dS)
        chunk_grads[0].mul_(scale)  # dq: q was scaled in its copy
        for grad, value in zip(grads, chunk_grads, strict=True):
            if grad is not None:
                scatter(grad, value, t0, t1)
    return (*grads, dS.view(B, HV, K, V))


def _empty_like(x: Tensor) -> Tensor:
    """``torch.empty_like(x)``, on huge pages (``_native.empty``) for the [B, H, T, D] views of
    [B, T, H, D] tensors that q, k and v are."""
    if x.dim() == 4 and x.transpose(1, 2).is_contiguous():
        B, H, T, D = x.shape
        return _native.empty((B, T, H, D), x).transpose(1, 2)
    return torch.empty_like(x)


def differentiable_backward(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    beta: Tensor | None,
    g: Tensor | None,
    S0: Tensor,
    d_o: Tensor,
    d_S: Tensor | None,
    scale: float,
    C: int,
    mech: Mechanism,
    needs: tuple[bool, ...],
) -> tuple[Tensor | None, ...]:
    """The backward pass as plain autograd, for ``create_graph=True`` (double backward):
    (dq, dk, dv, dbeta, dg, dS0), None where ``needs`` does not mark an input.

    The group loop's and the fused backward passes write into buffers (``out=``), which autograd
    cannot record. These gradients are instead those of the same algebra in its all-blocks form
    (``chunk_forward``), recomputed from the inputs with ``torch.autograd.grad(...,
    create_graph=True)``: themselves differentiable, exactly, with respect to the inputs and to
    d_o and d_S. Memory is that of the scores of every block at once, paid only for higher-order
    gradients.
    """
    inputs = (q, k, v, beta, g, S0)
    wanted = [x is not None and need for x, need in zip(inputs, needs, strict=False)]
    o, S = chunk_forward(q * scale, k, v, beta, g, S0, C, mech)
    outputs, seeds = [o], [d_o]
    if d_S is not None:
        outputs.append(S)
        seeds.append(d_S)
    return differentiable_gradients(outputs, seeds, inputs, wanted)


def differentiable_gradients(outputs, seeds, inputs, wanted) -> tuple[Tensor | None, ...]:
    """``torch.autograd.grad(outputs, ..., seeds, create_graph=True)`` for the ``inputs`` that
    ``wanted`` marks: one gradient per input, None where not wanted, zeros where wanted and
    unused (the backward of an op that falls back to its composite for double backward)."""
    chosen = [x for x, w in zip(inputs, wanted, strict=True) if w]
    found = iter(torch.autograd.grad(outputs, chosen, seeds, create_graph=True, allow_unused=True))
    grads = []
    for x, w in zip(inputs, wanted, strict=True):
        grad = next(found) if w else None
        grads.append(torch.zeros_like(x) if w and grad is None else grad)
    return tuple(grads)
