// CyclicFlowAttention's token-by-token parts (``linattn.ops.cyfa``), forward and backward: the
// write direction into its two memories and the softmax readout between them. Each token's work
// reads only that token's clock lambda, write strength beta and norms r, so these are the whole
// of CyFA's work outside its two scalar-decay memories (the chunk kernels).
//
// Phases: with P = M - 1 (M slots, J = M / 2 pairs), the pair j turns by theta_j = j theta_1,
// theta_1 = omega (lambda mod P) wrapped to (-pi, pi], omega = 2 pi / P: lambda's whole part is
// reduced exactly, in float64 (a long clock keeps the precision of its fraction), and cos / sin
// of j theta_1 follow from those of theta_1 by the angle-addition recurrence.
// d theta_j / d lambda = j omega.
//
//   write:   a_{2j} = c_j n_j,  a_{2j+1} = -s_j n_j   (n_0 = P^-1/2, n_j = (2 / P)^1/2),
//            keys w = beta a [B, H, T, M], values w r_k, zero-padded to ``width`` [B, H, T, W]
//   readout: y = R (r_q z),  p = softmax(E y),  u = R^T E^T p   [B, H, T, M]
//            (R turns pair j by theta_j: (c x0 - s x1, s x0 + c x1); E the table [H, P, M])
//
// The backward recomputes every token's phases and softmax from the inputs (nothing is saved):
//
//   da = R du,  dp = E da,  dl = p (dp - p . dp),  dy = E^T dl,  dx = R^T dy,
//   dz = r_q dx,  dr_q = z . dx,  dE = dl y^T + p da^T,
//   dtheta_j = (du_{2j} u_{2j+1} - du_{2j+1} u_{2j}) + (dy_{2j+1} y_{2j} - dy_{2j} y_{2j+1});
//   write: dw = dkeys + r_k dvalues,  dr_k = dvalues . w,  dbeta = dw . a,
//          dtheta_j = -beta n_j (s_j dw_{2j} + c_j dw_{2j+1}).
//
// Work: a task per tile of kTile tokens of a sequence, every head in turn (the gradients arrive
// as [B, T, H, .] rows: read in order), every token quantity in a [slot][token] buffer, so that
// each loop runs over a tile's tokens and vectorises (float32: exp and sincos by branch-free
// polynomials). float64 runs the same loops with the library's exp, sin and cos. Sums over the
// tokens (dE, the norms' dw) are kept per thread in float64, then summed.
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <type_traits>
#include <utility>
#include <vector>

#include "block_cache.h"
#include "gates.h"

namespace linattn_native {
namespace {

constexpr int64_t kTile = 64;  // tokens of a tile: every buffer a few SIMD vectors per slot
constexpr int64_t kFlushTiles = 16;  // tiles whose dE a token lane sums in T before float64
constexpr double kPi = 3.14159265358979323846;

// sin and cos of x for |x| <= pi (and a little beyond): x = q pi / 2 + r with |r| <= pi / 4, the
// Taylor polynomials of sin (to r^9) and cos (to r^8), below float32's half ulp there; the
// quadrant q chooses and signs them. Branch-free, so the tile loops vectorise.
__attribute__((always_inline)) inline void sincos_pi(float x, float& s, float& c) {
  const float q = (x * 0.636619772f + 12582912.0f) - 12582912.0f;  // round(x 2 / pi)
  float r = std::fma(q, -1.57079601f, x);  // pi / 2 in two parts: q times the first is exact
  r = std::fma(q, -3.13916473e-07f, r);
  const float r2 = r * r;
  float ps = 2.75573192e-06f;  // 1 / 9!
  ps = std::fma(ps, r2, -1.98412698e-04f);
  ps = std::fma(ps, r2, 8.33333333e-03f);
  ps = std::fma(ps, r2, -1.66666667e-01f);
  const float sr = std::fma(ps * r2, r, r);
  float pc = 2.48015873e-05f;  // 1 / 8!
  pc = std::fma(pc, r2, -1.38888889e-03f);
  pc = std::fma(pc, r2, 4.16666667e-02f);
  pc = std::fma(pc, r2, -0.5f);
  const float cr = std::fma(pc, r2, 1.0f);
  const int n = static_cast<int>(q) & 3;  // q in {-2, ..., 2}: two's complement & 3 is q mod 4
  const float sa = (n & 1) ? cr : sr;
  const float ca = (n & 1) ? sr : cr;
  s = (n & 2) ? -sa : sa;
  c = ((n + 1) & 2) ? -ca : ca;
}

__attribute__((always_inline)) inline void sincos_pi(double x, double& s, double& c) {
  s = std::sin(x);
  c = std::cos(x);
}

// exp(x) for the softmax's x <= 0 (``exp_flush`` in float32).
__attribute__((always_inline)) inline float exp_le0(float x) { return exp_flush(x); }
__attribute__((always_inline)) inline double exp_le0(double x) { return std::exp(x); }

// Rows of a [B, H, T, D] tensor with any strides (unit stride along D).
template <typename T>
struct Rows {
  T* data;
  int64_t sb, sh, st;
  T* row(int64_t b, int64_t h, int64_t t) const { return data + b * sb + h * sh + t * st; }
};

template <typename T>
Rows<T> rows_of(const at::Tensor& x) {
  return {x.data_ptr<std::remove_const_t<T>>(), x.stride(0), x.stride(1), x.stride(2)};
}

// A [B, H, T, D] tensor the loops read by rows: in place with unit stride along D, else copied.
at::Tensor unit_rows(const at::Tensor& x) { return x.stride(3) == 1 ? x : x.contiguous(); }

// The phases of a tile: c[j][i], s[j][i] for tokens t0 + i of head (b, h); lam [B, T, H].
template <typename T>
void phases(const T* lam, int64_t T_, int64_t H, int64_t b, int64_t h, int64_t t0, int64_t n,
            int64_t J, T* c, T* s) {
  const int64_t P = 2 * J - 1;
  const T omega = static_cast<T>(2 * kPi / P);
  const T half = static_cast<T>(P) / 2;
  const T* column = lam + (b * T_ + t0) * H + h;
  T* angle = c + kTile;  // theta_1, in c's second row until its cosine replaces it
  for (int64_t i = 0; i < n; ++i) {
    // lambda's whole turns mod P in float64 (exact for every whole number up to 2^52: a
    // quotient rounded up by one is set right by the correction), its fraction exact in T.
    // A scalar loop (the selects on a rounded quotient keep GCC from if-converting it); the
    // sines and cosines below vectorise.
    const T x = column[i * H];
    const double whole = std::floor(static_cast<double>(x));
    double turns = whole - static_cast<double>(P) * std::floor(whole / static_cast<double>(P));
    turns = turns < 0 ? turns + static_cast<double>(P) : turns;
    turns = turns >= static_cast<double>(P) ? turns - static_cast<double>(P) : turns;
    T coordinate = static_cast<T>(turns) + (x - static_cast<T>(whole));
    coordinate = coordinate > half ? coordinate - static_cast<T>(P) : coordinate;
    angle[i] = coordinate * omega;
  }
  T *c1 = c + kTile, *s1 = s + kTile;
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    c[i] = 1;
    s[i] = 0;
    T sine, cosine;
    sincos_pi(angle[i], sine, cosine);
    s1[i] = sine;
    c1[i] = cosine;
  }
  for (int64_t j = 2; j < J; ++j) {  // cos and sin of j theta_1: angle addition
    const T* c1 = c + kTile;
    const T* s1 = s + kTile;
    const T* cp = c + (j - 1) * kTile;
    const T* sp = s + (j - 1) * kTile;
    T* cj = c + j * kTile;
    T* sj = s + j * kTile;
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) {
      cj[i] = cp[i] * c1[i] - sp[i] * s1[i];
      sj[i] = sp[i] * c1[i] + cp[i] * s1[i];
    }
  }
}

