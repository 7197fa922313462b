// The gated Oja rule's chunk form (``linattn.ops.gated_oja_rule``), forward and backward fused
// per (sequence, value head): a loop over the chunks, its products on the BLAS, the gate's
// row-wise work in plain loops. Self-contained: its ops are registered at the end of this file.
//
// The rule, in the transposed memory X = S^T [V, K] (the module docstring of gated_oja_rule.py):
//
//   X_t = (I - beta_t v_t v_t^T) Diag(exp gv_t) X_{t-1} + beta_t v_t k_t^T,   o_t = X_t q_t.
//
// Forward, one chunk of c tokens entering with X, G the cumulative log-gates of the chunk (summed
// in double, each exponential rounded once to float), Q = scale q:
//
//   1. Vd = exp(G) v,  Vi = exp(-G) v,  R = D Vi  with D = exp(G_c) (the chunk's decay)
//   2. L = diag(beta) tril(Vd Vi^T, -1);  (I + L) [W | U0] = diag(beta) [Vd | K]   (the UT form)
//   3. U = U0 - W X                                    (the errors)
//   4. o = exp(G) (Q X^T + tril(Q U^T) Vi)
//   5. X <- D X + R^T U                                (D scales X's rows)
//
// Every exponent of a factored chunk stays within ``limit`` (exp(-G) <= exp(limit)); a chunk whose
// decay spans more is not run here: the forward counts such (sequence, head)s in ``steep`` and
// stops them, and the caller runs its PyTorch form instead.
//
// Backward, the chunks last to first, dX the gradient of the state leaving the chunk, steps 1-3
// recomputed from the state entering it (saved by the forward), P = tril(Q U^T), dY = exp(G) do:
//
//   6. dP = tril(dY Vi^T),  dQ = dY X + dP U,  dU = R dX + dP^T Q,  dVi = P^T dY,  dR = U dX^T,
//      dD = rowsum(dX * X)
//   7. dX_prev = D dX + dY^T Q - W^T dU
//   8. [dMv | dMk] = (I + L)^{-T} [-dU X^T | dU],  dL = -tril([dMv | dMk] [W | U0]^T, -1)
//   9. dbeta = rowsum(dMv * Vd + dMk * K) + rowsum(dL * tril(Vd Vi^T, -1)),  dk = beta dMk,
//      dB = diag(beta) dL,  dVd = beta dMv + dB Vi,  dVi += dB^T Vd
//  10. dv = exp(G) dVd + exp(-G) dVi + D exp(-G) dR
//  11. dG = do * o + Vd * dVd - Vi * dVi - R * dR, its last row plus colsum(R * dR) + D * dD;
//      dgv = the reverse cumulative sum of dG over the chunk
//
// Layouts: the tokens of every sequence one after another (packed; ``bounds`` the N + 1
// cumulative lengths), q, k [TT, H, K], v, gv, o [TT, HV, V], beta [TT, HV], all contiguous
// (value head h reads q / k head h / (HV / H)); states S [N, HV, K, V] (fla's layout); the saved
// states X [chunks, HV, V, K] entering every chunk of every sequence. Float32 only.
#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <optional>
#include <tuple>
#include <vector>

#include "blas.h"
#include "block_cache.h"
#include "gates.h"
#include "triangular.h"

