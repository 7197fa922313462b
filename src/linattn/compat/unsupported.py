"""fla 0.6.0 entry points for mechanisms linattn does not compute: each raises
NotImplementedError naming what is missing (and what linattn has instead, where it has it)."""

from __future__ import annotations

from collections.abc import Callable

MISSING = {
    "chunk_abc": "ABC (attention with bounded-memory control: a softmax over memory slots)",
    "chunk_gsa": "gated slot attention (a softmax over gated memory slots)",
    "fused_recurrent_gsa": "gated slot attention (a softmax over gated memory slots)",
    "chunk_cyfa": "CyFA (its state and readout)",
    "fused_recurrent_cyfa": "CyFA (its state and readout)",
    "chunk_log_linear_attn": "log-linear attention (a Fenwick-tree hierarchy of states)",
    "chunk_mesa_net": "MesaNet (a conjugate-gradient solve per token)",
    "chunk_momentum_delta_rule": "the momentum delta rule (a second, momentum state)",
    "fused_recurrent_momentum_delta_rule": "the momentum delta rule (a second, momentum state)",
    "chunk_precond_gated_delta_rule": "the preconditioned gated delta rule (a second, "
    "preconditioner state)",
    "fused_recurrent_precond_gated_delta_rule": "the preconditioned gated delta rule",
    "chunk_precond_kda": "preconditioned KDA (a second, preconditioner state)",
    "fused_recurrent_precond_kda": "preconditioned KDA (a second, preconditioner state)",
    "fused_chunk_based": "Based in fla's form (its Taylor feature map and normaliser inside the "
    "kernel; linattn.features.taylor with linear_attention(normalize=True) is linattn's own)",
    "parallel_based": "Based in fla's form (its Taylor feature map and normaliser inside the "
    "kernel; linattn.features.taylor with linear_attention(normalize=True) is linattn's own)",
    "parallel_path_attn": "PaTH attention (Householder position encoding inside softmax)",
}


def _missing(name: str, what: str) -> Callable[..., object]:
    def entry(*args: object, **kwargs: object) -> object:
        raise NotImplementedError(
            f"linattn.compat.{name}: linattn does not compute {what}; run fla's {name} on a GPU"
        )

    entry.__name__ = entry.__qualname__ = name
    entry.__doc__ = f"fla's ``{name}``: not computed by linattn ({what}); raises."
    return entry


globals().update({name: _missing(name, what) for name, what in MISSING.items()})
__all__ = sorted(MISSING)
