// The CUDA reduction kernels on a GPU: every dtype × op (PreMulSum with a
// host or device scalar, Avg), 1 to 8 inputs, odd counts, misaligned offsets,
// in and out of place, against Weft's host reduction kernels bit for bit.
// Skips with one line where no GPU is present. Argument checks run anywhere.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/cuda/reduce_launch.h"
#include "cuda/reduce_cases.h"

namespace weft::cuda {
namespace {

using testing::Math;

#define SKIP_WITHOUT_GPU()                                                                 \
  do {                                                                                     \
    int devices_ = 0;                                                                      \
    cudaError_t error_ = cudaGetDeviceCount(&devices_);                                    \
    if (error_ != cudaSuccess || devices_ == 0)                                            \
      GTEST_SKIP() << "no CUDA device: "                                                   \
                   << (error_ != cudaSuccess ? cudaGetErrorString(error_) : "count is 0"); \
  } while (0)

#define ASSERT_CUDA(expr) ASSERT_EQ((expr), cudaSuccess) << #expr

struct DeviceBuffer {
  explicit DeviceBuffer(size_t bytes) { cudaMalloc(&base, bytes + 64); }
  ~DeviceBuffer() { cudaFree(base); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  uint8_t* at(size_t offset) const { return static_cast<uint8_t*>(base) + offset; }
  void* base = nullptr;  // cudaMalloc aligns to 256 bytes at least
};

struct Shape {
  int n;
  size_t count;
  size_t in_offset, out_offset;  // elements past an aligned base
  bool in_place;                 // output = input 0
};

void check(weftDataType_t t, Math m, const Shape& s, cudaStream_t stream, uint64_t seed) {
  SCOPED_TRACE(std::string(reduce::dtype_name(t)) + " " + testing::math_name(m) + " n " +
               std::to_string(s.n) + " count " + std::to_string(s.count) + " offsets " +
               std::to_string(s.in_offset) + "/" + std::to_string(s.out_offset) +
               (s.in_place ? " in place" : ""));
  std::mt19937_64 rng(seed);
  size_t size = reduce::dtype_size(t), bytes = s.count * size;
  std::vector<std::vector<uint8_t>> inputs;
  std::vector<std::unique_ptr<DeviceBuffer>> buffers;
  std::vector<const void*> pointers;
  for (int k = 0; k < s.n; ++k) {
    inputs.push_back(testing::random_elements(t, s.count, rng));
    buffers.push_back(std::make_unique<DeviceBuffer>(bytes));
    ASSERT_NE(buffers.back()->base, nullptr);
    uint8_t* at = buffers.back()->at(s.in_offset * size);
    ASSERT_CUDA(cudaMemcpy(at, inputs.back().data(), bytes, cudaMemcpyHostToDevice));
    pointers.push_back(at);
  }
  std::vector<uint8_t> scalar = testing::premul_scalar(t, rng);
  DeviceBuffer out(bytes), device_scalar(8);
  ASSERT_CUDA(cudaMemcpy(device_scalar.base, scalar.data(), size, cudaMemcpyHostToDevice));
  ReduceCall call;
  call.dtype = t;
  call.op = testing::op_of(m);
  call.n = s.n;
  call.inputs = pointers.data();
  call.output = s.in_place ? const_cast<void*>(pointers[0]) : out.at(s.out_offset * size);
  call.count = s.count;
  if (m == Math::PreMulHost) call.scalar_host = scalar.data();
  if (m == Math::PreMulDevice) call.scalar_device = device_scalar.base;
  if (m == Math::Avg) call.divisor = static_cast<uint64_t>(s.n);
  Status status = launch_reduce(call, stream);
  ASSERT_TRUE(status.ok()) << status.message();
  ASSERT_CUDA(cudaStreamSynchronize(stream));
  std::vector<uint8_t> got(bytes);
  ASSERT_CUDA(cudaMemcpy(got.data(), call.output, bytes, cudaMemcpyDeviceToHost));
  std::vector<uint8_t> want = testing::host_reduce(t, m, inputs, scalar.data(), s.count);
  EXPECT_EQ(testing::first_difference(t, got.data(), want.data(), s.count), "");
}

class KernelGpuTest : public ::testing::TestWithParam<weftDataType_t> {};

TEST_P(KernelGpuTest, EveryOpMatchesTheHostKernelsBitForBit) {
  SKIP_WITHOUT_GPU();
  cudaStream_t stream;
  ASSERT_CUDA(cudaStreamCreate(&stream));
  const Shape shapes[] = {
      {1, 1, 0, 0, false},   {2, 4099, 0, 0, false}, {3, 1001, 1, 1, false},
      {2, 999, 0, 3, false}, {5, 333, 2, 0, false},  {8, 2047, 3, 3, false},
      {4, 0, 0, 0, false},   {2, 1025, 1, 1, true},  {4, (1 << 20) + 7, 0, 0, false},
  };
  uint64_t seed = 1 + static_cast<uint64_t>(GetParam()) * 100;
  for (Math m : testing::kMaths)
    for (const Shape& s : shapes) check(GetParam(), m, s, stream, seed++);
  ASSERT_CUDA(cudaStreamDestroy(stream));
}

INSTANTIATE_TEST_SUITE_P(AllDtypes, KernelGpuTest, ::testing::ValuesIn(testing::kDtypes),
                         [](const auto& info) {
                           return std::string(reduce::dtype_name(info.param));
                         });

// Checked before anything reaches CUDA: runs without a GPU too.
TEST(KernelArguments, BadInputIsRefusedNamingTheArgument) {
  alignas(16) float data[8] = {};
  const void* inputs[2] = {data, reinterpret_cast<const uint8_t*>(data) + 1};
  ReduceCall call;
  call.n = 2;
  call.inputs = inputs;
  call.output = data;
  call.count = 4;
  Status status = launch_reduce(call, nullptr);
  EXPECT_EQ(status.code(), weftInvalidArgument);
  EXPECT_NE(status.message().find("inputs[1]"), std::string::npos) << status.message();
  call.n = 9;
  status = launch_reduce(call, nullptr);
  EXPECT_EQ(status.code(), weftInvalidArgument);
  EXPECT_NE(status.message().find("n = 9"), std::string::npos) << status.message();
  call.n = 1;
  call.dtype = static_cast<weftDataType_t>(12);
  EXPECT_EQ(launch_reduce(call, nullptr).code(), weftInvalidArgument);
  call.dtype = weftFloat32;
  call.scalar_host = data;
  call.scalar_device = data;
  status = launch_reduce(call, nullptr);
  EXPECT_NE(status.message().find("scalar_host and scalar_device"), std::string::npos)
      << status.message();
}

}  // namespace
}  // namespace weft::cuda
