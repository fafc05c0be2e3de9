// Building blocks that emit steps, shared by the algorithm families: the
// step emitter, message splitting, scratch slot rings, last-writer
// bookkeeping, and the ring and tree phases several collectives are made of.
// Internal to weft_algorithms.
#pragma once

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <map>
#include <vector>

#include "algorithms/patterns.h"
#include "algorithms/schedule.h"

namespace weft::algo::detail {

// "No step": dependency lists skip it, so optional predecessors need no branches.
inline constexpr uint32_t kNone = UINT32_MAX;

// Chunks a pipelined stage may keep in flight per scratch slot ring: enough
// to overlap receive, reduce and forward without scratch growing with count.
inline constexpr uint32_t kPipelineDepth = 4;

inline Range at(Buf buf, uint64_t offset, uint64_t count) {
  return Range{offset, count, buf};
}
inline Range at(Buf buf, Span span) {
  return Range{span.offset, span.count, buf};
}
// The part of `range` at `span`, relative to its start.
inline Range sub(const Range& range, Span span) {
  return Range{range.offset + span.offset, span.count, range.buf};
}

// A list of step indices: a braced list (copied, inline when short) or a
// borrowed vector. Lives only as a call argument.
class Deps {
 public:
  Deps() = default;
  Deps(std::initializer_list<uint32_t> list) : size_(list.size()) {
    if (size_ <= kInline) {
      std::copy(list.begin(), list.end(), inline_);
      data_ = inline_;
    } else {
      spill_.assign(list);
      data_ = spill_.data();
    }
  }
  Deps(const std::vector<uint32_t>& list) : data_(list.data()), size_(list.size()) {}
  Deps(const Deps&) = delete;
  Deps& operator=(const Deps&) = delete;
  const uint32_t* begin() const { return data_; }
  const uint32_t* end() const { return data_ + size_; }

 private:
  static constexpr size_t kInline = 4;
  uint32_t inline_[kInline] = {};
  std::vector<uint32_t> spill_;
  const uint32_t* data_ = nullptr;
  size_t size_ = 0;
};

class Emitter {
 public:
  explicit Emitter(Program* program) : program_(program) {}

  uint32_t send(int peer, const Range& a, const Deps& deps = {}) {
    return emit(StepKind::Send, peer, a, {}, {}, deps);
  }
  uint32_t recv(int peer, const Range& dst, const Deps& deps = {}) {
    return emit(StepKind::Recv, peer, {}, {}, dst, deps);
  }
  uint32_t reduce(const Range& dst, const Range& a, const Range& b, const Deps& deps = {}) {
    return emit(StepKind::Reduce, -1, a, b, dst, deps);
  }
  uint32_t copy(const Range& dst, const Range& a, const Deps& deps = {}) {
    return emit(StepKind::Copy, -1, a, {}, dst, deps);
  }
  // A step that moves nothing (an empty copy) and completes once `deps`
  // have: where many steps wait for many others, they wait for it instead.
  uint32_t join(const Deps& deps) {
    return copy(Range{0, 0, Buf::Scratch}, Range{0, 0, Buf::Scratch}, deps);
  }

  // A message cut into pieces of at most `chunk` elements (0: one piece).
  // Sender and receiver cut a message of the same length identically, so
  // the pieces match one to one. Appends the piece steps to *steps.
  void send_pieces(int peer, const Range& a, uint64_t chunk, const Deps& deps,
                   std::vector<uint32_t>* steps = nullptr) {
    pieces(StepKind::Send, peer, a, chunk, deps, steps);
  }
  void recv_pieces(int peer, const Range& dst, uint64_t chunk, const Deps& deps,
                   std::vector<uint32_t>* steps = nullptr) {
    pieces(StepKind::Recv, peer, dst, chunk, deps, steps);
  }

  // Reserves `count` elements of scratch.
  Range scratch(uint64_t count);

 private:
  uint32_t emit(StepKind kind, int peer, const Range& a, const Range& b, const Range& dst,
                const Deps& deps);
  void pieces(StepKind kind, int peer, const Range& range, uint64_t chunk, const Deps& deps,
              std::vector<uint32_t>* steps);
  uint32_t add(const Step& step, const Deps& deps);
  Program* program_;
};

// `depth` scratch slots of `len` elements taken round-robin by successive
// uses; rewriting a slot must wait for the last step that read it.
class SlotRing {
 public:
  SlotRing() = default;
  SlotRing(Emitter& emitter, uint64_t len, uint64_t depth);
  Range slot(uint64_t use, uint64_t count) const {
    return Range{base_ + (use % depth_) * len_, count, Buf::Scratch};
  }
  uint32_t reuse_dep(uint64_t use) const { return last_reader_[use % depth_]; }
  void release(uint64_t use, uint32_t step) { last_reader_[use % depth_] = step; }

