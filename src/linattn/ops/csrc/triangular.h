// The UT transform's triangular solves (spec section 8), written out: forward substitution on
// chunks of C <= 64 or so rows whose right-hand sides [c, K + V] stay in the L1 cache.
//
// Why not the BLAS's strsm: on blocks this small it costs more than a matrix product of twice
// its operations, and two threads running it at once each run slower than one alone,
// which limits the delta rule's two-thread speed-up. Substitution keeps a block of columns of a
// group of rows in registers while it subtracts the rows above them, each row above loaded once
// for the group (row by row, a load per fused multiply-add, the solve would run well below a
// matrix product's rate).
#pragma once

#include <cstdint>

namespace linattn_native {

// Solve (I + L) X = X in place for unit-lower-triangular I + L [c, c] (row-major, stride ldl;
// only L's strictly lower part is read) and X [c, n] (row-major, stride ldx):
// x_i <- x_i - sum_{j < i} L_ij x_j for i = 0, 1, ..., c - 1.
void unit_lower_solve(int64_t c, int64_t n, const float* L, int64_t ldl, float* X, int64_t ldx);

// Solve (I + L)^T X = X in place (the same storage as ``unit_lower_solve``), its gradient:
// x_i <- x_i - sum_{j > i} L_ji x_j for i = c - 1, ..., 0, the sum taken from j = c - 1 down.
void unit_lower_solve_transposed(int64_t c, int64_t n, const float* L, int64_t ldl, float* X,
                                 int64_t ldx);

}  // namespace linattn_native
