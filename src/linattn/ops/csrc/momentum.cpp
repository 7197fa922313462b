// The momentum delta rule's chunk form (``linattn.ops.momentum_delta_rule``), forward and backward
// fused per (sequence, head): a loop over the chunks, its products on the BLAS, the decays' and
// weights' recurrences in plain loops. Self-contained: its ops are registered at the end of this
// file.
//
// The rule keeps the pair Z = [S; M] [2K, V] (the memory over the momentum). One chunk of c tokens
// (positions 1..c, position 0 the pair entering), alpha_i = exp(log_alpha), mu_i = exp(log_mu),
// beta_0 = 0, Q = scale q, EK = diag(eta) k (the module docstring of momentum_delta_rule.py):
//
//   1. a0_i = a(i, 0) and m(i, s) = mu_i m(i - 1, s) (m(s, s) = 1), and the weights
//      g(i, s) = alpha_i g(i - 1, s) + beta_i m(i, s)  (g(s - 1, s) = 0), c0_i = -g(i, 0):
//      products of decays <= 1 only, so no exponent leaves float32's range (no chunk is too steep)
//   2. PK = P EK^T, QK = Q EK^T;  L[t, s] = g(t, s + 1) PK[t, s] (s < t),
//      A[t, s] = g(t + 1, s + 1) QK[t, s] (s <= t)
//   3. R = [[a0_t P_t | c0_t P_t]; [a0_{t+1} Q_t | c0_{t+1} Q_t]] [2c, 2K],  Y = R Z
//   4. (I + L) W = V - Y_reads                        (the errors, by substitution)
//   5. O = Y_outs + A W
//   6. Z <- [[a0_c, c0_c], [0, m(c, 0)]] Z + I^T W,  I_s = [g(c, s + 1) EK_s | -m(c, s + 1) EK_s]
//
// Backward, the chunks last to first, dZ the gradient of the pair leaving the chunk, steps 1-3
// recomputed, Z and W saved by the forward:
//
//   7. dW = A^T dO + I dZ,  dI = W dZ^T,  dA = tril(dO W^T);  dR' = (I + L)^-T dW (= dv),
//      dL = -tril(dR' W^T, -1);  dY = [-dR'; dO],  dR = dY Z^T
//   8. dZ <- Phi^T dZ + R^T dY
//   9. the factors' gradients (dP, dQ, dEK from R, L, A, I), and those of a0, c0, m, g, which the
//      recurrences of step 1 carry back to log_alpha, log_mu and beta
//
// Layouts: the tokens of every sequence one after another (packed; ``bounds`` the N + 1
// cumulative lengths), q, k, p [TT, H, K], v, o [TT, H, V], the log-decays and rates [TT, H], all
// contiguous; the pair Z0, Z [2, N, H, K, V] (fla's layout: S and M stacked); the saved pairs
// [chunks, H, 2K, V] entering every chunk of every sequence and the errors W [TT, H, V].
// Float32 only.
#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>
#include <tuple>
#include <vector>

#include "blas.h"
#include "block_cache.h"
#include "gates.h"
#include "triangular.h"

