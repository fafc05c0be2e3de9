// Bruck: ceil(log2 n) messages per rank for any n, at the cost of local
// rotations through scratch. For small, latency-bound messages.
#include <algorithm>
#include <vector>

#include "algorithms/families.h"

namespace weft::algo::detail {

// Works on a rotated copy in which block j is rank r+j's: in the round with
// distance d a rank sends its first min(d, n-d) blocks to r-d and receives
// as many from r+d behind them. One rotation at the end puts blocks in rank
// order.
void bruck_allgather(const Params& p, Emitter& e) {
  const int n = p.nranks;
  const uint64_t count = p.count;
  const Range tmp = e.scratch(n * count);
  LastTouch written;  // indexed like tmp
  written.set(Span{0, count}, e.copy(sub(tmp, Span{0, count}), at(Buf::Input, 0, count)));
  for (int d = 1; d < n; d *= 2) {
    const uint64_t len = std::min(d, n - d) * count;
    send_written(e, wrap_rank(int64_t{p.rank} - d, n), tmp, Span{0, len}, p.chunk, written);
    recv_noted(e, wrap_rank(int64_t{p.rank} + d, n), tmp, Span{d * count, len}, p.chunk, nullptr,
               &written);
  }
  // tmp[j] goes to output block r+j; in place this also rewrites the input
  // block, after the first copy read it (that copy wrote tmp[0]).
  const uint64_t head = (n - p.rank) * count;
  std::vector<uint32_t> deps;
  written.collect(Span{0, head}, &deps);
  e.copy(at(Buf::Output, p.rank * count, head), sub(tmp, Span{0, head}), deps);
  if (p.rank > 0) {
    deps.clear();
    written.collect(Span{head, p.rank * count}, &deps);
    e.copy(at(Buf::Output, 0, p.rank * count), sub(tmp, Span{head, p.rank * count}), deps);
  }
}

// Rotate so that block j is the one for rank r+j; in the round with distance
// d send every block whose index has bit d set to r+d (packed into one
// message) and take r-d's blocks in their place; finally block j holds what
// rank r-j sent to this rank.
void bruck_alltoall(const Params& p, Emitter& e) {
  const int n = p.nranks;
  const int r = p.rank;
  const uint64_t b = p.count;
  const Range tmp = e.scratch(n * b);
  LastTouch written;  // indexed like tmp
  const uint64_t head = (n - r) * b;
  const uint32_t head_copy = e.copy(sub(tmp, Span{0, head}), at(Buf::Input, r * b, head));
  written.set(Span{0, head}, head_copy);
  uint32_t tail_copy = kNone;
  if (r > 0) {
    tail_copy = e.copy(sub(tmp, Span{head, r * b}), at(Buf::Input, 0, r * b));
    written.set(Span{head, r * b}, tail_copy);
  }
  // Blocks with bit d set come in runs of d: [j, j + d) for j = d, 3d, 5d...
  auto runs = [n](int d) {
    std::vector<Span> out;
    for (int j = d; j < n; j += 2 * d) {
      out.push_back(Span{static_cast<uint64_t>(j), static_cast<uint64_t>(std::min(d, n - j))});
    }
    return out;
  };
  uint64_t most = 0;
  for (int d = 1; d < n; d *= 2) {
    uint64_t blocks = 0;
    for (const Span& run : runs(d)) blocks += run.count;
    most = std::max(most, blocks);
  }
  const Range out_stage = e.scratch(most * b);
  const Range in_stage = e.scratch(most * b);
  LastTouch out_written, out_read, in_written, in_read;  // indexed like the stages
  std::vector<uint32_t> deps;
  for (int d = 1; d < n; d *= 2) {
    const std::vector<Span> round = runs(d);
    std::vector<uint32_t> packs;
    uint64_t pos = 0;
    for (const Span& run : round) {
      const Span from{run.offset * b, run.count * b};
      const Span to{pos, run.count * b};
      deps.clear();
      written.collect(from, &deps);
      out_read.collect(to, &deps);
      packs.push_back(e.copy(sub(out_stage, to), sub(tmp, from), deps));
      out_written.set(to, packs.back());
      pos += to.count;
    }
    send_written(e, wrap_rank(int64_t{r} + d, n), out_stage, Span{0, pos}, p.chunk, out_written,
                 &out_read);
    recv_noted(e, wrap_rank(int64_t{r} - d, n), in_stage, Span{0, pos}, p.chunk, &in_read,
               &in_written);
    pos = 0;
    for (size_t i = 0; i < round.size(); ++i) {
      const Span to{round[i].offset * b, round[i].count * b};
      const Span from{pos, round[i].count * b};
      deps.clear();
      in_written.collect(from, &deps);
      deps.push_back(packs[i]);  // the pack read these tmp blocks
      const uint32_t unpack = e.copy(sub(tmp, to), sub(in_stage, from), deps);
      written.set(to, unpack);
      in_read.set(from, unpack);
      pos += from.count;
    }
  }
  for (int j = 0; j < n; ++j) {
    const int from = wrap_rank(int64_t{r} - j, n);
    deps.clear();
    written.collect(Span{j * b, b}, &deps);
    // In place, output block `from` is input block `from`, read by a rotation copy.
    if (p.in_place) deps.push_back(from >= r ? head_copy : tail_copy);
    e.copy(at(Buf::Output, from * b, b), sub(tmp, Span{j * b, b}), deps);
  }
}

}  // namespace weft::algo::detail
