// The backward pass of the chunk form (spec section 8 differentiated), one member function of
// ``ChunkBackward`` per step, in the order they run for each chunk:
//
//   gates                 G, exp(G), exp(G_c - G), D; Qd, Ke, Kd (terms.h); Gamma (one gate
//                         per token)
//   scores                A_qk and the delta rule's A_kk (terms.h, as in the forward pass)
//   pseudo_values         L, the UT transform's [W | U0], U = U0 - W S (terms.h; else U = v)
//   output_gradients      dU, dA, dQd, dKe from dO and dS'
//   read_gate_gradients   dG from Qd, G_c's share from D, Ke's share (dGe)
//   qk_score_gradients    A_qk's two factors: dQ, dK and the gates' share
//   state_gradient        dS = D dS' + Qd^T dO - W^T dU
//   ut_transform_backward dR_v, dR_k, dT; dv, dbeta, beta's share of dk
//   kk_score_gradients    A_kk's two factors: dK and the gates' share
//   gate_gradients        dg: the reversed cumulative sum of dG, Ke's prefix sum
//
// Every mechanism of DESIGN.md's table, chunk by chunk from
// the last, from the states the forward pass saved: without decay (kg = 0: linear attention and,
// with beta, the delta rule: every gate below is 1 and dg is not formed), one log-gate per token
// (kg = 1: scalar decay, Mamba-2 style, and with beta Gated DeltaNet) or one per channel (kg = K:
// GLA and, with beta, KDA). Recomputed per chunk,
// with G [c, kg] the cumulative log-gates: Qd = scale q exp(G), Ke = k exp(G_c - G),
// Kd = k exp(G), D = Diag(exp G_c) on the state's rows; A_qk = scale decayed(Q K^T) (j <= i);
// delta rule: A_kk = decayed(K K^T) (j < i), (I + diag(beta) A_kk) [W | U0] = diag(beta) [Kd | V],
// U = U0 - W S (else U = V). Then, with dS' the gradient of the state leaving the chunk:
//
//   dU = A_qk^T dO + Ke dS'       dA = mask(dO U^T)       dQd = dO S^T       dKe = U dS'^T
//   dQ = scale exp(G) dQd + dQ_A            dK = exp(G_c - G) dKe + dK_A
//   dS = D dS' + Qd^T dO - W^T dU
//   delta rule: dR_v = T^{-T} dU, dR_k = -dR_v S^T, dT = -(dR_k W^T + dR_v U0^T) (j < i),
//               dV = beta dR_v, dK += beta exp(G) dR_k + dK_L with dL = diag(beta) dT,
//               dbeta = rows of (dT * A_kk) + dR_k . Kd + dR_v . V
//
// where dQ_A, dK_A (dK_L) are the gradients of A_qk's (A_kk's) two factors: for kg = 1, with
// Gamma[i, j] = exp(G_i - G_j), (dA * Gamma) K and (dA * Gamma)^T Q times scale; for kg = K, block
// by block as ``channel_diagonal`` forms the product. The gates: dG = dQd * Qd (+ beta dR_k * Kd)
// row by row; each product's share off its diagonal (X * dX - Y * dY for its factors X, Y; for
// kg = 1 the row sums of dM * M less its column sums, ``product_gate_gradient``); and
// D <dS', S> (row by row of S) for G_c. With kg = 1 each term is summed over the channels. dg is
// the reversed cumulative sum of dG inside the chunk (G_i = g_1 + ... + g_i) plus Ke's share,
// sum_{i < t} dKe_i * Ke_i. Terms without decay (the products' diagonals, Ke_c) never enter dg:
// their shares cancel exactly, and their rounding would swamp the small dg of steep gates.
//

#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>

#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

#include "blas.h"
#include "checks.h"
#include "gates.h"
#include "kernels.h"
#include "layout.h"
#include "products.h"
#include "schedule.h"
#include "terms.h"
#include "triangular.h"

