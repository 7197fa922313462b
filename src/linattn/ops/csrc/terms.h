// A chunk's rows and terms, and the one term every rule shares (spec section 8), computed in one
// place for the forward pass (forward.cpp) and the backward pass (backward.cpp) alike:
//
//   chunk_gates    G (cumulative log-gates), exp(G), exp(G_c - G), D = exp(G_c);
//                  Qd = scale q exp(G), Ke = k exp(G_c - G), Kd = k exp(G)
//
// The rules' own terms (the scores A_qk and A_kk, the UT transform, the pseudo-values) are in
// rules/, a file per rule. None of the state-independent terms reads the state: they are computed
// for every (chunk, head) pair at once when heads alone cannot fill the threads (the split
// schedules).
#pragma once

#include <cstdint>

#include "gates.h"
#include "products.h"

namespace linattn_native {

// One chunk of c <= C tokens of one head: its rows in the inputs (row strides ld*), beta [c]
// (stride sb) and the log-gates g [c, kg] (row stride sg), nullptr where the mechanism has none.
struct ChunkRows {
  const float *q, *k, *v;
  int64_t ldq, ldk, ldv;
  const float* beta;
  int64_t sb;
  const float* g;
  int64_t sg;
  int c;
};

// Where one chunk's terms are written (each block row-major): G [c, kg] as pairs; Qd, Ke, Kd
// [c, K] (Kd nullptr: not formed, no delta rule); eG = exp(G), eEnd = exp(G_c - G) [c, kg];
// D = exp(G_c) [kg]; A (A_qk), Akk and L [c, C] with row stride C (L may be Akk: then the UT
// transform scales A_kk into L in place); X [c, K + V], [W | U0] after the UT transform.
struct Terms {
  Gates G;
  float *Qd, *Ke, *Kd, *eG, *eEnd, *D;
  float *A, *Akk, *L, *X;
};

// The rows the products read: Qd = q_alpha Qread, Ke and Kd, which are the inputs themselves
// (and q_alpha the scale) without decay.
struct GatedRows {
  const float* Qread;
  int64_t ldqr;
  float q_alpha;
  const float* Kend;
  int64_t ldke;
  const float* Kdec;
  int64_t ldkd;
};

// Step G, D, Qd, Ke, Kd into ``t`` (kg = 0: nothing is formed; the rows are the inputs).
// ``zeros``: kg zeros. ``exclusive``: the read of the state before the token's write (RWKV-6's,
// the additive rule with a bonus, rules.h), Qd_i = scale q_i exp(G_{i-1}) with G_{-1} = 0.
GatedRows chunk_gates(const ChunkRows& x, int64_t kg, int64_t K, float scale, const float* zeros,
                      const Terms& t, bool exclusive = false);

}  // namespace linattn_native
