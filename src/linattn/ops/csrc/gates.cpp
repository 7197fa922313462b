// The cumulative log-gates of gates.h, summed exactly as pairs of floats.

#include "gates.h"

namespace linattn_native {
namespace {

// One row of ``cumulative_gates``: (hi, lo) = (hi_prev, lo_prev) + max(g, floor), the rounding of
// hi_prev + g kept in lo (Knuth's TwoSum, exact in float32 arithmetic: cheaper here than a double
// sum, which would be a large share of GLA's forward pass). Not inlined, and the floor a
// parameter: GCC
// vectorises the loop only so (with kGateFloor folded in, it does not).
__attribute__((noinline)) void cumulative_row(const float* __restrict g, int64_t kg,
                                              const float* __restrict hi_prev,
                                              const float* __restrict lo_prev,
                                              float* __restrict hi, float* __restrict lo,
                                              float floor) {
#pragma omp simd
  for (int64_t ch = 0; ch < kg; ++ch) {
    const float x = g[ch] < floor ? floor : g[ch], a = hi_prev[ch];
    const float s = a + x, x_part = s - a;
    const float rounding = (a - (s - x_part)) + (x - x_part);
    hi[ch] = s;
    lo[ch] = lo_prev[ch] + rounding;
  }
}

}  // namespace

// G_i = sum_{l <= i} max(g_l, kGateFloor) for c rows of kg gates (row stride sg) as ``G``'s pairs;
// ``zeros``: kg zeros (the sum before the first row).
void cumulative_gates(const float* gc, int64_t sg, int c, int64_t kg, const float* zeros,
                      const Gates& G) {
  for (int i = 0; i < c; ++i) {
    const int64_t at = static_cast<int64_t>(i) * kg;
    const float* hi_prev = i == 0 ? zeros : G.hi + at - kg;
    const float* lo_prev = i == 0 ? zeros : G.lo + at - kg;
    cumulative_row(gc + i * sg, kg, hi_prev, lo_prev, G.hi + at, G.lo + at, kGateFloor);
  }
}

// out = sum where g > floor, else 0 (a floored gate's gradient), for one row of kg gates; not
// inlined, for the reason given at ``cumulative_row``.
__attribute__((noinline)) void floored_gradient_row(const float* __restrict sum,
                                                    const float* __restrict g, int64_t kg,
                                                    float* __restrict out, float floor) {
#pragma omp simd
  for (int64_t ch = 0; ch < kg; ++ch) out[ch] = g[ch] > floor ? sum[ch] : 0.0f;
}

}  // namespace linattn_native
