// Device memory a rank shares with the other ranks of its node, and the peers' memory it
// maps: the driver calls of CUDA IPC (docs/cuda-ipc.md). Three kinds, chosen per pair of ranks:
//  - Pointer: ranks that are threads of one process use each other's addresses as they are
//    (an IPC handle cannot be opened in the process that made it);
//  - PosixFd: cuMemCreate with a POSIX file-descriptor handle, exported as an fd, passed
//    over an AF_UNIX socket (transports/cuda_ipc/fd_exchange.h), imported, reserved, mapped
//    and made accessible by the peer;
//  - Legacy: cuMemAlloc + cuIpcGetMemHandle, whose 64 bytes travel through the bootstrap,
//    and cuIpcOpenMemHandle: the fallback where the driver offers no POSIX-fd handles.
// Every call here needs the device's context current (cuda::ContextScope).
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>

#include "common/status.h"
#include "core/cuda/driver.h"

namespace weft::cuda {

enum class IpcKind : uint8_t { Pointer = 0, PosixFd = 1, Legacy = 2 };
const char* ipc_kind_name(IpcKind kind);

// Device memory shared between ranks: this rank's allocation (exportable as `kind`; Pointer:
// not exported) or a peer's mapped here. Move-only; releasing undoes what made it.
class Region {
 public:
  Region() = default;
  Region(Region&& other) noexcept { *this = std::move(other); }
  Region& operator=(Region&& other) noexcept;
  ~Region() { reset(); }

  // At least `bytes` of device memory on `device` (the current context's).
  static Status allocate(drv::Device device, size_t bytes, IpcKind kind, Region* out);
  // A peer's region by its address (a thread of this process): nothing to release.
  static Region from_pointer(drv::DevicePtr base, size_t bytes);
  // `bytes` of the allocation behind `fd` (PosixFd), made accessible to `device`.
  static Status from_fd(int fd, size_t bytes, drv::Device device, Region* out);
  static Status from_legacy(const drv::IpcMemHandle& handle, size_t bytes, Region* out);

  drv::DevicePtr base() const { return base_; }
  size_t bytes() const { return bytes_; }
  // An allocation of this rank's: a new descriptor for it (PosixFd; the caller closes it), or
  // its legacy IPC handle.
  Status export_fd(int* fd) const;
  Status export_legacy(drv::IpcMemHandle* handle) const;
  void reset();

 private:
  drv::DevicePtr base_ = 0;
  size_t bytes_ = 0;
  IpcKind kind_ = IpcKind::Pointer;
  bool imported_ = false;
  drv::MemHandle handle_ = 0;  // PosixFd: the physical allocation
};

// Whether `device` can export POSIX-fd handles (VMM and the handle type both supported).
bool supports_posix_fd(drv::Device device);

}  // namespace weft::cuda