// n_j: the write's pair norms.
template <typename T>
T pair_norm(int64_t j, int64_t P) {
  return static_cast<T>(j == 0 ? std::sqrt(1.0 / P) : std::sqrt(2.0 / P));
}

struct Shape {
  int64_t B, T, H, J;
};

// The rows of a tile's c and s buffers: J, and at least 2 (``phases`` writes theta_1's row).
int64_t phase_rows(const Shape& d) { return std::max<int64_t>(d.J, 2); }

Shape shape_of(const char* op, const at::Tensor& lam, int64_t M) {
  TORCH_CHECK(lam.dim() == 3, op, ": lam must be [B, T, H], got ", lam.sizes());
  TORCH_CHECK(M >= 2 && M % 2 == 0, op, ": the slots M must be even and >= 2, got ", M);
  return {lam.size(0), lam.size(1), lam.size(2), M / 2};
}

void check_tokens(const char* op, const char* name, const at::Tensor& x, const at::Tensor& lam) {
  TORCH_CHECK(x.sizes() == lam.sizes(), op, ": ", name, " must be [B, T, H] = ", lam.sizes(),
              ", got ", x.sizes());
  TORCH_CHECK(x.scalar_type() == lam.scalar_type(), op, ": ", name, " must be ",
              lam.scalar_type(), ", got ", x.scalar_type());
}

void check_float(const char* op, const at::Tensor& lam, c10::DeviceType device) {
  TORCH_CHECK(lam.scalar_type() == at::kFloat || lam.scalar_type() == at::kDouble, op,
              ": lam must be float32 or float64, got ", lam.scalar_type());
  TORCH_CHECK(lam.device().type() == device, op, ": lam must be a ",
              c10::DeviceTypeName(device), " tensor, got ", lam.device());
}

void check_rows(const char* op, const char* name, const at::Tensor& x, const Shape& d,
                int64_t width, const at::Tensor& lam) {
  TORCH_CHECK(x.dim() == 4 && x.size(0) == d.B && x.size(1) == d.H && x.size(2) == d.T, op, ": ",
              name, " must be [B, H, T, D] = [", d.B, ", ", d.H, ", ", d.T, ", D], got ",
              x.sizes());
  TORCH_CHECK(width < 0 || x.size(3) == width, op, ": ", name, " must have ", width,
              " columns, got ", x.size(3));
  TORCH_CHECK(x.scalar_type() == lam.scalar_type() && x.device() == lam.device(), op, ": ", name,
              " must be a ", lam.scalar_type(), " tensor on ", lam.device());
}

// ---- the write ---------------------------------------------------------------------------------

// The write's tile quantities: beta, r_k [kTile] of head h's tokens t0 + i (gathered from their
// [B, T, H] columns), and n_j.
template <typename T>
void gather_tokens(const Shape& d, const T* x, int64_t b, int64_t h, int64_t t0, int64_t n,
                   T* out) {
  const T* column = x + (b * d.T + t0) * d.H + h;
  for (int64_t i = 0; i < n; ++i) out[i] = column[i * d.H];
}

template <typename T>
void write_forward(const Shape& d, const T* lam, const T* beta, const T* rk, int64_t width,
                   T* keys, T* values) {
  const int64_t M = 2 * d.J, P = M - 1;
  const int64_t tiles = (d.T + kTile - 1) / kTile;  // tasks: a tile of tokens, every head
  at::parallel_for(0, d.B * tiles, 1, [&](int64_t first, int64_t last) {
    std::vector<T> buf((2 * phase_rows(d) + M + 2) * kTile);
    T *c = buf.data(), *s = c + phase_rows(d) * kTile, *w = s + phase_rows(d) * kTile;
    T *bt_ = w + M * kTile, *r = bt_ + kTile;
    for (int64_t bt = first; bt < last; ++bt) {
      const int64_t b = bt / tiles, t0 = bt % tiles * kTile;
      const int64_t n = std::min(kTile, d.T - t0);
      for (int64_t h = 0; h < d.H; ++h) {
        phases(lam, d.T, d.H, b, h, t0, n, d.J, c, s);
        gather_tokens(d, beta, b, h, t0, n, bt_);
        gather_tokens(d, rk, b, h, t0, n, r);
        for (int64_t j = 0; j < d.J; ++j) {  // w = beta a, pair by pair
          const T norm = pair_norm<T>(j, P);
          const T *cj = c + j * kTile, *sj = s + j * kTile;
          T *w0 = w + 2 * j * kTile, *w1 = w0 + kTile;
#pragma omp simd
          for (int64_t i = 0; i < n; ++i) {
            w0[i] = norm * bt_[i] * cj[i];
            w1[i] = -norm * bt_[i] * sj[i];
          }
        }
        T* key = keys + ((b * d.H + h) * d.T + t0) * M;
        T* value = values + ((b * d.H + h) * d.T + t0) * width;
        for (int64_t i = 0; i < n; ++i) {
          for (int64_t m = 0; m < M; ++m) {
            key[i * M + m] = w[m * kTile + i];
            value[i * width + m] = w[m * kTile + i] * r[i];
          }
          for (int64_t m = M; m < width; ++m) value[i * width + m] = 0;
        }
      }
    }
  });
}

