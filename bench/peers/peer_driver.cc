#include "peer_driver.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <optional>
#include <vector>

#include "pattern.h"
#include "report.h"

namespace weft::peers {
namespace {

constexpr int kExitWrongResults = 1;
constexpr int kExitUsage = 2;
constexpr int kExitLibraryError = 3;

constexpr size_t kAlignment = 4096;
constexpr int kHostNameBytes = 64;

using perf::Geometry;
using perf::Source;

// Ping-pong: rank 0 sends, rank 1 receives and sends the same buffer back, so both end
// with rank 0's input; the other ranks take no part.
Source echo_source(const Geometry&, int rank, int, int, size_t j) {
  return rank <= 1 ? Source{Source::Kind::kCopy, 0, j} : Source{};
}

// A benchmarked collective: weft-perf's entry (`layout`) gives its geometry, bus factor
// and expected results.
struct PeerCollective {
  const char* name;
  const char* layout;
  // Ping-pong instead of the layout's exchange: expected values from echo_source, checked
  // in place too (the echo is well defined there), and rank 0's time halved (one way, as
  // latency benchmarks report it).
  bool ping_pong = false;
};

const PeerCollective kCollectives[] = {
    {"allreduce", "allreduce"},
    {"reducescatter", "reducescatter"},
    {"allgather", "allgather"},
    {"broadcast", "broadcast"},
    {"reduce", "reduce"},
    {"alltoall", "alltoall"},
    // Equal counts: the same exchange as alltoall through the vector interface.
    {"alltoallv", "alltoall"},
    {"gather", "gather"},
    {"scatter", "scatter"},
    {"sendrecv", "sendrecv"},
    {"pingpong", "sendrecv", true},
};

const PeerCollective* find_peer_collective(std::string_view name) {
  for (const PeerCollective& c : kCollectives)
    if (name == c.name) return &c;
  return nullptr;
}

std::string collective_names() {
  std::string names;
  for (const PeerCollective& c : kCollectives)
    names += std::string(names.empty() ? "" : " ") + c.name;
  return names;
}

struct FreeDeleter {
  void operator()(float* pointer) const { std::free(pointer); }
};
using Buffer = std::unique_ptr<float, FreeDeleter>;

Buffer allocate(size_t elements) {
  const size_t bytes = std::max<size_t>(elements, 1) * sizeof(float);
  const size_t rounded = (bytes + kAlignment - 1) / kAlignment * kAlignment;
  auto* pointer = static_cast<float*>(std::aligned_alloc(kAlignment, rounded));
  if (pointer == nullptr) throw std::bad_alloc();
  std::memset(pointer, 0, rounded);  // touch every page before anything is timed
  return Buffer(pointer);
}

// One placement's figures on one rank (plain data: it travels as bytes).
struct Timing {
  double mean_s = 0;
  double median_s = 0;
  double p99_s = 0;
  int64_t wrong = 0;
};
struct RankResult {
  Timing placement[2];  // out of place, in place
};

struct RankIdentity {
  int pid;
  char host[kHostNameBytes];
};

// A row's figures per placement, combined over the ranks.
struct Combined {
  perf::Measurement measurement;
  double median_us = 0;
  double p99_us = 0;
};

std::string json_number(double value) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.6g", value);
  return text;
}

std::string json_placement(const Combined& c) {
  const perf::Measurement& m = c.measurement;
  return "{\"time_us\":" + json_number(m.time_us) + ",\"algbw_gbps\":" + json_number(m.algbw) +
         ",\"busbw_gbps\":" + json_number(m.busbw) +
         ",\"wrong\":" + (m.wrong ? std::to_string(*m.wrong) : "null") +
         ",\"median_us\":" + json_number(c.median_us) + ",\"p99_us\":" + json_number(c.p99_us) +
         "}";
}

// The in-place cells of a table row whose in-place call was not run, and what
// perf::format_row prints for an all-zero unchecked placement (same widths).
const std::string kNotRunCells = "      N/A     N/A     N/A     N/A\n";

std::string latency_line(size_t bytes, const Combined (&c)[2], bool in_place) {
  char text[160];
  if (in_place) {
    std::snprintf(text, sizeof(text), "#  %12zu  %10.2f  %10.2f  %10.2f  %10.2f\n", bytes,
                  c[0].median_us, c[0].p99_us, c[1].median_us, c[1].p99_us);
  } else {
    std::snprintf(text, sizeof(text), "#  %12zu  %10.2f  %10.2f  %10s  %10s\n", bytes,
                  c[0].median_us, c[0].p99_us, "N/A", "N/A");
  }
  return text;
}

class Driver {
 public:
  Driver(const perf::Options& options, const PeerCollective& peer, Backend& backend)
      : options_(options),
        peer_(peer),
        layout_(*perf::find_collective(peer.layout)),
        backend_(backend),
        rank_(backend.rank()),
        nranks_(backend.nranks()),
        pattern_(weftFloat32, layout_.reduces ? std::optional(weftSum) : std::nullopt, nranks_) {
    placements_ = backend.has_in_place(peer.name) ? 2 : 1;
    const char* corrupt = std::getenv("WEFT_PERF_CORRUPT");
    corrupt_ = corrupt != nullptr && std::strcmp(corrupt, "1") == 0 && rank_ == 1;
  }

