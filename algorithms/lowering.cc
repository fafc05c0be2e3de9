#include "algorithms/lowering.h"

#include <algorithm>
#include <deque>
#include <set>

namespace weft::algo {
namespace {

bool fail(std::string* error, const std::string& message) {
  if (error) *error = "lowering: " + message;
  return false;
}

Space space_of(Buf buf) {
  switch (buf) {
    case Buf::Input:
      return Space::Input;
    case Buf::Output:
      return Space::Output;
    case Buf::Scratch:
      break;
  }
  return Space::Scratch;
}

// What the dry run knows of the messages from one rank to another.
struct Channel {
  uint64_t sent = 0;           // chunks the sender has put in slots
  uint64_t consumed = 0;       // chunks the receiver has taken out
  std::deque<uint64_t> bytes;  // sizes of the chunks in flight, oldest first
};

// One rank in the dry run: which steps may run, how far each has got.
struct RankRun {
  const Program* program = nullptr;
  std::vector<uint32_t> remaining;  // unfinished dependencies per step
  std::vector<uint32_t> dependents_begin, dependents;
  std::vector<uint64_t> chunks_done;
  std::set<uint32_t> active;  // ready and unfinished, lowest index first
  size_t finished = 0;
  std::vector<int64_t> ack_waited;  // per peer: the highest Ack value already waited for
  // Per peer, the transfer steps in program order (the k-th send matches the
  // peer's k-th receive) and how many have finished: each channel carries
  // whole messages in that order, as its counters count chunks.
  std::vector<std::vector<uint32_t>> sends, recvs;
  std::vector<size_t> sends_done, recvs_done;
  LoweredProgram* out = nullptr;
};

class DryRun {
 public:
  DryRun(const LowerConfig& config, std::vector<Program>& programs,
         std::vector<LoweredProgram>* out)
      : config_(config),
        n_(static_cast<int>(programs.size())),
        chunk_elements_(config.slot_bytes / config.element_size),
        ranks_(programs.size()),
        channels_(programs.size() * programs.size()) {
    for (int r = 0; r < n_; ++r) {
      RankRun& run = ranks_[r];
      run.program = &programs[r];
      run.out = &(*out)[r];
      run.out->scratch_bytes = programs[r].scratch_count * config.element_size;
      run.ack_waited.assign(n_, -1);
      run.sends.assign(n_, {});
      run.recvs.assign(n_, {});
      run.sends_done.assign(n_, 0);
      run.recvs_done.assign(n_, 0);
    }
  }

  bool run(std::string* error) {
    for (int r = 0; r < n_; ++r) {
      if (!prepare(r, error)) return false;
    }
    for (;;) {
      bool all_done = true, progressed = false;
      for (int r = 0; r < n_; ++r) {
        if (!pass(r, &progressed, error)) return false;
        all_done = all_done && ranks_[r].finished == ranks_[r].program->steps.size();
      }
      if (all_done) return true;
      if (!progressed) return fail(error, stuck());
    }
  }

 private:
  // Checks the steps, indexes dependents, and opens every channel this rank
  // receives on: its Ack there says the previous operation's chunks are consumed.
  bool prepare(int r, std::string* error) {
    RankRun& run = ranks_[r];
    const Program& p = *run.program;
    const size_t steps = p.steps.size();
    run.remaining.assign(steps, 0);
    run.chunks_done.assign(steps, 0);
    run.dependents_begin.assign(steps + 1, 0);
    std::vector<bool> receives_from(n_, false);
    for (size_t i = 0; i < steps; ++i) {
      const Step& s = p.steps[i];
      if (s.first_dep + uint64_t{s.num_deps} > p.deps.size()) {
        return fail(error, "rank " + std::to_string(r) + " step " + std::to_string(i) +
                               ": dependencies out of range");
      }
      for (uint32_t k = 0; k < s.num_deps; ++k) {
        const uint32_t d = p.deps[s.first_dep + k];
        if (d >= i) {
          return fail(error, "rank " + std::to_string(r) + " step " + std::to_string(i) +
                                 " depends on a later step");
        }
        ++run.dependents_begin[d + 1];
      }
      run.remaining[i] = s.num_deps;
      if (s.kind == StepKind::Send || s.kind == StepKind::Recv) {
        if (s.peer < 0 || s.peer >= n_ || s.peer == r) {
          return fail(error, "rank " + std::to_string(r) + " step " + std::to_string(i) +
                                 ": invalid peer " + std::to_string(s.peer));
        }
        if (s.kind == StepKind::Recv) receives_from[s.peer] = true;
        (s.kind == StepKind::Send ? run.sends : run.recvs)[s.peer].push_back(
            static_cast<uint32_t>(i));
      }
    }
    for (size_t i = 0; i < steps; ++i) run.dependents_begin[i + 1] += run.dependents_begin[i];
    run.dependents.resize(run.dependents_begin[steps]);
    std::vector<uint32_t> fill(run.dependents_begin.begin(), run.dependents_begin.end() - 1);
    for (size_t i = 0; i < steps; ++i) {
      const Step& s = p.steps[i];
      for (uint32_t k = 0; k < s.num_deps; ++k) {
        run.dependents[fill[p.deps[s.first_dep + k]]++] = static_cast<uint32_t>(i);
      }
      if (s.num_deps == 0) run.active.insert(static_cast<uint32_t>(i));
    }
    for (int peer = 0; peer < n_; ++peer) {
      if (receives_from[peer]) write_flag(run, Flag::Ack, peer, 0);
    }
    return true;
  }