template <typename T>
void write_backward(const Shape& d, const T* lam, const T* beta, const T* rk, Rows<const T> dk,
                    Rows<const T> dv, T* dlam, T* dbeta, T* drk) {
  const int64_t M = 2 * d.J, P = M - 1;
  const T omega = static_cast<T>(2 * kPi / P);
  const int64_t tiles = (d.T + kTile - 1) / kTile;  // tasks: a tile of tokens, every head
  at::parallel_for(0, d.B * tiles, 1, [&](int64_t first, int64_t last) {
    std::vector<T> buf((2 * phase_rows(d) + 2 * M + 5) * kTile);
    T *c = buf.data(), *s = c + phase_rows(d) * kTile, *gk = s + phase_rows(d) * kTile;
    T *gv = gk + M * kTile, *bt_ = gv + M * kTile, *r = bt_ + kTile, *g_beta = r + kTile;
    T *g_rk = g_beta + kTile, *g_lam = g_rk + kTile;
    for (int64_t bt = first; bt < last; ++bt) {
      const int64_t b = bt / tiles, t0 = bt % tiles * kTile;
      const int64_t n = std::min(kTile, d.T - t0);
      for (int64_t h = 0; h < d.H; ++h) {
        phases(lam, d.T, d.H, b, h, t0, n, d.J, c, s);
        gather_tokens(d, beta, b, h, t0, n, bt_);
        gather_tokens(d, rk, b, h, t0, n, r);
        for (int64_t i = 0; i < n; ++i) {  // the gradients' rows into [slot][token]
          const T* k_row = dk.row(b, h, t0 + i);
          const T* v_row = dv.row(b, h, t0 + i);
          for (int64_t m = 0; m < M; ++m) {
            gk[m * kTile + i] = k_row[m];
            gv[m * kTile + i] = v_row[m];
          }
        }
#pragma omp simd
        for (int64_t i = 0; i < n; ++i) g_beta[i] = g_rk[i] = g_lam[i] = 0;
        for (int64_t j = 0; j < d.J; ++j) {
          const T norm = pair_norm<T>(j, P), turn = static_cast<T>(j) * norm;
          const T *cj = c + j * kTile, *sj = s + j * kTile;
          const T *k0 = gk + 2 * j * kTile, *k1 = k0 + kTile;
          const T *v0 = gv + 2 * j * kTile, *v1 = v0 + kTile;
#pragma omp simd
          for (int64_t i = 0; i < n; ++i) {
            const T a0 = norm * cj[i], a1 = -norm * sj[i];
            const T d0 = k0[i] + r[i] * v0[i], d1 = k1[i] + r[i] * v1[i];
            g_beta[i] += d0 * a0 + d1 * a1;
            g_rk[i] += v0[i] * a0 + v1[i] * a1;
            g_lam[i] -= turn * (sj[i] * d0 + cj[i] * d1);
          }
        }
        const int64_t token = (b * d.T + t0) * d.H + h;
        for (int64_t i = 0; i < n; ++i) {
          dbeta[token + i * d.H] = g_beta[i];
          drk[token + i * d.H] = g_rk[i] * bt_[i];
          dlam[token + i * d.H] = g_lam[i] * bt_[i] * omega;
        }
      }
    }
  });
}

// ---- the readout -------------------------------------------------------------------------------

// The forward of a tile: y [M][kTile] (R r_q z), p [P][kTile] (the softmax), u [M][kTile];
// a [M][kTile] is E^T p. z's rows read from ``zr``.
template <typename T>
void readout_tile(const Shape& d, int64_t b, int64_t h, int64_t t0, int64_t n, Rows<const T> zr,
                  const T* rq, const T* table, const T* c, const T* s, T* y, T* l, T* a, T* u) {
  const int64_t M = 2 * d.J, P = M - 1;
  for (int64_t i = 0; i < n; ++i) {  // x = r_q z, into u's buffer for now
    const T* z = zr.row(b, h, t0 + i);
    const T r = rq[(b * d.T + t0 + i) * d.H + h];
    for (int64_t m = 0; m < M; ++m) u[m * kTile + i] = r * z[m];
  }
  for (int64_t j = 0; j < d.J; ++j) {  // y = R x
    const T *cj = c + j * kTile, *sj = s + j * kTile;
    const T *x0 = u + 2 * j * kTile, *x1 = x0 + kTile;
    T *y0 = y + 2 * j * kTile, *y1 = y0 + kTile;
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) {
      y0[i] = cj[i] * x0[i] - sj[i] * x1[i];
      y1[i] = sj[i] * x0[i] + cj[i] * x1[i];
    }
  }
  const T* E = table + h * P * M;
  for (int64_t r = 0; r < P; ++r) {  // l = E y
    T* lr = l + r * kTile;
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) lr[i] = 0;
    for (int64_t m = 0; m < M; ++m) {
      const T e = E[r * M + m];
      const T* ym = y + m * kTile;
#pragma omp simd
      for (int64_t i = 0; i < n; ++i) lr[i] += e * ym[i];
    }
  }
  T* top = a;  // the rows' maximum and then their sum, in a's first row for now
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) top[i] = l[i];
  for (int64_t r = 1; r < P; ++r) {
    const T* lr = l + r * kTile;
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) top[i] = std::max(top[i], lr[i]);
  }
  T* sum = a + kTile;
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) sum[i] = 0;
  for (int64_t r = 0; r < P; ++r) {
    T* lr = l + r * kTile;
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) {
      lr[i] = exp_le0(lr[i] - top[i]);
      sum[i] += lr[i];
    }
  }
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) sum[i] = 1 / sum[i];
  for (int64_t r = 0; r < P; ++r) {  // p, in l's buffer
    T* lr = l + r * kTile;
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) lr[i] *= sum[i];
  }
  for (int64_t m = 0; m < M; ++m) {  // a = E^T p (after the last read of top and sum)
    T* am = u + m * kTile;  // into u's buffer first: a's rows 0 and 1 are still being read
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) am[i] = 0;
    for (int64_t r = 0; r < P; ++r) {
      const T e = E[r * M + m];
      const T* pr = l + r * kTile;
#pragma omp simd
      for (int64_t i = 0; i < n; ++i) am[i] += e * pr[i];
    }
  }
  for (int64_t j = 0; j < d.J; ++j) {  // u = R^T a, a copied out of u's buffer first
    const T *cj = c + j * kTile, *sj = s + j * kTile;
    T *a0 = a + 2 * j * kTile, *a1 = a0 + kTile;
    T *u0 = u + 2 * j * kTile, *u1 = u0 + kTile;
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) {
      a0[i] = u0[i];
      a1[i] = u1[i];
      u0[i] = cj[i] * a0[i] + sj[i] * a1[i];
      u1[i] = cj[i] * a1[i] - sj[i] * a0[i];
    }
  }
}

