// The oblique delta rule (spec section 8, its read key apart from its write key):
// S <- D S + k (v - (D S)^T r)^T, read o = S^T q. The beta slot carries the read keys r [c, K]
// (row stride sb). In a chunk its writes are the pseudo-values U of the delta rule's UT transform
// with r on the rows of the products and k on their columns (rules.h):
//
//   L = decayed(r k^T) (j < i),  (I + L) [W | U0] = [Rd | V],  Rd = r exp(G),  U = U0 - W S,
//
// and the loop's Ke, A_qk (the write keys k) and its steps are the delta rule's. L is the product
// itself (no strength scales it): the solve reads t.Akk, whose strictly lower part is L.

#include <limits>

#include "rules.h"

#include <algorithm>
#include <cstring>

#include "../blas.h"
#include "../triangular.h"

namespace linattn_native {
namespace {

Rows read_keys(const ChunkRows& x) { return {x.beta, x.sb}; }

// A_qk = scale decayed(q k^T) (j <= i) into t.A and L = decayed(r k^T) (j < i) into t.Akk, every
// decay formed once for both.
void scores(const ChunkRows& x, int64_t kg, int64_t K, float scale, const Terms& t, int64_t C,
            Scratch& w) {
  const Rows q{x.q, x.ldq}, k{x.k, x.ldk};
  decayed_products(q, read_keys(x), k, t.G, kg, x.c, K, scale, t.A, t.Akk, C, w, t.eEnd);
}

// Row i of Rd = r exp(G) (kg = 0: r itself) into out [K].
void decayed_read_row(const ChunkRows& x, const float* eG, int64_t kg, int64_t K, int i,
                      float* out) {
  const int Ki = static_cast<int>(K);
  const float* ri = x.beta + i * x.sb;
  if (kg == 0) {
    std::memcpy(out, ri, sizeof(float) * K);
  } else if (kg == 1) {
    const float e = eG[i];
#pragma omp simd
    for (int ch = 0; ch < Ki; ++ch) out[ch] = e * ri[ch];
  } else {
    const float* e = eG + i * K;
#pragma omp simd
    for (int ch = 0; ch < Ki; ++ch) out[ch] = e[ch] * ri[ch];
  }
}

// X = [Rd | V] into t.X [c, K + V], then the solve (I + L) X = X: X = [W | U0].
void ut_transform(const ChunkRows& x, GatedRows&, int64_t kg, int64_t K, int64_t V, int64_t C,
                  const Terms& t, Scratch&) {
  const int c = x.c;
  const int64_t ldx = K + V;
  for (int i = 0; i < c; ++i) {
    float* xi = t.X + i * ldx;
    decayed_read_row(x, t.eG, kg, K, i, xi);
    std::memcpy(xi + K, x.v + i * x.ldv, sizeof(float) * V);
  }
  unit_lower_solve(c, K + V, t.Akk, C, t.X, ldx);  // X = [W | U0]
}

// The pseudo-values U = U0 - W S (X = [W | U0]; S [K, V] the state entering the chunk) into U
// [c, V] (row stride ldu), U0 copied first where U is not X's own U0 block.
void pseudo_values(int c, int64_t K, int64_t V, const float* X, const float* S, float* U,
                   int64_t ldu) {
  const int64_t ldx = K + V;
  if (U != X + K) {
    for (int i = 0; i < c; ++i) std::memcpy(U + i * ldu, X + i * ldx + K, sizeof(float) * V);
  }
  gemm(false, false, c, V, K, -1.0f, X, ldx, S, V, 1.0f, U, ldu);
}

// Row i of the UT transform's backward: dv_i = dR_v,i, dr_i = exp(G_i) dR_k,i (the slot's
// gradient row, written here first), the gates' share dR_k,i . Rd_i, and dL's row i kept below
// the diagonal (zero from i on).
void transform_row(int i, const ChunkRows& x, const ChunkGrads& g, const Dims& d,
                   const Recomputed& rc, const TermGrads& tg) {
  const int c = d.c, Ki = static_cast<int>(d.K);
  const int64_t K = d.K, V = d.V, C = d.C, kr = std::max<int64_t>(d.kg, 1);
  const float *ri = x.beta + i * x.sb, *rk = tg.dRk + i * K;
  const float* eg = d.gated() ? rc.t.eG + i * kr : nullptr;
  float *dr_i = g.dB + i * g.sdb, *dGi = tg.dG + i * kr;
  std::memcpy(g.dV + i * g.lddv, tg.dU + i * tg.lddu, sizeof(float) * V);
  if (!d.gated()) {
    std::memcpy(dr_i, rk, sizeof(float) * K);
  } else if (!d.channel()) {
    const float e = eg[0];
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int ch = 0; ch < Ki; ++ch) {
      const float r = e * rk[ch];
      dr_i[ch] = r;
      s += r * ri[ch];
    }
    dGi[0] += s;
  } else {
#pragma omp simd
    for (int ch = 0; ch < Ki; ++ch) {
      const float r = eg[ch] * rk[ch];
      dr_i[ch] = r;
      dGi[ch] += r * ri[ch];
    }
  }
  float* dLi = tg.dA + static_cast<int64_t>(i) * C;
  std::fill(dLi + i, dLi + c, 0.0f);
}

// The backward (backward.cpp's step 8): dR_v = (I + L)^{-T} dU (in dU), dR_k = -dR_v S^T,
// dL = -(dR_k W^T + dR_v U0^T) (j < i); dv, dr and the gates' share from the right-hand side
// [Rd | V]; then L's two factors: dr (rows) and dk (columns), and the gates' share.
void backward(const ChunkRows& x, const ChunkGrads& g, const Dims& d, const Recomputed& rc,
              const float* S, const TermGrads& tg, Scratch& w) {
  const int c = d.c, Ki = static_cast<int>(d.K), Vi = static_cast<int>(d.V);
  const int64_t K = d.K, V = d.V, C = d.C, ldx = K + V;
  const float *W = rc.t.X, *U0 = rc.t.X + K;
  unit_lower_solve_transposed(c, Vi, rc.t.Akk, C, tg.dU, tg.lddu);
  const float* dRv = tg.dU;
  gemm(false, true, c, Ki, Vi, -1.0f, dRv, tg.lddu, S, V, 0.0f, tg.dRk, K);
  // dL, read below the diagonal alone (``transform_row`` clears the rest)
  lower_products(c, c, 1, Ki, -1.0f, tg.dRk, K, W, ldx, tg.dA, C);
  lower_products(c, c, 1, Vi, -1.0f, dRv, tg.lddu, U0, ldx, tg.dA, C, 1.0f);
  for (int i = 0; i < c; ++i) transform_row(i, x, g, d, rc, tg);
  const Rows r = read_keys(x), k{x.k, x.ldk};
  if (!d.channel()) {
    if (d.gated()) {
      product_gate_gradient(tg.dA, rc.t.Akk, C, c, tg.dGx);
      for (int64_t e = 0; e < static_cast<int64_t>(c) * C; ++e) tg.dA[e] *= rc.Gam[e];
    }
    lower_product_gradient(c, c, 1, Ki, 1.0f, tg.dA, C, r.p, r.ld, k.p, k.ld, g.dB, g.sdb, 1.0f,
                           g.dK, g.lddk, 1.0f);
    return;
  }
  std::fill(tg.dX, tg.dX + c * K, 0.0f);
  std::fill(tg.dY, tg.dY + c * K, 0.0f);
  channel_product_backward(r, k, rc.t.G, K, c, 1.0f, tg.dA, C, tg.dX, tg.dY, w, rc.t.eEnd);
  channel_gate_share(r, k, rc.t.G, K, c, 1.0f, tg.dA, C, tg.dGx, w, rc.t.eEnd);
  for (int i = 0; i < c; ++i) {
    const float *dx = tg.dX + i * K, *dy = tg.dY + i * K;
    float *dr_i = g.dB + i * g.sdb, *dk_i = g.dK + i * g.lddk;
#pragma omp simd
    for (int ch = 0; ch < Ki; ++ch) {
      dr_i[ch] += dx[ch];
      dk_i[ch] += dy[ch];
    }
  }
}

// The step (section 7: decay, read, correct, write): u = v - (Diag(alpha) S)^T r, the read of the
// decayed state as S^T (alpha * r) without writing the decay; then S <- Diag(alpha) S + k u^T and
// o = S^T q. Two passes over each block of S, the second in L1.
void step(const StepHead& h, int64_t K, int64_t V, float* S, float* o) {
  float* ar = h.scratch;  // [K] alpha * r
#pragma omp simd
  for (int64_t i = 0; i < K; ++i) ar[i] = h.alpha[i] * h.beta[i];
  column_blocks(V, [&](auto vecs, int64_t j0, int64_t w) {
    constexpr int N = decltype(vecs)::value;
    float u[kBlockVecs * kLanes];
    read_block<N>(ar, K, V, h.S_in + j0, w, u);
    for (int64_t j = 0; j < w; ++j) u[j] = h.v[j0 + j] - u[j];
    write_block<N, false>(h, h.k, u, nullptr, nullptr, K, V, h.S_in + j0, S + j0, w, o + j0);
  });
}

}  // namespace

const Rule kObliqueRule{.name = "oblique",
                        .reads_beta = true,
                        .needs_Kd = false,
                        .writes = 1,
                        .input_keys = 1,
                        .input_low = -std::numeric_limits<float>::infinity(),  // r: finite
                        .input_high = std::numeric_limits<float>::infinity(),
                        .takes_bonus = false,
                        .scores = scores,
                        .pseudo_value_terms = ut_transform,
                        .pseudo_values = pseudo_values,
                        .backward = backward,
                        .step = step};
const RuleEntry kObliqueRuleEntry{kObliqueRule};  // its row of rules.h's table

}  // namespace linattn_native