namespace linattn_native {
namespace {

constexpr const char* kForward = "oja_forward";
constexpr const char* kBackward = "oja_backward";

// The sizes of one call, checked at the entry points before any work.
struct OjaShape {
  int64_t TT, H, HV, K, V, N, C, chunks;
  std::vector<int64_t> bounds;
  std::vector<int64_t> first_chunk;  // the index of each sequence's first chunk in ``states``
};

OjaShape oja_shape(const char* op, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                   const at::Tensor& gv, const at::Tensor& beta, at::IntArrayRef bounds,
                   int64_t C, c10::DeviceType device) {
  const auto tensor = [&](const char* name, const at::Tensor& x, int64_t dim) {
    TORCH_CHECK(x.defined(), op, ": ", name, " is undefined");
    TORCH_CHECK(x.scalar_type() == at::kFloat, op, ": ", name, " must be float32, got ",
                x.scalar_type());
    TORCH_CHECK(x.device().type() == device, op, ": ", name, " must be on ",
                c10::DeviceTypeName(device), ", got ", x.device());
    TORCH_CHECK(x.dim() == dim, op, ": ", name, " must have ", dim, " dimensions, got ",
                x.sizes());
    TORCH_CHECK(x.is_contiguous(), op, ": ", name, " must be contiguous");
  };
  tensor("q", q, 3);
  tensor("k", k, 3);
  tensor("v", v, 3);
  tensor("gv", gv, 3);
  tensor("beta", beta, 2);
  OjaShape s;
  s.TT = q.size(0);
  s.H = q.size(1);
  s.K = q.size(2);
  s.HV = v.size(1);
  s.V = v.size(2);
  TORCH_CHECK(k.sizes() == q.sizes(), op, ": k must have q's shape ", q.sizes(), ", got ",
              k.sizes());
  TORCH_CHECK(s.H >= 1 && s.HV >= 1 && s.HV % s.H == 0, op,
              ": v's heads must be a multiple of q's, got ", s.HV, " and ", s.H);
  TORCH_CHECK(v.size(0) == s.TT, op, ": v must have ", s.TT, " tokens, got ", v.size(0));
  TORCH_CHECK(gv.sizes() == v.sizes(), op, ": gv must have v's shape ", v.sizes(), ", got ",
              gv.sizes());
  TORCH_CHECK(beta.size(0) == s.TT && beta.size(1) == s.HV, op, ": beta must have shape [",
              s.TT, ", ", s.HV, "], got ", beta.sizes());
  TORCH_CHECK(C >= 1 && C <= 1024, op, ": C (the chunk size) must be in [1, 1024], got ", C);
  TORCH_CHECK(s.K >= 1 && s.V >= 1 && s.K <= 65536 && s.V <= 65536 &&
                  s.HV * (s.K + s.V) <= INT32_MAX,
              op, ": K = ", s.K, " and V = ", s.V, " must be in [1, 65536]");
  TORCH_CHECK(bounds.size() >= 2 && bounds.front() == 0 && bounds.back() == s.TT, op,
              ": bounds must run from 0 to ", s.TT, " (the tokens), got ", bounds);
  s.N = static_cast<int64_t>(bounds.size()) - 1;
  s.C = C;
  s.chunks = 0;
  for (int64_t n = 0; n < s.N; ++n) {
    TORCH_CHECK(bounds[n] <= bounds[n + 1], op, ": bounds must not decrease, got ", bounds);
    s.first_chunk.push_back(s.chunks);
    s.chunks += (bounds[n + 1] - bounds[n] + C - 1) / C;
  }
  s.bounds.assign(bounds.begin(), bounds.end());
  return s;
}

void check_state(const char* op, const char* name, const at::Tensor& x, const OjaShape& s,
                 c10::DeviceType device) {
  TORCH_CHECK(x.scalar_type() == at::kFloat && x.device().type() == device, op, ": ", name,
              " must be a float32 tensor on ", c10::DeviceTypeName(device));
  TORCH_CHECK(x.dim() == 4 && x.size(0) == s.N && x.size(1) == s.HV && x.size(2) == s.K &&
                  x.size(3) == s.V,
              op, ": ", name, " must have shape [", s.N, ", ", s.HV, ", ", s.K, ", ", s.V,
              "], got ", x.sizes());
  TORCH_CHECK(x.is_contiguous(), op, ": ", name, " must be contiguous");
}

// Ask for m rows of n floats, ld floats apart, ahead of their use (``write``: rows about to be
// written): a task walks one head's rows, H D floats apart, which the hardware's prefetchers
// follow poorly across so many streams.
inline void prefetch_rows(const float* x, int64_t m, int64_t n, int64_t ld, bool write = false) {
  for (int64_t r = 0; r < m; ++r) {
    const char* row = reinterpret_cast<const char*>(x + r * ld);
    for (int64_t off = 0; off < n * 4; off += 64) {
      if (write) {
        __builtin_prefetch(row + off, 1);
      } else {
        __builtin_prefetch(row + off);
      }
    }
  }
}

// One chunk's recomputable terms (steps 1-3), in one thread's blocks.
struct Chunk {
  int64_t C, K, V;
  std::vector<double> acc;  // [V]: the running log-gate
  std::vector<float> eG, eGi, Vd, Vi, R, D, A, L, WU, U, P, O;