template <typename T>
void readout_forward(const Shape& d, Rows<const T> zr, const T* rq, const T* lam, const T* table,
                     T* out) {
  const int64_t M = 2 * d.J, P = M - 1;
  const int64_t tiles = (d.T + kTile - 1) / kTile;  // tasks: a tile of tokens, every head
  at::parallel_for(0, d.B * tiles, 1, [&](int64_t first, int64_t last) {
    std::vector<T> buf((2 * phase_rows(d) + 3 * M + P) * kTile);
    T *c = buf.data(), *s = c + phase_rows(d) * kTile, *y = s + phase_rows(d) * kTile;
    T* a = y + M * kTile;
    T *u = a + M * kTile, *l = u + M * kTile;
    for (int64_t bt = first; bt < last; ++bt) {
      const int64_t b = bt / tiles, t0 = bt % tiles * kTile;
      const int64_t n = std::min(kTile, d.T - t0);
      for (int64_t h = 0; h < d.H; ++h) {
        phases(lam, d.T, d.H, b, h, t0, n, d.J, c, s);
        readout_tile(d, b, h, t0, n, zr, rq, table, c, s, y, l, a, u);
        T* o = out + ((b * d.H + h) * d.T + t0) * M;
        for (int64_t i = 0; i < n; ++i)
          for (int64_t m = 0; m < M; ++m) o[i * M + m] = u[m * kTile + i];
      }
    }
  });
}

