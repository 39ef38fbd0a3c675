#include <cstdio>
#include <vector>
#include <random>
#include <x86intrin.h>
#include DEC
using namespace tm_avx512_decode;
int main(int argc, char** argv) {
  const int64_t Hkv = 3, D = 64; const int G = 3;
  int ntok = argc > 1 ? atoi(argv[1]) : 16;  // tokens in the working set (L1: 16-32)
  std::vector<uint16_t> k(ntok * Hkv * D, 0x3f80), v(ntok * Hkv * D, 0x3f80);
  std::vector<int64_t> slots(ntok); for (int i = 0; i < ntok; ++i) slots[i] = i;
  std::vector<float> qp(Hkv * G * D, 0.01f), o(Hkv * G * D, 0.f), buf(G * 16 * 16), s(Hkv * G * ntok, 0.001f);
  const int reps = 200000 / (ntok / 16);
  for (int pass = 0; pass < 2; ++pass) {
    uint64_t t0 = __rdtsc();
    for (int r = 0; r < reps; ++r)
      for (int t = 0; t < ntok; t += 16)
        for (int h = 0; h < Hkv; ++h)
          score_tile<G, 2>(qp.data() + h * G * D, k.data(), slots.data() + t, 16, Hkv, h, s.data() + h * G * ntok + t, ntok, buf.data() SCORE_EXTRA);
    uint64_t t1 = __rdtsc();
    for (int r = 0; r < reps; ++r)
      for (int t = 0; t < ntok; t += 16)
        for (int h = 0; h < Hkv; ++h)
          value_tile<G, 2>(s.data() + h * G * ntok + t, ntok, v.data(), slots.data() + t, 16, Hkv, h, o.data() + h * G * D VALUE_EXTRA);
    uint64_t t2 = __rdtsc();
    double n = double(reps) * ntok * Hkv;
    if (pass) printf("ntok %d: score %.2f, value %.2f TSC cycles per token-head (x1.26 for ~2.9 GHz core)  %f\n", ntok, (t1 - t0) / n, (t2 - t1) / n, o[0] + s[5]);
  }
}
