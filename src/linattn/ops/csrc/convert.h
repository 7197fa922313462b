// The inputs and outputs in bfloat16 or float16, read and written chunk by chunk (no
// whole-tensor float32 copy; docs/design.md, "Layout and dtypes"): a chunk's rows of a float32
// tensor are read and written in place (or, its rows apart,
// copied through a block: ``read_rows``); those of a bfloat16 or float16 tensor are converted
// into a float32 block of the thread (``Staging``) as the chunk is reached, and its outputs
// written back from one, so that no whole-tensor float32 copy is made.
// Every product, state and cumulative gate is float32 either way: the results are those of
// converting the inputs to float32 first and the outputs back at the end (the same roundings,
// round to nearest even, as PyTorch's ``Tensor.to``).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <utility>
#include <vector>

#if defined(__F16C__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace linattn_native {

// Whether the kernels read (or write) x in its dtype: float32 in place, bfloat16 and float16
// converted chunk by chunk.
inline bool convertible(at::ScalarType type) {
  return type == at::kFloat || type == at::kBFloat16 || type == at::kHalf;
}

// Whether x's rows [B, H, T(, D)] lie apart (a row stride other than the row width D, as in a
// [B, T, H, D] tensor read per head): a float32 chunk of them is copied into a thread's block
// (``read_rows``).
inline bool spread_rows(const at::Tensor& x) {
  return x.size(2) > 1 && x.stride(2) != (x.dim() > 3 ? x.size(3) : 1);
}

// Whether any of the (defined) tensors xs is read through ``Staging``: not float32, or float32
// with its rows apart (``spread_rows``).
inline bool any_staged(std::initializer_list<at::Tensor> xs) {
  for (const at::Tensor& x : xs) {
    if (x.defined() && (x.scalar_type() != at::kFloat || spread_rows(x))) return true;
  }
  return false;
}

// n bfloat16 values (their bits) to float32: the 16 bits on top of a zero mantissa tail.
inline void to_float(const uint16_t* src, int64_t n, float* dst) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t bits = static_cast<uint32_t>(src[i]) << 16;
    float x;
    std::memcpy(&x, &bits, sizeof x);
    dst[i] = x;
  }
}

// n float32 values to bfloat16 bits, rounded to nearest even (c10's rounding, NaN a quiet NaN).
inline void from_float(const float* src, int64_t n, uint16_t* dst) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    uint32_t bits;
    std::memcpy(&bits, &src[i], sizeof bits);
    const uint32_t rounded = (bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16;
    dst[i] = src[i] != src[i] ? uint16_t{0x7FC0} : static_cast<uint16_t>(rounded);
  }
}

// n float16 values to float32 (exact), eight at a time where the processor converts them.
inline void to_float(const c10::Half* src, int64_t n, float* dst) {
  int64_t i = 0;
#if defined(__F16C__)
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(h));
  }
#endif
  for (; i < n; ++i) dst[i] = static_cast<float>(src[i]);
}

// n float32 values to float16, rounded to nearest even.
inline void from_float(const float* src, int64_t n, c10::Half* dst) {
  int64_t i = 0;
#if defined(__F16C__)
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), h);
  }
#endif
  for (; i < n; ++i) dst[i] = static_cast<c10::Half>(src[i]);
}

// Float32 rows of a tensor: where they are and their row stride.
struct FloatRows {
  const float* p;
  int64_t ld;
};

// The element offset of row t0 of head (b, h) in x [B, H, T(, D)] with any strides.
inline int64_t row_offset(const at::Tensor& x, int64_t b, int64_t h, int64_t t0) {
  return b * x.stride(0) + h * x.stride(1) + t0 * x.stride(2);
}

// D: the row width of x [B, H, T, D], 1 for x [B, H, T].
inline int64_t row_width(const at::Tensor& x) { return x.dim() > 3 ? x.size(3) : 1; }

// Rows [t0, t0 + c) of head (b, h) of x [B, H, T(, D)] (unit stride along D) as float32: x's own
// rows for float32 rows side by side (or without a ``block``); else copied (float32 rows apart,
// ``spread_rows``) or converted into ``block`` [c, D] (row stride D). A copy is read again by
// every product of the chunk from one block in the L1 cache: rows H D floats apart fall into a
// few of its sets and evict each other (in a [B, T, H, 64] tensor with H = 8, 64 rows of 256
// bytes map onto 8 of the 64 sets of a 32 KiB cache).
inline FloatRows read_rows(const at::Tensor& x, int64_t b, int64_t h, int64_t t0, int c,
                           float* block) {
  const int64_t at = row_offset(x, b, h, t0), ld = x.stride(2), D = row_width(x);
  if (x.scalar_type() == at::kFloat) {
    const float* src = x.const_data_ptr<float>() + at;
    if (!block || !spread_rows(x)) return {src, ld};
    for (int i = 0; i < c; ++i) std::memcpy(block + i * D, src + i * ld, sizeof(float) * D);
    return {block, D};
  }
  if (x.scalar_type() == at::kBFloat16) {
    const auto* src = reinterpret_cast<const uint16_t*>(x.const_data_ptr<c10::BFloat16>()) + at;
    for (int i = 0; i < c; ++i) to_float(src + i * ld, D, block + i * D);
  } else {
    const c10::Half* src = x.const_data_ptr<c10::Half>() + at;
    for (int i = 0; i < c; ++i) to_float(src + i * ld, D, block + i * D);
  }
  return {block, D};
}