template <typename T>
void readout_backward(const Shape& d, Rows<const T> zr, const T* rq, const T* lam,
                      const T* table, Rows<const T> dur, int64_t width, T* dz, T* drq, T* dlam,
                      double* dtable /* [threads, H, P, M], zeroed */) {
  const int64_t M = 2 * d.J, P = M - 1;
  const T omega = static_cast<T>(2 * kPi / P);
  const int64_t tiles = (d.T + kTile - 1) / kTile;  // tasks: a tile of tokens, every head
  at::parallel_for(0, d.B * tiles, 1, [&](int64_t first, int64_t last) {
    std::vector<T> buf((2 * phase_rows(d) + 6 * M + 2 * P + 2) * kTile);
    T *c = buf.data(), *s = c + phase_rows(d) * kTile, *y = s + phase_rows(d) * kTile;
    T* a = y + M * kTile;
    T *u = a + M * kTile, *p = u + M * kTile, *du = p + P * kTile, *da = du + M * kTile;
    T *dp = da + M * kTile, *dy = dp + P * kTile, *th = dy + M * kTile, *pd = th + kTile;
    T* dl = dp;  // dl overwrites dp row by row
    // dE: per token lane in T over up to kFlushTiles tiles ([H, P, M][kTile], so that its sums
    // vectorise), then over the lanes into this task's float64 sums
    std::vector<double> gE_all(d.H * P * M, 0.0);
    std::vector<T> lanes(d.H * P * M * kTile, T(0));
    int64_t pending = 0;
    const auto flush = [&] {
      for (int64_t e = 0; e < d.H * P * M; ++e) {
        double sum = 0;
        for (int64_t i = 0; i < kTile; ++i) sum += lanes[e * kTile + i];
        gE_all[e] += sum;
      }
      std::fill(lanes.begin(), lanes.end(), T(0));
      pending = 0;
    };
    for (int64_t bt = first; bt < last; ++bt) {
      const int64_t b = bt / tiles, t0 = bt % tiles * kTile;
      const int64_t n = std::min(kTile, d.T - t0);
      if (pending == kFlushTiles) flush();
      ++pending;
      for (int64_t h = 0; h < d.H; ++h) {
        const T* E = table + h * P * M;
        T* gE = lanes.data() + h * P * M * kTile;
        phases(lam, d.T, d.H, b, h, t0, n, d.J, c, s);
        readout_tile(d, b, h, t0, n, zr, rq, table, c, s, y, p, a, u);
        for (int64_t i = 0; i < n; ++i) {
          const T* g = dur.row(b, h, t0 + i);
          for (int64_t m = 0; m < M; ++m) du[m * kTile + i] = g[m];
        }
        for (int64_t j = 0; j < d.J; ++j) {  // da = R du; dtheta from u = R^T a
          const T *cj = c + j * kTile, *sj = s + j * kTile;
          const T *g0 = du + 2 * j * kTile, *g1 = g0 + kTile;
          const T *u0 = u + 2 * j * kTile, *u1 = u0 + kTile;
          T *d0 = da + 2 * j * kTile, *d1 = d0 + kTile;
#pragma omp simd
          for (int64_t i = 0; i < n; ++i) {
            d0[i] = cj[i] * g0[i] - sj[i] * g1[i];
            d1[i] = sj[i] * g0[i] + cj[i] * g1[i];
          }
          const T w = static_cast<T>(j) * omega;
          if (j == 0) {
#pragma omp simd
            for (int64_t i = 0; i < n; ++i) th[i] = 0;
          } else {
#pragma omp simd
            for (int64_t i = 0; i < n; ++i) th[i] += w * (g0[i] * u1[i] - g1[i] * u0[i]);
          }
        }
        for (int64_t r = 0; r < P; ++r) {  // dp = E da; dE += p da^T
          T* dpr = dp + r * kTile;
          const T* pr = p + r * kTile;
#pragma omp simd
          for (int64_t i = 0; i < n; ++i) dpr[i] = 0;
          for (int64_t m = 0; m < M; ++m) {
            const T e = E[r * M + m];
            const T* dam = da + m * kTile;
            T* lane = gE + (r * M + m) * kTile;
#pragma omp simd
            for (int64_t i = 0; i < n; ++i) {
              dpr[i] += e * dam[i];
              lane[i] += pr[i] * dam[i];
            }
          }
        }
#pragma omp simd  // p . dp
        for (int64_t i = 0; i < n; ++i) pd[i] = 0;
        for (int64_t r = 0; r < P; ++r) {
          const T *pr = p + r * kTile, *dpr = dp + r * kTile;
#pragma omp simd
          for (int64_t i = 0; i < n; ++i) pd[i] += pr[i] * dpr[i];
        }
        for (int64_t r = 0; r < P; ++r) {  // dl = p (dp - p . dp)
          const T* pr = p + r * kTile;
          T* dlr = dl + r * kTile;
#pragma omp simd
          for (int64_t i = 0; i < n; ++i) dlr[i] = pr[i] * (dlr[i] - pd[i]);
        }
        for (int64_t m = 0; m < M; ++m) {  // dy = E^T dl; dE += dl y^T
          T* dym = dy + m * kTile;
          const T* ym = y + m * kTile;
#pragma omp simd
          for (int64_t i = 0; i < n; ++i) dym[i] = 0;
          for (int64_t r = 0; r < P; ++r) {
            const T e = E[r * M + m];
            const T* dlr = dl + r * kTile;
            T* lane = gE + (r * M + m) * kTile;
#pragma omp simd
            for (int64_t i = 0; i < n; ++i) {
              dym[i] += e * dlr[i];
              lane[i] += dlr[i] * ym[i];
            }
          }
        }
        for (int64_t j = 1; j < d.J; ++j) {  // dtheta from y = R x
          const T *y0 = y + 2 * j * kTile, *y1 = y0 + kTile;
          const T *g0 = dy + 2 * j * kTile, *g1 = g0 + kTile;
          const T w = static_cast<T>(j) * omega;
#pragma omp simd
          for (int64_t i = 0; i < n; ++i) th[i] += w * (g1[i] * y0[i] - g0[i] * y1[i]);
        }
        for (int64_t i = 0; i < n; ++i) {  // dx = R^T dy; dz = r_q dx; dr_q = z . dx
          const int64_t token = (b * d.T + t0 + i) * d.H + h;
          const T* z = zr.row(b, h, t0 + i);
          T* g = dz + ((b * d.H + h) * d.T + t0 + i) * width;
          T acc = 0;
          for (int64_t j = 0; j < d.J; ++j) {
            const T cj = c[j * kTile + i], sj = s[j * kTile + i];
            const T g0 = dy[2 * j * kTile + i], g1 = dy[(2 * j + 1) * kTile + i];
            const T x0 = cj * g0 + sj * g1, x1 = cj * g1 - sj * g0;
            g[2 * j] = rq[token] * x0;
            g[2 * j + 1] = rq[token] * x1;
            acc += z[2 * j] * x0 + z[2 * j + 1] * x1;
          }
          for (int64_t m = M; m < width; ++m) g[m] = 0;
          drq[token] = acc;
          dlam[token] = th[i];
        }
      }
    }
    flush();
    double* out = dtable + at::get_thread_num() * d.H * P * M;
    for (int64_t e = 0; e < d.H * P * M; ++e) out[e] += gE_all[e];
  });
}

// ---- the RMS norms' two factors ---------------------------------------------------------------
//
// The keys' and queries' RMS norm as two factors (``cyfa._NormParts``): y = x w and r = (mean(x^2)
// + eps)^-1/2 per row of K, so that the memories take r where it is one number a token. Backward:
// dx = dy w - (dr r^3 / K) x, dw = sum over the rows of dy x. One pass over the rows each way.

// x's rows: [A, B, C, K] (the public [B, T, H, K]) with any strides, unit stride along K.
template <typename T>
struct Rows3 {
  T* data;
  int64_t s0, s1, s2;
  T* row(int64_t i, int64_t j, int64_t k) const { return data + i * s0 + j * s1 + k * s2; }
};

template <typename T>
Rows3<T> rows3_of(const at::Tensor& x) {
  return {x.data_ptr<std::remove_const_t<T>>(), x.stride(0), x.stride(1), x.stride(2)};
}

template <typename T>
void norm_forward(int64_t A, int64_t B, int64_t C, int64_t K, Rows3<const T> x, const T* w,
                  double eps, T* y, T* r) {
  at::parallel_for(0, A * B, 1, [&](int64_t first, int64_t last) {
    for (int64_t ab = first; ab < last; ++ab) {
      const int64_t a = ab / B, b = ab % B;
      for (int64_t c = 0; c < C; ++c) {
        const T* xr = x.row(a, b, c);
        T* yr = y + (ab * C + c) * K;
        T square = 0;
#pragma omp simd reduction(+ : square)
        for (int64_t k = 0; k < K; ++k) {
          square += xr[k] * xr[k];
          yr[k] = xr[k] * w[k];
        }
        r[ab * C + c] = static_cast<T>(1.0 / std::sqrt(static_cast<double>(square) / K + eps));
      }
    }
  });
}

// dx (rows contiguous, x's shape) and the sum of dy x over the rows, into dw_part [threads, K]
// (float64, zeroed; a row per thread): summed in T over blocks of kNormBlock row groups (a, b),
// then in float64.
constexpr int64_t kNormBlock = 64;

