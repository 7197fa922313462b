// The SIMD vectors of the kernels' hand-written loops (the generation step's passes, step.h; the
// triangular solves, triangular.cpp): the compiler's vector extension (GCC and Clang, which build
// the extension), one vector of kLanes floats. Written out where the plain loops' accumulators
// were kept in memory, not in registers.
#pragma once

#include <cmath>
#include <cstring>

#if defined(__AVX512F__) || defined(__FMA__)
#include <immintrin.h>
#endif

namespace linattn_native {

#if defined(__AVX512F__)
constexpr int kLanes = 16;  // floats in a SIMD vector
#elif defined(__AVX__)
constexpr int kLanes = 8;
#else
constexpr int kLanes = 4;
#endif

typedef float Vec __attribute__((vector_size(kLanes * sizeof(float))));

inline Vec load(const float* p) {
  Vec x;
  std::memcpy(&x, p, sizeof x);  // an unaligned vector load
  return x;
}

inline void store(float* p, Vec x) { std::memcpy(p, &x, sizeof x); }

inline Vec splat(float x) { return Vec{} + x; }

// x, held in a register: a vector that several fused multiply-adds read is loaded once (GCC
// folds a load into each of them otherwise, as a memory operand: a load per multiply-add).
inline Vec in_register(Vec x) {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  asm("" : "+v"(x));
#endif
  return x;
}

// a b + c, each lane rounded once (a fused multiply-add: the bits of std::fma on every lane,
// whether or not the compiler would contract a b + c).
inline Vec fmadd(Vec a, Vec b, Vec c) {
#if defined(__AVX512F__)
  return (Vec)_mm512_fmadd_ps((__m512)a, (__m512)b, (__m512)c);
#elif defined(__AVX__) && defined(__FMA__)
  return (Vec)_mm256_fmadd_ps((__m256)a, (__m256)b, (__m256)c);
#else
  Vec r;
  for (int lane = 0; lane < kLanes; ++lane) r[lane] = std::fma(a[lane], b[lane], c[lane]);
  return r;
#endif
}

}  // namespace linattn_native
