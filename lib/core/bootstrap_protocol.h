// The bootstrap's wire protocol as pure functions over bytes: frames cut from
// a connection's byte stream, and the messages the root receives from ranks.
// Apart from sockets and threads, so that the parsing of what anyone on the
// network may send is fuzzed on its own (tests/fuzz) and its bounds live here.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "common/status.h"

namespace weft {

using Secret = std::array<uint8_t, 16>;
using Blob = std::vector<uint8_t>;

// 2: a rank's record carries its view of the host's speed (PeerInfo::host_speed).
inline constexpr uint32_t kProtocolVersion = 2;

// Framed messages: a 16-byte header (magic, type, payload length) + payload.
inline constexpr uint32_t kFrameMagic = 0x57465442;  // "WFTB"
inline constexpr uint64_t kMaxFramePayload = 64ull << 20;
// Before a connection has proven it knows the secret it may send this much.
inline constexpr uint64_t kMaxHelloPayload = 64 << 10;

struct FrameHeader {
  uint32_t magic;
  uint32_t type;
  uint64_t length;
};
static_assert(sizeof(FrameHeader) == 16);

// A bad magic or a payload above max_payload: the stream cannot be trusted further.
Status check_frame_header(const FrameHeader& header, uint64_t max_payload);

enum MessageType : uint32_t {
  kHello = 1,            // rank -> root: version, secret, rank, nranks, info
  kTable = 2,            // root -> rank: every rank's info
  kAllGather = 3,        // rank -> root: sequence number, contribution
  kAllGatherResult = 4,  // root -> rank: every contribution
  kGoodbye = 5,          // rank -> root: leaving on purpose, with what it had launched
  kAborting = 6,         // rank -> root: this rank aborts its communicator
  kPeerFailed = 7,       // root -> rank: another rank died or aborted
  kRootError = 8,        // root -> rank: the root gives up (e.g. join deadline)
  kPeerLeft = 9,         // root -> rank: another rank left on purpose, and its goodbye
  kFailed = 10,          // rank -> root: this rank's communicator timed out or was revoked, and why
  kShrink = 11,          // rank -> root: sequence number, excluded ranks, contribution
  kShrinkResult = 12,    // root -> rank: sequence number, error ("" if none), survivors' parts
  kCalls = 13,           // rank -> root: its latest collectives, while it waits for one
  kMismatch = 14,        // root -> rank: two ranks made different calls (their message)
};

// Cuts one connection's bytes, as they arrive in any pieces, into whole frames.
class FrameReader {
 public:
  enum class Next { kFrame, kIncomplete, kInvalid };

  void append(const uint8_t* data, size_t size);
  // The next whole frame, if it has arrived; kInvalid once a header fails check_frame_header.
  Next next(uint64_t max_payload, uint32_t* type, Blob* payload);
  size_t buffered() const { return input_.size() - consumed_; }

 private:
  std::vector<uint8_t> input_;
  size_t consumed_ = 0;  // bytes of input_ already returned as frames
};

// The messages a rank sends the root. Every decode checks the bytes left and
// returns false on a truncated payload (trailing bytes are ignored).
struct Hello {
  uint32_t version = kProtocolVersion;
  Secret secret{};
  int32_t rank = -1;
  int32_t nranks = -1;
  std::string label;  // "host:pid"
  Blob info;
};
Blob encode_hello(const Hello& hello);
bool decode_hello(const Blob& payload, Hello* out);

struct AllGatherPart {
  uint64_t sequence = 0;
  Blob part;
  int64_t timeout_ms = 0;  // the contributor's, in [1, kMaxWaitMs]
};
// Longer than any wait a rank asks for (remaining_ms caps them at 2^30 ms).
inline constexpr int64_t kMaxWaitMs = int64_t{1} << 31;
Blob encode_allgather(const AllGatherPart& part);
bool decode_allgather(const Blob& payload, AllGatherPart* out);

// kFailed: why this rank's communicator failed, and whom it waited for (at most nranks).
struct FailureReport {
  std::string message;
  std::vector<int32_t> waited;
};
Blob encode_failure_report(const FailureReport& report);
bool decode_failure_report(const Blob& payload, int nranks, FailureReport* out);

// kShrink: excluded ranks (at most nranks, each in [0, nranks)) and the contribution.
struct ShrinkRequest {
  uint64_t sequence = 0;
  std::vector<int32_t> excluded;
  Blob part;
};
Blob encode_shrink_request(const ShrinkRequest& request);
bool decode_shrink_request(const Blob& payload, int nranks, ShrinkRequest* out);
// "{2,3}": an exclusion list in messages.
std::string rank_list(const std::vector<int32_t>& ranks);

// kCalls: a rank's latest collectives on a communicator without shared segments (ranks on
// several nodes), sent when it waits for one; the root compares them across ranks.
struct CallRecord {
  uint64_t sequence = 0;
  uint64_t fingerprint = 0;  // equal for calls every rank must make alike
  std::string text;          // "allreduce(count=1000, float, sum)"
  // AllToAllv: this rank's send counts then receive counts, nranks each (empty for other
  // collectives, and on communicators above kMaxCountedRanks ranks).
  std::vector<uint64_t> counts;
  friend bool operator==(const CallRecord&, const CallRecord&) = default;
};
// At most this many records per report, and count rows only up to this many ranks (a
// report then holds at most 64 · 2 · 1024 counts: 1 MiB).
inline constexpr size_t kMaxCallRecords = 64;
inline constexpr size_t kMaxCountedRanks = 1024;
// "mismatched alltoallv counts: rank 0 sends 3 elements to rank 1 while rank 1 receives 5
// from rank 0, sequence 1": what every rank fails with when AllToAllv's count matrix
// disagrees (the direct path's announcements or the root's reports).
std::string describe_count_mismatch(int from, int to, uint64_t sends, uint64_t receives,
                                    uint64_t sequence);
Blob encode_calls(const std::vector<CallRecord>& calls);
bool decode_calls(const Blob& payload, std::vector<CallRecord>* out);
// What the root compares: every call the ranks reported, by sequence, and AllToAllv's count
// rows (what rank i sends to j against what j receives from i, for every pair of ranks that
// reported the call). A record stays true once reported (rank r made that call), so reports
// only add; the oldest sequences are forgotten beyond kKeptSequences. Each report costs
// O(records · log sequences), plus O(ranks reported) per AllToAllv row.
class CallComparison {
 public:
  void add(int rank, const std::vector<CallRecord>& calls);
  // The first disagreement: at the lowest sequence reported with two fingerprints, the lowest
  // rank that reported it against the lowest whose call differs from that one's. The message
  // every rank fails with, or "" while the calls agree.
  std::string mismatch() const;
  static constexpr size_t kKeptSequences = 1024;

 private:
  struct Caller {
    int rank;
    std::string text;
  };
  // sequence -> fingerprint -> the lowest rank that reported it.
  std::map<uint64_t, std::map<uint64_t, Caller>> by_sequence_;
  std::set<uint64_t> disagreeing_;
  // AllToAllv: sequence -> rank -> its count row; sequence -> the first disagreeing pair
  // (from, to) in that order, with what from sends and to receives.
  struct CountPair {
    int from, to;
    uint64_t sends, receives;
  };
  std::map<uint64_t, std::map<int, std::vector<uint64_t>>> rows_;
  std::map<uint64_t, CountPair> count_mismatches_;
  void add_row(int rank, uint64_t sequence, const std::vector<uint64_t>& counts);
};

}  // namespace weft
