// The generalized delta rule (spec section 8 generalized): a diagonal-plus-low-rank
// transition, S_t = Diag(exp g_t) S_{t-1} + a_t (b_t^T S_{t-1}) + k_t v_t^T, read o = S^T q. b
// reads the state entering the token (not decayed by g_t); a is the direction it is written along.
// The beta slot carries the rule's inputs [a | b] [c, 2 K] per chunk (row stride sb).
//
// In a chunk of c tokens entering with S (G_t the inclusive cumulative log-gate, G_{t-1} its
// exclusive version, G_{-1} = 0), what the low-rank part reads, U_b [c, V] with row t = b_t^T
// S_{t-1}, unrolls to
//
//   (I - A_ba) U_b = A_bk V + Bd S,    Bd = b exp(G_{t-1}),
//   A_bk[t, s] = sum_ch b_t k_s exp(G_{t-1} - G_s) (s < t), A_ba likewise with a,
//
// one unit-lower-triangular solve: [W | U0] = (I - A_ba)^{-1} [-Bd | A_bk V], U_b = U0 - W S. The
// chunk writes along k and a: stacked (rules.h), Ke = [k; a] exp(G_c - G), U = [V; U_b] and
// A_q = [A_qk | A_qa] (A_qa[t, s] = scale sum_ch q_t a_s exp(G_t - G_s), s <= t), so that
// o = Qd S + A_q U and S <- D S + Ke^T U are the loop's steps. Every exponent is G_x - G_y with
// x >= y. A strict product with b's exclusive gate is the inclusive product of the rows b_{t+1}
// (b_next) and y_s about G_t, one row down: the products of products.h serve it.
// The block of b's products is kept negated, M_b = -[A_bk | A_ba] (t.Akk, row stride 2 C), so
// that its second half is the solve's L = -A_ba, and with no gate or one per head the products
// of q and of b are one matrix product each, with the stacked right factors Y = [k; a].

#include <limits>

#include "rules.h"

#include <algorithm>
#include <cstring>

#include "../blas.h"
#include "../triangular.h"

