// A stand-in libcuda.so.1 for tests on machines without a GPU: enough of the driver ABI
// for Weft's run-time lookup (cuGetProcAddress_v2 and the entry points it resolves), in
// which the bytes of `weft_fake_device_memory` are device memory of GPU 3 and every other
// pointer is unknown to CUDA. It lets a test load "the driver" after Weft has looked for
// it, as a process that initialises CUDA late does.
#include <stddef.h>
#include <stdint.h>
#include <string.h>

enum { kSuccess = 0, kNotSupported = 801, kMemoryTypeDevice = 2 };
enum { kAttrMemoryType = 2, kAttrIsManaged = 8, kAttrDeviceOrdinal = 9 };

char weft_fake_device_memory[4096];

static int get_error_string(int error, const char** text) {
  *text = error == kSuccess ? "no error" : "not supported by the fake driver";
  return kSuccess;
}

static int pointer_get_attributes(unsigned n, int* attributes, void** data, uintptr_t ptr) {
  const uintptr_t begin = (uintptr_t)weft_fake_device_memory;
  const int device = ptr >= begin && ptr < begin + sizeof weft_fake_device_memory;
  for (unsigned i = 0; i < n; ++i) {
    uint32_t value = 0;
    if (device && attributes[i] == kAttrMemoryType) value = kMemoryTypeDevice;
    if (device && attributes[i] == kAttrDeviceOrdinal) value = 3;
    memcpy(data[i], &value, sizeof value);
  }
  return kSuccess;
}

static int unsupported(void) {
  return kNotSupported;
}

int cuGetProcAddress_v2(const char* name, void** fn, int version, uint64_t flags, int* found) {
  (void)version;
  (void)flags;
  if (strcmp(name, "cuGetErrorString") == 0)
    *fn = (void*)get_error_string;
  else if (strcmp(name, "cuPointerGetAttributes") == 0)
    *fn = (void*)pointer_get_attributes;
  else
    *fn = (void*)unsupported;
  if (found != NULL) *found = 1;
  return kSuccess;
}
