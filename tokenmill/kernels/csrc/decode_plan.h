// How paged_decode (paged_decode.cpp) divides a step's decode attention among the threads: tasks of
// (sequence, KV heads, token range), and each thread's contiguous range of them. No ATen here.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

namespace tokenmill_decode {

// One unit of parallel work: tokens [t0, t1) of sequence b's visible context, KV heads [h0, h1).
// part >= 0: the context is split, and this piece's output and log-sum-exp go to partial row `part`.
struct DecodeTask {
  int64_t b, h0, h1, t0, t1, part;
};

// A split context: sequence b's pieces hold partial rows [first, first + count).
struct DecodeJoin {
  int64_t b, first, count;
};

struct DecodePlan {
  std::vector<DecodeTask> tasks;  // grouped by sequence, then piece, then heads
  std::vector<DecodeJoin> joins;  // one per split context
  int64_t parts = 0;              // partial rows (pieces of split contexts)
};

constexpr int64_t kMinPiece = 256;  // tokens: below this a piece's setup and the join cost more than they save

// Tasks for B sequences on `threads` threads. Whole sequences when there are enough of them, else one
// task per KV head (every K/V row is still read once). Outside batch-invariant mode a context whose
// tasks would hold more than 1 / (2 threads) of the step's K/V rows is cut into pieces of at least
// kMinPiece tokens and all KV heads (whole rows, read in order), joined afterwards by their
// log-sum-exp (split-K, as flash-decoding does on GPUs): one long sequence, or a few, otherwise leave
// threads idle (9/3 heads at batch 1: three tasks on two threads, or on 32). Batch-invariant mode
// never cuts: a sequence's sums then do not depend on the batch or the thread count.
inline DecodePlan plan_decode(const int64_t* seq_lens, int64_t B, int64_t Hkv, int64_t window, int64_t threads,
                       bool split_context) {
  const int64_t per = B >= 2 * threads ? Hkv : 1;  // KV heads per task
  auto visible = [&](int64_t b) { return window > 0 ? std::min(seq_lens[b], window) : seq_lens[b]; };
  int64_t rows = 0;  // K/V rows (token x KV head) of the step
  for (int64_t b = 0; b < B; ++b) rows += visible(b) * Hkv;
  const int64_t target = std::max<int64_t>(1, (rows + 2 * threads - 1) / (2 * threads));  // rows per task
  DecodePlan plan;
  for (int64_t b = 0; b < B; ++b) {
    const int64_t len = visible(b), first = seq_lens[b] - len;
    int64_t pieces = 1, heads = per;
    if (split_context && len * per > target) {
      pieces = std::max<int64_t>(1, std::min((len * Hkv + target - 1) / target, len / kMinPiece));
      if (pieces > 1) heads = Hkv;
    }
    if (pieces > 1) plan.joins.push_back({b, plan.parts, pieces});
    for (int64_t c = 0; c < pieces; ++c) {
      const int64_t t0 = first + len * c / pieces, t1 = first + len * (c + 1) / pieces;
      const int64_t part = pieces > 1 ? plan.parts++ : -1;
      for (int64_t h0 = 0; h0 < Hkv; h0 += heads) plan.tasks.push_back({b, h0, h0 + heads, t0, t1, part});
    }
  }
  return plan;
}

// Task ranges [bounds[i], bounds[i + 1]), one per thread, of about equal work (the K/V rows each
// task reads, plus a fixed cost per task): contexts differ widely (W1: 64-768 tokens), so equal task
// counts per thread left one thread waiting for the other.
inline std::vector<int64_t> balanced_ranges(const std::vector<DecodeTask>& tasks, int64_t threads) {
  constexpr int64_t kTaskCost = 32;  // rows' worth of per-task setup (slots, softmax, scratch)
  const int64_t count = static_cast<int64_t>(tasks.size()), n = std::max<int64_t>(1, std::min(threads, count));
  std::vector<int64_t> cum(count + 1, 0);
  for (int64_t t = 0; t < count; ++t)
    cum[t + 1] = cum[t] + (tasks[t].t1 - tasks[t].t0 + kTaskCost) * (tasks[t].h1 - tasks[t].h0);
  std::vector<int64_t> bounds(n + 1, count);
  bounds[0] = 0;
  for (int64_t i = 1, t = 0; i < n; ++i) {  // first task whose range starts at or past i/n of the work
    while (t < count && cum[t] * n < cum[count] * i) ++t;
    if (t > bounds[i - 1] && cum[t] * n - cum[count] * i > cum[count] * i - cum[t - 1] * n) --t;  // the nearer edge
    bounds[i] = t;
  }
  return bounds;
}

}  // namespace tokenmill_decode