  // Advances every active step of rank r by what it can do now: a local
  // step completes, a transfer moves one chunk if its slot or data is there.
  bool pass(int r, bool* progressed, std::string* error) {
    RankRun& run = ranks_[r];
    for (auto it = run.active.begin(); it != run.active.end();) {
      const uint32_t i = *it;
      const Step& s = run.program->steps[i];
      bool finished = false;
      switch (s.kind) {
        case StepKind::Copy:
        case StepKind::Reduce:
          emit_local(run, s);
          finished = true;
          break;
        case StepKind::Send:
        case StepKind::Recv: {
          bool moved = false;
          if (!move_chunk(r, i, &moved, &finished, error)) return false;
          if (!moved) {
            ++it;
            continue;
          }
          break;
        }
      }
      *progressed = true;
      if (!finished) {
        ++it;
        continue;
      }
      ++run.finished;
      for (uint32_t k = run.dependents_begin[i]; k < run.dependents_begin[i + 1]; ++k) {
        const uint32_t d = run.dependents[k];
        if (--run.remaining[d] == 0) run.active.insert(d);
      }
      it = run.active.erase(it);
    }
    return true;
  }

  void emit_local(RankRun& run, const Step& s) {
    const uint64_t es = config_.element_size;
    if (s.dst.count == 0) return;  // a join: ordering only, which the stream gives
    StreamOp op;
    op.dst = {space_of(s.dst.buf), -1, s.dst.offset * es};
    op.a = {space_of(s.a.buf), -1, s.a.offset * es};
    if (s.kind == StepKind::Copy) {
      op.kind = OpKind::Copy;
      op.bytes = s.dst.count * es;
    } else {
      op.kind = OpKind::Reduce;
      op.count = s.dst.count;
      op.b = {space_of(s.b.buf), -1, s.b.offset * es};
    }
    run.out->ops.push_back(op);
  }

  uint64_t chunks_of(uint64_t count) const {
    return std::max<uint64_t>(1, (count + chunk_elements_ - 1) / chunk_elements_);
  }

