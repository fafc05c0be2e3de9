// weft-perf: nccl-tests-style bandwidth benchmark for Weft. Every process is one rank;
// rank 0 gathers the times and error counts with point-to-point messages and prints.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "collectives.h"
#include "common/dtype.h"
#include "cuda_loader.h"
#include "element.h"
#include "options.h"
#include "pattern.h"
#include "report.h"
#include "weft/weft.h"

namespace weft::perf {
namespace {

// Exit statuses.
constexpr int kExitWrongResults = 1;
constexpr int kExitUsage = 2;
constexpr int kExitWeftError = 3;

constexpr size_t kBufferAlignment = 4096;
constexpr int kHostNameBytes = 64;

// The rank the launcher gave this process (weftrun, torchrun, mpirun, srun), known before
// there is a communicator to ask; nullptr without a launcher.
const char* launcher_rank() {
  for (const char* name :
       {"WEFT_RANK", "RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "SLURM_PROCID"}) {
    const char* value = std::getenv(name);
    if (value != nullptr && value[0] != '\0') return value;
  }
  return nullptr;
}

struct Rank {
  weftComm_t comm = nullptr;  // host memory: results gathered at rank 0, barriers
  int rank = 0;
  int nranks = 1;
};

// A GPU run (-G 1): the measured calls go to a GPU communicator on a CUDA stream, as in
// nccl-tests; buffers are device memory, prepared and checked through host copies.
struct Gpu {
  const tools::CudaDriver* driver = nullptr;
  int device = -1;
  weftComm_t comm = nullptr;
  void* cuda_stream = nullptr;
  weftStream_t stream = nullptr;
};

// Ends the process on a failed Weft call: the benchmark cannot go on without its peers.
void require(const Rank& self, weftResult_t result, const char* what) {
  if (result == weftSuccess) return;
  const std::string rank = self.comm != nullptr ? std::to_string(self.rank)
                           : launcher_rank()    ? launcher_rank()
                                                : "0";
  // The last error already starts with the failed function's name.
  const char* detail = weftGetLastError(self.comm);
  if (detail[0] != '\0')
    std::fprintf(stderr, "weft-perf: rank %s: %s (%s)\n", rank.c_str(), detail,
                 weftGetErrorString(result));
  else
    std::fprintf(stderr, "weft-perf: rank %s: %s failed: %s\n", rank.c_str(), what,
                 weftGetErrorString(result));
  if (self.comm != nullptr) weftCommAbort(self.comm);
  std::exit(kExitWeftError);
}

// Every rank's value, at rank 0 (the other ranks get an empty vector).
template <typename T>
std::vector<T> gather_at_rank0(const Rank& self, const T& value) {
  static_assert(std::is_trivially_copyable_v<T>);
  if (self.rank != 0) {
    require(self, weftSend(&value, sizeof(T), weftUint8, 0, self.comm, nullptr), "weftSend");
    return {};
  }
  std::vector<T> values(static_cast<size_t>(self.nranks));
  values[0] = value;
  for (int peer = 1; peer < self.nranks; ++peer)
    require(self, weftRecv(&values[peer], sizeof(T), weftUint8, peer, self.comm, nullptr),
            "weftRecv");
  return values;
}

// Rank 0's value, at every rank.
int broadcast_from_rank0(const Rank& self, int value) {
  if (self.rank == 0) {
    for (int peer = 1; peer < self.nranks; ++peer)
      require(self, weftSend(&value, sizeof(value), weftUint8, peer, self.comm, nullptr),
              "weftSend");
  } else {
    require(self, weftRecv(&value, sizeof(value), weftUint8, 0, self.comm, nullptr), "weftRecv");
  }
  return value;
}

// Frees a buffer: aligned host memory, or (-R 1) weftMemAlloc memory
// registered with `comm`.
struct BufferDeleter {
  weftComm_t comm = nullptr;
  void* handle = nullptr;
  const tools::CudaDriver* driver = nullptr;  // device memory
  void operator()(std::byte* pointer) const {
    if (driver != nullptr) {
      driver->mem_free(reinterpret_cast<unsigned long long>(pointer));
      return;
    }
    if (comm == nullptr) {
      std::free(pointer);
      return;
    }
    weftCommDeregister(comm, handle);
    weftMemFree(pointer);
  }
};
using Buffer = std::unique_ptr<std::byte, BufferDeleter>;

// `self` set: the memory comes from weftMemAlloc and is registered with its
// communicator, so that direct algorithms read it in place. `gpu` set: device memory.
Buffer allocate(size_t bytes, const Rank* self, const Gpu* gpu) {
  const size_t rounded =
      (std::max<size_t>(bytes, 1) + kBufferAlignment - 1) / kBufferAlignment * kBufferAlignment;
  Buffer buffer;
  if (gpu != nullptr) {
    unsigned long long pointer = 0;
    if (const int r = gpu->driver->mem_alloc(&pointer, rounded); r != 0) {
      std::fprintf(stderr, "weft-perf: cuMemAlloc of %zu bytes failed: %s\n", rounded,
                   gpu->driver->error(r));
      std::exit(kExitWeftError);
    }
    return Buffer(reinterpret_cast<std::byte*>(pointer),
                  BufferDeleter{nullptr, nullptr, gpu->driver});
  }
  if (self != nullptr) {
    void* pointer = nullptr;
    BufferDeleter deleter{self->comm, nullptr};
    require(*self, weftMemAlloc(&pointer, rounded), "weftMemAlloc");
    require(*self, weftCommRegister(self->comm, pointer, rounded, &deleter.handle),
            "weftCommRegister");
    buffer = Buffer(static_cast<std::byte*>(pointer), deleter);
  } else {
    auto* pointer = static_cast<std::byte*>(std::aligned_alloc(kBufferAlignment, rounded));
    if (pointer == nullptr) {
      std::fprintf(stderr, "weft-perf: cannot allocate %zu bytes\n", bytes);
      std::exit(kExitWeftError);
    }
    buffer = Buffer(pointer);
  }
  std::memset(buffer.get(), 0, rounded);  // touch every page before anything is timed
  return buffer;
}

// What one rank measured for one row.
struct RankResult {
  double seconds[2];  // per iteration: out of place, in place
  int64_t wrong[2];
};

class Benchmark {
 public:
  Benchmark(const Options& options, const Collective& collective, const Rank& self, const Gpu* gpu)
      : options_(options), collective_(collective), self_(self), gpu_(gpu) {
    const char* corrupt = std::getenv("WEFT_PERF_CORRUPT");
    corrupt_ = corrupt != nullptr && std::strcmp(corrupt, "1") == 0 && self.rank == 1;
  }

  // Runs every dtype, op and size; returns the total number of wrong elements.
  int64_t run() {
    for (weftDataType_t dtype : options_.dtypes) {
      allocate_buffers(dtype);
      if (collective_.reduces) {
        for (weftRedOp_t op : options_.ops) run_sweep(dtype, op);
      } else {
        run_sweep(dtype, std::nullopt);
      }
    }
    return wrong_total_;
  }

  double avg_busbw() const { return measurements_ == 0 ? 0 : busbw_sum_ / measurements_; }

 private:
  struct Placement {
    const void* send;
    void* recv;
  };

  // The pointers of one call: separate buffers, or nccl-tests' in-place offsets.
  Placement placement(bool in_place, const Geometry& g, size_t element_size) const {
    if (!in_place) return {send_.get(), recv_.get()};
    const size_t rank = static_cast<size_t>(self_.rank);
    return {recv_.get() + g.send_inplace_offset * rank * element_size,
            recv_.get() + g.recv_inplace_offset * rank * element_size};
  }

  Geometry geometry(size_t bytes, size_t element_size) const {
    return collective_.geometry(bytes / element_size, element_size, self_.nranks);
  }

  CallArgs call_args(const Placement& p, const Geometry& g, weftDataType_t dtype,
                     std::optional<weftRedOp_t> op) const {
    return {p.send,
            p.recv,
            g.param_count,
            dtype,
            op.value_or(weftSum),
            options_.root,
            self_.rank,
            self_.nranks,
            gpu_ != nullptr ? gpu_->comm : self_.comm,
            gpu_ != nullptr ? gpu_->stream : nullptr};
  }

  void call(const CallArgs& args) { require(self_, collective_.call(args), collective_.name); }

  // Waits until the calls made so far completed (on a GPU: their stream).
  void complete() {
    if (gpu_ == nullptr) return;
    if (const int r = gpu_->driver->stream_synchronize(gpu_->cuda_stream); r != 0) {
      std::fprintf(stderr, "weft-perf: rank %d: cuStreamSynchronize failed: %s\n", self_.rank,
                   gpu_->driver->error(r));
      std::exit(kExitWeftError);
    }
    weftResult_t failed = weftSuccess;
    require(self_, weftCommGetAsyncError(gpu_->comm, &failed), "weftCommGetAsyncError");
    require(self_, failed, collective_.name);
  }

  // Host bytes to or from device memory (a GPU run).
  void copy(void* to, const void* from, size_t bytes) {
    if (const int r = gpu_->driver->memcpy(reinterpret_cast<unsigned long long>(to),
                                           reinterpret_cast<unsigned long long>(from), bytes);
        r != 0) {
      std::fprintf(stderr, "weft-perf: rank %d: cuMemcpy failed: %s\n", self_.rank,
                   gpu_->driver->error(r));
      std::exit(kExitWeftError);
    }
  }

  // Elements of the receive buffer a row uses, in and out of place (in place, the send
  // range lies in the receive buffer too).
  size_t recv_extent(const Geometry& g) const {
    const size_t rank = static_cast<size_t>(self_.rank);
    return std::max({g.recv_count, g.send_count + g.send_inplace_offset * rank,
                     g.recv_count + g.recv_inplace_offset * rank});
  }

  // Sizes both buffers for the largest row.
  void allocate_buffers(weftDataType_t dtype) {
    const size_t element_size = dtype_size(dtype);
    const Geometry g = geometry(options_.max_bytes, element_size);
    const Rank* registered = options_.register_buffers ? &self_ : nullptr;
    send_.reset();  // the previous dtype's buffers go first
    recv_.reset();
    send_ = allocate(g.send_count * element_size, registered, gpu_);
    recv_ = allocate(recv_extent(g) * element_size, registered, gpu_);
    if (gpu_ != nullptr) {
      host_send_.assign(g.send_count * element_size, std::byte{0});
      host_recv_.assign(recv_extent(g) * element_size, std::byte{0});
    }
  }

  void run_sweep(weftDataType_t dtype, std::optional<weftRedOp_t> op) {
    const size_t element_size = dtype_size(dtype);
    const InputPattern pattern(dtype, op, self_.nranks);
    require(self_, weftBarrier(self_.comm, nullptr), "weftBarrier");
    for (size_t bytes : {options_.max_bytes, options_.min_bytes}) {
      const Geometry g = geometry(bytes, element_size);
      for (int i = 0; i < options_.warmup_iters; ++i)
        call(call_args(placement(false, g, element_size), g, dtype, op));
      complete();
    }
    for (size_t bytes : benchmark_sizes(options_)) {
      const Geometry g = geometry(bytes, element_size);
      RankResult mine{};
      for (int in_place = 0; in_place < 2; ++in_place) {
        const Placement p = placement(in_place == 1, g, element_size);
        const CallArgs args = call_args(p, g, dtype, op);
        // The first call at a new size pays one-time costs (the tuner's
        // decision for its size bucket, building the schedule): untimed.
        call(args);
        complete();
        mine.seconds[in_place] = time_calls(args);
        if (in_place == 0 && self_.rank == 0 && collective_.tuned) record_algorithm();
        mine.wrong[in_place] = checked(in_place == 1) ? check(args, g, pattern, in_place == 1) : 0;
      }
      std::vector<RankResult> all = gather_at_rank0(self_, mine);
      if (self_.rank == 0) report(all, g, dtype, op);
    }
  }

  // The tuner's choice for the calls just timed, and its predicted time
  // (the model runs here, outside the timed loop).
  void record_algorithm() {
    const char* name = nullptr;
    if (weftCommLastAlgorithm(gpu_ != nullptr ? gpu_->comm : self_.comm, &name, &predicted_us_) !=
        weftSuccess) {
      algorithm_.clear();
      predicted_us_ = -1;
      return;
    }
    algorithm_ = name;
  }

  bool checked(bool in_place) const {
    return options_.check && (!in_place || collective_.check_in_place);
  }

  // Seconds per call, wall clock over options_.iters calls started together.
  double time_calls(const CallArgs& args) {
    require(self_, weftBarrier(self_.comm, nullptr), "weftBarrier");
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < options_.iters; ++i) call(args);
    complete();
    const std::chrono::duration<double> elapsed = std::chrono::steady_clock::now() - start;
    return elapsed.count() / options_.iters;
  }

  // Runs the call once on known inputs and counts this rank's wrong output elements.
  int64_t check(const CallArgs& args, const Geometry& g, const InputPattern& pattern,
                bool in_place) {
    const weftDataType_t dtype = args.dtype;
    const size_t element_size = dtype_size(dtype);
    // On a GPU the buffers are prepared and read in their host copies, at the same offsets.
    std::byte* recv_base = gpu_ != nullptr ? host_recv_.data() : recv_.get();
    std::byte* send_base = gpu_ != nullptr ? host_send_.data() : send_.get();
    auto in_host = [&](const void* p) -> std::byte* {
      const auto* at = static_cast<const std::byte*>(p);
      return at >= recv_.get() && at < recv_.get() + recv_extent(g) * element_size
                 ? recv_base + (at - recv_.get())
                 : send_base + (at - send_.get());
    };
    // Poison first: in place, the input below overwrites part of it. 0xff bytes are NaN or
    // out of the inputs' range in every type, so an element left unwritten counts as wrong.
    std::memset(recv_base, 0xff, recv_extent(g) * element_size);
    void* input = in_host(in_place ? args.send : send_.get());
    for (size_t i = 0; i < g.send_count; ++i)
      store_element(dtype, input, i, pattern.input(self_.rank, i));
    if (gpu_ != nullptr) {
      copy(recv_.get(), recv_base, recv_extent(g) * element_size);
      copy(send_.get(), send_base, g.send_count * element_size);
    }
    call(args);
    complete();
    if (gpu_ != nullptr) copy(recv_base, recv_.get(), recv_extent(g) * element_size);
    void* output = in_host(args.recv);
    // Test hook (WEFT_PERF_CORRUPT=1): rank 1 damages one received element, to prove that
    // the checker notices. Bit 6 of the most significant byte: far beyond any tolerance.
    if (corrupt_ && g.recv_count > 0)
      static_cast<unsigned char*>(output)[(g.recv_count / 2 + 1) * element_size - 1] ^= 0x40;
    int64_t wrong = 0;
    for (size_t j = 0; j < g.recv_count; ++j) {
      const Source source = collective_.source(g, self_.rank, self_.nranks, options_.root, j);
      if (source.kind == Source::Kind::kUnchecked) continue;
      const double expected = source.kind == Source::Kind::kCopy
                                  ? pattern.input(source.rank, source.index)
                                  : pattern.reduced(source.index);
      const double got = load_element(dtype, output, j);
      // Written so that a NaN result counts as wrong.
      if (!(std::fabs(got - expected) <= pattern.tolerance(expected))) ++wrong;
    }
    return wrong;
  }

  double combined_seconds(const std::vector<RankResult>& all, int placement) const {
    double result = all[0].seconds[placement];
    for (const RankResult& r : all) {
      const double s = r.seconds[placement];
      switch (options_.average) {
        case AverageMode::kRank0:
          break;
        case AverageMode::kMean:
          if (&r != &all[0]) result += s;
          break;
        case AverageMode::kMin:
          result = std::min(result, s);
          break;
        case AverageMode::kMax:
          result = std::max(result, s);
          break;
      }
    }
    return options_.average == AverageMode::kMean ? result / all.size() : result;
  }

  void report(const std::vector<RankResult>& all, const Geometry& g, weftDataType_t dtype,
              std::optional<weftRedOp_t> op) {
    Row row;
    row.bytes = row_bytes(g, dtype_size(dtype));
    row.count = g.param_count;
    row.type = dtype_name(dtype);
    row.redop = op ? op_name(*op) : "none";
    row.root = collective_.rooted ? options_.root : -1;
    row.algorithm = algorithm_;
    row.predicted_us = predicted_us_;
    for (int p = 0; p < 2; ++p) {
      Measurement& m = p == 0 ? row.out_of_place : row.in_place;
      const double seconds = combined_seconds(all, p);
      m.time_us = seconds * 1e6;
      m.algbw = seconds > 0 ? static_cast<double>(row.bytes) / 1e9 / seconds : 0;
      m.busbw = m.algbw * collective_.bus_factor(self_.nranks);
      if (checked(p == 1)) {
        int64_t wrong = 0;
        for (const RankResult& r : all) wrong += r.wrong[p];
        m.wrong = wrong;
        wrong_total_ += wrong;
      }
      busbw_sum_ += m.busbw;
      ++measurements_;
    }
    const std::string text =
        options_.json ? format_json_row(row, collective_.name, self_.nranks) : format_row(row);
    std::fputs(text.c_str(), stdout);
    std::fflush(stdout);
  }

  const Options& options_;
  const Collective& collective_;
  const Rank& self_;
  const Gpu* gpu_;
  bool corrupt_ = false;
  Buffer send_;
  Buffer recv_;
  std::vector<std::byte> host_send_, host_recv_;  // a GPU run's host copies
  std::string algorithm_;                         // rank 0: of the row being measured
  double predicted_us_ = -1;
  int64_t wrong_total_ = 0;
  double busbw_sum_ = 0;
  int measurements_ = 0;
};

std::string collective_names() {
  std::string names;
  for (const Collective& c : collectives()) names += std::string(names.empty() ? "" : " ") + c.name;
  return names;
}

struct RankIdentity {
  int pid;
  int device;
  char host[kHostNameBytes];
};

std::vector<RankLine> gather_rank_lines(const Rank& self, int device) {
  RankIdentity mine{};
  mine.pid = static_cast<int>(getpid());
  mine.device = device;
  gethostname(mine.host, sizeof(mine.host) - 1);
  std::vector<RankLine> lines;
  for (const RankIdentity& r : gather_at_rank0(self, mine))
    lines.push_back({static_cast<int>(lines.size()), r.pid, r.host, r.device});
  return lines;
}

// This rank's GPU, if the run uses one: -G 1 requires it, the default takes it when there is
// a driver and a device. Ranks of a node share its GPUs round robin by local rank.
std::optional<Gpu> find_gpu(const Options& options, bool report) {
  if (options.gpu == 0) return std::nullopt;
  const char* local = std::getenv("WEFT_LOCAL_RANK");
  const int local_rank = local != nullptr ? std::atoi(local) : 0;
  std::string why;
  const tools::CudaDriver* driver = tools::use_gpu(0, &why);
  int devices = 0;
  if (driver != nullptr && driver->device_get_count(&devices) == 0 && devices > 0)
    driver = tools::use_gpu(local_rank % devices, &why);
  if (driver == nullptr) {
    if (options.gpu == 1) {
      if (report) std::fprintf(stderr, "weft-perf: -G 1 needs a GPU: %s\n", why.c_str());
      std::exit(report ? kExitUsage : 0);
    }
    return std::nullopt;
  }
  Gpu gpu;
  gpu.driver = driver;
  gpu.device = local_rank % devices;
  return gpu;
}

// Device-to-device copy bandwidth on this rank's GPU, counting bytes read plus written (the
// ceiling the collectives' traffic is measured against): the median of repeated copies of
// `bytes` (at least 256 MiB, so that the cache plays no part).
double copy_ceiling_gbps(const Gpu& gpu, size_t bytes) {
  bytes = std::max<size_t>(bytes, size_t{256} << 20);
  const tools::CudaDriver& d = *gpu.driver;
  unsigned long long from = 0, to = 0;
  if (d.mem_alloc(&from, bytes) != 0 || d.mem_alloc(&to, bytes) != 0) return -1;
  std::vector<double> seconds;
  for (int i = 0; i < 13; ++i) {
    const auto start = std::chrono::steady_clock::now();
    d.memcpy_async(to, from, bytes, gpu.cuda_stream);
    d.stream_synchronize(gpu.cuda_stream);
    const std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
    if (i >= 3) seconds.push_back(took.count());  // the first ones warm up
  }
  d.mem_free(from);
  d.mem_free(to);
  std::sort(seconds.begin(), seconds.end());
  return 2.0 * static_cast<double>(bytes) / seconds[seconds.size() / 2] / 1e9;
}

int run(int argc, char** argv) {
  Options options;
  const char* rank = launcher_rank();
  // Every rank sees the same flags: rank 0 alone reports bad ones and fails, so the
  // message comes once and no launcher ends rank 0 before it has printed it.
  const bool first = rank == nullptr || std::strcmp(rank, "0") == 0;
  if (std::optional<std::string> error = parse_options(argc, argv, &options)) {
    if (!first) return 0;
    std::fprintf(stderr, "weft-perf: %s\n%s", error->c_str(), kUsage);
    return kExitUsage;
  }
  if (options.help) {
    std::printf("%scollectives: %s\n", kUsage, collective_names().c_str());
    return 0;
  }
  const Collective* collective = find_collective(options.collective);
  if (collective == nullptr) {
    if (!first) return 0;
    std::fprintf(stderr, "weft-perf: unknown collective '%s' (available: %s)\n",
                 options.collective.c_str(), collective_names().c_str());
    return kExitUsage;
  }
  // The library reads WEFT_ALGO when the communicator is created.
  const std::string forced = forced_algorithm(options);
  if (!forced.empty()) setenv("WEFT_ALGO", forced.c_str(), 1);

  // Without a launcher this process is the only rank, as in nccl-tests.
  if (rank == nullptr) {
    setenv("WEFT_RANK", "0", 1);
    setenv("WEFT_NRANKS", "1", 1);
  }
  // Before the communicator: -G 1 without a GPU is a usage error of every rank, not a death.
  std::optional<Gpu> found = find_gpu(options, first);
  Rank self;
  weftConfig_t config = WEFT_CONFIG_INITIALIZER;
  if (options.timeout_s > 0) config.timeoutMs = options.timeout_s * 1000;
  require(self, weftCommInitFromEnv(&self.comm, &config), "weftCommInitFromEnv");
  require(self, weftCommUserRank(self.comm, &self.rank), "weftCommUserRank");
  require(self, weftCommCount(self.comm, &self.nranks), "weftCommCount");
  if (collective->rooted && options.root >= self.nranks) {
    std::fprintf(stderr, "weft-perf: root %d is not a rank of %d\n", options.root, self.nranks);
    weftCommDestroy(self.comm);
    return kExitUsage;
  }
  // The GPU: every rank must agree (one without a GPU makes the run a host one).
  int all_gpu = found ? 1 : 0;
  require(self, weftAllReduce(&all_gpu, &all_gpu, 1, weftInt32, weftMin, self.comm, nullptr),
          "weftAllReduce");
  if (all_gpu == 0 && options.gpu == 1) {
    if (self.rank == 0) std::fprintf(stderr, "weft-perf: -G 1: a rank has no GPU\n");
    weftCommDestroy(self.comm);
    return kExitUsage;
  }
  Gpu* gpu = all_gpu == 1 ? &*found : nullptr;
  if (gpu != nullptr) {
    weftConfig_t gpu_config = config;
    gpu_config.cudaDevice = gpu->device;
    require(self, weftCommSplit(self.comm, 0, self.rank, &gpu->comm, &gpu_config), "weftCommSplit");
    if (const int r = gpu->driver->stream_create(&gpu->cuda_stream, 1); r != 0) {
      std::fprintf(stderr, "weft-perf: cuStreamCreate failed: %s\n", gpu->driver->error(r));
      return kExitWeftError;
    }
    require(self, weftStreamCreateFromCuda(gpu->cuda_stream, &gpu->stream),
            "weftStreamCreateFromCuda");
  }
  int version = 0;
  require(self, weftGetVersion(&version), "weftGetVersion");
  std::vector<RankLine> rank_lines = gather_rank_lines(self, gpu != nullptr ? gpu->device : -1);
  if (self.rank == 0 && !options.json) {
    char note[256] = "";
    if (gpu != nullptr)
      std::snprintf(
          note, sizeof note,
          "# Device memory (-G 1)%s; device-to-device copy ceiling on GPU %d: %.1f GB/s "
          "(bytes read + written)\n#\n",
          gpu->driver->emulated ? " on the host EMULATION of the CUDA driver, not a GPU" : "",
          gpu->device, copy_ceiling_gbps(*gpu, options.max_bytes));
    std::fputs(format_header(options, self.nranks, version, rank_lines, note).c_str(), stdout);
  }
  require(self, weftBarrier(self.comm, nullptr), "weftBarrier");

  int64_t wrong = 0;
  double avg_busbw = 0;
  {  // registered buffers are released before the communicator goes
    Benchmark benchmark(options, *collective, self, gpu);
    wrong = benchmark.run();
    avg_busbw = benchmark.avg_busbw();
  }
  if (self.rank == 0 && !options.json) std::fputs(format_footer(wrong, avg_busbw).c_str(), stdout);
  std::fflush(stdout);
  // Every rank ends with rank 0's verdict, so any launcher sees the failure.
  const int status = broadcast_from_rank0(self, wrong == 0 ? 0 : kExitWrongResults);
  if (gpu != nullptr) {
    require(self, weftStreamDestroy(gpu->stream), "weftStreamDestroy");
    require(self, weftCommDestroy(gpu->comm), "weftCommDestroy");
    gpu->driver->stream_destroy(gpu->cuda_stream);
  }
  require(self, weftCommDestroy(self.comm), "weftCommDestroy");
  return status;
}

}  // namespace
}  // namespace weft::perf

int main(int argc, char** argv) {
  return weft::perf::run(argc, argv);
}
