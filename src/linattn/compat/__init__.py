"""fla 0.6.0's op interface on linattn: drop-in entry points with flash-linear-attention's names.

Swap ``from fla.ops.gated_delta_rule import chunk_gated_delta_rule`` for
``from linattn.compat import chunk_gated_delta_rule`` to run the same call on the CPU (or any
device) through linattn's ops. Every one of fla 0.6.0's ``fla.ops`` entry points (the 59
``chunk_* / fused_recurrent_* / fused_chunk_* / parallel_*`` names and ``fused_attnres``,
``FLA_ENTRY_POINTS``) has a function here with fla's name, positional order, keywords and
defaults, and so do the ones fla exports from one op module only
(``FLA_SUBMODULE_ENTRY_POINTS``: name -> fla module, e.g. ``chunk_gdn2`` from ``fla.ops.gdn2``):

- every name computes, one module of this package per fla op module (``gated_delta_rule``,
  ``kda``, ``gsa``, ``mesa_net``, ``attn``, ...), on the registered mechanism that lists it in
  its ``fla_names`` (``linattn.registry.with_fla_name``): ``chunk_*`` run its chunk form,
  ``fused_recurrent_*`` its recurrent form, ``parallel_*`` its parallel (or blockwise) form;
- fla's deprecated ``fused_chunk_delta_rule`` / ``fused_chunk_gla`` raise as fla's do;
- a name linattn did not compute would raise NotImplementedError naming the missing mechanism
  (``unsupported.MISSING``, empty for fla 0.6.0).

The documentation's compat page tables every name with its mechanism, forms and nearest
mechanism. Where fla's naive reference and its kernels disagree, the function follows the
kernels and its docstring says so.

fla's conventions (``_core``): layout ``[B, T, H, D]``; grouped value heads (v, g, beta, states
with HV = G * H heads); states ``[N, HV, K, V]`` or ``[N, HV, V, K]`` with ``state_v_first``,
final states float32 (float64 for float64 inputs); ``scale=None`` is 1 / sqrt(K); log-space gates;
``cu_seqlens`` with B = 1 (``cu_seqlens_cpu`` and ``chunk_indices`` accepted: precomputed
indices fla's kernels use); ``cp_context`` must be None (NotImplementedError otherwise);
unknown keywords are swallowed where fla's ``**kwargs`` swallows them. fla's checks raise
ValueError here where fla raises ValueError or asserts; the Triton kernels' own limits (dtypes,
head sizes) are not copied. Mixed dtypes (q, k in bfloat16 with v in float32) are promoted.
"""

