#include "lowering/stream_emulation.h"

#include <chrono>
#include <cstring>
#include <thread>

namespace weft::test {
namespace {

const char* flag_name(algo::Flag flag) {
  return flag == algo::Flag::Inbound ? "inbound" : "ack";
}

}  // namespace

StreamEmulation::StreamEmulation(int nranks, const algo::LowerConfig& config,
                                 uint64_t first_sequence, int64_t wait_timeout_ms)
    : nranks_(nranks),
      config_(config),
      next_sequence_(first_sequence),
      wait_timeout_ms_(wait_timeout_ms),
      ranks_(nranks) {
  const size_t slots = static_cast<size_t>(nranks) * config.slots;
  for (Rank& rank : ranks_) {
    rank.inbound.assign(slots * config.slot_bytes, std::byte{0});
    rank.flags = std::make_unique<std::atomic<uint64_t>[]>(2 * nranks);
    rank.slot_full = std::make_unique<std::atomic<uint8_t>[]>(slots);
    for (int i = 0; i < 2 * nranks; ++i) rank.flags[i].store(0);
    for (size_t i = 0; i < slots; ++i) rank.slot_full[i].store(0);
  }
}

void StreamEmulation::fail(const std::string& message) {
  {
    std::lock_guard<std::mutex> lock(error_mutex_);
    if (error_.empty()) error_ = message;
  }
  failed_.store(true);
  for (Rank& rank : ranks_) {
    { std::lock_guard<std::mutex> lock(rank.mutex); }
    rank.changed.notify_all();
  }
}

bool StreamEmulation::run(std::vector<EmulatedOp>& ops, std::string* error) {
  std::vector<std::thread> threads;
  for (int r = 0; r < nranks_; ++r) threads.emplace_back([this, r, &ops] { run_rank(r, ops); });
  for (std::thread& t : threads) t.join();
  next_sequence_ += ops.size();
  if (!failed_.load()) return true;
  *error = error_;
  return false;
}

bool StreamEmulation::run_rank(int r, std::vector<EmulatedOp>& ops) {
  for (size_t k = 0; k < ops.size(); ++k) {
    const std::vector<algo::StreamOp>& list = ops[k].lists[r].ops;
    for (size_t i = 0; i < list.size(); ++i) {
      if (failed_.load() || !execute(r, k, next_sequence_ + k, i, list[i], ops[k])) return false;
    }
  }
  return true;
}

std::byte* StreamEmulation::address(int r, EmulatedOp& emulated, const algo::Loc& loc,
                                    uint64_t bytes, const std::string& where) {
  OpBuffers& b = emulated.buffers[r];
  std::byte* base = nullptr;
  uint64_t size = 0;
  const uint64_t area = uint64_t{config_.slots} * config_.slot_bytes;
  const bool peer_valid = loc.peer >= 0 && loc.peer < nranks_;
  switch (loc.space) {
    case algo::Space::Input:
      base = b.input, size = b.input_bytes;
      break;
    case algo::Space::Output:
      base = b.output, size = b.output_bytes;
      break;
    case algo::Space::Scratch:
      base = b.scratch.data(), size = b.scratch.size();
      break;
    case algo::Space::Inbound:
      if (peer_valid) base = ranks_[r].inbound.data() + loc.peer * area, size = area;
      break;
    case algo::Space::PeerInbound:
      if (peer_valid) base = ranks_[loc.peer].inbound.data() + r * area, size = area;
      break;
  }
  if (base == nullptr && bytes > 0) {
    fail(where + ": operand outside every buffer (peer " + std::to_string(loc.peer) + ")");
    return nullptr;
  }
  if (loc.offset > size || bytes > size - loc.offset) {
    fail(where + ": bytes " + std::to_string(loc.offset) + ".." +
         std::to_string(loc.offset + bytes) + " outside a buffer of " + std::to_string(size));
    return nullptr;
  }
  return base + loc.offset;
}

bool StreamEmulation::execute(int r, size_t op_index, uint64_t sequence, size_t step,
                              const algo::StreamOp& op, EmulatedOp& emulated) {
  const std::string where = "rank " + std::to_string(r) + " operation " + std::to_string(op_index) +
                            " stream op " + std::to_string(step);
  switch (op.kind) {
    case algo::OpKind::Copy: {
      std::byte* dst = address(r, emulated, op.dst, op.bytes, where);
      const std::byte* src = address(r, emulated, op.a, op.bytes, where);
      if (dst == nullptr || src == nullptr) return false;
      const uint64_t slot_bytes = config_.slot_bytes;
      // A copy into a peer's slot fills it; a copy out of one's own slot
      // consumes it. Both must stay inside one slot.
      if (op.dst.space == algo::Space::PeerInbound || op.a.space == algo::Space::Inbound) {
        const algo::Loc& loc = op.dst.space == algo::Space::PeerInbound ? op.dst : op.a;
        if (loc.offset % slot_bytes + op.bytes > slot_bytes) {
          fail(where + ": a copy crosses a slot boundary");
          return false;
        }
      }
      if (op.dst.space == algo::Space::PeerInbound) {
        const size_t slot = static_cast<size_t>(r) * config_.slots + op.dst.offset / slot_bytes;
        if (ranks_[op.dst.peer].slot_full[slot].exchange(1) != 0) {
          fail(where + ": overwrites slot " + std::to_string(op.dst.offset / slot_bytes) +
               " of rank " + std::to_string(op.dst.peer) + " before it consumed it");
          return false;
        }
        slot_writes_.fetch_add(1);
      }
      std::memcpy(dst, src, op.bytes);
      if (op.a.space == algo::Space::Inbound) {
        const size_t slot =
            static_cast<size_t>(op.a.peer) * config_.slots + op.a.offset / slot_bytes;
        if (ranks_[r].slot_full[slot].exchange(0) != 1) {
          fail(where + ": consumes slot " + std::to_string(op.a.offset / slot_bytes) +
               " from rank " + std::to_string(op.a.peer) + " that holds no chunk");
          return false;
        }
      }
      return true;
    }
    case algo::OpKind::Reduce: {
      const uint64_t bytes = op.count * reduce::dtype_size(emulated.dtype);
      std::byte* dst = address(r, emulated, op.dst, bytes, where);
      const std::byte* a = address(r, emulated, op.a, bytes, where);
      const std::byte* b = address(r, emulated, op.b, bytes, where);
      if (dst == nullptr || a == nullptr || b == nullptr) return false;
      reduce::apply(emulated.dtype, emulated.op, dst, a, b, op.count);
      return true;
    }
    case algo::OpKind::WriteFlag:
      if (op.peer < 0 || op.peer >= nranks_) {
        fail(where + ": flag of invalid peer " + std::to_string(op.peer));
        return false;
      }
      flag(op.peer, op.flag, r).store(algo::flag_value(sequence, op.value));
      {
        // Taken so that a waiter between its check and its sleep cannot miss this.
        std::lock_guard<std::mutex> lock(ranks_[op.peer].mutex);
      }
      ranks_[op.peer].changed.notify_one();
      return true;
    case algo::OpKind::WaitFlag: {
      if (op.peer < 0 || op.peer >= nranks_) {
        fail(where + ": waits on invalid peer " + std::to_string(op.peer));
        return false;
      }
      std::atomic<uint64_t>& counter = flag(r, op.flag, op.peer);
      const uint64_t target = algo::flag_value(sequence, op.value);
      if (counter.load() >= target) return true;
      std::unique_lock<std::mutex> lock(ranks_[r].mutex);
      const bool reached =
          ranks_[r].changed.wait_for(lock, std::chrono::milliseconds(wait_timeout_ms_),
                                     [&] { return counter.load() >= target || failed_.load(); });
      lock.unlock();
      if (failed_.load()) return false;
      if (!reached) {
        fail(where + ": timed out waiting for its " + flag_name(op.flag) + " flag from rank " +
             std::to_string(op.peer) + " to reach " + std::to_string(target) + " (it is " +
             std::to_string(counter.load()) + ")");
        return false;
      }
      return true;
    }
  }
  return true;
}

}  // namespace weft::test
