#include "algorithms/simulator.h"

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <map>
#include <utility>

namespace weft::algo {

namespace {

constexpr uint32_t kNoStep = UINT32_MAX;

uint64_t mix(uint64_t x) {
  // splitmix64 finaliser: cheap, well spread, deterministic.
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Per-rank stream of values: one mix per element.
uint64_t rank_key(uint64_t seed, int rank) {
  return mix(seed + static_cast<uint64_t>(rank));
}
uint64_t input_value(uint64_t seed, int rank, uint64_t index) {
  return mix(rank_key(seed, rank) ^ index);
}
uint64_t poison_value(uint64_t seed, int rank, uint64_t index) {
  return input_value(~seed, rank, index);
}

// Where a rank's buffers sit in its simulated memory. In place, Input and
// Output overlap exactly as schedule.h describes.
struct Layout {
  uint64_t in_base = 0;
  uint64_t in_size = 0;
  uint64_t out_base = 0;
  uint64_t out_size = 0;
  uint64_t scratch_base = 0;
  uint64_t scratch_size = 0;
  uint64_t total = 0;

  uint64_t base(Buf buf) const {
    return buf == Buf::Input ? in_base : buf == Buf::Output ? out_base : scratch_base;
  }
  uint64_t size(Buf buf) const {
    return buf == Buf::Input ? in_size : buf == Buf::Output ? out_size : scratch_size;
  }
};

Layout layout_for(const Params& p, uint64_t scratch) {
  Layout l;
  l.in_size = input_count(p);
  l.out_size = output_count(p);
  // Input start minus Output start, when the buffers alias.
  int64_t shift = 0;
  bool alias = p.in_place && l.in_size > 0 && l.out_size > 0;
  const int64_t rank_off = static_cast<int64_t>(p.rank * p.count);
  const int64_t root_off = static_cast<int64_t>(p.root * p.count);
  switch (p.collective) {
    case Collective::AllGather:
      shift = rank_off;
      break;
    case Collective::ReduceScatter:
      shift = -rank_off;
      break;
    case Collective::Gather:
      shift = root_off;
      break;
    case Collective::Scatter:
      shift = -root_off;
      break;
    case Collective::AllToAllv:
    case Collective::Barrier:
      alias = false;
      break;
    default:
      break;
  }
  uint64_t io = l.in_size + l.out_size;
  if (alias) {
    l.in_base = shift > 0 ? static_cast<uint64_t>(shift) : 0;
    l.out_base = shift < 0 ? static_cast<uint64_t>(-shift) : 0;
    io = std::max(l.in_base + l.in_size, l.out_base + l.out_size);
  } else {
    l.out_base = l.in_size;
  }
  l.scratch_base = io;
  l.scratch_size = scratch;
  l.total = io + scratch;
  return l;
}

const char* buf_name(Buf buf) {
  return buf == Buf::Input ? "Input" : buf == Buf::Output ? "Output" : "Scratch";
}

std::string range_text(const Range& r) {
  char text[96];
  snprintf(text, sizeof(text), "%s[%" PRIu64 ",+%" PRIu64 ")", buf_name(r.buf), r.offset, r.count);
  return text;
}

std::string step_text(const Step& s) {
  switch (s.kind) {
    case StepKind::Send:
      return "Send " + range_text(s.a) + " to " + std::to_string(s.peer);
    case StepKind::Recv:
      return "Recv " + range_text(s.dst) + " from " + std::to_string(s.peer);
    case StepKind::Reduce:
      return "Reduce " + range_text(s.dst) + " = " + range_text(s.a) + " op " + range_text(s.b);
    case StepKind::Copy:
      return "Copy " + range_text(s.dst) + " <- " + range_text(s.a);
  }
  return "?";
}

// Physical ranges in a rank's memory.
struct Phys {
  uint64_t lo = 0;
  uint64_t len = 0;
  bool overlaps(const Phys& o) const { return lo < o.lo + o.len && o.lo < lo + len; }
  bool operator==(const Phys& o) const { return lo == o.lo && len == o.len; }
};

enum class State : uint8_t { kWaiting, kReady, kDone };

struct SimStep {
  uint32_t range_first = 0;  // Send: a; Recv: dst; Copy: dst, a; Reduce: dst, a, b
  uint32_t partner = kNoStep;
  uint32_t pending = 0;  // dependencies not yet done
  uint32_t time = 0;     // rounds before the step may start, then when it completes
  int32_t peer = -1;
  StepKind kind = StepKind::Copy;
  State state = State::kWaiting;
};

struct RankSim {
  Layout layout;
  std::vector<SimStep> steps;
  std::vector<Phys> ranges;
  std::vector<uint32_t> dep_first;  // steps + 1 entries into deps
  std::vector<uint32_t> deps;
  std::vector<uint32_t> next_first;  // steps + 1 entries into next
  std::vector<uint32_t> next;        // dependents
  std::vector<uint64_t> mem;
  std::vector<uint64_t> shape;  // AllReduce: order-sensitive hash of each element's expression
  std::vector<uint64_t> heard;  // Barrier: per step, bitset of ranks it (transitively) heard from
};

class Simulator {
 public:
  Simulator(const Params& params, const SimOptions& options, const ProgramBuilder& builder)
      : params_(params), options_(options), builder_(builder), n_(params.nranks) {}

  SimResult run();

 private:
  Params params_for(int rank) const;
  void issue(SimIssue kind, const std::string& message);
  std::string describe(int rank, uint32_t step);
  bool load(int rank);
  void check_hazards(int rank, const Program& program);
  bool match();
  void execute();
  void complete(int rank, uint32_t step, uint32_t time);
  void transfer(int send_rank, uint32_t send, int recv_rank, uint32_t recv);
  void apply_local(int rank, uint32_t step);
  void report_deadlock();
  void check_values();
  void check_barrier();

  const Params& params_;
  const SimOptions& options_;
  const ProgramBuilder& builder_;
  const int n_;
  int words_ = 0;  // per Barrier bitset
  bool shapes_ = false;
  SimResult result_;
  std::vector<RankSim> ranks_;
  std::vector<std::pair<int, uint32_t>> work_;
  std::map<int, Program> described_;  // programs rebuilt to word error messages
  // AllToAllv layout, [rank * n + peer].
  std::vector<uint64_t> send_counts_, send_displs_, recv_counts_, recv_displs_;
};

void Simulator::issue(SimIssue kind, const std::string& message) {
  result_.issues |= kind;
  if (result_.errors.size() < options_.max_errors) result_.errors.push_back(message);
}

Params Simulator::params_for(int rank) const {
  Params p = params_;
  p.rank = rank;
  if (p.collective == Collective::AllToAllv && !send_counts_.empty()) {
    const size_t row = static_cast<size_t>(rank) * n_;
    p.send_counts = &send_counts_[row];
    p.send_displs = &send_displs_[row];
    p.recv_counts = &recv_counts_[row];
    p.recv_displs = &recv_displs_[row];
  }
  return p;
}

std::string Simulator::describe(int rank, uint32_t step) {
  auto it = described_.find(rank);
  if (it == described_.end()) {
    Program program;
    std::string error;
    builder_(params_for(rank), &program, &error);
    it = described_.emplace(rank, std::move(program)).first;
  }
  const std::string text = step < it->second.steps.size() ? step_text(it->second.steps[step]) : "?";
  return "rank " + std::to_string(rank) + " step " + std::to_string(step) + " (" + text + ")";
}

SimResult Simulator::run() {
  result_.ranks.resize(n_);
  if (params_.collective == Collective::AllToAllv) {
    const std::vector<uint64_t>& counts = options_.alltoallv_counts;
    if (counts.size() != static_cast<size_t>(n_) * n_) {
      issue(kSimBuildFailed, "alltoallv needs SimOptions::alltoallv_counts (nranks^2 entries)");
      return std::move(result_);
    }
    const size_t cells = counts.size();
    send_counts_.resize(cells);
    send_displs_.resize(cells);
    recv_counts_.resize(cells);
    recv_displs_.resize(cells);
    for (int r = 0; r < n_; ++r) {
      uint64_t send_at = 0;
      uint64_t recv_at = 0;
      for (int q = 0; q < n_; ++q) {
        const size_t cell = static_cast<size_t>(r) * n_ + q;
        send_counts_[cell] = counts[cell];
        send_displs_[cell] = send_at;
        send_at += counts[cell] + options_.alltoallv_gap;
        recv_counts_[cell] = counts[static_cast<size_t>(q) * n_ + r];
        recv_displs_[cell] = recv_at;
        recv_at += recv_counts_[cell] + options_.alltoallv_gap;
      }
    }
  }
  if (params_.collective == Collective::Barrier) words_ = (n_ + 63) / 64;
  shapes_ = options_.check_values && params_.collective == Collective::AllReduce;
  ranks_.resize(n_);
  result_.hazards_checked = options_.hazard_step_limit > 0;
  bool loaded = true;
  for (int r = 0; r < n_; ++r) loaded = load(r) && loaded;
  if (!loaded || !match()) return std::move(result_);
  execute();
  if (result_.has(kSimDeadlock)) return std::move(result_);
  if (options_.check_values) check_values();
  if (params_.collective == Collective::Barrier) check_barrier();
  return std::move(result_);
}

// Builds one rank's program, checks each step on its own, converts it to
// the compact form the run uses, checks hazards and counts.
bool Simulator::load(int rank) {
  const Params p = params_for(rank);
  Program program;
  std::string error;
  if (!builder_(p, &program, &error)) {
    issue(kSimBuildFailed, "rank " + std::to_string(rank) + ": build failed: " + error);
    return false;
  }
  RankSim& sim = ranks_[rank];
  sim.layout = layout_for(p, program.scratch_count);
  const size_t count = program.steps.size();
  if (count >= kNoStep) {
    issue(kSimInvalidStep, "rank " + std::to_string(rank) + ": too many steps");
    return false;
  }
  bool ok = true;
  auto bad = [&](SimIssue kind, uint32_t i, const std::string& what) {
    issue(kind, "rank " + std::to_string(rank) + " step " + std::to_string(i) + " (" +
                    step_text(program.steps[i]) + "): " + what);
    ok = false;
  };
  auto phys = [&](const Range& r, uint32_t i) {
    if (static_cast<int>(r.buf) > 2) {
      bad(kSimInvalidStep, i, "unknown buffer");
      return Phys{};
    }
    const uint64_t size = sim.layout.size(r.buf);
    if (r.offset > size || r.count > size - r.offset) {
      bad(kSimOutOfBounds, i,
          std::string(buf_name(r.buf)) + " holds " + std::to_string(size) + " elements");
      return Phys{};
    }
    return Phys{sim.layout.base(r.buf) + r.offset, r.count};
  };
  result_.ranks[rank] = count_program(program, options_.element_size);
  sim.steps.resize(count);
  sim.deps.reserve(program.deps.size());
  size_t num_ranges = 0;
  for (const Step& s : program.steps) {
    num_ranges += s.kind == StepKind::Reduce ? 3 : s.kind == StepKind::Copy ? 2 : 1;
  }
  sim.ranges.reserve(num_ranges);
  sim.dep_first.assign(count + 1, 0);
  std::vector<uint32_t> dependents(count, 0);
  for (uint32_t i = 0; i < count; ++i) {
    const Step& s = program.steps[i];
    SimStep& out = sim.steps[i];
    out.kind = s.kind;
    out.peer = s.peer;
    out.range_first = static_cast<uint32_t>(sim.ranges.size());
    if (uint64_t{s.first_dep} + s.num_deps > program.deps.size()) {
      bad(kSimInvalidStep, i, "dependency list outside Program::deps");
      continue;
    }
    sim.dep_first[i] = static_cast<uint32_t>(sim.deps.size());
    for (uint32_t k = 0; k < s.num_deps; ++k) {
      const uint32_t d = program.deps[s.first_dep + k];
      if (d >= i) {
        bad(kSimInvalidStep, i, "depends on step " + std::to_string(d) + ", not an earlier one");
        continue;
      }
      sim.deps.push_back(d);
      ++dependents[d];
    }
    out.pending = static_cast<uint32_t>(sim.deps.size()) - sim.dep_first[i];
    switch (s.kind) {
      case StepKind::Send:
      case StepKind::Recv: {
        if (s.peer < 0 || s.peer >= n_ || s.peer == rank) bad(kSimInvalidStep, i, "bad peer");
        sim.ranges.push_back(phys(s.kind == StepKind::Send ? s.a : s.dst, i));
        break;
      }
      case StepKind::Copy: {
        const Phys dst = phys(s.dst, i);
        const Phys a = phys(s.a, i);
        if (s.a.count != s.dst.count) bad(kSimInvalidStep, i, "lengths differ");
        if (dst.overlaps(a)) bad(kSimInvalidStep, i, "source and destination overlap");
        sim.ranges.insert(sim.ranges.end(), {dst, a});
        break;
      }
      case StepKind::Reduce: {
        const Phys dst = phys(s.dst, i);
        const Phys a = phys(s.a, i);
        const Phys b = phys(s.b, i);
        if (s.a.count != s.dst.count || s.b.count != s.dst.count) {
          bad(kSimInvalidStep, i, "lengths differ");
        }
        if ((dst.overlaps(a) && !(dst == a)) || (dst.overlaps(b) && !(dst == b))) {
          bad(kSimInvalidStep, i, "destination partly overlaps an operand");
        }
        sim.ranges.insert(sim.ranges.end(), {dst, a, b});
        break;
      }
      default:
        bad(kSimInvalidStep, i, "unknown step kind");
    }
  }
  sim.dep_first[count] = static_cast<uint32_t>(sim.deps.size());
  if (!ok) return false;
  // Dependents, for waking steps up as their dependencies complete.
  sim.next_first.assign(count + 1, 0);
  for (uint32_t i = 0; i < count; ++i) sim.next_first[i + 1] = sim.next_first[i] + dependents[i];
  sim.next.resize(sim.deps.size());
  for (uint32_t i = 0; i < count; ++i) {
    for (uint32_t k = sim.dep_first[i]; k < sim.dep_first[i + 1]; ++k) {
      const uint32_t d = sim.deps[k];
      sim.next[sim.next_first[d + 1] - dependents[d]--] = i;
    }
  }
  if (options_.hazard_step_limit > 0 && count <= options_.hazard_step_limit) {
    check_hazards(rank, program);
  } else {
    result_.hazards_checked = false;
  }
  if (options_.check_values) {
    const Layout& l = sim.layout;
    sim.mem.resize(l.total);
    for (uint64_t i = 0; i < l.total; ++i) sim.mem[i] = poison_value(options_.seed, rank, i);
    for (uint64_t i = 0; i < l.in_size; ++i) {
      sim.mem[l.in_base + i] = input_value(options_.seed, rank, i);
    }
    if (shapes_) sim.shape = sim.mem;
  }
  if (words_ > 0) sim.heard.assign(count * words_, 0);
  return true;
}

// Any two steps touching overlapping elements, one of them writing, must be
// ordered by a dependency path: an executor may run unordered steps at once.
// Steps are visited in index order (a topological order, since dependencies
// point backwards), keeping per run of elements its last writer and the
// readers since. A write must follow both, a read the last writer; pairs
// further back then follow by transitivity, so this finds every race.
void Simulator::check_hazards(int rank, const Program& program) {
  const size_t count = program.steps.size();
  const size_t words = (count + 63) / 64;
  // before[i]: bitset of the steps with a dependency path to step i.
  std::vector<uint64_t> before(count * words, 0);
  const RankSim& sim = ranks_[rank];
  for (size_t i = 0; i < count; ++i) {
    uint64_t* row = &before[i * words];
    for (uint32_t k = sim.dep_first[i]; k < sim.dep_first[i + 1]; ++k) {
      const uint32_t d = sim.deps[k];
      const uint64_t* from = &before[d * words];
      for (size_t w = 0; w <= d / 64; ++w) row[w] |= from[w];
      row[d / 64] |= uint64_t{1} << (d % 64);
    }
  }
  struct Run {
    uint64_t end;
    uint32_t writer;
    std::vector<uint32_t> readers;  // since the writer
  };
  std::map<uint64_t, Run> runs;  // begin -> run; untouched elements have no run
  // Makes `at` a run boundary.
  auto split = [&](uint64_t at) {
    auto it = runs.upper_bound(at);
    if (it == runs.begin()) return;
    --it;
    if (it->first == at || it->second.end <= at) return;
    Run tail = it->second;
    it->second.end = at;
    runs.emplace(at, std::move(tail));
  };
  size_t reported = 0;
  auto ordered = [&](uint32_t earlier, uint32_t step) {
    if (earlier == step || (before[step * words + earlier / 64] >> (earlier % 64) & 1)) return;
    if (reported++ >= 2) return;
    issue(kSimHazard, "hazard: " + describe(rank, earlier) + " and step " + std::to_string(step) +
                          " (" + step_text(program.steps[step]) +
                          ") touch the same elements with no dependency path between them");
  };
  auto touch = [&](const Phys& at, uint32_t step, bool write) {
    if (at.len == 0) return;
    const uint64_t end = at.lo + at.len;
    split(at.lo);
    split(end);
    // Fill the gaps with fresh runs so every element is covered.
    uint64_t pos = at.lo;
    for (auto it = runs.lower_bound(at.lo); pos < end;) {
      if (it == runs.end() || it->first > pos) {
        const uint64_t gap_end = it == runs.end() ? end : std::min(end, it->first);
        it = runs.emplace_hint(it, pos, Run{gap_end, kNoStep, {}});
      }
      Run& run = it->second;
      if (run.writer != kNoStep) ordered(run.writer, step);
      if (write) {
        for (uint32_t reader : run.readers) ordered(reader, step);
        run.writer = step;
        run.readers.clear();
      } else if (run.readers.empty() || run.readers.back() != step) {
        run.readers.push_back(step);
      }
      pos = run.end;
      ++it;
    }
  };
  for (uint32_t i = 0; i < count; ++i) {
    const SimStep& s = sim.steps[i];
    const Phys* r = &sim.ranges[s.range_first];
    switch (s.kind) {
      case StepKind::Send:
        touch(r[0], i, false);
        break;
      case StepKind::Recv:
        touch(r[0], i, true);
        break;
      case StepKind::Copy:
        touch(r[1], i, false);
        touch(r[0], i, true);
        break;
      case StepKind::Reduce:
        touch(r[1], i, false);
        touch(r[2], i, false);
        touch(r[0], i, true);
        break;
    }
  }
  if (reported > 2) {
    issue(kSimHazard, "rank " + std::to_string(rank) + ": " + std::to_string(reported) +
                          " unordered pairs in all");
  }
}

// The k-th Send from s to d pairs with the k-th Recv on d from s.
bool Simulator::match() {
  using Entry = std::pair<int32_t, uint32_t>;  // peer, step
  std::vector<std::vector<Entry>> recvs(n_);
  for (int r = 0; r < n_; ++r) {
    for (uint32_t i = 0; i < ranks_[r].steps.size(); ++i) {
      if (ranks_[r].steps[i].kind == StepKind::Recv)
        recvs[r].push_back({ranks_[r].steps[i].peer, i});
    }
    std::stable_sort(recvs[r].begin(), recvs[r].end(),
                     [](const Entry& x, const Entry& y) { return x.first < y.first; });
  }
  bool ok = true;
  std::vector<uint32_t> sent_to(n_);
  for (int s = 0; s < n_; ++s) {
    std::fill(sent_to.begin(), sent_to.end(), 0);
    RankSim& from = ranks_[s];
    for (uint32_t i = 0; i < from.steps.size(); ++i) {
      SimStep& send = from.steps[i];
      if (send.kind != StepKind::Send) continue;
      const int d = send.peer;
      const uint32_t k = sent_to[d]++;
      const auto group =
          std::equal_range(recvs[d].begin(), recvs[d].end(), Entry{s, 0},
                           [](const Entry& x, const Entry& y) { return x.first < y.first; });
      if (k >= static_cast<uint32_t>(group.second - group.first)) {
        issue(kSimUnmatched, "unmatched: " + describe(s, i) + " is send number " +
                                 std::to_string(k + 1) + " to rank " + std::to_string(d) +
                                 ", which posts only " +
                                 std::to_string(group.second - group.first) + " receives from it");
        ok = false;
        continue;
      }
      const uint32_t j = (group.first + k)->second;
      SimStep& recv = ranks_[d].steps[j];
      send.partner = j;
      recv.partner = i;
      if (from.ranges[send.range_first].len != ranks_[d].ranges[recv.range_first].len) {
        issue(kSimSizeMismatch,
              "size mismatch: " + describe(s, i) + " is matched with " + describe(d, j));
        ok = false;
      }
    }
  }
  for (int d = 0; d < n_; ++d) {
    for (const Entry& e : recvs[d]) {
      if (ranks_[d].steps[e.second].partner == kNoStep) {
        issue(kSimUnmatched, "unmatched: " + describe(d, e.second) + " has no matching send");
        ok = false;
      }
    }
  }
  return ok;
}

void Simulator::apply_local(int rank, uint32_t step) {
  RankSim& sim = ranks_[rank];
  const SimStep& s = sim.steps[step];
  if (words_ > 0) {
    uint64_t* heard = &sim.heard[step * words_];
    for (uint32_t k = sim.dep_first[step]; k < sim.dep_first[step + 1]; ++k) {
      const uint64_t* from = &sim.heard[sim.deps[k] * words_];
      for (int w = 0; w < words_; ++w) heard[w] |= from[w];
    }
    heard[rank / 64] |= uint64_t{1} << (rank % 64);
  }
  if (sim.mem.empty() || (s.kind != StepKind::Copy && s.kind != StepKind::Reduce)) return;
  const Phys dst = sim.ranges[s.range_first];
  const Phys a = sim.ranges[s.range_first + 1];
  uint64_t* mem = sim.mem.data();
  uint64_t* shape = sim.shape.data();
  if (s.kind == StepKind::Copy) {
    std::copy_n(mem + a.lo, dst.len, mem + dst.lo);
    if (shapes_) std::copy_n(shape + a.lo, dst.len, shape + dst.lo);
    return;
  }
  const Phys b = sim.ranges[s.range_first + 2];
  for (uint64_t i = 0; i < dst.len; ++i) mem[dst.lo + i] = mem[a.lo + i] + mem[b.lo + i];
  if (!shapes_) return;
  for (uint64_t i = 0; i < dst.len; ++i) {
    shape[dst.lo + i] =
        mix(shape[a.lo + i] + mix(shape[b.lo + i]));  // neither commutes nor associates
  }
}

void Simulator::transfer(int send_rank, uint32_t send, int recv_rank, uint32_t recv) {
  RankSim& from = ranks_[send_rank];
  RankSim& to = ranks_[recv_rank];
  apply_local(send_rank, send);
  apply_local(recv_rank, recv);
  if (words_ > 0) {
    const uint64_t* src = &from.heard[send * words_];
    uint64_t* dst = &to.heard[recv * words_];
    for (int w = 0; w < words_; ++w) dst[w] |= src[w];
  }
  if (to.mem.empty()) return;
  const Phys a = from.ranges[from.steps[send].range_first];
  const Phys dst = to.ranges[to.steps[recv].range_first];
  std::copy_n(from.mem.data() + a.lo, dst.len, to.mem.data() + dst.lo);
  if (shapes_) std::copy_n(from.shape.data() + a.lo, dst.len, to.shape.data() + dst.lo);
}

void Simulator::complete(int rank, uint32_t step, uint32_t time) {
  RankSim& sim = ranks_[rank];
  SimStep& s = sim.steps[step];
  s.state = State::kDone;
  s.time = time;
  RankStats& stats = result_.ranks[rank];
  stats.rounds = std::max(stats.rounds, time);
  for (uint32_t k = sim.next_first[step]; k < sim.next_first[step + 1]; ++k) {
    SimStep& next = sim.steps[sim.next[k]];
    next.time = std::max(next.time, time);
    if (--next.pending == 0) work_.push_back({rank, sim.next[k]});
  }
}

// Runs every step whose dependencies are done; a matched pair runs when both
// sides are ready and costs one round.
void Simulator::execute() {
  for (int r = 0; r < n_; ++r) {
    for (uint32_t i = 0; i < ranks_[r].steps.size(); ++i) {
      if (ranks_[r].steps[i].pending == 0) work_.push_back({r, i});
    }
  }
  uint64_t random = options_.order_seed;
  while (!work_.empty()) {
    if (random != 0) {
      random ^= random << 13;  // xorshift64
      random ^= random >> 7;
      random ^= random << 17;
      std::swap(work_[random % work_.size()], work_.back());
    }
    const auto [r, i] = work_.back();
    work_.pop_back();
    SimStep& s = ranks_[r].steps[i];
    if (s.kind == StepKind::Copy || s.kind == StepKind::Reduce) {
      apply_local(r, i);
      complete(r, i, s.time);
      continue;
    }
    s.state = State::kReady;
    SimStep& other = ranks_[s.peer].steps[s.partner];
    if (other.state != State::kReady) continue;
    const uint32_t time = std::max(s.time, other.time) + 1;
    if (s.kind == StepKind::Send) {
      transfer(r, i, s.peer, s.partner);
    } else {
      transfer(s.peer, s.partner, r, i);
    }
    complete(r, i, time);
    complete(s.peer, s.partner, time);
  }
  for (const RankStats& stats : result_.ranks)
    result_.rounds = std::max(result_.rounds, stats.rounds);
  report_deadlock();
}

// Names a few stuck steps and follows each one's wait chain to the cause.
void Simulator::report_deadlock() {
  uint64_t stuck = 0;
  uint64_t total = 0;
  std::vector<std::pair<int, uint32_t>> first_stuck;
  for (int r = 0; r < n_; ++r) {
    total += ranks_[r].steps.size();
    bool named = false;
    for (uint32_t i = 0; i < ranks_[r].steps.size(); ++i) {
      if (ranks_[r].steps[i].state == State::kDone) continue;
      ++stuck;
      if (!named && first_stuck.size() < 3) first_stuck.push_back({r, i});
      named = true;
    }
  }
  if (stuck == 0) return;
  std::string text =
      "deadlock: " + std::to_string(stuck) + " of " + std::to_string(total) + " steps never ran";
  for (auto [r, i] : first_stuck) {
    text += "\n  ";
    for (int hop = 0; hop < 8; ++hop) {
      const RankSim& sim = ranks_[r];
      const SimStep& s = sim.steps[i];
      text += describe(r, i);
      if (s.state == State::kWaiting) {
        uint32_t d = i;
        for (uint32_t k = sim.dep_first[i]; k < sim.dep_first[i + 1]; ++k) {
          if (sim.steps[sim.deps[k]].state != State::kDone) {
            d = sim.deps[k];
            break;
          }
        }
        text += " waits for ";
        i = d;
      } else if (s.state == State::kReady) {
        text += " is ready; its partner ";
        const int peer = s.peer;
        i = s.partner;
        r = peer;
      } else {
        break;
      }
    }
  }
  issue(kSimDeadlock, text);
}

void Simulator::check_values() {
  const Collective c = params_.collective;
  const uint64_t count = params_.count;
  const uint64_t seed = options_.seed;
  const int root = params_.root;
  uint64_t wrong = 0;
  auto expect = [&](int r, uint64_t index, uint64_t want) {
    const RankSim& sim = ranks_[r];
    const uint64_t got = sim.mem[sim.layout.out_base + index];
    if (got == want) return;
    if (wrong++ < 3) {
      issue(kSimWrongResult, "wrong result: rank " + std::to_string(r) + " Output[" +
                                 std::to_string(index) + "] = " + std::to_string(got) +
                                 ", expected " + std::to_string(want));
    }
  };
  // Sum over all ranks of input element `index`.
  auto sum = [&](uint64_t index) {
    uint64_t total = 0;
    for (int s = 0; s < n_; ++s) total += input_value(seed, s, index);
    return total;
  };
  switch (c) {
    case Collective::AllReduce:
    case Collective::Reduce:
      for (uint64_t i = 0; i < count; ++i) {
        const uint64_t want = sum(i);
        for (int r = 0; r < n_; ++r) {
          if (c == Collective::AllReduce || r == root) expect(r, i, want);
        }
      }
      break;
    case Collective::ReduceScatter:
      for (int r = 0; r < n_; ++r) {
        for (uint64_t i = 0; i < count; ++i) expect(r, i, sum(r * count + i));
      }
      break;
    case Collective::AllGather:
    case Collective::Gather:
      for (int r = 0; r < n_; ++r) {
        if (c == Collective::Gather && r != root) continue;
        for (int s = 0; s < n_; ++s) {
          for (uint64_t i = 0; i < count; ++i) expect(r, s * count + i, input_value(seed, s, i));
        }
      }
      break;
    case Collective::Broadcast:
      for (int r = 0; r < n_; ++r) {
        for (uint64_t i = 0; i < count; ++i) expect(r, i, input_value(seed, root, i));
      }
      break;
    case Collective::Scatter:
      for (int r = 0; r < n_; ++r) {
        for (uint64_t i = 0; i < count; ++i) expect(r, i, input_value(seed, root, r * count + i));
      }
      break;
    case Collective::AllToAll:
      for (int r = 0; r < n_; ++r) {
        for (int s = 0; s < n_; ++s) {
          for (uint64_t i = 0; i < count; ++i) {
            expect(r, s * count + i, input_value(seed, s, r * count + i));
          }
        }
      }
      break;
    case Collective::AllToAllv:
      for (int r = 0; r < n_; ++r) {
        std::vector<bool> defined(ranks_[r].layout.out_size, false);
        for (int s = 0; s < n_; ++s) {
          const size_t in_cell = static_cast<size_t>(r) * n_ + s;
          const size_t out_cell = static_cast<size_t>(s) * n_ + r;
          for (uint64_t i = 0; i < recv_counts_[in_cell]; ++i) {
            const uint64_t at = recv_displs_[in_cell] + i;
            defined[at] = true;
            expect(r, at, input_value(seed, s, send_displs_[out_cell] + i));
          }
        }
        // Elements no peer sends to must keep what they held.
        const uint64_t base = ranks_[r].layout.out_base;
        for (uint64_t i = 0; i < defined.size(); ++i) {
          if (!defined[i]) expect(r, i, poison_value(seed, r, base + i));
        }
      }
      break;
    case Collective::Barrier:
      break;
  }
  // Out of place, the input is read-only.
  if (!params_.in_place) {
    for (int r = 0; r < n_; ++r) {
      const RankSim& sim = ranks_[r];
      for (uint64_t i = 0; i < sim.layout.in_size; ++i) {
        if (sim.mem[sim.layout.in_base + i] != input_value(seed, r, i)) {
          if (wrong++ < 3) {
            issue(kSimWrongResult, "rank " + std::to_string(r) + " overwrote Input[" +
                                       std::to_string(i) + "] out of place");
          }
          break;
        }
      }
    }
  }
  if (wrong > 3) issue(kSimWrongResult, std::to_string(wrong) + " wrong elements in all");
  if (shapes_) {
    for (uint64_t i = 0; i < count; ++i) {
      const uint64_t first = ranks_[0].shape[ranks_[0].layout.out_base + i];
      for (int r = 1; r < n_; ++r) {
        if (ranks_[r].shape[ranks_[r].layout.out_base + i] == first) continue;
        issue(kSimOrderDiffers, "ranks 0 and " + std::to_string(r) + " combine Output[" +
                                    std::to_string(i) +
                                    "] in different orders: floats would not agree bitwise");
        i = count;
        break;
      }
    }
  }
  result_.values_checked = true;
}

// A Barrier rank may finish only once it has (transitively) heard from all.
void Simulator::check_barrier() {
  std::vector<uint64_t> all(words_);
  for (int r = 0; r < n_; ++r) {
    std::fill(all.begin(), all.end(), 0);
    all[r / 64] |= uint64_t{1} << (r % 64);
    const RankSim& sim = ranks_[r];
    for (size_t i = 0; i < sim.steps.size(); ++i) {
      for (int w = 0; w < words_; ++w) all[w] |= sim.heard[i * words_ + w];
    }
    for (int s = 0; s < n_; ++s) {
      if (!(all[s / 64] >> (s % 64) & 1)) {
        issue(kSimNoSync, "barrier: rank " + std::to_string(r) + " can leave before rank " +
                              std::to_string(s) + " arrives");
        break;
      }
    }
  }
}

}  // namespace

RankStats count_program(const Program& program, uint64_t element_size) {
  RankStats stats;
  stats.steps = program.steps.size();
  stats.scratch = program.scratch_count;
  for (const Step& s : program.steps) {
    if (s.kind != StepKind::Send) continue;
    ++stats.messages;
    stats.bytes_sent += s.a.count * element_size;
    stats.largest = std::max(stats.largest, s.a.count);
  }
  return stats;
}

std::string SimResult::message() const {
  std::string text;
  for (const std::string& e : errors) text += e + "\n";
  return text;
}

SimResult simulate(const Params& params, const SimOptions& options, const ProgramBuilder& builder) {
  if (params.nranks < 1) {
    SimResult result;
    result.issues = kSimBuildFailed;
    result.errors.push_back("nranks must be at least 1");
    return result;
  }
  Simulator simulator(params, options, builder);
  return simulator.run();
}

}  // namespace weft::algo