namespace linattn_native {
namespace {

constexpr const char* kBackwardOp = "linattn_native.chunk_backward";

// Step 4's dU = A_qk^T dO + Ke dS' (dU [c, V], row stride lddu; for the additive rule, dv).
void value_gradient(int c, int64_t K, int64_t V, const float* Aqk, int64_t C, const float* dO,
                    int64_t lddo, const float* Ke, int64_t ldke, const float* dS, float* dU,
                    int64_t lddu) {
  gemm(true, false, c, V, c, 1.0f, Aqk, C, dO, lddo, 0.0f, dU, lddu);
  gemm(false, false, c, V, K, 1.0f, Ke, ldke, dS, V, 1.0f, dU, lddu);
}

// Step 7: dS = D dS' + Qd^T dO - W^T dU in place of dS' [K, V] (D nullptr: no decay; W nullptr:
// the additive rule; Qd = q_alpha Qr; W [c, K] with row stride ldx).
void state_gradient_step(int c, int64_t kg, int64_t K, int64_t V, const float* D,
                         float q_alpha, const float* Qr, int64_t ldqr, const float* dO,
                         int64_t lddo, const float* W, int64_t ldx, const float* dU, float* dS) {
  const int Vi = static_cast<int>(V);
  for (int64_t ch = 0; D && ch < K; ++ch) {
    float* row = dS + ch * V;
    const float d = D[kg == 1 ? 0 : ch];
#pragma omp simd
    for (int j = 0; j < Vi; ++j) row[j] *= d;
  }
  gemm(true, false, K, V, c, q_alpha, Qr, ldqr, dO, lddo, 1.0f, dS, V);
  if (W) gemm(true, false, K, V, c, -1.0f, W, ldx, dU, V, 1.0f, dS, V);
}

// The tensors of a backward call, checked, their rows where the BLAS reads them, and the
// gradients it writes.
struct BackwardTensors {
  bool delta;  // the rule (the mechanism's; beta and dbeta are defined for the delta rule only)
  at::Tensor q, k, v, beta, g, d_o, states, dq, dk, dv, dg, dbeta, dS;
};

// One thread's scratch for the backward pass of one chunk of one head (64-bit sizes), and the
// chunk's rows. ``load`` points it at chunk n of head p; ``run`` takes every step in order.
struct ChunkBackward {
  const BackwardTensors& t;
  const int64_t K, V, C, P, HV, G_, T, kg, kr;
  const bool delta, gated, channel;
  const float scale;
  const int Ki, Vi;
  const int64_t ldx, CC, CK, CG;
  Scratch w;
  std::vector<float> Gam, Aqk, Akk, L, dA, X, U, dU, dRk, Qd, Ke, Kd, dQd, dKe, dXm, dYm, eG,
      eEnd, dG, dGe, dG_diag, Dv, dG_end;
  const Gates G;  // [c, kr] each

  // The chunk: c tokens from t0 of value head (b, h), which reads q/k head (b, hq); the rows of
  // every input and gradient (dq, dk per value head: summed over each group at the end).
  int c = 0;
  int64_t b = 0, h = 0, hq = 0, t0 = 0;
  const float *Q = nullptr, *Kc = nullptr, *Vc = nullptr, *dO = nullptr;
  float *dQ = nullptr, *dK = nullptr, *dV = nullptr;
  int64_t ldq = 0, ldk = 0, ldv = 0, lddo = 0, lddq = 0, lddk = 0, lddv = 0;
  const float* S = nullptr;  // the state entering the chunk
  float* dSh = nullptr;      // dS': the gradient of the state leaving it (becomes dS)
  const float *bc = nullptr, *gc = nullptr;
  int64_t sb = 0, sg = 0, sdb = 0, lddg = 0;
  float *dB = nullptr, *dGt = nullptr;
  // The rows read by the products: Qd = qr_alpha Qr, Ke, Kd (the inputs without decay); U.
  const float *Qr = nullptr, *Ker = nullptr, *Kdr = nullptr, *Uc = nullptr;
  float qr_alpha = 1.0f;
  int64_t ldqr = 0, ldke = 0, ldkd = 0, ldu = 0;
  float* dUp = nullptr;  // dU; the additive rule's dU is dV
  int64_t lddu = 0;