namespace linattn_native {
namespace {

// The rows of a in the rule's inputs [a | b] (b: K columns on).
Rows a_rows(const ChunkRows& x) { return {x.beta, x.sb}; }

// Where the stacked factors Y = [k; a] [2 c, K] are: with no gate they are the write rows Ke
// themselves (t.Ke, which ``stacked_keys`` then leaves as they are), else w.Y.
float* stacked_at(int64_t kg, const Terms& t, Scratch& w) { return kg == 0 ? t.Ke : w.Y.data(); }

// Y = [k; a] [2 c, K] into Y: the products' right factors, stacked.
void stacked_factors(const ChunkRows& x, int64_t K, float* Y) {
  for (int i = 0; i < x.c; ++i) {
    std::memcpy(Y + i * K, x.k + i * x.ldk, sizeof(float) * K);
    std::memcpy(Y + (x.c + i) * K, x.beta + i * x.sb, sizeof(float) * K);
  }
}

// No gate or one per token: A_q = scale decayed(q Y^T) and M_b = -decayed(b_next Y^T) one row
// down, each one product of the stacked Y (``stacked_factors``), then row i of A_q and row i + 1
// of M_b times the same decays exp(G_i - G_j) and masked alike (j <= i in each c-column block).
// The decays are the rows of Gamma (``token_decay_row``): quotients of the end decays where the
// chunk is one factored block (as the delta rule's products), no exponential formed again.
void stacked_products(const ChunkRows& x, int64_t kg, int64_t K, float scale, const Terms& t,
                      int64_t lda, Scratch& w) {
  const int c = x.c;
  float* Y = stacked_at(kg, t, w);
  stacked_factors(x, K, Y);
  lower_products(c, c, 2, K, scale, x.q, x.ldq, Y, K, t.A, lda);
  std::fill(t.Akk, t.Akk + 2 * c, 0.0f);
  lower_products(c - 1, c, 2, K, -1.0f, x.beta + x.sb + K, x.sb, Y, K, t.Akk + lda, lda);
  float* e = w.Ex.data();  // row i's decays
  const float* quotients = kg == 1 && end_factored(t.G, 1, c, t.eEnd) ? t.eEnd : nullptr;
  for (int i = 0; i < c; ++i) {
    float *rows[2] = {t.A + i * lda, i + 1 < c ? t.Akk + (i + 1) * lda : nullptr};
    if (kg == 1) token_decay_row(t.G, i, c, quotients, e);
    for (float* row : rows) {
      for (int block = 0; row && block < 2; ++block) {
        float* r = row + block * c;
        if (kg == 1) {
#pragma omp simd
          for (int j = 0; j <= i; ++j) r[j] *= e[j];
        }
        std::fill(r + i + 1, r + c, 0.0f);
      }
    }
  }
}

// The scores: A_q = [A_qk | A_qa] into t.A (inclusive) and M_b = -[A_bk | A_ba] into t.Akk
// (strict, b's gate exclusive), both of row stride 2 C.
void scores(const ChunkRows& x, int64_t kg, int64_t K, float scale, const Terms& t, int64_t C,
            Scratch& w) {
  const int64_t lda = 2 * C;
  if (kg <= 1) {
    stacked_products(x, kg, K, scale, t, lda, w);
    return;
  }
  // Per channel: the four products on shared decays, b_next = b_{i+1} copied with a zero last row
  // (its row c - 1 is factored with the others, its product row not written).
  const int c = x.c;
  float* b_next = w.Y.data();
  for (int i = 0; i + 1 < c; ++i) {
    std::memcpy(b_next + i * K, x.beta + (i + 1) * x.sb + K, sizeof(float) * K);
  }
  std::fill(b_next + (c - 1) * K, b_next + c * K, 0.0f);
  std::fill(t.Akk, t.Akk + 2 * c, 0.0f);  // M_b's row 0
  decayed_products_2x2({x.q, x.ldq}, {b_next, K}, c - 1, {x.k, x.ldk}, a_rows(x), t.G, c, K,
                       scale, -1.0f, t.A, t.Akk + lda, lda, w, t.eEnd);
}

// The stacked write rows Ke = [k; a] exp(G_c - G) [2 c, K] into t.Ke, r.Kend pointed at them
// (with no gate, ``scores`` put them there as the factors Y).
void stacked_keys(const ChunkRows& x, GatedRows& r, int64_t kg, int64_t K, const Terms& t) {
  const int c = x.c, Ki = static_cast<int>(K);
  for (int i = 0; i < c && kg > 0; ++i) {
    const float* ai = x.beta + i * x.sb;
    float* ar = t.Ke + (c + i) * K;
    if (kg == 1) {
      const float e = t.eEnd[i];
#pragma omp simd
      for (int ch = 0; ch < Ki; ++ch) ar[ch] = e * ai[ch];
    } else {
      const float* e = t.eEnd + i * K;
#pragma omp simd
      for (int ch = 0; ch < Ki; ++ch) ar[ch] = ai[ch] * e[ch];
    }
  }
  r.Kend = t.Ke, r.ldke = K;
}

// exp(G_{t-1}) of token t (one per channel, or one for all at e[0]; nullptr: 1, no gate or t = 0).
const float* exclusive_decay(const Terms& t, int64_t kg, int i) {
  return kg == 0 || i == 0 ? nullptr : t.eG + (i - 1) * kg;
}

// The solve's terms, into X [2 c, K + V] (rules.h): the U0 columns of rows 0..c-1 = V; rows
// c..2c-1 = [-Bd | A_bk V], then the solve (I + L) X = X with L = -A_ba (M_b's second half),
// X = [W | U0]; the stacked Ke.
void solve_terms(const ChunkRows& x, GatedRows& r, int64_t kg, int64_t K, int64_t V, int64_t C,
                 const Terms& t, Scratch&) {
  const int c = x.c, Ki = static_cast<int>(K);
  const int64_t ldx = K + V;
  float* X = t.X + c * ldx;  // [W | U0]
  stacked_keys(x, r, kg, K, t);
  for (int i = 0; i < c; ++i) {
    std::memcpy(t.X + i * ldx + K, x.v + i * x.ldv, sizeof(float) * V);
    const float *bi = x.beta + i * x.sb + K, *e = exclusive_decay(t, kg, i);
    float* wi = X + i * ldx;
    if (!e) {
#pragma omp simd
      for (int ch = 0; ch < Ki; ++ch) wi[ch] = -bi[ch];
    } else if (kg == 1) {
      const float d = -e[0];
#pragma omp simd
      for (int ch = 0; ch < Ki; ++ch) wi[ch] = d * bi[ch];
    } else {
#pragma omp simd
      for (int ch = 0; ch < Ki; ++ch) wi[ch] = -bi[ch] * e[ch];
    }
  }
  lower_times(c, c, 1, V, -1.0f, t.Akk, 2 * C, x.v, x.ldv, 0.0f, X + K, ldx);  // A_bk V
  unit_lower_solve(c, K + V, t.Akk + c, 2 * C, X, ldx);
}

// U = [V; U_b] [2 c, V] (row stride ldu) from X (rules.h) and S: U_b = U0 - W S.
void pseudo_values(int c, int64_t K, int64_t V, const float* X, const float* S, float* U,
                   int64_t ldu) {
  const int64_t ldx = K + V;
  if (U != X + K) {
    for (int i = 0; i < 2 * c; ++i) std::memcpy(U + i * ldu, X + i * ldx + K, sizeof(float) * V);
  }
  gemm(false, false, c, V, K, -1.0f, X + c * ldx, ldx, S, V, 1.0f, U + c * ldu, ldu);
}

// A factor of a product: its rows, and where its gradient's rows go (row stride ld).
struct Factor {
  Rows in;
  float* d;
  int64_t ld;
};

// The gradient of M = alpha decayed(x y^T) of n rows (j <= i; M and dM [n, n], row stride ld,
// dM masked alike and used up) into x.d, y.d and the gates' share into dG [n, kg], a term of dg
// itself (tg.dGx: row i of x and y at G_i; ``product_gate_gradient``, ``channel_gate_share``),
// as the loop's A_qk (backward.cpp, step 6): the diagonal (no decay) crosses no gate; per
// channel, the factors from the end decays where the chunk fits (as ``scores`` formed them).
void product_backward(Factor x, Factor y, int n, float alpha, const float* M, float* dM,
                      int64_t ld, const Dims& d, const Recomputed& rc, float* dG,
                      const TermGrads& tg, Scratch& w) {
  const int Ki = static_cast<int>(d.K);
  const int64_t K = d.K;
  if (n <= 0) return;
  if (!d.channel()) {
    if (d.gated()) {
      product_gate_gradient(dM, M, ld, n, dG);
      times_decays(n, dM, ld, rc.Gam, d.C);
    }
    lower_product_gradient(n, n, 1, Ki, alpha, dM, ld, x.in.p, x.in.ld, y.in.p, y.in.ld, x.d, x.ld,
                           1.0f, y.d, y.ld, 1.0f);
    return;
  }
  float* diag = tg.dG_diag;
  for (int i = 0; i < n; ++i) {
    diag[i] = alpha * dM[i * (ld + 1)];
    dM[i * (ld + 1)] = 0.0f;
  }
  std::fill(tg.dX, tg.dX + n * K, 0.0f);
  std::fill(tg.dY, tg.dY + n * K, 0.0f);
  // the end decays are the whole chunk's (about its last row): fit over all its c rows
  const float* end = end_factored(rc.t.G, K, d.c, rc.t.eEnd) ? rc.t.eEnd : nullptr;
  channel_product_backward(x.in, y.in, rc.t.G, K, n, alpha, dM, ld, tg.dX, tg.dY, w, end);
  channel_gate_share(x.in, y.in, rc.t.G, K, n, alpha, dM, ld, dG, w, end);
  for (int i = 0; i < n; ++i) {
    const float *xi = x.in.p + i * x.in.ld, *yi = y.in.p + i * y.in.ld;
    const float *dx = tg.dX + i * K, *dy = tg.dY + i * K, dd = diag[i];
    float *gx = x.d + i * x.ld, *gy = y.d + i * y.ld;
#pragma omp simd
    for (int ch = 0; ch < Ki; ++ch) {
      gx[ch] += dx[ch] + dd * yi[ch];
      gy[ch] += dy[ch] + dd * xi[ch];
    }
  }
}

// da = exp(G_c - G) dAe (Ae, a's stacked write rows), db = 0: the rule's inputs' gradient rows
// before the products and the solve add theirs.
void input_gradients(const ChunkGrads& g, const Dims& d, const Recomputed& rc,
                     const TermGrads& tg) {
  const int c = d.c, Ki = static_cast<int>(d.K);
  const int64_t K = d.K, kg = d.kg;
  for (int i = 0; i < c; ++i) {
    const float* dae = tg.dKe + (c + i) * K;
    float *da = g.dB + i * g.sdb, *db = da + K;
    if (kg == 0) {
      std::memcpy(da, dae, sizeof(float) * K);
    } else if (kg == 1) {
      const float e = rc.t.eEnd[i];
#pragma omp simd
      for (int ch = 0; ch < Ki; ++ch) da[ch] = e * dae[ch];
    } else {
      const float* e = rc.t.eEnd + i * K;
#pragma omp simd
      for (int ch = 0; ch < Ki; ++ch) da[ch] = e[ch] * dae[ch];
    }
    std::fill(db, db + K, 0.0f);
  }
}

// The read's gradient: dBd = R S^T (R = T^T dU_b), db_t += exp(G_{t-1}) dBd_t and the gate
// G_{t-1}'s share Bd_t * dBd_t (t >= 1).
void read_gradient(const ChunkRows& x, const ChunkGrads& g, const Dims& d, const Recomputed& rc,
                   const float* R, int64_t ldr, const float* S, const TermGrads& tg) {
  const int c = d.c, Ki = static_cast<int>(d.K);
  const int64_t K = d.K, kg = d.kg;
  gemm(false, true, c, Ki, d.V, 1.0f, R, ldr, S, d.V, 0.0f, tg.dRk, K);
  for (int i = 0; i < c; ++i) {
    const float *dbd = tg.dRk + i * K, *bi = x.beta + i * x.sb + K;
    const float* e = exclusive_decay(rc.t, kg, i);
    float* db = g.dB + i * g.sdb + K;
    if (!e) {
#pragma omp simd
      for (int ch = 0; ch < Ki; ++ch) db[ch] += dbd[ch];
    } else if (kg == 1) {
      float s = 0.0f;
#pragma omp simd reduction(+ : s)
      for (int ch = 0; ch < Ki; ++ch) {
        db[ch] += e[0] * dbd[ch];
        s += bi[ch] * dbd[ch];
      }
      tg.dG[i - 1] += e[0] * s;
    } else {
      float* dG = tg.dG + (i - 1) * K;
#pragma omp simd
      for (int ch = 0; ch < Ki; ++ch) {
        const float r = e[ch] * dbd[ch];
        db[ch] += r;
        dG[ch] += bi[ch] * r;
      }
    }
  }
}

// Zero dM[i, j] for j >= i (c rows, row stride ld): the strict mask.
void strict_mask(int c, float* dM, int64_t ld) {
  for (int i = 0; i < c; ++i) std::fill(dM + i * ld + i, dM + i * ld + c, 0.0f);
}

// M_b's gradient with no gate or one per head, as ``stacked_products`` formed it: the gates'
// share and the decays block by block, then db_next += -dM Y and dY = -dM^T b_next [2 c, K] (in
// w.dY) in one product each, dY's halves added to dk and da.
void stacked_backward(const ChunkRows& x, const ChunkGrads& g, const Dims& d,
                      const Recomputed& rc, const TermGrads& tg, Scratch& w) {
  const int c = d.c, n = c - 1, Ki = static_cast<int>(d.K);
  const int64_t K = d.K, lda = d.lda();
  if (n <= 0) return;
  float* dM = tg.dA + lda;  // rows 1.. of dM_b: the view of b_next
  const float* M = rc.t.Akk + lda;
  for (int block = 0; d.gated() && block < 2; ++block) {
    product_gate_gradient(dM + block * c, M + block * c, lda, n, tg.dGx);
    times_decays(n, dM + block * c, lda, rc.Gam, d.C);
  }
  const float* b_next = x.beta + x.sb + K;
  const float* Y = stacked_at(d.kg, rc.t, w);  // [k; a], as ``scores`` left them
  // db_next += -dM Y, and dY = -dM^T b_next [2 c, K] (the rows [k; a]) into w.dY
  lower_product_gradient(n, c, 2, Ki, -1.0f, dM, lda, b_next, x.sb, Y, K, g.dB + g.sdb + K, g.sdb,
                         1.0f, w.dY.data(), K, 0.0f);
  for (int i = 0; i < c; ++i) {
    const float *dk_y = w.dY.data() + i * K, *da_y = w.dY.data() + (c + i) * K;
    float *dk_i = g.dK + i * g.lddk, *da_i = g.dB + i * g.sdb;
#pragma omp simd
    for (int ch = 0; ch < Ki; ++ch) {
      dk_i[ch] += dk_y[ch];
      da_i[ch] += da_y[ch];
    }
  }
}

// M_b's gradient per channel where the chunk is one factored block (``end_factored``; false,
// nothing done, otherwise): as ``stacked_backward``, the two halves of dM side by side in one
// product each, on the factors Xf = b_next / end (n = c - 1 rows, b_{i+1} about G_i) and Yf =
// [k; a] end (2 c rows, in w.Y): dXf = -dM Yf, dYf = -dM^T Xf (in w.dY), back through the end
// decays. The diagonals (no decay) go to the factors alone, as ``product_backward``'s.
bool channel_stacked_backward(const ChunkRows& x, const ChunkGrads& g, const Dims& d,
                              const Recomputed& rc, const TermGrads& tg, Scratch& w) {
  const int c = d.c, n = c - 1, Ki = static_cast<int>(d.K);
  const int64_t K = d.K, lda = d.lda();
  const float* end = rc.t.eEnd;
  if (!end_factored(rc.t.G, K, c, end)) return false;
  float *dM = tg.dA + lda, *Xf = w.Xf.data(), *Yf = w.Y.data();  // dM: rows 1.. of dM_b
  float *dXf = w.dXf.data(), *dYf = w.dY.data();
  for (int i = 0; i < c; ++i) {
    const float *ki = x.k + i * x.ldk, *ai = x.beta + i * x.sb, *e = end + i * K;
    float *yk = Yf + i * K, *ya = Yf + (c + i) * K;
#pragma omp simd
    for (int ch = 0; ch < Ki; ++ch) {
      yk[ch] = ki[ch] * e[ch];
      ya[ch] = ai[ch] * e[ch];
    }
    if (i == n) break;
    const float* bi = x.beta + (i + 1) * x.sb + K;
    float *xi = Xf + i * K, *dbi = g.dB + (i + 1) * g.sdb + K;
    float *dki = g.dK + i * g.lddk, *dai = g.dB + i * g.sdb, *dk = dM + i * lda + i;
    const float dd_k = -dk[0], dd_a = -dk[c];  // the diagonals: b_{i+1} . k_i, b_{i+1} . a_i
    dk[0] = dk[c] = 0.0f;
#pragma omp simd
    for (int ch = 0; ch < Ki; ++ch) {
      xi[ch] = bi[ch] / e[ch];
      dbi[ch] += dd_k * ki[ch] + dd_a * ai[ch];
      dki[ch] += dd_k * bi[ch];
      dai[ch] += dd_a * bi[ch];
    }
  }
  lower_product_gradient(n, c, 2, Ki, -1.0f, dM, lda, Xf, K, Yf, K, dXf, K, 0.0f, dYf, K, 0.0f);
  for (int i = 0; i < n; ++i) {
    const float *bi = x.beta + (i + 1) * x.sb + K, *ki = x.k + i * x.ldk, *ai = x.beta + i * x.sb;
    const float *e = end + i * K, *dx = dXf + i * K, *dyk = dYf + i * K, *dya = dYf + (c + i) * K;
    float *dbi = g.dB + (i + 1) * g.sdb + K, *dki = g.dK + i * g.lddk, *dai = g.dB + i * g.sdb;
#pragma omp simd
    for (int ch = 0; ch < Ki; ++ch) {
      dbi[ch] += dx[ch] / e[ch];
      dki[ch] += dyk[ch] * e[ch];
      dai[ch] += dya[ch] * e[ch];
    }
  }
  // The gates' share, pair by pair (``channel_gate_share``; it reuses w's factor blocks).
  const Rows b_next{x.beta + x.sb + K, x.sb};
  channel_gate_share(b_next, {x.k, x.ldk}, rc.t.G, K, n, -1.0f, dM, lda, tg.dGx, w, end);
  channel_gate_share(b_next, a_rows(x), rc.t.G, K, n, -1.0f, dM + c, lda, tg.dGx, w, end);
  return true;
}

// The solve's backward: R = T^T dU_b (in place), dv = dU_v + A_bk^T R, the read's gradient,
// dA_bk = mask(R V^T) and dL = -mask(R U_b^T) (strict), each product's factors' gradients.
void solve_backward(const ChunkRows& x, const ChunkGrads& g, const Dims& d, const Recomputed& rc,
                    const float* S, const TermGrads& tg, Scratch& w) {
  const int c = d.c;
  const int64_t K = d.K, V = d.V, lda = d.lda();
  float* R = tg.dU + c * tg.lddu;
  unit_lower_solve_transposed(c, V, rc.t.Akk + c, lda, R, tg.lddu);
  for (int i = 0; i < c; ++i) {
    std::memcpy(g.dV + i * g.lddv, tg.dU + i * tg.lddu, sizeof(float) * V);
  }
  lower_transposed_times(c, c, V, -1.0f, rc.t.Akk, lda, R, tg.lddu, 1.0f, g.dV, g.lddv);
  read_gradient(x, g, d, rc, R, tg.lddu, S, tg);
  // dM_b = -mask(R [V; U_b]^T) [c, 2 c]: rc.U is [V; U_b]
  lower_products(c, c, 2, V, -1.0f, R, tg.lddu, rc.U, rc.ldu, tg.dA, lda);
  strict_mask(c, tg.dA, lda);
  strict_mask(c, tg.dA + c, lda);
  if (!d.channel()) {
    stacked_backward(x, g, d, rc, tg, w);
    return;
  }
  if (channel_stacked_backward(x, g, d, rc, tg, w)) return;
  const Factor b_next{{x.beta + x.sb + K, x.sb}, g.dB + g.sdb + K, g.sdb};
  const Factor k{{x.k, x.ldk}, g.dK, g.lddk}, a{a_rows(x), g.dB, g.sdb};
  const float* M = rc.t.Akk + lda;
  product_backward(b_next, k, c - 1, -1.0f, M, tg.dA + lda, lda, d, rc, tg.dGx, tg, w);
  product_backward(b_next, a, c - 1, -1.0f, M + c, tg.dA + lda + c, lda, d, rc, tg.dGx, tg, w);
}

// The rule's backward (backward.cpp's step 8): da from the stacked rows, A_qa's factors (dq, da,
// the gates), then the solve's.
void backward(const ChunkRows& x, const ChunkGrads& g, const Dims& d, const Recomputed& rc,
              const float* S, const TermGrads& tg, Scratch& w) {
  const int c = d.c;
  input_gradients(g, d, rc, tg);
  const Factor q{{x.q, x.ldq}, g.dQ, g.lddq}, a{a_rows(x), g.dB, g.sdb};
  product_backward(q, a, c, d.scale, rc.t.A + c, tg.dA + c, d.lda(), d, rc, tg.dGx, tg, w);
  solve_backward(x, g, d, rc, S, tg, w);
}

// The step: r = S^T b, read from the state entering the token (before its decay); then
// S <- Diag(alpha) S + k v^T + a r^T and o = S^T q (h.beta = [a | b], [2K]). Two passes over
// each block of S, the second in L1.
void step(const StepHead& h, int64_t K, int64_t V, float* S, float* o) {
  const float *a = h.beta, *b = h.b;
  column_blocks(V, [&](auto vecs, int64_t j0, int64_t w) {
    constexpr int N = decltype(vecs)::value;
    float r[kBlockVecs * kLanes];
    read_block<N>(b, K, V, h.S_in + j0, w, r);
    write_block<N, true>(h, h.k, h.v + j0, a, r, K, V, h.S_in + j0, S + j0, w, o + j0);
  });
}

}  // namespace

const Rule kDplrRule{.name = "dplr",
                            .reads_beta = true,
                            .needs_Kd = false,
                            .writes = 2,
                            .input_keys = 2,
                            .input_low = -std::numeric_limits<float>::infinity(),  // [a | b]:
                            .input_high = std::numeric_limits<float>::infinity(),  // finite
                            .takes_bonus = false,
                            .scores = scores,
                            .pseudo_value_terms = solve_terms,
                            .pseudo_values = pseudo_values,
                            .backward = backward,
                            .step = step};
const RuleEntry kDplrRuleEntry{kDplrRule};  // its row of rules.h's table

}  // namespace linattn_native
