// CUDA awareness without linking CUDA: the driver is looked up at run time
// (only if the program already loaded it), so libnccl.so.2 loads on machines
// without a GPU. The device-API host functions are refused: their device-side
// counterparts are inline code over NCCL's structures, which Weft does not have.
#include <cuda.h>
#include <dlfcn.h>
#include <nccl_device.h>

#include "api/nccl/shim.h"

namespace weft::nccl {

namespace {

struct Driver {
  decltype(&cuPointerGetAttribute) pointer_attribute = nullptr;
  decltype(&cuCtxGetCurrent) current_context = nullptr;
};

// RTLD_NOLOAD: a program that never touched CUDA has no device memory, and
// loading the driver for it would only cost time (or fail without a GPU).
const Driver& driver() {
  static const Driver loaded = [] {
    Driver d;
    void* library = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
    if (library == nullptr) return d;
    d.pointer_attribute =
        reinterpret_cast<decltype(d.pointer_attribute)>(dlsym(library, "cuPointerGetAttribute"));
    d.current_context =
        reinterpret_cast<decltype(d.current_context)>(dlsym(library, "cuCtxGetCurrent"));
    return d;
  }();
  return loaded;
}

constexpr const char* kNoGpuPath =
    "Weft's GPU path has not landed yet, so this libnccl.so.2 runs on host memory only";

}  // namespace

bool is_device_memory(const void* pointer) {
  const Driver& d = driver();
  if (pointer == nullptr || d.pointer_attribute == nullptr) return false;
  unsigned int type = 0;
  // Host memory CUDA does not know gives an error: that is the host case.
  return d.pointer_attribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                             reinterpret_cast<CUdeviceptr>(pointer)) == CUDA_SUCCESS &&
         type == CU_MEMORYTYPE_DEVICE;
}

ncclResult_t check_host_memory(const void* pointer, const char* argument, const char* function) {
  if (is_device_memory(pointer))
    return record(ncclInvalidUsage, function, "%s %p is CUDA device memory: %s", argument, pointer,
                  kNoGpuPath);
  return ncclSuccess;
}

bool cuda_context_current() {
  const Driver& d = driver();
  CUcontext context = nullptr;
  return d.current_context != nullptr && d.current_context(&context) == CUDA_SUCCESS &&
         context != nullptr;
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
