// The terms and gradients of one chunk in the backward pass (backward.cpp), which its steps, free
// functions, read and write explicitly; rules/ differentiate their own terms over the same.
#pragma once

#include <cstdint>

#include "products.h"
#include "terms.h"

namespace linattn_native {

// The sizes every step reads: c tokens, K, V, the blocks' row stride C, the gate width kg (0, 1
// or K: none, one per token, one per channel) and the scale of q.
struct Dims {
  int c;
  int64_t K, V, C, kg;
  float scale;
  int64_t writes;  // the rule's write vectors per token (rules.h): n = writes c write rows
  bool gated() const { return kg > 0; }
  bool channel() const { return kg > 1; }
  int64_t rows() const { return writes * c; }  // the chunk's write rows (Ke, U)
  int64_t lda() const { return writes * C; }   // the row stride of A_q = [A_qk | A_qa] and dA
};

// Where a chunk's gradients go (the rows of each, row strides ld*) and dO, the gradient of its
// outputs; dbeta (delta rule) and dg (with a gate) nullptr where the mechanism has none. dq, dk
// are per value head (summed over each group of grouped heads at the end).
struct ChunkGrads {
  const float* dO;
  int64_t lddo;
  float *dQ, *dK, *dV, *dB, *dg;
  int64_t lddq, lddk, lddv, sdb, lddg;
};

// The forward terms of a chunk, recomputed from the state S entering it: terms.h's ``Terms``
// (with the rule's scores and, for the delta rule, X = [W | U0]), the rows the products read,
// Gamma = exp(G_i - G_j) for one gate per token, and the pseudo-values U [c, V] (row stride ldu).
struct Recomputed {
  Terms t;
  GatedRows r;
  const float* Gam;
  const float* U;
  int64_t ldu;
};

// The gradients of a chunk's terms, in one thread's blocks: dA ([c, writes C]: of A_q, then of
// the delta rule's L, or the dplr rule's A_bk and L), dU ([writes c, V], row stride lddu: the
// rule's own block where U reads the state; the additive rule's dU is dv itself), dR_k, dQd
// [c, K], dKe [writes c, K], the per-channel products' dX, dY [c, K], and the gates': dG [c, kg]
// per row, dGe (Ke's share), dG_diag [c] (A_qk's diagonal), dG_end [kg] (G_c's share), and
// dGx [c, kg] (the products' share of dg itself: ``product_gate_gradient``,
// ``channel_gate_share``).
struct TermGrads {
  float* dA;
  float* dU;
  int64_t lddu;
  float *dRk, *dQd, *dKe, *dX, *dY, *dG, *dGe, *dG_diag, *dG_end, *dGx;
};

}  // namespace linattn_native
