#include "algorithms/pipeline/checker.h"

#include <algorithm>

namespace weft::algo::pipeline {

namespace {

constexpr size_t kMaxErrors = 8;

std::string describe(int rank, const Action& a) {
  std::string s = "rank " + std::to_string(rank) + " " + op_name(a.op) + "(mb " +
                  std::to_string(a.microbatch) + ", chunk " + std::to_string(a.chunk);
  if (is_comm(a.op)) s += ", peer " + std::to_string(a.peer);
  return s + ")";
}

// A group of transfers on a rank's stream: actions [begin, end), the time
// the host enqueued it, posted it (the previous group done) and completed.
struct Group {
  size_t begin, end;
  int64_t queued, posted, done;
  bool receives;
};

// Per rank and (chunk, micro-batch): what has happened so far; the host's
// position and clock; the stream's groups and the first not yet complete.
struct RankState {
  std::vector<char> f, b, w, split, got_f, got_b;
  size_t pc = 0;
  int64_t clock = 0;
  std::vector<Group> groups;
  size_t head = 0, wait_for = 0;
  bool waiting = false, finished = false;
  int in_flight = 0, held = 0;
};

}  // namespace

std::string CheckResult::message() const {
  std::string out;
  for (const std::string& e : errors) out += e + "\n";
  return out;
}

double bubble_formula(const Params& params) {
  const double p = params.stages, m = params.microbatches;
  const double v = params.family == Family::Interleaved ? params.virtual_stages : 1;
  return (p - 1) / (v * m + p - 1);
}

CheckResult check(const Params& params, const Schedule& schedule) {
  CheckResult out;
  auto error = [&](std::string e) {
    if (out.errors.size() < kMaxErrors) out.errors.push_back(std::move(e));
  };
  const int p = params.stages, m = params.microbatches, v = params.virtual_stages;
  const int last = p * v - 1;
  if (int(schedule.ranks.size()) != p) {
    error("the schedule has " + std::to_string(schedule.ranks.size()) + " ranks, not " +
          std::to_string(p));
    return out;
  }
  // Every action in range, transfers to the right neighbour.
  for (int r = 0; r < p; ++r)
    for (const Action& a : schedule.ranks[r]) {
      if (a.microbatch < 0 || a.microbatch >= m || a.chunk < 0 || a.chunk >= v) {
        error(describe(r, a) + ": micro-batch or chunk out of range");
        continue;
      }
      const int s = stage_of(a.chunk, r, p);
      const bool fwd = a.op == Op::SendForward || a.op == Op::RecvBackward;
      if (is_comm(a.op) && (fwd ? s == last : s == 0))
        error(describe(r, a) + ": stage " + std::to_string(s) + " has no neighbour there");
      else if (is_comm(a.op) && a.peer != (fwd ? s + 1 : s - 1) % p)
        error(describe(r, a) + ": wrong peer for stage " + std::to_string(s));
    }
  if (!out.ok()) return out;

  // Transfers by ordered pair: the k-th send of a → b meets the k-th receive on b from a.
  struct Slot {
    int rank;
    size_t index;  // in the rank's list
  };
  std::vector<std::vector<Slot>> sends(size_t(p) * p), recvs(size_t(p) * p);
  std::vector<std::vector<size_t>> slot_of(p);  // action -> k in its pair
  for (int r = 0; r < p; ++r)
    for (size_t i = 0; i < schedule.ranks[r].size(); ++i) {
      const Action& a = schedule.ranks[r][i];
      slot_of[r].push_back(0);
      if (!is_comm(a.op)) continue;
      const bool send = a.op == Op::SendForward || a.op == Op::SendBackward;
      std::vector<Slot>& list =
          send ? sends[size_t(r) * p + a.peer] : recvs[size_t(a.peer) * p + r];
      slot_of[r][i] = list.size();
      list.push_back({r, i});
    }
  for (int a = 0; a < p; ++a)
    for (int b = 0; b < p; ++b) {
      const auto& s = sends[size_t(a) * p + b];
      const auto& q = recvs[size_t(a) * p + b];
      if (s.size() != q.size())
        error("rank " + std::to_string(a) + " sends " + std::to_string(s.size()) + " to rank " +
              std::to_string(b) + ", which receives " + std::to_string(q.size()));
      for (size_t k = 0; k < std::min(s.size(), q.size()); ++k) {
        const Action& x = schedule.ranks[a][s[k].index];
        const Action& y = schedule.ranks[b][q[k].index];
        const int sx = stage_of(x.chunk, a, p), sy = stage_of(y.chunk, b, p);
        const bool forward = x.op == Op::SendForward && y.op == Op::RecvForward && sy == sx + 1;
        const bool backward = x.op == Op::SendBackward && y.op == Op::RecvBackward && sy == sx - 1;
        if ((!forward && !backward) || x.microbatch != y.microbatch)
          error("transfer " + std::to_string(k) + " from rank " + std::to_string(a) + " to " +
                std::to_string(b) + " pairs " + describe(a, x) + " with " + describe(b, y));
        (x.op == Op::SendForward ? out.forward_transfers : out.backward_transfers) += 1;
      }
    }
  if (!out.ok()) return out;

  std::vector<std::vector<int64_t>> send_post(sends.size()), recv_post(recvs.size());
  for (size_t i = 0; i < sends.size(); ++i) {
    send_post[i].assign(sends[i].size(), -1);
    recv_post[i].assign(recvs[i].size(), -1);
  }
  const size_t cells = size_t(v) * m;
  std::vector<RankState> st(p);
  for (RankState& s : st)
    s.f = s.b = s.w = s.split = s.got_f = s.got_b = std::vector<char>(cells, 0);
  out.busy.assign(p, 0);
  out.peak_in_flight.assign(p, 0);
  out.peak_held.assign(p, 0);
  auto cell = [&](int chunk, int mb) { return size_t(chunk) * m + mb; };
  // Whether the compute action can run now (its inputs exist); records it if so.
  auto compute = [&](int r, const Action& a) {
    RankState& s = st[r];
    const size_t c = cell(a.chunk, a.microbatch);
    const int stage = stage_of(a.chunk, r, p);
    auto local = [&](int other) { return other % p == r; };
    auto fail = [&](const char* why) {
      error(describe(r, a) + ": " + why);
      return false;
    };
    int64_t cost = 0;
    switch (a.op) {
      case Op::Forward:
        if (s.f[c]) return fail("runs twice");
        if (stage > 0 &&
            !(local(stage - 1) ? st[r].f[cell((stage - 1) / p, a.microbatch)] : s.got_f[c]))
          return fail("its input activation has not arrived");
        s.f[c] = 1, cost = params.costs.forward;
        out.peak_in_flight[r] = std::max(out.peak_in_flight[r], ++s.in_flight);
        out.peak_held[r] = std::max(out.peak_held[r], ++s.held);
        break;
      case Op::Backward:
      case Op::BackwardInput:
        if (!s.f[c]) return fail("runs before its forward");
        if (s.b[c]) return fail("runs twice");
        if (stage < last &&
            !(local(stage + 1) ? st[r].b[cell((stage + 1) / p, a.microbatch)] : s.got_b[c]))
          return fail("its output gradient has not arrived");
        s.b[c] = 1, --s.in_flight;
        if (a.op == Op::Backward) {
          --s.held, cost = params.costs.backward_input + params.costs.backward_weight;
        } else {
          s.split[c] = 1, cost = params.costs.backward_input;
        }
        break;
      case Op::BackwardWeight:
        if (!s.split[c]) return fail("runs before its input-gradient backward");
        if (s.w[c]) return fail("runs twice");
        s.w[c] = 1, --s.held, cost = params.costs.backward_weight;
        break;
      default:
        break;
    }
    s.clock += cost;
    out.busy[r] += cost;
    return true;
  };

  // The host side of rank r: compute, enqueue groups, wait for a group with a
  // receive (its data is needed next) and, at the end, for the whole stream.
  auto host = [&](int r) {
    RankState& s = st[r];
    const std::vector<Action>& list = schedule.ranks[r];
    bool moved = false;
    while (s.pc < list.size()) {
      const Action& a = list[s.pc];
      if (!is_comm(a.op)) {
        if (!compute(r, a)) return false;  // an error: stop this rank
        ++s.pc, moved = true;
        continue;
      }
      if (s.waiting) {
        const Group& g = s.groups[s.wait_for];
        if (g.done < 0) return moved;
        s.clock = std::max(s.clock, g.done);
        s.waiting = false, s.pc = g.end, moved = true;
        continue;
      }
      Group g{s.pc, s.pc, s.clock, -1, -1, false};
      while (g.end < list.size() && is_comm(list[g.end].op) && list[g.end].group == a.group) {
        const Action& x = list[g.end];
        const size_t c = cell(x.chunk, x.microbatch);
        if ((x.op == Op::SendForward && !s.f[c]) || (x.op == Op::SendBackward && !s.b[c])) {
          error(describe(r, x) + ": sends what has not been computed");
          return false;
        }
        g.receives = g.receives || x.op == Op::RecvForward || x.op == Op::RecvBackward;
        ++g.end;
      }
      s.groups.push_back(g);
      moved = true;
      if (g.receives) {
        s.waiting = true, s.wait_for = s.groups.size() - 1;
      } else {
        s.pc = g.end;
      }
    }
    if (!s.groups.empty() && s.groups.back().done < 0) return moved;
    if (!s.finished) {
      if (!s.groups.empty()) s.clock = std::max(s.clock, s.groups.back().done);
      s.finished = true, moved = true;
    }
    return moved;
  };
  // The stream side: groups in order, each posted once the previous is done
  // and complete once every transfer in it has met its counterpart.
  auto stream = [&](int r) {
    RankState& s = st[r];
    const std::vector<Action>& list = schedule.ranks[r];
    auto slot = [&](size_t i, bool mine) {
      const Action& x = list[i];
      const bool send = x.op == Op::SendForward || x.op == Op::SendBackward;
      const size_t key = send ? size_t(r) * p + x.peer : size_t(x.peer) * p + r;
      auto& table = (send == mine) ? send_post : recv_post;
      return &table[key][slot_of[r][i]];
    };
    bool moved = false;
    while (s.head < s.groups.size()) {
      Group& g = s.groups[s.head];
      if (g.posted < 0) {
        g.posted = std::max(g.queued, s.head ? s.groups[s.head - 1].done : int64_t(0));
        for (size_t i = g.begin; i < g.end; ++i) *slot(i, true) = g.posted;
        moved = true;
      }
      int64_t done = g.posted;
      for (size_t i = g.begin; i < g.end; ++i) {
        const int64_t other = *slot(i, false);
        if (other < 0) return moved;  // waits for a peer
        done = std::max(done, other);
      }
      for (size_t i = g.begin; i < g.end; ++i) {
        const Action& x = list[i];
        if (x.op == Op::RecvForward) s.got_f[cell(x.chunk, x.microbatch)] = 1;
        if (x.op == Op::RecvBackward) s.got_b[cell(x.chunk, x.microbatch)] = 1;
      }
      g.done = done, ++s.head, moved = true;
    }
    return moved;
  };
  for (bool progress = true; progress && out.ok();) {
    progress = false;
    for (int r = 0; r < p; ++r) {
      progress = host(r) || progress;
      progress = stream(r) || progress;
    }
  }
  if (!out.ok()) return out;
  for (int r = 0; r < p; ++r)
    if (!st[r].finished) {
      const RankState& s = st[r];
      const size_t at = s.head < s.groups.size() ? s.groups[s.head].begin : s.pc;
      error("deadlock: " + describe(r, schedule.ranks[r][at]) + " waits forever");
    }
  for (int r = 0; r < p && out.ok(); ++r)
    for (int c = 0; c < v; ++c)
      for (int mb = 0; mb < m; ++mb) {
        const size_t i = cell(c, mb);
        if (!st[r].f[i] || !st[r].b[i] || (st[r].split[i] && !st[r].w[i]))
          error("rank " + std::to_string(r) + " chunk " + std::to_string(c) + " micro-batch " +
                std::to_string(mb) + ": forward or backward missing");
      }
  if (!out.ok()) return out;
  int64_t total = 0;
  for (int r = 0; r < p; ++r)
    out.makespan = std::max(out.makespan, st[r].clock), total += out.busy[r];
  for (int r = 0; r < p; ++r)
    out.rank_bubble.push_back(out.makespan ? 1.0 - double(out.busy[r]) / double(out.makespan) : 0);
  out.bubble = out.makespan ? 1.0 - double(total) / (double(p) * double(out.makespan)) : 0;
  return out;
}

}  // namespace weft::algo::pipeline
