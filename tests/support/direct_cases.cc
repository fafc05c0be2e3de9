#include "support/direct_cases.h"

#include <dirent.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>

#include "support/typed_values.h"

namespace weft::testing {

using algo::Collective;

std::vector<std::string> weft_segments(pid_t pid, const char* prefix) {
  std::vector<std::string> found;
  DIR* dir = opendir("/dev/shm");
  if (dir == nullptr) return found;
  std::string pattern = std::string(prefix) + "-%d-";
  while (dirent* entry = readdir(dir)) {
    int owner = 0;
    if (sscanf(entry->d_name, pattern.c_str(), &owner) != 1) continue;
    bool match = pid != 0 ? owner == pid : kill(owner, 0) != 0 && errno == ESRCH;
    if (match) found.push_back(entry->d_name);
  }
  closedir(dir);
  return found;
}

void NoLeftovers::TearDown() {
  for (const char* prefix : {"weft", "weft-mem"})
    EXPECT_EQ(weft_segments(0, prefix), std::vector<std::string>())
        << prefix << "-* segments left in /dev/shm";
}

weftComm_t direct_comm(weftComm_t parent, int rank, algo::Algorithm algorithm, int timeout_ms) {
  std::string spec;
  for (int c = 0; c < algo::kNumCollectives; ++c)
    if (algo::supports(algorithm, static_cast<Collective>(c)))
      spec += (spec.empty() ? "" : ",") +
              std::string(algo::collective_name(static_cast<Collective>(c))) + ":" +
              algo::algorithm_name(algorithm);
  weftConfig_t config = WEFT_CONFIG_INITIALIZER;
  config.algorithms = spec.c_str();
  if (timeout_ms > 0) config.timeoutMs = timeout_ms;
  weftComm_t comm = nullptr;
  EXPECT_EQ(weftCommSplit(parent, 0, rank, &comm, &config), weftSuccess)
      << weftGetLastError(parent);
  // Attached everywhere: the names are gone already.
  EXPECT_EQ(weft_segments(getpid(), "weft"), std::vector<std::string>());
  return comm;
}

bool is_reduction(Collective c) {
  return c == Collective::ReduceScatter || c == Collective::AllReduce || c == Collective::Reduce;
}

std::vector<std::pair<weftDataType_t, int>> dtype_ops(Collective c) {
  std::vector<std::pair<weftDataType_t, int>> combos;
  if (is_reduction(c)) {
    for (weftDataType_t t : {weftFloat32, weftInt32, weftBfloat16, weftFloat64})
      for (int op = 0; op <= kPreMulSum; ++op) combos.push_back({t, op});
  } else {
    for (weftDataType_t t : {weftInt8, weftFloat64, weftFloat16}) combos.push_back({t, weftSum});
  }
  return combos;
}

namespace {

// Small integers: every reduction of them is exact in every dtype used here.
double input_value(const Case& c, int q, size_t i) {
  if (!is_reduction(c.collective)) return static_cast<double>((q * 5 + i) % 11);
  if (c.op == weftProd) return static_cast<double>((q + i) % 2 + 1);
  return static_cast<double>((q + 2 * i) % 3);
}

// The expected reduction of element i, as an element of c.dtype.
std::vector<uint8_t> reduced(const Case& c, int nranks, size_t i) {
  double value = c.op == weftProd ? 1 : c.op == weftMax ? -1e300 : c.op == weftMin ? 1e300 : 0;
  for (int q = 0; q < nranks; ++q) {
    double v = input_value(c, q, i) * (c.op == kPreMulSum ? 2 : 1);
    value = c.op == weftProd  ? value * v
            : c.op == weftMax ? std::max(value, v)
            : c.op == weftMin ? std::min(value, v)
                              : value + v;
  }
  // Avg: integers truncate, fp64 divides in fp64, other floats in fp32 (as Weft does).
  if (c.op == weftAvg)
    value = c.dtype == weftFloat64   ? value / nranks
            : is_float_type(c.dtype) ? static_cast<float>(value) / static_cast<float>(nranks)
                                     : std::floor(value / nranks);
  std::vector<uint8_t> bytes(dtype_size(c.dtype));
  store_value(c.dtype, bytes.data(), 0, value);
  return bytes;
}

std::vector<uint8_t> moved(const Case& c, int q, size_t i) {
  std::vector<uint8_t> bytes(dtype_size(c.dtype));
  store_value(c.dtype, bytes.data(), 0, input_value(c, q, i));
  return bytes;
}

// AllToAllv: counts from q to p, some zero, some above the staging.
size_t v_count(size_t base, int q, int p) {
  return (q + p) % 3 == 0 ? 0 : base * static_cast<size_t>(1 + (q * 3 + p) % 4);
}

}  // namespace

std::string run_case(weftComm_t comm, const Case& c, int rank, int n, const CaseMemory& memory,
                     const DeviceBuffers* device) {
  const size_t e = dtype_size(c.dtype), count = c.count;
  std::vector<size_t> sc(n), sd(n), rc(n), rd(n);
  size_t in_count = count, out_count = count;
  if (c.collective == Collective::ReduceScatter || c.collective == Collective::AllToAll)
    in_count = n * count;
  if (c.collective == Collective::AllGather || c.collective == Collective::AllToAll)
    out_count = n * count;
  if (c.collective == Collective::AllToAllv) {
    in_count = out_count = 0;
    for (int p = 0; p < n; ++p) {
      sc[p] = v_count(count, rank, p), sd[p] = in_count, in_count += sc[p] + 1;
      rc[p] = v_count(count, p, rank), rd[p] = out_count, out_count += rc[p] + 1;
    }
  }
  size_t total = c.in_place ? std::max(in_count, out_count) : out_count;
  const size_t out_bytes = total * e + 1;
  std::vector<uint8_t> out_vector, separate_vector;
  uint8_t* out = nullptr;
  uint8_t* separate = nullptr;
  if (memory) {
    out = memory(0, out_bytes);
    separate = memory(1, in_count * e + 1);
  } else {
    out_vector.resize(out_bytes);
    separate_vector.resize(in_count * e + 1);
    out = out_vector.data();
    separate = separate_vector.data();
  }
  memset(out, 0xA5, out_bytes);
  uint8_t* recv = out;
  uint8_t* send = c.in_place ? out : separate;
  if (c.in_place && c.collective == Collective::AllGather) send = out + rank * count * e;
  if (c.in_place && c.collective == Collective::ReduceScatter) recv = out + rank * count * e;
  for (size_t i = 0; i < in_count; ++i) store_value(c.dtype, send, i, input_value(c, rank, i));
  // On a GPU: the same layout in device buffers, the call's pointers moved there.
  uint8_t* device_out = nullptr;
  uint8_t* device_separate = nullptr;
  auto on_device = [&](uint8_t* host) -> uint8_t* {
    if (device == nullptr) return host;
    if (host >= out && host < out + out_bytes) return device_out + (host - out);
    return device_separate + (host - separate);
  };
  if (device != nullptr) {
    device_out = static_cast<uint8_t*>(device->allocate(out_bytes));
    device_separate = static_cast<uint8_t*>(device->allocate(in_count * e + 1));
    if (device_out == nullptr || device_separate == nullptr) return "device allocation failed";
    device->to_device(device_out, out, out_bytes);
    device->to_device(device_separate, separate, in_count * e + 1);
  }
  struct Release {
    const DeviceBuffers* device;
    uint8_t *a, *b;
    ~Release() {
      if (device != nullptr) {
        device->free(a);
        device->free(b);
      }
    }
  } release{device, device_out, device_separate};
  weftStream_t stream = device != nullptr ? device->stream : nullptr;

  weftRedOp_t op = static_cast<weftRedOp_t>(c.op);
  if (c.op == kPreMulSum) {
    std::vector<uint8_t> two(e);
    store_value(c.dtype, two.data(), 0, 2.0);
    if (weftRedOpCreatePreMulSum(&op, two.data(), c.dtype, weftScalarHostImmediate, comm) !=
        weftSuccess)
      return weftGetLastError(comm);
  }
  weftResult_t result = weftInternalError;
  uint8_t* call_send = on_device(send);
  uint8_t* call_recv = on_device(recv);
  switch (c.collective) {
    case Collective::AllReduce:
      result = weftAllReduce(call_send, call_recv, count, c.dtype, op, comm, stream);
      break;
    case Collective::ReduceScatter:
      result = weftReduceScatter(call_send, call_recv, count, c.dtype, op, comm, stream);
      break;
    case Collective::Reduce:
      result = weftReduce(call_send, call_recv, count, c.dtype, op, c.root, comm, stream);
      break;
    case Collective::AllGather:
      result = weftAllGather(call_send, call_recv, count, c.dtype, comm, stream);
      break;
    case Collective::Broadcast:
      result = weftBroadcast(call_send, call_recv, count, c.dtype, c.root, comm, stream);
      break;
    case Collective::AllToAll:
      result = weftAllToAll(call_send, call_recv, count, c.dtype, comm, stream);
      break;
    case Collective::AllToAllv:
      result = weftAllToAllv(call_send, sc.data(), sd.data(), call_recv, rc.data(), rd.data(),
                             c.dtype, comm, stream);
      break;
    default:
      break;
  }
  if (result == weftSuccess && stream != nullptr) result = weftStreamSynchronize(stream);
  if (result == weftSuccess) weftCommGetAsyncError(comm, &result);
  if (c.op == kPreMulSum) weftRedOpDestroy(op, comm);
  if (result != weftSuccess) return std::string("call failed: ") + weftGetLastError(comm);
  if (device != nullptr) device->to_host(out, device_out, out_bytes);
  if (out[out_bytes - 1] != 0xA5) return "wrote past the end of the output";

  auto check = [&](size_t index, const std::vector<uint8_t>& want) -> std::string {
    if (memcmp(recv + index * e, want.data(), e) == 0) return "";
    return "element " + std::to_string(index) + ": got " +
           std::to_string(load_value(c.dtype, recv, index)) + ", want " +
           std::to_string(load_value(c.dtype, want.data(), 0));
  };
  std::string error;
  for (size_t i = 0; i < count && error.empty(); ++i) {
    switch (c.collective) {
      case Collective::AllReduce:
        error = check(i, reduced(c, n, i));
        break;
      case Collective::ReduceScatter:
        error = check(i, reduced(c, n, rank * count + i));
        break;
      case Collective::Reduce:
        if (rank == c.root) error = check(i, reduced(c, n, i));
        break;
      case Collective::Broadcast:
        error = check(i, moved(c, c.root, i));
        break;
      case Collective::AllGather:
      case Collective::AllToAll:
        for (int q = 0; q < n && error.empty(); ++q)
          error = check(q * count + i,
                        moved(c, q, c.collective == Collective::AllGather ? i : rank * count + i));
        break;
      default:
        break;
    }
  }
  if (c.collective == Collective::AllToAllv)
    for (int q = 0; q < n && error.empty(); ++q) {
      size_t displ = 0;  // where q's piece for this rank starts in q's input
      for (int p = 0; p < rank; ++p) displ += v_count(count, q, p) + 1;
      for (size_t i = 0; i < rc[q] && error.empty(); ++i)
        error = check(rd[q] + i, moved(c, q, displ + i));
    }
  return error;
}
}  // namespace weft::testing
