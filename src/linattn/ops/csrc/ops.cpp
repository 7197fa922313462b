// The kernels registered with torch.library as the ops ``torch.ops.linattn_native.*``: a schema
// each and the CPU kernel. The chunk form's two kernels are plain kernels of the one op that is
// traced, ``linattn::chunk_forward`` / ``chunk_backward`` (``linattn.ops.library``: its schema,
// fake kernels and autograd exist at import, whether or not this extension is built), which
// calls them on eager float32 CPU tensors; they keep their own checks, which guard memory (a
// direct call through torch.ops can pass anything), but no fake kernel of their own. The
// generation step has no Python op around it: its Meta kernel is its fake kernel.

#include <torch/library.h>

#include "block_cache.h"
#include "kernels.h"
#include "schedule.h"

namespace linattn_native {

TORCH_LIBRARY(linattn_native, m) {
  m.def(
      "chunk_forward(Tensor q, Tensor k, Tensor v, Tensor? beta, Tensor? g, Tensor S0, float scale,"
      " int C, bool keep, str rule, str gate, int reads=1, Tensor? bonus=None)"
      " -> (Tensor, Tensor, Tensor)");
  m.def(
      "chunk_backward(Tensor q, Tensor k, Tensor v, Tensor? beta, Tensor? g, Tensor states,"
      " Tensor d_o, Tensor dS_final, float scale, int C, str rule, str gate, int reads=1)"
      " -> (Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)");
  m.def(
      "recurrent_step(Tensor(a!) state, Tensor q, Tensor k, Tensor v, Tensor? beta, Tensor? g,"
      " float scale, str rule, str gate, Tensor? source=None, Tensor? b=None) -> Tensor");
  m.def(
      "short_conv_forward(Tensor x, Tensor weight, Tensor? bias, Tensor? state, bool silu)"
      " -> Tensor");
  m.def(
      "short_conv_backward(Tensor dy, Tensor x, Tensor weight, Tensor? bias, Tensor? state,"
      " bool silu) -> (Tensor, Tensor, Tensor, Tensor)");
  m.def(
      "atk_forward(Tensor k, Tensor g, Tensor beta, Tensor A0, Tensor center, float log_x,"
      " float eps, bool keep) -> (Tensor, Tensor, Tensor)");
  m.def(
      "atk_backward(Tensor k, Tensor g, Tensor beta, Tensor A0, Tensor center, Tensor A_all,"
      " Tensor dkp, Tensor dA_end, float log_x, float eps)"
      " -> (Tensor, Tensor, Tensor, Tensor, Tensor)");
  m.def("logsumexp_gate_forward(Tensor x, Tensor? z0) -> (Tensor, Tensor, Tensor)");
  m.def(
      "logsumexp_gate_backward(Tensor k, Tensor g, Tensor? dk, Tensor? dg, Tensor? dz_last,"
      " Tensor first_constant) -> (Tensor, Tensor)");
  m.def("empty_huge(int[] sizes, ScalarType dtype) -> Tensor", &empty_huge);
  m.def("cache_release() -> int", &cache_release);
  m.def("cache_bytes() -> int", &cache_bytes);
  m.def("threads_used(int n) -> int", &threads_used);
}

TORCH_LIBRARY_IMPL(linattn_native, CPU, m) {
  m.impl("chunk_forward", &chunk_forward);
  m.impl("chunk_backward", &chunk_backward);
  m.impl("recurrent_step", &recurrent_step);
  m.impl("short_conv_forward", &short_conv_forward);
  m.impl("short_conv_backward", &short_conv_backward);
  m.impl("atk_forward", &atk_forward);
  m.impl("atk_backward", &atk_backward);
  m.impl("logsumexp_gate_forward", &logsumexp_gate_forward);
  m.impl("logsumexp_gate_backward", &logsumexp_gate_backward);
}

TORCH_LIBRARY_IMPL(linattn_native, Meta, m) {
  m.impl("recurrent_step", &recurrent_step_meta);
  m.impl("short_conv_forward", &short_conv_forward_meta);
  m.impl("short_conv_backward", &short_conv_backward_meta);
}

// TTT-Linear's dual form and Titans' chunk form, forward and backward (ttt.cpp; ``linattn.ops.ttt``
// and ``linattn.ops.titans`` call them eagerly on float32 CPU tensors, outside a trace).
TORCH_LIBRARY_FRAGMENT(linattn_native, m) {
  m.def(
      "ttt_forward(Tensor q, Tensor k, Tensor v, Tensor eta, Tensor w, Tensor b, Tensor W0,"
      " Tensor h0, float scale, float eps, int size, int every, bool keep)"
      " -> (Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)");
  m.def(
      "ttt_backward(Tensor q, Tensor k, Tensor v, Tensor eta, Tensor w, Tensor b, Tensor Ws,"
      " Tensor hs, Tensor z, Tensor d_o, Tensor? dW, Tensor? dh, float scale, float eps, int size,"
      " int every)"
      " -> (Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)");
  m.def(
      "titans_forward(Tensor q, Tensor k, Tensor v, Tensor theta, Tensor alpha, Tensor eta,"
      " Tensor w, Tensor b, Tensor M0, Tensor S0, float eps, int size, int every, bool keep)"
      " -> (Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)");
  m.def(
      "titans_backward(Tensor q, Tensor k, Tensor v, Tensor theta, Tensor alpha, Tensor eta,"
      " Tensor w, Tensor b, Tensor Ms, Tensor Ss, Tensor z, Tensor d_o, Tensor? dM, Tensor? dS,"
      " float eps, int size, int every)"
      " -> (Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(linattn_native, CPU, m) {
  m.impl("ttt_forward", &ttt_forward);
  m.impl("ttt_backward", &ttt_backward);
  m.impl("titans_forward", &titans_forward);
  m.impl("titans_backward", &titans_backward);
}

}  // namespace linattn_native

// Preconditioned DeltaNet's write keys, the ATK scan with the write strengths applied (atk.cpp;
// ``linattn.ops.precond_delta_rule`` calls them eagerly on float32 CPU tensors, outside a trace).
namespace linattn_native {

TORCH_LIBRARY_FRAGMENT(linattn_native, m) {
  m.def(
      "atk_write_forward(Tensor k, Tensor g, Tensor beta, Tensor A0, Tensor center,"
      " Tensor strength, float log_x, float eps, bool keep) -> (Tensor, Tensor, Tensor)");
  m.def(
      "atk_write_backward(Tensor k, Tensor g, Tensor beta, Tensor A0, Tensor center,"
      " Tensor strength, Tensor A_all, Tensor dw, Tensor dA_end, Tensor? dr, float log_x,"
      " float eps)"
      " -> (Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(linattn_native, CPU, m) {
  m.impl("atk_write_forward", &atk_write_forward);
  m.impl("atk_write_backward", &atk_write_backward);
}

}  // namespace linattn_native
