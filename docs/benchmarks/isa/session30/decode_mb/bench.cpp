// standalone: decode_heads on in-L2 data, single thread; variant source included via DEC macro
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <random>
#include <chrono>
#include DEC
int main(int argc, char** argv) {
  const int64_t H = 9, Hkv = 3, D = 64, G = 3;
  int64_t B = argc > 1 ? atoi(argv[1]) : 2, len = argc > 2 ? atoi(argv[2]) : 1024, reps = argc > 3 ? atoi(argv[3]) : 300;
  std::mt19937 rng(0); std::normal_distribution<float> nd;
  std::vector<uint16_t> k(B * len * Hkv * D), v(B * len * Hkv * D);
  for (auto& x : k) { float f = nd(rng); uint32_t b; memcpy(&b, &f, 4); x = b >> 16; }
  for (auto& x : v) { float f = nd(rng); uint32_t b; memcpy(&b, &f, 4); x = b >> 16; }
  std::vector<int64_t> slots(B * len);
  // blocks of 16 tokens in shuffled order
  std::vector<int64_t> blocks(B * len / 16); for (size_t i = 0; i < blocks.size(); ++i) blocks[i] = i;
  std::shuffle(blocks.begin(), blocks.end(), rng);
  for (int64_t t = 0; t < B * len; ++t) slots[t] = blocks[t / 16] * 16 + t % 16;
  std::vector<float> q(B * H * D), out(B * H * D);
  for (auto& x : q) x = nd(rng);
  std::vector<float> scratch(tm_avx512::decode_scratch_floats(G, len, D, Hkv));
  double best = 1e30;
  for (int r = 0; r < 5; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < reps; ++i)
      for (int64_t b = 0; b < B; ++b)
        tm_avx512::decode_heads(q.data() + b * H * D, k.data(), v.data(), true, slots.data() + b * len, len, out.data() + b * H * D, G, Hkv, 0, Hkv, D, 0.125f, scratch.data());
    double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / reps;
    best = std::min(best, dt);
  }
  double cs = 0; for (float x : out) cs += x;
  printf("B %ld len %ld: %.1f ns/token  %.1f cycles/token@2.33GHz  checksum %.6f\n", B, len, best / (B * len) * 1e9, best / (B * len) * 2.33e9, cs);
}