template <typename T>
void norm_backward(int64_t A, int64_t B, int64_t C, int64_t K, Rows3<const T> x, const T* w,
                   const T* r, Rows3<const T> dy, bool has_dy, const T* dr, T* dx,
                   double* dw_part) {
  at::parallel_for(0, A * B, kNormBlock, [&](int64_t first, int64_t last) {
    std::vector<T> acc(K);
    T* sum = acc.data();
    double* out = dw_part + at::get_thread_num() * K;
    for (int64_t block = first; block < last; block += kNormBlock) {
      std::fill(acc.begin(), acc.end(), T(0));
      for (int64_t ab = block; ab < std::min(last, block + kNormBlock); ++ab) {
        const int64_t a = ab / B, b = ab % B;
        for (int64_t c = 0; c < C; ++c) {
          const T* xr = x.row(a, b, c);
          T* dxr = dx + (ab * C + c) * K;
          const int64_t i = ab * C + c;
          const T coef = dr ? -dr[i] * r[i] * r[i] * r[i] / static_cast<T>(K) : T(0);
          if (has_dy) {
            const T* g = dy.row(a, b, c);
#pragma omp simd
            for (int64_t k = 0; k < K; ++k) {
              dxr[k] = g[k] * w[k] + coef * xr[k];
              sum[k] += g[k] * xr[k];
            }
          } else {
#pragma omp simd
            for (int64_t k = 0; k < K; ++k) dxr[k] = coef * xr[k];
          }
        }
      }
      for (int64_t k = 0; k < K; ++k) out[k] += static_cast<double>(sum[k]);
    }
  });
}

// ---- the entry points --------------------------------------------------------------------------

