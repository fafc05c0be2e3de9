#include "cuda_loader.h"

#include <dlfcn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <mutex>
#include <type_traits>

namespace weft::tools {

namespace {

CudaDriver g_driver;
std::string g_why;
bool g_loaded = false;

bool load() {
  void* library = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
  if (library == nullptr) {
    g_why = std::string("no CUDA driver: ") + dlerror();
    return false;
  }
  using GetProc = int (*)(const char*, void**, int, uint64_t, int*);
  auto get_proc = reinterpret_cast<GetProc>(dlsym(library, "cuGetProcAddress_v2"));
  if (get_proc == nullptr) {
    g_why = "no CUDA driver: libcuda.so.1 lacks cuGetProcAddress_v2 (older than CUDA 12)";
    return false;
  }
  bool ok = true;
  auto one = [&](const char* name, auto* fn) {
    void* p = nullptr;
    if (get_proc(name, &p, 12000, 0, nullptr) != 0 || p == nullptr) {
      g_why = std::string("no CUDA driver: no entry point ") + name;
      ok = false;
    }
    *fn = reinterpret_cast<std::remove_pointer_t<decltype(fn)>>(p);
  };
  one("cuInit", &g_driver.init);
  one("cuGetErrorString", &g_driver.get_error_string);
  one("cuDeviceGetCount", &g_driver.device_get_count);
  one("cuDeviceGet", &g_driver.device_get);
  one("cuDevicePrimaryCtxRetain", &g_driver.primary_ctx_retain);
  one("cuCtxSetCurrent", &g_driver.ctx_set_current);
  one("cuMemAlloc", &g_driver.mem_alloc);
  one("cuMemFree", &g_driver.mem_free);
  one("cuMemcpy", &g_driver.memcpy);
  one("cuMemcpyAsync", &g_driver.memcpy_async);
  one("cuStreamCreate", &g_driver.stream_create);
  one("cuStreamDestroy", &g_driver.stream_destroy);
  one("cuStreamSynchronize", &g_driver.stream_synchronize);
  g_driver.emulated = dlsym(library, "weft_emulated_cuda_driver") != nullptr;
  if (!ok) return false;
  if (int r = g_driver.init(0); r != 0) {
    g_why = std::string("no CUDA device: cuInit failed: ") + g_driver.error(r);
    return false;
  }
  return true;
}

}  // namespace

const char* CudaDriver::error(int result) const {
  const char* text = nullptr;
  return get_error_string != nullptr && get_error_string(result, &text) == 0 && text != nullptr
             ? text
             : "unknown error";
}

const CudaDriver* use_gpu(int device, std::string* why) {
  static std::once_flag once;
  std::call_once(once, [] { g_loaded = load(); });
  if (!g_loaded) {
    *why = g_why;
    return nullptr;
  }
  int count = 0, handle = 0;
  void* context = nullptr;
  if (int r = g_driver.device_get_count(&count); r != 0 || count <= device) {
    *why = "no CUDA device " + std::to_string(device) + " (" + std::to_string(count) + " found)";
    return nullptr;
  }
  if (int r = g_driver.device_get(&handle, device); r != 0) {
    *why = std::string("cuDeviceGet: ") + g_driver.error(r);
    return nullptr;
  }
  if (int r = g_driver.primary_ctx_retain(&context, handle); r != 0) {
    *why = std::string("cuDevicePrimaryCtxRetain: ") + g_driver.error(r);
    return nullptr;
  }
  if (int r = g_driver.ctx_set_current(context); r != 0) {
    *why = std::string("cuCtxSetCurrent: ") + g_driver.error(r);
    return nullptr;
  }
  return &g_driver;
}

bool gpu_present(std::string* why) {
  int pipes[2];
  if (pipe(pipes) != 0) {
    *why = "pipe failed";
    return false;
  }
  const pid_t child = fork();
  if (child == 0) {
    close(pipes[0]);
    std::string reason;
    const bool present = use_gpu(0, &reason) != nullptr;
    if (!present) (void)!write(pipes[1], reason.data(), reason.size());
    _exit(present ? 0 : 1);
  }
  close(pipes[1]);
  char buffer[512];
  ssize_t got = read(pipes[0], buffer, sizeof buffer);
  close(pipes[0]);
  int status = 0;
  waitpid(child, &status, 0);
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return true;
  *why = got > 0 ? std::string(buffer, static_cast<size_t>(got)) : "the probe failed";
  return false;
}

}  // namespace weft::tools