  // Runs the sweep; returns the wrong elements over every row and rank.
  int64_t run() {
    allocate_buffers();
    backend_.barrier();
    for (size_t bytes : {options_.max_bytes, options_.min_bytes}) {
      const PeerCall c = place(geometry(bytes, false), false);
      backend_.prepare(c);
      for (int i = 0; i < options_.warmup_iters; ++i) backend_.call(c);
    }
    for (size_t bytes : perf::benchmark_sizes(options_)) {
      RankResult mine;
      for (int in_place = 0; in_place < placements_; ++in_place) {
        const Geometry g = geometry(bytes, in_place == 1);
        const PeerCall c = place(g, in_place == 1);
        backend_.prepare(c);
        mine.placement[in_place] = time_calls(c);
        if (checked(in_place == 1)) mine.placement[in_place].wrong = check(c, g);
      }
      std::vector<RankResult> all(static_cast<size_t>(nranks_));
      backend_.allgather_bytes(&mine, all.data(), sizeof(mine));
      report(all, geometry(bytes, false));
    }
    return wrong_total_;
  }

  double avg_busbw() const { return measurements_ == 0 ? 0 : busbw_sum_ / measurements_; }
  const std::string& latency_lines() const { return latency_lines_; }

 private:
  Geometry geometry(size_t bytes, bool in_place) const {
    Geometry g = layout_.geometry(bytes / sizeof(float), sizeof(float), nranks_);
    if (in_place) backend_.adjust_in_place(peer_.name, &g);
    return g;
  }

  // Elements of the receive buffer a row touches (in place, the input lies in it too).
  size_t recv_extent(const Geometry& g) const {
    const size_t rank = static_cast<size_t>(rank_);
    return std::max({g.recv_count, g.send_count + g.send_inplace_offset * rank,
                     g.recv_count + g.recv_inplace_offset * rank});
  }

  void allocate_buffers() {
    const Geometry out = geometry(options_.max_bytes, false);
    const Geometry in = geometry(options_.max_bytes, true);
    send_ = allocate(out.send_count);
    recv_ = allocate(std::max(recv_extent(out), recv_extent(in)));
  }

  PeerCall place(const Geometry& g, bool in_place) const {
    const size_t rank = static_cast<size_t>(rank_);
    PeerCall c{peer_.name, send_.get(),   recv_.get(), g.param_count,
               in_place,   options_.root, rank_,       nranks_};
    if (in_place) {
      c.send = recv_.get() + g.send_inplace_offset * rank;
      c.recv = recv_.get() + g.recv_inplace_offset * rank;
    }
    return c;
  }

  bool checked(bool in_place) const {
    return options_.check && (!in_place || layout_.check_in_place || peer_.ping_pong);
  }

  // Back-to-back calls after a barrier, as weft-perf times them, with a timestamp after
  // each call: the mean is the wall clock over all of them, the quantiles per call.
  Timing time_calls(const PeerCall& c) {
    using Clock = std::chrono::steady_clock;
    std::vector<Clock::time_point> stamps(static_cast<size_t>(options_.iters) + 1);
    backend_.barrier();
    stamps[0] = Clock::now();
    for (int i = 0; i < options_.iters; ++i) {
      backend_.call(c);
      stamps[i + 1] = Clock::now();
    }
    std::vector<double> per_call(static_cast<size_t>(options_.iters));
    for (size_t i = 0; i < per_call.size(); ++i)
      per_call[i] = std::chrono::duration<double>(stamps[i + 1] - stamps[i]).count();
    const double scale = peer_.ping_pong ? 0.5 : 1.0;
    Timing t;
    t.mean_s =
        scale * std::chrono::duration<double>(stamps.back() - stamps[0]).count() / options_.iters;
    t.median_s = scale * quantile(per_call, 0.5);
    t.p99_s = scale * quantile(per_call, 0.99);
    return t;
  }

