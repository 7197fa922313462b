// The additive rule (spec sections 5 and 8): S <- D S + k v^T, read o = S^T q. Its chunk form
// needs the scores A_qk alone; its pseudo-values are the values, U = V (rules.h).

#include "rules.h"

namespace linattn_native {
namespace {

// A_qk = scale decayed(q k^T) (j <= i) into t.A.
void scores(const ChunkRows& x, int64_t kg, int64_t K, float scale, const Terms& t, int64_t C,
            Scratch& w) {
  const Rows q{x.q, x.ldq}, k{x.k, x.ldk};
  decayed_products(q, q, k, t.G, kg, x.c, K, scale, t.A, nullptr, C, w, t.eEnd);
}

// The step: S <- Diag(alpha) S + k v^T, o = S^T q, one pass over each block of S (step.h).
void step(const StepHead& h, int64_t K, int64_t V, float* S, float* o) {
  column_blocks(V, [&](auto vecs, int64_t j0, int64_t w) {
    constexpr int N = decltype(vecs)::value;
    write_block<N, false>(h, h.k, h.v + j0, nullptr, nullptr, K, V, h.S_in + j0, S + j0, w,
                          o + j0);
  });
}

}  // namespace

extern const Rule kAdditiveRule{
    "additive", false, false, 1, 0, scores, nullptr, nullptr, nullptr, step};

}  // namespace linattn_native
