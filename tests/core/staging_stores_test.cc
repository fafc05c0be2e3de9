// The streaming copy into staging: every alignment and length, nothing outside the
// destination touched. (The choice to use it: timed_choice_test.cc.)
#include "core/staging_stores.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

namespace weft {
namespace {

TEST(CopyStreaming, EveryAlignmentAndLengthExactly) {
  constexpr size_t kGuard = 64;
  const size_t lengths[] = {0, 1, 15, 63, 64, 65, 127, 128, 1000, 4096, 65536 + 7};
  for (size_t length : lengths)
    for (size_t dst_offset : {0, 1, 8, 16, 33, 63})
      for (size_t src_offset : {0, 3, 16}) {
        std::vector<std::byte> src(length + src_offset), dst(length + dst_offset + 2 * kGuard);
        for (size_t i = 0; i < src.size(); ++i) src[i] = std::byte(i * 131 + 7);
        std::memset(dst.data(), 0xA5, dst.size());
        std::byte* to = dst.data() + kGuard + dst_offset;
        copy_streaming(to, src.data() + src_offset, length);
        ASSERT_TRUE(std::equal(to, to + length, src.data() + src_offset))
            << length << " bytes, dst offset " << dst_offset << ", src offset " << src_offset;
        for (std::byte* b = dst.data(); b < to; ++b) ASSERT_EQ(*b, std::byte{0xA5});
        for (std::byte* b = to + length; b < dst.data() + dst.size(); ++b)
          ASSERT_EQ(*b, std::byte{0xA5});
      }
}

}  // namespace
}  // namespace weft
