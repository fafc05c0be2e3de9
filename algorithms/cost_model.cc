#include "algorithms/cost_model.h"

#include <algorithm>
#include <queue>
#include <unordered_map>
#include <utility>

namespace weft::algo {

namespace {

// One step as the timing needs it; 32 bytes, so a million-step run stays small.
struct TimedStep {
  double bytes = 0;
  int32_t rank = 0;
  int32_t peer = -1;
  uint32_t match = 0;  // Send: the matching Recv's index
  uint32_t pending = 0;
  StepKind kind = StepKind::Copy;
};

bool fail(std::string* error, std::string message) {
  if (error) *error = std::move(message);
  return false;
}

uint64_t pair_key(int from, int to) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(from)) << 32) | static_cast<uint32_t>(to);
}

// Direct one-shot calls that read the peers' buffers in place (CostNetwork::single_copy):
// an offer and a done word (two synchronisations), then per rank one read of each peer's
// block and, for AllGather and AllToAll, the copy of its own block.
bool reads_in_place(const Params& params, uint64_t element_size, const CostNetwork& network) {
  const bool copies_only = params.collective == Collective::AllGather ||
                           params.collective == Collective::Broadcast ||
                           params.collective == Collective::AllToAll;
  const uint64_t floor = network.single_copy_bytes[static_cast<size_t>(params.collective)];
  return copies_only && !(params.in_place && timed_by_placement(params.collective)) &&
         params.algorithm == Algorithm::OneShot && floor != 0 &&
         params.count * element_size >= floor;
}

double single_copy_time(const Params& params, uint64_t element_size, const CostNetwork& network) {
  const double piece = static_cast<double>(params.count * element_size);
  // Every rank but a Broadcast's root reads alike.
  const double slowest = params.collective == Collective::Broadcast
                             ? network.single_copy.time_us(piece)
                             : network.memory.transfer_us(piece) +
                                   (params.nranks - 1) * network.single_copy.time_us(piece);
  return 2 * network.direct.latency_us + slowest;
}

// A lane call (CostNetwork::lane_bytes): the writers' copies into their slots, then a
// Broadcast's readers read the root's slot, a Reduce's root every other rank's.
bool in_lanes(const Params& params, uint64_t element_size, const CostNetwork& network) {
  return (params.collective == Collective::Broadcast || params.collective == Collective::Reduce) &&
         params.algorithm == Algorithm::OneShot &&
         params.count * element_size <= network.lane_bytes;
}

double lane_time(const Params& params, uint64_t element_size, const CostNetwork& network) {
  const double piece = static_cast<double>(params.count * element_size);
  const int read = params.collective == Collective::Broadcast ? 1 : params.nranks - 1;
  return network.lane_us + network.memory.transfer_us(piece) +
         read * network.direct.transfer_us(piece);
}

// Direct algorithms: every rank copies its input into a staging buffer the
// node shares, the ranks synchronise (one latency), then each reads what it
// needs from the peers' staging buffers (reductions fused with the reads).
// One-shot reads everything at once; two-shot reduces one n-th of the
// vector per rank, synchronises again and then gathers the reduced n-ths.
// The copy into the rank's own staging is a local copy (memory's throughput);
// the reads move lines another core has just written (the direct throughput).
double direct_time(const Params& params, uint64_t element_size, const CostNetwork& network) {
  if (in_lanes(params, element_size, network)) return lane_time(params, element_size, network);
  if (reads_in_place(params, element_size, network))
    return single_copy_time(params, element_size, network);
  const int n = params.nranks;
  const double piece = static_cast<double>(params.count * element_size);
  double staging = 0, latency = 0, reading = 0;
  // A Broadcast's readers read the root's staging undisturbed (docs/tuning.md, run 7).
  LinkTime link = network.direct;
  if (params.collective == Collective::Broadcast)
    link.bandwidth_gb_s =
        network.quiet_read_gb_s > 0 ? network.quiet_read_gb_s : network.memory.bandwidth_gb_s;
  for (int r = 0; r < n; ++r) {
    Params mine = params;
    mine.rank = r;
    const double staged = params.collective == Collective::AllToAllv
                              ? piece * n
                              : static_cast<double>(input_count(mine) * element_size);
    staging = std::max(staging, network.memory.time_us(staged));
    double reads = 0;
    for (int p = 0; p < n; ++p) {
      if (p == r) continue;
      double bytes = piece;  // per peer: its contribution to this rank's output
      if (params.collective == Collective::Broadcast) bytes = p == params.root ? piece : 0;
      if (params.collective == Collective::Reduce && r != params.root) bytes = 0;
      if (params.algorithm == Algorithm::TwoShot) bytes = 2 * piece / n;
      latency = std::max(latency, link.latency_us);
      reads += link.transfer_us(bytes);
    }
    reading = std::max(reading, reads);
  }
  // Everyone waits for the slowest staging copy (and, in two-shot, for the
  // slowest reduced n-th, which its rank copies into its staging as a second step):
  // one latency per synchronisation.
  const bool two_shot = params.algorithm == Algorithm::TwoShot;
  if (two_shot) staging += network.memory.time_us(piece / n);
  return staging + (two_shot ? 2 : 1) * latency + reading;
}

}  // namespace

