// How a GEMM's work goes out to the threads: its column units (panels, panel pairs, groups of
// block-quantized rows) and its M rows cut into a grid of unit slices x row slices, one task each.
// Cutting the columns alone left threads idle on many-core servers wherever a layer has few units:
// the default model's o_proj and down_proj have 36 groups of 16 columns, which a grain of 4 groups
// spread over at most 9 threads, and a GQA k/v projection fewer still. Rows are cut only for
// compute-bound calls (M >= 2 * kMinSliceRows, prompt chunks): there a slice of rows re-reads its
// units' weights, cheap against its multiply-adds. Decode-sized calls keep whole columns, at least
// min_units a task, since their cost is reading the weights once. Each row's sums are the same
// whichever slice computes it (the kernels' per-row order does not depend on the rows beside it).
#pragma once

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>

namespace tokenmill_gemm {

constexpr int64_t kMinSliceRows = 8;

struct GemmSplit {
  int64_t unit_slices = 1, row_slices = 1;
  int64_t tasks() const { return unit_slices * row_slices; }
};

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// The grid with the smallest largest task (ceil(units / U) x ceil(M / R)); on a tie, fewer tasks,
// then fewer row slices (fewer re-reads of the weights).
inline GemmSplit split_gemm(int64_t units, int64_t M, int64_t threads, int64_t min_units) {
  threads = std::max<int64_t>(1, threads);
  units = std::max<int64_t>(1, units);
  GemmSplit best;
  best.unit_slices = std::min(threads, ceil_div(units, std::max<int64_t>(1, min_units)));
  if (M < 2 * kMinSliceRows) return best;
  int64_t best_cost = ceil_div(units, best.unit_slices) * M;
  for (int64_t u = 1; u <= std::min(threads, units); ++u) {
    const int64_t r = std::max<int64_t>(1, std::min(threads / u, M / kMinSliceRows));
    const int64_t cost = ceil_div(units, u) * ceil_div(M, r);
    const GemmSplit s{u, r};
    if (cost < best_cost || (cost == best_cost && (s.tasks() < best.tasks() ||
                                                    (s.tasks() == best.tasks() && r < best.row_slices)))) {
      best = s;
      best_cost = cost;
    }
  }
  return best;
}

// body(u0, u1, r0, r1): the units [u0, u1) over the rows [r0, r1), once per task of split_gemm's grid
template <typename Body>
void parallel_units_rows(int64_t units, int64_t M, int64_t min_units, const Body& body) {
  const GemmSplit s = split_gemm(units, M, at::get_num_threads(), min_units);
  at::parallel_for(0, s.tasks(), 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const int64_t u = t % s.unit_slices, r = t / s.unit_slices;
      body(units * u / s.unit_slices, units * (u + 1) / s.unit_slices, M * r / s.row_slices,
           M * (r + 1) / s.row_slices);
    }
  });
}

}  // namespace tokenmill_gemm
