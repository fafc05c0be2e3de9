// The streaming copy into staging: every alignment and length, nothing outside the
// destination touched (the choice to use it: timed_choice_test.cc); the last-level cache
// read from sysfs-like directories.
#include "core/staging_stores.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
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

// A directory laid out as /sys/devices/system/cpu/cpuN/cache, removed with the object.
class CacheDir {
 public:
  CacheDir() {
    char pattern[] = "/tmp/weft-cache-test-XXXXXX";
    EXPECT_NE(mkdtemp(pattern), nullptr);
    path_ = pattern;
  }
  ~CacheDir() { std::filesystem::remove_all(path_); }
  void add(int index, const char* level, const char* type, const char* size) const {
    const std::filesystem::path dir =
        std::filesystem::path(path_) / ("index" + std::to_string(index));
    std::filesystem::create_directories(dir);
    std::ofstream(dir / "level") << level << "\n";
    std::ofstream(dir / "type") << type << "\n";
    if (size != nullptr) std::ofstream(dir / "size") << size << "\n";
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

TEST(LastLevelCache, TheHighestLevelOfDataOrUnifiedCacheWithItsSuffix) {
  CacheDir cpu;
  cpu.add(0, "1", "Data", "32K");
  cpu.add(1, "1", "Instruction", "32K");
  cpu.add(2, "2", "Unified", "1024K");
  EXPECT_EQ(last_level_cache_bytes(cpu.path()), 1024u << 10);
  cpu.add(3, "3", "Unified", "8192K");
  EXPECT_EQ(last_level_cache_bytes(cpu.path()), 8192u << 10);
  // An instruction cache never counts, however high; sizes in M are read too.
  cpu.add(4, "4", "Instruction", "64M");
  cpu.add(5, "3", "Unified", "32M");
  EXPECT_EQ(last_level_cache_bytes(cpu.path()), uint64_t{32} << 20);
}

TEST(LastLevelCache, NoneListedIsZero) {
  EXPECT_EQ(last_level_cache_bytes("/nonexistent/weft/cache"), 0u);
  CacheDir cpu;
  EXPECT_EQ(last_level_cache_bytes(cpu.path()), 0u);
  cpu.add(0, "3", "Unified", nullptr);  // no size file
  EXPECT_EQ(last_level_cache_bytes(cpu.path()), 0u);
}

TEST(LastLevelCache, PlainBytesAndGigabytesAndUnreadableSizes) {
  CacheDir cpu;
  cpu.add(0, "2", "Unified", "524288");
  EXPECT_EQ(last_level_cache_bytes(cpu.path()), 524288u);
  cpu.add(1, "3", "Unified", "0K");  // unreadable: the level below stands
  cpu.add(2, "3", "Data", "many");
  EXPECT_EQ(last_level_cache_bytes(cpu.path()), 524288u);
  cpu.add(3, "4", "Unified", "1G");
  EXPECT_EQ(last_level_cache_bytes(cpu.path()), uint64_t{1} << 30);
}

}  // namespace
}  // namespace weft