  Chunk(int64_t C_, int64_t K_, int64_t V_)
      : C(C_), K(K_), V(V_), acc(V_), eG(C_ * V_), eGi(C_ * V_), Vd(C_ * V_), Vi(C_ * V_),
        R(C_ * V_), D(V_), A(C_ * C_), L(C_ * C_), WU(C_ * (V_ + K_)), U(C_ * K_), P(C_ * C_),
        O(C_ * V_) {}

  // Steps 1 and 2 for the c tokens at gv, v, k, beta (row strides ldv, ldk, ldb): false where
  // the chunk's decay spans ``limit`` or more. G is summed in double and kept as a pair of floats
  // (hi + lo, gates.h), whose exponentials ``exp_pair`` rounds once: the accuracy of a double
  // exponential rounded to float, in vectorised float arithmetic.
  bool terms(int64_t c, const float* gv, const float* v, int64_t ldv, const float* k, int64_t ldk,
             const float* beta, int64_t ldb, double limit) {
    std::fill(acc.begin(), acc.end(), 0.0);
    for (int64_t i = 0; i < c; ++i) {
      const float* g = gv + i * ldv;
      float* hi = eG.data() + i * V;  // the pairs, in eG and eGi until their exponentials
      float* lo = eGi.data() + i * V;
      for (int64_t j = 0; j < V; ++j) {
        acc[j] += static_cast<double>(g[j]);
        hi[j] = static_cast<float>(acc[j]);
        lo[j] = static_cast<float>(acc[j] - static_cast<double>(hi[j]));
      }
    }
    for (int64_t j = 0; j < V; ++j) {
      if (!(acc[j] > -limit)) return false;
    }
    for (int64_t i = 0; i < c; ++i) {
      const float* vi = v + i * ldv;
      float* e = eG.data() + i * V;
      float* ei = eGi.data() + i * V;
      float* vd = Vd.data() + i * V;
      float* vv = Vi.data() + i * V;
#pragma omp simd
      for (int64_t j = 0; j < V; ++j) {
        const float hi = e[j], lo = ei[j];
        const float ef = exp_pair(hi, lo), en = exp_pair(-hi, -lo);
        e[j] = ef;
        ei[j] = en;
        vd[j] = ef * vi[j];
        vv[j] = en * vi[j];
      }
    }
    for (int64_t j = 0; j < V; ++j) D[j] = eG[(c - 1) * V + j];
    for (int64_t i = 0; i < c; ++i) {
      for (int64_t j = 0; j < V; ++j) R[i * V + j] = D[j] * Vi[i * V + j];
    }
    // A = Vd Vi^T (its strictly lower part read), L = diag(beta) A there
    lower_products(c, c, 1, V, 1.0f, Vd.data(), V, Vi.data(), V, A.data(), C);
    const int64_t W = V + K;
    for (int64_t i = 0; i < c; ++i) {
      const float b = beta[i * ldb];
      for (int64_t s = 0; s < i; ++s) L[i * C + s] = b * A[i * C + s];
      float* row = WU.data() + i * W;
      for (int64_t j = 0; j < V; ++j) row[j] = b * Vd[i * V + j];
      const float* ki = k + i * ldk;
      for (int64_t j = 0; j < K; ++j) row[V + j] = b * ki[j];
    }
    unit_lower_solve(c, W, L.data(), C, WU.data(), W);
    return true;
  }

  // Step 3: U = U0 - W X.
  void errors(int64_t c, const float* X) {
    const int64_t W = V + K;
    for (int64_t i = 0; i < c; ++i) {
      std::copy(WU.data() + i * W + V, WU.data() + i * W + W, U.data() + i * K);
    }
    gemm(false, false, c, K, V, -1.0f, WU.data(), W, X, K, 1.0f, U.data(), K);
  }

