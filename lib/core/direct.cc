#include "core/direct.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>

#include "common/dtype.h"
#include "common/env.h"
#include "common/log.h"
#include "core/executor.h"
#include "transports/shm/cma.h"

namespace weft {

namespace {

constexpr size_t kLine = 64;
constexpr int64_t kDefaultStagingBytes = 4 << 20;
constexpr int64_t kMinStagingBytes = 4096;
// Below this, staging (one synchronisation) beats reading in place (two).
constexpr int64_t kDefaultZeroCopyBytes = 8192;
// Off: on the 2-core VM measured (docs/shared-memory.md) process_vm_readv,
// which pins the peer's pages one by one, copied 4-8 times slower than
// memcpy, and staging won at every size.
constexpr int64_t kDefaultCmaBytes = 0;
// Reductions run over pieces this large, so the result stays in cache across sources.
constexpr uint64_t kReduceChunkBytes = 64 << 10;
// Peers' segments kept mapped; beyond that the cache starts afresh.
constexpr size_t kMaxPeerMappings = 256;

size_t round_up(size_t bytes, size_t to) {
  return (bytes + to - 1) / to * to;
}

void copy_bytes(std::byte* dst, const std::byte* src, size_t bytes) {
  if (bytes != 0 && dst != src) memcpy(dst, src, bytes);
}

std::vector<uint8_t> to_blob(char kind, const std::string& text) {
  std::vector<uint8_t> blob(text.size() + 1);
  blob[0] = static_cast<uint8_t>(kind);
  if (!text.empty()) memcpy(blob.data() + 1, text.data(), text.size());
  return blob;
}

// Gathers every rank's outcome of a setup stage; fails on every rank if any failed.
Status agree(const DirectState::AllGather& allgather, const Status& mine,
             const std::string& payload, std::vector<std::string>* payloads) {
  std::vector<std::vector<uint8_t>> all;
  WEFT_RETURN_IF_ERROR(
      allgather(mine.ok() ? to_blob('+', payload) : to_blob('-', mine.message()), &all));
  payloads->clear();
  for (size_t q = 0; q < all.size(); ++q) {
    std::string text(all[q].begin() + (all[q].empty() ? 0 : 1), all[q].end());
    if (all[q].empty() || all[q][0] != '+') {
      if (!mine.ok()) return mine;
      return Error(weftSystemError, "shared memory: rank %zu failed: %s", q, text.c_str());
    }
    payloads->push_back(std::move(text));
  }
  return Status::Ok();
}

bool has_slots(algo::Collective collective) {
  return collective == algo::Collective::ReduceScatter ||
         collective == algo::Collective::AllToAll || collective == algo::Collective::AllToAllv;
}

// dst = source(0) op source(1) op ... op source(n-1), where source(q) points
// at rank q's first element; the order is fixed, so every rank gets the same bits.
template <typename Source>
void reduce_ranks(const JobMath& math, int n, std::byte* dst, uint64_t count, Source source) {
  const size_t e = math.element_size;
  if (n == 1) {
    copy_bytes(dst, source(0), count * e);
    return;
  }
  const uint64_t chunk = std::max<uint64_t>(1, kReduceChunkBytes / e);
  for (uint64_t begin = 0; begin < count; begin += chunk) {
    const uint64_t length = std::min(chunk, count - begin);
    const size_t at = begin * e;
    reduce::apply(math.dtype, math.op, dst + at, source(0) + at, source(1) + at, length);
    for (int q = 2; q < n; ++q)
      reduce::apply(math.dtype, math.op, dst + at, dst + at, source(q) + at, length);
  }
}

bool overlaps(const std::byte* a, size_t a_bytes, const std::byte* b, size_t b_bytes) {
  return a < b + b_bytes && b < a + a_bytes;
}

bool zero_copy_capable(const DirectCall& call) {
  switch (call.collective) {
    case algo::Collective::AllReduce:
      return call.algorithm == algo::Algorithm::OneShot;
    case algo::Collective::Reduce:
    case algo::Collective::AllGather:
    case algo::Collective::Broadcast:
    case algo::Collective::AllToAll:
      return true;
    default:
      return false;
  }
}

// Collectives whose peers only copy the input (a reduction would need it in place).
bool cma_capable(const DirectCall& call) {
  return call.collective == algo::Collective::AllGather ||
         call.collective == algo::Collective::Broadcast ||
         call.collective == algo::Collective::AllToAll;
}

uint64_t ceil_div(uint64_t a, uint64_t b) {
  return (a + b - 1) / b;
}

// Elements of a piece of `total` that fall in round `step` of `per_round`.
uint64_t piece(uint64_t total, uint64_t step, uint64_t per_round) {
  uint64_t begin = step * per_round;
  return begin >= total ? 0 : std::min(per_round, total - begin);
}

}  // namespace

// Each rank's segment starts with its control block; its staging follows.
// Fields that different ranks write sit on different cache lines.
struct DirectState::Control {
  // Per staging half: (last round published in it << 1) | whether this rank
  // needs another round. A peer one round ahead publishes in the other half,
  // so the round being read keeps its `more` bit.
  alignas(kLine) std::atomic<uint64_t> ready[2] = {0, 0};
  alignas(kLine) shm::Doorbell bell;
  // This rank's offer for a zero-copy-capable op: whether peers may read its
  // input in place and how (an Offer). The fields are written first, then
  // `offer_op` (the op's ticket + 1) is released.
  alignas(kLine) std::atomic<uint64_t> offer_op{0};
  std::atomic<uint32_t> offer_kind{0}, offer_pid{0};
  std::atomic<uint64_t> offer_serial{0}, offer_segment_bytes{0}, offer_offset{0}, offer_bytes{0};
  // The last zero-copy op in which this rank finished reading its peers' inputs.
  alignas(kLine) std::atomic<uint64_t> done{0};
  // The last kAnnounced collectives this rank launched, slot sequence % kAnnounced:
  // `sequence` holds sequence + 1 once `count` and `shape` are written (0 while
  // they change), so a reader that sees the same value before and after reading
  // them has a consistent announcement.
  static constexpr uint64_t kAnnounced = 8;
  struct Announced {
    std::atomic<uint64_t> sequence{0}, count{0}, shape{0};
  };
  alignas(kLine) Announced announced[kAnnounced];
};
static_assert(std::atomic<uint64_t>::is_always_lock_free);
constexpr size_t kControlBytes = 512;  // keeps the staging well aligned
static_assert(sizeof(DirectState::Control) <= kControlBytes);

struct DirectState::Offer {
  enum Kind : uint32_t {
    kRefused,   // the op is staged
    kUnneeded,  // peers read nothing of this rank
    kMapped,    // in weftMemAlloc segment (pid, serial) at `offset`
    kCma,       // at address `offset` of process `pid`, `bytes` long
  };
  Kind kind = kRefused;
  uint32_t pid = 0;
  uint64_t serial = 0, segment_bytes = 0, offset = 0, bytes = 0;
};

DirectState::~DirectState() = default;

Status DirectState::init(int rank, int nranks, bool same_node, const AllGather& allgather,
                         const Registry* registry) {
  rank_ = rank;
  nranks_ = nranks;
  registry_ = registry;
  zero_copy_bytes_ = static_cast<uint64_t>(
      std::max<int64_t>(0, env_int("WEFT_SHM_ZERO_COPY_BYTES", kDefaultZeroCopyBytes)));
  cma_bytes_ =
      static_cast<uint64_t>(std::max<int64_t>(0, env_int("WEFT_SHM_CMA_BYTES", kDefaultCmaBytes)));
  if (nranks > 1 && !same_node) return Status::Ok();
  if (nranks > 1 && env_int("WEFT_SHM_DISABLE", 0) != 0) {
    WEFT_LOG(INFO, INIT, "shared memory disabled by WEFT_SHM_DISABLE");
    return Status::Ok();
  }
  int64_t requested = env_int("WEFT_SHM_BYTES", kDefaultStagingBytes);
  if (requested < kMinStagingBytes)
    return Error(weftInvalidUsage, "WEFT_SHM_BYTES=%lld is below the minimum of %lld bytes",
                 static_cast<long long>(requested), static_cast<long long>(kMinStagingBytes));
  // Two halves, each with a slot per peer of at least a cache line.
  staging_bytes_ = round_up(std::max<size_t>(requested, 2 * nranks * kLine), 2 * kLine);
  size_t total = kControlBytes + staging_bytes_;

  std::vector<shm::Segment> segments(nranks);
  if (nranks == 1) {
    WEFT_RETURN_IF_ERROR(shm::Segment::anonymous(total, &segments[0]));
    new (segments[0].data()) Control();
  } else {
    // Stage 1: create, and learn the peers' names (every rank takes part even
    // after a failure, so that no peer waits for it).
    Status created = shm::Segment::create("weft", total, &segments[rank]);
    if (created.ok()) new (segments[rank].data()) Control();
    std::vector<std::string> names;
    WEFT_RETURN_IF_ERROR(agree(allgather, created, segments[rank].name(), &names));
    // Stage 2: attach to every peer; then nobody needs the names any more.
    Status opened;
    for (int q = 0; q < nranks && opened.ok(); ++q)
      if (q != rank) opened = shm::Segment::open(names[q], total, &segments[q]);
    // The probe word for CMA travels with this stage: its address and value,
    // and whether this rank would offer CMA at all.
    cma_probe_ = static_cast<uint64_t>(getpid()) << 32 ^ static_cast<uint64_t>(rank) ^
                 static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
    const SetupWords mine{static_cast<uint64_t>(getpid()), reinterpret_cast<uintptr_t>(&cma_probe_),
                          cma_probe_, cma_bytes_, zero_copy_bytes_};
    std::vector<std::string> words;
    Status attached = agree(
        allgather, opened, std::string(reinterpret_cast<const char*>(&mine), sizeof(mine)), &words);
    // Unlink every name (ENOENT is fine): a segment whose creator died
    // between the stages is still removed by the survivors.
    for (const std::string& name : names) shm::Segment::unlink_name(name);
    segments[rank].unlink();
    WEFT_RETURN_IF_ERROR(attached);
    std::vector<SetupWords> setups(nranks);
    for (int q = 0; q < nranks; ++q) {
      if (words[q].size() != sizeof(SetupWords))
        return Error(weftInternalError, "shared memory: rank %d sent a malformed setup", q);
      memcpy(&setups[q], words[q].data(), sizeof(SetupWords));
    }
    WEFT_RETURN_IF_ERROR(probe_cma(allgather, setups));
    // Below the largest of the ranks' smallest offer sizes some rank refuses every offer,
    // so such ops are staged without publishing offers (a synchronisation less per call).
    for (const SetupWords& setup : setups) {
      uint64_t smallest = setup.zero_copy_bytes;
      if (cma_ && setup.cma_bytes != 0) smallest = std::min(smallest, setup.cma_bytes);
      offer_floor_ = std::max(offer_floor_, smallest);
    }
  }
  segments_ = std::move(segments);
  for (const shm::Segment& segment : segments_)
    controls_.push_back(reinterpret_cast<Control*>(segment.data()));
  bell_.store(&controls_[rank]->bell, std::memory_order_release);
  WEFT_LOG(INFO, INIT, "rank %d: direct algorithms over %zu bytes of staging per rank%s", rank,
           staging_bytes_, nranks > 1 ? " in /dev/shm" : "");
  return Status::Ok();
}

DirectState::Control& DirectState::control(int rank) const {
  return *controls_[rank];
}

// The half of `rank`'s staging that the round in progress uses.
const std::byte* DirectState::staging(int rank) const {
  return segments_[rank].data() + kControlBytes + ((round_ + 1) % 2) * (staging_bytes_ / 2);
}

std::byte* DirectState::own_staging() const {
  return const_cast<std::byte*>(staging(rank_));
}

void DirectState::interrupt() {
  if (shm::Doorbell* bell = doorbell()) bell->interrupt();
}

void DirectState::ring_peers() const {
  // Only peers wait for what this rank publishes; one fence serves every doorbell.
  std::atomic_thread_fence(std::memory_order_seq_cst);
  for (int q = 0; q < nranks_; ++q)
    if (q != rank_) controls_[q]->bell.ring_fenced();
}

namespace {
uint64_t pack_shape(const CallShape& call) {
  return static_cast<uint64_t>(call.collective) | static_cast<uint64_t>(call.dtype) << 8 |
         static_cast<uint64_t>(call.op & 0xff) << 16 |
         static_cast<uint64_t>(static_cast<uint32_t>(call.root)) << 32;
}
CallShape unpack_shape(uint64_t shape, uint64_t count) {
  CallShape call;
  call.collective = static_cast<algo::Collective>(shape & 0xff);
  call.dtype = static_cast<weftDataType_t>((shape >> 8) & 0xff);
  call.op = static_cast<int>((shape >> 16) & 0xff);
  call.root = static_cast<int>(static_cast<uint32_t>(shape >> 32));
  call.count = count;
  return call;
}
}  // namespace

std::string describe_call(const CallShape& call) {
  static const char* const kOps[] = {"sum", "prod", "max", "min", "avg", "premulsum"};
  std::string text = algo::collective_name(call.collective);
  text += "(count=" + std::to_string(call.count) + ", " + dtype_name(call.dtype);
  bool reduction = call.collective == algo::Collective::AllReduce ||
                   call.collective == algo::Collective::ReduceScatter ||
                   call.collective == algo::Collective::Reduce;
  if (reduction) text += std::string(", ") + (call.op >= 0 && call.op <= 5 ? kOps[call.op] : "?");
  bool rooted = call.collective == algo::Collective::Broadcast ||
                call.collective == algo::Collective::Reduce ||
                call.collective == algo::Collective::Gather ||
                call.collective == algo::Collective::Scatter;
  if (rooted) text += ", root " + std::to_string(call.root);
  return text + ")";
}

void DirectState::announce(uint64_t sequence, const CallShape& call) {
  Control::Announced& slot = control(rank_).announced[sequence % Control::kAnnounced];
  slot.sequence.store(0, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  slot.count.store(call.count, std::memory_order_relaxed);
  slot.shape.store(pack_shape(call), std::memory_order_relaxed);
  slot.sequence.store(sequence + 1, std::memory_order_release);
}

std::string DirectState::mismatch(uint64_t sequence, const CallShape& call) const {
  const uint64_t mine = pack_shape(call);
  for (int q = 0; q < nranks_; ++q) {
    if (q == rank_) continue;
    const Control::Announced& slot = controls_[q]->announced[sequence % Control::kAnnounced];
    if (slot.sequence.load(std::memory_order_acquire) != sequence + 1) continue;
    uint64_t count = slot.count.load(std::memory_order_relaxed);
    uint64_t shape = slot.shape.load(std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_acquire);
    if (slot.sequence.load(std::memory_order_relaxed) != sequence + 1) continue;  // rewritten
    if (count == call.count && shape == mine) continue;
    return "mismatched collectives: rank " + std::to_string(q) + " called " +
           describe_call(unpack_shape(shape, count)) + " while rank " + std::to_string(rank_) +
           " called " + describe_call(call) + ", sequence " + std::to_string(sequence);
  }
  return "";
}

bool DirectState::peers_ready(uint64_t round, bool* more) const {
  *more = false;
  for (Control* peer : controls_) {
    uint64_t ready = peer->ready[round % 2].load(std::memory_order_acquire);
    if ((ready >> 1) < round) return false;
    *more = *more || (ready & 1) != 0;
  }
  return true;
}

uint64_t DirectState::slot_elements(const Job& job) const {
  size_t slots = has_slots(job.direct->collective) ? nranks_ : 1;
  return staging_bytes_ / 2 / (slots * job.math.element_size);
}

uint64_t DirectState::rounds(const Job& job) const {
  const DirectCall& call = *job.direct;
  uint64_t per_round = slot_elements(job);
  if (call.collective != algo::Collective::AllToAllv) {
    uint64_t chunks = ceil_div(call.count, per_round);
    return call.algorithm == algo::Algorithm::TwoShot ? 2 * chunks : chunks;
  }
  // Counts differ per rank: run as long as any rank needs (at least one round).
  uint64_t largest = 1;
  for (int q = 0; q < nranks_; ++q)
    largest = std::max({largest, call.send_counts[q], call.recv_counts[q]});
  return ceil_div(largest, per_round);
}

void DirectState::reduce_all(const Job& job, std::byte* dst, size_t offset_bytes,
                             uint64_t count) const {
  reduce_ranks(job.math, nranks_, dst, count, [&](int q) { return staging(q) + offset_bytes; });
}

bool DirectState::pack(const Job& job, const std::byte* input, uint64_t step) const {
  const DirectCall& call = *job.direct;
  const size_t e = job.math.element_size;
  const uint64_t per_round = slot_elements(job);
  std::byte* mine = own_staging();
  bool two_shot = call.algorithm == algo::Algorithm::TwoShot;
  uint64_t chunk = two_shot ? step / 2 : step;
  uint64_t begin = chunk * per_round, length = piece(call.count, chunk, per_round);
  switch (call.collective) {
    case algo::Collective::AllReduce:
      if (two_shot && step % 2 == 1) {
        // Second half: publish this rank's reduced slice.
        uint64_t slice_begin = length * rank_ / nranks_;
        uint64_t slice_end = length * (rank_ + 1) / nranks_;
        copy_bytes(mine + slice_begin * e, job.output + (begin + slice_begin) * e,
                   (slice_end - slice_begin) * e);
        break;
      }
      [[fallthrough]];
    case algo::Collective::Reduce:
    case algo::Collective::AllGather:
      copy_bytes(mine, input + begin * e, length * e);
      break;
    case algo::Collective::Broadcast:
      if (rank_ == call.root) copy_bytes(mine, input + begin * e, length * e);
      break;
    case algo::Collective::ReduceScatter:
    case algo::Collective::AllToAll:
      for (int p = 0; p < nranks_; ++p)
        copy_bytes(mine + p * per_round * e, input + (p * call.count + begin) * e, length * e);
      break;
    case algo::Collective::AllToAllv:
      for (int p = 0; p < nranks_; ++p)
        copy_bytes(mine + p * per_round * e, input + (call.send_displs[p] + step * per_round) * e,
                   piece(call.send_counts[p], step, per_round) * e);
      break;
    default:
      break;
  }
  return step + 1 < rounds(job);
}

void DirectState::unpack(const Job& job, uint64_t step) const {
  const DirectCall& call = *job.direct;
  const size_t e = job.math.element_size;
  const uint64_t per_round = slot_elements(job);
  bool two_shot = call.algorithm == algo::Algorithm::TwoShot;
  uint64_t chunk = two_shot ? step / 2 : step;
  uint64_t begin = chunk * per_round, length = piece(call.count, chunk, per_round);
  std::byte* out = job.output;
  switch (call.collective) {
    case algo::Collective::AllReduce:
      if (two_shot) {
        for (int q = 0; q < nranks_; ++q) {
          uint64_t slice_begin = length * q / nranks_, slice_end = length * (q + 1) / nranks_;
          size_t offset = slice_begin * e;
          if (step % 2 == 0 && q == rank_)  // first half: reduce this rank's slice
            reduce_all(job, out + begin * e + offset, offset, slice_end - slice_begin);
          else if (step % 2 == 1 && q != rank_)  // second half: gather the others'
            copy_bytes(out + begin * e + offset, staging(q) + offset,
                       (slice_end - slice_begin) * e);
        }
        break;
      }
      reduce_all(job, out + begin * e, 0, length);
      break;
    case algo::Collective::Reduce:
      if (rank_ == call.root) reduce_all(job, out + begin * e, 0, length);
      break;
    case algo::Collective::ReduceScatter:
      reduce_all(job, out + begin * e, rank_ * per_round * e, length);
      break;
    case algo::Collective::AllGather:
      for (int q = 0; q < nranks_; ++q)
        copy_bytes(out + (q * call.count + begin) * e, staging(q), length * e);
      break;
    case algo::Collective::Broadcast:
      // The root's own output already holds the data when the call is in place.
      copy_bytes(out + begin * e, staging(call.root), length * e);
      break;
    case algo::Collective::AllToAll:
      for (int q = 0; q < nranks_; ++q)
        copy_bytes(out + (q * call.count + begin) * e, staging(q) + rank_ * per_round * e,
                   length * e);
      break;
    case algo::Collective::AllToAllv:
      for (int q = 0; q < nranks_; ++q)
        copy_bytes(out + (call.recv_displs[q] + step * per_round) * e,
                   staging(q) + rank_ * per_round * e,
                   piece(call.recv_counts[q], step, per_round) * e);
      break;
    default:
      break;
  }
}

bool DirectState::advance(const Job& job, const std::byte* input, DirectRun* run,
                          bool* progressed) {
  if (tickets_done_.load(std::memory_order_acquire) != run->ticket) return false;
  Control& mine = control(rank_);
  // Ranks agree on whether an op has rounds at all; then it runs until no
  // rank needs another one.
  bool more = rounds(job) > 0;
  if (more && run->path == DirectRun::Path::Undecided && !choose_path(job, input, run))
    return false;
  if (run->path == DirectRun::Path::ZeroCopy) {
    if (!zero_copy(job, run, progressed)) return false;
    more = false;
  }
  while (more) {
    uint64_t round = round_ + 1;
    if (!run->published) {
      run->more = pack(job, input, run->step);
      mine.ready[round % 2].store(round << 1 | (run->more ? 1 : 0), std::memory_order_release);
      ring_peers();
      run->published = true;
    }
    if (!peers_ready(round, &more)) return false;
    unpack(job, run->step);
    round_ = round;
    ++run->step;
    run->published = false;
    *progressed = true;
  }
  tickets_done_.fetch_add(1, std::memory_order_release);
  mine.bell.ring();  // a later op of this communicator may sleep in another thread
  return true;
}

Status DirectState::probe_cma(const AllGather& allgather, const std::vector<SetupWords>& setups) {
  bool wanted = false;
  for (const SetupWords& setup : setups) wanted = wanted || setup.cma_bytes != 0;
  // Every rank sees the same probes, so all skip the round below alike.
  if (!wanted) return Status::Ok();
  std::string why;
  for (int q = 0; q < nranks_ && why.empty(); ++q) {
    if (q == rank_) continue;
    const SetupWords& setup = setups[q];
    uint64_t seen = 0;
    Status read =
        shm::cma_read(static_cast<pid_t>(setup.pid), setup.probe_address, &seen, sizeof(seen));
    if (!read.ok())
      why = "rank " + std::to_string(q) + ": " + read.message();
    else if (seen != setup.probe_value)  // another pid namespace: that pid is someone else
      why = "rank " + std::to_string(q) + "'s pid names another process here";
  }
  std::vector<std::vector<uint8_t>> flags;
  WEFT_RETURN_IF_ERROR(allgather({static_cast<uint8_t>(why.empty() ? 1 : 0)}, &flags));
  cma_ = true;
  for (size_t q = 0; q < flags.size(); ++q) {
    if (flags[q].size() == 1 && flags[q][0] == 1) continue;
    if (cma_ && why.empty()) why = "rank " + std::to_string(q) + " cannot read its peers";
    cma_ = false;
  }
  if (!cma_)
    WEFT_LOG(INFO, INIT, "rank %d: no cross-memory attach (%s): unregistered buffers are staged",
             rank_, why.c_str());
  return Status::Ok();
}

DirectState::Offer DirectState::offer_for(const Job& job, const std::byte* input) const {
  const DirectCall& call = *job.direct;
  const size_t bytes = call.count * job.math.element_size;
  const bool all_to_all = call.collective == algo::Collective::AllToAll;
  const size_t input_bytes = all_to_all ? nranks_ * bytes : bytes;
  const std::byte* out = job.output;
  const bool cma = cma_ && cma_bytes_ != 0 && cma_capable(call);
  // Ranks may differ in their thresholds: any refusal stages the op everywhere.
  if (bytes < (cma ? std::min(zero_copy_bytes_, cma_bytes_) : zero_copy_bytes_)) return {};
  if (call.collective == algo::Collective::Broadcast && rank_ != call.root)
    return {Offer::kUnneeded};
  // Peers read the input while this rank writes its output: they must not meet.
  bool apart = false;
  switch (call.collective) {
    case algo::Collective::AllReduce:
      apart = !overlaps(input, bytes, out, bytes);
      break;
    case algo::Collective::Reduce:
      apart = rank_ != call.root || !overlaps(input, bytes, out, bytes);
      break;
    case algo::Collective::AllGather:  // in place, this rank's own part is never written
      apart = input == out + rank_ * bytes || !overlaps(input, bytes, out, nranks_ * bytes);
      break;
    case algo::Collective::Broadcast:
      apart = input == out || !overlaps(input, bytes, out, bytes);
      break;
    case algo::Collective::AllToAll:
      apart = !overlaps(input, input_bytes, out, input_bytes);
      break;
    default:
      break;
  }
  if (!apart) return {};
  SharedLocation where;
  if (bytes >= zero_copy_bytes_ && registry_ != nullptr && registry_->covers(input, input_bytes) &&
      find_shared(input, input_bytes, &where))
    return {Offer::kMapped,      where.pid,    where.serial,
            where.segment_bytes, where.offset, input_bytes};
  if (cma && bytes >= cma_bytes_)
    return {Offer::kCma, static_cast<uint32_t>(getpid()),    0,
            0,           reinterpret_cast<uintptr_t>(input), input_bytes};
  return {};
}

bool DirectState::choose_path(const Job& job, const std::byte* input, DirectRun* run) {
  using Path = DirectRun::Path;
  if (!shared() || !zero_copy_capable(*job.direct) ||
      job.direct->count * job.math.element_size < offer_floor_) {
    run->path = Path::Staging;
    return true;
  }
  const uint64_t op = run->ticket + 1;
  if (!run->offered) {
    Offer offer = offer_for(job, input);
    Control& mine = control(rank_);
    mine.offer_kind.store(offer.kind, std::memory_order_relaxed);
    mine.offer_pid.store(offer.pid, std::memory_order_relaxed);
    mine.offer_serial.store(offer.serial, std::memory_order_relaxed);
    mine.offer_segment_bytes.store(offer.segment_bytes, std::memory_order_relaxed);
    mine.offer_offset.store(offer.offset, std::memory_order_relaxed);
    mine.offer_bytes.store(offer.bytes, std::memory_order_relaxed);
    mine.offer_op.store(op, std::memory_order_release);
    ring_peers();
    run->offered = true;
    // Every peer sees this refusal, so all of them stage the op too. A peer
    // does not overwrite its offer before this rank read it: its next op
    // needs this one finished, which needs this rank's part.
    if (offer.kind == Offer::kRefused) {
      run->path = Path::Staging;
      return true;
    }
  }
  for (Control* peer : controls_)
    if (peer->offer_op.load(std::memory_order_acquire) < op) return false;
  run->path = Path::ZeroCopy;
  for (Control* peer : controls_)
    if (peer->offer_kind.load(std::memory_order_relaxed) == Offer::kRefused)
      run->path = Path::Staging;
  if (run->path == Path::Staging) return true;
  Status mapped = map_inputs(job, input);
  if (!mapped.ok()) {
    // The peers read in place already: failing the communicator is the only way out.
    job.comm->fail(mapped.code(), mapped.message());
    return false;
  }
  return true;
}

Status DirectState::map_inputs(const Job& job, const std::byte* input) {
  if (peer_memory_.size() + nranks_ > kMaxPeerMappings) peer_memory_.clear();
  const DirectCall& call = *job.direct;
  const uint64_t blocks = call.collective == algo::Collective::AllToAll ? nranks_ : 1;
  const uint64_t input_bytes = blocks * call.count * job.math.element_size;
  sources_.assign(nranks_, Source{});
  for (int q = 0; q < nranks_; ++q) {
    if (q == rank_) {
      sources_[q].local = input;
      continue;
    }
    const Control& peer = control(q);
    const uint32_t pid = peer.offer_pid.load(std::memory_order_relaxed);
    const uint64_t offset = peer.offer_offset.load(std::memory_order_relaxed);
    const uint32_t kind = peer.offer_kind.load(std::memory_order_relaxed);
    // Reading past a peer's input would take another buffer's bytes (or fault).
    if (kind != Offer::kUnneeded && peer.offer_bytes.load(std::memory_order_relaxed) != input_bytes)
      return Error(
          weftInvalidUsage, "%s: rank %d offered %llu bytes of input, this rank's count needs %llu",
          algo::collective_name(call.collective), q,
          static_cast<unsigned long long>(peer.offer_bytes.load(std::memory_order_relaxed)),
          static_cast<unsigned long long>(input_bytes));
    switch (kind) {
      case Offer::kCma:
        sources_[q] = Source{nullptr, static_cast<pid_t>(pid), offset};
        break;
      case Offer::kMapped: {
        std::pair<uint32_t, uint64_t> key{pid, peer.offer_serial.load(std::memory_order_relaxed)};
        auto it = peer_memory_.find(key);
        if (it == peer_memory_.end()) {
          shm::Segment segment;
          WEFT_RETURN_IF_ERROR(shm::Segment::open(
              shared_memory_name(key.first, key.second),
              peer.offer_segment_bytes.load(std::memory_order_relaxed), &segment));
          it = peer_memory_.emplace(key, std::move(segment)).first;
        }
        sources_[q].local = it->second.data() + offset;
        break;
      }
      default:
        break;
    }
  }
  return Status::Ok();
}

Status DirectState::read_input(int q, size_t offset, std::byte* dst, size_t bytes) const {
  const Source& source = sources_[q];
  if (source.local != nullptr) {
    copy_bytes(dst, source.local + offset, bytes);
    return Status::Ok();
  }
  Status read = shm::cma_read(source.pid, source.address + offset, dst, bytes);
  if (!read.ok())
    return Error(weftRemoteError,
                 "shared memory: reading rank %d's input by cross-memory attach: %s", q,
                 read.message().c_str());
  return Status::Ok();
}

bool DirectState::zero_copy(const Job& job, DirectRun* run, bool* progressed) {
  const uint64_t op = run->ticket + 1;
  if (!run->read) {
    const DirectCall& call = *job.direct;
    const size_t bytes = call.count * job.math.element_size;
    std::byte* out = job.output;
    Status read;
    switch (call.collective) {
      case algo::Collective::AllReduce:
      case algo::Collective::Reduce:  // every input is mapped: CMA offers are refused
        if (call.collective == algo::Collective::AllReduce || rank_ == call.root)
          reduce_ranks(job.math, nranks_, out, call.count,
                       [&](int q) { return sources_[q].local; });
        break;
      case algo::Collective::AllGather:
        for (int q = 0; q < nranks_ && read.ok(); ++q)
          read = read_input(q, 0, out + q * bytes, bytes);
        break;
      case algo::Collective::Broadcast:
        read = read_input(call.root, 0, out, bytes);
        break;
      case algo::Collective::AllToAll:
        for (int q = 0; q < nranks_ && read.ok(); ++q)
          read = read_input(q, rank_ * bytes, out + q * bytes, bytes);
        break;
      default:
        break;
    }
    if (!read.ok()) {
      // A peer that died or unmapped its input: nothing else can end the op.
      job.comm->fail(read.code(), read.message());
      return false;
    }
    if (log_enabled(LogLevel::TRACE, kLogCOLL)) {
      int cma = 0;
      for (int q = 0; q < nranks_; ++q) cma += sources_[q].pid != 0;
      WEFT_LOG(TRACE, COLL, "direct %s op %llu: read in place, cma=%d peers",
               algo::collective_name(call.collective), static_cast<unsigned long long>(op), cma);
    }
    control(rank_).done.store(op, std::memory_order_release);
    ring_peers();
    run->read = true;
    *progressed = true;
  }
  // The input goes back to the user only once no peer reads it any more.
  for (Control* peer : controls_)
    if (peer->done.load(std::memory_order_acquire) < op) return false;
  return true;
}

std::string DirectState::describe(const DirectRun& run) const {
  if (run.path == DirectRun::Path::ZeroCopy)
    return std::string("direct in-place op (mapped or CMA): ") +
           (run.read ? "waiting for the peers to finish reading this rank's input"
                     : "reading the peers' inputs");
  if (run.offered && run.path == DirectRun::Path::Undecided)
    return "direct op: waiting for the peers' zero-copy offers";
  return "direct round " + std::to_string(run.step) + " with the ranks of this node";
}

}  // namespace weft
