// A program written against NCCL's header only (nccl.h, not weft.h), as any
// NCCL user's is. Run under weftrun at 1-5 ranks with host memory; it checks
// every collective, type and op on the libnccl.so.2 it is bound to, and that
// this library is the one NCCL_SHIM_EXPECT names (ours, also when it is
// LD_PRELOADed over the real NCCL). Exits non-zero on any failure.
#include <dlfcn.h>
#include <nccl.h>
#include <nccl_device.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

namespace {

int g_rank = 0;
int g_nranks = 1;
int g_failures = 0;

#define CHECK(cond, ...)                                                              \
  do {                                                                                \
    if (!(cond)) {                                                                    \
      fprintf(stderr, "rank %d FAIL %s:%d: %s: ", g_rank, __FILE__, __LINE__, #cond); \
      fprintf(stderr, __VA_ARGS__);                                                   \
      fputc('\n', stderr);                                                            \
      if (++g_failures > 20) exit(1);                                                 \
    }                                                                                 \
  } while (0)

#define OK(call)                                                                          \
  do {                                                                                    \
    ncclResult_t ok_result = (call);                                                      \
    CHECK(ok_result == ncclSuccess, "%s -> %s: %s", #call, ncclGetErrorString(ok_result), \
          ncclGetLastError(NULL));                                                        \
  } while (0)

// The rendezvous id travels through a file named after weftrun's per-job secret.
ncclUniqueId exchange_id() {
  const char* secret = getenv("WEFT_SECRET");
  std::string path = std::string("/tmp/weft-nccl-abi-") + (secret ? secret : "solo") + ".id";
  ncclUniqueId id;
  if (g_rank == 0) {
    OK(ncclGetUniqueId(&id));
    std::string tmp = path + ".tmp";
    std::ofstream(tmp, std::ios::binary).write(id.internal, sizeof(id.internal));
    CHECK(rename(tmp.c_str(), path.c_str()) == 0, "rename %s", path.c_str());
    return id;
  }
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  for (;;) {
    std::ifstream in(path, std::ios::binary);
    if (in.read(id.internal, sizeof(id.internal))) return id;
    if (std::chrono::steady_clock::now() > deadline) {
      fprintf(stderr, "rank %d: no id file %s\n", g_rank, path.c_str());
      exit(1);
    }
    std::this_thread::yield();
  }
}

// ------------------------------------------------------------------ values
// Small integers, exact in every type (fp8 e5m2 included), encoded per type.
uint32_t encode_minifloat(double v, int ebits, int mbits) {
  if (v == 0) return 0;
  float f = static_cast<float>(v);
  uint32_t bits;
  memcpy(&bits, &f, 4);
  uint32_t sign = bits >> 31;
  int exponent = static_cast<int>((bits >> 23) & 255) - 127 + ((1 << (ebits - 1)) - 1);
  uint32_t mantissa = (bits >> (23 - mbits)) & ((1u << mbits) - 1);
  return sign << (ebits + mbits) | static_cast<uint32_t>(exponent) << mbits | mantissa;
}

double decode_minifloat(uint32_t bits, int ebits, int mbits) {
  int bias = (1 << (ebits - 1)) - 1;
  uint32_t exponent = (bits >> mbits) & ((1u << ebits) - 1);
  double mantissa = bits & ((1u << mbits) - 1);
  double value = exponent == 0 ? std::ldexp(mantissa, 1 - bias - mbits)
                               : std::ldexp(1 + mantissa / (1 << mbits), exponent - bias);
  return (bits >> (ebits + mbits)) & 1 ? -value : value;
}

constexpr size_t kSizes[] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2, 1, 1};
const char* const kTypeNames[] = {"int8",    "uint8",    "int32",   "uint32",
                                  "int64",   "uint64",   "float16", "float32",
                                  "float64", "bfloat16", "fp8e4m3", "fp8e5m2"};

void put(void* base, size_t i, ncclDataType_t t, double v) {
  char* p = static_cast<char*>(base) + i * kSizes[t];
  switch (t) {
    case ncclInt8:
      *reinterpret_cast<int8_t*>(p) = static_cast<int8_t>(v);
      break;
    case ncclUint8:
      *reinterpret_cast<uint8_t*>(p) = static_cast<uint8_t>(v);
      break;
    case ncclInt32:
      *reinterpret_cast<int32_t*>(p) = static_cast<int32_t>(v);
      break;
    case ncclUint32:
      *reinterpret_cast<uint32_t*>(p) = static_cast<uint32_t>(v);
      break;
    case ncclInt64:
      *reinterpret_cast<int64_t*>(p) = static_cast<int64_t>(v);
      break;
    case ncclUint64:
      *reinterpret_cast<uint64_t*>(p) = static_cast<uint64_t>(v);
      break;
    case ncclFloat16:
      *reinterpret_cast<uint16_t*>(p) = encode_minifloat(v, 5, 10);
      break;
    case ncclFloat32:
      *reinterpret_cast<float*>(p) = static_cast<float>(v);
      break;
    case ncclFloat64:
      *reinterpret_cast<double*>(p) = v;
      break;
    case ncclBfloat16:
      *reinterpret_cast<uint16_t*>(p) = encode_minifloat(v, 8, 7);
      break;
    case ncclFloat8e4m3:
      *reinterpret_cast<uint8_t*>(p) = encode_minifloat(v, 4, 3);
      break;
    default:
      *reinterpret_cast<uint8_t*>(p) = encode_minifloat(v, 5, 2);
      break;
  }
}

double get(const void* base, size_t i, ncclDataType_t t) {
  const char* p = static_cast<const char*>(base) + i * kSizes[t];
  switch (t) {
    case ncclInt8:
      return *reinterpret_cast<const int8_t*>(p);
    case ncclUint8:
      return *reinterpret_cast<const uint8_t*>(p);
    case ncclInt32:
      return *reinterpret_cast<const int32_t*>(p);
    case ncclUint32:
      return *reinterpret_cast<const uint32_t*>(p);
    case ncclInt64:
      return static_cast<double>(*reinterpret_cast<const int64_t*>(p));
    case ncclUint64:
      return static_cast<double>(*reinterpret_cast<const uint64_t*>(p));
    case ncclFloat16:
      return decode_minifloat(*reinterpret_cast<const uint16_t*>(p), 5, 10);
    case ncclFloat32:
      return *reinterpret_cast<const float*>(p);
    case ncclFloat64:
      return *reinterpret_cast<const double*>(p);
    case ncclBfloat16:
      return decode_minifloat(*reinterpret_cast<const uint16_t*>(p), 8, 7);
    case ncclFloat8e4m3:
      return decode_minifloat(*reinterpret_cast<const uint8_t*>(p), 4, 3);
    default:
      return decode_minifloat(*reinterpret_cast<const uint8_t*>(p), 5, 2);
  }
}

bool is_float(ncclDataType_t t) {
  return t >= ncclFloat16;
}

// Relative precision of the type (fp8 e5m2 has 2 mantissa bits).
double precision(ncclDataType_t t) {
  switch (t) {
    case ncclFloat16:
      return std::ldexp(1, -10);
    case ncclBfloat16:
      return std::ldexp(1, -7);
    case ncclFloat8e4m3:
      return std::ldexp(1, -3);
    case ncclFloat8e5m2:
      return std::ldexp(1, -2);
    default:
      return 1e-6;
  }
}

// Rank r's element i for each op: sums stay <= 5, products are powers of two.
double input(int op_kind, int r, size_t i) {
  switch (op_kind) {
    case ncclProd:
      return ((r + i) % 3 == 0) ? 2 : 1;
    case ncclMax:
    case ncclMin:
      return static_cast<double>((r * 7 + i * 3) % 5);
    default:
      return static_cast<double>((r + i) % 2);
  }
}

// The exact result over all ranks; op_kind 5 is a pre-multiplied sum (x2).
double expected(int op_kind, size_t i, ncclDataType_t t) {
  double acc = op_kind == ncclProd ? 1 : (op_kind == ncclMin ? 1e9 : (op_kind == ncclMax ? -1 : 0));
  for (int r = 0; r < g_nranks; ++r) {
    double v = input(op_kind, r, i);
    if (op_kind == ncclProd)
      acc *= v;
    else if (op_kind == ncclMax)
      acc = std::max(acc, v);
    else if (op_kind == ncclMin)
      acc = std::min(acc, v);
    else
      acc += v;
  }
  if (op_kind == ncclAvg) acc = is_float(t) ? acc / g_nranks : std::floor(acc / g_nranks);
  if (op_kind >= ncclNumOps) acc *= 2;
  return acc;
}

bool close_enough(double got, double want, ncclDataType_t t, int op_kind) {
  if (op_kind != ncclAvg) return got == want;
  return std::fabs(got - want) <= std::fabs(want) * precision(t) + 1e-12;
}

// ------------------------------------------------------------- reductions
enum class Red { AllReduce, Reduce, ReduceScatter };

void check_reduction(ncclComm_t comm, Red kind, ncclDataType_t t, int op_kind, size_t count,
                     bool in_place) {
  const int n = g_nranks, root = n - 1;
  size_t in_count = kind == Red::ReduceScatter ? count * n : count;
  std::vector<char> send(in_count * kSizes[t] + 1), recv(in_count * kSizes[t] + 1);
  for (size_t i = 0; i < in_count; ++i) put(send.data(), i, t, input(op_kind, g_rank, i));
  ncclRedOp_t op = static_cast<ncclRedOp_t>(op_kind);
  char scalar[8];
  put(scalar, 0, t, 2);
  if (op_kind >= ncclNumOps) {
    auto residence = op_kind == ncclNumOps ? ncclScalarHostImmediate : ncclScalarDevice;
    OK(ncclRedOpCreatePreMulSum(&op, scalar, t, residence, comm));
    CHECK(op >= ncclNumOps, "PreMulSum op %d", op);
  }
  void* out = in_place ? send.data() : recv.data();
  const void* in = send.data();
  ncclResult_t r;
  if (kind == Red::AllReduce)
    r = ncclAllReduce(in, out, count, t, op, comm, nullptr);
  else if (kind == Red::Reduce)
    r = ncclReduce(in, out, count, t, op, root, comm, nullptr);
  else {
    if (in_place) out = send.data() + g_rank * count * kSizes[t];
    r = ncclReduceScatter(in, out, count, t, op, comm, nullptr);
  }
  CHECK(r == ncclSuccess, "reduction %d %s op %d count %zu inplace %d: %s", static_cast<int>(kind),
        kTypeNames[t], op_kind, count, in_place, ncclGetLastError(NULL));
  if (op_kind >= ncclNumOps) OK(ncclRedOpDestroy(op, comm));
  if (kind == Red::Reduce && g_rank != root) return;
  int wrong = 0;
  for (size_t i = 0; i < count; ++i) {
    size_t global = kind == Red::ReduceScatter ? g_rank * count + i : i;
    double want = expected(op_kind, global, t), got = get(out, i, t);
    if (!close_enough(got, want, t, op_kind) && wrong++ == 0)
      CHECK(false, "kind %d %s op %d count %zu inplace %d: [%zu] = %g, want %g",
            static_cast<int>(kind), kTypeNames[t], op_kind, count, in_place, i, got, want);
  }
}

// --------------------------------------------------------- data movement
// Element i of rank r's piece, as bytes: any type moves bytes unchanged.
uint8_t byte_of(int r, size_t i) {
  return static_cast<uint8_t>(r * 37 + i * 11 + 1);
}

enum class Move { AllGather, Broadcast, AllToAll, Gather, Scatter };

void check_move(ncclComm_t comm, Move kind, ncclDataType_t t, size_t count, bool in_place) {
  const int n = g_nranks, root = n > 1 ? 1 : 0;
  const size_t e = kSizes[t], piece = count * e;
  std::vector<uint8_t> send(piece * n + 1, 0), recv(piece * n + 1, 0xEE);
  // The pieces this rank sends: AllGather/Gather one, AllToAll/Scatter one per destination.
  for (int q = 0; q < n; ++q)
    for (size_t b = 0; b < piece; ++b) send[q * piece + b] = byte_of(g_rank * n + q, b);
  uint8_t* in = send.data();
  uint8_t* out = recv.data();
  ncclResult_t r = ncclSuccess;
  switch (kind) {
    case Move::AllGather:
      if (in_place) {
        memcpy(out + g_rank * piece, in, piece);
        in = out + g_rank * piece;
      }
      r = ncclAllGather(in, out, count, t, comm, nullptr);
      break;
    case Move::Broadcast:
      if (in_place) {
        memcpy(out, in, piece);
        r = ncclBcast(out, count, t, root, comm, nullptr);
      } else {
        r = ncclBroadcast(in, out, count, t, root, comm, nullptr);
      }
      break;
    case Move::AllToAll:
      if (in_place) {
        memcpy(out, in, piece * n);
        in = out;
      }
      r = ncclAlltoAll(in, out, count, t, comm, nullptr);
      break;
    case Move::Gather:
      if (in_place && g_rank == root) {
        memcpy(out + root * piece, in, piece);
        in = out + root * piece;
      }
      r = ncclGather(in, out, count, t, root, comm, nullptr);
      break;
    case Move::Scatter:
      if (in_place && g_rank == root) out = in + root * piece;
      r = ncclScatter(in, out, count, t, root, comm, nullptr);
      break;
  }
  CHECK(r == ncclSuccess, "move %d %s count %zu inplace %d: %s", static_cast<int>(kind),
        kTypeNames[t], count, in_place, ncclGetLastError(NULL));
  // Expected bytes of the output: source rank s's piece q.
  auto want_at = [&](int s, int q, size_t b) { return byte_of(s * n + q, b); };
  int wrong = 0;
  auto expect = [&](size_t at, uint8_t want) {
    if (out[at] != want && wrong++ == 0)
      CHECK(false, "move %d %s count %zu inplace %d: byte %zu = %d, want %d",
            static_cast<int>(kind), kTypeNames[t], count, in_place, at, out[at], want);
  };
  for (size_t b = 0; b < piece; ++b) {
    for (int s = 0; s < n; ++s) {
      if (kind == Move::AllGather) expect(s * piece + b, want_at(s, 0, b));
      if (kind == Move::AllToAll) expect(s * piece + b, want_at(s, g_rank, b));
      if (kind == Move::Gather && g_rank == root) expect(s * piece + b, want_at(s, 0, b));
    }
    if (kind == Move::Broadcast) expect(b, want_at(root, 0, b));
    if (kind == Move::Scatter) expect(b, want_at(root, g_rank, b));
  }
}

// --------------------------------------------------------------- p2p
void check_p2p(ncclComm_t comm) {
  const int n = g_nranks;
  const size_t count = 1001;
  std::vector<int32_t> out(count * n), in(count * n, -1);
  for (int q = 0; q < n; ++q)
    for (size_t i = 0; i < count; ++i)
      out[q * count + i] = g_rank * 100000 + q * 1000 + static_cast<int>(i);
  // Every pair at once, in nested groups (the inner ends change nothing).
  OK(ncclGroupStart());
  for (int q = 0; q < n; ++q) {
    OK(ncclGroupStart());
    OK(ncclSend(out.data() + q * count, count, ncclInt32, q, comm, nullptr));
    OK(ncclGroupEnd());
    OK(ncclRecv(in.data() + q * count, count, ncclInt32, q, comm, nullptr));
  }
  OK(ncclGroupEnd());
  for (int q = 0; q < n; ++q)
    CHECK(in[q * count + 7] == q * 100000 + g_rank * 1000 + 7, "from %d: %d", q, in[q * count + 7]);
  // A ring shift, count 0 included.
  int next = (g_rank + 1) % n, prev = (g_rank + n - 1) % n;
  int32_t token = g_rank, got = -1;
  OK(ncclGroupStart());
  OK(ncclSend(&token, 1, ncclInt32, next, comm, nullptr));
  OK(ncclRecv(&got, 1, ncclInt32, prev, comm, nullptr));
  OK(ncclSend(nullptr, 0, ncclInt32, next, comm, nullptr));
  OK(ncclRecv(nullptr, 0, ncclInt32, prev, comm, nullptr));
  OK(ncclGroupEnd());
  CHECK(got == prev, "ring got %d want %d", got, prev);
}

// ------------------------------------------------------- communicators
int sum_of_ranks(ncclComm_t comm) {
  int count = 0, rank = -1;
  OK(ncclCommCount(comm, &count));
  OK(ncclCommUserRank(comm, &rank));
  int32_t value = rank, sum = -1;
  OK(ncclAllReduce(&value, &sum, 1, ncclInt32, ncclSum, comm, nullptr));
  CHECK(sum == count * (count - 1) / 2, "sum of ranks %d over %d", sum, count);
  return sum;
}

void wait_async(ncclComm_t comm) {
  ncclResult_t state = ncclInProgress;
  while (state == ncclInProgress) OK(ncclCommGetAsyncError(comm, &state));
  CHECK(state == ncclSuccess, "async state %s: %s", ncclGetErrorString(state),
        ncclGetLastError(NULL));
}

void check_config_and_nonblocking(ncclComm_t world) {
  ncclUniqueId id;
  if (g_rank == 0) OK(ncclGetUniqueId(&id));
  OK(ncclBroadcast(&id, &id, sizeof(id), ncclUint8, 0, world, nullptr));

  ncclConfig_t bad = NCCL_CONFIG_INITIALIZER;
  bad.magic = 0x1234;
  ncclComm_t none = nullptr;
  CHECK(ncclCommInitRankConfig(&none, g_nranks, id, g_rank, &bad) == ncclInvalidArgument,
        "bad magic accepted");
  CHECK(strstr(ncclGetLastError(NULL), "NCCL_CONFIG_INITIALIZER") != nullptr, "message: %s",
        ncclGetLastError(NULL));

  // Non-blocking: InProgress with *comm set, then Success through the async error.
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  config.commName = "nonblocking";
  ncclComm_t nb = nullptr;
  ncclResult_t r = ncclCommInitRankConfig(&nb, g_nranks, id, g_rank, &config);
  CHECK(r == ncclInProgress, "non-blocking init returned %s", ncclGetErrorString(r));
  CHECK(nb != nullptr, "comm not set while in progress");
  wait_async(nb);
  // A group on it may end InProgress; its results are there once the comm is ready.
  int32_t value = g_rank + 1, sum = 0;
  OK(ncclGroupStart());
  OK(ncclAllReduce(&value, &sum, 1, ncclInt32, ncclSum, nb, nullptr));
  r = ncclGroupEnd();
  CHECK(r == ncclSuccess || r == ncclInProgress, "group end %s", ncclGetErrorString(r));
  wait_async(nb);
  CHECK(sum == g_nranks * (g_nranks + 1) / 2, "non-blocking sum %d", sum);
  // A split with a NULL config inherits non-blocking.
  ncclComm_t child = nullptr;
  r = ncclCommSplit(nb, 0, g_rank, &child, nullptr);
  CHECK(r == ncclInProgress, "non-blocking split returned %s", ncclGetErrorString(r));
  wait_async(nb);
  CHECK(child != nullptr, "split child not set");
  if (child != nullptr) {
    wait_async(child);
    sum_of_ranks(child);
    OK(ncclCommDestroy(child));
  }
  // A non-blocking init inside a group: the group's end is what returns InProgress.
  if (g_rank == 0) OK(ncclGetUniqueId(&id));
  OK(ncclBroadcast(&id, &id, sizeof(id), ncclUint8, 0, world, nullptr));
  ncclComm_t grouped = nullptr;
  OK(ncclGroupStart());
  OK(ncclCommInitRankConfig(&grouped, g_nranks, id, g_rank, &config));
  r = ncclGroupEnd();
  CHECK(r == ncclInProgress, "non-blocking group init ended %s", ncclGetErrorString(r));
  wait_async(grouped);
  sum_of_ranks(grouped);
  OK(ncclCommDestroy(grouped));
  OK(ncclCommFinalize(nb));
  wait_async(nb);
  OK(ncclCommDestroy(nb));
}

void check_split_finalize(ncclComm_t world) {
  const int n = g_nranks;
  // Colors by parity, keys reversing the order; the last rank opts out when n >= 3.
  int color = (n >= 3 && g_rank == n - 1) ? NCCL_SPLIT_NOCOLOR : g_rank % 2;
  ncclComm_t half = reinterpret_cast<ncclComm_t>(&color);
  OK(ncclCommSplit(world, color, -g_rank, &half, nullptr));
  if (color == NCCL_SPLIT_NOCOLOR) {
    CHECK(half == nullptr, "NOCOLOR gave a communicator");
  } else {
    int members = 0;
    for (int q = 0; q < n; ++q) members += (q % 2 == color && !(n >= 3 && q == n - 1));
    int count = 0, rank = -1;
    OK(ncclCommCount(half, &count));
    OK(ncclCommUserRank(half, &rank));
    CHECK(count == members, "split size %d want %d", count, members);
    int below = 0;  // members with a larger rank come first (key -rank)
    for (int q = g_rank + 1; q < n; ++q) below += (q % 2 == color && !(n >= 3 && q == n - 1));
    CHECK(rank == below, "split rank %d want %d", rank, below);
    sum_of_ranks(half);
  }
  // Finalize in opposite orders on even and odd ranks: no cross-rank barrier.
  ncclComm_t a = nullptr, b = nullptr;
  OK(ncclCommSplit(world, 0, g_rank, &a, nullptr));
  OK(ncclCommSplit(world, 0, g_rank, &b, nullptr));
  sum_of_ranks(a);
  sum_of_ranks(b);
  ncclComm_t first = g_rank % 2 ? b : a, second = g_rank % 2 ? a : b;
  OK(ncclCommFinalize(first));
  OK(ncclCommFinalize(second));
  CHECK(ncclCommFinalize(first) == ncclInvalidArgument, "second finalize accepted");
  OK(ncclCommDestroy(first));
  OK(ncclCommDestroy(second));
  CHECK(ncclCommDestroy(first) == ncclInvalidUsage, "destroyed twice");
  if (half != nullptr) OK(ncclCommDestroy(half));
}

// The last rank is excluded from a copy of world: its own call is refused, the
// others get a communicator of n - 1 ranks in their old order.
void check_shrink(ncclComm_t world) {
  if (g_nranks < 2) return;
  ncclComm_t copy = nullptr;
  OK(ncclCommSplit(world, 0, g_rank, &copy, nullptr));
  int excluded = g_nranks - 1;
  ncclComm_t shrunk = nullptr;
  ncclResult_t r = ncclCommShrink(copy, &excluded, 1, &shrunk, nullptr, NCCL_SHRINK_DEFAULT);
  if (g_rank == excluded) {
    CHECK(r == ncclInvalidUsage && strstr(ncclGetLastError(nullptr), "excludeRanks") != nullptr,
          "excluded rank's shrink gave %d: %s", r, ncclGetLastError(nullptr));
    // As after a failed init, the handle made for it is failed; destroying it is allowed.
    if (shrunk != nullptr) OK(ncclCommDestroy(shrunk));
  } else {
    OK(r);
    int count = 0, rank = -1;
    OK(ncclCommCount(shrunk, &count));
    OK(ncclCommUserRank(shrunk, &rank));
    CHECK(count == g_nranks - 1 && rank == g_rank, "shrunk to rank %d of %d", rank, count);
    sum_of_ranks(shrunk);
    OK(ncclCommDestroy(shrunk));
  }
  OK(ncclCommDestroy(copy));
}

// Several communicators from one thread, inited and used in groups.
void check_init_all() {
  ncclComm_t comms[2] = {nullptr, nullptr};
  int devs[2] = {0, 0};  // the same device twice: accepted
  OK(ncclCommInitAll(comms, 2, devs));
  float values[2] = {1.5f, 2.5f}, sums[2] = {0, 0};
  OK(ncclGroupStart());
  for (int i = 0; i < 2; ++i)
    OK(ncclAllReduce(&values[i], &sums[i], 1, ncclFloat32, ncclSum, comms[i], nullptr));
  OK(ncclGroupEnd());
  CHECK(sums[0] == 4.0f && sums[1] == 4.0f, "init-all sums %g %g", sums[0], sums[1]);
  int device = -1;
  OK(ncclCommCuDevice(comms[1], &device));
  CHECK(device == 0, "device %d", device);
  for (ncclComm_t c : comms) OK(ncclCommDestroy(c));
  // The scalable init with one id per "root": the first serves.
  ncclUniqueId ids[2];
  OK(ncclGetUniqueId(&ids[0]));
  OK(ncclGetUniqueId(&ids[1]));
  OK(ncclGroupStart());
  for (int i = 0; i < 2; ++i) OK(ncclCommInitRankScalable(&comms[i], 2, i, 2, ids, nullptr));
  OK(ncclGroupEnd());
  int32_t v[2] = {3, 4}, s[2] = {0, 0};
  OK(ncclGroupStart());
  for (int i = 0; i < 2; ++i)
    OK(ncclAllReduce(&v[i], &s[i], 1, ncclInt32, ncclSum, comms[i], nullptr));
  OK(ncclGroupEnd());
  CHECK(s[0] == 7 && s[1] == 7, "scalable sums %d %d", s[0], s[1]);
  for (ncclComm_t c : comms) OK(ncclCommDestroy(c));
}

// Rank 0 waits in a collective the others never join; another thread aborts
// (or revokes) the communicator, which must end the wait with an error.
void check_abort(ncclComm_t world, bool revoke) {
  if (g_nranks < 2) return;
  ncclComm_t victim = nullptr;
  OK(ncclCommSplit(world, 0, g_rank, &victim, nullptr));
  if (g_rank == 0) {
    std::atomic<bool> calling{false};
    std::thread ender([&] {
      while (!calling.load()) std::this_thread::yield();
      OK(revoke ? ncclCommRevoke(victim, NCCL_REVOKE_DEFAULT) : ncclCommAbort(victim));
    });
    int32_t value = 1, sum = 0;
    calling = true;
    ncclResult_t r = ncclAllReduce(&value, &sum, 1, ncclInt32, ncclSum, victim, nullptr);
    ender.join();
    CHECK(r != ncclSuccess, "a collective nobody joined succeeded");
    r = ncclAllReduce(&value, &sum, 1, ncclInt32, ncclSum, victim, nullptr);
    CHECK(r != ncclSuccess, "a call after %s succeeded", revoke ? "revoke" : "abort");
    if (revoke)
      OK(ncclCommDestroy(victim));
    else
      CHECK(ncclCommDestroy(victim) == ncclInvalidUsage, "destroy after abort accepted");
  }
  sum_of_ranks(world);  // the others wait here until rank 0 is done
  if (g_rank != 0) OK(ncclCommAbort(victim));
}

void check_memory_and_registration(ncclComm_t world) {
  void* buffer = nullptr;
  OK(ncclGroupStart());
  OK(ncclMemAlloc(&buffer, 1 << 16));  // immediate inside a group
  CHECK(buffer != nullptr, "MemAlloc gave NULL");
  if (buffer != nullptr) memset(buffer, 0, 1 << 16);
  OK(ncclGroupEnd());
  if (buffer == nullptr) return;
  void* handle = nullptr;
  OK(ncclCommRegister(world, buffer, 1 << 16, &handle));
  auto* values = static_cast<float*>(buffer);
  for (int i = 0; i < 4096; ++i) values[i] = static_cast<float>(g_rank + i % 3);
  OK(ncclAllReduce(values, values + 4096, 4096, ncclFloat32, ncclSum, world, nullptr));
  for (int i = 0; i < 4096; i += 1023)
    CHECK(values[4096 + i] == g_nranks * (i % 3) + g_nranks * (g_nranks - 1) / 2.0f,
          "registered sum [%d] = %g", i, values[4096 + i]);
  OK(ncclCommDeregister(world, handle));
  OK(ncclCommDeregister(world, nullptr));
  ncclWindow_t win = reinterpret_cast<ncclWindow_t>(&handle);
  OK(ncclCommWindowRegister(world, buffer, 1 << 16, &win, NCCL_WIN_DEFAULT));
  CHECK(win == reinterpret_cast<ncclWindow_t>(&handle), "unsupported window touched *win");
  OK(ncclCommWindowDeregister(world, nullptr));
  OK(ncclMemFree(buffer));
}

void check_simulate(ncclComm_t world) {
  std::vector<float> data(1 << 18, 1.0f), out(1 << 18, -7.0f);
  ncclSimInfo_t info = NCCL_SIM_INFO_INITIALIZER;
  OK(ncclGroupStart());
  OK(ncclAllReduce(data.data(), out.data(), data.size(), ncclFloat32, ncclSum, world, nullptr));
  OK(ncclGroupSimulateEnd(&info));
  CHECK(out[0] == -7.0f && out.back() == -7.0f, "a simulated group ran");
  if (g_nranks > 1)
    CHECK(info.estimatedTime > 0, "estimatedTime %g", info.estimatedTime);
  else
    CHECK(info.estimatedTime >= 0, "estimatedTime %g", info.estimatedTime);
  ncclSimInfo_t bad = NCCL_SIM_INFO_INITIALIZER;
  bad.magic = 0;
  OK(ncclGroupStart());
  CHECK(ncclGroupSimulateEnd(&bad) == ncclInvalidArgument, "bad simInfo accepted");
  OK(ncclGroupEnd());
}

void check_errors(ncclComm_t world) {
  CHECK(strcmp(ncclGetErrorString(ncclSuccess), "no error") == 0, "%s",
        ncclGetErrorString(ncclSuccess));
  CHECK(strcmp(ncclGetErrorString(ncclInProgress), "NCCL operation in progress") == 0, "%s",
        ncclGetErrorString(ncclInProgress));
  CHECK(strncmp(ncclGetErrorString(ncclRemoteError), "remote process exited", 21) == 0, "%s",
        ncclGetErrorString(ncclRemoteError));
  for (int r = ncclUnhandledCudaError; r <= ncclInvalidUsage; ++r)
    CHECK(strlen(ncclGetErrorString(static_cast<ncclResult_t>(r))) > 10, "result %d", r);
  int32_t x = 0;
  auto expect = [&](ncclResult_t got, ncclResult_t want, const char* word) {
    CHECK(got == want, "got %s want %s", ncclGetErrorString(got), ncclGetErrorString(want));
    CHECK(strstr(ncclGetLastError(NULL), word) != nullptr, "last error '%s' lacks '%s'",
          ncclGetLastError(NULL), word);
  };
  expect(ncclAllReduce(&x, &x, 1, static_cast<ncclDataType_t>(13), ncclSum, world, nullptr),
         ncclInvalidArgument, "datatype");
  expect(ncclAllReduce(&x, &x, 1, ncclInt32, ncclSum, nullptr, nullptr), ncclInvalidArgument,
         "comm is NULL");
  expect(ncclBroadcast(&x, &x, 1, ncclInt32, g_nranks, world, nullptr), ncclInvalidArgument,
         "root");
  expect(ncclSend(&x, 1, ncclInt32, -1, world, nullptr), ncclInvalidArgument, "peer");
  expect(ncclAllReduce(&x, nullptr, 1, ncclInt32, ncclSum, world, nullptr), ncclInvalidArgument,
         "recvbuff");
  expect(ncclAllReduce(&x, &x, 1, ncclInt32, static_cast<ncclRedOp_t>(42), world, nullptr),
         ncclInvalidArgument, "op");
  expect(ncclGroupEnd(), ncclInvalidUsage, "ncclGroupStart");
  expect(ncclCommShrink(world, &x, 1, nullptr, nullptr, NCCL_SHRINK_DEFAULT), ncclInvalidArgument,
         "newcomm");
  expect(ncclCommRevoke(world, 1), ncclInvalidArgument, "revokeFlags");
  ncclDevComm_t dev;
  expect(ncclDevCommCreate(world, nullptr, &dev), ncclInvalidUsage, "device API");
  ncclTeam_t team = ncclTeamWorld(world);
  CHECK(team.nRanks == 0, "device team has %d ranks", team.nRanks);
  // A failed call inside a group fails the group's end too, and the group is dropped.
  OK(ncclGroupStart());
  CHECK(ncclAllReduce(&x, &x, 1, ncclInt32, ncclSum, nullptr, nullptr) == ncclInvalidArgument,
        "NULL comm in a group");
  CHECK(ncclGroupEnd() != ncclSuccess, "group with a failed call succeeded");
  int version = 0;
  OK(ncclGetVersion(&version));
  CHECK(version == 22809, "version %d", version);
  CHECK(ncclGetVersion(nullptr) == ncclInvalidArgument, "NULL version accepted");
}

}  // namespace

