#include "core/direct.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <chrono>
#include <cstring>
#include <optional>

#include "common/dtype.h"
#include "common/env.h"
#include "common/log.h"
#include "core/bootstrap_protocol.h"
#include "core/executor.h"
#include "core/staging_stores.h"
#include "transports/shm/cma.h"

namespace weft {

namespace {

constexpr size_t kLine = 64;
// The defaults of WEFT_SHM_* are in the environment table (common/env.cc); CMA's
// depends on the cores (kAutoCmaBytes).
constexpr uint64_t kMinStagingBytes = 4096;
constexpr size_t kControlBytes = 2048;  // keeps the staging well aligned
// What a ready word's cache line holds after the word (DirectState::Control::ReadyLine).
constexpr size_t kInlineBytes = kLine - sizeof(uint64_t);
// Announcements (mismatch detection) follow the control block: the last announced_slots()
// collectives this rank launched, slot sequence % that. A slot's words: sequence + 1
// once the call's words are written (0 while they change: a reader that sees the same
// value before and after reading them has a consistent call), the count, the packed shape,
// sequence + 1 once the next word holds the input's hash (WEFT_CHECK=full), then for
// AllToAllv the rank's send counts and receive counts, nranks each.
constexpr size_t kSlotSequence = 0, kSlotCount = 1, kSlotShape = 2, kSlotHashed = 3, kSlotHash = 4,
                 kSlotCounts = 5;
// A ready word's layout: the round above kRoundShift, the call's tag below it (bits 1 to 23,
// so that 2^40 rounds fit), whether the rank needs another round in bit 0.
constexpr unsigned kRoundShift = 24;
constexpr uint64_t kTagMask = (uint64_t{1} << (kRoundShift - 1)) - 1;
// Lanes: kLanes slots in the header (kShortLanes where /dev/shm is short), after the
// announcements. A Broadcast or Reduce of at most kLaneBytes takes one.
// A lane slot: its ready word, then its data (DirectState::LaneSlot), whole cache lines.
constexpr size_t kLaneSlotBytes = (sizeof(uint64_t) + kLaneBytes + kLine - 1) / kLine * kLine;
// Reductions run over pieces this large, so the result stays in cache across sources.
constexpr uint64_t kReduceChunkBytes = 64 << 10;
// The most ranks on a node whose communicator has point-to-point rings.
constexpr int kMaxPairRingRanks = 64;
// Peers' segments kept mapped; beyond that the cache starts afresh.
constexpr size_t kMaxPeerMappings = 256;

size_t round_up(size_t bytes, size_t to) {
  return (bytes + to - 1) / to * to;
}

// Words per announcement slot, whole cache lines.
size_t slot_words(int nranks) {
  return round_up(kSlotCounts + 2 * static_cast<size_t>(nranks), kLine / sizeof(uint64_t));
}

// A rank's rings in its segment: announcement slots (as many as fit 32 KiB, 16 where /dev/shm
// is short; a power of two, the slot a mask of the sequence on the call's path, from 8 to
// 2 * kLaneWindow) and lane slots (kLanes where the window can use them and /dev/shm has
// room, else kShortLanes). A rank whose streams run as many calls ahead of a peer as it has
// announcement slots (GPU calls return at enqueue) overwrites announcements the peer has not
// compared yet. Ranks may differ (they read the room at different moments): all use the
// fewest slots of each ring, the first ones of their own.
struct Rings {
  uint64_t announced = 0, lanes = 0;
  uint64_t pairs = 0;  // point-to-point slots per pair (shm::PairRings), 0: none
};

Rings rings_for(int nranks, bool short_of_room) {
  const size_t budget = short_of_room ? size_t{16} << 10 : size_t{32} << 10;
  const size_t fit = budget / (slot_words(nranks) * sizeof(uint64_t));
  Rings rings;
  rings.announced = 8;
  while (rings.announced < 2 * kLaneWindow && 2 * rings.announced <= fit) rings.announced *= 2;
  rings.lanes = !short_of_room && rings.announced == 2 * kLaneWindow ? kLanes : kShortLanes;
  // Where /dev/shm is short small sends and receives take the transport, as larger ones do;
  // so they do beyond kMaxPairRingRanks, where a rank's rings would outgrow 600 KiB.
  rings.pairs = short_of_room || nranks > kMaxPairRingRanks ? 0 : shm::PairRings::kSlots;
  return rings;
}

// How far a sender runs ahead, plus one: half of either ring, so that a peer that made
// another call still finds this rank's announcement of it and its word in its lane slot.
uint64_t window_of(const Rings& rings) {
  return std::min<uint64_t>({kLaneWindow, rings.announced / 2, rings.lanes / 2});
}

// Where the lane slots start in a rank's segment: after the control block and the
// announcements.
size_t lanes_offset(int nranks, const Rings& rings) {
  return round_up(kControlBytes + rings.announced * slot_words(nranks) * sizeof(uint64_t), kLine);
}

// Where the point-to-point rings start: after the lane slots.
size_t pairs_offset(int nranks, const Rings& rings) {
  return lanes_offset(nranks, rings) + rings.lanes * kLaneSlotBytes;
}

// What precedes the staging in a rank's segment: the control block, the announcements, the
// lane slots and the point-to-point rings.
size_t header_bytes(int nranks, const Rings& rings) {
  return round_up(pairs_offset(nranks, rings) + shm::PairRings::region_bytes(nranks, rings.pairs),
                  kControlBytes);
}

}  // namespace

uint64_t DirectState::lane_window_for(int nranks) {
  return window_of(rings_for(nranks, false));
}

namespace {

// WEFT_CHECK, or on when unset; a value that does not parse fails init.
Status read_check_mode(CheckMode* mode) {
  const EnvVar& var = env_var("WEFT_CHECK");
  std::optional<std::string> text = env_string(var.name);
  *mode = CheckMode::On;
  if (!text) return Status::Ok();
  std::string expected;
  std::optional<uint64_t> value = parse_env_value(var, *text, &expected);
  if (!value)
    return Error(weftInvalidArgument, "WEFT_CHECK=%s is not %s", text->c_str(), expected.c_str());
  *mode = static_cast<CheckMode>(*value);
  return Status::Ok();
}

const char* check_mode_name(uint64_t mode) {
  switch (static_cast<CheckMode>(mode)) {
    case CheckMode::Off:
      return "off";
    case CheckMode::On:
      return "on";
    case CheckMode::Full:
      return "full";
  }
  return "an unknown mode";
}

void copy_bytes(std::byte* dst, const std::byte* src, size_t bytes) {
  if (bytes != 0 && dst != src) memcpy(dst, src, bytes);
}

// The last-level cache the staging and the streamed outputs are sized against:
// WEFT_CACHE_BYTES, or what sysfs lists for the CPU this process first asked from. One CPU's
// cache, though the node's ranks may be spread over several (sockets, AMD's per-CCX L3).
uint64_t node_cache_bytes() {
  if (std::optional<uint64_t> set = env_value_if_set("WEFT_CACHE_BYTES", "the CPU's")) return *set;
  static const uint64_t listed = last_level_cache_bytes(
      "/sys/devices/system/cpu/cpu" + std::to_string(std::max(sched_getcpu(), 0)) + "/cache");
  return listed;
}

// A copy into this rank's own staging, streamed when the round is (stores_, a TimedChoice).
void stage_bytes(std::byte* dst, const std::byte* src, size_t bytes, bool streamed) {
  if (streamed)
    copy_streaming(dst, src, bytes);
  else
    copy_bytes(dst, src, bytes);
}

using Clock = std::chrono::steady_clock;

double micros_since(Clock::time_point start) {
  return std::chrono::duration<double, std::micro>(Clock::now() - start).count();
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

// reduce_ranks for two ranks or more.
template <typename Source>
void reduce_ranks_of(const JobMath& math, int n, std::byte* dst, uint64_t count, Source source) {
  const size_t e = math.element_size;
  const uint64_t chunk = std::max<uint64_t>(1, kReduceChunkBytes / e);
  for (uint64_t begin = 0; begin < count; begin += chunk) {
    const uint64_t length = std::min(chunk, count - begin);
    const size_t at = begin * e;
    reduce::apply(math.dtype, math.op, dst + at, source(0) + at, source(1) + at, length);
    for (int q = 2; q < n; ++q)
      reduce::apply(math.dtype, math.op, dst + at, dst + at, source(q) + at, length);
  }
}

// dst = source(0) op source(1) op ... op source(n-1), where source(q) points
// at rank q's first element; the order is fixed, so every rank gets the same bits.
// Inline: a rank alone copies.
template <typename Source>
inline void reduce_ranks(const JobMath& math, int n, std::byte* dst, uint64_t count,
                         Source source) {
  if (n == 1)
    copy_bytes(dst, source(0), count * math.element_size);
  else
    reduce_ranks_of(math, n, dst, count, source);
}

bool overlaps(const std::byte* a, size_t a_bytes, const std::byte* b, size_t b_bytes) {
  return a < b + b_bytes && b < a + a_bytes;
}

// Whether an AllToAll's own block can go straight from its input to its output instead of
// through the staging: in place it is there already, and disjoint buffers cannot overwrite
// what is still to be read (partly overlapping ones could).
bool own_block_direct(const std::byte* input, const std::byte* output, size_t bytes) {
  return input == output || !overlaps(input, bytes, output, bytes);
}

bool zero_copy_capable(const DirectCall& call) {
  switch (call.collective) {
    case algo::Collective::AllReduce:  // TwoShot in two phases (DirectState::offer_for)
      return call.algorithm == algo::Algorithm::OneShot ||
             call.algorithm == algo::Algorithm::TwoShot;
    case algo::Collective::Reduce:
    case algo::Collective::AllGather:
    case algo::Collective::Broadcast:
    case algo::Collective::AllToAll:
      return true;
    default:
      return false;
  }
}

// Collectives whose peers copy the input, and AllReduce, whose peers reduce what they read
// piece by piece from a scratch (DirectState::reduce_read_inputs). A Reduce's root alone
// would read and reduce every input while its peers idle; staged, they copy in parallel.
bool cma_capable(algo::Collective collective) {
  return collective == algo::Collective::AllGather || collective == algo::Collective::Broadcast ||
         collective == algo::Collective::AllToAll || collective == algo::Collective::AllReduce;
}

size_t collective_index(algo::Collective collective) {
  return static_cast<size_t>(collective);
}

uint64_t ceil_div(uint64_t a, uint64_t b) {
  return (a + b - 1) / b;
}

// Elements of a piece of `total` that fall in round `step` of `per_round`.
uint64_t piece(uint64_t total, uint64_t step, uint64_t per_round) {
  uint64_t begin = step * per_round;
  return begin >= total ? 0 : std::min(per_round, total - begin);
}

// The room-sized default: a communicator takes at most this share of what is
// free in /dev/shm when its ranks set up (1/64: 64 communicators leave a third
// of it), so that dozens fit in a container's 64 MB, each later one getting a
// little less, instead of the first few taking it all and the rest falling
// back to the message path.
constexpr uint64_t kRoomShare = 64;
constexpr uint64_t kPage = 4096;
constexpr uint64_t kMinCacheStaging = 512 * 1024;

// What /dev/shm has free, and this rank's share of it, when that share is less than
// `requested` bytes of staging and WEFT_SHM_BYTES was not set (an explicit value is taken as
// asked; no room: the message path).
struct ShortRoom {
  uint64_t free = 0, share = 0;
};
std::optional<ShortRoom> short_room(uint64_t requested, int nranks) {
  std::optional<uint64_t> room = shm::free_bytes();
  if (nranks == 1 || !room || env_string("WEFT_SHM_BYTES")) return std::nullopt;
  const uint64_t share = *room / (kRoomShare * static_cast<uint64_t>(nranks));
  if (share >= requested) return std::nullopt;
  return ShortRoom{*room, share};
}

// The default staging, `largest` (WEFT_SHM_BYTES's default) unless the last-level cache is
// small for the node's ranks: then cache / (2 * nranks), so that a round of every rank
// (half the staging) takes at most a quarter of the cache, and the buffers the rounds are
// copied from and into keep the rest. With 4 ranks on this VM's 8 MiB L3, 4 MiB of staging
// per rank (8 MiB of rounds in flight) ran 4-64 MiB ops of every collective 1.15-1.6x slower
// than 1 MiB of staging did, and 2 ranks 1.05-1.3x slower than with 2 MiB (docs/shared-memory.md,
// "Rounds sized to the cache"). Not below kMinCacheStaging: 256 KiB at 4 ranks ran 1.1-1.2x
// slower than 512 KiB, its rounds costing a synchronisation each.
uint64_t cache_sized_staging(uint64_t largest, int nranks, uint64_t cache) {
  if (cache == 0) return largest;
  const uint64_t fitting = cache / (2 * static_cast<uint64_t>(nranks)) / kPage * kPage;
  return std::min(largest, std::max(fitting, kMinCacheStaging));
}

// This rank's staging bytes: `requested`, or its share of a short /dev/shm (then one WARN
// per process).
size_t staging_size(uint64_t requested, const std::optional<ShortRoom>& room, int nranks, int rank,
                    size_t header) {
  uint64_t bytes = requested;
  if (room) {
    // Whole pages with the header (tmpfs reserves pages), and never less than the header's.
    bytes = std::max((room->share + header) / kPage * kPage, round_up(header, kPage)) - header;
    static std::atomic<bool> warned{false};
    if (!warned.exchange(true))
      WEFT_LOG(WARN, INIT,
               "rank %d: /dev/shm has %llu bytes free: direct-path staging of %llu bytes per "
               "rank instead of %llu (larger messages take more rounds; enlarge /dev/shm or "
               "set WEFT_SHM_BYTES)",
               rank, static_cast<unsigned long long>(room->free),
               static_cast<unsigned long long>(bytes), static_cast<unsigned long long>(requested));
  }
  return round_up(std::max<size_t>(bytes, 2 * nranks * kLine), 2 * kLine);
}

}  // namespace

// Each rank's segment starts with its control block; its staging follows.
// Fields that different ranks write sit on different cache lines.
struct DirectState::Control {
  // Per staging half: (last round published in it << kRoundShift) | the call's tag
  // (Job::ready_tag) << 1 | whether this rank needs another round. A peer one round ahead
  // publishes in the other half, so the round being read keeps its `more` bit.
  // A small op's one round travels in the rest of the word's cache line (inline_op): a peer
  // then takes a single cache miss for the word and the data, not one for each.
  struct alignas(kLine) ReadyLine {
    std::atomic<uint64_t> word{0};
    std::byte data[kInlineBytes];
  };
  ReadyLine ready[2];
  // The CPU this rank last published from (sched_getcpu; -1: unknown), written before
  // `ready` or `offer_op` when it changed (note_cpu).
  alignas(kLine) std::atomic<int32_t> cpu{-1};
  alignas(kLine) shm::Doorbell bell;
  // This rank's offer for a zero-copy-capable op: whether peers may read its
  // input in place and how (an Offer). The fields are written first, then
  // `offer_op` (the op's ticket + 1) is released.
  alignas(kLine) std::atomic<uint64_t> offer_op{0};
  std::atomic<uint32_t> offer_kind{0}, offer_pid{0};
  std::atomic<uint64_t> offer_serial{0}, offer_segment_bytes{0}, offer_offset{0}, offer_bytes{0};
  // An AllReduce's: its output's address, and whether it needs the two phases.
  std::atomic<uint64_t> offer_output{0};
  std::atomic<uint32_t> offer_two_phase{0};
  // The last zero-copy op in which this rank finished reading its peers' inputs; the last
  // two-phase AllReduce whose slice it reduced.
  alignas(kLine) std::atomic<uint64_t> done{0};
  std::atomic<uint64_t> reduced{0};
  // Per lane slot: the last lane round this rank published in it, its call's tag below it
  // as in a ready word (after the slot's own word when it writes one). What a sender acks:
  // eight rounds to a line, a sender's look at them moves a line every eight calls.
  alignas(kLine) std::atomic<uint64_t> lane_ready[kLanes] = {};
};
static_assert(std::atomic<uint64_t>::is_always_lock_free);
static_assert(sizeof(DirectState::Control) <= kControlBytes);

// A lane slot's own word leads its data on one cache line, for the rank that reads it: a
// small call then moves one line to it, not two.
struct alignas(kLine) DirectState::LaneSlot {
  // lane_ready's word for the last round whose data this rank wrote here (the data first).
  std::atomic<uint64_t> word{0};
  std::byte data[kLaneBytes];
};
static_assert(sizeof(DirectState::LaneSlot) == kLaneSlotBytes);

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
  uint64_t output = 0;     // an AllReduce's output, at this address of this rank's process
  bool two_phase = false;  // an AllReduce read in two phases (DirectRun::two_phase)
};

CmaThresholds cma_thresholds(std::optional<uint64_t> set, bool oversubscribed) {
  CmaThresholds thresholds{};
  for (size_t c = 0; c < thresholds.size(); ++c)
    if (cma_capable(static_cast<algo::Collective>(c)))
      thresholds[c] = set ? *set : oversubscribed ? 0 : kAutoCmaBytes;
  if (!set && oversubscribed)
    thresholds[collective_index(algo::Collective::AllToAll)] = kOversubscribedAllToAllCmaBytes;
  return thresholds;
}

DirectState::~DirectState() = default;

Status DirectState::init(int rank, int nranks, bool same_node, bool oversubscribed,
                         const AllGather& allgather, const Registry* registry) {
  rank_ = rank;
  nranks_ = nranks;
  registry_ = registry;
  WEFT_RETURN_IF_ERROR(read_check_mode(&check_));
  slot_words_ = slot_words(nranks);
  zero_copy_bytes_ = env_value("WEFT_SHM_ZERO_COPY_BYTES");
  const std::optional<uint64_t> cma_bytes = env_value_if_set("WEFT_SHM_CMA_BYTES", "the default");
  cma_bytes_ = cma_thresholds(cma_bytes, oversubscribed);
  // A threshold the user set is kept as set; the default is a floor for the timed choice,
  // but where ranks share cores (they would time each other's time slices) a fixed window.
  cma_chosen_ = !cma_bytes && !oversubscribed;
  if (!cma_bytes && oversubscribed) cma_buffer_bound_ = node_cache_bytes();
  cma_choices_.fill(TimedChoice(kCmaMargin, TimedChoice::Probe::Alternate, kCmaWarmup));
  stores_.fill(TimedChoice(kStreamingMargin, TimedChoice::Probe::OtherWay));
  // Probes alike on every rank: an op's time includes its peers' copies, so a rank's figure
  // for a way is only clean while the peers take it too.
  copy_stores_.fill(TimedChoice(kCopyStreamingMargin, TimedChoice::Probe::Alternate));
  // Ranks that share cores time each other's time slices, not the stores.
  const uint64_t stream_bytes =
      oversubscribed || !streaming_stores_available() ? 0 : env_value("WEFT_SHM_STREAM_BYTES");
  stream_floor_ = stream_bytes == 0 ? UINT64_MAX : stream_bytes;
  const uint64_t cache = node_cache_bytes();
  output_stream_floor_ =
      !streaming_stores_available() || env_value("WEFT_SHM_STREAM_BYTES") == 0 || cache == 0
          ? UINT64_MAX
          : cache;
  two_phase_floor_ = cache == 0 ? UINT64_MAX : cache / 2;
  if (nranks > 1 && !same_node) {
    unavailable_reason_ = "this communicator's ranks are on several nodes";
    return Status::Ok();
  }
  if (nranks > 1 && env_value("WEFT_SHM_DISABLE") != 0) {
    WEFT_LOG(INFO, INIT, "shared memory disabled by WEFT_SHM_DISABLE");
    unavailable_reason_ = "WEFT_SHM_DISABLE is set";
    return Status::Ok();
  }
  const uint64_t requested = env_string("WEFT_SHM_BYTES")
                                 ? env_value("WEFT_SHM_BYTES")
                                 : cache_sized_staging(env_value("WEFT_SHM_BYTES"), nranks, cache);
  if (requested < kMinStagingBytes)
    return Error(weftInvalidUsage, "WEFT_SHM_BYTES=%llu is below the minimum of %llu bytes",
                 static_cast<unsigned long long>(requested),
                 static_cast<unsigned long long>(kMinStagingBytes));
  // Two halves, each with a slot per peer of at least a cache line. Where /dev/shm is short
  // the rings are too.
  const std::optional<ShortRoom> room = short_room(requested, nranks);
  const Rings rings = rings_for(nranks, room.has_value());
  header_bytes_ = header_bytes(nranks, rings);
  staging_bytes_ = staging_size(requested, room, nranks, rank, header_bytes_);
  size_t total = header_bytes_ + staging_bytes_;
  // By rank: where its staging and its lanes start.
  std::vector<size_t> headers(nranks, header_bytes_);
  std::vector<size_t> lane_offsets(nranks, lanes_offset(nranks, rings));
  std::vector<size_t> pair_offsets(nranks, pairs_offset(nranks, rings));
  Rings agreed_rings = rings;

  std::vector<shm::Segment> segments(nranks);
  if (nranks == 1) {
    WEFT_RETURN_IF_ERROR(shm::Segment::anonymous(total, &segments[0]));
    new (segments[0].data()) Control();  // never announces: no peer would read it
    shm::PairRings::construct(segments[0].data() + pair_offsets[0], nranks, rings.pairs);
  } else {
    // Stage 1: create, and learn the peers' names (every rank takes part even
    // after a failure, so that no peer waits for it).
    Status created = shm::Segment::create("weft", total, &segments[rank]);
    if (created.ok()) {
      new (segments[rank].data()) Control();
      auto* words = reinterpret_cast<std::atomic<uint64_t>*>(segments[rank].data() + kControlBytes);
      for (size_t i = 0; i < rings.announced * slot_words_; ++i)
        new (&words[i]) std::atomic<uint64_t>(0);
      shm::PairRings::construct(segments[rank].data() + pair_offsets[rank], nranks, rings.pairs);
    }
    // Each name travels after its segment's size and rings: ranks may have sized theirs to
    // different room, and all use the smallest staging and the fewest slots.
    std::vector<std::string> names;
    const uint64_t own_sizes[4] = {total, rings.announced, rings.lanes, rings.pairs};
    Status agreed = agree(allgather, created,
                          std::string(reinterpret_cast<const char*>(own_sizes), sizeof(own_sizes)) +
                              segments[rank].name(),
                          &names);
    if (!agreed.ok() && agreed.code() == weftSystemError) {
      // Some rank found no room (or no /dev/shm): the communicator still works, on the
      // message path. Every rank saw the same outcome, so all of them go this way.
      segments[rank].unlink();
      unavailable_reason_ = "shared memory could not be set up: " + agreed.message();
      static std::atomic<bool> warned{false};
      if (!warned.exchange(true))
        WEFT_LOG(WARN, INIT,
                 "rank %d: %s; communicators without room in /dev/shm use the message path "
                 "(slower within a node)",
                 rank, unavailable_reason_.c_str());
      return Status::Ok();
    }
    WEFT_RETURN_IF_ERROR(agreed);
    std::vector<uint64_t> totals(nranks);
    for (int q = 0; q < nranks; ++q) {
      uint64_t sizes[4] = {0, 0, 0, 0};
      if (names[q].size() > sizeof(sizes)) memcpy(sizes, names[q].data(), sizeof(sizes));
      const Rings theirs{sizes[1], sizes[2], sizes[3]};
      const bool announced_valid = theirs.announced >= 8 && theirs.announced <= 2 * kLaneWindow &&
                                   (theirs.announced & (theirs.announced - 1)) == 0;
      const bool lanes_valid = (theirs.lanes == kLanes || theirs.lanes == kShortLanes) &&
                               (theirs.pairs == 0 || theirs.pairs == shm::PairRings::kSlots);
      headers[q] = header_bytes(nranks, theirs);
      if (!announced_valid || !lanes_valid || sizes[0] <= headers[q])
        return Error(weftInternalError, "shared memory: rank %d sent a malformed name", q);
      totals[q] = sizes[0];
      lane_offsets[q] = lanes_offset(nranks, theirs);
      pair_offsets[q] = pairs_offset(nranks, theirs);
      agreed_rings.announced = std::min(agreed_rings.announced, theirs.announced);
      agreed_rings.lanes = std::min(agreed_rings.lanes, theirs.lanes);
      agreed_rings.pairs = std::min(agreed_rings.pairs, theirs.pairs);
      names[q].erase(0, sizeof(sizes));
      staging_bytes_ = std::min<size_t>(staging_bytes_, totals[q] - headers[q]);
    }
    // Stage 2: attach to every peer; then nobody needs the names any more.
    Status opened;
    for (int q = 0; q < nranks && opened.ok(); ++q)
      if (q != rank) opened = shm::Segment::open(names[q], totals[q], &segments[q]);
    // The probe word for CMA travels with this stage: its address and value,
    // and whether this rank would offer CMA at all.
    cma_probe_ = static_cast<uint64_t>(getpid()) << 32 ^ static_cast<uint64_t>(rank) ^
                 static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
    const SetupWords mine{static_cast<uint64_t>(getpid()),
                          reinterpret_cast<uintptr_t>(&cma_probe_),
                          cma_probe_,
                          zero_copy_bytes_,
                          static_cast<uint64_t>(check_),
                          cma_bytes_,
                          cma_buffer_bound_};
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
    // A rank that compares nothing (off) or hashes inputs (full) while its peers do otherwise
    // would leave mismatches undetected on some ranks: every rank names the same first pair.
    for (int q = 1; q < nranks; ++q)
      if (setups[q].check != setups[0].check)
        return Error(weftInvalidUsage,
                     "WEFT_CHECK differs between ranks: rank %d has %s while rank 0 has %s (set "
                     "the same value on every rank)",
                     q, check_mode_name(setups[q].check), check_mode_name(setups[0].check));
    WEFT_RETURN_IF_ERROR(probe_cma(allgather, setups));
    for (const SetupWords& setup : setups) pids_.push_back(static_cast<pid_t>(setup.pid));
    for (size_t c = 0; c < cma_floors_.size(); ++c) {
      // Below the largest of the ranks' smallest offer sizes some rank refuses every offer,
      // so such ops are staged without publishing offers (a synchronisation less per call).
      // A rank with CMA off for the collective refuses such offers: then every op of it
      // at least that large is staged too.
      bool every_rank_offers = cma_;
      for (const SetupWords& setup : setups) {
        uint64_t smallest = setup.zero_copy_bytes;
        if (cma_ && setup.cma_bytes[c] != 0) smallest = std::min(smallest, setup.cma_bytes[c]);
        offer_floors_[c] = std::max(offer_floors_[c], smallest);
        every_rank_offers = every_rank_offers && setup.cma_bytes[c] != 0;
        cma_floors_[c] = std::max(cma_floors_[c], setup.cma_bytes[c]);
      }
      if (!every_rank_offers) cma_floors_[c] = 0;
    }
    // Where ranks share cores an AllToAll is read by CMA only while its buffers fit the
    // cache: the cost model, whose single copy has no ceiling, keeps timing it staged. Any
    // rank's bound counts, so that every rank's tuner decides alike.
    for (const SetupWords& setup : setups)
      if (setup.cma_buffer_bound != UINT64_MAX)
        cma_floors_[collective_index(algo::Collective::AllToAll)] = 0;
  }
  // The header's pages (control, announcements, lanes) are mapped now, so that the first
  // small calls take no page fault; the staging's at the first op that writes them
  // (prefault_staging).
  if (!segments[rank].prefault(0, header_bytes_))
    WEFT_LOG(INFO, INIT, "rank %d: staging not prefaulted (no MADV_POPULATE): first calls fault",
             rank);
  segments_ = std::move(segments);
  for (int q = 0; q < nranks; ++q) {
    std::byte* segment = segments_[q].data();
    controls_.push_back(reinterpret_cast<Control*>(segment));
    announcements_.push_back(reinterpret_cast<std::atomic<uint64_t>*>(segment + kControlBytes));
    stagings_.push_back(segment + headers[q]);
    lanes_.push_back(reinterpret_cast<LaneSlot*>(segment + lane_offsets[q]));
  }
  std::vector<std::byte*> pair_regions;
  std::vector<shm::Doorbell*> bells;
  for (int q = 0; q < nranks; ++q) {
    pair_regions.push_back(segments_[q].data() + pair_offsets[q]);
    bells.push_back(&controls_[q]->bell);
  }
  pair_rings_.attach(rank, nranks, agreed_rings.pairs, std::move(pair_regions), std::move(bells));
  announced_mask_ = agreed_rings.announced - 1;
  lane_count_ = agreed_rings.lanes;
  lane_window_ = window_of(agreed_rings);
  half_bytes_ = staging_bytes_ / 2;
  bell_.store(&controls_[rank]->bell, std::memory_order_release);
  WEFT_LOG(INFO, INIT, "rank %d: direct algorithms over %zu bytes of staging per rank%s", rank,
           staging_bytes_, nranks > 1 ? " in /dev/shm" : "");
  return Status::Ok();
}

// The helpers of advance() are inline: it runs on every direct call, and a call to each
// costs as much as its work (docs/performance.md, "Small-message fast path").
inline DirectState::Control& DirectState::control(int rank) const {
  return *controls_[rank];
}

// The half of `rank`'s staging that the round in progress uses.
inline const std::byte* DirectState::staging(int rank, const DirectRun& run) const {
  const uint64_t half = (round_ + 1) % 2;
  if (run.inline_data) return controls_[rank]->ready[half].data;
  return stagings_[rank] + half * half_bytes_;
}

inline std::byte* DirectState::own_staging(const DirectRun& run) const {
  return const_cast<std::byte*>(staging(rank_, run));
}

inline void DirectState::note_cpu() const {
  if (nranks_ == 1) return;
  // Stored only when it changed: a store would take the line back from a peer that read it.
  const int cpu = sched_getcpu();
  std::atomic<int32_t>& noted = control(rank_).cpu;
  if (noted.load(std::memory_order_relaxed) != cpu) noted.store(cpu, std::memory_order_relaxed);
}

bool DirectState::shares_cpu_with_peer() const {
  if (!shared()) return false;
  const int cpu = sched_getcpu();
  for (int q = 0; q < nranks_; ++q)
    if (q != rank_ && controls_[q]->cpu.load(std::memory_order_relaxed) == cpu) return true;
  return false;
}

bool DirectState::awaited_elsewhere(const DirectRun& run) const {
  if (!shared() || run.path != DirectRun::Path::Staging || !run.published) return false;
  const uint64_t round = round_ + 1;
  const int cpu = sched_getcpu();
  for (int q = 0; q < nranks_; ++q) {
    if (q == rank_) continue;
    const Control& peer = control(q);
    if ((peer.ready[round % 2].word.load(std::memory_order_acquire) >> kRoundShift) >= round)
      continue;
    const int noted = peer.cpu.load(std::memory_order_relaxed);
    if (noted < 0 || noted == cpu) return false;
  }
  return true;
}

void DirectState::interrupt() {
  if (shm::Doorbell* bell = doorbell()) bell->interrupt();
}

inline void DirectState::ring_peers() const {
  // Only peers wait for what this rank publishes; one fence serves every doorbell.
  if (nranks_ == 1) return;
  std::atomic_thread_fence(std::memory_order_seq_cst);
  for (int q = 0; q < nranks_; ++q)
    if (q != rank_) controls_[q]->bell.ring_fenced();
}

namespace {
// The collective is the packed word's low byte.
static_assert(std::endian::native == std::endian::little, "pack_shape's layout");
constexpr uint64_t kAllToAllvShape = static_cast<uint64_t>(algo::Collective::AllToAllv);
uint64_t pack_shape(const CallShape& call) {
  uint64_t word;
  memcpy(&word, &call, sizeof(word));
  return word;
}
// The call's sequence, count and shape hashed to the ready word's tag bits (a
// multiply-xorshift: calls that differ in any of them differ in the tag but for one pair
// in 2^23).
uint64_t ready_tag(uint64_t sequence, uint64_t count, uint64_t shape) {
  uint64_t word = (sequence * 0x9E3779B97F4A7C15ull ^ count) * 0xFF51AFD7ED558CCDull;
  return ((word ^ shape) * 0xC4CEB9FE1A85EC53ull) >> (64 - (kRoundShift - 1));
}
CallShape unpack_shape(uint64_t shape, uint64_t count) {
  CallShape call;
  call.collective = static_cast<algo::Collective>(shape & 0xff);
  call.dtype = static_cast<uint8_t>(shape >> 8);
  call.op = static_cast<uint8_t>(shape >> 16);
  call.root = static_cast<int32_t>(shape >> 32);
  call.count = count;
  return call;
}
}  // namespace

std::string describe_call(const CallShape& call) {
  static const char* const kOps[] = {"sum", "prod", "max", "min", "avg", "premulsum"};
  std::string text = algo::collective_name(call.collective);
  text += "(count=" + std::to_string(call.count) + ", " +
          dtype_name(static_cast<weftDataType_t>(call.dtype));
  bool reduction = call.collective == algo::Collective::AllReduce ||
                   call.collective == algo::Collective::ReduceScatter ||
                   call.collective == algo::Collective::Reduce;
  if (reduction) text += std::string(", ") + (call.op <= 5 ? kOps[call.op] : "?");
  bool rooted = call.collective == algo::Collective::Broadcast ||
                call.collective == algo::Collective::Reduce ||
                call.collective == algo::Collective::Gather ||
                call.collective == algo::Collective::Scatter;
  if (rooted) text += ", root " + std::to_string(call.root);
  return text + ")";
}

inline std::atomic<uint64_t>* DirectState::announcement(int rank, uint64_t sequence) const {
  return announcements_[rank] + (sequence & announced_mask_) * slot_words_;
}

void DirectState::announce(Job& job) {
  job.announced_shape = announce(job.sequence, job.shape, job.alltoallv_counts);
  job.ready_tag = ready_tag(job.sequence, job.shape.count, job.announced_shape);
}

uint64_t DirectState::announce(uint64_t sequence, const CallShape& call,
                               const uint64_t* alltoallv_counts) {
  std::atomic<uint64_t>* slot = announcement(rank_, sequence);
  const uint64_t shape = pack_shape(call);
  slot[kSlotSequence].store(0, std::memory_order_relaxed);
  slot[kSlotHashed].store(0, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  slot[kSlotCount].store(call.count, std::memory_order_relaxed);
  slot[kSlotShape].store(shape, std::memory_order_relaxed);
  if (alltoallv_counts != nullptr)
    for (size_t i = 0; i < 2 * static_cast<size_t>(nranks_); ++i)
      slot[kSlotCounts + i].store(alltoallv_counts[i], std::memory_order_relaxed);
  slot[kSlotSequence].store(sequence + 1, std::memory_order_release);
  return shape;
}

void DirectState::announce_input_hash(uint64_t sequence, uint64_t hash) {
  std::atomic<uint64_t>* slot = announcement(rank_, sequence);
  slot[kSlotHash].store(hash, std::memory_order_relaxed);
  slot[kSlotHashed].store(sequence + 1, std::memory_order_release);
}

std::optional<uint64_t> DirectState::announced_word(int rank, uint64_t sequence,
                                                    size_t word) const {
  const std::atomic<uint64_t>* slot = announcement(rank, sequence);
  if (slot[kSlotSequence].load(std::memory_order_acquire) != sequence + 1) return std::nullopt;
  uint64_t value = slot[word].load(std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_acquire);
  if (slot[kSlotSequence].load(std::memory_order_relaxed) != sequence + 1)
    return std::nullopt;  // rewritten meanwhile
  return value;
}

std::optional<uint64_t> DirectState::input_hash(int rank, uint64_t sequence) const {
  if (announced_word(rank, sequence, kSlotHashed) != sequence + 1) return std::nullopt;
  std::optional<uint64_t> hash = announced_word(rank, sequence, kSlotHash);
  // Written before kSlotHashed, which a relaunch clears first: still this sequence's?
  if (announced_word(rank, sequence, kSlotHashed) != sequence + 1) return std::nullopt;
  return hash;
}

namespace {
// Count and packed shape of the announcement in `slot`, if it is `sequence`'s.
inline bool read_call(const std::atomic<uint64_t>* slot, uint64_t sequence, uint64_t* count,
                      uint64_t* shape) {
  if (slot[kSlotSequence].load(std::memory_order_acquire) != sequence + 1) return false;
  *count = slot[kSlotCount].load(std::memory_order_relaxed);
  *shape = slot[kSlotShape].load(std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_acquire);
  return slot[kSlotSequence].load(std::memory_order_relaxed) == sequence + 1;
}
}  // namespace

inline bool DirectState::announced_call(int rank, uint64_t sequence, uint64_t* count,
                                        uint64_t* shape) const {
  return read_call(announcement(rank, sequence), sequence, count, shape);
}

bool DirectState::agrees(uint64_t sequence, uint64_t count, uint64_t shape) const {
  if ((shape & 0xff) == kAllToAllvShape) return false;
  // In locals: read_call's acquire loads would make the compiler reload members each turn.
  const size_t offset = (sequence & announced_mask_) * slot_words_;
  std::atomic<uint64_t>* const* slots = announcements_.data();
  const int n = nranks_, me = rank_;
  uint64_t theirs_count = 0, theirs_shape = 0;
  for (int q = 0; q < n; ++q)
    if (q != me && read_call(slots[q] + offset, sequence, &theirs_count, &theirs_shape) &&
        (theirs_count != count || theirs_shape != shape))
      return false;
  return true;
}

std::string DirectState::mismatch(uint64_t sequence, const CallShape& call) const {
  const uint64_t mine = pack_shape(call);
  for (int q = 0; q < nranks_; ++q) {
    uint64_t count = 0, shape = 0;
    if (q == rank_ || !announced_call(q, sequence, &count, &shape)) continue;
    if (count == call.count && shape == mine) continue;
    return "mismatched collectives: rank " + std::to_string(q) + " called " +
           describe_call(unpack_shape(shape, count)) + " while rank " + std::to_string(rank_) +
           " called " + describe_call(call) + ", sequence " + std::to_string(sequence);
  }
  return call.collective == algo::Collective::AllToAllv ? count_mismatch(sequence, mine) : "";
}

// Every rank scans the same matrix in the same order, so all name the same pair.
std::string DirectState::count_mismatch(uint64_t sequence, uint64_t shape) const {
  const size_t n = static_cast<size_t>(nranks_);
  // Only rows of ranks that made this call hold counts.
  auto same_call = [&](int q) { return announced_word(q, sequence, kSlotShape) == shape; };
  for (int from = 0; from < nranks_; ++from) {
    if (!same_call(from)) continue;
    for (int to = 0; to < nranks_; ++to) {
      if (!same_call(to)) continue;
      std::optional<uint64_t> sends = announced_word(from, sequence, kSlotCounts + to);
      std::optional<uint64_t> receives = announced_word(to, sequence, kSlotCounts + n + from);
      if (!sends || !receives || *sends == *receives) continue;
      return describe_count_mismatch(from, to, *sends, *receives, sequence);
    }
  }
  return "";
}

inline bool DirectState::peers_ready(uint64_t round, uint64_t tag, bool* more,
                                     bool* same_call) const {
  *more = false;
  *same_call = true;
  for (Control* peer : controls_) {
    uint64_t ready = peer->ready[round % 2].word.load(std::memory_order_acquire);
    if ((ready >> kRoundShift) < round) return false;
    *more = *more || (ready & 1) != 0;
    *same_call = *same_call && ((ready >> 1) & kTagMask) == tag;
  }
  return true;
}

inline bool DirectState::lane_op(const Job& job) const {
  // Every rank decides alike: the offer floor is the same on all of them, and the rest is
  // the call's.
  const DirectCall& call = *job.direct;
  return (call.collective == algo::Collective::Broadcast ||
          call.collective == algo::Collective::Reduce) &&
         shared() && call.algorithm == algo::Algorithm::OneShot &&
         call.count * job.math.element_size <= kLaneBytes && staged_unoffered(job);
}

inline uint64_t DirectState::lane_index(uint64_t round) const {
  return round & (lane_count_ - 1);  // a power of two
}

inline DirectState::LaneSlot& DirectState::lane_slot(int q, uint64_t round) const {
  return lanes_[q][lane_index(round)];
}

inline uint64_t DirectState::lane_word(int q, uint64_t round) const {
  // Acquire: pairs with rank q's release of its word in advance_lane, after its slot's
  // writes (its data) and after its reads of the rounds before (what it took of ours).
  return controls_[q]->lane_ready[lane_index(round)].load(std::memory_order_acquire);
}

inline uint64_t DirectState::lane_data_word(int q, uint64_t round) const {
  // Acquire: pairs with rank q's release of it, after its data.
  return lane_slot(q, round).word.load(std::memory_order_acquire);
}

inline uint64_t DirectState::own_lane_word(uint64_t round) const {
  return round << kRoundShift | lane_calls_[lane_index(round)].tag << 1;
}

inline bool DirectState::ack_lane(uint64_t round) {
  // A peer's word for the round is this round's until it runs lane_count_ - lane_window_ + 1
  // rounds further than it may: equal to this rank's once it published the round with this
  // rank's call in it (with checks off every tag is 0).
  const uint64_t mine = own_lane_word(round);
  for (int q = 0; q < nranks_; ++q)
    if (q != rank_ && lane_word(q, round) != mine) return false;
  lane_acked_ = round;
  return true;
}

bool DirectState::ack_lanes() {
  while (lane_acked_ < lane_round_)
    if (!ack_lane(lane_acked_ + 1)) return false;
  lanes_unacked_ = false;
  lanes_passed_ = false;
  return true;
}

bool DirectState::advance_lane(const Job& job, const std::byte* input, DirectRun* run,
                               bool* progressed) {
  const DirectCall& call = *job.direct;
  const uint64_t round = lane_round_ + 1;
  const size_t bytes = call.count * job.math.element_size;
  const bool broadcast = call.collective == algo::Collective::Broadcast;
  const bool root = rank_ == call.root;
  run->lane_root = broadcast ? call.root : -1;
  if (!run->published) {
    // The slot held round - lane_count_: every peer must be done with it, which it is once it
    // published round - lane_window_ + 1 (a rank publishes a lane round only after finishing
    // the one before), the oldest round this rank may not have acked. With checks on, a tag
    // that differs keeps this rank waiting here, where its wait's check (lane_mismatch) names
    // the call.
    if (round >= lane_window_ && lane_acked_ < round - lane_window_ + 1 &&
        !ack_lane(round - lane_window_ + 1))
      return false;
    // With checks off the tag is 0 and nothing is compared.
    if (check_ != CheckMode::Off)
      lane_calls_[lane_index(round)] = {job.sequence, job.ready_tag, job.shape};
    note_cpu();
    // Release, both: the slot's bytes (and the call's announcement) before the words, and
    // this rank's reads of earlier rounds before lane_ready's (a writer's acquire orders its
    // next write to those slots after them).
    const uint64_t word = own_lane_word(round);
    if (!broadcast || root) {
      LaneSlot& slot = lane_slot(rank_, round);
      copy_bytes(slot.data, input, bytes);
      slot.word.store(word, std::memory_order_release);
    }
    control(rank_).lane_ready[lane_index(round)].store(word, std::memory_order_release);
    ring_peers();
    run->published = true;
    *progressed = true;
  }
  // A rank that reads compares the writers' words with its own (their calls); one that only
  // sent compares later (ack_lane), so its call completes without the check.
  const uint64_t mine = own_lane_word(round);
  bool same_call = true;
  if (broadcast && !root) {
    // Only the root's slot is read. Its word still holds this round: the root publishes
    // round + lane_count_ there only after this rank published round + 1.
    const uint64_t theirs = lane_data_word(call.root, round);
    if ((theirs >> kRoundShift) < round) return false;
    copy_bytes(job.output, lane_slot(call.root, round).data, bytes);
    same_call = theirs == mine;
  } else if (broadcast) {
    copy_bytes(job.output, input, bytes);  // in place, the root's output is its input
  } else if (root) {
    for (int q = 0; q < nranks_; ++q) {
      const uint64_t theirs = lane_data_word(q, round);
      if (q == rank_) continue;
      if ((theirs >> kRoundShift) < round) return false;
      same_call = same_call && theirs == mine;
    }
    reduce_ranks(job.math, nranks_, job.output, call.count,
                 [&](int q) { return lane_slot(q, round).data; });
  }
  // Reduce's non-roots read nothing: the round ends with its publication. Only now is it
  // this rank's to ack (a wait's check before this would find lane_round_ all acked).
  lane_round_ = round;
  lanes_unacked_ = check_ != CheckMode::Off;
  run->same_call = same_call;
  return true;
}

std::string DirectState::settled_lane_mismatch() {
  // Acquire: pairs with the release of each op's last tickets_done_ increment.
  if (tickets_done_.load(std::memory_order_acquire) !=
      tickets_issued_.load(std::memory_order_relaxed))
    return "";
  return lane_mismatch();
}

std::string DirectState::lane_mismatch() {
  if (!lanes_unacked() || ack_lanes()) return "";
  // The oldest round a peer's word does not show this rank's call in: peers publish in order,
  // so a peer's later rounds wait until this one is compared.
  const uint64_t round = lane_acked_ + 1;
  const LaneCall& mine = lane_calls_[lane_index(round)];
  std::string why = mismatch(mine.sequence, mine.shape);
  if (!why.empty()) return why;
  // Its announcement may be gone (calls queued on a stream run far ahead): the word says it.
  for (int q = 0; q < nranks_; ++q) {
    const uint64_t theirs = lane_word(q, round);
    const bool other =
        (theirs >> kRoundShift) == round ? theirs != own_lane_word(round) : lanes_passed_;
    if (q != rank_ && other)
      return "mismatched collectives: rank " + std::to_string(q) +
             " made another call where rank " + std::to_string(rank_) + " called " +
             describe_call(mine.shape) + ", sequence " + std::to_string(mine.sequence);
  }
  return "";
}

inline bool DirectState::staged_unoffered(const Job& job) const {
  return !shared() || !zero_copy_capable(*job.direct) ||
         job.direct->count * job.math.element_size <
             offer_floors_[collective_index(job.direct->collective)];
}

inline bool DirectState::inline_op(const Job& job) const {
  // Every rank decides alike: the call and the ranks decide it.
  const DirectCall& call = *job.direct;
  if (!shared() || call.algorithm != algo::Algorithm::OneShot || call.count == 0 ||
      call.collective == algo::Collective::AllToAllv)
    return false;
  // AllToAll leaves out the writer's own block (compact_slot).
  const size_t slots = call.collective == algo::Collective::AllToAll ? nranks_ - 1
                       : has_slots(call.collective)                  ? nranks_
                                                                     : 1;
  return slots * call.count * job.math.element_size <= kInlineBytes;
}

inline int DirectState::compact_slot(int writer, int reader) {
  return reader > writer ? reader - 1 : reader;
}

inline uint64_t DirectState::slot_elements(const Job& job) const {
  size_t slots = has_slots(job.direct->collective) ? nranks_ : 1;
  return staging_bytes_ / 2 / (slots * job.math.element_size);
}

inline uint64_t DirectState::rounds(const Job& job, uint64_t per_round) const {
  const DirectCall& call = *job.direct;
  if (call.collective != algo::Collective::AllToAllv) {
    uint64_t chunks = ceil_div(call.count, per_round);
    return call.algorithm == algo::Algorithm::TwoShot ? 2 * chunks : chunks;
  }
  // Counts differ per rank: run as long as any rank needs (at least one round).
  uint64_t largest = 1;
  for (int q = 0; q < nranks_; ++q)
    largest = std::max({largest, call.peers->send_counts[q], call.peers->recv_counts[q]});
  return ceil_div(largest, per_round);
}

inline uint64_t DirectState::round_bytes(const Job& job, const DirectRun& run) const {
  // A slot per peer (or one slot) of the round's piece; AllToAllv's pieces of its counts.
  const DirectCall& call = *job.direct;
  uint64_t elements = 0;
  if (call.collective == algo::Collective::AllToAllv) {
    for (int p = 0; p < nranks_; ++p)
      elements += piece(call.peers->send_counts[p], run.step, run.per_round);
  } else {
    const size_t slots = has_slots(call.collective) ? nranks_ : 1;
    elements = slots * piece(call.count, run.step, run.per_round);
  }
  return elements * job.math.element_size;
}

inline bool DirectState::packs_and_unpacks(const DirectCall& call) const {
  // A Broadcast's other ranks write nothing, a Reduce's read nothing. Two-shot's rounds
  // alternate between two kinds, so its figures would depend on which rounds were timed.
  return call.algorithm == algo::Algorithm::OneShot &&
         (rank_ == call.root || (call.collective != algo::Collective::Broadcast &&
                                 call.collective != algo::Collective::Reduce));
}

// Whether an AllToAllv's own block can go straight from its input to its output: the
// buffers, as far as the counts reach, do not overlap (there is no in-place AllToAllv).
DirectState::Extents DirectState::alltoallv_extents(const Job& job) const {
  const DirectCall::PeerCounts& peers = *job.direct->peers;
  Extents extents;
  for (int q = 0; q < nranks_; ++q) {
    extents.input = std::max(extents.input, peers.send_displs[q] + peers.send_counts[q]);
    extents.output = std::max(extents.output, peers.recv_displs[q] + peers.recv_counts[q]);
  }
  return extents;
}

bool DirectState::own_block_direct_v(const Job& job) const {
  const Extents extents = alltoallv_extents(job);
  const size_t e = job.math.element_size;
  return !overlaps(job.input, extents.input * e, job.output, extents.output * e);
}

bool DirectState::streams_output(const Job& job) const {
  const DirectCall& call = *job.direct;
  const size_t e = job.math.element_size;
  const uint64_t n = nranks_;
  uint64_t input = 0, output = 0;  // this rank's buffers' extents, in elements
  bool reads_output = false;       // its output is input it reads (in place)
  switch (call.collective) {
    case algo::Collective::AllGather:
      input = call.count;
      output = n * call.count;
      // In place its own block, which it reads, is left where it is.
      reads_output = job.input != job.output + rank_ * call.count * e &&
                     overlaps(job.input, input * e, job.output, output * e);
      break;
    case algo::Collective::Broadcast:
      if (rank_ == call.root && job.input == job.output) return false;  // copies nothing
      input = output = call.count;
      break;
    case algo::Collective::AllToAll:
      input = output = n * call.count;
      reads_output = overlaps(job.input, input * e, job.output, output * e);
      break;
    case algo::Collective::AllToAllv: {
      const Extents extents = alltoallv_extents(job);
      input = extents.input;
      output = extents.output;
      reads_output = overlaps(job.input, input * e, job.output, output * e);
      break;
    }
    default:
      return false;
  }
  output_streamed_bytes_ = 0;
  return !reads_output && n * (input + output) * e >= output_stream_floor_;
}

inline void DirectState::copy_out(std::byte* dst, const std::byte* src, size_t bytes,
                                  const DirectRun& run) const {
  if (!run.stream_output) return copy_bytes(dst, src, bytes);
  copy_streaming(dst, src, bytes);
  output_streamed_bytes_ += bytes;
}

void DirectState::prefault_staging(uint64_t first_round_bytes) {
  const size_t bytes = std::min<uint64_t>(half_bytes_, first_round_bytes);
  if (bytes <= prefaulted_bytes_) return;
  // Rounds alternate between the halves: map both as far as this op writes. Without it the
  // first large calls take a page fault per 4 KiB written; mapping the whole staging at init
  // instead costs every communicator's creation the CPU to clear it, although most (a
  // subgroup's, a P2P pair's) never stage a large call. Peers' staging is only read, and a
  // read fault maps 16 pages at once (fault-around), so it is left to fault.
  for (size_t half = 0; half < 2; ++half)
    (void)segments_[rank_].prefault(header_bytes_ + half * half_bytes_ + prefaulted_bytes_,
                                    bytes - prefaulted_bytes_);
  prefaulted_bytes_ = bytes;
}

inline void DirectState::reduce_all(const Job& job, const DirectRun& run, std::byte* dst,
                                    size_t offset_bytes, uint64_t count) const {
  reduce_ranks(job.math, nranks_, dst, count,
               [&](int q) { return staging(q, run) + offset_bytes; });
}

// Inlined into advance(), its only caller (a call costs a third of a small call's pack).
[[gnu::always_inline]] inline bool DirectState::pack(const Job& job, const std::byte* input,
                                                     const DirectRun& run) const {
  const DirectCall& call = *job.direct;
  const size_t e = job.math.element_size;
  const uint64_t per_round = run.per_round, step = run.step;
  std::byte* mine = own_staging(run);
  bool two_shot = call.algorithm == algo::Algorithm::TwoShot;
  uint64_t chunk = two_shot ? step / 2 : step;
  uint64_t begin = chunk * per_round, length = piece(call.count, chunk, per_round);
  switch (call.collective) {
    case algo::Collective::AllReduce:
      if (two_shot && step % 2 == 1) {
        // Second half: publish this rank's reduced slice.
        uint64_t slice_begin = length * rank_ / nranks_;
        uint64_t slice_end = length * (rank_ + 1) / nranks_;
        stage_bytes(mine + slice_begin * e, job.output + (begin + slice_begin) * e,
                    (slice_end - slice_begin) * e, run.streamed);
        break;
      }
      [[fallthrough]];
    case algo::Collective::Reduce:
    case algo::Collective::AllGather:
      stage_bytes(mine, input + begin * e, length * e, run.streamed);
      break;
    case algo::Collective::Broadcast:
      if (rank_ == call.root) stage_bytes(mine, input + begin * e, length * e, run.streamed);
      break;
    case algo::Collective::AllToAll:
      if (run.inline_data) {
        // Only the peers' blocks travel. This rank's own goes straight to its output, once
        // the others are packed (in place, or a user's overlapping buffers, it may be the
        // input they were packed from).
        for (int p = 0; p < nranks_; ++p)
          if (p != rank_)
            copy_bytes(mine + compact_slot(rank_, p) * length * e, input + p * call.count * e,
                       length * e);
        const size_t own = rank_ * call.count * e;
        if (job.output + own != input + own) memmove(job.output + own, input + own, length * e);
        break;
      }
      [[fallthrough]];
    case algo::Collective::ReduceScatter: {
      // An AllToAll's own block skips the staging where it can (unpack copies it).
      const int own = call.collective == algo::Collective::AllToAll &&
                              own_block_direct(input, job.output, nranks_ * call.count * e)
                          ? rank_
                          : -1;
      for (int p = 0; p < nranks_; ++p)
        if (p != own)
          stage_bytes(mine + p * per_round * e, input + (p * call.count + begin) * e, length * e,
                      run.streamed);
      break;
    }
    case algo::Collective::AllToAllv: {
      const int own = own_block_direct_v(job) ? rank_ : -1;  // unpack copies it
      for (int p = 0; p < nranks_; ++p)
        if (p != own)
          stage_bytes(mine + p * per_round * e,
                      input + (call.peers->send_displs[p] + step * per_round) * e,
                      piece(call.peers->send_counts[p], step, per_round) * e, run.streamed);
      break;
    }
    default:
      break;
  }
  return step + 1 < run.rounds;
}

inline void DirectState::unpack(const Job& job, const DirectRun& run) const {
  const DirectCall& call = *job.direct;
  const size_t e = job.math.element_size;
  const uint64_t per_round = run.per_round, step = run.step;
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
            reduce_all(job, run, out + begin * e + offset, offset, slice_end - slice_begin);
          else if (step % 2 == 1 && q != rank_)  // second half: gather the others'
            copy_bytes(out + begin * e + offset, staging(q, run) + offset,
                       (slice_end - slice_begin) * e);
        }
        break;
      }
      reduce_all(job, run, out + begin * e, 0, length);
      break;
    case algo::Collective::Reduce:
      if (rank_ == call.root) reduce_all(job, run, out + begin * e, 0, length);
      break;
    case algo::Collective::ReduceScatter:
      reduce_all(job, run, out + begin * e, rank_ * per_round * e, length);
      break;
    case algo::Collective::AllGather: {
      // In place, this rank's own block is in its output already: copying it back from the
      // staging would move a third more bytes for nothing.
      const int own = job.input == out + rank_ * call.count * e ? rank_ : -1;
      for (int q = 0; q < nranks_; ++q)
        if (q != own)
          copy_out(out + (q * call.count + begin) * e, staging(q, run), length * e, run);
      break;
    }
    case algo::Collective::Broadcast:
      // The root's own output already holds the data when the call is in place.
      if (rank_ != call.root || job.input != out)
        copy_out(out + begin * e, staging(call.root, run), length * e, run);
      break;
    case algo::Collective::AllToAll: {
      // Copied from the input when pack left it out of the staging (a no-op in place).
      const int own = !run.inline_data && own_block_direct(job.input, out, nranks_ * call.count * e)
                          ? rank_
                          : -1;
      for (int q = 0; q < nranks_; ++q) {
        if (q == own)
          copy_out(out + (q * call.count + begin) * e, job.input + (q * call.count + begin) * e,
                   length * e, run);
        else if (!run.inline_data)
          copy_out(out + (q * call.count + begin) * e, staging(q, run) + rank_ * per_round * e,
                   length * e, run);
        else if (q != rank_)  // pack wrote this rank's own block
          copy_bytes(out + q * call.count * e,
                     staging(q, run) + compact_slot(q, rank_) * length * e, length * e);
      }
      break;
    }
    case algo::Collective::AllToAllv: {
      const int own = own_block_direct_v(job) ? rank_ : -1;
      for (int q = 0; q < nranks_; ++q)
        copy_out(out + (call.peers->recv_displs[q] + step * per_round) * e,
                 q == own ? job.input + (call.peers->send_displs[q] + step * per_round) * e
                          : staging(q, run) + rank_ * per_round * e,
                 piece(call.peers->recv_counts[q], step, per_round) * e, run);
      break;
    }
    default:
      break;
  }
}