  ChunkBackward(const BackwardTensors& tensors, const Sizes& sz, int64_t gates, float s)
      : t(tensors), K(sz.K), V(sz.V), C(sz.C), P(sz.P), HV(sz.HV), G_(sz.G), T(sz.T), kg(gates),
        kr(std::max<int64_t>(gates, 1)), delta(tensors.delta), gated(gates > 0),
        channel(gates > 1), scale(s), Ki(static_cast<int>(K)), Vi(static_cast<int>(V)),
        ldx(K + V), CC(C * C), CK(C * K), CG(C * kr), w(C, K, V), Gam(kg == 1 ? CC : 0),
        Aqk(CC), Akk(CC), L(CC), dA(CC), X(C * ldx), U(C * V), dU(C * V), dRk(CK), Qd(CK),
        Ke(CK), Kd(CK), dQd(CK), dKe(CK), dXm(CK), dYm(CK), eG(CG), eEnd(CG), dG(CG), dGe(CG),
        dG_diag(C), Dv(kr), dG_end(kr), G{w.G.data(), w.G.data() + C * K} {}

  template <typename F>
  F* at_row(const at::Tensor& x, F* base) const {
    return chunk_rows(x, base, b, h, t0);
  }

  template <typename F>
  F* at_qk_row(const at::Tensor& x, F* base) const {  // q and k: the q/k head, in place
    return chunk_rows(x, base, b, hq, t0);
  }

  // Point at chunk n of head p.
  void load(int64_t n, int64_t p) {
    b = p / HV, h = p % HV, hq = h / G_, t0 = n * C;
    c = static_cast<int>(std::min<int64_t>(C, T - t0));
    Q = at_qk_row(t.q, t.q.data_ptr<float>()), Kc = at_qk_row(t.k, t.k.data_ptr<float>());
    Vc = at_row(t.v, t.v.data_ptr<float>()), dO = at_row(t.d_o, t.d_o.data_ptr<float>());
    dQ = at_row(t.dq, t.dq.data_ptr<float>()), dK = at_row(t.dk, t.dk.data_ptr<float>());
    dV = at_row(t.dv, t.dv.data_ptr<float>());
    ldq = t.q.stride(2), ldk = t.k.stride(2), ldv = t.v.stride(2), lddo = t.d_o.stride(2);
    lddq = t.dq.stride(2), lddk = t.dk.stride(2), lddv = t.dv.stride(2);
    S = t.states.data_ptr<float>() + (n * P + p) * K * V;
    dSh = t.dS.data_ptr<float>() + p * K * V;
    if (delta) {
      bc = at_row(t.beta, t.beta.data_ptr<float>()), sb = t.beta.stride(2);
      dB = at_row(t.dbeta, t.dbeta.data_ptr<float>()), sdb = t.dbeta.stride(2);
    }
    if (gated) {
      gc = at_row(t.g, t.g.data_ptr<float>()), sg = t.g.stride(2);
      dGt = at_row(t.dg, t.dg.data_ptr<float>()), lddg = t.dg.stride(2);
    }
    Uc = Vc, ldu = ldv;
    dUp = delta ? dU.data() : dV;
    lddu = delta ? V : lddv;
  }

  void run() {
    gates();
    scores();
    pseudo_values();
    output_gradients();
    read_gate_gradients();
    qk_score_gradients();
    state_gradient();
    if (delta) {
      ut_transform_backward();
      kk_score_gradients();
    }
    gate_gradients();
  }

  // The chunk's rows and where its terms (terms.h) are written.
  ChunkRows rows() const { return {Q, Kc, Vc, ldq, ldk, ldv, bc, sb, gc, sg, c}; }
  Terms terms() {
    return {G,         Qd.data(),  Ke.data(),  delta ? Kd.data() : nullptr,
            eG.data(), eEnd.data(), Dv.data(), Aqk.data(),
            Akk.data(), L.data(),  X.data()};
  }

  // 1. Gates (terms.h's ``chunk_gates``): G, exp(G), exp(G_c - G), D; Qd, Ke, Kd; and Gamma
  //    for one gate per token. Without decay these rows are the inputs themselves.
  void gates() {
    const GatedRows r = chunk_gates(rows(), kg, K, scale, w.zeros.data(), terms());
    Qr = r.Qread, ldqr = r.ldqr, qr_alpha = r.q_alpha;
    Ker = r.Kend, ldke = r.ldke, Kdr = r.Kdec, ldkd = r.ldkd;
    if (!gated || channel) return;
    for (int i = 0; i < c; ++i) {
      float* row = Gam.data() + static_cast<int64_t>(i) * C;
      const float G_i = G.hi[i], L_i = G.lo[i];
#pragma omp simd
      for (int j = 0; j < c; ++j) row[j] = decay(G_i, L_i, G.hi[j], G.lo[j]);
      for (int j = i + 1; j < c; ++j) row[j] = 0.0f;
    }
  }