from linattn.compat import unsupported
from linattn.compat.abc import chunk_abc
from linattn.compat.attn import (
    parallel_attn,
    parallel_forgetting_attn,
    parallel_stickbreaking_attn,
)
from linattn.compat.attnres import fused_attnres
from linattn.compat.based import fused_chunk_based, parallel_based
from linattn.compat.comba import chunk_comba, fused_recurrent_comba
from linattn.compat.cyfa import chunk_cyfa, fused_recurrent_cyfa
from linattn.compat.delta_rule import (
    chunk_delta_rule,
    fused_chunk_delta_rule,
    fused_recurrent_delta_rule,
)
from linattn.compat.deltaformer import deltaformer_attn
from linattn.compat.dsa import naive_dsa, naive_dsa_indexer
from linattn.compat.gated_delta_product import chunk_gated_delta_product
from linattn.compat.gated_delta_rule import (
    chunk_gated_delta_rule,
    chunk_gdn,
    fused_recurrent_gated_delta_rule,
    fused_recurrent_gdn,
)
from linattn.compat.gated_oja_rule import chunk_gated_oja_rule, fused_recurrent_gated_oja_rule
from linattn.compat.gdn2 import chunk_gdn2, fused_recurrent_gdn2
from linattn.compat.generalized_delta_rule import (
    chunk_dplr_delta_rule,
    chunk_iplr_delta_rule,
    fused_recurrent_dplr_delta_rule,
    fused_recurrent_iplr_delta_rule,
)
from linattn.compat.gla import chunk_gla, fused_chunk_gla, fused_recurrent_gla
from linattn.compat.gsa import chunk_gsa, fused_recurrent_gsa
from linattn.compat.hgrn import chunk_hgrn, fused_recurrent_hgrn
from linattn.compat.kda import chunk_kda, fused_recurrent_kda, kda_gate
from linattn.compat.lightnet import chunk_lightnet, fused_recurrent_lightnet
from linattn.compat.linear_attn import (
    chunk_linear_attn,
    fused_chunk_linear_attn,
    fused_recurrent_linear_attn,
)
from linattn.compat.log_linear_attn import chunk_log_linear_attn
from linattn.compat.mesa_net import chunk_mesa_net, mesa_net_decoding_one_step
from linattn.compat.moba import parallel_moba
from linattn.compat.momentum_delta_rule import (
    chunk_momentum_delta_rule,
    fused_recurrent_momentum_delta_rule,
)
from linattn.compat.nsa import parallel_nsa
from linattn.compat.parallax import parallel_parallax
from linattn.compat.path_attn import parallel_path_attn
from linattn.compat.precond_gated_delta_rule import (
    chunk_precond_gated_delta_rule,
    fused_recurrent_precond_gated_delta_rule,
)
from linattn.compat.precond_kda import chunk_precond_kda, fused_recurrent_precond_kda
from linattn.compat.rebased import parallel_rebased
from linattn.compat.rwkv4 import fused_recurrent_rwkv4
from linattn.compat.rwkv6 import chunk_rwkv6, fused_recurrent_rwkv6
from linattn.compat.rwkv7 import chunk_rwkv7, fused_mul_recurrent_rwkv7, fused_recurrent_rwkv7
from linattn.compat.simple_gla import (
    chunk_lightning_attn,
    chunk_retention,
    chunk_simple_gla,
    fused_chunk_retention,
    fused_chunk_simple_gla,
    fused_recurrent_lightning_attn,
    fused_recurrent_retention,
    fused_recurrent_simple_gla,
    parallel_retention,
    parallel_simple_gla,
)
from linattn.compat.titans import chunk_titans_linear
from linattn.compat.ttt import chunk_ttt_linear, fused_chunk_ttt_linear
from linattn.compat.unsupported import *  # noqa: F403
from linattn.compat.unsupported import MISSING
from linattn.compat.wall_attn import parallel_wall_attn, parallel_wall_attn_decode

