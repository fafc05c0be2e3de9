// Algorithms are schedules: a pure function from (collective, nranks, rank,
// counts, chunking, root) to this rank's program of steps over buffer ranges.
// Nothing here does I/O or knows a transport; the host and GPU executors run
// programs, the simulator checks them, and the tuner costs them.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

namespace weft::algo {

enum class Collective : uint8_t {
  AllReduce,
  ReduceScatter,
  AllGather,
  Broadcast,
  Reduce,
  AllToAll,
  AllToAllv,
  Gather,
  Scatter,
  Barrier,
};
inline constexpr int kNumCollectives = 10;

enum class Algorithm : uint8_t {
  Ring,
  Tree,  // double binary tree
  Rhd,   // recursive halving-doubling (Rabenseifner)
  Rd,    // recursive doubling
  Bruck,
  Pairwise,
  Binomial,
  Chain,
  Dissemination,
  Hierarchical,  // inside each node, across nodes, inside each node again
  NodeLeader,    // through one leader rank per node (small messages)
  OneShot,       // direct over shared memory: every rank reads every peer's input
  TwoShot,       // direct over shared memory: reduce a slice, then gather the slices
};
inline constexpr int kNumAlgorithms = 13;

// Inline where the per-call paths ask (docs/performance.md, "Small-message fast path").
inline constexpr const char* kCollectiveNames[kNumCollectives] = {
    "allreduce", "reducescatter", "allgather", "broadcast", "reduce",
    "alltoall",  "alltoallv",     "gather",    "scatter",   "barrier",
};
// "allreduce", "reducescatter", ...
inline const char* collective_name(Collective c) {
  const int i = static_cast<int>(c);
  return i < kNumCollectives ? kCollectiveNames[i] : "unknown";
}
const char* algorithm_name(Algorithm a);  // "ring", "tree", "rhd", ...
bool parse_collective(std::string_view name, Collective* out);
bool parse_algorithm(std::string_view name, Algorithm* out);

// Direct algorithms run over memory the ranks of one node share; the host
// executor performs them itself, so they have no program (build() refuses
// them) and apply only when every rank of the communicator is on one node.
inline bool is_direct(Algorithm algorithm) {
  return algorithm == Algorithm::OneShot || algorithm == Algorithm::TwoShot;
}

// Where a range lives. Input is the user's send buffer, Output the user's
// receive buffer, Scratch a buffer the executor provides (Program::scratch_count
// elements). In-place calls alias Input and Output with NCCL's conventions:
// AllReduce/Broadcast/Reduce/AllToAll input == output; AllGather input ==
// output + rank*count; ReduceScatter output == input + rank*recvcount;
// Gather input == output + root*count (at root); Scatter output == input +
// root*count (at root). Programs must be correct under that aliasing.
enum class Buf : uint8_t { Input, Output, Scratch };

// Offsets and counts are in elements.
struct Range {
  uint64_t offset = 0;
  uint64_t count = 0;
  Buf buf = Buf::Input;
};

enum class StepKind : uint8_t {
  Send,    // a -> peer
  Recv,    // peer -> dst
  Reduce,  // dst = a (op) b, element-wise; dst may alias a or b exactly
  Copy,    // dst = a
};

// The k-th Send from rank s to rank d matches the k-th Recv on d from s, in
// program order, whatever order the executor posts them in. A step may start
// once every step it depends on has completed; steps without a dependency
// path between them may run concurrently, so every read-after-write,
// write-after-read and write-after-write hazard on overlapping ranges must be
// expressed as a (transitive) dependency.
struct Step {
  StepKind kind = StepKind::Copy;
  int32_t peer = -1;
  uint32_t first_dep = 0;  // index into Program::deps
  uint32_t num_deps = 0;
  Range a;    // Send, Reduce, Copy
  Range b;    // Reduce
  Range dst;  // Recv, Reduce, Copy
};

struct Program {
  std::vector<Step> steps;
  std::vector<uint32_t> deps;  // indices of earlier steps
  uint64_t scratch_count = 0;  // elements of scratch the program needs