int main() {
  g_rank = getenv("WEFT_RANK") ? atoi(getenv("WEFT_RANK")) : 0;
  g_nranks = getenv("WEFT_NRANKS") ? atoi(getenv("WEFT_NRANKS")) : 1;
  setvbuf(stdout, nullptr, _IOLBF, 0);

  // The library bound to ncclAllReduce must be the one expected (ours).
  if (const char* expect = getenv("NCCL_SHIM_EXPECT")) {
    Dl_info info{};
    CHECK(dladdr(reinterpret_cast<void*>(&ncclAllReduce), &info) != 0, "dladdr");
    char bound[PATH_MAX] = "", wanted[PATH_MAX] = "";
    CHECK(info.dli_fname && realpath(info.dli_fname, bound) && realpath(expect, wanted) &&
              strcmp(bound, wanted) == 0,
          "ncclAllReduce comes from %s, not %s", bound, expect);
  }

  ncclUniqueId id = exchange_id();
  ncclComm_t world = nullptr;
  OK(ncclGroupStart());  // as nccl-tests inits
  OK(ncclCommInitRank(&world, g_nranks, id, g_rank));
  OK(ncclGroupEnd());
  if (world == nullptr || g_failures) return 1;
  sum_of_ranks(world);
  if (g_rank == 0) {
    const char* secret = getenv("WEFT_SECRET");
    unlink((std::string("/tmp/weft-nccl-abi-") + (secret ? secret : "solo") + ".id").c_str());
  }

  const size_t counts[] = {0, 1, 7, 1029};
  for (int t = 0; t < ncclNumTypes; ++t) {
    auto type = static_cast<ncclDataType_t>(t);
    for (int op = 0; op <= ncclNumOps + 1; ++op)  // 5: PreMulSum host, 6: PreMulSum "device"
      for (Red kind : {Red::AllReduce, Red::Reduce, Red::ReduceScatter})
        for (size_t count : counts)
          for (bool in_place : {false, true})
            check_reduction(world, kind, type, op, count, in_place);
    for (Move kind :
         {Move::AllGather, Move::Broadcast, Move::AllToAll, Move::Gather, Move::Scatter})
      for (size_t count : counts)
        for (bool in_place : {false, true}) check_move(world, kind, type, count, in_place);
  }
  check_p2p(world);
  check_errors(world);
  check_memory_and_registration(world);
  check_simulate(world);
  check_config_and_nonblocking(world);
  check_split_finalize(world);
  check_shrink(world);
  check_init_all();
  check_abort(world, false);
  check_abort(world, true);
  sum_of_ranks(world);
  OK(ncclCommDestroy(world));
  if (g_failures == 0) printf("rank %d: nccl abi test passed\n", g_rank);
  return g_failures == 0 ? 0 : 1;
}
