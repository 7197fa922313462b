// How the chunk form's work is spread over the threads (the forward and backward passes alike).
//
// fused: each thread takes whole heads, every step of a chunk in turn, chunk after chunk: one
//        pass over memory, the fastest where the P = B H heads divide evenly over the threads.
// split: the steps that do not read the state (terms.h) run for every (chunk, head) pair at once,
//        into a buffer of every chunk's terms (memory linear in T); then the state pass, per head;
//        then what reads the saved states, again for every (chunk, head) pair. More memory
//        traffic, but every thread busy when the heads are fewer than the threads or divide
//        unevenly over them (B = 1 inference on many cores).
//
// ``LINATTN_SCHEDULE=fused|split`` in the environment forces one (the tests run both); by default
// the split is taken where the fused schedule would leave at least half of the threads' time
// idle: ceil(P / threads) threads >= kSplitImbalance P (P = 1 on 2 threads; P <= 8 on 16).
#pragma once

#include <ATen/Parallel.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>
#include <algorithm>

#include "blas.h"
#include "gates.h"
#include "tuning.h"

namespace linattn_native {

// The split schedule is taken where the fused schedule's threads x ceil(P / threads) reaches this
// factor times P (tuning.SPLIT_IMBALANCE says how it was chosen).
constexpr double kSplitImbalance = LINATTN_SPLIT_IMBALANCE;
static_assert(kSplitImbalance >= 1.0, "LINATTN_SPLIT_IMBALANCE must be >= 1");

// Whether the split schedule runs for P heads on the current number of threads.
inline bool split_schedule(int64_t P) {
  const char* forced = std::getenv("LINATTN_SCHEDULE");
  if (forced && std::strcmp(forced, "split") == 0) return true;
  if (forced && std::strcmp(forced, "fused") == 0) return false;
  const int64_t threads = at::get_num_threads();
  if (threads <= 1 || P <= 0) return false;
  const int64_t rounds = (P + threads - 1) / threads;
  return static_cast<double>(rounds * threads) >= kSplitImbalance * static_cast<double>(P);
}

// at::parallel_for over [0, n) with each task's thread set up for the kernels: subnormals
// flushed and the BLAS sequential (``SequentialBlas``): the threads are ours.
template <typename F>
void parallel_tasks(int64_t n, const F& body) {
  at::parallel_for(0, n, 1, [&](int64_t lo, int64_t hi) {
    FlushSubnormals flush;
    SequentialBlas blas;
    body(lo, hi);
  });
}

// How many distinct threads ``parallel_tasks`` runs n tasks on: the check that the kernels'
// parallel loops really are parallel (without OpenMP compiled into the extension, at::parallel_for
// runs every task on the calling thread, and the kernels would silently use one core).
inline int64_t threads_used(int64_t n) {
  std::vector<char> seen(static_cast<size_t>(std::max(at::get_num_threads(), 1)), 0);
  parallel_tasks(n, [&](int64_t, int64_t) {
    const int t = at::get_thread_num();
    if (t >= 0 && t < static_cast<int>(seen.size())) seen[t] = 1;
  });
  int64_t used = 0;
  for (char s : seen) used += s;
  return used;
}

}  // namespace linattn_native
