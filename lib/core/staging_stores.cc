#include "core/staging_stores.h"

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>

#if defined(__x86_64__)
#include <emmintrin.h>
#endif

namespace weft {

bool streaming_stores_available() {
#if defined(__x86_64__)
  return true;
#else
  return false;
#endif
}

uint64_t last_level_cache_bytes(const std::string& cache_dir) {
  std::error_code error;
  int best_level = 0;
  uint64_t best_bytes = 0;
  for (const auto& entry : std::filesystem::directory_iterator(cache_dir, error)) {
    if (entry.path().filename().string().rfind("index", 0) != 0) continue;
    auto read = [&](const char* name) {
      std::string text;
      std::ifstream(entry.path() / name) >> text;
      return text;
    };
    const std::string type = read("type"), size = read("size");
    if (type == "Instruction" || size.empty()) continue;
    const int level = atoi(read("level").c_str());
    char* end = nullptr;
    uint64_t bytes = strtoull(size.c_str(), &end, 10);
    if (*end == 'K') bytes <<= 10;
    if (*end == 'M') bytes <<= 20;
    if (*end == 'G') bytes <<= 30;
    if (bytes == 0) continue;  // unreadable: a lower level's figure is better than none
    if (level > best_level || (level == best_level && bytes > best_bytes)) {
      best_level = level;
      best_bytes = bytes;
    }
  }
  return best_bytes;
}

void copy_streaming(std::byte* dst, const std::byte* src, size_t bytes) {
  if (bytes == 0) return;  // an empty buffer's pointers may be null, which memcpy forbids
#if defined(__x86_64__)
  constexpr size_t kLine = 64;
  // Whole lines only: a streamed partial line would be merged in memory line by line.
  size_t head = (kLine - reinterpret_cast<uintptr_t>(dst) % kLine) % kLine;
  if (head >= bytes) {
    memcpy(dst, src, bytes);
    return;
  }
  memcpy(dst, src, head);
  size_t at = head;
  for (; at + kLine <= bytes; at += kLine) {
    const auto* from = reinterpret_cast<const __m128i*>(src + at);
    auto* to = reinterpret_cast<__m128i*>(dst + at);
    __m128i a = _mm_loadu_si128(from), b = _mm_loadu_si128(from + 1);
    __m128i c = _mm_loadu_si128(from + 2), d = _mm_loadu_si128(from + 3);
    _mm_stream_si128(to, a);
    _mm_stream_si128(to + 1, b);
    _mm_stream_si128(to + 2, c);
    _mm_stream_si128(to + 3, d);
  }
  memcpy(dst + at, src + at, bytes - at);
#else
  memcpy(dst, src, bytes);
#endif
}

void streaming_fence() {
#if defined(__x86_64__)
  _mm_sfence();
#endif
}

}  // namespace weft
