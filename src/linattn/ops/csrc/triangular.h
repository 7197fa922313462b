// The UT transform's triangular solves (spec section 8), written out: forward substitution on
// chunks of C <= 64 or so rows whose right-hand sides [c, K + V] stay in the L1 cache.
//
// Why not the BLAS's strsm: on blocks this small it cost 3x a matrix product of twice its
// operations (MKL, 64 x 64 into 64 x 128: 37 us against 12 us), and two threads running it at
// once each ran 1.25x slower than one alone (the delta rule's forward pass, one process per
// core), which held the delta rule's two-thread speed-up at 1.4-1.5x (issue 21). Substitution
// keeps a block of columns of a group of rows in registers while it subtracts the rows above
// them, each row above loaded once for the group (issue 34: row by row, a load per fused
// multiply-add, the solve ran at a third of a matrix product's rate).
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
