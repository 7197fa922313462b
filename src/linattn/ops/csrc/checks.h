// The entry points' checks, before any work, each naming the argument (dtype, device, shape and
// the sizes the BLAS's 32-bit integers and the per-thread blocks allow), so that no call, from
// Python or through torch.ops, reads or writes out of bounds. Strides are not refused: an input
// whose rows the BLAS cannot read in place is copied (``blas_rows``, layout.h).
#pragma once

#include <ATen/core/Tensor.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>

#include "convert.h"
#include "mechanism.h"
#include "tuning.h"

namespace linattn_native {

// An entry point's checks, before any work, each naming the argument: dtype, device and shape, so
// that no call, from Python or through torch.ops, reads or writes out of bounds.
// ``device``: the CPU for the kernels, meta for their fake (shape-only) kernels in ops.cpp.
struct Checks {
  const char* op;
  c10::DeviceType device = c10::kCPU;

  void float32_cpu(const char* name, const at::Tensor& x) const {
    TORCH_CHECK(x.defined(), op, ": ", name, " is undefined");
    TORCH_CHECK(x.scalar_type() == at::kFloat, op, ": ", name, " must be float32, got ",
                x.scalar_type());
    TORCH_CHECK(x.device().type() == device, op, ": ", name, " must be a ",
                c10::DeviceTypeName(device), " tensor, got ", x.device());
  }

  // An input the chunk kernels read chunk by chunk: float32 in place, bfloat16 or float16
  // converted into float32 blocks (convert.h).
  void input_cpu(const char* name, const at::Tensor& x) const {
    TORCH_CHECK(x.defined(), op, ": ", name, " is undefined");
    TORCH_CHECK(convertible(x.scalar_type()), op, ": ", name,
                " must be float32, bfloat16 or float16, got ", x.scalar_type());
    TORCH_CHECK(x.device().type() == device, op, ": ", name, " must be a ",
                c10::DeviceTypeName(device), " tensor, got ", x.device());
  }

  void shape(const char* name, const at::Tensor& x, at::IntArrayRef sizes, const char* dims,
             bool input = false) const {
    input ? input_cpu(name, x) : float32_cpu(name, x);
    TORCH_CHECK(x.sizes() == sizes, op, ": ", name, " must be of shape ", dims, " = ", sizes,
                ", got ", x.sizes());
  }

  // ``shape`` for an input of the chunk kernels (float32, bfloat16 or float16).
  void input_shape(const char* name, const at::Tensor& x, at::IntArrayRef sizes,
                   const char* dims) const {
    shape(name, x, sizes, dims, true);
  }

  // beta and g as the mechanism has them: beta [B, HV, T] for a rule that reads it (the delta
  // rule; [B, HV, T, 2 K] = [a | b] for the dplr rule; None for the additive rule), g
  // [B, HV, T, kg] with kg the gate's width (None without a gate); kg.
  int64_t mechanism_inputs(const Mechanism& m, const std::optional<at::Tensor>& beta,
                           const std::optional<at::Tensor>& g, int64_t B, int64_t HV, int64_t T,
                           int64_t K) const {
    TORCH_CHECK(beta.has_value() == m.rule->reads_beta, op, ": beta must be ",
                m.rule->reads_beta ? "given" : "None", " for the ", m.rule->name, " rule");
    const int64_t keys = m.rule->input_keys;  // the dplr rule's [a | b]: 2
    if (beta.has_value() && keys == 0) input_shape("beta", *beta, {B, HV, T}, "[B, HV, T]");
    if (beta.has_value() && keys > 0) {
      input_shape("beta", *beta, {B, HV, T, keys * K},
                  "[B, HV, T, 2 K] (the rule's inputs [a | b])");
    }
    TORCH_CHECK(g.has_value() == m.gated(), op, ": g must be ",
                m.gated() ? "given for a gate" : "None without a gate");
    const int64_t kg = m.gate_width(K);
    if (g.has_value()) {
      const char* dims = m.gate == Gate::kHead ? "[B, HV, T, 1]" : "[B, HV, T, K]";
      input_shape("g", *g, {B, HV, T, kg}, dims);
    }
    return kg;
  }
};

// The sizes of a chunk-form call: q, k [B, H, T, K], v [B, HV, T, V] (grouped value heads:
// HV = group H, value head j reads q/k head j / group; group = 1 the plain case), N chunks of C
// tokens, with
// C = min(C, T) (the same chunks: one chunk holds the whole sequence either way). P = B HV: the
// value heads, one state each. 64-bit throughout; the BLAS's 32-bit sizes and leading dimensions
// are checked here, before any work.
//
// R (``reads``) write rows per query row: q [B, H, T / R, K] and o [B, HV, T / R, V], query i
// read after write row i R + R - 1 (DeltaProduct's n_h writes per token, one read); T and C are
// multiples of R, so that every chunk holds whole groups. R = 1: a query per write row.
struct Sizes {
  int64_t B, H, HV, group, T, K, V, P, N, C;  // group: value heads per q/k head
  int64_t R = 1;                              // write rows per query row
  Sizes(const Checks& check, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
        int64_t C64, int64_t reads = 1) {
    check.input_cpu("q", q);
    TORCH_CHECK(q.dim() == 4, check.op, ": q must be of shape [B, H, T, K], got ", q.sizes());
    TORCH_CHECK(reads >= 1, check.op, ": reads (write rows per query row) must be >= 1, got ",
                reads);
    R = reads;
    B = q.size(0), H = q.size(1), T = q.size(2) * R, K = q.size(3);
    check.input_shape("k", k, {B, H, T, K}, R == 1 ? "[B, H, T, K]" : "[B, H, T reads, K]");
    check.input_cpu("v", v);
    TORCH_CHECK(v.dim() == 4, check.op, ": v must be of shape [B, HV, T, V], got ", v.sizes());
    HV = v.size(1), V = v.size(3);
    TORCH_CHECK((H == 0 && HV == 0) || (H > 0 && HV % H == 0), check.op,
                ": v's heads HV = ", HV, " must be a multiple of q's and k's H = ", H,
                " (grouped value heads)");
    group = H > 0 ? HV / H : 1;
    check.input_shape("v", v, {B, HV, T, V}, "[B, HV, T, V]");
    TORCH_CHECK(C64 >= 1, check.op, ": C (the chunk size) must be >= 1, got ", C64);
    C = std::min(C64, std::max<int64_t>(T, 1));
    TORCH_CHECK(C <= kMaxChunk, check.op, ": C = min(chunk size, T) = ", C, " exceeds ",
                kMaxChunk, " (a thread keeps C x C blocks: use a smaller chunk size)");
    TORCH_CHECK(C % R == 0, check.op, ": C = min(chunk size, T) = ", C,
                " must be a multiple of reads = ", R, " (whole groups of write rows per chunk)");
    TORCH_CHECK(K + V <= INT32_MAX && HV * std::max(K, V) <= INT32_MAX, check.op, ": K = ", K,
                ", V = ", V, ", HV = ", HV, " exceed the BLAS's 32-bit sizes");
    P = B * HV;
    N = (T + C - 1) / C;
  }

  int64_t queries() const { return T / R; }  // q's and o's rows

  // The q/k head that value head hv reads.
  int64_t qk_head(int64_t hv) const { return hv / group; }
};

// A scale that multiplies q: finite (a NaN or Inf would make every output NaN without a word).
inline float checked_scale(const Checks& check, double scale) {
  TORCH_CHECK(std::isfinite(scale), check.op, ": scale must be finite, got ", scale);
  return static_cast<float>(scale);
}

}  // namespace linattn_native