  // 2. The decayed products A_qk (j <= i) and A_kk (j < i): terms.h's ``chunk_scores``.
  void scores() { chunk_scores(rows(), delta, kg, K, scale, G, C, Aqk.data(), Akk.data(), w); }

  // 3. Pseudo-values: U = V, or terms.h's UT transform and U = U0 - W S.
  void pseudo_values() {
    if (!delta) return;
    const GatedRows r{Qr, ldqr, qr_alpha, Ker, ldke, Kdr, ldkd};
    ut_transform(rows(), r, K, V, C, Akk.data(), L.data(), X.data());
    linattn_native::pseudo_values(c, K, V, X.data(), S, U.data(), V);
    Uc = U.data(), ldu = V;
  }

  // 4. dU = A_qk^T dO + Ke dS';  dA = mask(dO U^T);  dQd = dO S^T;  dKe = U dS'^T. For the
  //    additive rule dU is dV; without decay dQd and dKe go straight into dQ (scaled), dK.
  void output_gradients() {
    value_gradient(c, K, V, Aqk.data(), C, dO, lddo, Ker, ldke, dSh, dUp, lddu);
    gemm(false, true, c, c, Vi, 1.0f, dO, lddo, Uc, ldu, 0.0f, dA.data(), C);
    if (gated) {
      gemm(false, true, c, Ki, Vi, 1.0f, dO, lddo, S, V, 0.0f, dQd.data(), K);
      gemm(false, true, c, Ki, Vi, 1.0f, Uc, ldu, dSh, V, 0.0f, dKe.data(), K);
    } else {
      gemm(false, true, c, Ki, Vi, scale, dO, lddo, S, V, 0.0f, dQ, lddq);
      gemm(false, true, c, Ki, Vi, 1.0f, Uc, ldu, dSh, V, 0.0f, dK, lddk);
    }
    for (int i = 0; i < c; ++i) {
      float* dAi = dA.data() + static_cast<int64_t>(i) * C;
      for (int j = i + 1; j < c; ++j) dAi[j] = 0.0f;
    }
  }

  // 5. dG from Qd; G_c's share from D; Ke's share apart, in dGe: Ke_i = k_i exp(G_c - G_i)
  //    depends on the gates after i only, and is added to dg as a prefix sum (step 9), not
  //    as G_c's share less G_i's, whose rounding would be that of the undecayed Ke_c.
  void read_gate_gradients() {
    if (gated) {
      std::fill(dG_end.begin(), dG_end.end(), 0.0f);
      for (int ch = 0; ch < Ki; ++ch) {
        const float *Sr = S + ch * V, *dSr = dSh + ch * V;
        float sS = 0.0f;
#pragma omp simd reduction(+ : sS)
        for (int j = 0; j < Vi; ++j) sS += dSr[j] * Sr[j];
        dG_end[channel ? ch : 0] += Dv[channel ? ch : 0] * sS;
      }
      for (int i = 0; i < c; ++i) {
        const float *a = dQd.data() + i * K, *x = Qd.data() + i * K;
        const float *e = dKe.data() + i * K, *y = Ke.data() + i * K;
        float *dGi = dG.data() + i * kg, *dGei = dGe.data() + i * kg;
        if (!channel) {
          float sq = 0.0f, sk = 0.0f;
#pragma omp simd reduction(+ : sq, sk)
          for (int ch = 0; ch < Ki; ++ch) {
            sq += a[ch] * x[ch];
            sk += e[ch] * y[ch];
          }
          dGi[0] = sq;
          dGei[0] = sk;
        } else {
#pragma omp simd
          for (int ch = 0; ch < Ki; ++ch) {
            dGi[ch] = a[ch] * x[ch];
            dGei[ch] = e[ch] * y[ch];
          }
        }
      }
    }
  }

