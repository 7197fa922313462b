"""fla 0.6.0's op interface on linattn: drop-in entry points with flash-linear-attention's names.

Swap ``from fla.ops.gated_delta_rule import chunk_gated_delta_rule`` for
``from linattn.compat import chunk_gated_delta_rule`` to run the same call on the CPU (or any
device) through linattn's ops. Every one of fla 0.6.0's 59 ``chunk_* / fused_recurrent_* /
fused_chunk_* / parallel_*`` entry points (``fla.ops``) has a function here with fla's name,
positional order, keywords and defaults (``FLA_ENTRY_POINTS``):

- computed by linattn: linear attention (``*_linear_attn``, normalised with fla's ``(kv, z)``
  state), simple GLA, retention and lightning attention (a constant decay per head), GLA, the
  delta rule, the gated delta rule (``chunk_gdn`` / ``fused_recurrent_gdn`` too), KDA, HGRN,
  the generalized delta rule (``*_dplr_delta_rule``, ``*_iplr_delta_rule``), RWKV-6, RWKV-7 and
  Comba (modules ``linear_attn``, ``simple_gla``, ``gla``, ``delta_rule``, ``gated_delta_rule``,
  ``kda``, ``hgrn``, ``generalized_delta_rule``, ``rwkv6``, ``rwkv7``, ``comba``); ``chunk_*`` run
  linattn's chunk form,
  ``fused_recurrent_*`` its recurrent form,
  ``parallel_*`` its parallel form;
- fla's deprecated ``fused_chunk_delta_rule`` / ``fused_chunk_gla`` raise as fla's do;
- the others raise NotImplementedError naming the missing mechanism (``unsupported``).

Softmax attention's variants (issue 52): ``parallel_attn`` and ``parallel_forgetting_attn``
(module ``attn``, with ``parallel_stickbreaking_attn``), ``parallel_parallax``,
``parallel_wall_attn`` / ``parallel_wall_attn_decode``, ``parallel_nsa``, ``parallel_moba``
(fla.ops.moba only) and ``fused_attnres`` (attention residuals; its name is outside the pattern
above: ``FLA_OTHER_ENTRY_POINTS``).

``chunk_gdn2`` / ``fused_recurrent_gdn2`` (Gated DeltaNet-2, module ``gdn2``) and
``fused_mul_recurrent_rwkv7`` (RWKV-7's decoding loop) and ``chunk_gated_delta_product``
(Gated DeltaProduct, module ``gated_delta_product``) are computed too; fla exports them from
``fla.ops.gdn2``, ``fla.ops.rwkv7`` and ``fla.ops.gated_delta_product`` only, not ``fla.ops``
(``FLA_SUBMODULE_ENTRY_POINTS``).

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
from linattn.compat.attn import (
    parallel_attn,
    parallel_forgetting_attn,
    parallel_stickbreaking_attn,
)
from linattn.compat.attnres import fused_attnres
from linattn.compat.comba import chunk_comba, fused_recurrent_comba
from linattn.compat.delta_rule import (
    chunk_delta_rule,
    fused_chunk_delta_rule,
    fused_recurrent_delta_rule,
)
from linattn.compat.gated_delta_product import chunk_gated_delta_product
from linattn.compat.gated_delta_rule import (
    chunk_gated_delta_rule,
    chunk_gdn,
    fused_recurrent_gated_delta_rule,
    fused_recurrent_gdn,
)
from linattn.compat.gdn2 import chunk_gdn2, fused_recurrent_gdn2
from linattn.compat.generalized_delta_rule import (
    chunk_dplr_delta_rule,
    chunk_iplr_delta_rule,
    fused_recurrent_dplr_delta_rule,
    fused_recurrent_iplr_delta_rule,
)
from linattn.compat.gla import chunk_gla, fused_chunk_gla, fused_recurrent_gla
from linattn.compat.hgrn import fused_recurrent_hgrn
from linattn.compat.kda import chunk_kda, fused_recurrent_kda, kda_gate
from linattn.compat.linear_attn import (
    chunk_linear_attn,
    fused_chunk_linear_attn,
    fused_recurrent_linear_attn,
)
from linattn.compat.moba import parallel_moba
from linattn.compat.nsa import parallel_nsa
from linattn.compat.parallax import parallel_parallax
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
from linattn.compat.unsupported import *  # noqa: F403
from linattn.compat.unsupported import MISSING
from linattn.compat.wall_attn import parallel_wall_attn, parallel_wall_attn_decode

__all__ = [
    "chunk_comba",
    "chunk_delta_rule",
    "chunk_dplr_delta_rule",
    "chunk_gated_delta_product",
    "chunk_gated_delta_rule",
    "chunk_gdn",
    "chunk_gdn2",
    "chunk_gla",
    "chunk_iplr_delta_rule",
    "chunk_kda",
    "chunk_lightning_attn",
    "chunk_linear_attn",
    "chunk_retention",
    "chunk_rwkv6",
    "chunk_rwkv7",
    "chunk_simple_gla",
    "fused_chunk_delta_rule",
    "fused_chunk_gla",
    "fused_chunk_linear_attn",
    "fused_chunk_retention",
    "fused_chunk_simple_gla",
    "fused_recurrent_comba",
    "fused_recurrent_delta_rule",
    "fused_recurrent_dplr_delta_rule",
    "fused_recurrent_gated_delta_rule",
    "fused_recurrent_gdn",
    "fused_recurrent_gdn2",
    "fused_recurrent_gla",
    "fused_recurrent_hgrn",
    "fused_recurrent_iplr_delta_rule",
    "fused_recurrent_kda",
    "fused_recurrent_lightning_attn",
    "fused_mul_recurrent_rwkv7",
    "fused_recurrent_linear_attn",
    "fused_recurrent_retention",
    "fused_recurrent_rwkv6",
    "fused_recurrent_rwkv7",
    "fused_recurrent_simple_gla",
    "kda_gate",
    "parallel_retention",
    "parallel_simple_gla",
    # issue 52: fla's softmax entry points
    "parallel_attn",
    "parallel_forgetting_attn",
    "parallel_stickbreaking_attn",
    "parallel_parallax",
    "parallel_wall_attn",
    "fused_attnres",
    "parallel_nsa",
    "parallel_moba",
    "parallel_wall_attn_decode",
]
DEPRECATED = ("fused_chunk_delta_rule", "fused_chunk_gla")  # raise in fla 0.6.0 too
# Entry points fla exports from one of its op modules only (not from ``fla.ops``): name -> module.
FLA_SUBMODULE_ENTRY_POINTS = {
    "chunk_gdn2": "fla.ops.gdn2",
    "fused_recurrent_gdn2": "fla.ops.gdn2",
    "fused_mul_recurrent_rwkv7": "fla.ops.rwkv7",
    "chunk_gated_delta_product": "fla.ops.gated_delta_product",
    "parallel_moba": "fla.ops.moba",  # issue 52
}
# ``fla.ops`` entry points whose names are outside the chunk_ / fused_recurrent_ / fused_chunk_ /
# parallel_ pattern, and which are not attention over tokens (no registry entry): counted in
# FLA_ENTRY_POINTS and signature-checked, not in COMPUTED (issue 52: attention residuals).
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
