// The delta rule (spec section 8): S <- D (I - beta k k^T) S + beta k v^T, read o = S^T q. In a
// chunk its writes are the pseudo-values U of the UT transform (rules.h):
//
//   L = diag(beta) A_kk (j < i),  (I + L) [W | U0] = diag(beta) [Kd | V],  U = U0 - W S.

#include "rules.h"

#include <algorithm>
#include <cstring>

#include "../blas.h"
#include "../triangular.h"

namespace linattn_native {
namespace {

// A_qk = scale decayed(q k^T) (j <= i) into t.A and A_kk = decayed(k k^T) (j < i) into t.Akk,
// every decay formed once for both.
void scores(const ChunkRows& x, int64_t kg, int64_t K, float scale, const Terms& t, int64_t C,
            Scratch& w) {
  const Rows q{x.q, x.ldq}, k{x.k, x.ldk};
  decayed_products(q, k, k, t.G, kg, x.c, K, scale, t.A, t.Akk, C, w, t.eEnd);
}

// The UT transform: L = diag(beta) A_kk (j < i) into t.L, X = diag(beta) [Kd | v] into t.X [c,
// K + V] (r: the rows Kd), then the solve (I + L) X = X: X = [W | U0].
void ut_transform(const ChunkRows& x, GatedRows& r, int64_t, int64_t K, int64_t V, int64_t C,
                  const Terms& t, Scratch&) {
  const float* Akk = t.Akk;
  float *L = t.L, *X = t.X;
  const int c = x.c, Ki = static_cast<int>(K), Vi = static_cast<int>(V);
  const int64_t ldx = K + V;
  for (int i = 0; i < c; ++i) {
    const float bi = x.beta[i * x.sb];
    const float* Ai = Akk + static_cast<int64_t>(i) * C;
    float* Li = L + static_cast<int64_t>(i) * C;
#pragma omp simd
    for (int j = 0; j < i; ++j) Li[j] = bi * Ai[j];
    const float *kd = r.Kdec + i * r.ldkd, *vi = x.v + i * x.ldv;
    float* xi = X + i * ldx;
#pragma omp simd
    for (int ch = 0; ch < Ki; ++ch) xi[ch] = bi * kd[ch];
#pragma omp simd
    for (int ch = 0; ch < Vi; ++ch) xi[K + ch] = bi * vi[ch];
  }
  unit_lower_solve(c, K + V, L, C, X, ldx);  // X = [W | U0]
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

// Row i of the UT transform's backward: dbeta_i, dv_i = beta_i dR_v,i, beta's share of dk_i (and
// of dG_i with a gate), and dL_i = beta_i dT_i (j < i; zero from i on).
void ut_transform_row(int i, const ChunkRows& x, const ChunkGrads& g, const Dims& d,
                      const Recomputed& rc, const TermGrads& tg) {
  const int c = d.c, Ki = static_cast<int>(d.K), Vi = static_cast<int>(d.V);
  const int64_t K = d.K, C = d.C, kr = std::max<int64_t>(d.kg, 1);
  const float bi = x.beta[i * x.sb];
  float* dTi = tg.dA + static_cast<int64_t>(i) * C;
  const float* Ai = rc.t.Akk + static_cast<int64_t>(i) * C;
  const float *kd = rc.r.Kdec + i * rc.r.ldkd, *vi = x.v + i * x.ldv, *eg = rc.t.eG + i * kr;
  const float *rk = tg.dRk + i * K, *rv = tg.dU + i * tg.lddu;
  float *dk_i = g.dK + i * g.lddk, *dv_i = g.dV + i * g.lddv, *dGi = tg.dG + i * kr;
  float db = 0.0f, sk = 0.0f;
#pragma omp simd reduction(+ : db)
  for (int j = 0; j < i; ++j) db += dTi[j] * Ai[j];
  if (!d.channel()) {
    const float a = d.gated() ? bi * eg[0] : bi;
#pragma omp simd reduction(+ : sk)
    for (int ch = 0; ch < Ki; ++ch) {
      sk += rk[ch] * kd[ch];
      dk_i[ch] += a * rk[ch];
    }
    if (d.gated()) dGi[0] += bi * sk;
  } else {
#pragma omp simd reduction(+ : sk)
    for (int ch = 0; ch < Ki; ++ch) {
      const float r = rk[ch] * kd[ch];
      sk += r;
      dGi[ch] += bi * r;
      dk_i[ch] += bi * eg[ch] * rk[ch];
    }
  }
#pragma omp simd reduction(+ : db)
  for (int ch = 0; ch < Vi; ++ch) {
    db += rv[ch] * vi[ch];
    dv_i[ch] = bi * rv[ch];
  }
  g.dB[i * g.sdb] = db + sk;
#pragma omp simd
  for (int j = 0; j < i; ++j) dTi[j] *= bi;  // dL = diag(beta) dT
  for (int j = i; j < c; ++j) dTi[j] = 0.0f;
}

// The UT transform's backward: dR_v = T^{-T} dU (in dU), dR_k = -dR_v S^T, dT (in dA, then
// dL = diag(beta) dT); dv, dbeta, and beta's share of dk and of the gates.
void ut_transform_backward(const ChunkRows& x, const ChunkGrads& g, const Dims& d,
                           const Recomputed& rc, const float* S, const TermGrads& tg) {
  const int c = d.c, Ki = static_cast<int>(d.K), Vi = static_cast<int>(d.V);
  const int64_t K = d.K, V = d.V, C = d.C, ldx = K + V;
  const float *W = rc.t.X, *U0 = rc.t.X + K;
  unit_lower_solve_transposed(c, Vi, rc.t.L, C, tg.dU, tg.lddu);
  const float* dRv = tg.dU;
  gemm(false, true, c, Ki, Vi, -1.0f, dRv, tg.lddu, S, V, 0.0f, tg.dRk, K);
  // dT, read below the diagonal alone (``ut_transform_row`` clears the rest)
  lower_products(c, c, 1, Ki, -1.0f, tg.dRk, K, W, ldx, tg.dA, C);
  lower_products(c, c, 1, Vi, -1.0f, dRv, tg.lddu, U0, ldx, tg.dA, C, 1.0f);
  for (int i = 0; i < c; ++i) ut_transform_row(i, x, g, d, rc, tg);
}

// A_kk's two factors (both k): dk += dK_L from dL (in dA), and the gates' share.
void kk_score_gradients(const ChunkRows& x, const ChunkGrads& g, const Dims& d,
                        const Recomputed& rc, const TermGrads& tg, Scratch& w) {
  const int c = d.c, Ki = static_cast<int>(d.K);
  const int64_t K = d.K, C = d.C;
  if (!d.channel()) {
    if (d.gated()) {
      product_gate_gradient(tg.dA, rc.t.Akk, C, c, tg.dGx);
      for (int64_t e = 0; e < static_cast<int64_t>(c) * C; ++e) tg.dA[e] *= rc.Gam[e];
    }
    lower_product_gradient(c, c, 1, Ki, 1.0f, tg.dA, C, x.k, x.ldk, x.k, x.ldk, g.dK, g.lddk,
                           1.0f, g.dK, g.lddk, 1.0f);
    return;
  }
  std::fill(tg.dX, tg.dX + c * K, 0.0f);
  std::fill(tg.dY, tg.dY + c * K, 0.0f);
  const Rows k{x.k, x.ldk};
  channel_product_backward(k, k, rc.t.G, K, c, 1.0f, tg.dA, C, tg.dX, tg.dY, w, rc.t.eEnd);
  channel_gate_share(k, k, rc.t.G, K, c, 1.0f, tg.dA, C, tg.dGx, w, rc.t.eEnd);
  for (int i = 0; i < c; ++i) {
    const float *dx = tg.dX + i * K, *dy = tg.dY + i * K;
    float* dk_i = g.dK + i * g.lddk;
#pragma omp simd
    for (int ch = 0; ch < Ki; ++ch) dk_i[ch] += dx[ch] + dy[ch];
  }
}

// Step 8 of backward.cpp: the UT transform's backward, then A_kk's.
void backward(const ChunkRows& x, const ChunkGrads& g, const Dims& d, const Recomputed& rc,
              const float* S, const TermGrads& tg, Scratch& w) {
  ut_transform_backward(x, g, d, rc, S, tg);
  kk_score_gradients(x, g, d, rc, tg, w);
}

// The step (section 7: decay, read, correct, write): u = beta (v - (Diag(alpha) S)^T k), the
// read of the decayed state as S^T (alpha * k) without writing the decay; then
// S <- Diag(alpha) S + k u^T and o = S^T q. Two passes over each block of S, the second in L1.
void step(const StepHead& h, int64_t K, int64_t V, float* S, float* o) {
  float* ak = h.scratch;  // [K] alpha * k
#pragma omp simd
  for (int64_t i = 0; i < K; ++i) ak[i] = h.alpha[i] * h.k[i];
  const float b = *h.beta;
  column_blocks(V, [&](auto vecs, int64_t j0, int64_t w) {
    constexpr int N = decltype(vecs)::value;
    float u[kBlockVecs * kLanes];
    read_block<N>(ak, K, V, h.S_in + j0, w, u);
    for (int64_t j = 0; j < w; ++j) u[j] = b * (h.v[j0 + j] - u[j]);
    write_block<N, false>(h, h.k, u, nullptr, nullptr, K, V, h.S_in + j0, S + j0, w, o + j0);
  });
}

}  // namespace

const Rule kDeltaRule{.name = "delta",
                             .reads_beta = true,
                             .needs_Kd = true,
                             .writes = 1,
                             .input_keys = 0,
                             .input_low = 0.0f,  // beta in [0, 2]: I - beta k k^T contracts
                             .input_high = 2.0f,
                             .takes_bonus = false,
                             .scores = scores,
                             .pseudo_value_terms = ut_transform,
                             .pseudo_values = pseudo_values,
                             .backward = backward,
                             .step = step};
const RuleEntry kDeltaRuleEntry{kDeltaRule};  // its row of rules.h's table

}  // namespace linattn_native
