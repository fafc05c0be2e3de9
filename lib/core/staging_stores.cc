#include "core/staging_stores.h"

#include <cstring>

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
