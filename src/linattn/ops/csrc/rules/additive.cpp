// The additive rule (spec sections 5 and 8): S <- D S + k v^T, read o = S^T q. Its chunk form
// needs the scores A_qk alone; its pseudo-values are the values, U = V (rules.h). With a bonus u
// (RWKV-6, ``ops.rwkv6``) the read is of the state before the token's write plus u on the token's
// own write, o_t = S_{t-1}^T (scale q_t) + scale (q_t^T Diag(u) k_t) v_t: the scores are strictly
// lower with q's gate exclusive, and the bonus is their diagonal (``bonus_scores``).

#include "rules.h"

#include <algorithm>
#include <cstring>

namespace linattn_native {
namespace {

// A_qk = scale decayed(q k^T) (j <= i) into t.A.
void scores(const ChunkRows& x, int64_t kg, int64_t K, float scale, const Terms& t, int64_t C,
            Scratch& w) {
  const Rows q{x.q, x.ldq}, k{x.k, x.ldk};
  decayed_products(q, q, k, t.G, kg, x.c, K, scale, t.A, nullptr, C, w, t.eEnd);
}

// The step: S <- Diag(alpha) S + k v^T, o = S^T q, one pass over each block of S (step.h): the
// pass streams the state in order, so the next head is not prefetched (the hardware's stream
// prefetch does it, and the explicit one only adds instructions).
void step(const StepHead& h, int64_t K, int64_t V, float* S, float* o) {
  column_blocks(V, [&](auto vecs, int64_t j0, int64_t w) {
    constexpr int N = decltype(vecs)::value;
    write_block<N, false, false>(h, h.k, h.v + j0, nullptr, nullptr, K, V, h.S_in + j0, S + j0,
                                 w, o + j0);
  });
}

}  // namespace

// A strict product with q's gate exclusive, exp(G_{i-1} - G_j) for j < i, is the inclusive
// product of the rows q_{i+1} and k_j about G_i, one row down (as the dplr rule's b): the
// product of q_next (q_{i+1} on row i, the last row zeros, in w.Y) and k over the chunk's c rows,
// with its end decays as the rule's own scores, moved one row down; row 0 then holds zeros and
// the diagonal, zero after the move, the bonus.
void bonus_scores(const ChunkRows& x, int64_t kg, int64_t K, float scale, const float* u,
                  const Terms& t, int64_t C, Scratch& w) {
  const int c = x.c, Ki = static_cast<int>(K);
  float* q_next = w.Y.data();
  for (int i = 0; i + 1 < c; ++i) {
    std::memcpy(q_next + i * K, x.q + (i + 1) * x.ldq, sizeof(float) * K);
  }
  std::fill(q_next + (c - 1) * K, q_next + c * K, 0.0f);
  const Rows qn{q_next, K}, k{x.k, x.ldk};
  decayed_products(qn, qn, k, t.G, kg, c, K, scale, t.A, nullptr, C, w, t.eEnd);
  for (int i = c - 1; i > 0; --i) std::memcpy(t.A + i * C, t.A + (i - 1) * C, sizeof(float) * c);
  std::fill(t.A, t.A + c, 0.0f);
  for (int i = 0; i < c; ++i) {
    const float *qi = x.q + i * x.ldq, *ki = x.k + i * x.ldk;
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int ch = 0; ch < Ki; ++ch) s += qi[ch] * u[ch] * ki[ch];
    t.A[i * C + i] = scale * s;
  }
}

extern const Rule kAdditiveRule{.name = "additive",
                                .reads_beta = false,
                                .needs_Kd = false,
                                .writes = 1,
                                .input_keys = 0,
                                .input_low = 0.0f,
                                .input_high = 0.0f,
                                .takes_bonus = true,
                                .scores = scores,
                                .pseudo_value_terms = nullptr,
                                .pseudo_values = nullptr,
                                .backward = nullptr,
                                .step = step};

}  // namespace linattn_native