// Where rows [t0, t0 + c) of head (b, h) of the output x are written as float32: x's own rows
// for float32 rows side by side (or without a ``block``), else ``block`` (row stride D), which
// ``write_rows`` then copies or converts into x (float32 rows apart: as ``read_rows``).
inline std::pair<float*, int64_t> output_rows(const at::Tensor& x, int64_t b, int64_t h,
                                              int64_t t0, float* block) {
  if (x.scalar_type() == at::kFloat && (!block || !spread_rows(x))) {
    return {x.data_ptr<float>() + row_offset(x, b, h, t0), x.stride(2)};
  }
  return {block, row_width(x)};
}

// Whether ``write_rows`` writes x's float32 rows past the cache (``stream_rows``): float32 rows
// apart (``spread_rows``) of whole 64-byte lines, each row at a line's start (AVX-512).
inline bool streamed_rows(const at::Tensor& x) {
#if defined(__AVX512F__)
  const int64_t D = row_width(x);
  const auto base = reinterpret_cast<uintptr_t>(x.data_ptr());
  return x.scalar_type() == at::kFloat && spread_rows(x) && D % 16 == 0 &&
         x.stride(2) % 16 == 0 && x.stride(1) % 16 == 0 && x.stride(0) % 16 == 0 &&
         base % 64 == 0;
#else
  (void)x;
  return false;
#endif
}

// Whether rows of x written through a thread's blocks (``staged``: ``output_rows`` gives a block,
// ``write_rows`` copies it) go past the cache: then they are not prefetched for writing.
inline bool streamed_output(const at::Tensor& x, bool staged) {
  return staged && x.defined() && streamed_rows(x);
}

// c rows of D floats (row stride ld) from block (row stride D) into dst with non-temporal
// stores (``streamed_rows``): lines written whole and not read again by the kernel go to memory
// without first being read into the cache (the read-for-ownership of an ordinary store: a fifth
// of the forward's memory traffic at K = V = 64, outputs being a quarter of the bytes it moves).
// The fence orders them before anything the thread writes after (another thread's reads).
inline void stream_rows(float* dst, int64_t ld, const float* block, int64_t D, int c) {
#if defined(__AVX512F__)
  for (int i = 0; i < c; ++i) {
    for (int64_t j = 0; j < D; j += 16) {
      _mm512_stream_ps(dst + i * ld + j, _mm512_loadu_ps(block + i * D + j));
    }
  }
  _mm_sfence();
#else
  for (int i = 0; i < c; ++i) std::memcpy(dst + i * ld, block + i * D, sizeof(float) * D);
#endif
}

// The c rows of ``block`` (``output_rows``'s) into x's rows [t0, t0 + c) of head (b, h), in x's
// dtype; nothing where ``block`` is x's own rows (written in place).
inline void write_rows(const at::Tensor& x, int64_t b, int64_t h, int64_t t0, int c,
                       const float* block) {
  const int64_t at = row_offset(x, b, h, t0), ld = x.stride(2), D = row_width(x);
  if (x.scalar_type() == at::kFloat) {
    float* dst = x.data_ptr<float>() + at;
    if (block == dst) return;
    if (streamed_rows(x)) return stream_rows(dst, ld, block, D, c);
    for (int i = 0; i < c; ++i) std::memcpy(dst + i * ld, block + i * D, sizeof(float) * D);
    return;
  }
  if (x.scalar_type() == at::kBFloat16) {
    auto* dst = reinterpret_cast<uint16_t*>(x.data_ptr<c10::BFloat16>()) + at;
    for (int i = 0; i < c; ++i) from_float(block + i * D, D, dst + i * ld);
  } else {
    c10::Half* dst = x.data_ptr<c10::Half>() + at;
    for (int i = 0; i < c; ++i) from_float(block + i * D, D, dst + i * ld);
  }
}

// One thread's float32 blocks for the chunk rows of the tensors that are not float32 or whose
// rows lie apart (``spread_rows``): ``slots`` blocks of C rows of at most ``width`` values, each
// 64-byte aligned (as the rows of a float32 [B, T, H, 64] tensor are, so that the BLAS reads both
// alike); none where every tensor is float32 with its rows side by side.
class Staging {
 public:
  Staging(int64_t slots, int64_t C, int64_t width, bool needed)
      : size_((C * width + 15) / 16 * 16), data_(needed ? slots * size_ + 16 : 0) {}
  float* block(int64_t slot) {
    if (data_.empty()) return nullptr;
    const auto base = reinterpret_cast<uintptr_t>(data_.data());
    float* aligned = data_.data() + ((64 - base % 64) % 64) / sizeof(float);
    return aligned + slot * size_;
  }

 private:
  int64_t size_;
  std::vector<float> data_;
};

}  // namespace linattn_native
