// weft-bench-reduce: throughput of the host reduction kernels per dtype x op,
// next to memcpy of the same bytes in the same run (the ceiling one thread
// can reach). Bandwidth counts every byte read and written: 3 * count * size
// for a reduction (two inputs, one output), 2 * bytes for memcpy.
// WEFT_REDUCE_ISA=scalar|avx2|avx512 picks the variant.
//
// oneshot/<message>/<round>: one rank's memory work in a staged one-shot
// AllReduce of two ranks, float sum, without the synchronisation: per round,
// copy the input into staging, then reduce staging and the peer's staging into
// the output. Rounds of a whole staging half (2 MiB by default) against
// smaller ones show what the round size costs in cache misses alone.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "core/reduce/kernel_table.h"
#include "core/reduce/numeric_types.h"
#include "core/reduce/reduce.h"

namespace weft::reduce {
namespace {

constexpr size_t kSizes[] = {64 << 10, 4 << 20};
constexpr const char* kOpNames[] = {"sum", "prod", "max", "min"};

std::string size_name(size_t bytes) {
  return bytes >= (1 << 20) ? std::to_string(bytes >> 20) + "MiB"
                            : std::to_string(bytes >> 10) + "KiB";
}

// 64-byte aligned, touched once so the first timed pass does not page-fault.
struct Buffer {
  explicit Buffer(size_t bytes) : data(static_cast<uint8_t*>(std::aligned_alloc(64, bytes))) {
    std::memset(data, 0, bytes);
  }
  ~Buffer() { std::free(data); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  uint8_t* data;
};

// Ordinary values near 1 (no NaN, no overflow), so no input takes a special path.
void fill(weftDataType_t dtype, uint8_t* p, size_t count) {
  for (size_t i = 0; i < count; ++i) {
    float x = 1.0f + static_cast<float>(i % 61) / 64.0f;
    switch (dtype) {
      case weftFloat16: {
        uint16_t h = float_to_fp16(x);
        std::memcpy(p + 2 * i, &h, 2);
        break;
      }
      case weftBfloat16: {
        uint16_t h = float_to_bf16(x);
        std::memcpy(p + 2 * i, &h, 2);
        break;
      }
      case weftFloat8e4m3:
        p[i] = float_to_fp8e4m3(x);
        break;
      case weftFloat8e5m2:
        p[i] = float_to_fp8e5m2(x);
        break;
      case weftFloat32:
        std::memcpy(p + 4 * i, &x, 4);
        break;
      case weftFloat64: {
        double d = x;
        std::memcpy(p + 8 * i, &d, 8);
        break;
      }
      default: {
        uint64_t v = i * 0x9e3779b97f4a7c15ull;
        std::memcpy(p + dtype_size(dtype) * i, &v, dtype_size(dtype));
      }
    }
  }
}

void set_rate(benchmark::State& state, double bytes_per_iteration) {
  state.SetBytesProcessed(static_cast<int64_t>(bytes_per_iteration * state.iterations()));
  state.counters["GB/s"] =
      benchmark::Counter(bytes_per_iteration, benchmark::Counter::kIsIterationInvariantRate,
                         benchmark::Counter::kIs1000);
}

void bm_reduce(benchmark::State& state, weftDataType_t dtype, Op op, size_t bytes) {
  size_t count = bytes / dtype_size(dtype);
  Buffer a(bytes), b(bytes), dst(bytes);
  fill(dtype, a.data, count);
  fill(dtype, b.data, count);
  for (auto _ : state) {
    apply(dtype, op, dst.data, a.data, b.data, count);
    benchmark::ClobberMemory();
  }
  set_rate(state, 3.0 * static_cast<double>(bytes));
}

void bm_memcpy(benchmark::State& state, size_t bytes) {
  Buffer src(bytes), dst(bytes);
  for (auto _ : state) {
    std::memcpy(dst.data, src.data, bytes);
    benchmark::ClobberMemory();
  }
  set_rate(state, 2.0 * static_cast<double>(bytes));
}

void bm_oneshot_passes(benchmark::State& state, size_t bytes, size_t round_bytes) {
  Buffer input(bytes), staging(round_bytes), peer_staging(round_bytes), output(bytes);
  const size_t count = bytes / sizeof(float), round_count = round_bytes / sizeof(float);
  fill(weftFloat32, input.data, count);
  fill(weftFloat32, peer_staging.data, round_count);
  for (auto _ : state) {
    for (size_t begin = 0; begin < count; begin += round_count) {
      const size_t length = std::min(round_count, count - begin);
      std::memcpy(staging.data, input.data + begin * sizeof(float), length * sizeof(float));
      apply(weftFloat32, Op::Sum, output.data + begin * sizeof(float), staging.data,
            peer_staging.data, length);
    }
    benchmark::ClobberMemory();
  }
  // The message's bytes once per second: weft-perf's busbw at two ranks.
  set_rate(state, static_cast<double>(bytes));
}

void register_all() {
  // Rounds of the whole message (up to the default staging half, 2 MiB), then smaller ones.
  for (size_t bytes : {size_t{1} << 20, size_t{2} << 20, size_t{4} << 20})
    for (size_t round : {std::min(bytes, size_t{2} << 20), size_t{256} << 10, size_t{64} << 10})
      benchmark::RegisterBenchmark(("oneshot/" + size_name(bytes) + "/" + size_name(round)).c_str(),
                                   bm_oneshot_passes, bytes, round);
  for (size_t bytes : kSizes) {
    benchmark::RegisterBenchmark(("memcpy/" + size_name(bytes)).c_str(), bm_memcpy, bytes);
    for (int t = 0; t < kNumDtypes; ++t) {
      auto dtype = static_cast<weftDataType_t>(t);
      for (int op = 0; op < kNumOps; ++op) {
        std::string name = std::string(isa_name(active_isa())) + "/" + dtype_name(dtype) + "/" +
                           kOpNames[op] + "/" + size_name(bytes);
        benchmark::RegisterBenchmark(name.c_str(), bm_reduce, dtype, static_cast<Op>(op), bytes);
      }
    }
  }
}

}  // namespace
}  // namespace weft::reduce

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  weft::reduce::register_all();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