namespace linattn_native {
namespace {

constexpr const char* kMomentumForward = "momentum_forward";
constexpr const char* kMomentumBackward = "momentum_backward";

// The sizes of one call, checked at the entry points before any work.
struct MomentumShape {
  int64_t TT, H, K, V, N, C, chunks;
  std::vector<int64_t> bounds;
  std::vector<int64_t> first_chunk;  // the index of each sequence's first chunk in ``states``
};

void check_input(const char* op, const char* name, const at::Tensor& x, int64_t dim,
                 c10::DeviceType device) {
  TORCH_CHECK(x.defined(), op, ": ", name, " is undefined");
  TORCH_CHECK(x.scalar_type() == at::kFloat, op, ": ", name, " must be float32, got ",
              x.scalar_type());
  TORCH_CHECK(x.device().type() == device, op, ": ", name, " must be on ",
              c10::DeviceTypeName(device), ", got ", x.device());
  TORCH_CHECK(x.dim() == dim, op, ": ", name, " must have ", dim, " dimensions, got ", x.sizes());
  TORCH_CHECK(x.is_contiguous(), op, ": ", name, " must be contiguous");
}

MomentumShape momentum_shape(const char* op, const at::Tensor& q, const at::Tensor& k,
                             const at::Tensor& p, const at::Tensor& la, const at::Tensor& lm,
                             const at::Tensor& beta, const at::Tensor& eta, int64_t V,
                             at::IntArrayRef bounds, int64_t C, c10::DeviceType device) {
  check_input(op, "q", q, 3, device);
  check_input(op, "k", k, 3, device);
  check_input(op, "p", p, 3, device);
  MomentumShape s;
  s.TT = q.size(0);
  s.H = q.size(1);
  s.K = q.size(2);
  s.V = V;
  TORCH_CHECK(k.sizes() == q.sizes(), op, ": k must have q's shape ", q.sizes(), ", got ",
              k.sizes());
  TORCH_CHECK(p.sizes() == q.sizes(), op, ": p must have q's shape ", q.sizes(), ", got ",
              p.sizes());
  using Named = std::pair<const char*, const at::Tensor*>;
  for (const auto& [name, x] : {Named{"log_alpha", &la}, Named{"log_mu", &lm},
                                Named{"beta", &beta}, Named{"eta", &eta}}) {
    check_input(op, name, *x, 2, device);
    TORCH_CHECK(x->size(0) == s.TT && x->size(1) == s.H, op, ": ", name, " must have shape [",
                s.TT, ", ", s.H, "], got ", x->sizes());
  }
  TORCH_CHECK(C >= 1 && C <= 1024, op, ": C (the chunk size) must be in [1, 1024], got ", C);
  TORCH_CHECK(s.H >= 1 && s.K >= 1 && s.V >= 1 && s.K <= 65536 && s.V <= 65536 &&
                  s.H * (s.K + s.V) <= INT32_MAX,
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

void check_rows(const char* op, const char* name, const at::Tensor& x, const MomentumShape& s,
                c10::DeviceType device) {
  check_input(op, name, x, 3, device);
  TORCH_CHECK(x.size(0) == s.TT && x.size(1) == s.H && x.size(2) == s.V, op, ": ", name,
              " must have shape [", s.TT, ", ", s.H, ", ", s.V, "], got ", x.sizes());
}

void check_pair(const char* op, const char* name, const at::Tensor& x, const MomentumShape& s,
                c10::DeviceType device) {
  check_input(op, name, x, 5, device);
  TORCH_CHECK(x.size(0) == 2 && x.size(1) == s.N && x.size(2) == s.H && x.size(3) == s.K &&
                  x.size(4) == s.V,
              op, ": ", name, " must have shape [2, ", s.N, ", ", s.H, ", ", s.K, ", ", s.V,
              "], got ", x.sizes());
}

// Rows [t0, t0 + c) of heads [h0, h1) of x [TT, H, D] into buf [h1 - h0, C, D] (``gather``) or
// back (``scatter``), in memory order: the rows of one chunk of all heads lie together, so this is
// one sequential pass, where a head's own rows, H D floats apart, are streams that the hardware's
// prefetchers follow poorly (the kernels then read and write a head's rows at stride D).
// (A row of the common widths is copied inline: a call of memmove a row would cost about as much
// as the copy.)
inline void copy_row(const float* src, int64_t D, float* dst) {
  if (D == 64) {
    std::memcpy(dst, src, 64 * sizeof(float));
  } else if (D == 128) {
    std::memcpy(dst, src, 128 * sizeof(float));
  } else if (D == 1) {
    *dst = *src;
  } else {
    std::copy(src, src + D, dst);
  }
}

void gather(const float* x, int64_t H, int64_t D, int64_t t0, int64_t c, int64_t h0, int64_t h1,
            int64_t C, float* buf) {
  for (int64_t t = 0; t < c; ++t) {
    const float* row = x + ((t0 + t) * H + h0) * D;
    for (int64_t h = h0; h < h1; ++h, row += D) copy_row(row, D, buf + ((h - h0) * C + t) * D);
  }
}

void scatter(const float* buf, int64_t H, int64_t D, int64_t t0, int64_t c, int64_t h0,
             int64_t h1, int64_t C, float* x) {
  for (int64_t t = 0; t < c; ++t) {
    float* row = x + ((t0 + t) * H + h0) * D;
    for (int64_t h = h0; h < h1; ++h, row += D) {
      copy_row(buf + ((h - h0) * C + t) * D, D, row);
    }
  }
}

// Asks for the rows [t0, t0 + c) of head h of x [TT, H, D] (and, with ``D`` 1, of all heads: the
// per-token scalars) to be brought into the cache, while the chunk before is computed: the next
// ``gather`` then copies from the cache instead of waiting on memory, as the compiled forward of
// the other rules reads its next chunk's rows (layout.h's ``prefetch_rows``).
inline void prefetch_head_rows(const float* x, int64_t H, int64_t D, int64_t t0, int64_t c,
                               int64_t h, bool write = false) {
  const int64_t width = D == 1 ? H : D, first = D == 1 ? 0 : h;
  for (int64_t t = t0; t < t0 + c; ++t) {
    const uintptr_t row = reinterpret_cast<uintptr_t>(x + (t * H + first) * D);
    const uintptr_t end = row + width * sizeof(float);
    for (uintptr_t line = row & ~uintptr_t{63}; line < end; line += 64) {
      const void* address = reinterpret_cast<const void*>(line);
      write ? __builtin_prefetch(address, 1, 2) : __builtin_prefetch(address, 0, 2);
    }
  }
}

// One chunk's recomputable terms (steps 1-3 but the product Y), in one thread's blocks. The
// (c + 1) x (c + 1) tables m and g are row-major with stride C + 1; the c x c ones with stride C.
struct Chunk {
  int64_t C, K, V, D;  // D = C + 1
  std::vector<float> alpha, mu, b, a0, m, g, P, Q, EK, PK, QK, L, A, R, I, es;

  Chunk(int64_t C_, int64_t K_, int64_t V_)
      : C(C_), K(K_), V(V_), D(C_ + 1), alpha(C_ + 2), mu(C_ + 2), b(C_ + 1), a0(C_ + 1),
        m(D * D), g(D * D), P(C_ * K_), Q(C_ * K_), EK(C_ * K_), PK(C_ * C_), QK(C_ * C_),
        L(C_ * C_), A(C_ * C_), R(2 * C_ * 2 * K_), I(C_ * 2 * K_), es(C_) {}

  float gw(int64_t i, int64_t s) const { return g[i * D + s]; }
  float c0(int64_t i) const { return -g[i * D]; }

  // The c tokens at the given rows (strides ldq for q, k, p and ldh for the per-head scalars).
  // With ``factors`` the factors P, Q and EK are kept (the backward's step 9 reads them); without
  // (the forward), the products read q, k and p where they lie, scale and eta applied to the
  // products' entries instead of to copies of the rows.
  void terms(int64_t c, const float* q, const float* k, const float* p, int64_t ldq,
             const float* la, const float* lm, const float* beta, const float* eta, int64_t ldh,
             float scale, bool factors = true) {
    alpha[c + 1] = 0.0f;  // no position after the chunk: the backward's recurrences stop here
    b[0] = 0.0f;
    a0[0] = 1.0f;
    m[0] = 1.0f;
    g[0] = 0.0f;
    for (int64_t i = 1; i <= c; ++i) {
      alpha[i] = std::exp(la[(i - 1) * ldh]);
      mu[i] = std::exp(lm[(i - 1) * ldh]);
      b[i] = beta[(i - 1) * ldh];
      a0[i] = alpha[i] * a0[i - 1];
      const float* mp = m.data() + (i - 1) * D;
      const float* gp = g.data() + (i - 1) * D;
      float* mi = m.data() + i * D;
      float* gi = g.data() + i * D;
      const float al = alpha[i], mui = mu[i], bi = b[i];
#pragma omp simd
      for (int64_t s = 0; s < i; ++s) {
        mi[s] = mui * mp[s];
        gi[s] = al * gp[s] + bi * mi[s];
      }
      mi[i] = 1.0f;
      gi[i] = bi;
    }
    // the factors (P, Q, EK, their row stride ld) and what is left to apply: qs to Q's rows and
    // es_s to EK's (1 where the factors carry them)
    const float *Pf = p, *Qf = q, *Ef = k;
    int64_t ld = ldq;
    float qs = scale;
    if (factors) {
      for (int64_t t = 0; t < c; ++t) {
        const float e = eta[t * ldh];
        const float *qt = q + t * ldq, *kt = k + t * ldq, *pt = p + t * ldq;
        float *Pt = P.data() + t * K, *Qt = Q.data() + t * K, *Et = EK.data() + t * K;
#pragma omp simd
        for (int64_t a = 0; a < K; ++a) {
          Pt[a] = pt[a];
          Qt[a] = scale * qt[a];
          Et[a] = e * kt[a];
        }
      }
      Pf = P.data(), Qf = Q.data(), Ef = EK.data(), ld = K, qs = 1.0f;
      std::fill(es.begin(), es.begin() + c, 1.0f);
    } else {
      for (int64_t t = 0; t < c; ++t) es[t] = eta[t * ldh];
    }
    lower_products(c, c, 1, K, 1.0f, Pf, ld, Ef, ld, PK.data(), C);
    lower_products(c, c, 1, K, qs, Qf, ld, Ef, ld, QK.data(), C);
    const float* e = es.data();
    for (int64_t t = 0; t < c; ++t) {
      float *Lt = L.data() + t * C, *At = A.data() + t * C;
      const float *PKt = PK.data() + t * C, *QKt = QK.data() + t * C;
      const float *gt = g.data() + t * D + 1, *gn = g.data() + (t + 1) * D + 1;
#pragma omp simd
      for (int64_t s = 0; s < t; ++s) Lt[s] = gt[s] * e[s] * PKt[s];
#pragma omp simd
      for (int64_t s = 0; s <= t; ++s) At[s] = gn[s] * e[s] * QKt[s];
      std::fill(At + t + 1, At + c, 0.0f);
    }
    const int64_t W = 2 * K;
    for (int64_t t = 0; t < c; ++t) {
      float* rp = R.data() + t * W;
      float* rq = R.data() + (c + t) * W;
      const float ap = a0[t], cp = c0(t), an = a0[t + 1] * qs, cn = c0(t + 1) * qs;
      const float ig = gw(c, t + 1) * es[t], im = -m[c * D + t + 1] * es[t];
      float* in = I.data() + t * W;
      const float *Pt = Pf + t * ld, *Qt = Qf + t * ld, *Et = Ef + t * ld;
#pragma omp simd
      for (int64_t a = 0; a < K; ++a) {
        rp[a] = ap * Pt[a];
        rp[K + a] = cp * Pt[a];
        rq[a] = an * Qt[a];
        rq[K + a] = cn * Qt[a];
        in[a] = ig * Et[a];
        in[K + a] = im * Et[a];
      }
    }
  }
};

// The pair [2, N, H, K, V] of (sequence n, head h) into / out of a [2K, V] block.
void pair_in(const float* src, int64_t N, int64_t H, int64_t n, int64_t h, int64_t KV, float* Z) {
  std::copy(src + (n * H + h) * KV, src + (n * H + h + 1) * KV, Z);
  std::copy(src + ((N + n) * H + h) * KV, src + ((N + n) * H + h + 1) * KV, Z + KV);
}

void pair_out(const float* Z, int64_t N, int64_t H, int64_t n, int64_t h, int64_t KV, float* dst) {
  std::copy(Z, Z + KV, dst + (n * H + h) * KV);
  std::copy(Z + KV, Z + 2 * KV, dst + ((N + n) * H + h) * KV);
}

}  // namespace

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> momentum_forward(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& p,
    const at::Tensor& la, const at::Tensor& lm, const at::Tensor& beta, const at::Tensor& eta,
    const at::Tensor& Z0, at::IntArrayRef bounds, double scale, int64_t C, bool keep) {
  check_input(kMomentumForward, "v", v, 3, c10::kCPU);
  const MomentumShape s = momentum_shape(kMomentumForward, q, k, p, la, lm, beta, eta, v.size(2),
                                         bounds, C, c10::kCPU);
  check_rows(kMomentumForward, "v", v, s, c10::kCPU);
  check_pair(kMomentumForward, "Z0", Z0, s, c10::kCPU);
  const auto opts = q.options();
  const int64_t H = s.H, K = s.K, V = s.V, N = s.N, KV = K * V;
  at::Tensor o = fresh({s.TT, H, V}, opts);
  at::Tensor Z = at::empty({2, N, H, K, V}, opts);
  at::Tensor states = fresh({keep ? s.chunks : 0, H, 2 * K, V}, opts);
  at::Tensor errors = fresh({keep ? s.TT : 0, H, V}, opts);
  const float sc = static_cast<float>(scale);
  const float *qp = q.data_ptr<float>(), *kp = k.data_ptr<float>(), *vp = v.data_ptr<float>();
  const float *pp = p.data_ptr<float>(), *lap = la.data_ptr<float>(), *lmp = lm.data_ptr<float>();
  const float *bp = beta.data_ptr<float>(), *ep = eta.data_ptr<float>();
  const float* Z0p = Z0.data_ptr<float>();
  float *op = o.data_ptr<float>(), *Zp = Z.data_ptr<float>();
  float *Zs = states.data_ptr<float>(), *Ws = errors.data_ptr<float>();
  // A thread's (sequence, head)s: per sequence, the chunks in order and, inner, its heads (the
  // rows of one chunk of all heads lie together in memory), each head's pair apart.
  at::parallel_for(0, N * H, 1, [&](int64_t lo, int64_t hi) {
    SequentialBlas sequential;
    FlushSubnormals flush;
    Chunk ch(C, K, V);
    std::vector<float> Zall(H * 2 * KV);
    // a chunk of the thread's heads: inputs and outputs ([heads, C, D]; the values' rows turn
    // into the errors W) and the 4 scalars a token
    const int64_t HC = H * C;
    std::vector<float> Qb(HC * K), Kb(HC * K), Pb(HC * K), Vb(HC * V), Ob(HC * V), sb(4 * HC);
    for (int64_t n = lo / H; n * H < hi; ++n) {
      const int64_t h0 = std::max(lo, n * H) - n * H, h1 = std::min(hi, (n + 1) * H) - n * H;
      const int64_t T1 = s.bounds[n + 1];
      for (int64_t h = h0; h < h1; ++h) pair_in(Z0p, N, H, n, h, KV, Zall.data() + h * 2 * KV);
      int64_t index = s.first_chunk[n];
      for (int64_t t0 = s.bounds[n]; t0 < T1; t0 += C, ++index) {
        const int64_t c = std::min(C, T1 - t0);
        gather(qp, H, K, t0, c, h0, h1, C, Qb.data());
        gather(kp, H, K, t0, c, h0, h1, C, Kb.data());
        gather(pp, H, K, t0, c, h0, h1, C, Pb.data());
        gather(vp, H, V, t0, c, h0, h1, C, Vb.data());
        const float* scalars[] = {lap, lmp, bp, ep};
        for (int64_t x = 0; x < 4; ++x) {
          gather(scalars[x], H, 1, t0, c, h0, h1, C, sb.data() + x * HC);
        }
        // the next chunk's rows of this sequence, a head's share while each head is computed
        const int64_t tn = t0 + C, cn = std::min(C, T1 - tn);
        for (int64_t h = h0; h < h1; ++h) {
          if (cn > 0) {
            prefetch_head_rows(qp, H, K, tn, cn, h);
            prefetch_head_rows(kp, H, K, tn, cn, h);
            prefetch_head_rows(pp, H, K, tn, cn, h);
            prefetch_head_rows(vp, H, V, tn, cn, h);
            if (h == h0) {
              for (const float* x : {lap, lmp, bp, ep}) prefetch_head_rows(x, H, 1, tn, cn, h);
            }
          }
          float* Zh = Zall.data() + h * 2 * KV;
          const int64_t u = h - h0, uK = u * C * K, uV = u * C * V;
          const float* su = sb.data() + u * C;
          ch.terms(c, Qb.data() + uK, Kb.data() + uK, Pb.data() + uK, K, su, su + HC,
                   su + 2 * HC, su + 3 * HC, 1, sc, false);
          if (keep) std::copy(Zh, Zh + 2 * KV, Zs + (index * H + h) * 2 * KV);
          // steps 3-4: W = (I + L)^-1 (V - R_reads Z), in place of the chunk's values (the
          // product subtracted into them, not written apart and subtracted in a pass of its own)
          float* Wb = Vb.data() + uV;
          gemm(false, false, c, V, 2 * K, -1.0f, ch.R.data(), 2 * K, Zh, V, 1.0f, Wb, V);
          unit_lower_solve(c, V, ch.L.data(), C, Wb, V);
          // step 5: O = R_outs Z + A W, into the output rows
          float* Ou = Ob.data() + uV;
          gemm(false, false, c, V, 2 * K, 1.0f, ch.R.data() + c * 2 * K, 2 * K, Zh, V, 0.0f, Ou,
               V);
          lower_times(c, c, 1, V, 1.0f, ch.A.data(), C, Wb, V, 1.0f, Ou, V);
          // step 6: S <- a0_c S + c0_c M, M <- m(c, 0) M, then Z += I^T W
          const float ac = ch.a0[c], cc = ch.c0(c), mc = ch.m[c * ch.D];
          float *S = Zh, *M = Zh + KV;
          for (int64_t e = 0; e < KV; ++e) {
            S[e] = ac * S[e] + cc * M[e];
            M[e] *= mc;
          }
          gemm(true, false, 2 * K, V, c, 1.0f, ch.I.data(), 2 * K, Wb, V, 1.0f, Zh, V);
        }
        scatter(Ob.data(), H, V, t0, c, h0, h1, C, op);
        if (keep) scatter(Vb.data(), H, V, t0, c, h0, h1, C, Ws);  // the errors W
      }
      for (int64_t h = h0; h < h1; ++h) pair_out(Zall.data() + h * 2 * KV, N, H, n, h, KV, Zp);
    }
  });
  return {o, Z, states, errors};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor,
           at::Tensor, at::Tensor>
momentum_backward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& p,
                  const at::Tensor& la, const at::Tensor& lm, const at::Tensor& beta,
                  const at::Tensor& eta, const at::Tensor& states, const at::Tensor& errors,
                  const at::Tensor& d_o, const std::optional<at::Tensor>& dZ,
                  at::IntArrayRef bounds, double scale, int64_t C) {
  check_input(kMomentumBackward, "errors", errors, 3, c10::kCPU);
  const MomentumShape s = momentum_shape(kMomentumBackward, q, k, p, la, lm, beta, eta,
                                         errors.size(2), bounds, C, c10::kCPU);
  check_rows(kMomentumBackward, "errors", errors, s, c10::kCPU);
  check_rows(kMomentumBackward, "d_o", d_o, s, c10::kCPU);
  check_input(kMomentumBackward, "states", states, 4, c10::kCPU);
  TORCH_CHECK(states.size(0) == s.chunks && states.size(1) == s.H && states.size(2) == 2 * s.K &&
                  states.size(3) == s.V,
              kMomentumBackward, ": states must have shape [", s.chunks, ", ", s.H, ", ",
              2 * s.K, ", ", s.V, "], got ", states.sizes());
  if (dZ.has_value()) check_pair(kMomentumBackward, "dZ", *dZ, s, c10::kCPU);
  const auto opts = q.options();
  const int64_t H = s.H, K = s.K, V = s.V, N = s.N, KV = K * V, W2 = 2 * K;
  at::Tensor dq = fresh({s.TT, H, K}, opts), dk = fresh({s.TT, H, K}, opts);
  at::Tensor dp = fresh({s.TT, H, K}, opts), dv = fresh({s.TT, H, V}, opts);
  at::Tensor dla = at::empty({s.TT, H}, opts), dlm = at::empty({s.TT, H}, opts);
  at::Tensor dbeta = at::empty({s.TT, H}, opts), deta = at::empty({s.TT, H}, opts);
  at::Tensor dZ0 = at::empty({2, N, H, K, V}, opts);
  const float sc = static_cast<float>(scale);
  const float *qp = q.data_ptr<float>(), *kp = k.data_ptr<float>(), *pp = p.data_ptr<float>();
  const float *lap = la.data_ptr<float>(), *lmp = lm.data_ptr<float>();
  const float *bp = beta.data_ptr<float>(), *ep = eta.data_ptr<float>();
  const float *Zs = states.data_ptr<float>(), *Ws = errors.data_ptr<float>();
  const float* dop = d_o.data_ptr<float>();
  const float* dZp = dZ.has_value() ? dZ->data_ptr<float>() : nullptr;
  float *dqp = dq.data_ptr<float>(), *dkp = dk.data_ptr<float>(), *dpp = dp.data_ptr<float>();
  float *dvp = dv.data_ptr<float>(), *dlap = dla.data_ptr<float>(), *dlmp = dlm.data_ptr<float>();
  float *dbp = dbeta.data_ptr<float>(), *dep = deta.data_ptr<float>();
  float* dZ0p = dZ0.data_ptr<float>();
  at::parallel_for(0, N * H, 1, [&](int64_t lo, int64_t hi) {
    SequentialBlas sequential;
    FlushSubnormals flush;
    Chunk ch(C, K, V);
    const int64_t D = C + 1;
    std::vector<float> dZall(H * 2 * KV), dY(2 * C * V), dW(C * V),
        dI(C * W2), dA(C * C), dL(C * C), dR(2 * C * W2), dP(C * K), dQ(C * K), dEK(C * K),
        dG(D * D), dm(D * D), da0(D), dc0(D), dalpha(D + 1), dbpos(D), dMc(D);
    // a chunk of the thread's heads: inputs and gradients ([heads, C, D]), 4 scalars a token each
    const int64_t HC = H * C;
    std::vector<float> Qb(HC * K), Kb(HC * K), Pb(HC * K), WB(HC * V), dOB(HC * V), sb(4 * HC),
        dQB(HC * K), dKB(HC * K), dPB(HC * K), dVB(HC * V), dsb(4 * HC);
    for (int64_t n = lo / H; n * H < hi; ++n) {
      const int64_t h0 = std::max(lo, n * H) - n * H, h1 = std::min(hi, (n + 1) * H) - n * H;
      for (int64_t h = h0; h < h1; ++h) {
        float* dZh = dZall.data() + h * 2 * KV;
        if (dZp) {
          pair_in(dZp, N, H, n, h, KV, dZh);
        } else {
          std::fill(dZh, dZh + 2 * KV, 0.0f);
        }
      }
      const int64_t T0 = s.bounds[n], T1 = s.bounds[n + 1];
      const int64_t nc = (T1 - T0 + C - 1) / C;
      const float* scalars[] = {lap, lmp, bp, ep};
      float* dscalars[] = {dlap, dlmp, dbp, dep};
      for (int64_t j = nc - 1; j >= 0; --j) {
        const int64_t t0 = T0 + j * C, c = std::min(C, T1 - t0);
        gather(qp, H, K, t0, c, h0, h1, C, Qb.data());
        gather(kp, H, K, t0, c, h0, h1, C, Kb.data());
        gather(pp, H, K, t0, c, h0, h1, C, Pb.data());
        gather(Ws, H, V, t0, c, h0, h1, C, WB.data());
        gather(dop, H, V, t0, c, h0, h1, C, dOB.data());
        for (int64_t x = 0; x < 4; ++x) {
          gather(scalars[x], H, 1, t0, c, h0, h1, C, sb.data() + x * HC);
        }
        for (int64_t h = h1 - 1; h >= h0; --h) {
          float* dZh = dZall.data() + h * 2 * KV;
          const float* Zh = Zs + ((s.first_chunk[n] + j) * H + h) * 2 * KV;
          const int64_t u = h - h0, uK = u * C * K, uV = u * C * V;
          const float* su = sb.data() + u * C;
          float* dsu = dsb.data() + u * C;
          ch.terms(c, Qb.data() + uK, Kb.data() + uK, Pb.data() + uK, K, su, su + HC,
                   su + 2 * HC, su + 3 * HC, 1, sc);
          const float *Wb = WB.data() + uV, *dO = dOB.data() + uV;
          const float *S = Zh, *M = Zh + KV, *dS = dZh, *dM = dZh + KV;
          // the gradients of the chunk's transition Phi: of a0_c, c0_c and m(c, 0)
          // (the sums in vector lanes: a fixed order, whatever the thread)
          float phi_a = 0.0f, phi_c = 0.0f, phi_m = 0.0f;
#pragma omp simd reduction(+ : phi_a, phi_c, phi_m)
          for (int64_t e = 0; e < KV; ++e) {
            phi_a += dS[e] * S[e];
            phi_c += dS[e] * M[e];
            phi_m += dM[e] * M[e];
          }
          // step 7
          lower_transposed_times(c, c, V, 1.0f, ch.A.data(), C, dO, V, 0.0f, dW.data(), V);
          gemm(false, false, c, V, W2, 1.0f, ch.I.data(), W2, dZh, V, 1.0f, dW.data(), V);
          gemm(false, true, c, W2, V, 1.0f, Wb, V, dZh, V, 0.0f, dI.data(), W2);
          lower_products(c, c, 1, V, 1.0f, dO, V, Wb, V, dA.data(), C);
          unit_lower_solve_transposed(c, V, ch.L.data(), C, dW.data(), V);
          std::copy(dW.data(), dW.data() + c * V, dVB.data() + uV);
          lower_products(c, c, 1, V, -1.0f, dW.data(), V, Wb, V, dL.data(), C);
          for (int64_t e = 0; e < c * V; ++e) {
            dY[e] = -dW[e];
            dY[c * V + e] = dO[e];
          }
          gemm(false, true, 2 * c, W2, V, 1.0f, dY.data(), V, Zh, V, 0.0f, dR.data(), W2);
          // step 8: dZ <- Phi^T dZ + R^T dY (dM first: it reads dS before dS is scaled)
          {
            const float ac = ch.a0[c], cc = ch.c0(c), mc = ch.m[c * D];
            float *dSw = dZh, *dMw = dZh + KV;
            for (int64_t e = 0; e < KV; ++e) {
              dMw[e] = cc * dSw[e] + mc * dMw[e];
              dSw[e] *= ac;
            }
          }
          gemm(true, false, W2, V, 2 * c, 1.0f, ch.R.data(), W2, dY.data(), V, 1.0f, dZh, V);
          // step 9: the weights' gradients dG (g's table) and dm (m's), a0's and c0's
          for (int64_t i = 0; i <= c; ++i) {
            std::fill(dG.data() + i * D, dG.data() + i * D + i + 1, 0.0f);
            std::fill(dm.data() + i * D, dm.data() + i * D + i + 1, 0.0f);
            da0[i] = 0.0f;
            dc0[i] = 0.0f;
          }
          for (int64_t t = 0; t < c; ++t) {
            float *dLt = dL.data() + t * C, *dAt = dA.data() + t * C;
            const float *PKt = ch.PK.data() + t * C, *QKt = ch.QK.data() + t * C;
            const float *gt = ch.g.data() + t * D + 1, *gn = ch.g.data() + (t + 1) * D + 1;
            float *dGt = dG.data() + t * D + 1, *dGn = dG.data() + (t + 1) * D + 1;
            for (int64_t u = 0; u < t; ++u) {
              dGt[u] += dLt[u] * PKt[u];
              dLt[u] *= gt[u];  // dPK
            }
            std::fill(dLt + t, dLt + c, 0.0f);
            for (int64_t u = 0; u <= t; ++u) {
              dGn[u] += dAt[u] * QKt[u];
              dAt[u] *= gn[u];  // dQK
            }
            std::fill(dAt + t + 1, dAt + c, 0.0f);
          }
          for (int64_t t = 0; t < c; ++t) {
            const float *drp = dR.data() + t * W2, *drq = dR.data() + (c + t) * W2;
            const float *Pt = ch.P.data() + t * K, *Qt = ch.Q.data() + t * K;
            const float ap = ch.a0[t], cp = ch.c0(t), an = ch.a0[t + 1], cn = ch.c0(t + 1);
            float *dPt = dP.data() + t * K, *dQt = dQ.data() + t * K;
            float sap = 0.0f, scp = 0.0f, san = 0.0f, scn = 0.0f;
#pragma omp simd reduction(+ : sap, scp, san, scn)
            for (int64_t a = 0; a < K; ++a) {
              dPt[a] = ap * drp[a] + cp * drp[K + a];
              dQt[a] = an * drq[a] + cn * drq[K + a];
              sap += Pt[a] * drp[a];
              scp += Pt[a] * drp[K + a];
              san += Qt[a] * drq[a];
              scn += Qt[a] * drq[K + a];
            }
            da0[t] += sap;
            dc0[t] += scp;
            da0[t + 1] += san;
            dc0[t + 1] += scn;
          }
          lower_times(c, c, 1, K, 1.0f, dL.data(), C, ch.EK.data(), K, 1.0f, dP.data(), K);
          lower_times(c, c, 1, K, 1.0f, dA.data(), C, ch.EK.data(), K, 1.0f, dQ.data(), K);
          lower_transposed_times(c, c, K, 1.0f, dL.data(), C, ch.P.data(), K, 0.0f, dEK.data(),
                                 K);
          lower_transposed_times(c, c, K, 1.0f, dA.data(), C, ch.Q.data(), K, 1.0f, dEK.data(),
                                 K);
          for (int64_t u = 0; u < c; ++u) {
            const float* dIu = dI.data() + u * W2;
            const float* Eu = ch.EK.data() + u * K;
            float* dEu = dEK.data() + u * K;
            const float ig = ch.gw(c, u + 1), im = ch.m[c * D + u + 1];
            float sg = 0.0f, sm = 0.0f;
#pragma omp simd reduction(+ : sg, sm)
            for (int64_t a = 0; a < K; ++a) {
              dEu[a] += ig * dIu[a] - im * dIu[K + a];
              sg += dIu[a] * Eu[a];
              sm += dIu[K + a] * Eu[a];
            }
            dG[c * D + u + 1] += sg;
            dm[c * D + u + 1] -= sm;
          }
          da0[c] += phi_a;
          dc0[c] += phi_c;
          dm[c * D] += phi_m;
          for (int64_t i = 0; i <= c; ++i) dG[i * D] -= dc0[i];
          // the token rows of dq, dk, dp, deta
          float *dqc = dQB.data() + uK, *dkc = dKB.data() + uK;
          std::copy(dP.data(), dP.data() + c * K, dPB.data() + uK);
          const float* kc = Kb.data() + uK;
          for (int64_t t = 0; t < c; ++t) {
            const float e = su[3 * HC + t];
            const float* dEt = dEK.data() + t * K;
            const float* kt = kc + t * K;
            float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
            for (int64_t a = 0; a < K; ++a) {
              dqc[t * K + a] = sc * dQ[t * K + a];
              dkc[t * K + a] = e * dEt[a];
              sum += dEt[a] * kt[a];
            }
            dsu[3 * HC + t] = sum;
          }
          // g's recurrence backward, rows c down to 1: dG row i becomes the adjoint gamma_i of
          // g's row i (its own gradient plus alpha_{i+1} times the next row's adjoint)
          for (int64_t i = c; i >= 1; --i) {
            float* gi = dG.data() + i * D;
            if (i < c) {
              const float* gn = dG.data() + (i + 1) * D;
              const float an = ch.alpha[i + 1];
#pragma omp simd
              for (int64_t u = 0; u <= i; ++u) gi[u] += an * gn[u];
            }
            const float* gp = ch.g.data() + (i - 1) * D;
            const float* mi = ch.m.data() + i * D;
            float* dmi = dm.data() + i * D;
            const float bi = ch.b[i];
            float sa = 0.0f, sb = 0.0f;
#pragma omp simd reduction(+ : sa)
            for (int64_t u = 0; u < i; ++u) sa += gi[u] * gp[u];
#pragma omp simd reduction(+ : sb)
            for (int64_t u = 0; u <= i; ++u) {
              sb += gi[u] * mi[u];
              dmi[u] += bi * gi[u];
            }
            dalpha[i] = sa;
            dbpos[i] = sb;
          }
          // m(i, s) = exp(M_i - M_s): dM_i = rowsum_i - colsum_i of dm * m (the diagonal cancels)
          for (int64_t i = 0; i <= c; ++i) dMc[i] = 0.0f;
          for (int64_t i = 1; i <= c; ++i) {
            const float* mi = ch.m.data() + i * D;
            const float* dmi = dm.data() + i * D;
            float row = 0.0f;
#pragma omp simd reduction(+ : row)
            for (int64_t u = 0; u < i; ++u) {
              const float x = dmi[u] * mi[u];
              row += x;
              dMc[u] -= x;
            }
            dMc[i] += row;
          }
          // a0_i = exp(A_i): dA_i = da0_i a0_i; log_alpha_l reaches A_i for i >= l and g through
          // alpha_l; log_mu_l reaches M_i for i >= l
          double run_a = 0.0, run_m = 0.0;
          for (int64_t i = c; i >= 1; --i) {
            run_a += static_cast<double>(da0[i] * ch.a0[i]);
            run_m += static_cast<double>(dMc[i]);
            dsu[i - 1] = static_cast<float>(run_a) + dalpha[i] * ch.alpha[i];
            dsu[HC + i - 1] = static_cast<float>(run_m);
            dsu[2 * HC + i - 1] = dbpos[i];
          }
        }
        scatter(dQB.data(), H, K, t0, c, h0, h1, C, dqp);
        scatter(dKB.data(), H, K, t0, c, h0, h1, C, dkp);
        scatter(dPB.data(), H, K, t0, c, h0, h1, C, dpp);
        scatter(dVB.data(), H, V, t0, c, h0, h1, C, dvp);
        for (int64_t x = 0; x < 4; ++x) {
          scatter(dsb.data() + x * HC, H, 1, t0, c, h0, h1, C, dscalars[x]);
        }
      }
      for (int64_t h = h0; h < h1; ++h) pair_out(dZall.data() + h * 2 * KV, N, H, n, h, KV, dZ0p);
    }
  });
  return {dq, dk, dv, dp, dla, dlm, dbeta, deta, dZ0};
}

namespace {

// The fake (shape-only) kernels: the Meta kernels of both ops.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> momentum_forward_meta(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& p,
    const at::Tensor& la, const at::Tensor& lm, const at::Tensor& beta, const at::Tensor& eta,
    const at::Tensor& Z0, at::IntArrayRef bounds, double scale, int64_t C, bool keep) {
  check_input(kMomentumForward, "v", v, 3, c10::kMeta);
  const MomentumShape s = momentum_shape(kMomentumForward, q, k, p, la, lm, beta, eta, v.size(2),
                                         bounds, C, c10::kMeta);
  check_rows(kMomentumForward, "v", v, s, c10::kMeta);
  check_pair(kMomentumForward, "Z0", Z0, s, c10::kMeta);
  const auto opts = q.options();
  return {at::empty({s.TT, s.H, s.V}, opts), at::empty({2, s.N, s.H, s.K, s.V}, opts),
          at::empty({keep ? s.chunks : 0, s.H, 2 * s.K, s.V}, opts),
          at::empty({keep ? s.TT : 0, s.H, s.V}, opts)};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor,
           at::Tensor, at::Tensor>
momentum_backward_meta(const at::Tensor& q, const at::Tensor& k, const at::Tensor& p,
                       const at::Tensor& la, const at::Tensor& lm, const at::Tensor& beta,
                       const at::Tensor& eta, const at::Tensor& states, const at::Tensor& errors,
                       const at::Tensor& d_o, const std::optional<at::Tensor>& dZ,
                       at::IntArrayRef bounds, double scale, int64_t C) {
  check_input(kMomentumBackward, "errors", errors, 3, c10::kMeta);
  const MomentumShape s = momentum_shape(kMomentumBackward, q, k, p, la, lm, beta, eta,
                                         errors.size(2), bounds, C, c10::kMeta);
  const auto opts = q.options();
  const auto rows = [&](int64_t d) { return at::empty({s.TT, s.H, d}, opts); };
  const auto scalars = [&]() { return at::empty({s.TT, s.H}, opts); };
  return {rows(s.K),  rows(s.K),  rows(s.V),  rows(s.K), scalars(),
          scalars(), scalars(), scalars(), at::empty({2, s.N, s.H, s.K, s.V}, opts)};
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(linattn_native, m) {
  m.def(
      "momentum_forward(Tensor q, Tensor k, Tensor v, Tensor p, Tensor log_alpha, Tensor log_mu,"
      " Tensor beta, Tensor eta, Tensor Z0, int[] bounds, float scale, int C, bool keep)"
      " -> (Tensor, Tensor, Tensor, Tensor)");
  m.def(
      "momentum_backward(Tensor q, Tensor k, Tensor p, Tensor log_alpha, Tensor log_mu,"
      " Tensor beta, Tensor eta, Tensor states, Tensor errors, Tensor d_o, Tensor? dZ,"
      " int[] bounds, float scale, int C)"
      " -> (Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(linattn_native, CPU, m) {
  m.impl("momentum_forward", &momentum_forward);
  m.impl("momentum_backward", &momentum_backward);
}

TORCH_LIBRARY_IMPL(linattn_native, Meta, m) {
  m.impl("momentum_forward", &momentum_forward_meta);
  m.impl("momentum_backward", &momentum_backward_meta);
}

}  // namespace linattn_native