  // Moves chunk chunks_done[i] of transfer step i on rank r, if it can go now.
  bool move_chunk(int r, uint32_t i, bool* moved, bool* finished, std::string* error) {
    RankRun& run = ranks_[r];
    const Step& s = run.program->steps[i];
    const bool send = s.kind == StepKind::Send;
    const Range& range = send ? s.a : s.dst;
    const uint64_t es = config_.element_size;
    const uint64_t first = run.chunks_done[i] * chunk_elements_;
    const uint64_t elements = std::min(chunk_elements_, range.count - std::min(range.count, first));
    const Loc local{space_of(range.buf), -1, (range.offset + first) * es};
    const std::vector<uint32_t>& order = send ? run.sends[s.peer] : run.recvs[s.peer];
    size_t& done = send ? run.sends_done[s.peer] : run.recvs_done[s.peer];
    if (order[done] != i) return true;  // an earlier message to this peer goes first
    Channel& ch = send ? channels_[r * n_ + s.peer] : channels_[s.peer * n_ + r];
    const uint64_t index = send ? ch.sent : ch.consumed;
    const uint64_t slot = index % config_.slots * config_.slot_bytes;
    if (index + 1 >= (uint64_t{1} << kChunkBits)) {
      return fail(error, "more than 2^24 chunks between two ranks; raise the slot size");
    }
    if (send) {
      if (ch.sent - ch.consumed >= config_.slots) return true;  // every slot still full
      // The slot is free once the peer has consumed the chunk that used it
      // last; the first `slots` chunks need only the peer's opening Ack.
      const uint64_t needed = index < config_.slots ? 0 : index - config_.slots + 1;
      if (static_cast<int64_t>(needed) > run.ack_waited[s.peer]) {
        wait_flag(run, Flag::Ack, s.peer, needed);
        run.ack_waited[s.peer] = static_cast<int64_t>(needed);
      }
      if (elements > 0) copy(run, {Space::PeerInbound, s.peer, slot}, local, elements * es);
      ++run.out->chunks_sent;
      write_flag(run, Flag::Inbound, s.peer, index + 1);
      ch.bytes.push_back(elements * es);
      ++ch.sent;
    } else {
      if (ch.consumed == ch.sent) return true;  // not sent yet
      if (ch.bytes.front() != elements * es) {
        return fail(error, "rank " + std::to_string(r) + " receives " +
                               std::to_string(elements * es) + " bytes from rank " +
                               std::to_string(s.peer) + " where it sends " +
                               std::to_string(ch.bytes.front()));
      }
      wait_flag(run, Flag::Inbound, s.peer, index + 1);
      if (elements > 0) copy(run, local, {Space::Inbound, s.peer, slot}, elements * es);
      write_flag(run, Flag::Ack, s.peer, index + 1);
      ch.bytes.pop_front();
      ++ch.consumed;
    }
    *moved = true;
    *finished = ++run.chunks_done[i] == chunks_of(range.count);
    if (*finished) ++done;
    return true;
  }

  static void copy(RankRun& run, const Loc& dst, const Loc& src, uint64_t bytes) {
    StreamOp op;
    op.kind = OpKind::Copy;
    op.dst = dst;
    op.a = src;
    op.bytes = bytes;
    run.out->ops.push_back(op);
  }
  static void flag_op(RankRun& run, OpKind kind, Flag flag, int peer, uint64_t value) {
    StreamOp op;
    op.kind = kind;
    op.flag = flag;
    op.peer = peer;
    op.value = value;
    run.out->ops.push_back(op);
  }
  static void write_flag(RankRun& run, Flag flag, int peer, uint64_t value) {
    flag_op(run, OpKind::WriteFlag, flag, peer, value);
  }
  static void wait_flag(RankRun& run, Flag flag, int peer, uint64_t value) {
    flag_op(run, OpKind::WaitFlag, flag, peer, value);
  }

  // Where each unfinished rank is stuck, for the error.
  std::string stuck() const {
    std::string text = "the ranks cannot complete within " + std::to_string(config_.slots) +
                       " slots of " + std::to_string(config_.slot_bytes) + " bytes:";
    for (int r = 0; r < n_; ++r) {
      const RankRun& run = ranks_[r];
      if (run.finished == run.program->steps.size()) continue;
      text += " rank " + std::to_string(r);
      if (run.active.empty()) {
        text += " (no step ready);";
        continue;
      }
      const Step& s = run.program->steps[*run.active.begin()];
      text += std::string(s.kind == StepKind::Send ? " sends to " : " waits for ") +
              std::to_string(s.peer) + ";";
    }
    return text;
  }

