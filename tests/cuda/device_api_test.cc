// The device API on a process that never loaded the CUDA driver (any
// machine): every pointer is host memory, CUDA streams are refused clearly,
// and host collectives run as before.
#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "support/expect_error.h"
#include "support/single_rank.h"
#include "weft/weft.hpp"

namespace {

TEST(DeviceApiWithoutDriver, EveryPointerIsHostMemory) {
  int on_stack = 0;
  auto on_heap = std::make_unique<double[]>(4);
  for (const void* p : {static_cast<const void*>(&on_stack), static_cast<const void*>(&on_heap[1]),
                        static_cast<const void*>(nullptr)}) {
    weftMemoryType_t type = weftMemoryDevice;
    int device = 7;
    ASSERT_EQ(weftPointerGetMemoryType(p, &type, &device), weftSuccess);
    EXPECT_EQ(type, weftMemoryHost);
    EXPECT_EQ(device, -1);
  }
  weftMemoryType_t type;
  EXPECT_EQ(weftPointerGetMemoryType(&on_stack, &type, nullptr), weftSuccess);
  EXPECT_ERROR(weftPointerGetMemoryType(&on_stack, nullptr, nullptr), weftInvalidArgument, "type");
}

TEST(DeviceApiWithoutDriver, CudaStreamsAreRefusedNamingTheArgument) {
  weftStream_t stream = nullptr;
  EXPECT_ERROR(weftStreamCreateFromCuda(nullptr, &stream), weftInvalidArgument,
               "cudaStream: no CUDA driver is loaded");
  EXPECT_EQ(stream, nullptr);
  int fake = 0;
  EXPECT_ERROR(weftStreamCreateFromCuda(&fake, &stream), weftInvalidArgument, "cudaStream");
  EXPECT_ERROR(weftStreamCreateFromCuda(nullptr, nullptr), weftInvalidArgument, "stream");
}

TEST(DeviceApiWithoutDriver, CppApi) {
  double x = 1.0;
  weft::MemoryLocation where = weft::memory_location(&x);
  EXPECT_EQ(where.type, weft::MemoryType::host);
  EXPECT_EQ(where.device, -1);
  try {
    weft::Stream stream = weft::Stream::from_cuda(nullptr);
    ADD_FAILURE() << "a CUDA stream was created without a driver";
  } catch (const weft::Error& error) {
    EXPECT_EQ(error.code(), weftInvalidArgument);
    EXPECT_NE(std::string(error.what()).find("cudaStream"), std::string::npos) << error.what();
  }
}

// The device-memory check sits on every call's path: host buffers still pass.
class HostCollectives : public weft::testing::SingleRankTest {};

TEST_F(HostCollectives, StillRunWithoutDriver) {
  float in[5] = {1.5f, -2.0f, 3.25f, 0.0f, 8.0f}, out[5] = {};
  ASSERT_EQ(weftAllReduce(in, out, 5, weftFloat32, weftSum, comm_, nullptr), weftSuccess)
      << weftGetLastError(nullptr);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(out[i], in[i]);
}

}  // namespace