  // Appends a step depending on the listed earlier steps; returns its index.
  uint32_t add(const Step& step, std::initializer_list<uint32_t> after = {});
  uint32_t add(const Step& step, const std::vector<uint32_t>& after);
};

// Where the ranks sit, for topology-aware and hierarchical schedules. Every
// rank of a communicator passes the same layout.
struct Layout {
  std::vector<int> node_of;  // node index per rank, nodes numbered 0.. by lowest rank
  std::vector<int> ring;     // ring order, every rank once; empty: 0, 1, ..., n-1
};

struct Params {
  Collective collective = Collective::AllReduce;
  Algorithm algorithm = Algorithm::Ring;
  int nranks = 1;
  int rank = 0;
  int root = 0;                    // Broadcast, Reduce, Gather, Scatter
  uint64_t count = 0;              // per collective, as the C API's count argument
  uint64_t chunk = 0;              // max elements per message (0: no chunking)
  bool in_place = false;           // Input/Output alias as described above
  const Layout* layout = nullptr;  // null: one node, rings in rank order
  // AllToAllv only (elements, indexed by peer; nranks entries each).
  const uint64_t* send_counts = nullptr;
  const uint64_t* send_displs = nullptr;
  const uint64_t* recv_counts = nullptr;
  const uint64_t* recv_displs = nullptr;
  // AllToAllv: every rank's send counts, [sender * nranks + receiver], or
  // null when unknown. Hierarchical AllToAllv needs it: a rank relaying for
  // others must know what they send (the executor gathers it first).
  const uint64_t* all_send_counts = nullptr;
};

// Elements of the Input and Output buffers this rank's program may touch. 0
// where NCCL leaves a buffer unused on this rank: Input at a non-root
// Broadcast or Scatter rank, Output at a non-root Reduce or Gather rank.
// AllToAllv: the furthest end of this rank's displacement + count pairs.
namespace detail {
// The furthest end of n displacement + count pairs (AllToAllv's buffers).
uint64_t furthest_end(const uint64_t* displs, const uint64_t* counts, int n);
}  // namespace detail
// The same for any collective but AllToAllv, from its shape alone: `n` ranks, `count` as
// the C API's argument, `root`: whether this rank is the root (the per-call paths build no
// Params).
inline uint64_t input_count(Collective c, int n, bool root, uint64_t count) {
  switch (c) {
    case Collective::ReduceScatter:
    case Collective::AllToAll:
      return static_cast<uint64_t>(n) * count;
    case Collective::Broadcast:
      return root ? count : 0;
    case Collective::Scatter:
      return root ? static_cast<uint64_t>(n) * count : 0;
    case Collective::Barrier:
      return 0;
    default:
      return count;
  }
}
inline uint64_t output_count(Collective c, int n, bool root, uint64_t count) {
  switch (c) {
    case Collective::AllGather:
    case Collective::AllToAll:
      return static_cast<uint64_t>(n) * count;
    case Collective::Reduce:
      return root ? count : 0;
    case Collective::Gather:
      return root ? static_cast<uint64_t>(n) * count : 0;
    case Collective::Barrier:
      return 0;
    default:
      return count;
  }
}
inline uint64_t input_count(const Params& p) {
  if (p.collective == Collective::AllToAllv)
    return detail::furthest_end(p.send_displs, p.send_counts, p.nranks);
  return input_count(p.collective, p.nranks, p.rank == p.root, p.count);
}
inline uint64_t output_count(const Params& p) {
  if (p.collective == Collective::AllToAllv)
    return detail::furthest_end(p.recv_displs, p.recv_counts, p.nranks);
  return output_count(p.collective, p.nranks, p.rank == p.root, p.count);
}

// Collectives the direct (shared-memory) algorithms implement.
inline bool direct_supports(Algorithm algorithm, Collective collective) {
  switch (algorithm) {
    case Algorithm::OneShot:
      return collective == Collective::AllReduce || collective == Collective::ReduceScatter ||
             collective == Collective::AllGather || collective == Collective::Broadcast ||
             collective == Collective::Reduce || collective == Collective::AllToAll ||
             collective == Collective::AllToAllv;
    case Algorithm::TwoShot:
      return collective == Collective::AllReduce;
    default:
      return false;
  }
}
// Whether `algorithm` has a schedule for `collective`.
bool has_schedule(Algorithm algorithm, Collective collective);
// Whether `algorithm` implements `collective` (for any nranks). The direct test first: it
// is a switch, the table a scan (this runs on every call).
inline bool supports(Algorithm algorithm, Collective collective) {
  return direct_supports(algorithm, collective) || has_schedule(algorithm, collective);
}

// Whether build() makes a program for `params`: the arguments are valid, the
// pair is supported, and the layout suits the algorithm (hierarchical
// ReduceScatter, AllGather and AllToAll pair ranks across nodes by their
// index in the node, so they need the same number of ranks on every node;
// hierarchical AllToAllv needs all_send_counts, consistent with this rank's
// send and receive counts).
// Otherwise false, with the reason in *why (when given). Tuners use it to
// skip candidates.
bool applicable(const Params& params, std::string* why);

// Builds this rank's program. Returns false and sets *error when the
// combination is not supported; never throws for valid input.
bool build(const Params& params, Program* program, std::string* error);

}  // namespace weft::algo
