// CUDA awareness without linking CUDA: the driver is looked up at run time
// (only if the program already loaded it), so libnccl.so.2 loads on machines
// without a GPU. The device-API host functions are refused: their device-side
// counterparts are inline code over NCCL's structures, which Weft does not have.
#include <cuda.h>
#include <dlfcn.h>

#include <nccl_device.h>
#include <map>
#include <mutex>
#include <type_traits>

#include "api/nccl/shim.h"

namespace weft::nccl {

namespace {

struct Driver {
  decltype(&cuCtxGetCurrent) current_context = nullptr;
  decltype(&cuCtxGetDevice) context_device = nullptr;
  decltype(&cuMemAlloc) mem_alloc = nullptr;
  decltype(&cuMemFree) mem_free = nullptr;
  decltype(&cuGetErrorString) error_string = nullptr;
};

// The entry points through cuGetProcAddress (CUDA 12.0 semantics, the versions the typedefs
// above name), once the program has loaded the driver. RTLD_NOLOAD: a program that never
// touched CUDA has no device memory, and loading the driver for it would only cost time (or
// fail without a GPU). Resolved at the first call that finds it loaded (a program may load
// CUDA after its first NCCL call); the calls that ask are rare (init, allocation).
const Driver& driver() {
  static std::mutex mutex;
  static Driver resolved;
  static bool found = false;
  std::lock_guard<std::mutex> lock(mutex);
  if (found) return resolved;
  void* library = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
  if (library == nullptr) return resolved;
  using GetProc =
      CUresult (*)(const char*, void**, int, cuuint64_t, CUdriverProcAddressQueryResult*);
  auto get_proc = reinterpret_cast<GetProc>(dlsym(library, "cuGetProcAddress_v2"));
  if (get_proc == nullptr) return resolved;
  auto one = [&](const char* name, auto* fn) {
    void* p = nullptr;
    if (get_proc(name, &p, 12000, 0, nullptr) == CUDA_SUCCESS)
      *fn = reinterpret_cast<std::remove_pointer_t<decltype(fn)>>(p);
  };
  one("cuCtxGetCurrent", &resolved.current_context);
  one("cuCtxGetDevice", &resolved.context_device);
  one("cuMemAlloc", &resolved.mem_alloc);
  one("cuMemFree", &resolved.mem_free);
  one("cuGetErrorString", &resolved.error_string);
  found = true;
  return resolved;
}

constexpr const char* kHostComm =
    "this communicator was made without a current CUDA context, so it runs on host memory "
    "(make it after cudaSetDevice to run on the GPU)";

const char* cuda_message(CUresult r) {
  const char* text = nullptr;
  const Driver& d = driver();
  return d.error_string != nullptr && d.error_string(r, &text) == CUDA_SUCCESS && text != nullptr
             ? text
             : "unknown CUDA error";
}

}  // namespace

// Weft's own look (one pointer load per call while no driver is loaded).
bool is_device_memory(const void* pointer) {
  weftMemoryType_t type = weftMemoryHost;
  return pointer != nullptr && weftPointerGetMemoryType(pointer, &type, nullptr) == weftSuccess &&
         type == weftMemoryDevice;
}

ncclResult_t check_host_memory(const void* pointer, const char* argument, const char* function) {
  if (is_device_memory(pointer))
    return record(ncclInvalidUsage, function, "%s %p is CUDA device memory: %s", argument, pointer,
                  kHostComm);
  return ncclSuccess;
}

bool cuda_context_current() {
  const Driver& d = driver();
  CUcontext context = nullptr;
  return d.current_context != nullptr && d.current_context(&context) == CUDA_SUCCESS &&
         context != nullptr;
}

bool current_cuda_device(int* device) {
  const Driver& d = driver();
  CUdevice ordinal = 0;
  if (!cuda_context_current() || d.context_device == nullptr ||
      d.context_device(&ordinal) != CUDA_SUCCESS)
    return false;
  *device = ordinal;
  return true;
}

ncclResult_t device_alloc(void** ptr, size_t size, const char* function) {
  const Driver& d = driver();
  if (d.mem_alloc == nullptr)
    return record(ncclUnhandledCudaError, function, "the CUDA driver has no cuMemAlloc_v2");
  CUdeviceptr p = 0;
  if (CUresult r = d.mem_alloc(&p, size); r != CUDA_SUCCESS)
    return record(ncclUnhandledCudaError, function, "cuMemAlloc of %zu bytes failed: %s", size,
                  cuda_message(r));
  *ptr = reinterpret_cast<void*>(p);
  return ncclSuccess;
}

ncclResult_t device_free(void* ptr, const char* function) {
  const Driver& d = driver();
  if (d.mem_free == nullptr)
    return record(ncclUnhandledCudaError, function, "the CUDA driver has no cuMemFree_v2");
  if (CUresult r = d.mem_free(reinterpret_cast<CUdeviceptr>(ptr)); r != CUDA_SUCCESS)
    return record(ncclUnhandledCudaError, function, "cuMemFree failed: %s", cuda_message(r));
  return ncclSuccess;
}

ncclResult_t weft_stream_for(cudaStream_t stream, const char* function, weftStream_t* out) {
  static std::mutex mutex;
  static auto* wrappers = new std::map<cudaStream_t, weftStream_t>;  // never freed
  std::lock_guard<std::mutex> lock(mutex);
  auto it = wrappers->find(stream);
  if (it == wrappers->end()) {
    weftStream_t made = nullptr;
    if (weftResult_t r = weftStreamCreateFromCuda(stream, &made); r != weftSuccess)
      return from_weft(r, function);
    it = wrappers->emplace(stream, made).first;
  }
  *out = it->second;
  return ncclSuccess;
}

namespace {

ncclResult_t refuse_device_api(const char* function) {
  return record(ncclInvalidUsage, function,
                "NCCL's device API (device communicators, teams, barriers, LL all-to-all) is not "
                "provided by Weft: its device code inlines NCCL's own structures");
}

// Team queries return a value, not a result: an empty team, with the last error set.
ncclTeam_t empty_team(const char* function) {
  refuse_device_api(function);
  return ncclTeam_t{0, -1, 0};
}

}  // namespace

}  // namespace weft::nccl

