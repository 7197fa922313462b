// The generation step's passes over one head's state (spec section 9: a step reads and writes
// the state once, d_k d_v numbers, whatever the context), shared by the rules' steps (rules/*.cpp,
// ``Rule::step``) and called by step.cpp's loop over the heads.
//
// One head's state S [K, V] (row stride V) is taken in blocks of columns, kBlockVecs SIMD vectors
// wide (128 columns with AVX-512: whole rows at V = 128, the head read in order), then blocks of
// one vector, then the last few columns one by one. A block (64 KiB at K = V = 128) is read from
// memory once and stays in the L1 or L2 cache while the rule makes at most two passes over it,
// its accumulators in registers:
//
//   read_block   r = S^T c              the read of the state entering the pass (the delta rule's
//                                       S^T (alpha * k), the dplr rule's S^T b); S is not written
//   write_block  S <- Diag(alpha) S + x u^T (+ y r^T);  o = S^T q    (the new state's read)
//
// The columns are independent: column j of the new state and o_j read column j of the old state
// only, so a block is the whole step for its columns. No state-sized temporary, and no pass that
// checks the state: the inputs are checked before the step (step.cpp), and a non-finite new
// state shows in o (``o_j = sum_i q_i S_ij``: a NaN or an Inf in column j makes o_j NaN or Inf,
// q_i = 0 included, 0 * Inf being NaN), which the loop checks, V numbers a head.
//
// The vectors (simd.h) are written out, because the compiler kept the plain loops' accumulators
// over a block's columns in memory, not in registers, and the step then cost several passes over
// the state instead of about one.
#pragma once

#include <cstdint>
#include <type_traits>

#include "simd.h"

namespace linattn_native {

#if defined(__AVX512F__)
constexpr int kBlockVecs = 8;  // vectors in a block of columns: 32 registers hold 3 blocks
#else
constexpr int kBlockVecs = 4;  // 16 registers (AVX), or the generic vectors
#endif

// One value head's step inputs, q and the decay prepared by step.cpp once per head.
struct StepHead {
  const float* q;      // [K], scaled: scale * q (the head's q/k head, grouped value heads)
  const float* k;      // [K]
  const float* v;      // [V]
  const float* beta;   // the rule's own inputs: the delta rule's beta [1], dplr's a [K]
  const float* b;      // dplr's b [K] (nullptr for the other rules)
  const float* alpha;  // [K] the decay exp(g) of each row (ones without a gate)
  float* scratch;      // [K] for the rule (the delta rule's alpha * k)
  const float* S_in;   // [K, V] the state entering the step: S itself (in place), or a source
  const float* next;   // [K, V] the next head's state entering its step, or nullptr: fetched
                       // into the L2 cache during this head's write pass (write_block)
};

// Calls f(vecs, j0, w) for each block of columns [j0, j0 + w) of V: vecs an
// std::integral_constant, kBlockVecs, kBlockVecs / 2 or 1 for blocks of that many vectors (the
// widest that fit: V = 64 is one block of whole rows with AVX-512 too), 0 for the last
// w < kLanes columns (one by one).
template <class F>
inline void column_blocks(int64_t V, F&& f) {
  constexpr int64_t wide = kBlockVecs * kLanes, half = wide / 2;
  int64_t j0 = 0;
  for (; j0 + wide <= V; j0 += wide) f(std::integral_constant<int, kBlockVecs>{}, j0, wide);
  for (; j0 + half <= V; j0 += half) f(std::integral_constant<int, kBlockVecs / 2>{}, j0, half);
  for (; j0 + kLanes <= V; j0 += kLanes) f(std::integral_constant<int, 1>{}, j0, kLanes);
  if (j0 < V) f(std::integral_constant<int, 0>{}, j0, V - j0);
}

// r [w] = S^T c over the block's columns (S points at the block's first column); N vectors
// wide, or w < kLanes columns one by one (N = 0).
template <int N>
inline void read_block(const float* c, int64_t K, int64_t V, const float* S, int64_t w,
                       float* r) {
  if constexpr (N == 0) {
    for (int64_t j = 0; j < w; ++j) r[j] = 0.0f;
    for (int64_t i = 0; i < K; ++i) {
      for (int64_t j = 0; j < w; ++j) r[j] += c[i] * S[i * V + j];
    }
  } else {
    Vec acc[N] = {};
    for (int64_t i = 0; i < K; ++i) {
      const Vec ci = splat(c[i]);
      const float* row = S + i * V;
      for (int n = 0; n < N; ++n) acc[n] += ci * load(row + n * kLanes);
    }
    for (int n = 0; n < N; ++n) store(r + n * kLanes, acc[n]);
  }
}

// S <- Diag(alpha) S_in + x u^T (+ y r^T with kLowRank) over the block's columns, and o [w] =
// S^T q of the new block, in one pass; N vectors wide, or w < kLanes columns one by one (N = 0).
// S_in: the state entering the step, S itself (in place) or another tensor's block (h.S_in + j0).
// The same block of the next head's state (h.next) is fetched into L2 meanwhile, a row per row
// written: the next read pass then finds it there, its fetch overlapped with this pass's
// arithmetic rather than after it (the two-pass rules' steps at Qwen3-Next's B 8, the state in
// L3: 0.79-0.85 of the time without; benchmarks/README.md, "Prefetching the next head").
template <int N, bool kLowRank, bool kPrefetch = true>
inline void write_block(const StepHead& h, const float* x, const float* u, const float* y,
                        const float* r, int64_t K, int64_t V, const float* S_in, float* S,
                        int64_t w, float* o) {
  if constexpr (N == 0) {
    for (int64_t j = 0; j < w; ++j) o[j] = 0.0f;
    for (int64_t i = 0; i < K; ++i) {
      for (int64_t j = 0; j < w; ++j) {
        float s = h.alpha[i] * S_in[i * V + j] + x[i] * u[j];
        if (kLowRank) s += y[i] * r[j];
        S[i * V + j] = s;
        o[j] += h.q[i] * s;
      }
    }
  } else {
    Vec acc[N] = {}, uu[N], rr[N];
    for (int n = 0; n < N; ++n) {
      uu[n] = load(u + n * kLanes);
      rr[n] = kLowRank ? load(r + n * kLanes) : Vec{};
    }
    // the block's columns of the next head (kPrefetch false: a rule whose one pass streams)
    const float* next = kPrefetch && h.next ? h.next + (S_in - h.S_in) : nullptr;
    constexpr int kLine = 64 / sizeof(float);  // floats in a cache line
    for (int64_t i = 0; i < K; ++i) {
      if (next) {  // a read (0), into L2 (locality 2: prefetcht1; 1 is as good, 3, into L1,
                   // is slower)
        for (int f = 0; f < N * kLanes; f += kLine) __builtin_prefetch(next + i * V + f, 0, 2);
      }
      const Vec ai = splat(h.alpha[i]), xi = splat(x[i]), qi = splat(h.q[i]);
      const Vec yi = splat(kLowRank ? y[i] : 0.0f);
      const float* in = S_in + i * V;
      float* row = S + i * V;
      for (int n = 0; n < N; ++n) {
        Vec s = ai * load(in + n * kLanes) + xi * uu[n];
        if (kLowRank) s += yi * rr[n];
        store(row + n * kLanes, s);
        acc[n] += qi * s;
      }
    }
    for (int n = 0; n < N; ++n) store(o + n * kLanes, acc[n]);
  }
}

}  // namespace linattn_native