  // One more call on known inputs; counts this rank's wrong output elements.
  int64_t check(const PeerCall& c, const Geometry& g) {
    // Poison first (in place the input below overwrites part of it): 0xff bytes are a
    // NaN, so an element left unwritten counts as wrong.
    std::memset(recv_.get(), 0xff, recv_extent(g) * sizeof(float));
    float* input = c.in_place ? const_cast<float*>(c.send) : send_.get();
    for (size_t i = 0; i < g.send_count; ++i)
      input[i] = static_cast<float>(pattern_.input(rank_, i));
    backend_.call(c);
    // Test hook (WEFT_PERF_CORRUPT=1, as in weft-perf): rank 1 damages one element.
    if (corrupt_ && g.recv_count > 0) c.recv[g.recv_count / 2] += 1024.0f;
    int64_t wrong = 0;
    for (size_t j = 0; j < g.recv_count; ++j) {
      const Source s = peer_.ping_pong ? echo_source(g, rank_, nranks_, options_.root, j)
                                       : layout_.source(g, rank_, nranks_, options_.root, j);
      if (s.kind == Source::Kind::kUnchecked) continue;
      const double expected = s.kind == Source::Kind::kCopy ? pattern_.input(s.rank, s.index)
                                                            : pattern_.reduced(s.index);
      // Written so that a NaN counts as wrong; the inputs make every result exact.
      if (!(static_cast<double>(c.recv[j]) == expected)) ++wrong;
    }
    return wrong;
  }

  // -a over the ranks; the one-way ping-pong time is rank 0's.
  double combine(const std::vector<RankResult>& all, int placement, double Timing::*field) const {
    const perf::AverageMode mode = peer_.ping_pong ? perf::AverageMode::kRank0 : options_.average;
    double result = all[0].placement[placement].*field;
    for (size_t r = 1; r < all.size(); ++r) {
      const double v = all[r].placement[placement].*field;
      if (mode == perf::AverageMode::kMean) result += v;
      if (mode == perf::AverageMode::kMin) result = std::min(result, v);
      if (mode == perf::AverageMode::kMax) result = std::max(result, v);
    }
    return mode == perf::AverageMode::kMean ? result / static_cast<double>(all.size()) : result;
  }

  void report(const std::vector<RankResult>& all, const Geometry& g) {
    perf::Row row;
    row.bytes = perf::row_bytes(g, sizeof(float));
    row.count = g.param_count;
    row.type = "float";
    row.redop = layout_.reduces ? "sum" : "none";
    row.root = layout_.rooted ? options_.root : -1;
    Combined combined[2];
    for (int p = 0; p < placements_; ++p) {
      Combined& c = combined[p];
      perf::Measurement& m = c.measurement;
      const double seconds = combine(all, p, &Timing::mean_s);
      m.time_us = seconds * 1e6;
      m.algbw = seconds > 0 ? static_cast<double>(row.bytes) / 1e9 / seconds : 0;
      m.busbw = m.algbw * layout_.bus_factor(nranks_);
      c.median_us = combine(all, p, &Timing::median_s) * 1e6;
      c.p99_us = combine(all, p, &Timing::p99_s) * 1e6;
      if (checked(p == 1)) {
        int64_t wrong = 0;
        for (const RankResult& r : all) wrong += r.placement[p].wrong;
        m.wrong = wrong;
        wrong_total_ += wrong;
      }
      busbw_sum_ += m.busbw;
      (p == 0 ? row.out_of_place : row.in_place) = m;
    }
    measurements_ += placements_;
    if (rank_ != 0) return;
    const bool in_place = placements_ == 2;
    latency_lines_ += latency_line(row.bytes, combined, in_place);
    std::string text;
    if (options_.json) {
      text = "{\"library\":\"" + backend_.name() + "\",\"collective\":\"" + peer_.name +
             "\",\"nranks\":" + std::to_string(nranks_) +
             ",\"size_bytes\":" + std::to_string(row.bytes) +
             ",\"count\":" + std::to_string(row.count) + ",\"type\":\"float\",\"redop\":\"" +
             row.redop + "\",\"root\":" + std::to_string(row.root) +
             ",\"out_of_place\":" + json_placement(combined[0]) +
             ",\"in_place\":" + (in_place ? json_placement(combined[1]) : "null") + "}\n";
    } else {
      text = perf::format_row(row);
      // A placement not run: its cells (all-zero, fixed width) become N/A.
      if (!in_place) text = text.substr(0, text.size() - kNotRunCells.size()) + kNotRunCells;
    }
    std::fputs(text.c_str(), stdout);
    std::fflush(stdout);
  }