// Which of a collective's kStoreSizeClasses a size of at least `floor` falls in: powers
// of two from the floor, the last class taking the rest.
size_t DirectState::choice_index(algo::Collective collective, uint64_t bytes, uint64_t floor) {
  return collective_index(collective) * kStoreSizeClasses +
         size_class(bytes, floor, kStoreSizeClasses);
}

size_t DirectState::size_class(uint64_t bytes, uint64_t floor, size_t classes) {
  return std::min<size_t>(classes, std::bit_width(bytes / floor)) - 1;
}

// Out of line: the rounds whose stores are chosen are large, and the untimed ones take
// no clock reads nor the code around them.
TimedChoice& DirectState::stores_for(algo::Collective collective, uint64_t bytes) {
  return stores_[choice_index(collective, bytes, stream_floor_)];
}

[[gnu::noinline]] bool DirectState::timed_pack(const Job& job, const std::byte* input,
                                               const DirectRun& run) {
  const auto start = Clock::now();
  const bool more = pack(job, input, run);
  if (run.streamed) streaming_fence();  // before the ready word publishes the round
  timing_.pack_us = micros_since(start);
  return more;
}

[[gnu::noinline]] void DirectState::timed_unpack(const Job& job, const DirectRun& run) {
  const auto start = Clock::now();
  unpack(job, run);
  const double micros = timing_.pack_us + micros_since(start);
  // A last round below the floor (an op's tail) is neither streamed nor counted.
  if (timing_.bytes < stream_floor_) return;
  TimedChoice& stores = stores_for(job.direct->collective, timing_.bytes);
  const bool streaming = stores.prefers_alternative();
  stores.observe(run.streamed, micros, timing_.bytes);
  WEFT_LOG(TRACE, COLL, "rank %d: a staging round of %llu bytes with %s stores took %.1f us%s",
           rank_, static_cast<unsigned long long>(timing_.bytes),
           run.streamed ? "streaming" : "ordinary", micros,
           stores.prefers_alternative() == streaming ? ""
           : streaming                               ? "; now ordinary stores"
                                                     : "; now streaming stores");
}

