// Gates and decays of the chunk form (spec section 8; section 10 for the per-channel gate).
//
// Inside a chunk of c tokens the log-gates g_t <= 0 are summed, G_i = g_1 + ... + g_i (the step
// "G" of section 8), and every decay is exp(G_i - G_j) for i >= j: an exponent <= 0, a number in
// [0, 1]. The constants here are mathematics, not tuning: they follow from float32's range.
#pragma once

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>

#if defined(__SSE__)
#include <xmmintrin.h>
#endif

namespace linattn_native {

// 2^n exp(r) for an integer n (a float) and |r| <= ln 2 / 2: exp(r) by its degree-7 Taylor
// polynomial, 2^n from the exponent bits; results below the normal range are 0 (flushed).
__attribute__((always_inline)) inline float exp_reduced(float n, float r) {
  float p = 1.98412698e-04f;  // 1/7!
  p = std::fma(p, r, 1.38888889e-03f);
  p = std::fma(p, r, 8.33333333e-03f);
  p = std::fma(p, r, 4.16666667e-02f);
  p = std::fma(p, r, 1.66666667e-01f);
  p = std::fma(p, r, 0.5f);
  p = std::fma(p, r, 1.0f);
  p = std::fma(p, r, 1.0f);
  const int32_t e = std::max(static_cast<int32_t>(n) + 127, 0);  // biased exponent of 2^n
  return p * __builtin_bit_cast(float, e << 23);  // e = 0: 2^n below the normal range, 0
}

// exp(x) for x <= 88, to about 2 ulp; results below the normal range are 0 (flushed, as the
// PyTorch path flushes decays below the smallest normal number). Branch-free, so loops over it
// vectorise: x = n ln 2 + r with |r| <= ln 2 / 2, exp(r) by its degree-7 Taylor polynomial.
__attribute__((always_inline)) inline float exp_flush(float x) {
  x = std::min(std::max(x, -104.0f), 88.0f);
  const float n = (x * 1.44269504f + 12582912.0f) - 12582912.0f;  // round to nearest (1.5 2^23)
  float r = std::fma(n, -0.693145752f, x);  // ln 2 in two parts: the product is exact
  r = std::fma(n, -1.42860677e-06f, r);
  return exp_reduced(n, r);
}

// exp(hi + lo) for a pair (hi, lo) with |lo| far below |hi|'s ulp times 2^10 (``Gates``' pairs,
// exact differences of them), as ``exp_flush`` but with lo added to the reduced argument: the
// rounding of hi + lo to one float (an error of up to |hi| 2^-24 in the result, more than the
// polynomial's for |hi| > 1) does not reach it.
__attribute__((always_inline)) inline float exp_pair(float hi, float lo) {
  const float x = std::min(std::max(hi, -104.0f), 88.0f);
  const float n = (x * 1.44269504f + 12582912.0f) - 12582912.0f;
  float r = std::fma(n, -0.693145752f, x);
  r = std::fma(n, -1.42860677e-06f, r) + lo;
  return exp_reduced(n, r);
}

// A log-gate spread that the factored product exp(G_i - G_r) exp(G_r - G_j) can carry in float32:
// each factor stays below FLT_MAX^(1/4), so products of inputs of modest size cannot overflow
// (``_blockmath.factor_budget``).
inline const float kFactorBudget = std::log(FLT_MAX) / 4.0f;

// The floor of a log-gate, log(FLT_MIN * FLT_EPSILON) - 1 (``_blockmath.gate_floor``): exp of
// anything below it is exactly 0 in float32, so flooring changes no decay, and it maps a reset
// (g = -inf) to a finite number. A literal, so that the loops that compare with it vectorise.
constexpr float kGateFloor = -104.278931f;

// The cumulative log-gates of a chunk as pairs of floats, G = hi + lo: hi the float32 running sum,
// lo its rounding errors, summed (each [c, kg], row-major; ``cumulative_gates``). A float32 G
// would keep 5 digits of a gate of -0.05 after a reset of -104, and a difference G_i - G_j of two
// large sums would lose the rest; from the pairs, (hi_i - hi_j) + (lo_i - lo_j) is the exact
// difference to float32 rounding however large G is (hi_i - hi_j is exact where the two are
// within a factor 2, else rounded once), at the cost of two float operations more per exponent
// (a double difference adds more per exponential than the pair's two float operations do).
struct Gates {
  float* hi;
  float* lo;
};

// exp(G_i - G_j) from the pairs of G_i and G_j (``Gates``).
__attribute__((always_inline)) inline float decay(float hi_i, float lo_i, float hi_j, float lo_j) {
  return exp_flush((hi_i - hi_j) + (lo_i - lo_j));
}

// exp(G_c - G_i) from the pairs of G_c and G_i for c >= i (so |hi_c| >= |hi_i|: G is
// non-increasing), to about the polynomial's error: hi_c - hi_i and its rounding error exactly
// (Fast2Sum), the error and the lo parts to ``exp_pair``.
__attribute__((always_inline)) inline float end_decay(float hi_c, float lo_c, float hi_i,
                                                      float lo_i) {
  const float s = hi_c - hi_i, rounding = (-hi_i) - (s - hi_c);
  return exp_pair(s, rounding + (lo_c - lo_i));
}

// Flush subnormal numbers to zero on this thread while alive (x86): decays deep below the normal
// range would otherwise run the arithmetic on them tens of times slower.
struct FlushSubnormals {
#if defined(__SSE__)
  unsigned int saved = _mm_getcsr();
  FlushSubnormals() { _mm_setcsr(saved | 0x8040); }  // FTZ | DAZ
  ~FlushSubnormals() { _mm_setcsr(saved); }
#endif
};

// G_i = sum_{l <= i} max(g_l, kGateFloor) for c rows of kg gates (row stride sg) as ``G``'s pairs;
// ``zeros``: kg zeros (the sum before the first row).
void cumulative_gates(const float* gc, int64_t sg, int c, int64_t kg, const float* zeros,
                      const Gates& G);

// out = sum where g > floor, else 0 (a floored gate's gradient), for one row of kg gates.
void floored_gradient_row(const float* __restrict sum, const float* __restrict g, int64_t kg,
                          float* __restrict out, float floor);

}  // namespace linattn_native
