// Lowering: a rank's program (schedule.h) as a list of stream operations,
// the form the GPU executor enqueues on one stream per rank (copies into a
// peer's scratch slot, flag writes, flag waits, reductions) without any
// kernel ever waiting for another rank. Pure: no I/O, no CUDA.
// docs/gpu-lowering.md describes the lowered form and why it cannot deadlock.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "algorithms/schedule.h"

namespace weft::algo {

// Where an operand lives, from the lowering rank's point of view. Offsets
// are in bytes. Input, Output and Scratch are this rank's buffers (Scratch
// is the program's own, Program::scratch_count elements). Inbound is this
// rank's receive area for messages from `peer`; PeerInbound is `peer`'s
// receive area for messages from this rank (mapped from the peer). Both are
// `slots` slots of `slot_bytes` (LowerConfig), offset = slot * slot_bytes.
enum class Space : uint8_t { Input, Output, Scratch, Inbound, PeerInbound };

struct Loc {
  Space space = Space::Input;
  int32_t peer = -1;  // Inbound, PeerInbound
  uint64_t offset = 0;
};

// Every rank owns two 64-bit counters per peer: Inbound[peer] (raised by
// `peer` when a chunk from it is in this rank's slot) and Ack[peer] (raised
// by `peer` when it has consumed a chunk this rank sent it). A rank only
// writes its peers' counters and only waits on its own.
enum class Flag : uint8_t { Inbound, Ack };

enum class OpKind : uint8_t {
  Copy,       // bytes from src to dst
  WriteFlag,  // peer's counter `flag` (its entry for this rank) = value
  WaitFlag,   // until this rank's counter `flag` for `peer` >= value
  Reduce,     // dst = a (op) b over `count` elements; dst may alias a or b exactly
};

// Flag values are relative to the operation: the executor writes and waits
// for flag_value(sequence, value), where `sequence` numbers the
// communicator's operations from 1 and never restarts, so counters only grow
// and are never reset.
inline constexpr int kChunkBits = 24;  // chunks per channel per operation < 2^24
inline constexpr uint64_t kMaxSequence = (uint64_t{1} << (64 - kChunkBits)) - 1;
inline uint64_t flag_value(uint64_t sequence, uint64_t value) {
  return (sequence << kChunkBits) + value;
}

struct StreamOp {
  OpKind kind = OpKind::Copy;
  Flag flag = Flag::Inbound;  // WriteFlag, WaitFlag
  int32_t peer = -1;          // WriteFlag, WaitFlag
  uint64_t value = 0;         // WriteFlag, WaitFlag: relative (flag_value)
  uint64_t bytes = 0;         // Copy
  uint64_t count = 0;         // Reduce: elements
  Loc dst;                    // Copy, Reduce
  Loc a;                      // Copy (source), Reduce
  Loc b;                      // Reduce
};

struct LowerConfig {
  uint64_t element_size = 4;
  // Each rank's receive area: per sending peer, `slots` slots of
  // `slot_bytes`; messages larger than a slot travel in slot-sized chunks.
  uint64_t slot_bytes = 1 << 20;
  uint32_t slots = 2;
};

struct LoweredProgram {
  std::vector<StreamOp> ops;
  uint64_t scratch_bytes = 0;  // the program's own scratch
  uint64_t chunks_sent = 0;    // chunks this rank sends (empty messages are one)
};

// Lowers every rank's program for `params` (params.rank is ignored). The
// ranks' lists are interleaved by a joint dry run with the slot limit, so
// that each list is in an order that cannot deadlock whatever the timing
// (docs/gpu-lowering.md). AllToAllv needs params.all_send_counts (other
// ranks' counts shape their programs). False with *error when the program
// cannot be built, the configuration is invalid, sends and receives do not
// match, or the ranks cannot complete within the slots.
bool lower_all(const Params& params, const LowerConfig& config, std::vector<LoweredProgram>* out,
               std::string* error);

// This rank's list (params.rank): lower_all's entry for it.
bool lower(const Params& params, const LowerConfig& config, LoweredProgram* out,
           std::string* error);

// What a lowered list does, counted: its operations by kind, the bytes its copies move (and of
// those, the bytes written into peers' slots) and the bytes its reductions read and write.
struct LoweredStats {
  uint64_t ops = 0, copies = 0, bytes_copied = 0, bytes_to_peers = 0;
  uint64_t flag_writes = 0, flag_waits = 0, reductions = 0, bytes_reduced = 0;
};
LoweredStats count_lowered(const LoweredProgram& program, uint64_t element_size);

// The device cost model the GPU executor chooses algorithms with (the slowest rank's list is
// the call's time): per stream operation a latency, and the bytes a copy or a reduction
// (3 vectors: 2 read, 1 written) moves per microsecond. First estimates for one H200, not
// calibrated on a GPU (scripts/gpu-check.sh measures what they should be).
struct DeviceCostModel {
  double copy_us = 2.5, flag_us = 1.0, kernel_us = 3.0;
  double copy_bytes_per_us = 1.5e6, reduce_bytes_per_us = 1.0e6;
};
double predict_device_us(const LoweredProgram& program, uint64_t element_size,
                         const DeviceCostModel& model = {});

// One point-to-point message of a rank: `bytes` at absolute address `address` to (sends) or
// from (receives) `peer`.
struct P2pMessage {
  int32_t peer = -1;
  uint64_t address = 0;
  uint64_t bytes = 0;
};

// Lowers one rank's point-to-point messages issued together (a group, or one call) to a list.
// Buffers are addressed absolutely: Input and Output locations carry the address as their
// offset (the executor binds both spaces to 0). Messages on one channel (to or from one peer)
// travel in their order, chunk after chunk; channels advance in rounds (round c: chunk c of
// every channel that sends, then of every channel that receives), so that ranks whose groups
// hold matching messages cannot deadlock: a send waits only for the acknowledgement of a chunk
// of an earlier round. The receiver must post the same sizes in the same order per channel.
// Messages to and from this rank itself are copies, the k-th send to itself into the k-th
// receive from itself (their sizes must be equal). False with *error for a peer out of range
// or unmatched messages to itself.
bool lower_p2p(int nranks, int rank, const std::vector<P2pMessage>& sends,
               const std::vector<P2pMessage>& receives, const LowerConfig& config,
               LoweredProgram* out, std::string* error);

}  // namespace weft::algo
