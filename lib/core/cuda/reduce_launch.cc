#include "core/cuda/reduce_launch.h"

#include <cstring>
#include <mutex>
#include <vector>

#include "core/cuda/driver.h"
#include "core/cuda/reduce_params.h"

// The fatbin nvcc made of reduce_kernels.cu (empty in a build without nvcc), embedded by
// CMake (lib/core/cuda/CMakeLists.txt).
extern "C" const unsigned char weft_reduce_fatbin[];
extern "C" const size_t weft_reduce_fatbin_size;

namespace weft::cuda {

namespace {

// The kernels as loaded into one context.
struct LoadedKernels {
  drv::Context context = nullptr;
  drv::Function kernels[weftNumTypes] = {};
  int sms = 1;
};

std::mutex g_loaded_mutex;
std::vector<LoadedKernels>* g_loaded = new std::vector<LoadedKernels>;  // never freed

// The context a launch on `stream` runs in.
Status stream_context(const Api& d, void* stream, drv::Context* context) {
  drv::Result r = stream == nullptr || stream == drv::legacy_stream()
                      ? d.ctx_get_current(context)
                      : d.stream_get_ctx(stream, context);
  if (r != drv::kSuccess) return driver_error(r, "reduce kernel", "finding the stream's context");
  if (*context == nullptr)
    return Error(weftInvalidUsage,
                 "reduce kernel: the default stream needs a current CUDA context on this thread");
  return Status::Ok();
}

// The kernels of `context`, loaded at its first launch (modules stay for the process's life).
Status kernels_for(const Api& d, drv::Context context, const LoadedKernels** out) {
  std::lock_guard<std::mutex> lock(g_loaded_mutex);
  for (const LoadedKernels& loaded : *g_loaded)
    if (loaded.context == context) {
      *out = &loaded;
      return Status::Ok();
    }
  if (!reduce_kernels_built())
    return Error(weftUnhandledCudaError,
                 "reduce kernel: this libweft was built without its CUDA kernels (no nvcc when "
                 "it was built)");
  ContextScope scope(context);
  WEFT_RETURN_IF_ERROR(scope.status());
  LoadedKernels loaded;
  loaded.context = context;
  drv::Module module = nullptr;
  drv::Result r = d.module_load_data(&module, weft_reduce_fatbin);
  if (r != drv::kSuccess) return driver_error(r, "reduce kernel", "cuModuleLoadData");
  for (int t = 0; t < weftNumTypes; ++t) {
    const std::string name = "weft_reduce_" + std::to_string(t);
    r = d.module_get_function(&loaded.kernels[t], module, name.c_str());
    if (r != drv::kSuccess) return driver_error(r, name.c_str(), "cuModuleGetFunction");
  }
  drv::Device device = 0;
  r = d.ctx_get_device(&device);
  if (r != drv::kSuccess) return driver_error(r, "reduce kernel", "cuCtxGetDevice");
  r = d.device_get_attribute(&loaded.sms, drv::kAttrMultiprocessorCount, device);
  if (r != drv::kSuccess) return driver_error(r, "reduce kernel", "cuDeviceGetAttribute");
  if (loaded.sms < 1) loaded.sms = 1;
  g_loaded->push_back(loaded);
  *out = &g_loaded->back();
  return Status::Ok();
}

}  // namespace

bool reduce_kernels_built() {
  return weft_reduce_fatbin_size > 0;
}

Status launch_reduce(const ReduceCall& call, void* stream) {
  size_t element = reduce::dtype_size(call.dtype);
  if (element == 0)
    return Error(weftInvalidArgument, "reduce kernel: dtype %d is not a weftDataType_t",
                 static_cast<int>(call.dtype));
  if (static_cast<unsigned>(call.op) >= static_cast<unsigned>(reduce::kNumOps))
    return Error(weftInvalidArgument, "reduce kernel: op %d is not sum, prod, max or min",
                 static_cast<int>(call.op));
  if (call.n < 1 || call.n > kMaxInputs)
    return Error(weftInvalidArgument, "reduce kernel: n = %d inputs is outside [1, %d]", call.n,
                 kMaxInputs);
  if (call.scalar_host != nullptr && call.scalar_device != nullptr)
    return Error(weftInvalidArgument,
                 "reduce kernel: scalar_host and scalar_device are both set; a PreMulSum has one "
                 "scalar");
  if (call.count == 0) return Status::Ok();
  if (call.inputs == nullptr) return Error(weftInvalidArgument, "reduce kernel: inputs is NULL");
  ReduceParams p{};
  for (int k = 0; k < call.n; ++k) {
    p.in[k] = call.inputs[k];
    if (p.in[k] == nullptr || reinterpret_cast<uintptr_t>(p.in[k]) % element != 0)
      return Error(weftInvalidArgument,
                   "reduce kernel: inputs[%d] = %p is NULL or not aligned to its %zu-byte "
                   "elements",
                   k, p.in[k], element);
  }
  if (call.output == nullptr || reinterpret_cast<uintptr_t>(call.output) % element != 0)
    return Error(weftInvalidArgument,
                 "reduce kernel: output = %p is NULL or not aligned to its %zu-byte elements",
                 call.output, element);
  p.out = call.output;
  p.n = call.n;
  p.count = call.count;
  p.op = call.op;
  p.divisor = call.divisor;
  p.premul = call.scalar_host != nullptr || call.scalar_device != nullptr;
  p.scalar_source = call.scalar_device;
  if (call.scalar_host != nullptr) memcpy(p.scalar, call.scalar_host, element);
  plan_packs(p, element);

  const Api* d = api();
  if (d == nullptr)
    return Error(weftUnhandledCudaError, "reduce kernel: no CUDA driver is loaded in this process");
  drv::Context context = nullptr;
  WEFT_RETURN_IF_ERROR(stream_context(*d, stream, &context));
  const LoadedKernels* loaded = nullptr;
  WEFT_RETURN_IF_ERROR(kernels_for(*d, context, &loaded));
  const uint64_t wanted = (work_items(p, element) + kReduceThreads - 1) / kReduceThreads;
  const uint64_t cap = static_cast<uint64_t>(loaded->sms) * kReduceBlocksPerSm;
  const unsigned blocks = static_cast<unsigned>(wanted < cap ? wanted : cap);
  void* arguments[] = {&p};
  ContextScope scope(context);
  WEFT_RETURN_IF_ERROR(scope.status());
  drv::Result r = d->launch_kernel(loaded->kernels[call.dtype], blocks, 1, 1, kReduceThreads, 1, 1,
                                   0, stream, arguments, nullptr);
  if (r != drv::kSuccess) return driver_error(r, "reduce kernel", "cuLaunchKernel");
  return Status::Ok();
}

}  // namespace weft::cuda