  // P = tril(Q U^T) (Q = scale q, its rows at stride ldq), zero above the diagonal.
  void scores(int64_t c, const float* q, int64_t ldq, float scale) {
    lower_products(c, c, 1, K, scale, q, ldq, U.data(), K, P.data(), C);
    for (int64_t i = 0; i < c; ++i) {
      std::fill(P.data() + i * C + i + 1, P.data() + i * C + c, 0.0f);
    }
  }
};

}  // namespace

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> oja_forward(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& gv,
    const at::Tensor& beta, const at::Tensor& S0, at::IntArrayRef bounds, double scale, int64_t C,
    double limit, bool keep) {
  const OjaShape s = oja_shape(kForward, q, k, v, gv, beta, bounds, C, c10::kCPU);
  check_state(kForward, "S0", S0, s, c10::kCPU);
  TORCH_CHECK(limit > 0, kForward, ": limit must be > 0, got ", limit);
  const auto opts = q.options();
  at::Tensor o = fresh({s.TT, s.HV, s.V}, opts);
  at::Tensor S = at::empty({s.N, s.HV, s.K, s.V}, opts);
  at::Tensor states = fresh({keep ? s.chunks : 0, s.HV, s.V, s.K}, opts);
  std::atomic<int64_t> steep{0};
  const int64_t HV = s.HV, K = s.K, V = s.V, G = s.HV / s.H;
  const int64_t ldq = s.H * K, ldv = HV * V;
  const float sc = static_cast<float>(scale);
  const float *qp = q.data_ptr<float>(), *kp = k.data_ptr<float>(), *vp = v.data_ptr<float>();
  const float *gp = gv.data_ptr<float>(), *bp = beta.data_ptr<float>();
  const float* S0p = S0.data_ptr<float>();
  float *op = o.data_ptr<float>(), *Sp = S.data_ptr<float>();
  float* Xs = states.data_ptr<float>();
  // A thread's (sequence, head)s: per sequence, the chunks in order and, inner, its heads (the
  // rows of one chunk of all heads lie together in memory), each head's state X apart.
  at::parallel_for(0, s.N * HV, 1, [&](int64_t lo, int64_t hi) {
    SequentialBlas sequential;
    Chunk ch(C, K, V);
    std::vector<float> Xall(HV * V * K);
    for (int64_t n = lo / HV; n * HV < hi; ++n) {
      const int64_t h0 = std::max(lo, n * HV) - n * HV, h1 = std::min(hi, (n + 1) * HV) - n * HV;
      const int64_t T1 = s.bounds[n + 1];
      for (int64_t h = h0; h < h1; ++h) {
        const float* S0u = S0p + (n * HV + h) * K * V;
        float* X = Xall.data() + h * V * K;
        for (int64_t a = 0; a < K; ++a) {
          for (int64_t j = 0; j < V; ++j) X[j * K + a] = S0u[a * V + j];
        }
      }
      const auto prefetch = [&](int64_t t0, int64_t h) {  // the rows of chunk t0 of head h
        if (h == h1) {
          t0 += C;
          h = h0;
        }
        const int64_t m = std::min(C, T1 - t0), hk = h / G;
        if (m <= 0) return;
        prefetch_rows(qp + (t0 * s.H + hk) * K, m, K, ldq);
        prefetch_rows(kp + (t0 * s.H + hk) * K, m, K, ldq);
        prefetch_rows(vp + (t0 * HV + h) * V, m, V, ldv);
        prefetch_rows(gp + (t0 * HV + h) * V, m, V, ldv);
        prefetch_rows(op + (t0 * HV + h) * V, m, V, ldv, true);
      };
      int64_t index = s.first_chunk[n];
      for (int64_t t0 = s.bounds[n]; t0 < T1; t0 += C, ++index) {
        if (steep.load(std::memory_order_relaxed)) return;  // the call's outputs are not used
        const int64_t c = std::min(C, T1 - t0);
        for (int64_t h = h0; h < h1; ++h) {
          const int64_t hk = h / G;
          float* X = Xall.data() + h * V * K;
          const float* qc = qp + (t0 * s.H + hk) * K;
          const float* kc = kp + (t0 * s.H + hk) * K;
          const float* vc = vp + (t0 * HV + h) * V;
          const float* gc = gp + (t0 * HV + h) * V;
          prefetch(t0, h + 1);
          if (!ch.terms(c, gc, vc, ldv, kc, ldq, bp + t0 * HV + h, HV, limit)) {
            steep.fetch_add(1);
            return;
          }
          if (keep) std::copy(X, X + V * K, Xs + (index * HV + h) * V * K);
          ch.errors(c, X);
          ch.scores(c, qc, ldq, sc);
          // o = exp(G) (Q X^T + P Vi)
          gemm(false, true, c, V, K, sc, qc, ldq, X, K, 0.0f, ch.O.data(), V);
          lower_times(c, c, 1, V, 1.0f, ch.P.data(), C, ch.Vi.data(), V, 1.0f, ch.O.data(), V);
          float* oc = op + (t0 * HV + h) * V;
          for (int64_t i = 0; i < c; ++i) {
            for (int64_t j = 0; j < V; ++j) oc[i * ldv + j] = ch.eG[i * V + j] * ch.O[i * V + j];
          }
          // X <- D X + R^T U
          for (int64_t j = 0; j < V; ++j) {
            for (int64_t a = 0; a < K; ++a) X[j * K + a] *= ch.D[j];
          }
          gemm(true, false, V, K, c, 1.0f, ch.R.data(), V, ch.U.data(), K, 1.0f, X, K);
        }
      }
      for (int64_t h = h0; h < h1; ++h) {
        const float* X = Xall.data() + h * V * K;
        float* Su = Sp + (n * HV + h) * K * V;
        for (int64_t a = 0; a < K; ++a) {
          for (int64_t j = 0; j < V; ++j) Su[a * V + j] = X[j * K + a];
        }
      }
    }
  });
  at::Tensor flag = at::empty({}, opts.dtype(at::kLong));
  flag.data_ptr<int64_t>()[0] = steep.load();
  return {o, S, states, flag};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> oja_backward(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& gv,
    const at::Tensor& beta, const at::Tensor& states, const at::Tensor& o, const at::Tensor& d_o,
    const std::optional<at::Tensor>& dS, at::IntArrayRef bounds, double scale, int64_t C,
    double limit) {
  const OjaShape s = oja_shape(kBackward, q, k, v, gv, beta, bounds, C, c10::kCPU);
  TORCH_CHECK(states.scalar_type() == at::kFloat && states.dim() == 4 &&
                  states.size(0) == s.chunks && states.size(1) == s.HV && states.size(2) == s.V &&
                  states.size(3) == s.K && states.is_contiguous(),
              kBackward, ": states must be contiguous float32 [", s.chunks, ", ", s.HV, ", ", s.V,
              ", ", s.K, "], got ", states.sizes());
  using Named = std::pair<const char*, const at::Tensor*>;
  for (const auto& [name, x] : {Named{"o", &o}, Named{"d_o", &d_o}}) {
    TORCH_CHECK(x->scalar_type() == at::kFloat && x->sizes() == v.sizes() && x->is_contiguous(),
                kBackward, ": ", name, " must be contiguous float32 of v's shape ", v.sizes(),
                ", got ", x->sizes());
  }
  if (dS.has_value()) check_state(kBackward, "dS", *dS, s, c10::kCPU);
  const auto opts = q.options();
  const int64_t HV = s.HV, K = s.K, V = s.V, G = s.HV / s.H, W = V + K;
  at::Tensor dq = fresh({s.TT, HV, K}, opts), dk = fresh({s.TT, HV, K}, opts);
  at::Tensor dv = fresh({s.TT, HV, V}, opts), dgv = fresh({s.TT, HV, V}, opts);
  at::Tensor dbeta = at::empty({s.TT, HV}, opts), dS0 = at::empty({s.N, HV, K, V}, opts);
  const int64_t ldq = s.H * K, ldv = HV * V, ldd = HV * K;
  const float sc = static_cast<float>(scale);
  const float *qp = q.data_ptr<float>(), *kp = k.data_ptr<float>(), *vp = v.data_ptr<float>();
  const float *gp = gv.data_ptr<float>(), *bp = beta.data_ptr<float>();
  const float *Xs = states.data_ptr<float>(), *opo = o.data_ptr<float>();
  const float* dop = d_o.data_ptr<float>();
  const float* dSp = dS.has_value() ? dS->data_ptr<float>() : nullptr;
  float *dqp = dq.data_ptr<float>(), *dkp = dk.data_ptr<float>(), *dvp = dv.data_ptr<float>();
  float *dgp = dgv.data_ptr<float>(), *dbp = dbeta.data_ptr<float>();
  float* dS0p = dS0.data_ptr<float>();
  std::atomic<int64_t> steep{0};
  at::parallel_for(0, s.N * HV, 1, [&](int64_t lo, int64_t hi) {
    SequentialBlas sequential;
    Chunk ch(C, K, V);
    std::vector<float> dXp(V * K), dY(C * V), dP(C * C), dU(C * K), dVi(C * V),
        dR(C * V), dD(V), dM(C * W), dL(C * C), dVd(C * V), dG(C * V);
    std::vector<double> run(V);
    std::vector<float> dXall(HV * V * K);
    for (int64_t n = lo / HV; n * HV < hi; ++n) {
      const int64_t h0 = std::max(lo, n * HV) - n * HV, h1 = std::min(hi, (n + 1) * HV) - n * HV;
      for (int64_t h = h0; h < h1; ++h) {
        float* dXh = dXall.data() + h * V * K;
        if (dSp) {
          const float* dSu = dSp + (n * HV + h) * K * V;
          for (int64_t a = 0; a < K; ++a) {
            for (int64_t j = 0; j < V; ++j) dXh[j * K + a] = dSu[a * V + j];
          }
        } else {
          std::fill(dXh, dXh + V * K, 0.0f);
        }
      }
      const int64_t T0 = s.bounds[n], T1 = s.bounds[n + 1];
      const int64_t nc = (T1 - T0 + C - 1) / C;
      // the rows of chunk j of head h (the chunk before after the first head), read and written
      const auto prefetch = [&](int64_t j, int64_t h) {
        if (h < h0) {
          j -= 1;
          h = h1 - 1;
        }
        if (j < 0) return;
        const int64_t t0 = T0 + j * C, m = std::min(C, T1 - t0), hk = h / G;
        prefetch_rows(qp + (t0 * s.H + hk) * K, m, K, ldq);
        prefetch_rows(kp + (t0 * s.H + hk) * K, m, K, ldq);
        for (const float* x : {vp, gp, opo, dop}) prefetch_rows(x + (t0 * HV + h) * V, m, V, ldv);
        prefetch_rows(Xs + ((s.first_chunk[n] + j) * HV + h) * V * K, 1, V * K, V * K);
        for (float* x : {dqp, dkp}) prefetch_rows(x + (t0 * HV + h) * K, m, K, ldd, true);
        for (float* x : {dvp, dgp}) prefetch_rows(x + (t0 * HV + h) * V, m, V, ldv, true);
      };
      for (int64_t j = nc - 1; j >= 0; --j) {
        const int64_t t0 = T0 + j * C, c = std::min(C, T1 - t0);
        for (int64_t h = h1 - 1; h >= h0; --h) {
          const int64_t hk = h / G;
          float* dXh = dXall.data() + h * V * K;
          const float* X = Xs + ((s.first_chunk[n] + j) * HV + h) * V * K;
          const float* qc = qp + (t0 * s.H + hk) * K;
          const float* kc = kp + (t0 * s.H + hk) * K;
          const float* vc = vp + (t0 * HV + h) * V;
          const float* gc = gp + (t0 * HV + h) * V;
          const float* bc = bp + t0 * HV + h;
          const float* oc = opo + (t0 * HV + h) * V;
          const float* doc = dop + (t0 * HV + h) * V;
          prefetch(j, h - 1);
          if (!ch.terms(c, gc, vc, ldv, kc, ldq, bc, HV, limit)) {  // not saved by the forward
            steep.fetch_add(1);
            return;
          }
          ch.errors(c, X);
          ch.scores(c, qc, ldq, sc);
          for (int64_t i = 0; i < c; ++i) {
            for (int64_t a = 0; a < V; ++a) dY[i * V + a] = ch.eG[i * V + a] * doc[i * ldv + a];
          }
          // step 6
          lower_products(c, c, 1, V, 1.0f, dY.data(), V, ch.Vi.data(), V, dP.data(), C);
          for (int64_t i = 0; i < c; ++i) {
            std::fill(dP.data() + i * C + i + 1, dP.data() + i * C + c, 0.0f);
          }
          gemm(false, false, c, K, V, 1.0f, ch.R.data(), V, dXh, K, 0.0f, dU.data(), K);
          lower_transposed_times(c, c, K, sc, dP.data(), C, qc, ldq, 1.0f, dU.data(), K);
          float* dqc = dqp + (t0 * HV + h) * K;
          gemm(false, false, c, K, V, sc, dY.data(), V, X, K, 0.0f, dqc, ldd);
          lower_times(c, c, 1, K, sc, dP.data(), C, ch.U.data(), K, 1.0f, dqc, ldd);
          lower_transposed_times(c, c, V, 1.0f, ch.P.data(), C, dY.data(), V, 0.0f, dVi.data(), V);
          gemm(false, true, c, V, K, 1.0f, ch.U.data(), K, dXh, K, 0.0f, dR.data(), V);
          for (int64_t a = 0; a < V; ++a) {
            float sum = 0.0f;
            for (int64_t b = 0; b < K; ++b) sum += dXh[a * K + b] * X[a * K + b];
            dD[a] = sum;
          }
          // step 7
          for (int64_t a = 0; a < V; ++a) {
            for (int64_t b = 0; b < K; ++b) dXp[a * K + b] = ch.D[a] * dXh[a * K + b];
          }
          gemm(true, false, V, K, c, sc, dY.data(), V, qc, ldq, 1.0f, dXp.data(), K);
          gemm(true, false, V, K, c, -1.0f, ch.WU.data(), W, dU.data(), K, 1.0f, dXp.data(), K);
          // step 8
          gemm(false, true, c, V, K, -1.0f, dU.data(), K, X, K, 0.0f, dM.data(), W);
          for (int64_t i = 0; i < c; ++i) {
            std::copy(dU.data() + i * K, dU.data() + (i + 1) * K, dM.data() + i * W + V);
          }
          unit_lower_solve_transposed(c, W, ch.L.data(), C, dM.data(), W);
          lower_products(c, c, 1, W, -1.0f, dM.data(), W, ch.WU.data(), W, dL.data(), C);
          // step 9
          float* dkc = dkp + (t0 * HV + h) * K;
          for (int64_t i = 0; i < c; ++i) {
            const float b = bc[i * HV];
            const float* ki = kc + i * ldq;
            const float* dMi = dM.data() + i * W;
            float sum = 0.0f;
            for (int64_t a = 0; a < V; ++a) sum += dMi[a] * ch.Vd[i * V + a];
            for (int64_t a = 0; a < K; ++a) {
              sum += dMi[V + a] * ki[a];
              dkc[i * ldd + a] = b * dMi[V + a];
            }
            for (int64_t r = 0; r < i; ++r) {
              sum += dL[i * C + r] * ch.A[i * C + r];
              dL[i * C + r] *= b;  // dB
            }
            std::fill(dL.data() + i * C + i, dL.data() + i * C + c, 0.0f);
            dbp[(t0 + i) * HV + h] = sum;
          }
          lower_times(c, c, 1, V, 1.0f, dL.data(), C, ch.Vi.data(), V, 0.0f, dVd.data(), V);
          lower_transposed_times(c, c, V, 1.0f, dL.data(), C, ch.Vd.data(), V, 1.0f, dVi.data(), V);
          // steps 10 and 11
          float* dvc = dvp + (t0 * HV + h) * V;
          for (int64_t i = 0; i < c; ++i) {
            const float b = bc[i * HV];
            for (int64_t a = 0; a < V; ++a) {
              const int64_t e = i * V + a;
              const float dvd = dVd[e] + b * dM[i * W + a];
              dvc[i * ldv + a] =
                  ch.eG[e] * dvd + ch.eGi[e] * dVi[e] + ch.D[a] * ch.eGi[e] * dR[e];
              dG[e] = doc[i * ldv + a] * oc[i * ldv + a] + ch.Vd[e] * dvd - ch.Vi[e] * dVi[e] -
                      ch.R[e] * dR[e];
            }
          }
          float* dgc = dgp + (t0 * HV + h) * V;
          for (int64_t a = 0; a < V; ++a) run[a] = static_cast<double>(ch.D[a] * dD[a]);
          for (int64_t i = 0; i < c; ++i) {
            for (int64_t a = 0; a < V; ++a) {
              run[a] += static_cast<double>(ch.R[i * V + a] * dR[i * V + a]);
            }
          }
          for (int64_t i = c - 1; i >= 0; --i) {
            for (int64_t a = 0; a < V; ++a) {
              run[a] += static_cast<double>(dG[i * V + a]);
              dgc[i * ldv + a] = static_cast<float>(run[a]);
            }
          }
          std::copy(dXp.begin(), dXp.end(), dXh);
        }
      }
      for (int64_t h = h0; h < h1; ++h) {
        const float* dXh = dXall.data() + h * V * K;
        float* dS0u = dS0p + (n * HV + h) * K * V;
        for (int64_t a = 0; a < K; ++a) {
          for (int64_t j = 0; j < V; ++j) dS0u[a * V + j] = dXh[j * K + a];
        }
      }
    }
  });
  TORCH_CHECK(steep.load() == 0, kBackward,
              ": a chunk's decay spans the limit: the forward did not run this call");
  return {dq, dk, dv, dgv, dbeta, dS0};
}

namespace {

// The fake (shape-only) kernels: the Meta kernels of both ops.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> oja_forward_meta(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& gv,
    const at::Tensor& beta, const at::Tensor& S0, at::IntArrayRef bounds, double scale, int64_t C,
    double limit, bool keep) {
  const OjaShape s = oja_shape(kForward, q, k, v, gv, beta, bounds, C, c10::kMeta);
  check_state(kForward, "S0", S0, s, c10::kMeta);
  const auto opts = q.options();
  return {at::empty({s.TT, s.HV, s.V}, opts), at::empty({s.N, s.HV, s.K, s.V}, opts),
          at::empty({keep ? s.chunks : 0, s.HV, s.V, s.K}, opts),
          at::empty({}, opts.dtype(at::kLong))};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>
oja_backward_meta(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                  const at::Tensor& gv, const at::Tensor& beta, const at::Tensor& states,
                  const at::Tensor& o, const at::Tensor& d_o, const std::optional<at::Tensor>& dS,
                  at::IntArrayRef bounds, double scale, int64_t C, double limit) {
  const OjaShape s = oja_shape(kBackward, q, k, v, gv, beta, bounds, C, c10::kMeta);
  const auto opts = q.options();
  return {at::empty({s.TT, s.HV, s.K}, opts), at::empty({s.TT, s.HV, s.K}, opts),
          at::empty({s.TT, s.HV, s.V}, opts), at::empty({s.TT, s.HV, s.V}, opts),
          at::empty({s.TT, s.HV}, opts),      at::empty({s.N, s.HV, s.K, s.V}, opts)};
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(linattn_native, m) {
  m.def(
      "oja_forward(Tensor q, Tensor k, Tensor v, Tensor gv, Tensor beta, Tensor S0, int[] bounds,"
      " float scale, int C, float limit, bool keep) -> (Tensor, Tensor, Tensor, Tensor)");
  m.def(
      "oja_backward(Tensor q, Tensor k, Tensor v, Tensor gv, Tensor beta, Tensor states,"
      " Tensor o, Tensor d_o, Tensor? dS, int[] bounds, float scale, int C, float limit)"
      " -> (Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(linattn_native, CPU, m) {
  m.impl("oja_forward", &oja_forward);
  m.impl("oja_backward", &oja_backward);
}

TORCH_LIBRARY_IMPL(linattn_native, Meta, m) {
  m.impl("oja_forward", &oja_forward_meta);
  m.impl("oja_backward", &oja_backward_meta);
}

}  // namespace linattn_native
