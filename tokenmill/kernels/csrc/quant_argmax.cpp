// Greedy sampling from a block-quantized LM head (the default model's tied head is 8-bit blocks):
// argmax over the first n_valid columns of x W^T without writing the logits. Each thread computes its
// groups' 16 columns for up to 4 rows at a time into a small tile with the same row kernel and the same
// quantized activations as q4_linear / q8_linear, so every value is theirs bit for bit; the running
// maximum keeps the first index on ties, as torch.argmax. A row whose values are all NaN gives column 0
// (as bf16_argmax_linear).
#include <ATen/Parallel.h>

#include <algorithm>
#include <limits>
#include <mutex>
#include <vector>

#include "gemm_split.h"
#include "ops.h"
#include "quant_acts.h"

namespace tokenmill_ops {

at::Tensor q_argmax_linear(const at::Tensor& x, const at::Tensor& records, int64_t bits, int64_t N, int64_t n_valid) {
  using namespace tokenmill_quant;
  TORCH_CHECK(x.dim() == 2, "x: [M, K]");
  TORCH_CHECK(n_valid > 0 && n_valid <= N, "n_valid must be in [1, N]");
  const int64_t M = x.size(0), K = x.size(1), nb = K / kBlockK;
  check_records(records, bits, N, K);
  const int64_t rec_size = bits == 4 ? kQ4Record : kQ8Record;
  auto out = new_tensor({M}, x.options().dtype(at::kLong));
  if (M == 0) return out;
  const at::Tensor xc = x.to(at::kFloat).contiguous();
  const QActsStorage acts = quantize_rows(xc);
  const RowsFn rows_fn = pick(bits == 4);
  const uint8_t* rp = records.data_ptr<uint8_t>();
  const int64_t chunk = rows_per_pass(K);
  std::vector<float> best_v(M, -std::numeric_limits<float>::infinity());
  std::vector<int64_t> best_i(M, -1);
  std::mutex merge;
  tokenmill_gemm::parallel_units_rows((n_valid + kGroupRows - 1) / kGroupRows, M, 4, [&](int64_t begin, int64_t end,
                                                                                         int64_t rb, int64_t re) {
    std::vector<float> lv(M, -std::numeric_limits<float>::infinity());
    std::vector<int64_t> li(M, -1);
    float tile[4 * kGroupRows];
    for (int64_t c0 = rb; c0 < re; c0 += chunk) {
      const int64_t c1 = std::min(re, c0 + chunk);
      for (int64_t g = begin; g < end; ++g) {  // columns in increasing order for every row
        const int64_t n0 = g * kGroupRows, ncols = std::min(kGroupRows, n_valid - n0);
        for (int64_t r0 = c0; r0 < c1; r0 += 4) {
          const int64_t rows = std::min<int64_t>(4, c1 - r0);
          rows_fn(rp + g * nb * rec_size, acts.view, r0, rows, nullptr, tile, kGroupRows, ncols);
          for (int64_t i = 0; i < rows; ++i)
            for (int64_t c = 0; c < ncols; ++c)
              if (tile[i * kGroupRows + c] > lv[r0 + i] || li[r0 + i] < 0) {
                if (tile[i * kGroupRows + c] != tile[i * kGroupRows + c]) continue;  // NaN
                lv[r0 + i] = tile[i * kGroupRows + c];
                li[r0 + i] = n0 + c;
              }
        }
      }
    }
    std::lock_guard<std::mutex> lock(merge);
    for (int64_t r = rb; r < re; ++r)  // the task's rows
      if (li[r] >= 0 && (best_i[r] < 0 || lv[r] > best_v[r] || (lv[r] == best_v[r] && li[r] < best_i[r]))) {
        best_v[r] = lv[r];
        best_i[r] = li[r];
      }
  });
  int64_t* o = out.data_ptr<int64_t>();
  for (int64_t r = 0; r < M; ++r) o[r] = std::max<int64_t>(best_i[r], 0);
  return out;
}

}  // namespace tokenmill_ops