 private:
  uint64_t base_ = 0;
  uint64_t len_ = 0;
  uint64_t depth_ = 1;
  std::vector<uint32_t> last_reader_;
};

// The last step to touch each element of one buffer, for algorithms whose
// ranges nest or shift from round to round.
class LastTouch {
 public:
  void set(Span span, uint32_t step);
  // Appends the steps that last touched any element of `span`.
  void collect(Span span, std::vector<uint32_t>* out) const;

 private:
  std::map<uint64_t, std::pair<uint64_t, uint32_t>> runs_;  // begin -> (end, step)
};

// Sends base[span] in pieces, each after the steps that last wrote its
// elements (`written` is indexed relative to base). Each piece is recorded
// in *read, when given, as the last step to touch its elements.
void send_written(Emitter& e, int peer, const Range& base, Span span, uint64_t chunk,
                  const LastTouch& written, LastTouch* read = nullptr);
// Receives into base[span] in pieces, each after the steps in *wait (when
// given) that last touched its elements; each piece becomes their last
// writer in *written, when given.
void recv_noted(Emitter& e, int peer, const Range& base, Span span, uint64_t chunk,
                const LastTouch* wait, LastTouch* written);

// The ring a ring or chain schedule follows: the real rank at each position
// (the layout's ring, else rank order), and this rank's position in it.
struct RingOrder {
  std::vector<int> members;
  int pos = 0;
  int size() const { return static_cast<int>(members.size()); }
  int right() const { return members[ring_next(pos, size())]; }
  int left() const { return members[ring_prev(pos, size())]; }
};
RingOrder ring_order(const Params& p);

// Ring reduce-scatter of the vector in `input` cut into `blocks` (indexed
// by ring position): in step s position r sends block r-1-s to the right
// and folds block r-2-s from the left into its running sum, so after n-1
// steps it owns block r in `own_dst`. The
// running sums live in `acc` at the block offsets when acc.count > 0 (as an
// AllReduce does with its Output), otherwise in scratch slots. Each block is
// summed at a single rank, in a fixed order.
struct RingReduceScatter {
  uint64_t chunks_per_block = 0;    // the most chunks any block has
  std::vector<uint32_t> own_ready;  // per chunk of block r: its last reduce
  std::vector<uint32_t> sends;      // [s * chunks_per_block + c]
};
RingReduceScatter ring_reduce_scatter(Emitter& e, const RingOrder& ring,
                                      const std::vector<Span>& blocks, uint64_t chunk,
                                      const Range& input, const Range& acc, const Range& own_dst);

// Ring allgather into `out` at the block offsets: position r's block starts at
// `own_src` (chunk c ready after own_ready[c], when given); step s forwards
// block r-s and receives block r-s-1, whose chunk c first waits for
// recv_after[s * chunks_per_block + c], when given.
void ring_allgather(Emitter& e, const RingOrder& ring, const std::vector<Span>& blocks,
                    uint64_t chunk, const Range& own_src, const std::vector<uint32_t>& own_ready,
                    const Range& out, const std::vector<uint32_t>& recv_after);

// Reduction towards the root of `links`, chunk by chunk: children's partial
// sums arrive in scratch slots and fold into `acc` (this rank's `input` first,
// then the children), which goes to the parent. With acc.count == 0 (a rank
// without an output buffer) the first child's slot accumulates instead.
// Leaves send `input` itself.
struct TreeReduce {
  std::vector<uint32_t> ready;  // per chunk: last step producing this rank's value
  std::vector<uint32_t> sent;   // per chunk: the send to the parent (kNone at the root)
};
TreeReduce tree_reduce(Emitter& e, const TreeLinks& links, const Range& input, const Range& acc,
                       uint64_t chunk);

// Broadcast from the root of `links`, chunk by chunk: the root sends
// `root_src`; other ranks receive into `dst` and forward it. Chunk c's first
// step waits for after[c], when given (the root: until its data is ready;
// the others: until `dst` may be overwritten).
void tree_broadcast(Emitter& e, const TreeLinks& links, const Range& root_src, const Range& dst,
                    uint64_t chunk, const std::vector<uint32_t>& after);

}  // namespace weft::algo::detail
