// The update rules, a file each (DESIGN.md: "Rules are modules"; spec section 8). The chunk loop
// (forward.cpp, backward.cpp) is written once for every rule; what differs between the rules is
// here, in the spec's names:
//
//   additive.cpp  S <- S + k v^T: the scores A_qk, and the pseudo-values are the values, U = V.
//   delta.cpp     S <- S + k beta (v - S^T k)^T: the scores A_qk and A_kk, the UT transform
//                 (I + L) [W | U0] = diag(beta) [Kd | V] with L = diag(beta) A_kk, the
//                 pseudo-values U = U0 - W S, and the backward of each.
//
// The gate (none, one per head, one per key channel) is a parameter of every term (kg), not a rule.
// A new rule is a new file here, its functions declared below, and a case where the loop calls
// them (``Rule`` in mechanism.h; the calls in forward.cpp and backward.cpp). Its file name must
// differ from every other source's: the build names each object file after its source's name.
#pragma once

#include <cstdint>
#include <utility>

#include "../backward.h"
#include "../terms.h"

namespace linattn_native {

namespace additive {

// The scores of a chunk: A_qk = scale decayed(q k^T) (j <= i) into t.A.
void scores(const ChunkRows& x, int64_t kg, int64_t K, float scale, const Terms& t, int64_t C,
            Scratch& w);

// The pseudo-values: the values themselves, read in place (rows, row stride).
inline std::pair<const float*, int64_t> pseudo_values(const ChunkRows& x) { return {x.v, x.ldv}; }

}  // namespace additive

namespace delta {

// The scores of a chunk: A_qk = scale decayed(q k^T) (j <= i) into t.A and A_kk = decayed(k k^T)
// (j < i) into t.Akk, every decay formed once for both.
void scores(const ChunkRows& x, int64_t kg, int64_t K, float scale, const Terms& t, int64_t C,
            Scratch& w);

// The UT transform: L = diag(beta) A_kk, then (I + L) [W | U0] = diag(beta) [Kd | v], solved
// into X [c, K + V] (r: the rows Kd).
void ut_transform(const ChunkRows& x, const GatedRows& r, int64_t K, int64_t V, int64_t C,
                  const float* Akk, float* L, float* X);

// The pseudo-values U = U0 - W S (X = [W | U0]; S [K, V] the state entering the chunk) into U
// [c, V] (row stride ldu), which may be X's U0 block itself (in place).
void pseudo_values(int c, int64_t K, int64_t V, const float* X, const float* S, float* U,
                   int64_t ldu);

// The UT transform's backward (backward.cpp's step 8): dR_v = T^{-T} dU (in dU), dR_k = -dR_v S^T,
// dT (in dA, then dL = diag(beta) dT); dv, dbeta, and beta's share of dk and of the gates.
void ut_transform_backward(const ChunkRows& x, const ChunkGrads& g, const Dims& d,
                           const Recomputed& rc, const float* S, const TermGrads& tg);

// A_kk's two factors (both k; step 8b): dk += dK_L from dL (in dA), and the gates' share.
void kk_score_gradients(const ChunkRows& x, const ChunkGrads& g, const Dims& d,
                        const Recomputed& rc, const TermGrads& tg, Scratch& w);

}  // namespace delta

}  // namespace linattn_native