using namespace weft::nccl;

extern "C" {

ncclResult_t pncclDevCommCreate(ncclComm_t, ncclDevCommRequirements_t const*, ncclDevComm_t*) {
  return refuse_device_api(__func__);
}
WEFT_NCCL_ALIAS(ncclDevCommCreate)

ncclResult_t pncclDevCommDestroy(ncclComm_t, ncclDevComm_t const*) {
  return refuse_device_api(__func__);
}
WEFT_NCCL_ALIAS(ncclDevCommDestroy)

ncclTeam_t pncclTeamWorld(ncclComm_t) {
  return empty_team(__func__);
}
WEFT_NCCL_ALIAS(ncclTeamWorld)

ncclTeam_t pncclTeamLsa(ncclComm_t) {
  return empty_team(__func__);
}
WEFT_NCCL_ALIAS(ncclTeamLsa)

ncclTeam_t pncclTeamRail(ncclComm_t) {
  return empty_team(__func__);
}
WEFT_NCCL_ALIAS(ncclTeamRail)

int pncclTeamRankToWorld(ncclComm_t, ncclTeam_t, int) {
  refuse_device_api(__func__);
  return -1;
}
WEFT_NCCL_ALIAS(ncclTeamRankToWorld)

int pncclTeamRankToLsa(ncclComm_t, ncclTeam_t, int) {
  refuse_device_api(__func__);
  return -1;
}
WEFT_NCCL_ALIAS(ncclTeamRankToLsa)

ncclResult_t pncclLsaBarrierCreateRequirement(ncclTeam_t, int, ncclLsaBarrierHandle_t*,
                                              ncclDevResourceRequirements_t*) {
  return refuse_device_api(__func__);
}
WEFT_NCCL_ALIAS(ncclLsaBarrierCreateRequirement)

ncclResult_t pncclGinBarrierCreateRequirement(ncclComm_t, ncclTeam_t, int, ncclGinBarrierHandle_t*,
                                              ncclDevResourceRequirements_t*) {
  return refuse_device_api(__func__);
}
WEFT_NCCL_ALIAS(ncclGinBarrierCreateRequirement)

int pncclLLA2ACalcSlots(int, int) {
  refuse_device_api(__func__);
  return 0;
}
WEFT_NCCL_ALIAS(ncclLLA2ACalcSlots)

ncclResult_t pncclLLA2ACreateRequirement(int, int, ncclLLA2AHandle_t*,
                                         ncclDevResourceRequirements_t*) {
  return refuse_device_api(__func__);
}
WEFT_NCCL_ALIAS(ncclLLA2ACreateRequirement)

}  // extern "C"