bool DirectState::advance(const Job& job, const std::byte* input, DirectRun* run,
                          bool* progressed) {
  if (tickets_done_.load(std::memory_order_acquire) != run->ticket) return false;
  Control& mine = control(rank_);
  // Ranks agree on whether an op has rounds at all; then it runs until no
  // rank needs another one.
  if (!run->sized) {
    run->inline_data = inline_op(job);
    run->per_round = run->inline_data ? job.direct->count : slot_elements(job);
    run->rounds = rounds(job, run->per_round);
    run->sized = true;
    if (!run->inline_data) {
      // The first round is the largest: it sizes the staging's mapping, and its stores
      // are chosen (and all the op's rounds timed) when it reaches the floor.
      const uint64_t first_round = round_bytes(job, *run);
      // AllToAllv's slots lie per_round apart whatever its counts.
      prefault_staging(job.direct->collective == algo::Collective::AllToAllv
                           ? nranks_ * run->per_round * job.math.element_size
                           : first_round);
      run->timed = first_round >= stream_floor_ && packs_and_unpacks(*job.direct);
    }
  }
  bool more = run->rounds > 0;
  if (more && run->path == DirectRun::Path::Undecided && lane_op(job))
    run->path = DirectRun::Path::Lane;
  if (run->path == DirectRun::Path::Lane) {
    if (!advance_lane(job, input, run, progressed)) return false;
    more = false;
  }
  if (more && run->path == DirectRun::Path::Undecided) {
    if (staged_unoffered(job))
      run->path = DirectRun::Path::Staging;
    else if (!choose_path(job, input, run))
      return false;
  }
  if (run->path == DirectRun::Path::ZeroCopy) {
    if (!zero_copy(job, run, progressed)) return false;
    more = false;
  }
  // Decided once the op is known to be staged (not read in place), before its first round.
  if (more && run->step == 0 && !run->published && !run->inline_data)
    run->stream_output = streams_output(job);
  const uint64_t tag = job.ready_tag;
  while (more) {
    uint64_t round = round_ + 1;
    if (!run->published) {
      if (run->timed) {
        timing_.bytes = round_bytes(job, *run);
        run->streamed = timing_.bytes >= stream_floor_ &&
                        stores_for(job.direct->collective, timing_.bytes).alternative(round);
        run->more = timed_pack(job, input, *run);
      } else {
        run->more = pack(job, input, *run);
      }
      note_cpu();
      mine.ready[round % 2].word.store(round << kRoundShift | tag << 1 | (run->more ? 1 : 0),
                                       std::memory_order_release);
      ring_peers();
      run->published = true;
    }
    bool same_call = false;
    if (!peers_ready(round, tag, &more, &same_call)) return false;
    // AllToAllv's counts are not in the tag: its check at completion always runs.
    if (run->step == 0) {
      run->same_call = same_call && job.shape.collective != algo::Collective::AllToAllv;
      // Every peer is past this rank's lane calls: those it only sent in are compared now. One
      // that differs keeps the op waiting, where the wait's check (check_mismatch, while this
      // op holds the lanes' state) names it.
      if (lanes_unacked() && !ack_lanes()) {
        lanes_passed_ = true;
        return false;
      }
    }
    if (run->timed)
      timed_unpack(job, *run);
    else
      unpack(job, *run);
    if (run->stream_output) streaming_fence();  // before the op's end publishes its output
    round_ = round;
    ++run->step;
    run->published = false;
    *progressed = true;
  }
  if (run->path_timed) observe_path(job, *run);
  if (run->stream_output)
    WEFT_LOG(TRACE, COLL, "rank %d: direct %s wrote %llu bytes of its output with streaming stores",
             rank_, algo::collective_name(job.direct->collective),
             static_cast<unsigned long long>(output_streamed_bytes_));
  tickets_done_.fetch_add(1, std::memory_order_release);
  mine.bell.ring();  // a later op of this communicator may sleep in another thread
  return true;
}

