// The triangular solves of triangular.h, by substitution: a block of columns at a time, a group of
// rows at a time.

#include "triangular.h"

#include <algorithm>
#include <cmath>

#include "simd.h"

namespace linattn_native {
namespace {

// The rows subtracted from a row are summed in blocks of this many: each block's sum starts from
// zero and is then subtracted once, so that the rounding error grows with the block length plus
// the number of blocks, not with the number of rows (a blocked BLAS solve sums so too; summed
// row after row, one 64-row chunk moved a training step's gate gradients by 1.4e-5 of float64
// against 1e-5 before, tests/integrations/test_fla.py).
constexpr int64_t kSumBlock = 16;

// Rows solved together (``solve_rows``): they share each loaded row above them. A group lies in
// one block of ``kSumBlock`` rows.
constexpr int kGroup = 4;
static_assert(kSumBlock % kGroup == 0, "a group of rows must lie in one summation block");

// A solve in the order it runs: rows x_i = x + i sx (i = 0, ..., c - 1), row i subtracting
// sum_{j < i} l(i, j) x_j with the weight l(i, j) = l[i li + j lj]. The solve of (I + L) reads
// L in place (li = ldl, lj = 1); the transposed solve is the same solve over the rows in reverse
// (sx < 0, and l(i, j) = L[c - 1 - j, c - 1 - i]).
struct Solve {
  int64_t c;
  float* x;
  int64_t sx;
  const float* l;
  int64_t li, lj;

  float* row(int64_t i) const { return x + i * sx; }
  float weight(int64_t i, int64_t j) const { return l[i * li + j * lj]; }
};

// part[r N + n] += l(i0 + r, j) x_j over the rows j in [j0, j1), for R rows at once: each x_j
// (N vectors from column c0) is loaded once for the R rows, and the R N sums stay in registers.
// Each sum takes its fused multiply-adds in the order of j.
template <int N, int R>
inline void accumulate(const Solve& s, int64_t i0, int64_t j0, int64_t j1, int64_t c0,
                       Vec* part) {
  for (int64_t j = j0; j < j1; ++j) {
    const float* xj = s.row(j) + c0;
    Vec xv[N];
    for (int n = 0; n < N; ++n) xv[n] = in_register(load(xj + n * kLanes));
    for (int r = 0; r < R; ++r) {
      const Vec w = splat(s.weight(i0 + r, j));
      for (int n = 0; n < N; ++n) part[r * N + n] = fmadd(w, xv[n], part[r * N + n]);
    }
  }
}

// x_i <- x_i - part over N vectors from column c0.
template <int N>
inline void subtract(float* xi, const Vec* part) {
  for (int n = 0; n < N; ++n) store(xi + n * kLanes, load(xi + n * kLanes) - part[n]);
}

// Rows [i0, i0 + R) of columns [c0, c0 + N kLanes): row i <- x_i - sum_{j < i} l(i, j) x_j,
// summed in the blocks [m kSumBlock, (m + 1) kSumBlock) of j below i, each from zero. The R rows
// lie in one block (i0 % R == 0): the blocks above it, and the part of their own block above
// i0, are summed for the R rows together (``accumulate``), then each row adds the group's rows
// above it, solved just before, and subtracts its last block. The same operations in the same
// order as row by row, so the same bits whatever R and N.
template <int N, int R>
inline void solve_rows(const Solve& s, int64_t i0, int64_t c0) {
  const int64_t open = i0 - i0 % kSumBlock;  // the first row of the group's own block
  Vec part[R * N];
  for (int64_t jb = 0; jb <= open; jb += kSumBlock) {
    for (Vec& p : part) p = Vec{};
    accumulate<N, R>(s, i0, jb, jb < open ? jb + kSumBlock : i0, c0, part);
    if (jb == open) break;
    for (int r = 0; r < R; ++r) subtract<N>(s.row(i0 + r) + c0, part + r * N);
  }
  for (int r = 0; r < R; ++r) {
    const int64_t i = i0 + r;
    accumulate<N, 1>(s, i, i0, i, c0, part + r * N);
    subtract<N>(s.row(i) + c0, part + r * N);  // 0 subtracted from a first row: no change
  }
}

// Columns [c0, c0 + N kLanes) of every row: groups of ``kGroup`` rows, then the last rows one
// by one. A block of N kLanes columns of all c rows (16 KB for 64 x 64) stays in the L1 cache
// while it is solved.
template <int N>
inline void solve_block(const Solve& s, int64_t c0) {
  int64_t i = 0;
  for (; i + kGroup <= s.c; i += kGroup) solve_rows<N, kGroup>(s, i, c0);
  for (; i < s.c; ++i) solve_rows<N, 1>(s, i, c0);
}

// One column, row by row (the last n % kLanes columns), in the same blocks and order.
void solve_column(const Solve& s, int64_t col) {
  for (int64_t i = 0; i < s.c; ++i) {
    float acc = s.row(i)[col];
    for (int64_t jb = 0; jb < i; jb += kSumBlock) {
      float part = 0.0f;
      for (int64_t j = jb; j < std::min(jb + kSumBlock, i); ++j) {
        part = std::fma(s.weight(i, j), s.row(j)[col], part);
      }
      acc -= part;
    }
    s.row(i)[col] = acc;
  }
}

// Every column: blocks of 4 vectors (64 columns with AVX-512: with groups of 4 rows, 16
// accumulators, and 4 loads and 4 broadcasts to 16 fused multiply-adds), then of one vector,
// then one column at a time.
void solve(const Solve& s, int64_t n) {
  int64_t c0 = 0;
  for (; c0 + 4 * kLanes <= n; c0 += 4 * kLanes) solve_block<4>(s, c0);
  for (; c0 + kLanes <= n; c0 += kLanes) solve_block<1>(s, c0);
  for (; c0 < n; ++c0) solve_column(s, c0);
}

}  // namespace

void unit_lower_solve(int64_t c, int64_t n, const float* L, int64_t ldl, float* X, int64_t ldx) {
  solve({c, X, ldx, L, ldl, 1}, n);
}

void unit_lower_solve_transposed(int64_t c, int64_t n, const float* L, int64_t ldl, float* X,
                                 int64_t ldx) {
  if (c == 0) return;
  // Row c - 1 - i of X is the i-th solved; it subtracts the rows j' > i' solved before it,
  // x_{i'} -= L[j', i'] x_{j'}, i' = c - 1 - i and j' = c - 1 - j: l(i, j) = L[c - 1 - j,
  // c - 1 - i] = (L + (c - 1)(ldl + 1))[-i - j ldl].
  solve({c, X + (c - 1) * ldx, -ldx, L + (c - 1) * (ldl + 1), -1, -ldl}, n);
}

}  // namespace linattn_native
