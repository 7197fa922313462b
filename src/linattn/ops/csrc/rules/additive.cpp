// The additive rule (spec sections 5 and 8): S <- D S + k v^T, read o = S^T q. Its chunk form
// needs the scores A_qk alone; its pseudo-values are the values, U = V (rules.h).

#include "rules.h"

namespace linattn_native {
namespace {

// A_qk = scale decayed(q k^T) (j <= i) into t.A.
void scores(const ChunkRows& x, int64_t kg, int64_t K, float scale, const Terms& t, int64_t C,
            Scratch& w) {
  const Rows q{x.q, x.ldq}, k{x.k, x.ldk};
  decayed_products(q, q, k, t.G, kg, x.c, K, scale, t.A, nullptr, C, w);
}

}  // namespace

extern const Rule kAdditiveRule{
    "additive", false, false, 1, 0, scores, nullptr, nullptr, nullptr};

}  // namespace linattn_native
