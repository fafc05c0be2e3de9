// Weft looks for a loaded CUDA driver on every call without taking the loader's lock
// (lib/core/cuda/driver.cc: the newest loaded object is pinned, and a library loaded
// after it shows as its successor). A driver loaded after Weft's first looks must still
// be found: here the host emulation of the driver, whose device memory then reads as device
// memory and is refused by a host collective naming the argument.
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <vector>

#include "cuda_loader.h"
#include "support/expect_error.h"
#include "support/single_rank.h"
#include "weft/weft.h"

namespace weft::testing {
namespace {

using tools::gpu_present;
using tools::use_gpu;

class DriverLoadedLate : public SingleRankTest {};

TEST_F(DriverLoadedLate, IsFoundAtTheNextCall) {
  ASSERT_EQ(dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD), nullptr)
      << "this test needs a process that has not loaded libcuda";
  std::vector<float> host(8, 1.0f), out(8);
  // Calls before the driver is loaded: host memory, the probe settles on its pin.
  for (int i = 0; i < 3; ++i)
    ASSERT_EQ(
        weftAllReduce(host.data(), out.data(), host.size(), weftFloat32, weftSum, comm_, nullptr),
        weftSuccess)
        << weftGetLastError(comm_);

  ASSERT_NE(dlopen(WEFT_EMULATED_DRIVER, RTLD_NOW | RTLD_GLOBAL), nullptr) << dlerror();
  std::string why;
  const tools::CudaDriver* d = use_gpu(0, &why);
  ASSERT_NE(d, nullptr) << why;
  ASSERT_TRUE(d->emulated);
  unsigned long long allocation = 0;
  ASSERT_EQ(d->mem_alloc(&allocation, 4096), 0);
  auto* device = reinterpret_cast<char*>(allocation);

  weftMemoryType_t type = weftMemoryHost;
  int ordinal = -1;
  ASSERT_EQ(weftPointerGetMemoryType(device + 64, &type, &ordinal), weftSuccess);
  EXPECT_EQ(type, weftMemoryDevice);
  EXPECT_EQ(ordinal, 0);
  ASSERT_EQ(weftPointerGetMemoryType(host.data(), &type, &ordinal), weftSuccess);
  EXPECT_EQ(type, weftMemoryHost);

  EXPECT_ERROR(weftAllReduce(device, out.data(), 8, weftFloat32, weftSum, comm_, nullptr),
               weftInvalidUsage, "sendbuff is device memory (GPU 0)");
  EXPECT_ERROR(weftAllReduce(host.data(), device, 8, weftFloat32, weftSum, comm_, nullptr),
               weftInvalidUsage, "recvbuff is device memory (GPU 0)");
  EXPECT_EQ(
      weftAllReduce(host.data(), out.data(), host.size(), weftFloat32, weftSum, comm_, nullptr),
      weftSuccess)
      << weftGetLastError(comm_);
  EXPECT_EQ(out[0], 1.0f);
  d->mem_free(allocation);
}

}  // namespace
}  // namespace weft::testing
