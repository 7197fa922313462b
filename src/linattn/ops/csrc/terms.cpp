// The state-independent terms of a chunk (terms.h; spec section 8).

#include "terms.h"


namespace linattn_native {
namespace {

// Qd_i = scale q_i exp(G_{i-1}) over the inclusive row (``chunk_gates``, exclusive): eq the row
// before's exp(G) (one per channel, or one for all), nullptr for exp(G_{-1}) = 1.
void exclusive_read_row(const float* qi, const float* eq, int64_t kg, int Ki, float scale,
                        float* qd) {
  if (!eq || kg == 1) {
    const float a = scale * (eq ? eq[0] : 1.0f);
#pragma omp simd
    for (int ch = 0; ch < Ki; ++ch) qd[ch] = a * qi[ch];
    return;
  }
#pragma omp simd
  for (int ch = 0; ch < Ki; ++ch) qd[ch] = scale * qi[ch] * eq[ch];
}

}  // namespace

// Step G, D, Qd, Ke, Kd: G_i = g_1 + ... + g_i as pairs, exp(G) and exp(G_c - G) once per
// gate (from the pairs without rounding their sum: ``exp_pair``, ``end_decay``; the products
// reuse exp(G_c - G), ``decayed_products``), Qd = scale q exp(G) (exclusive: exp(G_{i-1}) on
// row i), Ke = k exp(G_c - G),
// Kd = k exp(G) (when t.Kd), D = exp(G_c).
GatedRows chunk_gates(const ChunkRows& x, int64_t kg, int64_t K, float scale, const float* zeros,
                      const Terms& t, bool exclusive) {
  if (kg == 0) return {x.q, x.ldq, scale, x.k, x.ldk, x.k, x.ldk};
  const int c = x.c, Ki = static_cast<int>(K), kgi = static_cast<int>(kg);
  cumulative_gates(x.g, x.sg, c, kg, zeros, t.G);
  const float* Gc = t.G.hi + static_cast<int64_t>(c - 1) * kg;
  const float* Lc = t.G.lo + static_cast<int64_t>(c - 1) * kg;
  for (int ch = 0; ch < kgi; ++ch) t.D[ch] = exp_pair(Gc[ch], Lc[ch]);
  for (int i = 0; i < c; ++i) {
    const int64_t at = static_cast<int64_t>(i) * kg, row = static_cast<int64_t>(i) * K;
    const float *Gi = t.G.hi + at, *Li = t.G.lo + at;
    float *eg = t.eG + at, *ee = t.eEnd + at;
#pragma omp simd
    for (int ch = 0; ch < kgi; ++ch) {
      eg[ch] = exp_pair(Gi[ch], Li[ch]);
      ee[ch] = end_decay(Gc[ch], Lc[ch], Gi[ch], Li[ch]);
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
    if (exclusive) exclusive_read_row(qi, i > 0 ? eg - kg : nullptr, kg, Ki, scale, qd);
  }
  return {t.Qd, K, 1.0f, t.Ke, K, t.Kd ? t.Kd : x.k, t.Kd ? K : x.ldk};
}

}  // namespace linattn_native
