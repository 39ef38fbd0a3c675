// Which instruction-set paths the running CPU (and OS) allow, read once at load (cpuid through
// __builtin_cpu_supports, which also checks that the OS saves the wider registers). The kernels are
// built for the x86-64-v3 baseline (AVX2 + FMA); the AVX-512 paths live in their own translation
// units compiled with a target pragma, so one build runs on both kinds of CPU and each call picks
// the widest path this CPU has. TOKENMILL_CPU_ISA caps the choice (tests run every path this way):
// avx512_bf16 (the default cap: everything), avx512, avx2, scalar.
#pragma once

#include <string>

namespace tokenmill_isa {

enum class Level { kScalar = 0, kAvx2 = 1, kAvx512 = 2, kAvx512Bf16 = 3 };

struct CpuIsa {
  bool avx2 = false, fma = false, avx512f = false, avx512bw = false, avx512vl = false, avx512bf16 = false,
       avx512vnni = false, amx_tile = false, amx_bf16 = false, amx_permitted = false;
  Level best = Level::kScalar;  // the widest level this CPU and OS allow
};

const CpuIsa& cpu_isa();
// The level kernels use now: the best one, capped by TOKENMILL_CPU_ISA at load or by the
// tokenmill::set_cpu_isa op (tests and benchmarks compare paths in one process that way).
Level active_level();
const char* level_name(Level level);
std::string describe_isa();            // "level=... best=... features=..."
std::string set_isa(const std::string& cap);  // returns the level now active; auto: the load-time cap

// Batch-invariant mode (process-wide, off by default): every GEMM path sums a row in the same order
// whatever the number of rows in the call, and bf16 rows always take the same path, so a sequence's
// logits do not depend on what it is batched with (nor on speculative verification's k+1 rows).
bool batch_invariant();
bool set_batch_invariant(bool on);  // returns the previous setting

}  // namespace tokenmill_isa
