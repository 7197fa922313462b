// The triangular solves of triangular.h, by substitution, a block of columns at a time.

#include "triangular.h"

#include <algorithm>
#include <cmath>

namespace linattn_native {
namespace {

// One row of a solve: row i subtracts rows [j0, j1) with the weights l[j * sl].
struct RowTerms {
  int64_t i, j0, j1;
  const float* l;
  int64_t sl;
};

// The rows subtracted from a row are summed in blocks of this many: each block's sum starts from
// zero and is then subtracted once, so that the rounding error grows with the block length plus
// the number of blocks, not with the number of rows (a blocked BLAS solve sums so too; summed
// row after row, one 64-row chunk moved a training step's gate gradients by 1.4e-5 of float64
// against 1e-5 before, tests/integrations/test_fla.py).
constexpr int64_t kSumBlock = 16;

// Columns [c0, c0 + W) of row i: x_i <- x_i - sum_j l_j x_j over the rows j in [j0, j1) (the
// rows above i for the solve, below it for the transposed solve), with l_j = l[j * sl], in
// blocks of ``kSumBlock`` rows. The W columns stay in registers while the rows are subtracted.
// Every column takes the same fused multiply-adds in the same order, whether the compiler
// vectorises it or not (W = 1), so the result does not depend on where X lies in memory: the
// schedules give the same bits.
template <int W>
inline void subtract_rows(float* xi, const float* X, int64_t ldx, int64_t j0, int64_t j1,
                          const float* l, int64_t sl) {
  float acc[W];
#pragma omp simd
  for (int col = 0; col < W; ++col) acc[col] = xi[col];
  for (int64_t jb = j0; jb < j1; jb += kSumBlock) {
    const int64_t je = std::min(jb + kSumBlock, j1);
    float part[W];
#pragma omp simd
    for (int col = 0; col < W; ++col) part[col] = 0.0f;
    for (int64_t j = jb; j < je; ++j) {
      const float lj = l[j * sl];
      const float* xj = X + j * ldx;
#pragma omp simd
      for (int col = 0; col < W; ++col) part[col] = std::fma(lj, xj[col], part[col]);
    }
#pragma omp simd
    for (int col = 0; col < W; ++col) acc[col] -= part[col];
  }
#pragma omp simd
  for (int col = 0; col < W; ++col) xi[col] = acc[col];
}

// Columns [c0, c0 + W) of every row, in the solve's order: ``rows(step)`` is the step-th row to
// solve and what it subtracts (``RowTerms``). A block of W columns of all c rows (c x W floats:
// 32 KB for 64 x 128) stays in the L1 cache while it is solved.
template <int W, typename Rows>
inline void solve_block(float* X, int64_t ldx, int64_t c0, const Rows& rows, int64_t c) {
  for (int64_t step = 0; step < c; ++step) {
    const auto [i, j0, j1, l, sl] = rows(step);
    subtract_rows<W>(X + i * ldx + c0, X + c0, ldx, j0, j1, l, sl);
  }
}

// Every column, in blocks of 128 (8 AVX-512 registers: 8 chains of fused multiply-adds in
// flight, enough to hide their latency; [W | U0] at K = V = 64 is one block), then of 64 and 16,
// then one column at a time.
template <typename Rows>
inline void solve_columns(int64_t c, int64_t n, float* X, int64_t ldx, const Rows& rows) {
  int64_t c0 = 0;
  for (; c0 + 128 <= n; c0 += 128) solve_block<128>(X, ldx, c0, rows, c);
  for (; c0 + 64 <= n; c0 += 64) solve_block<64>(X, ldx, c0, rows, c);
  for (; c0 + 16 <= n; c0 += 16) solve_block<16>(X, ldx, c0, rows, c);
  for (; c0 < n; ++c0) solve_block<1>(X, ldx, c0, rows, c);
}

}  // namespace

void unit_lower_solve(int64_t c, int64_t n, const float* L, int64_t ldl, float* X, int64_t ldx) {
  // Row i = 0, ..., c - 1 reads L[i, j] for j < i: stride 1.
  solve_columns(c, n, X, ldx, [&](int64_t i) { return RowTerms{i, 0, i, L + i * ldl, 1}; });
}

void unit_lower_solve_transposed(int64_t c, int64_t n, const float* L, int64_t ldl, float* X,
                                 int64_t ldx) {
  // Row i = c - 1, ..., 0 reads L[j, i] for j > i: stride ldl.
  solve_columns(c, n, X, ldx, [&](int64_t step) {
    const int64_t i = c - 1 - step;
    return RowTerms{i, i + 1, c, L + i, ldl};
  });
}

}  // namespace linattn_native
