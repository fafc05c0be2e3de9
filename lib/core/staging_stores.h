#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace weft {

// Copies `bytes` with streaming (non-temporal) stores where the CPU has them: the lines go
// to memory without being read first or kept in this core's cache. Elsewhere, memcpy.
// Streaming stores are weakly ordered: call streaming_fence() before publishing them.
void copy_streaming(std::byte* dst, const std::byte* src, size_t bytes);

// Orders the streaming stores before every later store (the release that publishes them).
void streaming_fence();

// Whether copy_streaming bypasses the cache on this build (x86-64).
bool streaming_stores_available();

// The size of the last-level cache, the highest level of data or unified cache that sysfs
// lists under `cache_dir` (/sys/devices/system/cpu/cpuN/cache: index*/level, type, size; the
// largest of that level), or 0 when none can be read. From the kernel rather than sysconf,
// which asks the CPU: in a virtual machine that may describe the host's cache (one VM here:
// sysconf 64 MiB, sysfs and lscpu 8 MiB).
uint64_t last_level_cache_bytes(const std::string& cache_dir);

// How a rank writes the large staging rounds of one collective: TimedChoice, streaming
// stores as the alternative. A staging line a peer has just read sits in that peer's cache,
// and an ordinary store must first take it back. When the host places the two cores far
// apart (it moves them: a 2-rank 8-byte AllReduce takes 0.12 µs one minute and 0.35 the
// next), that take-back halves a large round's speed, and streaming stores, which skip it
// and leave the lines in memory for the readers, run such rounds 1.5-1.8× faster. Where the
// cores share their lines quickly, they are 1.3-1.5× slower (the readers go to memory). So
// each rank times its rounds (its pack and its unpack, not its waits). Each rank decides
// alone, probing the way it does not use: the choice changes no byte another rank reads.
// The margin: part of streaming's cost falls outside the rank's rounds (the peers read from
// memory, the rank's own next writes miss), so a close call is a loss.
constexpr double kStreamingMargin = 1.45;
}  // namespace weft