  const perf::Options& options_;
  const PeerCollective& peer_;
  const perf::Collective& layout_;
  Backend& backend_;
  const int rank_;
  const int nranks_;
  const perf::InputPattern pattern_;
  int placements_;  // 1 where the library has no in-place form
  bool corrupt_ = false;
  Buffer send_;
  Buffer recv_;
  int64_t wrong_total_ = 0;
  double busbw_sum_ = 0;
  int measurements_ = 0;
  std::string latency_lines_;
};

std::vector<perf::RankLine> rank_lines(Backend& backend) {
  RankIdentity mine{};
  mine.pid = static_cast<int>(getpid());
  gethostname(mine.host, sizeof(mine.host) - 1);
  std::vector<RankIdentity> all(static_cast<size_t>(backend.nranks()));
  backend.allgather_bytes(&mine, all.data(), sizeof(mine));
  std::vector<perf::RankLine> lines;
  for (const RankIdentity& r : all)
    lines.push_back({static_cast<int>(lines.size()), r.pid, r.host});
  return lines;
}

// weft-perf's header with the library's name in place of weft-perf's version line.
std::string header(const char* program, Backend& backend, const perf::Options& options) {
  std::string text = perf::format_header(options, backend.nranks(), 0, rank_lines(backend));
  text.erase(0, text.find('\n') + 1);
  return std::string("# ") + program + ": " + backend.version() + "\n" + text;
}

// Only float sums: the peers are compared on what the targets name.
std::optional<std::string> check_options(const perf::Options& options, const PeerCollective* peer) {
  if (peer == nullptr)
    return "unknown collective '" + options.collective + "' (available: " + collective_names() +
           ")";
  if (options.dtypes.size() != 1 || options.dtypes[0] != weftFloat32)
    return std::string("only -d float is supported");
  if (options.ops.size() != 1 || options.ops[0] != weftSum)
    return std::string("only -o sum is supported");
  return std::nullopt;
}

int run(int argc, char** argv, const char* program, BackendFactory make) {
  perf::Options options;
  std::optional<std::string> error = perf::parse_options(argc, argv, &options);
  if (!error && options.help) {
    std::printf(
        "usage: %s <collective> [flags]   collectives: %s\nflags as weft-perf's "
        "(float sums only):\n%s",
        program, collective_names().c_str(), perf::kUsage);
    return 0;
  }
  const PeerCollective* peer = find_peer_collective(options.collective);
  if (!error) error = check_options(options, peer);
  if (error) {
    std::fprintf(stderr, "%s: %s (try --help)\n", program, error->c_str());
    return kExitUsage;
  }
  std::unique_ptr<Backend> backend = make(options, &argc, &argv);
  if (!backend->supports(peer->name))
    error = backend->name() + " has no " + peer->name;
  else if (peer->ping_pong && backend->nranks() < 2)
    error = "pingpong needs 2 ranks";
  else if (perf::find_collective(peer->layout)->rooted && options.root >= backend->nranks())
    error = "root " + std::to_string(options.root) + " is not a rank of " +
            std::to_string(backend->nranks());
  if (error) {
    std::fprintf(stderr, "%s: %s\n", program, error->c_str());
    return kExitUsage;
  }
  const std::string head = header(program, *backend, options);
  if (backend->rank() == 0 && !options.json) std::fputs(head.c_str(), stdout);
  Driver driver(options, *peer, *backend);
  const int64_t wrong = driver.run();
  if (backend->rank() == 0 && !options.json) {
    std::fputs(perf::format_footer(wrong, driver.avg_busbw()).c_str(), stdout);
    std::printf(
        "# Per-call latency (us), nearest-rank quantiles:\n"
        "#          size  oop median     oop p99   ip median      ip p99\n%s",
        driver.latency_lines().c_str());
  }
  std::fflush(stdout);
  backend->barrier();
  return wrong == 0 ? 0 : kExitWrongResults;
}

}  // namespace

double quantile(std::vector<double> samples, double q) {
  if (samples.empty()) return 0;
  const size_t rank = static_cast<size_t>(std::ceil(q * static_cast<double>(samples.size())));
  const size_t index = std::min(samples.size(), std::max<size_t>(rank, 1)) - 1;
  std::nth_element(samples.begin(), samples.begin() + static_cast<ptrdiff_t>(index), samples.end());
  return samples[index];
}

int peer_main(int argc, char** argv, const char* program, BackendFactory make) {
  try {
    return run(argc, argv, program, make);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", program, e.what());
    return kExitLibraryError;
  }
}

}  // namespace weft::peers
