// CPU feature detection and the TOKENMILL_CPU_ISA cap (cpu_isa.h); register_ops.cpp exposes them as ops.
#include "cpu_isa.h"

#include <c10/util/Exception.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <vector>

#if defined(__x86_64__) && defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace tokenmill_isa {
namespace {

#if defined(__x86_64__) && defined(__linux__)
// AMX may be listed by cpuid yet unusable (a VM, an old kernel): Linux hands out the tile state only
// after this permission request succeeds. Asking is harmless where AMX is absent (it fails).
bool request_amx_permission() {
  constexpr int kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
}
#endif

Level parse_level(const std::string& v, const char* what) {
  if (v.empty() || v == "auto" || v == "avx512_bf16") return Level::kAvx512Bf16;
  if (v == "avx512") return Level::kAvx512;
  if (v == "avx2") return Level::kAvx2;
  if (v == "scalar") return Level::kScalar;
  TORCH_CHECK(false, what, "=", v, " is not one of auto, avx512_bf16, avx512, avx2, scalar");
}

Level capped(Level cap) {
  const Level best = cpu_isa().best;
  return static_cast<int>(cap) < static_cast<int>(best) ? cap : best;
}

// The process's own cap: TOKENMILL_CPU_ISA as read at load (the CPU's best without it)
Level load_level() {
  static const Level level = [] {
    const char* v = std::getenv("TOKENMILL_CPU_ISA");
    return capped(parse_level(v ? v : "", "TOKENMILL_CPU_ISA"));
  }();
  return level;
}

std::atomic<int>& active() {
  static std::atomic<int> level{static_cast<int>(load_level())};
  return level;
}

CpuIsa detect() {
  CpuIsa c;
#if defined(__x86_64__) && defined(__GNUC__)
  __builtin_cpu_init();
  c.avx2 = __builtin_cpu_supports("avx2");
  c.fma = __builtin_cpu_supports("fma");
  c.avx512f = __builtin_cpu_supports("avx512f");
  c.avx512bw = __builtin_cpu_supports("avx512bw");
  c.avx512vl = __builtin_cpu_supports("avx512vl");
  c.avx512bf16 = __builtin_cpu_supports("avx512bf16");
  c.avx512vnni = __builtin_cpu_supports("avx512vnni");
  c.amx_tile = __builtin_cpu_supports("amx-tile");
  c.amx_bf16 = __builtin_cpu_supports("amx-bf16");
#if defined(__linux__)
  c.amx_permitted = c.amx_tile && request_amx_permission();
#endif
#endif
#if defined(TM_EMULATE_AVX512)  // the test build (avx512_intrinsics.h): SIMDe stands in for the AVX-512 units
  c.avx512f = c.avx512bw = c.avx512vl = c.avx512bf16 = c.avx512vnni = true;
#endif
  Level have = Level::kScalar;
  if (c.avx2 && c.fma) have = Level::kAvx2;
  if (have == Level::kAvx2 && c.avx512f && c.avx512bw && c.avx512vl) have = Level::kAvx512;
  if (have == Level::kAvx512 && c.avx512bf16) have = Level::kAvx512Bf16;
  c.best = have;
  return c;
}

// "level=avx512_bf16 best=avx512_bf16 features=avx2,fma,...": what the startup log and roofline print
std::string describe_text() {
  const CpuIsa& c = cpu_isa();
  std::string s = std::string("level=") + level_name(active_level()) + " best=" + level_name(c.best) + " features=";
  const std::vector<std::pair<const char*, bool>> flags = {
      {"avx2", c.avx2}, {"fma", c.fma}, {"avx512f", c.avx512f}, {"avx512bw", c.avx512bw},
      {"avx512vl", c.avx512vl}, {"avx512_bf16", c.avx512bf16}, {"avx512_vnni", c.avx512vnni},
      {"amx_tile", c.amx_tile}, {"amx_bf16", c.amx_bf16}};
  bool first = true;
  for (const auto& [name, on] : flags)
    if (on) {
      s += (first ? "" : ",") + std::string(name);
      first = false;
    }
  if (first) s += "none";
  s += c.amx_tile ? (c.amx_permitted ? " amx=usable" : " amx=denied_by_os") : "";
#if defined(TM_EMULATE_AVX512)
  s += " emulated=simde";
#endif
  return s;
}

}  // namespace

std::string describe_isa() { return describe_text(); }

std::string set_isa(const std::string& cap) {
  // auto returns to the load-time cap, so `TOKENMILL_CPU_ISA=avx2 pytest` stays on AVX2 after a test
  // that compared levels
  active().store(static_cast<int>(cap == "auto" ? load_level() : capped(parse_level(cap, "set_cpu_isa"))));
  return level_name(active_level());
}

const CpuIsa& cpu_isa() {
  static const CpuIsa isa = detect();
  return isa;
}

Level active_level() { return static_cast<Level>(active().load(std::memory_order_relaxed)); }

namespace {
std::atomic<bool>& invariant() {
  static std::atomic<bool> on{false};
  return on;
}
}  // namespace

bool batch_invariant() { return invariant().load(std::memory_order_relaxed); }
bool set_batch_invariant(bool on) { return invariant().exchange(on); }

const char* level_name(Level level) {
  switch (level) {
    case Level::kAvx512Bf16: return "avx512_bf16";
    case Level::kAvx512: return "avx512";
    case Level::kAvx2: return "avx2";
    default: return "scalar";
  }
}

}  // namespace tokenmill_isa
