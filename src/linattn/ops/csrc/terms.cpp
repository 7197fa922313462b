// The state-independent terms of a chunk (terms.h; spec section 8).

#include "terms.h"

#include <cstring>

#include "blas.h"
#include "triangular.h"

namespace linattn_native {

// Step G, D, Qd, Ke, Kd: G_i = g_1 + ... + g_i as pairs, exp(G) and exp(G_c - G) once per
// gate, Qd = scale q exp(G), Ke = k exp(G_c - G), Kd = k exp(G) (when t.Kd), D = exp(G_c).
GatedRows chunk_gates(const ChunkRows& x, int64_t kg, int64_t K, float scale, const float* zeros,
                      const Terms& t) {
  if (kg == 0) return {x.q, x.ldq, scale, x.k, x.ldk, x.k, x.ldk};
  const int c = x.c, Ki = static_cast<int>(K), kgi = static_cast<int>(kg);
  cumulative_gates(x.g, x.sg, c, kg, zeros, t.G);
  const float* Gc = t.G.hi + static_cast<int64_t>(c - 1) * kg;
  const float* Lc = t.G.lo + static_cast<int64_t>(c - 1) * kg;
  for (int ch = 0; ch < kgi; ++ch) t.D[ch] = exp_flush(Gc[ch] + Lc[ch]);
  for (int i = 0; i < c; ++i) {
    const int64_t at = static_cast<int64_t>(i) * kg, row = static_cast<int64_t>(i) * K;
    const float *Gi = t.G.hi + at, *Li = t.G.lo + at;
    float *eg = t.eG + at, *ee = t.eEnd + at;
#pragma omp simd
    for (int ch = 0; ch < kgi; ++ch) {
      eg[ch] = exp_flush(Gi[ch] + Li[ch]);
      ee[ch] = decay(Gc[ch], Lc[ch], Gi[ch], Li[ch]);
    }
    const float *qi = x.q + i * x.ldq, *ki = x.k + i * x.ldk;
    float *qd = t.Qd + row, *ke = t.Ke + row;
    if (kg == 1) {
      const float a = scale * eg[0], e = ee[0];
#pragma omp simd
      for (int ch = 0; ch < Ki; ++ch) {
        qd[ch] = a * qi[ch];
        ke[ch] = e * ki[ch];
      }
      if (t.Kd) {
        float* kd = t.Kd + row;
        const float d = eg[0];
#pragma omp simd
        for (int ch = 0; ch < Ki; ++ch) kd[ch] = d * ki[ch];
      }
    } else {
#pragma omp simd
      for (int ch = 0; ch < Ki; ++ch) {
        qd[ch] = scale * qi[ch] * eg[ch];
        ke[ch] = ki[ch] * ee[ch];
      }
      if (t.Kd) {
        float* kd = t.Kd + row;
#pragma omp simd
        for (int ch = 0; ch < Ki; ++ch) kd[ch] = ki[ch] * eg[ch];
      }
    }
  }
  return {t.Qd, K, 1.0f, t.Ke, K, t.Kd ? t.Kd : x.k, t.Kd ? K : x.ldk};
}

// Step A_qk (and A_kk), by the products of products.h.
void chunk_scores(const ChunkRows& x, bool delta, int64_t kg, int64_t K, float scale,
                  const Gates& G, int64_t C, float* A, float* Akk, Scratch& w) {
  const int Ki = static_cast<int>(K);
  if (delta) {
    decayed_product_pair(x.q, x.ldq, x.k, x.ldk, x.k, x.ldk, G, static_cast<int>(kg), x.c, Ki,
                         scale, A, Akk, C, w);
  } else {
    decayed_products(x.q, x.ldq, x.k, x.ldk, G, kg, x.c, Ki, false, scale, A, C, w);
  }
}

// Step L, W, U0: L = diag(beta) A_kk (j < i), X = diag(beta) [Kd | v], then the solve
// (I + L) X = X (blas.h).
void ut_transform(const ChunkRows& x, const GatedRows& r, int64_t K, int64_t V, int64_t C,
                  const float* Akk, float* L, float* X) {
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

// Step U: U = U0 - W S, U0 copied first where U is not X's own U0 block.
void pseudo_values(int c, int64_t K, int64_t V, const float* X, const float* S, float* U,
                   int64_t ldu) {
  const int64_t ldx = K + V;
  if (U != X + K) {
    for (int i = 0; i < c; ++i) std::memcpy(U + i * ldu, X + i * ldx + K, sizeof(float) * V);
  }
  gemm(false, false, c, V, K, -1.0f, X, ldx, S, V, 1.0f, U, ldu);
}

}  // namespace linattn_native
