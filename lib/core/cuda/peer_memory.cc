#include "core/cuda/peer_memory.h"

#include <unistd.h>

namespace weft::cuda {

namespace {

constexpr const char* kWhat = "GPU memory sharing";

#define WEFT_DRIVER_CALL(call, name)                                                        \
  do {                                                                                      \
    if (drv::Result r_ = (call); r_ != drv::kSuccess) return driver_error(r_, kWhat, name); \
  } while (0)

const Api& driver() {
  return *api();  // callers hold a context, so the driver is loaded
}

drv::AllocationProp device_prop(drv::Device device) {
  drv::AllocationProp prop;
  prop.location.id = device;
  return prop;
}

// Makes [base, base + bytes) readable and writable from `device`.
Status grant_access(drv::DevicePtr base, size_t bytes, drv::Device device) {
  drv::AccessDesc access;
  access.location.id = device;
  WEFT_DRIVER_CALL(driver().mem_set_access(base, bytes, &access, 1), "cuMemSetAccess");
  return Status::Ok();
}

// Reserves an address range and maps the whole of `handle` there, readable and writable
// from `device`; on failure nothing is left reserved or mapped.
Status map_handle(drv::MemHandle handle, size_t bytes, drv::Device device, drv::DevicePtr* out) {
  const Api& d = driver();
  drv::DevicePtr base = 0;
  WEFT_DRIVER_CALL(d.mem_address_reserve(&base, bytes, 0, 0, 0), "cuMemAddressReserve");
  if (drv::Result r = d.mem_map(base, bytes, 0, handle, 0); r != drv::kSuccess) {
    d.mem_address_free(base, bytes);
    return driver_error(r, kWhat, "cuMemMap");
  }
  if (Status granted = grant_access(base, bytes, device); !granted.ok()) {
    d.mem_unmap(base, bytes);
    d.mem_address_free(base, bytes);
    return granted;
  }
  *out = base;
  return Status::Ok();
}

void unmap_handle(drv::DevicePtr base, size_t bytes, drv::MemHandle handle) {
  const Api& d = driver();
  d.mem_unmap(base, bytes);
  d.mem_address_free(base, bytes);
  d.mem_release(handle);
}

}  // namespace

const char* ipc_kind_name(IpcKind kind) {
  switch (kind) {
    case IpcKind::Pointer:
      return "pointer";
    case IpcKind::PosixFd:
      return "posix-fd";
    case IpcKind::Legacy:
      return "legacy";
  }
  return "?";
}

bool supports_posix_fd(drv::Device device) {
  const Api* d = api();
  int vmm = 0, fds = 0;
  return d != nullptr &&
         d->device_get_attribute(&vmm, drv::kAttrVirtualMemoryManagement, device) ==
             drv::kSuccess &&
         d->device_get_attribute(&fds, drv::kAttrPosixFdHandles, device) == drv::kSuccess &&
         vmm != 0 && fds != 0;
}

Region& Region::operator=(Region&& other) noexcept {
  if (this != &other) {
    reset();
    base_ = std::exchange(other.base_, 0);
    bytes_ = std::exchange(other.bytes_, 0);
    kind_ = other.kind_;
    imported_ = other.imported_;
    handle_ = std::exchange(other.handle_, 0);
  }
  return *this;
}

Status Region::allocate(drv::Device device, size_t bytes, IpcKind kind, Region* out) {
  const Api& d = driver();
  out->reset();
  out->kind_ = kind;
  out->imported_ = false;
  if (kind != IpcKind::PosixFd) {
    WEFT_DRIVER_CALL(d.mem_alloc(&out->base_, bytes), "cuMemAlloc");
    out->bytes_ = bytes;
    return Status::Ok();
  }
  const drv::AllocationProp prop = device_prop(device);
  size_t granularity = 0;
  WEFT_DRIVER_CALL(d.mem_get_allocation_granularity(&granularity, &prop, drv::kGranularityMinimum),
                   "cuMemGetAllocationGranularity");
  if (granularity == 0) granularity = 1;
  const size_t rounded = (bytes + granularity - 1) / granularity * granularity;
  drv::MemHandle handle = 0;
  WEFT_DRIVER_CALL(d.mem_create(&handle, rounded, &prop, 0), "cuMemCreate");
  if (Status mapped = map_handle(handle, rounded, device, &out->base_); !mapped.ok()) {
    d.mem_release(handle);
    return mapped;
  }
  out->handle_ = handle;
  out->bytes_ = rounded;
  return Status::Ok();
}

Region Region::from_pointer(drv::DevicePtr base, size_t bytes) {
  Region region;
  region.base_ = base;
  region.bytes_ = bytes;
  region.kind_ = IpcKind::Pointer;
  region.imported_ = true;
  return region;
}

Status Region::from_fd(int fd, size_t bytes, drv::Device device, Region* out) {
  const Api& d = driver();
  out->reset();
  drv::MemHandle handle = 0;
  WEFT_DRIVER_CALL(
      d.mem_import_from_shareable_handle(
          &handle, reinterpret_cast<void*>(static_cast<intptr_t>(fd)), drv::kHandlePosixFd),
      "cuMemImportFromShareableHandle");
  drv::DevicePtr base = 0;
  if (Status mapped = map_handle(handle, bytes, device, &base); !mapped.ok()) {
    d.mem_release(handle);
    return mapped;
  }
  out->base_ = base;
  out->bytes_ = bytes;
  out->kind_ = IpcKind::PosixFd;
  out->imported_ = true;
  out->handle_ = handle;
  return Status::Ok();
}

Status Region::from_legacy(const drv::IpcMemHandle& handle, size_t bytes, Region* out) {
  out->reset();
  drv::DevicePtr base = 0;
  WEFT_DRIVER_CALL(driver().ipc_open_mem_handle(&base, handle, drv::kIpcLazyEnablePeerAccess),
                   "cuIpcOpenMemHandle");
  out->base_ = base;
  out->bytes_ = bytes;
  out->kind_ = IpcKind::Legacy;
  out->imported_ = true;
  return Status::Ok();
}

Status Region::export_fd(int* fd) const {
  *fd = -1;
  WEFT_DRIVER_CALL(driver().mem_export_to_shareable_handle(fd, handle_, drv::kHandlePosixFd, 0),
                   "cuMemExportToShareableHandle");
  return Status::Ok();
}

Status Region::export_legacy(drv::IpcMemHandle* handle) const {
  WEFT_DRIVER_CALL(driver().ipc_get_mem_handle(handle, base_), "cuIpcGetMemHandle");
  return Status::Ok();
}

void Region::reset() {
  if (base_ == 0) return;
  if (kind_ == IpcKind::PosixFd) {
    unmap_handle(base_, bytes_, handle_);  // the physical memory lives while any process maps it
  } else if (!imported_) {
    driver().mem_free(base_);
  } else if (kind_ == IpcKind::Legacy) {
    driver().ipc_close_mem_handle(base_);
  }
  base_ = 0;
  bytes_ = 0;
  handle_ = 0;
}

}  // namespace weft::cuda