std::tuple<at::Tensor, at::Tensor> write_impl(const at::Tensor& lam, const at::Tensor& beta,
                                              const at::Tensor& r_k, int64_t slots,
                                              int64_t width, c10::DeviceType device) {
  const char* op = "linattn_native.cyfa_write";
  check_float(op, lam, device);
  const Shape d = shape_of(op, lam, slots);
  check_tokens(op, "beta", beta, lam);
  check_tokens(op, "r_k", r_k, lam);
  TORCH_CHECK(width >= slots, op, ": width must be >= the slots ", slots, ", got ", width);
  const auto options = lam.options();
  if (device != c10::kCPU) {
    return {at::empty({d.B, d.H, d.T, slots}, options),
            at::empty({d.B, d.H, d.T, width}, options)};
  }
  at::Tensor keys = fresh({d.B, d.H, d.T, slots}, options);
  at::Tensor values = fresh({d.B, d.H, d.T, width}, options);
  const at::Tensor l = lam.contiguous(), bt = beta.contiguous(), r = r_k.contiguous();
  AT_DISPATCH_FLOATING_TYPES(lam.scalar_type(), "cyfa", [&] {
    write_forward<scalar_t>(d, l.data_ptr<scalar_t>(), bt.data_ptr<scalar_t>(),
                            r.data_ptr<scalar_t>(), width, keys.data_ptr<scalar_t>(),
                            values.data_ptr<scalar_t>());
  });
  return {keys, values};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> write_backward_impl(
    const at::Tensor& lam, const at::Tensor& beta, const at::Tensor& r_k, const at::Tensor& dkeys,
    const at::Tensor& dvalues, c10::DeviceType device) {
  const char* op = "linattn_native.cyfa_write_backward";
  check_float(op, lam, device);
  TORCH_CHECK(dkeys.dim() == 4, op, ": dkeys must be [B, H, T, M], got ", dkeys.sizes());
  const Shape d = shape_of(op, lam, dkeys.size(3));
  check_tokens(op, "beta", beta, lam);
  check_tokens(op, "r_k", r_k, lam);
  check_rows(op, "dkeys", dkeys, d, -1, lam);
  check_rows(op, "dvalues", dvalues, d, -1, lam);
  TORCH_CHECK(dvalues.size(3) >= dkeys.size(3), op, ": dvalues must have at least M = ",
              dkeys.size(3), " columns, got ", dvalues.size(3));
  const auto options = lam.options();
  if (device != c10::kCPU) {
    return {at::empty(lam.sizes(), options), at::empty(lam.sizes(), options),
            at::empty(lam.sizes(), options)};
  }
  at::Tensor dlam = at::empty(lam.sizes(), options);
  at::Tensor dbeta = at::empty(lam.sizes(), options);
  at::Tensor drk = at::empty(lam.sizes(), options);
  const at::Tensor l = lam.contiguous(), bt = beta.contiguous(), r = r_k.contiguous();
  const at::Tensor gk = unit_rows(dkeys), gv = unit_rows(dvalues);
  AT_DISPATCH_FLOATING_TYPES(lam.scalar_type(), "cyfa", [&] {
    write_backward<scalar_t>(d, l.data_ptr<scalar_t>(), bt.data_ptr<scalar_t>(),
                             r.data_ptr<scalar_t>(), rows_of<const scalar_t>(gk),
                             rows_of<const scalar_t>(gv), dlam.data_ptr<scalar_t>(),
                             dbeta.data_ptr<scalar_t>(), drk.data_ptr<scalar_t>());
  });
  return {dlam, dbeta, drk};
}

Shape readout_checks(const char* op, const at::Tensor& z, const at::Tensor& r_q,
                     const at::Tensor& lam, const at::Tensor& table, c10::DeviceType device) {
  check_float(op, lam, device);
  TORCH_CHECK(table.dim() == 3, op, ": table must be [H, P, M], got ", table.sizes());
  const int64_t M = table.size(2);
  const Shape d = shape_of(op, lam, M);
  TORCH_CHECK(table.size(0) == d.H && table.size(1) == M - 1, op, ": table must be [H, M - 1, M]"
              " = [", d.H, ", ", M - 1, ", ", M, "], got ", table.sizes());
  TORCH_CHECK(table.scalar_type() == lam.scalar_type() && table.device() == lam.device(), op,
              ": table must be a ", lam.scalar_type(), " tensor on ", lam.device());
  check_tokens(op, "r_q", r_q, lam);
  check_rows(op, "z", z, d, -1, lam);
  TORCH_CHECK(z.size(3) >= M, op, ": z must have at least M = ", M, " columns, got ", z.size(3));
  return d;
}

at::Tensor readout_impl(const at::Tensor& z, const at::Tensor& r_q, const at::Tensor& lam,
                        const at::Tensor& table, c10::DeviceType device) {
  const char* op = "linattn_native.cyfa_readout";
  const Shape d = readout_checks(op, z, r_q, lam, table, device);
  const int64_t M = 2 * d.J;
  if (device != c10::kCPU) return at::empty({d.B, d.H, d.T, M}, lam.options());
  at::Tensor u = fresh({d.B, d.H, d.T, M}, lam.options());
  const at::Tensor zr = unit_rows(z), rq = r_q.contiguous(), l = lam.contiguous();
  const at::Tensor E = table.contiguous();
  AT_DISPATCH_FLOATING_TYPES(lam.scalar_type(), "cyfa", [&] {
    readout_forward<scalar_t>(d, rows_of<const scalar_t>(zr), rq.data_ptr<scalar_t>(),
                              l.data_ptr<scalar_t>(), E.data_ptr<scalar_t>(),
                              u.data_ptr<scalar_t>());
  });
  return u;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> readout_backward_impl(
    const at::Tensor& z, const at::Tensor& r_q, const at::Tensor& lam, const at::Tensor& table,
    const at::Tensor& du, c10::DeviceType device) {
  const char* op = "linattn_native.cyfa_readout_backward";
  const Shape d = readout_checks(op, z, r_q, lam, table, device);
  check_rows(op, "du", du, d, table.size(2), lam);
  const auto options = lam.options();
  if (device != c10::kCPU) {
    return {at::empty(z.sizes(), options), at::empty(lam.sizes(), options),
            at::empty(lam.sizes(), options), at::empty(table.sizes(), options)};
  }
  at::Tensor dz = fresh(z.sizes(), options);
  at::Tensor drq = at::empty(lam.sizes(), options);
  at::Tensor dlam = at::empty(lam.sizes(), options);
  at::Tensor per_thread = at::zeros({at::get_num_threads(), d.H, table.size(1), table.size(2)},
                                    options.dtype(at::kDouble));
  const at::Tensor zr = unit_rows(z), rq = r_q.contiguous(), l = lam.contiguous();
  const at::Tensor E = table.contiguous(), g = unit_rows(du);
  AT_DISPATCH_FLOATING_TYPES(lam.scalar_type(), "cyfa", [&] {
    readout_backward<scalar_t>(d, rows_of<const scalar_t>(zr), rq.data_ptr<scalar_t>(),
                               l.data_ptr<scalar_t>(), E.data_ptr<scalar_t>(),
                               rows_of<const scalar_t>(g), z.size(3), dz.data_ptr<scalar_t>(),
                               drq.data_ptr<scalar_t>(), dlam.data_ptr<scalar_t>(),
                               per_thread.data_ptr<double>());
  });
  // the threads' sums, in float64, then in the table's dtype
  at::Tensor dtable = per_thread.sum(0);
  return {dz, drq, dlam, dtable.to(table.scalar_type())};
}

std::tuple<at::Tensor, at::Tensor> write_cpu(const at::Tensor& lam, const at::Tensor& beta,
                                             const at::Tensor& r_k, int64_t slots,
                                             int64_t width) {
  return write_impl(lam, beta, r_k, slots, width, c10::kCPU);
}
std::tuple<at::Tensor, at::Tensor> write_meta(const at::Tensor& lam, const at::Tensor& beta,
                                              const at::Tensor& r_k, int64_t slots,
                                              int64_t width) {
  return write_impl(lam, beta, r_k, slots, width, c10::kMeta);
}
std::tuple<at::Tensor, at::Tensor, at::Tensor> write_backward_cpu(
    const at::Tensor& lam, const at::Tensor& beta, const at::Tensor& r_k, const at::Tensor& dkeys,
    const at::Tensor& dvalues) {
  return write_backward_impl(lam, beta, r_k, dkeys, dvalues, c10::kCPU);
}
std::tuple<at::Tensor, at::Tensor, at::Tensor> write_backward_meta(
    const at::Tensor& lam, const at::Tensor& beta, const at::Tensor& r_k, const at::Tensor& dkeys,
    const at::Tensor& dvalues) {
  return write_backward_impl(lam, beta, r_k, dkeys, dvalues, c10::kMeta);
}
at::Tensor readout_cpu(const at::Tensor& z, const at::Tensor& r_q, const at::Tensor& lam,
                       const at::Tensor& table) {
  return readout_impl(z, r_q, lam, table, c10::kCPU);
}
at::Tensor readout_meta(const at::Tensor& z, const at::Tensor& r_q, const at::Tensor& lam,
                        const at::Tensor& table) {
  return readout_impl(z, r_q, lam, table, c10::kMeta);
}
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> readout_backward_cpu(
    const at::Tensor& z, const at::Tensor& r_q, const at::Tensor& lam, const at::Tensor& table,
    const at::Tensor& du) {
  return readout_backward_impl(z, r_q, lam, table, du, c10::kCPU);
}
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> readout_backward_meta(
    const at::Tensor& z, const at::Tensor& r_q, const at::Tensor& lam, const at::Tensor& table,
    const at::Tensor& du) {
  return readout_backward_impl(z, r_q, lam, table, du, c10::kMeta);
}

std::tuple<at::Tensor, at::Tensor> norm_impl(const at::Tensor& x, const at::Tensor& w, double eps,
                                             c10::DeviceType device) {
  const char* op = "linattn_native.cyfa_norm";
  check_float(op, x, device);
  TORCH_CHECK(x.dim() == 4, op, ": x must be [B, T, H, K], got ", x.sizes());
  TORCH_CHECK(w.dim() == 1 && w.size(0) == x.size(3), op, ": w must be [K] = [", x.size(3),
              "], got ", w.sizes());
  TORCH_CHECK(w.scalar_type() == x.scalar_type() && w.device() == x.device(), op,
              ": w must be a ", x.scalar_type(), " tensor on ", x.device());
  TORCH_CHECK(eps >= 0, op, ": eps must be >= 0, got ", eps);
  const auto options = x.options();
  const int64_t A = x.size(0), B = x.size(1), C = x.size(2), K = x.size(3);
  if (device != c10::kCPU) return {at::empty(x.sizes(), options), at::empty({A, B, C}, options)};
  at::Tensor y = fresh(x.sizes(), options);
  at::Tensor r = at::empty({A, B, C}, options);
  const at::Tensor xr = unit_rows(x), wc = w.contiguous();
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "cyfa", [&] {
    norm_forward<scalar_t>(A, B, C, K, rows3_of<const scalar_t>(xr), wc.data_ptr<scalar_t>(), eps,
                           y.data_ptr<scalar_t>(), r.data_ptr<scalar_t>());
  });
  return {y, r};
}

std::tuple<at::Tensor, at::Tensor> norm_backward_impl(const at::Tensor& x, const at::Tensor& w,
                                                      const at::Tensor& r,
                                                      const std::optional<at::Tensor>& dy,
                                                      const std::optional<at::Tensor>& dr,
                                                      c10::DeviceType device) {
  const char* op = "linattn_native.cyfa_norm_backward";
  check_float(op, x, device);
  TORCH_CHECK(x.dim() == 4, op, ": x must be [B, T, H, K], got ", x.sizes());
  const int64_t A = x.size(0), B = x.size(1), C = x.size(2), K = x.size(3);
  TORCH_CHECK(w.dim() == 1 && w.size(0) == K, op, ": w must be [K] = [", K, "], got ", w.sizes());
  TORCH_CHECK(r.sizes() == at::IntArrayRef({A, B, C}), op, ": r must be [B, T, H], got ",
              r.sizes());
  for (const auto& [name, t] : {std::pair<const char*, const at::Tensor*>{"w", &w}, {"r", &r}}) {
    TORCH_CHECK(t->scalar_type() == x.scalar_type() && t->device() == x.device(), op, ": ", name,
                " must be a ", x.scalar_type(), " tensor on ", x.device());
  }
  const bool has_dy = dy.has_value() && dy->defined();
  const bool has_dr = dr.has_value() && dr->defined();
  if (has_dy) {
    TORCH_CHECK(dy->sizes() == x.sizes() && dy->scalar_type() == x.scalar_type(), op,
                ": dy must be a ", x.scalar_type(), " tensor of x's shape ", x.sizes());
  }
  if (has_dr) {
    TORCH_CHECK(dr->sizes() == r.sizes() && dr->scalar_type() == x.scalar_type(), op,
                ": dr must be a ", x.scalar_type(), " tensor of r's shape ", r.sizes());
  }
  const auto options = x.options();
  if (device != c10::kCPU) return {at::empty(x.sizes(), options), at::empty({K}, options)};
  at::Tensor dx = fresh(x.sizes(), options);
  at::Tensor part = at::zeros({at::get_num_threads(), K}, options.dtype(at::kDouble));
  const at::Tensor xr = unit_rows(x), wc = w.contiguous(), rc = r.contiguous();
  const at::Tensor g = has_dy ? unit_rows(*dy) : xr;
  const at::Tensor drc = has_dr ? dr->contiguous() : rc;
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "cyfa", [&] {
    norm_backward<scalar_t>(A, B, C, K, rows3_of<const scalar_t>(xr), wc.data_ptr<scalar_t>(),
                            rc.data_ptr<scalar_t>(), rows3_of<const scalar_t>(g), has_dy,
                            has_dr ? drc.data_ptr<scalar_t>() : nullptr, dx.data_ptr<scalar_t>(),
                            part.data_ptr<double>());
  });
  return {dx, part.sum(0).to(x.scalar_type())};
}