  const LowerConfig& config_;
  const int n_;
  const uint64_t chunk_elements_;
  std::vector<RankRun> ranks_;
  std::vector<Channel> channels_;  // [sender * n + receiver]
};

// Rank r's parameters: params itself for params.rank; for AllToAllv, the
// other ranks' counts come from all_send_counts and their displacements
// are packed (they move nothing between ranks, so they shape no order).
struct RankParams {
  Params params;
  std::vector<uint64_t> send_counts, send_displs, recv_counts, recv_displs;
};

bool rank_params(const Params& params, int r, RankParams* out, std::string* error) {
  out->params = params;
  out->params.rank = r;
  if (params.collective != Collective::AllToAllv || r == params.rank) return true;
  const int n = params.nranks;
  const uint64_t* all = params.all_send_counts;
  if (all == nullptr) return fail(error, "alltoallv needs all_send_counts to order the ranks");
  for (int q = 0; q < n; ++q) {
    if (all[params.rank * n + q] != params.send_counts[q] ||
        all[q * n + params.rank] != params.recv_counts[q]) {
      return fail(
          error, "all_send_counts disagrees with this rank's counts for peer " + std::to_string(q));
    }
  }
  uint64_t sent = 0, received = 0;
  for (int q = 0; q < n; ++q) {
    out->send_counts.push_back(all[r * n + q]);
    out->send_displs.push_back(sent);
    sent += all[r * n + q];
    out->recv_counts.push_back(all[q * n + r]);
    out->recv_displs.push_back(received);
    received += all[q * n + r];
  }
  out->params.send_counts = out->send_counts.data();
  out->params.send_displs = out->send_displs.data();
  out->params.recv_counts = out->recv_counts.data();
  out->params.recv_displs = out->recv_displs.data();
  return true;
}

}  // namespace

bool lower_all(const Params& params, const LowerConfig& config, std::vector<LoweredProgram>* out,
               std::string* error) {
  out->clear();
  if (config.element_size == 0) return fail(error, "element_size must be at least 1");
  if (config.slots == 0) return fail(error, "slots must be at least 1");
  if (config.slot_bytes < config.element_size) {
    return fail(error, "slot_bytes (" + std::to_string(config.slot_bytes) +
                           ") is smaller than one element");
  }
  if (params.nranks < 1 || params.rank < 0 || params.rank >= params.nranks) {
    return fail(error, "rank " + std::to_string(params.rank) + " is outside 0.." +
                           std::to_string(params.nranks - 1));
  }
  std::vector<Program> programs(params.nranks);
  for (int r = 0; r < params.nranks; ++r) {
    RankParams rp;
    if (!rank_params(params, r, &rp, error)) return false;
    std::string why;
    if (!build(rp.params, &programs[r], &why))
      return fail(error, "rank " + std::to_string(r) + ": " + why);
  }
  out->resize(params.nranks);
  DryRun dry_run(config, programs, out);
  if (dry_run.run(error)) return true;
  out->clear();
  return false;
}

bool lower(const Params& params, const LowerConfig& config, LoweredProgram* out,
           std::string* error) {
  std::vector<LoweredProgram> all;
  if (!lower_all(params, config, &all, error)) return false;
  *out = std::move(all[params.rank]);
  return true;
}

namespace {

// A channel's chunks in order: which message, which bytes.
struct Chunk {
  uint64_t address = 0;
  uint64_t bytes = 0;
};

std::vector<Chunk> chunks_of(const std::vector<P2pMessage>& messages, int peer,
                             uint64_t slot_bytes) {
  std::vector<Chunk> chunks;
  for (const P2pMessage& m : messages) {
    if (m.peer != peer) continue;
    if (m.bytes == 0) chunks.push_back({m.address, 0});  // still one chunk: the order is kept
    for (uint64_t at = 0; at < m.bytes; at += slot_bytes)
      chunks.push_back({m.address + at, std::min(slot_bytes, m.bytes - at)});
  }
  return chunks;
}

}  // namespace

bool lower_p2p(int nranks, int rank, const std::vector<P2pMessage>& sends,
               const std::vector<P2pMessage>& receives, const LowerConfig& config,
               LoweredProgram* out, std::string* error) {
  *out = LoweredProgram{};
  if (config.slots == 0 || config.slot_bytes == 0) return fail(error, "empty slots");
  for (const auto* list : {&sends, &receives})
    for (const P2pMessage& m : *list)
      if (m.peer < 0 || m.peer >= nranks)
        return fail(error, "peer " + std::to_string(m.peer) + " is outside 0.." +
                               std::to_string(nranks - 1));
  auto op = [&](OpKind kind, Flag flag, int peer, uint64_t value) {
    StreamOp s;
    s.kind = kind;
    s.flag = flag;
    s.peer = peer;
    s.value = value;
    out->ops.push_back(s);
  };
  auto copy = [&](const Loc& dst, const Loc& src, uint64_t bytes) {
    if (bytes == 0) return;
    StreamOp s;
    s.kind = OpKind::Copy;
    s.dst = dst;
    s.a = src;
    s.bytes = bytes;
    out->ops.push_back(s);
  };
  // To and from itself: copies, in order.
  std::vector<P2pMessage> to_self, from_self;
  for (const P2pMessage& m : sends)
    if (m.peer == rank) to_self.push_back(m);
  for (const P2pMessage& m : receives)
    if (m.peer == rank) from_self.push_back(m);
  if (to_self.size() != from_self.size())
    return fail(error, std::to_string(to_self.size()) + " sends to this rank itself but " +
                           std::to_string(from_self.size()) + " receives from it");
  for (size_t k = 0; k < to_self.size(); ++k) {
    if (to_self[k].bytes != from_self[k].bytes)
      return fail(error, "a send of " + std::to_string(to_self[k].bytes) +
                             " bytes to this rank itself meets a receive of " +
                             std::to_string(from_self[k].bytes));
    copy({Space::Output, -1, from_self[k].address}, {Space::Input, -1, to_self[k].address},
         to_self[k].bytes);
  }
  std::vector<std::vector<Chunk>> out_chunks(nranks), in_chunks(nranks);
  size_t rounds = 0;
  for (int p = 0; p < nranks; ++p) {
    if (p == rank) continue;
    out_chunks[p] = chunks_of(sends, p, config.slot_bytes);
    in_chunks[p] = chunks_of(receives, p, config.slot_bytes);
    rounds = std::max({rounds, out_chunks[p].size(), in_chunks[p].size()});
  }
  if (rounds >= (uint64_t{1} << kChunkBits))
    return fail(error, "more than 2^24 chunks between two ranks; raise the slot size");
  for (size_t c = 0; c < rounds; ++c) {
    for (int p = 0; p < nranks; ++p) {
      if (c >= out_chunks[p].size()) continue;
      // The slot is free once the chunk that used it last was consumed; the first `slots`
      // chunks wait for every chunk of earlier operations on the channel (value 0).
      if (c == 0 || c >= config.slots)
        op(OpKind::WaitFlag, Flag::Ack, p, c < config.slots ? 0 : c - config.slots + 1);
      copy({Space::PeerInbound, p, c % config.slots * config.slot_bytes},
           {Space::Input, -1, out_chunks[p][c].address}, out_chunks[p][c].bytes);
      ++out->chunks_sent;
      op(OpKind::WriteFlag, Flag::Inbound, p, c + 1);
    }
    for (int p = 0; p < nranks; ++p) {
      if (c >= in_chunks[p].size()) continue;
      op(OpKind::WaitFlag, Flag::Inbound, p, c + 1);
      copy({Space::Output, -1, in_chunks[p][c].address},
           {Space::Inbound, p, c % config.slots * config.slot_bytes}, in_chunks[p][c].bytes);
      op(OpKind::WriteFlag, Flag::Ack, p, c + 1);
    }
  }
  return true;
}

LoweredStats count_lowered(const LoweredProgram& program, uint64_t element_size) {
  LoweredStats stats;
  for (const StreamOp& op : program.ops) {
    ++stats.ops;
    switch (op.kind) {
      case OpKind::Copy:
        ++stats.copies;
        stats.bytes_copied += op.bytes;
        if (op.dst.space == Space::PeerInbound) stats.bytes_to_peers += op.bytes;
        break;
      case OpKind::Reduce:
        ++stats.reductions;
        stats.bytes_reduced += 3 * op.count * element_size;
        break;
      case OpKind::WriteFlag:
        ++stats.flag_writes;
        break;
      case OpKind::WaitFlag:
        ++stats.flag_waits;
        break;
    }
  }
  return stats;
}

double predict_device_us(const LoweredProgram& program, uint64_t element_size,
                         const DeviceCostModel& model) {
  const LoweredStats s = count_lowered(program, element_size);
  return static_cast<double>(s.copies) * model.copy_us +
         static_cast<double>(s.bytes_copied) / model.copy_bytes_per_us +
         static_cast<double>(s.reductions) * model.kernel_us +
         static_cast<double>(s.bytes_reduced) / model.reduce_bytes_per_us +
         static_cast<double>(s.flag_writes + s.flag_waits) * model.flag_us;
}

}  // namespace weft::algo
