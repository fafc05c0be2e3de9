// The cache of opened peer mappings (transports/cuda_ipc/mapping_cache.h),
// with mmap of memfd descriptors standing in for CUDA's import and map.
#include "transports/cuda_ipc/mapping_cache.h"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <vector>

namespace weft::cuda_ipc {
namespace {

constexpr size_t kBytes = 4096;

std::vector<uint8_t> handle(uint8_t tag) {
  return std::vector<uint8_t>(64, tag);
}

// Every open maps one memfd (the "exporter's memory") again each time.
struct Exporter {
  int fd = ::memfd_create("weft-cache-test", MFD_CLOEXEC);
  int closes = 0;
  Exporter() { EXPECT_EQ(::ftruncate(fd, kBytes), 0); }
  ~Exporter() { ::close(fd); }
  MappingCache::Open open() {
    return [this](Mapping* m) {
      void* p = ::mmap(nullptr, kBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
      if (p == MAP_FAILED) return Error(weftSystemError, "mmap");
      *m = {p, kBytes};
      return Status::Ok();
    };
  }
  MappingCache::Close close() {
    return [this](const Mapping& m) {
      ::munmap(m.address, m.bytes);
      ++closes;
    };
  }
};

TEST(MappingCache, SameHandleOpensOnce) {
  Exporter exporter;
  MappingCache cache(exporter.close(), 4);
  Mapping a, b;
  ASSERT_TRUE(cache.acquire(handle(1), exporter.open(), &a).ok());
  ASSERT_TRUE(cache.acquire(handle(1), exporter.open(), &b).ok());
  EXPECT_EQ(cache.opens(), 1u);
  EXPECT_EQ(a.address, b.address);
  std::memcpy(a.address, "seen", 4);
  char text[4] = {};
  ASSERT_EQ(::pread(exporter.fd, text, 4, 0), 4);
  EXPECT_EQ(std::memcmp(text, "seen", 4), 0);
  Mapping c;
  ASSERT_TRUE(cache.acquire(handle(2), exporter.open(), &c).ok());  // a new handle: a new open
  EXPECT_EQ(cache.opens(), 2u);
  EXPECT_NE(c.address, a.address);
  EXPECT_TRUE(cache.release(handle(1)));
  EXPECT_TRUE(cache.release(handle(1)));
  EXPECT_FALSE(cache.release(handle(1))) << "released more often than acquired";
  EXPECT_EQ(exporter.closes, 0) << "an idle mapping stays cached";
  ASSERT_TRUE(cache.acquire(handle(1), exporter.open(), &a).ok());
  EXPECT_EQ(cache.opens(), 2u);
}

TEST(MappingCache, IdleLimitAndEvictionClose) {
  Exporter exporter;
  {
    MappingCache cache(exporter.close(), 1);
    Mapping m;
    for (uint8_t tag = 1; tag <= 3; ++tag) {
      ASSERT_TRUE(cache.acquire(handle(tag), exporter.open(), &m).ok());
    }
    EXPECT_FALSE(cache.evict(handle(1))) << "in use";
    EXPECT_TRUE(cache.release(handle(1)));
    EXPECT_TRUE(cache.release(handle(2)));  // two idle, limit one: handle 1 goes
    EXPECT_EQ(exporter.closes, 1);
    EXPECT_EQ(cache.size(), 2u);
    EXPECT_TRUE(cache.evict(handle(2)));
    EXPECT_EQ(exporter.closes, 2);
    EXPECT_FALSE(cache.evict(handle(2))) << "already gone";
  }
  EXPECT_EQ(exporter.closes, 3) << "the cache closes what is left, in use or not";
}

TEST(MappingCache, FailedOpenIsNotCached) {
  Exporter exporter;
  MappingCache cache(exporter.close(), 4);
  Mapping m;
  const Status st = cache.acquire(
      handle(1), [](Mapping*) { return Error(weftSystemError, "no"); }, &m);
  EXPECT_EQ(st.code(), weftSystemError);
  EXPECT_EQ(cache.size(), 0u);
  EXPECT_EQ(cache.acquire({}, exporter.open(), &m).code(), weftInvalidArgument);
}

}  // namespace
}  // namespace weft::cuda_ipc