  // 6. A_qk's factors: dQ = scale exp(G) dQd + dQ_A, dK = exp(G_c - G) dKe + dK_A, and
  //    the gates' share.
  void qk_score_gradients() {
    if (!channel) {
      for (int i = 0; gated && i < c; ++i) {
        const float a = scale * eG[i], e = eEnd[i];
        const float *x = dQd.data() + i * K, *y = dKe.data() + i * K;
        float *dq_i = dQ + i * lddq, *dk_i = dK + i * lddk;
#pragma omp simd
        for (int ch = 0; ch < Ki; ++ch) {
          dq_i[ch] = a * x[ch];
          dk_i[ch] = e * y[ch];
        }
      }
      if (gated) {
        product_gate_gradient(dA.data(), Aqk.data(), C, c, dG.data());
        for (int64_t e = 0; e < static_cast<int64_t>(c) * C; ++e) dA[e] *= Gam[e];
      }
      gemm(false, false, c, Ki, c, scale, dA.data(), C, Kc, ldk, 1.0f, dQ, lddq);
      gemm(true, false, c, Ki, c, scale, dA.data(), C, Q, ldq, 1.0f, dK, lddk);
    } else {
      // The diagonal of dA (no decay) is taken out of the blocked backward and added to dQ
      // and dK alone: its shares of q dX and k dY cancel, and their rounding would reach dg.
      for (int i = 0; i < c; ++i) {
        float* dAii = dA.data() + static_cast<int64_t>(i) * (C + 1);
        dG_diag[i] = scale * *dAii;
        *dAii = 0.0f;
      }
      std::fill(dXm.begin(), dXm.begin() + c * K, 0.0f);
      std::fill(dYm.begin(), dYm.begin() + c * K, 0.0f);
      channel_diagonal_backward(Q, ldq, Kc, ldk, G, Ki, 0, c, scale, dA.data(), C,
                                dXm.data(), dYm.data(), w);
      for (int i = 0; i < c; ++i) {
        const float *qi = Q + i * ldq, *ki = Kc + i * ldk;
        const float *dx = dXm.data() + i * K, *dy = dYm.data() + i * K;
        const float *a = dQd.data() + i * K, *e = dKe.data() + i * K;
        const float *eg = eG.data() + i * K, *ee = eEnd.data() + i * K;
        float *dq_i = dQ + i * lddq, *dk_i = dK + i * lddk, *dGi = dG.data() + i * K;
        const float d = dG_diag[i];
#pragma omp simd
        for (int ch = 0; ch < Ki; ++ch) {
          dq_i[ch] = scale * eg[ch] * a[ch] + dx[ch] + d * ki[ch];
          dk_i[ch] = ee[ch] * e[ch] + dy[ch] + d * qi[ch];
          dGi[ch] += qi[ch] * dx[ch] - ki[ch] * dy[ch];
        }
      }
    }
  }

  // 7. dS = D dS' + Qd^T dO - W^T dU (dS' is no longer needed after this).
  void state_gradient() {
    state_gradient_step(c, kg, K, V, gated ? Dv.data() : nullptr, qr_alpha, Qr, ldqr, dO, lddo,
                        delta ? X.data() : nullptr, ldx, dU.data(), dSh);
  }

  // 8. The UT transform: dR_v = T^{-T} dU (in dU), dR_k = -dR_v S^T, dT (in dA); dv, dbeta and
  //    beta's share of dk.
  void ut_transform_backward() {
    const float* W = X.data();
    const float* U0 = X.data() + K;
    unit_lower_solve_transposed(c, Vi, L.data(), C, dU.data(), V);
    const float* dRv = dU.data();
    gemm(false, true, c, Ki, Vi, -1.0f, dRv, V, S, V, 0.0f, dRk.data(), K);
    gemm(false, true, c, c, Ki, -1.0f, dRk.data(), K, W, ldx, 0.0f, dA.data(), C);
    gemm(false, true, c, c, Vi, -1.0f, dRv, V, U0, ldx, 1.0f, dA.data(), C);
    for (int i = 0; i < c; ++i) {
      const float bi = bc[i * sb];
      float* dTi = dA.data() + static_cast<int64_t>(i) * C;
      const float* Ai = Akk.data() + static_cast<int64_t>(i) * C;
      const float *kd = Kdr + i * ldkd, *vi = Vc + i * ldv, *eg = eG.data() + i * kr;
      const float *rk = dRk.data() + i * K, *rv = dRv + i * V;
      float *dk_i = dK + i * lddk, *dv_i = dV + i * lddv, *dGi = dG.data() + i * kr;
      float db = 0.0f, sk = 0.0f;
#pragma omp simd reduction(+ : db)
      for (int j = 0; j < i; ++j) db += dTi[j] * Ai[j];
      if (!channel) {
        const float a = gated ? bi * eg[0] : bi;
#pragma omp simd reduction(+ : sk)
        for (int ch = 0; ch < Ki; ++ch) {
          sk += rk[ch] * kd[ch];
          dk_i[ch] += a * rk[ch];
        }
        if (gated) dGi[0] += bi * sk;
      } else {
#pragma omp simd reduction(+ : sk)
        for (int ch = 0; ch < Ki; ++ch) {
          const float r = rk[ch] * kd[ch];
          sk += r;
          dGi[ch] += bi * r;
          dk_i[ch] += bi * eg[ch] * rk[ch];
        }
      }
#pragma omp simd reduction(+ : db)
      for (int ch = 0; ch < Vi; ++ch) {
        db += rv[ch] * vi[ch];
        dv_i[ch] = bi * rv[ch];
      }
      dB[i * sdb] = db + sk;
#pragma omp simd
      for (int j = 0; j < i; ++j) dTi[j] *= bi;  // dL = diag(beta) dT
      for (int j = i; j < c; ++j) dTi[j] = 0.0f;
    }
  }

