// The device API with a GPU: pointer kinds, device memory refused by host
// calls (naming the argument), CUDA streams wrapped, graph capture refused.
// Skips with one line where no GPU is present.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <string>

#include "support/expect_error.h"
#include "support/single_rank.h"
#include "weft/weft.h"

namespace {

class DeviceApiGpu : public weft::testing::SingleRankTest {
 protected:
  void SetUp() override {
    int devices = 0;
    cudaError_t error = cudaGetDeviceCount(&devices);
    if (error != cudaSuccess || devices == 0)
      GTEST_SKIP() << "no CUDA device: "
                   << (error != cudaSuccess ? cudaGetErrorString(error) : "count is 0");
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&device_, 4096), cudaSuccess);
    SingleRankTest::SetUp();
  }
  void TearDown() override {
    SingleRankTest::TearDown();
    if (device_ != nullptr) cudaFree(device_);
  }
  void* device_ = nullptr;
  float host_[16] = {};
};

TEST_F(DeviceApiGpu, PointerKinds) {
  void *managed = nullptr, *pinned = nullptr;
  ASSERT_EQ(cudaMallocManaged(&managed, 4096), cudaSuccess);
  ASSERT_EQ(cudaMallocHost(&pinned, 4096), cudaSuccess);
  struct {
    const void* p;
    weftMemoryType_t type;
    int device;
  } cases[] = {{device_, weftMemoryDevice, 0},
               {static_cast<char*>(device_) + 100, weftMemoryDevice, 0},
               {managed, weftMemoryManaged, 0},
               {pinned, weftMemoryHost, -1},
               {host_, weftMemoryHost, -1}};
  for (const auto& c : cases) {
    weftMemoryType_t type;
    int device = -5;
    ASSERT_EQ(weftPointerGetMemoryType(c.p, &type, &device), weftSuccess);
    EXPECT_EQ(type, c.type) << c.p;
    if (c.type == weftMemoryDevice) {
      EXPECT_EQ(device, c.device) << c.p;
    }
  }
  cudaFree(managed);
  cudaFreeHost(pinned);
}

TEST_F(DeviceApiGpu, DeviceMemoryOnHostCallsIsRefusedNamingTheArgument) {
  EXPECT_ERROR(weftAllReduce(device_, host_, 4, weftFloat32, weftSum, comm_, nullptr),
               weftInvalidUsage, "sendbuff is device memory (GPU 0)");
  EXPECT_ERROR(weftAllReduce(host_, device_, 4, weftFloat32, weftSum, comm_, nullptr),
               weftInvalidUsage, "recvbuff is device memory");
  EXPECT_ERROR(weftAllGather(device_, device_, 4, weftFloat32, comm_, nullptr), weftInvalidUsage,
               "sendbuff is device memory");
  EXPECT_ERROR(weftSend(device_, 4, weftFloat32, 0, comm_, nullptr), weftInvalidUsage,
               "weftSend: sendbuff is device memory");
  EXPECT_ERROR(weftRecv(device_, 4, weftFloat32, 0, comm_, nullptr), weftInvalidUsage,
               "weftRecv: recvbuff is device memory");
  weftRedOp_t op;
  ASSERT_EQ(weftRedOpCreatePreMulSum(&op, device_, weftFloat32, weftScalarDevice, comm_),
            weftSuccess);
  EXPECT_ERROR(weftAllReduce(host_, host_, 4, weftFloat32, op, comm_, nullptr), weftInvalidUsage,
               "scalar is device memory");
  EXPECT_EQ(weftRedOpDestroy(op, comm_), weftSuccess);
  // The communicator is unharmed.
  host_[0] = 2.5f;
  ASSERT_EQ(weftAllReduce(host_, host_ + 8, 1, weftFloat32, weftSum, comm_, nullptr), weftSuccess);
  EXPECT_EQ(host_[8], 2.5f);
}

TEST_F(DeviceApiGpu, CudaStreamIsWrappedAndCollectivesOnItRefused) {
  cudaStream_t cuda;
  ASSERT_EQ(cudaStreamCreate(&cuda), cudaSuccess);
  weftStream_t stream = nullptr;
  ASSERT_EQ(weftStreamCreateFromCuda(cuda, &stream), weftSuccess) << weftGetLastError(nullptr);
  EXPECT_ERROR(weftAllReduce(host_, host_, 4, weftFloat32, weftSum, comm_, stream),
               weftInvalidUsage, "wraps a cudaStream_t");
  weftEvent_t event;
  ASSERT_EQ(weftEventCreate(&event), weftSuccess);
  EXPECT_ERROR(weftEventRecord(event, stream), weftInvalidUsage, "cudaEventRecord");
  EXPECT_EQ(weftEventDestroy(event), weftSuccess);
  ASSERT_EQ(cudaMemsetAsync(device_, 0, 4096, cuda), cudaSuccess);
  EXPECT_EQ(weftStreamSynchronize(stream), weftSuccess) << weftGetLastError(nullptr);
  EXPECT_EQ(weftStreamQuery(stream), weftSuccess) << weftGetLastError(nullptr);
  EXPECT_EQ(weftStreamDestroy(stream), weftSuccess);
  EXPECT_EQ(cudaStreamQuery(cuda), cudaSuccess) << "the cudaStream_t outlives its wrapper";
  // The legacy default stream (NULL) is a stream too.
  ASSERT_EQ(weftStreamCreateFromCuda(nullptr, &stream), weftSuccess) << weftGetLastError(nullptr);
  EXPECT_EQ(weftStreamDestroy(stream), weftSuccess);
  ASSERT_EQ(cudaStreamDestroy(cuda), cudaSuccess);
}

TEST_F(DeviceApiGpu, GraphCaptureIsRefused) {
  cudaStream_t cuda;
  ASSERT_EQ(cudaStreamCreate(&cuda), cudaSuccess);
  ASSERT_EQ(cudaStreamBeginCapture(cuda, cudaStreamCaptureModeRelaxed), cudaSuccess);
  weftStream_t stream = nullptr;
  EXPECT_ERROR(weftStreamCreateFromCuda(cuda, &stream), weftInvalidUsage, "capturing a CUDA graph");
  cudaGraph_t graph;
  ASSERT_EQ(cudaStreamEndCapture(cuda, &graph), cudaSuccess);
  cudaGraphDestroy(graph);
  ASSERT_EQ(cudaStreamDestroy(cuda), cudaSuccess);
}

}  // namespace