Status DirectState::probe_cma(const AllGather& allgather, const std::vector<SetupWords>& setups) {
  bool wanted = false;
  for (const SetupWords& setup : setups)
    for (uint64_t bytes : setup.cma_bytes) wanted = wanted || bytes != 0;
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
  const uint64_t cma_bytes = cma_bytes_[collective_index(call.collective)];
  const bool cma = cma_ && cma_bytes != 0;
  // Ranks may differ in their thresholds: any refusal stages the op everywhere.
  if (bytes < (cma ? std::min(zero_copy_bytes_, cma_bytes) : zero_copy_bytes_)) return {};
  if (call.collective == algo::Collective::Broadcast && rank_ != call.root)
    return {Offer::kUnneeded};
  // An AllReduce in place cannot be read in one step: only in two phases, whose second
  // reads the outputs by CMA.
  const bool reduced_in_place = call.collective == algo::Collective::AllReduce && input == out;
  const bool cma_reads = cma && bytes >= cma_bytes;
  if (reduced_in_place && !cma_reads) return {};
  // Peers read the input while this rank writes its output: they must not meet.
  bool apart = false;
  switch (call.collective) {
    case algo::Collective::AllReduce:  // in place, its slices are written apart (two-phase)
      apart = input == out || !overlaps(input, bytes, out, bytes);
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
  Offer offer;
  if (bytes >= zero_copy_bytes_ && registry_ != nullptr && registry_->covers(input, input_bytes) &&
      find_shared(input, input_bytes, &where))
    offer = {Offer::kMapped,      where.pid,    where.serial,
             where.segment_bytes, where.offset, input_bytes};
  else if (cma && bytes >= cma_bytes && nranks_ * 2 * input_bytes <= cma_buffer_bound_)
    offer = {Offer::kCma, static_cast<uint32_t>(getpid()),    0,
             0,           reinterpret_cast<uintptr_t>(input), input_bytes};
  offer.output = reinterpret_cast<uintptr_t>(out);
  // Out of place, a TwoShot AllReduce read by CMA, or one whose inputs over the node outgrow
  // two_phase_floor_, takes the two phases too (a registered input is read in one step).
  offer.two_phase =
      reduced_in_place ||
      (call.collective == algo::Collective::AllReduce && offer.kind == Offer::kCma &&
       (call.algorithm == algo::Algorithm::TwoShot || nranks_ * bytes >= two_phase_floor_));
  return offer;
}

DirectState::Offer DirectState::chosen_offer(const Job& job, const std::byte* input,
                                             DirectRun* run) {
  Offer offer = offer_for(job, input);
  if (offer.kind != Offer::kCma || !cma_chosen_) return offer;
  // Every rank that offers asks its choice for the same ops, so that their turns and probes
  // coincide: an op reads by CMA only if all of them offer. (Ranks whose placements differ
  // ask different choices: their turns drift apart and more of their ops are staged.)
  const DirectCall& call = *job.direct;
  const uint64_t block = call.count * job.math.element_size;
  const size_t c = collective_index(call.collective);
  const bool in_place =
      input == job.output + (call.collective == algo::Collective::AllGather ? rank_ * block : 0);
  TimedChoice& choice = cma_choices_[(c * 2 + in_place) * kCmaSizeClasses +
                                     size_class(block, cma_bytes_[c], kCmaSizeClasses)];
  run->path_timed = true;
  path_timing_.choice = &choice;
  path_timing_.bytes = offer.bytes;
  // Both ways are timed from here, before the peers' offers are awaited: a rank that
  // refuses knows its path at once, one that offers only once every peer offered.
  path_timing_.start = Clock::now();
  return choice.alternative() ? offer : Offer{};
}

[[gnu::noinline]] void DirectState::observe_path(const Job& job, const DirectRun& run) {
  const double micros = micros_since(path_timing_.start);
  TimedChoice& choice = *path_timing_.choice;
  const bool cma = run.path == DirectRun::Path::ZeroCopy;
  const bool preferred = choice.prefers_alternative();
  choice.observe(cma, micros, path_timing_.bytes);
  WEFT_LOG(TRACE, COLL, "rank %d: direct %s op %llu of %llu bytes %s took %.1f us%s", rank_,
           algo::collective_name(job.direct->collective),
           static_cast<unsigned long long>(run.ticket + 1),
           static_cast<unsigned long long>(path_timing_.bytes), cma ? "read in place" : "staged",
           micros,
           choice.prefers_alternative() == preferred ? ""
           : preferred                               ? "; now staging"
                                                     : "; now offering cross-memory attach");
}

bool DirectState::choose_path(const Job& job, const std::byte* input, DirectRun* run) {
  using Path = DirectRun::Path;
  if (staged_unoffered(job)) {
    run->path = Path::Staging;
    return true;
  }
  const uint64_t op = run->ticket + 1;
  if (!run->offered) {
    Offer offer = chosen_offer(job, input, run);
    Control& mine = control(rank_);
    mine.offer_kind.store(offer.kind, std::memory_order_relaxed);
    mine.offer_pid.store(offer.pid, std::memory_order_relaxed);
    mine.offer_serial.store(offer.serial, std::memory_order_relaxed);
    mine.offer_segment_bytes.store(offer.segment_bytes, std::memory_order_relaxed);
    mine.offer_offset.store(offer.offset, std::memory_order_relaxed);
    mine.offer_bytes.store(offer.bytes, std::memory_order_relaxed);
    mine.offer_output.store(offer.output, std::memory_order_relaxed);
    mine.offer_two_phase.store(offer.two_phase ? 1 : 0, std::memory_order_relaxed);
    note_cpu();
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
  for (Control* peer : controls_) {
    if (peer->offer_kind.load(std::memory_order_relaxed) == Offer::kRefused) {
      run->path = Path::Staging;
      return true;
    }
    run->two_phase = run->two_phase || peer->offer_two_phase.load(std::memory_order_relaxed) != 0;
  }
  Status mapped = map_inputs(job, input);
  if (!mapped.ok()) {
    // The peers read in place already: failing the communicator is the only way out. The
    // path stays undecided, so that a later advance never reads the inputs left unmapped.
    job.comm->fail(mapped.code(), mapped.message());
    return false;
  }
  run->path = Path::ZeroCopy;
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
    const uint64_t output = peer.offer_output.load(std::memory_order_relaxed);
    // Reading past a peer's input would take another buffer's bytes (or fault).
    if (kind != Offer::kUnneeded && peer.offer_bytes.load(std::memory_order_relaxed) != input_bytes)
      return Error(
          weftInvalidUsage, "%s: rank %d offered %llu bytes of input, this rank's count needs %llu",
          algo::collective_name(call.collective), q,
          static_cast<unsigned long long>(peer.offer_bytes.load(std::memory_order_relaxed)),
          static_cast<unsigned long long>(input_bytes));
    switch (kind) {
      case Offer::kCma:
        sources_[q] = Source{nullptr, static_cast<pid_t>(pid), offset, output};
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
        sources_[q].output = output;
        break;
      }
      default:
        break;
    }
  }
  return Status::Ok();
}