  // 8b. A_kk's two factors (both k): dK += dK_L, and the gates' share.
  void kk_score_gradients() {
    if (!channel) {
      if (gated) {
        product_gate_gradient(dA.data(), Akk.data(), C, c, dG.data());
        for (int64_t e = 0; e < static_cast<int64_t>(c) * C; ++e) dA[e] *= Gam[e];
      }
      gemm(false, false, c, Ki, c, 1.0f, dA.data(), C, Kc, ldk, 1.0f, dK, lddk);
      gemm(true, false, c, Ki, c, 1.0f, dA.data(), C, Kc, ldk, 1.0f, dK, lddk);
    } else {
      std::fill(dXm.begin(), dXm.begin() + c * K, 0.0f);
      std::fill(dYm.begin(), dYm.begin() + c * K, 0.0f);
      channel_diagonal_backward(Kc, ldk, Kc, ldk, G, Ki, 0, c, 1.0f, dA.data(), C,
                                dXm.data(), dYm.data(), w);
      for (int i = 0; i < c; ++i) {
        const float* ki = Kc + i * ldk;
        const float *dx = dXm.data() + i * K, *dy = dYm.data() + i * K;
        float *dk_i = dK + i * lddk, *dGi = dG.data() + i * K;
#pragma omp simd
        for (int ch = 0; ch < Ki; ++ch) {
          dk_i[ch] += dx[ch] + dy[ch];
          dGi[ch] += ki[ch] * (dx[ch] - dy[ch]);
        }
      }
    }
  }