std::tuple<at::Tensor, at::Tensor> norm_cpu(const at::Tensor& x, const at::Tensor& w, double eps) {
  return norm_impl(x, w, eps, c10::kCPU);
}
std::tuple<at::Tensor, at::Tensor> norm_meta(const at::Tensor& x, const at::Tensor& w,
                                             double eps) {
  return norm_impl(x, w, eps, c10::kMeta);
}
std::tuple<at::Tensor, at::Tensor> norm_backward_cpu(const at::Tensor& x, const at::Tensor& w,
                                                     const at::Tensor& r,
                                                     const std::optional<at::Tensor>& dy,
                                                     const std::optional<at::Tensor>& dr) {
  return norm_backward_impl(x, w, r, dy, dr, c10::kCPU);
}
std::tuple<at::Tensor, at::Tensor> norm_backward_meta(const at::Tensor& x, const at::Tensor& w,
                                                      const at::Tensor& r,
                                                      const std::optional<at::Tensor>& dy,
                                                      const std::optional<at::Tensor>& dr) {
  return norm_backward_impl(x, w, r, dy, dr, c10::kMeta);
}

}  // namespace

// lam, beta, r_k, r_q [B, T, H]; keys [B, H, T, M], values and z [B, H, T, W]; table [H, P, M];
// x and y [B, T, H, K], w [K], r [B, T, H].
TORCH_LIBRARY_FRAGMENT(linattn_native, m) {
  m.def("cyfa_write(Tensor lam, Tensor beta, Tensor r_k, int slots, int width)"
        " -> (Tensor, Tensor)");
  m.def("cyfa_write_backward(Tensor lam, Tensor beta, Tensor r_k, Tensor dkeys, Tensor dvalues)"
        " -> (Tensor, Tensor, Tensor)");
  m.def("cyfa_readout(Tensor z, Tensor r_q, Tensor lam, Tensor table) -> Tensor");
  m.def("cyfa_readout_backward(Tensor z, Tensor r_q, Tensor lam, Tensor table, Tensor du)"
        " -> (Tensor, Tensor, Tensor, Tensor)");
  m.def("cyfa_norm(Tensor x, Tensor w, float eps) -> (Tensor, Tensor)");
  m.def("cyfa_norm_backward(Tensor x, Tensor w, Tensor r, Tensor? dy, Tensor? dr)"
        " -> (Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(linattn_native, CPU, m) {
  m.impl("cyfa_write", &write_cpu);
  m.impl("cyfa_write_backward", &write_backward_cpu);
  m.impl("cyfa_readout", &readout_cpu);
  m.impl("cyfa_readout_backward", &readout_backward_cpu);
  m.impl("cyfa_norm", &norm_cpu);
  m.impl("cyfa_norm_backward", &norm_backward_cpu);
}

TORCH_LIBRARY_IMPL(linattn_native, Meta, m) {
  m.impl("cyfa_write", &write_meta);
  m.impl("cyfa_write_backward", &write_backward_meta);
  m.impl("cyfa_readout", &readout_meta);
  m.impl("cyfa_readout_backward", &readout_backward_meta);
  m.impl("cyfa_norm", &norm_meta);
  m.impl("cyfa_norm_backward", &norm_backward_meta);
}

}  // namespace linattn_native
