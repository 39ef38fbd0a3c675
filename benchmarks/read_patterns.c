// The memory floors of decode attention on this machine: read rates of a streaming read, of random
// 6 KiB pieces (one 16-token block of K for 3 KV heads x 64 dims in bf16), and of the same pieces with
// the next one prefetched into L1 (_MM_HINT_T0) or L2 (_MM_HINT_T1). One and two threads.
//
//     gcc -O2 -mavx2 -fopenmp -o /tmp/read_patterns benchmarks/read_patterns.c && /tmp/read_patterns
#include <immintrin.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { NONE, L1, L2 };

static float sum_piece(const float* p, size_t n) {
  __m256 s0 = _mm256_setzero_ps(), s1 = s0;
  for (size_t i = 0; i + 16 <= n; i += 16) {
    s0 = _mm256_add_ps(s0, _mm256_loadu_ps(p + i));
    s1 = _mm256_add_ps(s1, _mm256_loadu_ps(p + i + 8));
  }
  float t[8];
  _mm256_storeu_ps(t, _mm256_add_ps(s0, s1));
  return t[0] + t[1] + t[2] + t[3] + t[4] + t[5] + t[6] + t[7];
}

static void prefetch(const char* p, size_t bytes, int hint) {
  for (size_t o = 0; o < bytes; o += 64) {
    if (hint == L1) _mm_prefetch(p + o, _MM_HINT_T0);
    else _mm_prefetch(p + o, _MM_HINT_T1);
  }
}

int main(void) {
  const size_t bytes = (size_t)1 << 30, piece = 6144, pieces = bytes / piece, count = 100000;
  char* a = aligned_alloc(4096, bytes);
  memset(a, 1, bytes);
  size_t* idx = malloc(count * sizeof(size_t));
  srand(1);
  for (size_t i = 0; i < count; ++i) idx[i] = ((size_t)rand() * RAND_MAX + rand()) % pieces;
  for (int threads = 1; threads <= 2; ++threads) {
    omp_set_num_threads(threads);
    float sink = 0;
    double t = omp_get_wtime();
#pragma omp parallel for reduction(+ : sink)
    for (size_t c = 0; c < bytes / piece; ++c) sink += sum_piece((const float*)(a + c * piece), piece / 4);
    printf("threads %d: streaming read %.1f GB/s\n", threads, bytes / (omp_get_wtime() - t) / 1e9);
    const char* names[] = {"no prefetch", "next piece prefetched into L1", "next piece prefetched into L2"};
    for (int hint = NONE; hint <= L2; ++hint) {
      t = omp_get_wtime();
#pragma omp parallel for reduction(+ : sink)
      for (size_t c = 0; c < count; ++c) {
        if (hint != NONE && c + 1 < count) prefetch(a + idx[c + 1] * piece, piece, hint);
        sink += sum_piece((const float*)(a + idx[c] * piece), piece / 4);
      }
      printf("threads %d: random 6 KiB pieces, %s: %.1f GB/s\n", threads, names[hint],
             count * piece / (omp_get_wtime() - t) / 1e9);
    }
    if (sink == 42.f) printf("(sink)\n");
  }
  return 0;
}