  // 9. dg: the reversed cumulative sum of dG inside the chunk, G_c's share at its end.
  //    Ke's share (dGe) is the prefix sum sum_{i < t} dGe_i: Ke_i depends on g_t for t > i.
  //    A floored gate (g <= kGateFloor: its decay is exactly 0) has the floor's gradient, 0.
  void gate_gradients() {
    if (gated) {
      float* last = dG.data() + (c - 1) * kg;
      for (int ch = 0; ch < kg; ++ch) last[ch] += dG_end[ch];
      for (int i = c - 2; i >= 0; --i) {  // dG_i <- sum_{l >= i} dG_l
        float* dGi = dG.data() + i * kg;
#pragma omp simd
        for (int ch = 0; ch < kg; ++ch) dGi[ch] += dGi[ch + kg];
      }
      for (int i = 1; i < c; ++i) {  // dGe_i <- sum_{l <= i} dGe_l
        float* dGei = dGe.data() + i * kg;
#pragma omp simd
        for (int ch = 0; ch < kg; ++ch) dGei[ch] = dGei[ch] + dGei[ch - kg];
      }
      for (int i = c - 1; i >= 0; --i) {
        float* dGi = dG.data() + i * kg;
        if (i > 0) {
          const float* before = dGe.data() + (i - 1) * kg;  // sum_{l < i}
#pragma omp simd
          for (int ch = 0; ch < kg; ++ch) dGi[ch] += before[ch];
        }
        floored_gradient_row(dGi, gc + i * sg, kg, dGt + i * lddg, kGateFloor);
      }
    }
  }
};

// The split schedule (schedule.h) of the backward pass: 1. for every (chunk, head) pair, the
// terms the state-gradient chain reads (Qd, Ke, D, A_qk, W: steps 1-3) into a slot of ``slots``;
// 2. per head, from the last chunk, the chain dU = A_qk^T dO + Ke dS', dS = D dS' + Qd^T dO -
// W^T dU, saving each chunk's dS'; 3. every step of every pair from its saved dS' (steps 1-3
// computed again: the chain's slots hold only what it reads).
void backward_split(const BackwardTensors& t, const Sizes& sz, int64_t kg, float scale) {
  const int64_t K = sz.K, V = sz.V, C = sz.C, P = sz.P, N = sz.N, KV = K * V;
  const bool delta = t.delta, gated = kg > 0;
  // Slot n P + p: Qd, Ke [C, K] and D [kg] (with decay), A_qk [C, C], W [C, K] (delta rule),
  // each at a 64-byte boundary (``padded``, layout.h).
  const int64_t CKp = padded(C * K), CCp = padded(C * C);
  const int64_t gate_size = gated ? 2 * CKp + padded(kg) : 0;
  const int64_t size = gate_size + CCp + (delta ? CKp : 0);
  const at::Tensor slots = fresh({N * P, size}, t.q.options());
  const at::Tensor dS_in = fresh({N, P, K, V}, t.q.options());  // dS' of every chunk
  float *slotp = slots.data_ptr<float>(), *dSp = dS_in.data_ptr<float>();
  parallel_tasks(N * P, [&](int64_t lo, int64_t hi) {
    ChunkBackward chunk(t, sz, kg, scale);
    for (int64_t s = lo; s < hi; ++s) {
      chunk.load(s / P, s % P);
      chunk.gates();
      chunk.scores();
      chunk.pseudo_values();
      const int64_t c = chunk.c;
      float* slot = slotp + s * size;
      if (gated) {
        std::memcpy(slot, chunk.Qd.data(), sizeof(float) * c * K);
        std::memcpy(slot + CKp, chunk.Ke.data(), sizeof(float) * c * K);
        std::memcpy(slot + 2 * CKp, chunk.Dv.data(), sizeof(float) * kg);
      }
      std::memcpy(slot + gate_size, chunk.Aqk.data(), sizeof(float) * c * C);
      for (int64_t i = 0; delta && i < c; ++i) {
        std::memcpy(slot + gate_size + CCp + i * K, chunk.X.data() + i * chunk.ldx,
                    sizeof(float) * K);
      }
    }
  });
  parallel_tasks(P, [&](int64_t lo, int64_t hi) {
    ChunkBackward chunk(t, sz, kg, scale);
    for (int64_t p = lo; p < hi; ++p) {
      for (int64_t n = N - 1; n >= 0; --n) {
        chunk.load(n, p);
        const int64_t s = n * P + p;
        std::memcpy(dSp + s * KV, chunk.dSh, sizeof(float) * KV);
        const float* slot = slotp + s * size;
        const float* Qr = gated ? slot : chunk.Q;
        const float* Ke = gated ? slot + CKp : chunk.Kc;
        const float* W = delta ? slot + gate_size + CCp : nullptr;
        if (delta) {
          value_gradient(chunk.c, K, V, slot + gate_size, C, chunk.dO, chunk.lddo, Ke,
                         gated ? K : chunk.ldk, chunk.dSh, chunk.dU.data(), V);
        }
        state_gradient_step(chunk.c, kg, K, V, gated ? slot + 2 * CKp : nullptr,
                            gated ? 1.0f : scale, Qr, gated ? K : chunk.ldq, chunk.dO,
                            chunk.lddo, W, K, chunk.dU.data(), chunk.dSh);
      }
    }
  });
  parallel_tasks(N * P, [&](int64_t lo, int64_t hi) {
    ChunkBackward chunk(t, sz, kg, scale);
    for (int64_t s = lo; s < hi; ++s) {
      chunk.load(s / P, s % P);
      chunk.dSh = dSp + s * KV;  // its own copy of dS', which run() turns into dS
      chunk.run();
    }
  });
}

}  // namespace

// dq or dk per value head, d [B, HV, T, K] (a view of [B, T, HV, K]), summed over each group
// of G value heads into its q/k head: [B, H, T, K] (a view of [B, T, H, K]); d itself for G = 1.
static at::Tensor group_sum(const at::Tensor& d, const Sizes& sz) {
  if (sz.G == 1) return d;
  // [B, HV, T, K] -> [B, T, HV, K] -> [B, T, H, G, K], summed over G -> [B, T, H, K]
  return d.transpose(1, 2).view({sz.B, sz.T, sz.H, sz.G, sz.K}).sum(3).transpose(1, 2);
}

// The checks of a ``chunk_backward`` call: its sizes and the gate width kg.
std::pair<Sizes, int64_t> backward_sizes(const Mechanism& mech, const at::Tensor& q,
                                         const at::Tensor& k, const at::Tensor& v,
                                         const std::optional<at::Tensor>& beta,
                                         const std::optional<at::Tensor>& g,
                                         const at::Tensor& states, const at::Tensor& d_o,
                                         const at::Tensor& dS_final, double scale, int64_t C) {
  const Checks check{kBackwardOp};
  const Sizes sz(check, q, k, v, C);
  const int64_t B = sz.B, HV = sz.HV, T = sz.T, K = sz.K, V = sz.V;
  const int64_t kg = check.mechanism_inputs(mech, beta, g, B, HV, T, K);
  check.shape("states", states, {sz.N, sz.P, K, V}, "[ceil(T / C), B HV, K, V]");
  check.shape("d_o", d_o, {B, HV, T, V}, "[B, HV, T, V]");
  check.shape("dS_final", dS_final, {B, HV, K, V}, "[B, HV, K, V]");
  checked_scale(check, scale);
  return {sz, kg};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> chunk_backward(
    const at::Tensor& q_in, const at::Tensor& k_in, const at::Tensor& v_in,
    const std::optional<at::Tensor>& beta_opt, const std::optional<at::Tensor>& g_opt,
    const at::Tensor& states_in, const at::Tensor& d_o_in, const at::Tensor& dS_final,
    double scale_d, int64_t C64, c10::string_view rule, c10::string_view gate) {
  const Mechanism mech = parse_mechanism(kBackwardOp, rule, gate);
  const std::pair<Sizes, int64_t> checked = backward_sizes(
      mech, q_in, k_in, v_in, beta_opt, g_opt, states_in, d_o_in, dS_final, scale_d, C64);
  const Sizes& sz = checked.first;
  const int64_t kg = checked.second;
  const int64_t B = sz.B, HV = sz.HV, T = sz.T, K = sz.K, V = sz.V, P = sz.P, N = sz.N;
  const bool delta = mech.delta();
  const float scale = static_cast<float>(scale_d);
  BackwardTensors t;
  t.delta = delta;
  t.q = blas_rows(q_in), t.k = blas_rows(k_in), t.v = blas_rows(v_in);
  t.d_o = blas_rows(d_o_in), t.states = states_in.contiguous();
  const at::TensorOptions options = t.q.options();
  t.dq = fresh_public(sz, K, options), t.dk = fresh_public(sz, K, options);
  t.dv = fresh_public(sz, V, options);
  if (delta) {
    t.beta = *beta_opt;
    t.dbeta = at::empty({B, T, HV}, options).transpose(1, 2);
  }
  if (kg > 0) {
    t.g = unit_rows(*g_opt);
    t.dg = fresh_public(sz, kg, options);
  }
  t.dS = dS_final.reshape({P, K, V}).clone(at::MemoryFormat::Contiguous);

  if (split_schedule(P)) {
    backward_split(t, sz, kg, scale);
  } else {
    parallel_tasks(P, [&](int64_t lo, int64_t hi) {
      ChunkBackward chunk(t, sz, kg, scale);
      for (int64_t n = N - 1; n >= 0; --n) {
        for (int64_t p = lo; p < hi; ++p) {
          chunk.load(n, p);
          chunk.run();
        }
      }
    });
  }
  auto none = [&] { return at::empty({0}, options); };  // one each: outputs must not alias
  return {group_sum(t.dq, sz), group_sum(t.dk, sz), t.dv, delta ? t.dbeta : none(),
          kg > 0 ? t.dg : none(), t.dS.view({B, HV, K, V})};
}

}  // namespace linattn_native