Status DirectState::read_input(int q, size_t offset, std::byte* dst, size_t bytes,
                               bool streamed) const {
  const Source& source = sources_[q];
  if (source.local != nullptr) {
    if (streamed && dst != source.local + offset)
      copy_streaming(dst, source.local + offset, bytes);
    else
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

Status DirectState::reduce_read_inputs(const Job& job, uint64_t begin, uint64_t end) {
  const size_t e = job.math.element_size;
  const uint64_t chunk = std::max<uint64_t>(1, kReduceChunkBytes / e);
  // In place, the reduction's first step writes the output before a rank past the first two
  // combines its own piece there: that piece is combined from a copy.
  const bool own_copied = rank_ >= 2 && sources_[rank_].local == job.output;
  bool reads = own_copied;
  for (const Source& source : sources_) reads = reads || source.local == nullptr;
  if (reads && cma_scratch_.size() < nranks_ * chunk * e) cma_scratch_.resize(nranks_ * chunk * e);
  const auto scratch = [&](int q) { return cma_scratch_.data() + q * chunk * e; };
  for (uint64_t at = begin; at < end; at += chunk) {
    const uint64_t length = std::min(chunk, end - at);
    for (int q = 0; q < nranks_; ++q)
      if (sources_[q].local == nullptr || (q == rank_ && own_copied))
        WEFT_RETURN_IF_ERROR(read_input(q, at * e, scratch(q), length * e, false));
    reduce_ranks(job.math, nranks_, job.output + at * e, length, [&](int q) {
      return sources_[q].local != nullptr && !(q == rank_ && own_copied)
                 ? sources_[q].local + at * e
                 : scratch(q);
    });
  }
  return Status::Ok();
}

uint64_t DirectState::slice_begin(const Job& job, int q) const {
  // Whole cache lines, where the count allows, so that the reductions start aligned.
  const uint64_t count = job.direct->count, n = nranks_;
  const uint64_t line = std::max<uint64_t>(1, kLine / job.math.element_size);
  return std::min(count, ceil_div(count / n * q + count % n * q / n, line) * line);
}

Status DirectState::read_reduced_slices(const Job& job) {
  const size_t e = job.math.element_size;
  for (int q = 0; q < nranks_; ++q) {
    const uint64_t begin = slice_begin(job, q), end = slice_begin(job, q + 1);
    if (q == rank_ || begin == end) continue;
    Status read = shm::cma_read(pids_[q], sources_[q].output + begin * e, job.output + begin * e,
                                (end - begin) * e);
    if (!read.ok())
      return Error(weftRemoteError,
                   "shared memory: reading rank %d's reduced slice by cross-memory attach: %s", q,
                   read.message().c_str());
  }
  return Status::Ok();
}

template <typename Read>
Status DirectState::for_each_read(const Job& job, Read read) const {
  const DirectCall& call = *job.direct;
  const size_t bytes = call.count * job.math.element_size;
  std::byte* out = job.output;
  Status status;
  switch (call.collective) {
    case algo::Collective::AllGather:
      for (int q = 0; q < nranks_ && status.ok(); ++q) status = read(q, 0, out + q * bytes);
      break;
    case algo::Collective::Broadcast:
      status = read(call.root, 0, out);
      break;
    case algo::Collective::AllToAll:
      for (int q = 0; q < nranks_ && status.ok(); ++q)
        status = read(q, rank_ * bytes, out + q * bytes);
      break;
    default:  // the reductions read the mapped inputs where they lie
      break;
  }
  return status;
}

TimedChoice* DirectState::copy_stores_for(const Job& job) {
  const DirectCall& call = *job.direct;
  const uint64_t bytes = call.count * job.math.element_size;
  if (bytes < stream_floor_) return nullptr;
  bool copies = false;
  (void)for_each_read(job, [&](int q, size_t offset, const std::byte* dst) {
    copies = copies || (sources_[q].local != nullptr && sources_[q].local + offset != dst);
    return Status::Ok();
  });
  return copies ? &copy_stores_[choice_index(call.collective, bytes, stream_floor_)] : nullptr;
}

// Out of line, as timed_pack: the untimed reads take no clock reads nor the code around them.
[[gnu::noinline]] Status DirectState::timed_reads(const Job& job, TimedChoice* stores) {
  const uint64_t bytes = job.direct->count * job.math.element_size;
  const bool streamed = stores->alternative();
  copy_timing_ = {stores, streamed, bytes, Clock::now()};
  Status read = for_each_read(job, [&](int q, size_t offset, std::byte* dst) {
    return read_input(q, offset, dst, bytes, streamed);
  });
  if (streamed) streaming_fence();  // before the done word tells the peers
  return read;
}

[[gnu::noinline]] void DirectState::observe_copies(const Job& job) {
  const double micros = micros_since(copy_timing_.start);
  TimedChoice& stores = *copy_timing_.choice;
  const bool streaming = stores.prefers_alternative();
  stores.observe(copy_timing_.streamed, micros, copy_timing_.bytes);
  WEFT_LOG(TRACE, COLL, "rank %d: direct %s of %llu-byte blocks read with %s stores took %.1f us%s",
           rank_, algo::collective_name(job.direct->collective),
           static_cast<unsigned long long>(copy_timing_.bytes),
           copy_timing_.streamed ? "streaming" : "ordinary", micros,
           stores.prefers_alternative() == streaming ? ""
           : streaming                               ? "; now ordinary stores"
                                                     : "; now streaming stores");
}

bool DirectState::zero_copy(const Job& job, DirectRun* run, bool* progressed) {
  const uint64_t op = run->ticket + 1;
  if (run->two_phase && !run->reduced) {
    Status reduced = reduce_read_inputs(job, slice_begin(job, rank_), slice_begin(job, rank_ + 1));
    if (!reduced.ok()) {
      job.comm->fail(reduced.code(), reduced.message());
      return false;
    }
    control(rank_).reduced.store(op, std::memory_order_release);
    ring_peers();
    run->reduced = true;
    *progressed = true;
  }
  if (!run->read) {
    const DirectCall& call = *job.direct;
    const size_t bytes = call.count * job.math.element_size;
    Status read;
    if (run->two_phase) {
      // The peers' slices are final, and no peer reads this rank's input any more.
      for (Control* peer : controls_)
        if (peer->reduced.load(std::memory_order_acquire) < op) return false;
      read = read_reduced_slices(job);
    } else if (call.collective == algo::Collective::AllReduce) {
      read = reduce_read_inputs(job, 0, call.count);
    } else if (call.collective == algo::Collective::Reduce && rank_ == call.root) {
      // Every input is mapped: a Reduce takes no CMA offers.
      reduce_ranks(job.math, nranks_, job.output, call.count,
                   [&](int q) { return sources_[q].local; });
    } else if (TimedChoice* stores = copy_stores_for(job)) {
      run->copy_timed = true;
      read = timed_reads(job, stores);
    } else {
      read = for_each_read(job, [&](int q, size_t offset, std::byte* dst) {
        return read_input(q, offset, dst, bytes, false);
      });
    }
    if (!read.ok()) {
      // A peer that died or unmapped its input: nothing else can end the op.
      job.comm->fail(read.code(), read.message());
      return false;
    }
    if (log_enabled(LogLevel::TRACE, kLogCOLL)) {
      int cma = 0;
      for (int q = 0; q < nranks_; ++q) cma += sources_[q].pid != 0;
      WEFT_LOG(TRACE, COLL, "direct %s op %llu: read in place, cma=%d peers%s",
               algo::collective_name(call.collective), static_cast<unsigned long long>(op), cma,
               run->two_phase ? ", in two phases" : "");
    }
    control(rank_).done.store(op, std::memory_order_release);
    ring_peers();
    run->read = true;
    *progressed = true;
  }
  // The input goes back to the user only once no peer reads it any more.
  for (Control* peer : controls_)
    if (peer->done.load(std::memory_order_acquire) < op) return false;
  if (run->copy_timed) observe_copies(job);
  return true;
}

namespace {

// "rank 2" or "ranks 1, 3": the ranks for which `behind(q)` holds; empty if none.
template <typename Behind>
std::string ranks_where(int nranks, Behind behind) {
  std::vector<int> ranks;
  for (int q = 0; q < nranks; ++q)
    if (behind(q)) ranks.push_back(q);
  std::string text = ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < ranks.size(); ++i) text += (i > 0 ? ", " : "") + std::to_string(ranks[i]);
  return ranks.empty() ? std::string() : text;
}

}  // namespace

std::string DirectState::describe(const DirectRun& run) const {
  const uint64_t op = run.ticket + 1;
  std::string laggards;
  std::string what;
  if (tickets_done_.load(std::memory_order_acquire) != run.ticket) {
    what = "direct op: this communicator's earlier direct ops to finish";
  } else if (run.path == DirectRun::Path::Lane) {
    const uint64_t round = lane_round_ + 1;
    if (!run.published) {
      // (Only a round past the first lane_window_ - 1 waits before publishing.)
      const uint64_t acked = round >= lane_window_ ? round - lane_window_ + 1 : 0;
      laggards = ranks_where(nranks_, [&](int q) {
        return q != rank_ && (lane_word(q, acked) >> kRoundShift) < acked;
      });
      what = "direct lane round " + std::to_string(round) +
             ": the peers to take this rank's earlier calls";
    } else {
      // Waiting to read: a Broadcast's non-root reads the root, a Reduce's root every rank.
      const int root = run.lane_root;
      laggards = ranks_where(nranks_, [&](int q) {
        return q != rank_ && (root < 0 || q == root) &&
               (lane_word(q, round) >> kRoundShift) < round;
      });
      what = "direct lane round " + std::to_string(round) + " with the ranks of this node";
    }
  } else if (run.path == DirectRun::Path::ZeroCopy) {
    const bool reducing = run.reduced && !run.read;  // a two-phase AllReduce between phases
    if (run.read)
      laggards = ranks_where(
          nranks_, [&](int q) { return controls_[q]->done.load(std::memory_order_acquire) < op; });
    else if (reducing)
      laggards = ranks_where(nranks_, [&](int q) {
        return controls_[q]->reduced.load(std::memory_order_acquire) < op;
      });
    what = std::string("direct in-place op (mapped or CMA): ") +
           (run.read   ? "the peers to finish reading this rank's input"
            : reducing ? "the peers to reduce their slices"
                       : "this rank to read the peers' inputs");
  } else if (run.offered && run.path == DirectRun::Path::Undecided) {
    laggards = ranks_where(nranks_, [&](int q) {
      return controls_[q]->offer_op.load(std::memory_order_acquire) < op;
    });
    what = "direct op: the peers' zero-copy offers";
  } else {
    const uint64_t round = round_ + 1;
    laggards = ranks_where(nranks_, [&](int q) {
      return (controls_[q]->ready[round % 2].word.load(std::memory_order_acquire) >> kRoundShift) <
             round;
    });
    what = "direct round " + std::to_string(run.step) + " with the ranks of this node";
  }
  return laggards.empty() ? what : laggards + " (" + what + ")";
}

}  // namespace weft