CostNetwork CostNetwork::uniform(int nranks, LinkTime link, LinkTime memory) {
  CostNetwork network;
  network.nranks = nranks;
  network.classes = {link};
  network.memory = memory;
  return network;
}

bool predict(const Params& params, uint64_t element_size, const CostNetwork& network,
             CostResult* out, std::string* error) {
  const int n = params.nranks;
  if (n != network.nranks) return fail(error, "the network describes another rank count");
  *out = CostResult{};
  if (is_direct(params.algorithm)) {
    if (!supports(params.algorithm, params.collective))
      return fail(error, std::string(algorithm_name(params.algorithm)) + " does not implement " +
                             collective_name(params.collective));
    out->time_us = direct_time(params, element_size, network);
    return true;
  }

  // AllToAllv without counts is timed as every peer getting `count` (the
  // count matrix too, which hierarchical AllToAllv needs).
  Params base = params;
  std::vector<uint64_t> counts, displs, matrix;
  if (base.collective == Collective::AllToAllv && base.send_counts == nullptr) {
    counts.assign(n, base.count);
    for (int q = 0; q < n; ++q) displs.push_back(q * base.count);
    base.send_counts = base.recv_counts = counts.data();
    base.send_displs = base.recv_displs = displs.data();
    matrix.assign(static_cast<size_t>(n) * n, base.count);
    base.all_send_counts = matrix.data();
  }

  // Pipelined schedules move every chunk through every rank at least once:
  // refuse before building programs that certainly exceed the budget.
  if (base.chunk > 0 && base.count / base.chunk > network.max_steps / n)
    return fail(error, "more than " + std::to_string(network.max_steps) + " steps to time");

  // Every rank's program, flattened: steps, dependencies as global indexes.
  std::vector<TimedStep> steps;
  std::vector<uint32_t> dep_begin{0}, deps;
  Program program;
  for (int r = 0; r < n; ++r) {
    base.rank = r;
    if (!build(base, &program, error)) return false;
    // Rank 0's program stands for the others' size (symmetric schedules; a
    // root does the most work in rooted ones).
    const uint64_t expected = r == 0 ? program.steps.size() * static_cast<uint64_t>(n)
                                     : steps.size() + program.steps.size();
    if (expected > network.max_steps)
      return fail(error, "more than " + std::to_string(network.max_steps) + " steps to time");
    const uint32_t offset = static_cast<uint32_t>(steps.size());
    for (const Step& step : program.steps) {
      TimedStep timed;
      timed.kind = step.kind;
      timed.rank = r;
      timed.peer = step.peer;
      timed.pending = step.num_deps + (step.kind == StepKind::Recv ? 1 : 0);
      const Range& range = step.kind == StepKind::Send ? step.a : step.dst;
      timed.bytes = static_cast<double>(range.count * element_size);
      steps.push_back(timed);
      for (uint32_t d = 0; d < step.num_deps; ++d)
        deps.push_back(offset + program.deps[step.first_dep + d]);
      dep_begin.push_back(static_cast<uint32_t>(deps.size()));
    }
  }
  const uint32_t total = static_cast<uint32_t>(steps.size());

  // The k-th Send from s to d meets the k-th Recv on d from s.
  std::unordered_map<uint64_t, std::vector<uint32_t>> recvs;
  for (uint32_t i = 0; i < total; ++i)
    if (steps[i].kind == StepKind::Recv) recvs[pair_key(steps[i].peer, steps[i].rank)].push_back(i);
  std::unordered_map<uint64_t, size_t> matched;
  for (uint32_t i = 0; i < total; ++i) {
    if (steps[i].kind != StepKind::Send) continue;
    const uint64_t key = pair_key(steps[i].rank, steps[i].peer);
    auto found = recvs.find(key);
    size_t& k = matched[key];
    if (found == recvs.end() || k >= found->second.size())
      return fail(error, "a send from rank " + std::to_string(steps[i].rank) + " to rank " +
                             std::to_string(steps[i].peer) + " has no receive");
    steps[i].match = found->second[k++];
    ++out->messages;
  }

  // Dependents of each step (reverse edges), compressed.
  std::vector<uint32_t> next_begin(total + 1, 0), next(deps.size());
  for (uint32_t d : deps) ++next_begin[d + 1];
  for (uint32_t i = 0; i < total; ++i) next_begin[i + 1] += next_begin[i];
  {
    std::vector<uint32_t> fill(next_begin.begin(), next_begin.end() - 1);
    for (uint32_t i = 0; i < total; ++i)
      for (uint32_t d = dep_begin[i]; d < dep_begin[i + 1]; ++d) next[fill[deps[d]]++] = i;
  }

  // Events in time order: a step becoming ready (index < total), or a port
  // falling free (total + port). Ports are each rank's send port (0..n-1)
  // and compute (n..2n-1), which also carries its sends over links its core
  // copies; a step finding its port busy queues there, first come first
  // served, and starts when the port frees.
  std::vector<double> ready(total, 0.0), port_free(2 * static_cast<size_t>(n), 0.0);
  std::vector<double> recv_free(n, 0.0);
  std::vector<std::vector<uint32_t>> waiting(2 * static_cast<size_t>(n));
  std::vector<size_t> waiting_head(2 * static_cast<size_t>(n), 0);
  using Event = std::pair<double, uint32_t>;
  std::priority_queue<Event, std::vector<Event>, std::greater<Event>> queue;
  for (uint32_t i = 0; i < total; ++i)
    if (steps[i].pending == 0) queue.push({0.0, i});
  auto release = [&](uint32_t i, double at) {
    ready[i] = std::max(ready[i], at);
    if (--steps[i].pending == 0) queue.push({ready[i], i});
  };
  auto port_of = [&](const TimedStep& step) -> int64_t {
    if (step.kind == StepKind::Recv) return -1;
    const bool on_core = step.kind != StepKind::Send || network.copied_by_cpu(step.rank, step.peer);
    return on_core ? int64_t{n} + step.rank : step.rank;
  };
  uint32_t done_steps = 0;
  double finish = 0;
  auto run = [&](uint32_t i, double at) {
    ++done_steps;
    const TimedStep& step = steps[i];
    double done = at;
    if (step.kind == StepKind::Send) {
      const LinkTime& link = network.link(step.rank, step.peer);
      const double transfer = link.transfer_us(step.bytes);
      done = at + transfer;
      const double landed = std::max(at, recv_free[step.peer]) + transfer;
      recv_free[step.peer] = landed;
      release(step.match, landed + link.latency_us);
    } else if (step.kind != StepKind::Recv) {
      done = at + network.memory.time_us(step.bytes);
    }
    if (const int64_t port = port_of(step); port >= 0) {
      port_free[port] = done;
      queue.push({done, total + static_cast<uint32_t>(port)});
    }
    finish = std::max(finish, done);
    for (uint32_t d = next_begin[i]; d < next_begin[i + 1]; ++d) release(next[d], done);
  };
  while (!queue.empty()) {
    const auto [at, id] = queue.top();
    queue.pop();
    if (id >= total) {
      const uint32_t port = id - total;
      if (waiting_head[port] < waiting[port].size() && port_free[port] <= at)
        run(waiting[port][waiting_head[port]++], at);
      continue;
    }
    const int64_t port = port_of(steps[id]);
    if (port >= 0 && (port_free[port] > at || waiting_head[port] < waiting[port].size()))
      waiting[port].push_back(id);
    else
      run(id, at);
  }
  if (done_steps != total) return fail(error, "the programs deadlock");
  out->time_us = finish;
  out->steps = total;
  return true;
}

}  // namespace weft::algo