__all__ = [
    "chunk_abc",
    "chunk_comba",
    "chunk_cyfa",
    "chunk_delta_rule",
    "chunk_dplr_delta_rule",
    "chunk_gated_delta_product",
    "chunk_gated_delta_rule",
    "chunk_gated_oja_rule",
    "chunk_gdn",
    "chunk_gdn2",
    "chunk_gla",
    "chunk_gsa",
    "chunk_iplr_delta_rule",
    "chunk_kda",
    "chunk_lightning_attn",
    "chunk_linear_attn",
    "chunk_log_linear_attn",
    "chunk_mesa_net",
    "chunk_momentum_delta_rule",
    "chunk_precond_gated_delta_rule",
    "chunk_precond_kda",
    "chunk_retention",
    "chunk_rwkv6",
    "chunk_rwkv7",
    "chunk_simple_gla",
    "chunk_titans_linear",
    "chunk_ttt_linear",
    "deltaformer_attn",
    "fused_chunk_delta_rule",
    "fused_chunk_gla",
    "fused_chunk_linear_attn",
    "fused_chunk_retention",
    "fused_chunk_simple_gla",
    "fused_chunk_ttt_linear",
    "fused_recurrent_comba",
    "fused_recurrent_cyfa",
    "fused_recurrent_delta_rule",
    "fused_recurrent_dplr_delta_rule",
    "fused_recurrent_gated_delta_rule",
    "fused_recurrent_gated_oja_rule",
    "fused_recurrent_gdn",
    "fused_recurrent_gdn2",
    "fused_recurrent_gla",
    "fused_recurrent_gsa",
    "fused_recurrent_hgrn",
    "fused_recurrent_iplr_delta_rule",
    "fused_recurrent_kda",
    "fused_recurrent_lightning_attn",
    "fused_mul_recurrent_rwkv7",
    "fused_recurrent_linear_attn",
    "fused_recurrent_momentum_delta_rule",
    "fused_recurrent_precond_gated_delta_rule",
    "fused_recurrent_precond_kda",
    "fused_recurrent_retention",
    "fused_recurrent_rwkv6",
    "fused_recurrent_rwkv7",
    "fused_recurrent_simple_gla",
    "kda_gate",
    "mesa_net_decoding_one_step",
    "parallel_path_attn",
    "parallel_retention",
    "parallel_simple_gla",
    # reparametrisations of existing rules, and RWKV-4
    "chunk_hgrn",
    "chunk_lightnet",
    "fused_chunk_based",
    "fused_recurrent_lightnet",
    "fused_recurrent_rwkv4",
    "parallel_based",
    "parallel_rebased",
    # fla's softmax entry points
    "parallel_attn",
    "parallel_forgetting_attn",
    "parallel_stickbreaking_attn",
    "parallel_parallax",
    "parallel_wall_attn",
    "fused_attnres",
    "parallel_nsa",
    "parallel_moba",
    "parallel_wall_attn_decode",
    # DeepSeek sparse attention (fla.ops.dsa: naive code only)
    "naive_dsa",
    "naive_dsa_indexer",
]
DEPRECATED = ("fused_chunk_delta_rule", "fused_chunk_gla")  # raise in fla 0.6.0 too
# Entry points fla exports from one of its op modules only (not from ``fla.ops``): name -> module.
FLA_SUBMODULE_ENTRY_POINTS = {
    "chunk_gdn2": "fla.ops.gdn2",
    "fused_recurrent_gdn2": "fla.ops.gdn2",
    "fused_mul_recurrent_rwkv7": "fla.ops.rwkv7",
    "chunk_gated_delta_product": "fla.ops.gated_delta_product",
    "chunk_ttt_linear": "fla.ops.ttt",
    "fused_chunk_ttt_linear": "fla.ops.ttt",
    "chunk_titans_linear": "fla.ops.titans",
    "chunk_hgrn": "fla.ops.hgrn",
    "chunk_lightnet": "fla.ops.lightnet",
    "fused_recurrent_lightnet": "fla.ops.lightnet",
    "parallel_rebased": "fla.ops.rebased",
    "fused_recurrent_rwkv4": "fla.ops.rwkv4",
    # MesaNet, DeltaFormer, PaTH
    "mesa_net_decoding_one_step": "fla.ops.mesa_net",
    "deltaformer_attn": "fla.ops.deltaformer",
    "chunk_gated_oja_rule": "fla.ops.gated_oja_rule",
    "fused_recurrent_gated_oja_rule": "fla.ops.gated_oja_rule",
    "parallel_moba": "fla.ops.moba",
    "naive_dsa": "fla.ops.dsa",
    "naive_dsa_indexer": "fla.ops.dsa.naive",
}
# ``fla.ops`` entry points whose names are outside the chunk_ / fused_recurrent_ / fused_chunk_ /
# parallel_ pattern, and which are not attention over tokens (no registry entry): counted in
# FLA_ENTRY_POINTS and signature-checked, not in COMPUTED (attention residuals).
FLA_OTHER_ENTRY_POINTS = ("fused_attnres",)
# The ``fla.ops`` entry points linattn computes: the exported names less the deprecated ones,
# the helper, the submodule-only ones and the others above.
COMPUTED = tuple(
    name
    for name in __all__
    if name not in (*DEPRECATED, "kda_gate", *FLA_SUBMODULE_ENTRY_POINTS, *FLA_OTHER_ENTRY_POINTS)
)
FLA_ENTRY_POINTS = tuple(sorted((*COMPUTED, *DEPRECATED, *MISSING, *FLA_OTHER_ENTRY_POINTS)))
__all__ += unsupported.__all__
