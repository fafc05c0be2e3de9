// Expert-parallel dispatch and combine: the routing layout, the count
// exchange (or the worst-case blocks of the count-sync-free mode), one
// AllToAllv per direction of fixed-stride byte records, the grouping by
// local expert, and the adjoints that reuse the layout.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <string>

#include "parallel/internal.h"
#include "weft/parallel/ep.hpp"

namespace weft::parallel {

using detail::require;

namespace {

using Bytes = std::vector<unsigned char>;

// Rows per peer on the wire and where each peer's block starts: the exact
// counts, or in the count-sync-free mode `block` rows for every peer whose
// link may carry rows (open[p]: not when the receiving end holds no experts).
struct Wire {
  std::vector<size_t> rows, offsets;
  size_t total = 0;
};

Wire make_wire(const std::vector<size_t>& rows, size_t block, const std::vector<bool>& open) {
  Wire w;
  for (size_t p = 0; p < rows.size(); ++p) {
    w.rows.push_back(block == 0 ? rows[p] : open[p] ? block : 0);
    w.offsets.push_back(w.total);
    w.total += w.rows.back();
  }
  return w;
}

template <typename T>
void put(unsigned char* at, T value) {
  std::memcpy(at, &value, sizeof value);
}
template <typename T>
T get(const unsigned char* at) {
  T value;
  std::memcpy(&value, at, sizeof value);
  return value;
}

void require_span(std::string_view what, size_t got, size_t want, std::string_view formula) {
  require(got == want, std::string(what) + " has " + std::to_string(got) + " elements, expected " +
                           std::string(formula) + " = " + std::to_string(want));
}

}  // namespace

struct MoeHandle::State {
  size_t tokens = 0;
  // Source side: every slot's destination EP rank (−1: unused or dropped),
  // and per destination the tokens sent there, in token order.
  std::vector<int32_t> slot_rank;
  std::vector<std::vector<size_t>> sent_tokens;
  std::vector<size_t> send_rows, recv_rows;  // per peer, real rows
  size_t block = 0;                          // count-sync-free rows per peer, else 0
  // Receive side, per received row i (peer order, then the source's token
  // order) and slot j: the local expert (−1: not here), its weight, its row
  // in the grouped input, and the weight's gradient.
  std::vector<int32_t> expert;
  std::vector<float> weight;
  std::vector<int64_t> position;
  std::vector<float> d_weight;
  std::vector<size_t> expert_rows, expert_offset;
  std::vector<float> input, output;  // grouped; output saved by combine
  bool combined = false, backward_started = false;
  size_t remote_rows = 0;
  MoeLoad load;

  size_t received_rows = 0;
  size_t received() const { return received_rows; }
  // f(peer, wire row, received row) over every received row.
  template <typename F>
  void for_received(const Wire& wire, F f) const {
    size_t i = 0;
    for (size_t p = 0; p < recv_rows.size(); ++p)
      for (size_t n = 0; n < recv_rows[p]; ++n, ++i) f(p, wire.offsets[p] + n, i);
  }
  // f(peer, wire row, token) over every sent row.
  template <typename F>
  void for_sent(const Wire& wire, F f) const {
    for (size_t p = 0; p < sent_tokens.size(); ++p)
      for (size_t n = 0; n < sent_tokens[p].size(); ++n)
        f(p, wire.offsets[p] + n, sent_tokens[p][n]);
  }
};

MoeHandle::MoeHandle() : state_(std::make_unique<State>()) {}
MoeHandle::~MoeHandle() = default;
MoeHandle::MoeHandle(MoeHandle&&) noexcept = default;
MoeHandle& MoeHandle::operator=(MoeHandle&&) noexcept = default;

std::span<const float> MoeHandle::expert_input() const {
  return state_->input;
}
size_t MoeHandle::rows() const {
  return state_->expert_offset.empty() ? 0
                                       : state_->expert_offset.back() + state_->expert_rows.back();
}
size_t MoeHandle::expert_rows(int local_expert) const {
  require(local_expert >= 0 && size_t(local_expert) < state_->expert_rows.size(),
          "local_expert=" + std::to_string(local_expert) + " is out of range [0, " +
              std::to_string(state_->expert_rows.size()) + ")");
  return state_->expert_rows[local_expert];
}
size_t MoeHandle::expert_offset(int local_expert) const {
  expert_rows(local_expert);  // the range check
  return state_->expert_offset[local_expert];
}
const MoeLoad& MoeHandle::load() const {
  return state_->load;
}
size_t MoeHandle::remote_rows_sent() const {
  return state_->remote_rows;
}

struct MoeDispatcher::State {
  const Axis& axis;
  MoeOptions options;
  // local: the experts of an expert-holding rank; own: this rank's (local,
  // or 0 outside MoeOptions::expert_ranks), first: its first expert.
  int ranks = 1, rank = 0, local = 0, own = 0, first = -1;
  size_t k = 0, h = 0;
  // Ledger patterns are prefix + ".dispatch", ...; the load is noted when `note`.
  std::string prefix = "ep";
  bool note = true;
  // Where a slot for EP rank q travels (the hierarchical dispatcher's proxy)
  // and what its record names there: g − shift[q]. Flat: q itself and the
  // local expert (shift q · local).
  std::vector<int32_t> peer_of_rank, shift;
  // Per axis rank: it holds experts (rows can go to it); per axis rank: this
  // rank holds experts (rows can come from it).
  std::vector<bool> holds, receives;

  State(const Axis& a, const MoeOptions& o) : axis(a), options(o) {}

  // Pairs each source may send one expert: C, or "unbounded".
  size_t capacity(size_t tokens) const {
    if (options.capacity_factor <= 0) return std::numeric_limits<size_t>::max();
    return static_cast<size_t>(
        std::ceil(options.capacity_factor * double(tokens) * double(k) / double(options.experts)));
  }

  // One AllToAllv of `stride`-byte records from `send` (laid out by `out`)
  // into `recv` (laid out by `in`), booked with the logical size `logical`
  // and the bytes that left this rank. One rank: a copy, not booked.
  void exchange(std::string_view pattern, const Wire& out, const Wire& in, size_t stride,
                const Bytes& send, Bytes& recv, size_t logical) const {
    recv.assign(in.total * stride, 0);
    if (ranks == 1) {
      std::copy(send.begin(), send.end(), recv.begin());
      return;
    }
    std::vector<size_t> sc(ranks), sd(ranks), rc(ranks), rd(ranks);
    size_t sent = 0;
    for (int p = 0; p < ranks; ++p) {
      sc[p] = out.rows[p] * stride, sd[p] = out.offsets[p] * stride;
      rc[p] = in.rows[p] * stride, rd[p] = in.offsets[p] * stride;
      if (p != rank) sent += sc[p];
    }
    // Booked directly: bytes sent may be 0 (every row local), which the
    // shared booking would read as "derive from the closed form".
    double start = detail::now_s();
    check(weftAllToAllv(send.data(), sc.data(), sd.data(), recv.data(), rc.data(), rd.data(),
                        weftUint8, axis.comm(), axis.stream()));
    std::string algorithm = detail::last_algorithm(axis.comm());
    check(weftStreamSynchronize(axis.stream()));
    double elapsed = detail::now_s() - start;
    if (axis.ledger() != nullptr)
      axis.ledger()->record(pattern, "alltoallv", axis.name(), logical, sent, algorithm, elapsed,
                            elapsed);
  }

  // The routing layout of one dispatch on the source side.
  void route(MoeHandle::State& hs, std::span<const int32_t> index) const {
    const size_t cap = capacity(hs.tokens);
    std::vector<size_t> taken(options.experts, 0);
    hs.slot_rank.assign(hs.tokens * k, -1);
    hs.sent_tokens.assign(ranks, {});
    for (size_t t = 0; t < hs.tokens; ++t) {
      for (size_t j = 0; j < k; ++j) {
        int32_t g = index[t * k + j];
        if (g < 0) continue;
        if (taken[g] == cap) {
          ++hs.load.dropped;
          continue;
        }
        ++taken[g];
        hs.slot_rank[t * k + j] = peer_of_rank[g / local];
      }
      // Once per destination rank, however many of its experts the token chose.
      for (int p = 0; p < ranks; ++p)
        for (size_t j = 0; j < k; ++j)
          if (hs.slot_rank[t * k + j] == p) {
            hs.sent_tokens[p].push_back(t);
            break;
          }
    }
    hs.send_rows.resize(ranks);
    for (int p = 0; p < ranks; ++p) {
      hs.send_rows[p] = hs.sent_tokens[p].size();
      if (p != rank) hs.remote_rows += hs.send_rows[p];
    }
    hs.load.expert_tokens = taken;
  }

  // Count exchange: every rank's pairs per expert and rows per destination,
  // so each rank knows its receive counts and the load of the whole group.
  void exchange_counts(MoeHandle::State& hs) const {
    const size_t width = size_t(options.experts) + size_t(ranks);
    std::vector<uint64_t> mine(width), all(width * ranks);
    for (int g = 0; g < options.experts; ++g) mine[g] = hs.load.expert_tokens[g];
    for (int p = 0; p < ranks; ++p) mine[options.experts + p] = hs.send_rows[p];
    if (ranks == 1) {
      all = mine;
    } else {
      detail::blocking(axis, prefix + ".counts", "allgather", all.size() * sizeof(uint64_t),
                       [&](weftComm_t c, weftStream_t s) {
                         return weftAllGather(mine.data(), all.data(), width, weftUint64, c, s);
                       });
    }
    hs.recv_rows.assign(ranks, 0);
    hs.load.expert_tokens.assign(options.experts, 0);
    hs.load.rank_rows.assign(ranks, 0);
    for (int p = 0; p < ranks; ++p) {
      const uint64_t* row = all.data() + size_t(p) * width;
      hs.recv_rows[p] = row[options.experts + rank];
      for (int g = 0; g < options.experts; ++g) hs.load.expert_tokens[g] += row[g];
      for (int r = 0; r < ranks; ++r) hs.load.rank_rows[r] += row[options.experts + r];
    }
  }

  // Groups the received rows by local expert (pad: to C · ranks rows each).
  void group(MoeHandle::State& hs, const Bytes& recv, const Wire& wire, size_t stride) const {
    const size_t rows = hs.received();
    std::vector<size_t> count(own, 0);
    for (int32_t e : hs.expert)
      if (e >= 0) ++count[e];
    hs.expert_rows.assign(own, 0);
    hs.expert_offset.assign(own, 0);
    const size_t padded = options.pad ? capacity(pad_tokens(hs.tokens)) * ranks : 0;
    size_t offset = 0;
    for (int e = 0; e < own; ++e) {
      require(!options.pad || count[e] <= padded,
              "pad: local expert " + std::to_string(e) + " received " + std::to_string(count[e]) +
                  " rows, more than capacity · ep = " + std::to_string(padded) +
                  " (do all ranks dispatch the same number of tokens?)");
      hs.expert_rows[e] = options.pad ? padded : count[e];
      hs.expert_offset[e] = offset;
      offset += hs.expert_rows[e];
    }
    hs.input.assign(offset * h, 0.0f);
    hs.position.assign(rows * k, -1);
    std::vector<size_t> filled(own, 0);
    hs.for_received(wire, [&](size_t, size_t w, size_t i) {
      const unsigned char* record = recv.data() + w * stride;
      for (size_t j = 0; j < k; ++j) {
        int32_t e = hs.expert[i * k + j];
        if (e < 0) continue;
        size_t at = hs.expert_offset[e] + filled[e]++;
        hs.position[i * k + j] = int64_t(at);
        std::memcpy(hs.input.data() + at * h, record, h * sizeof(float));
      }
    });
  }

  // The token count the pad size is computed from: the bound when there is one.
  size_t pad_tokens(size_t tokens) const {
    return options.max_tokens != 0 ? options.max_tokens : tokens;
  }

  void note_load(const MoeHandle::State& hs) const {
    Ledger* ledger = axis.ledger();
    if (ledger == nullptr || !note) return;
    auto add = [&](const std::string& name, double value) {
      ledger->note(name, ledger->noted(name) + value);
    };
    for (size_t g = 0; g < hs.load.expert_tokens.size(); ++g)
      add("ep.load.expert." + std::to_string(g), double(hs.load.expert_tokens[g]));
    for (size_t r = 0; r < hs.load.rank_rows.size(); ++r)
      add("ep.load.rank." + std::to_string(r), double(hs.load.rank_rows[r]));
    add("ep.load.dropped", double(hs.load.dropped));
    ledger->note("ep.load.imbalance",
                 std::max(ledger->noted("ep.load.imbalance"), hs.load.imbalance));
  }

  Wire dispatch_send(const MoeHandle::State& hs) const {
    return make_wire(hs.send_rows, hs.block, holds);
  }
  Wire dispatch_recv(const MoeHandle::State& hs) const {
    return make_wire(hs.recv_rows, hs.block, receives);
  }
  size_t logical(const MoeHandle::State& hs) const { return hs.tokens * k * h * sizeof(float); }

  void validate(std::span<const float> x, size_t tokens, std::span<const int32_t> topk_index,
                std::span<const float> topk_weight) const {
    require_span("x", x.size(), tokens * h, "tokens·hidden");
    require_span("topk_index", topk_index.size(), tokens * k, "tokens·topk");
    require_span("topk_weight", topk_weight.size(), tokens * k, "tokens·topk");
    for (size_t i = 0; i < topk_index.size(); ++i)
      require(topk_index[i] >= -1 && topk_index[i] < options.experts,
              "topk_index[" + std::to_string(i) + "]=" + std::to_string(topk_index[i]) +
                  " is out of range [0, experts=" + std::to_string(options.experts) +
                  ") (-1: an unused slot)");
    require(options.max_tokens == 0 || tokens <= options.max_tokens,
            "tokens=" + std::to_string(tokens) +
                " exceeds max_tokens=" + std::to_string(options.max_tokens));
  }

  // A dispatch record: the row, then per slot its id on the destination
  // (−1: elsewhere, unused or dropped) and the weight.
  size_t record_stride() const { return h * sizeof(float) + k * (sizeof(int32_t) + sizeof(float)); }

  // The routing, the counts (or the worst-case blocks) and the token
  // transfer: fills hs up to the received slots (expert, weight) and returns
  // the received records, laid out by `in`.
  Bytes send_tokens(MoeHandle::State& hs, std::span<const float> x,
                    std::span<const int32_t> topk_index, std::span<const float> topk_weight,
                    Wire& in) const {
    route(hs, topk_index);
    if (options.max_tokens != 0) {
      // A row carries at least one of its destination's pairs, and a source
      // sends each expert at most C of them.
      size_t cap = capacity(options.max_tokens);
      hs.block = options.max_tokens;
      if (cap != std::numeric_limits<size_t>::max())
        hs.block = std::min(hs.block, cap * size_t(local));
      hs.recv_rows.assign(ranks, 0);  // read from the records below
    } else {
      exchange_counts(hs);
    }
    const size_t stride = record_stride(), meta = h * sizeof(float);
    Wire out = dispatch_send(hs);
    in = dispatch_recv(hs);
    Bytes send(out.total * stride, 0), recv;
    for (size_t r = 0; r < out.total; ++r)
      for (size_t j = 0; j < k; ++j) put<int32_t>(send.data() + r * stride + meta + j * 4, -1);
    hs.for_sent(out, [&](size_t p, size_t w, size_t t) {
      unsigned char* record = send.data() + w * stride;
      std::memcpy(record, x.data() + t * h, h * sizeof(float));
      for (size_t j = 0; j < k; ++j) {
        unsigned char* slot = record + meta + j * 4;
        int32_t g = topk_index[t * k + j];
        if (hs.slot_rank[t * k + j] == int32_t(p)) put<int32_t>(slot, g - shift[g / local]);
        put<float>(slot + k * 4, topk_weight[t * k + j]);
      }
    });
    exchange(prefix + ".dispatch", out, in, stride, send, recv, logical(hs));

    auto slot_id = [&](size_t w, size_t j) {
      return get<int32_t>(recv.data() + w * stride + meta + j * 4);
    };
    if (hs.block != 0) {
      // Count-sync-free: a block's real records come first; a padding record
      // has no slot here.
      for (int p = 0; p < ranks; ++p) {
        size_t n = 0;
        for (; n < in.rows[p]; ++n) {
          bool any = false;
          for (size_t j = 0; j < k; ++j) any = any || slot_id(in.offsets[p] + n, j) >= 0;
          if (!any) break;
        }
        hs.recv_rows[p] = n;
      }
    }
    for (size_t n : hs.recv_rows) hs.received_rows += n;
    hs.expert.resize(hs.received_rows * k);
    hs.weight.resize(hs.received_rows * k);
    hs.for_received(in, [&](size_t, size_t w, size_t i) {
      for (size_t j = 0; j < k; ++j) {
        hs.expert[i * k + j] = slot_id(w, j);
        hs.weight[i * k + j] = get<float>(recv.data() + w * stride + meta + (k + j) * 4);
      }
    });
    return recv;
  }

  // The imbalance over the known experts, then the ledger notes.
  void finish_load(MoeHandle::State& hs, int first) const {
    size_t known = hs.load.global ? options.experts : own, most = 0, total = 0;
    for (size_t g = 0; g < known; ++g) {
      size_t v = hs.load.expert_tokens[hs.load.global ? g : first + g];
      most = std::max(most, v), total += v;
    }
    hs.load.imbalance = total == 0 ? 1.0 : double(most) * double(known) / double(total);
    note_load(hs);
  }

  // Token-indexed rows [tokens, hidden] to the ranks the tokens went to
  // (the dispatch direction): the received rows, one per received record.
  Bytes send_rows(const MoeHandle::State& hs, std::string_view pattern, std::span<const float> rows,
                  Wire& in) const {
    Wire out = dispatch_send(hs);
    in = dispatch_recv(hs);
    const size_t stride = h * sizeof(float);
    Bytes send(out.total * stride, 0), recv;
    hs.for_sent(out, [&](size_t, size_t w, size_t t) {
      std::memcpy(send.data() + w * stride, rows.data() + t * h, stride);
    });
    exchange(std::string(pattern), out, in, stride, send, recv, logical(hs));
    return recv;
  }

  // The combine direction: `send` (one `stride`-byte record per received
  // row, laid out by `back`) to the sources, which add each record's first
  // h floats to their token's row of `sum` and, with d_weight, take its
  // slot values for the slots that went to the sender.
  void return_rows(const MoeHandle::State& hs, std::string_view pattern, const Wire& back,
                   size_t stride, const Bytes& send, std::span<float> sum,
                   std::span<float> d_weight) const {
    Wire home = dispatch_send(hs);
    Bytes recv;
    exchange(std::string(pattern), back, home, stride, send, recv, logical(hs));
    std::fill(sum.begin(), sum.end(), 0.0f);
    std::fill(d_weight.begin(), d_weight.end(), 0.0f);
    hs.for_sent(home, [&](size_t p, size_t w, size_t t) {
      const unsigned char* record = recv.data() + w * stride;
      for (size_t c = 0; c < h; ++c) sum[t * h + c] += get<float>(record + c * 4);
      if (d_weight.empty()) return;
      for (size_t j = 0; j < k; ++j)
        if (hs.slot_rank[t * k + j] == int32_t(p))
          d_weight[t * k + j] = get<float>(record + (h + j) * 4);
    });
  }
};

MoeDispatcher::MoeDispatcher(const Axis& ep, MoeOptions options)
    : state_(std::make_unique<State>(ep, options)) {
  State& s = *state_;
  s.ranks = s.axis.size();
  s.rank = s.axis.rank();
  const MoeOptions& o = s.options;
  require(o.experts > 0, "experts=" + std::to_string(o.experts) + " must be positive");
  std::vector<int> holders = o.expert_ranks;
  if (holders.empty())
    for (int q = 0; q < s.ranks; ++q) holders.push_back(q);
  std::vector<bool> seen(s.ranks, false);
  for (size_t i = 0; i < holders.size(); ++i) {
    const int q = holders[i];
    require(q >= 0 && q < s.ranks, "expert_ranks[" + std::to_string(i) + "]=" + std::to_string(q) +
                                       " is out of range [0, " + std::to_string(s.ranks) + ") of " +
                                       s.axis.name());
    require(!seen[q], "expert_ranks: rank " + std::to_string(q) + " appears twice");
    seen[q] = true;
  }
  const int nholders = int(holders.size());
  require(o.experts % nholders == 0, "experts=" + std::to_string(o.experts) +
                                         " does not divide by the " + std::to_string(nholders) +
                                         (o.expert_ranks.empty() ? " ranks of " + s.axis.name()
                                                                 : std::string(" expert_ranks")));
  require(o.topk >= 1, "topk=" + std::to_string(o.topk) + " must be at least 1");
  require(o.topk <= o.experts, "topk=" + std::to_string(o.topk) +
                                   " is larger than experts=" + std::to_string(o.experts));
  require(o.hidden > 0, "hidden=0 must be positive");
  require(std::isfinite(o.capacity_factor) && o.capacity_factor >= 0,
          "capacity_factor=" + std::to_string(o.capacity_factor) + " must be >= 0");
  require(!o.pad || o.capacity_factor > 0, "pad needs a capacity_factor > 0");
  require(!o.pad || o.max_tokens != 0 || o.expert_ranks.empty(),
          "pad with expert_ranks needs max_tokens: the pad is sized from the tokens of a "
          "source, and the expert ranks dispatch none");
  s.local = o.experts / nholders;
  s.k = size_t(o.topk);
  s.h = o.hidden;
  for (int q = 0; q < nholders; ++q) {
    s.peer_of_rank.push_back(holders[q]);
    s.shift.push_back(q * s.local);
    if (holders[q] == s.rank) s.own = s.local, s.first = q * s.local;
  }
  s.holds = seen;
  s.receives.assign(s.ranks, s.own > 0);
}

MoeDispatcher::~MoeDispatcher() = default;
MoeDispatcher::MoeDispatcher(MoeDispatcher&&) noexcept = default;
MoeDispatcher& MoeDispatcher::operator=(MoeDispatcher&&) noexcept = default;

int MoeDispatcher::local_experts() const {
  return state_->own;
}
int MoeDispatcher::first_expert() const {
  return state_->first;
}
const Axis& MoeDispatcher::axis() const {
  return state_->axis;
}

MoeHandle MoeDispatcher::dispatch(std::span<const float> x, size_t tokens,
                                  std::span<const int32_t> topk_index,
                                  std::span<const float> topk_weight) {
  const State& s = *state_;
  s.validate(x, tokens, topk_index, topk_weight);
  MoeHandle handle;
  MoeHandle::State& hs = *handle.state_;
  hs.tokens = tokens;
  Wire in;
  Bytes recv = s.send_tokens(hs, x, topk_index, topk_weight, in);
  s.group(hs, recv, in, s.record_stride());
  if (hs.block != 0) {
    // Only what reached this rank is known without a count exchange.
    hs.load.global = false;
    hs.load.expert_tokens.assign(s.options.experts, 0);
    for (int32_t e : hs.expert)
      if (e >= 0) ++hs.load.expert_tokens[first_expert() + e];
    hs.load.rank_rows.assign(s.ranks, 0);
    hs.load.rank_rows[s.rank] = hs.received();
  }
  s.finish_load(hs, first_expert());
  return handle;
}

void MoeDispatcher::combine(MoeHandle& handle, std::span<const float> expert_output,
                            std::span<float> out) {
  const State& s = *state_;
  MoeHandle::State& hs = *handle.state_;
  const size_t k = s.k, h = s.h;
  require_span("expert_output", expert_output.size(), handle.rows() * h, "rows·hidden");
  require_span("out", out.size(), hs.tokens * h, "tokens·hidden");
  hs.output.assign(expert_output.begin(), expert_output.end());
  hs.combined = true;
  // One row back per received row: the weighted sum over this rank's slots.
  Wire back = s.dispatch_recv(hs);
  const size_t stride = h * sizeof(float);
  Bytes send(back.total * stride, 0);
  hs.for_received(back, [&](size_t, size_t w, size_t i) {
    std::vector<float> sum(h, 0.0f);
    for (size_t j = 0; j < k; ++j) {
      int64_t at = hs.position[i * k + j];
      if (at < 0) continue;
      const float* y = expert_output.data() + size_t(at) * h;
      for (size_t c = 0; c < h; ++c) sum[c] += hs.weight[i * k + j] * y[c];
    }
    std::memcpy(send.data() + w * stride, sum.data(), stride);
  });
  s.return_rows(hs, s.prefix + ".combine", back, stride, send, out, {});
}

void MoeDispatcher::combine_backward(MoeHandle& handle, std::span<const float> dout,
                                     std::span<float> d_expert_output) {
  const State& s = *state_;
  MoeHandle::State& hs = *handle.state_;
  const size_t k = s.k, h = s.h;
  require(hs.combined, "combine_backward needs a handle that combine() has been called with");
  require_span("dout", dout.size(), hs.tokens * h, "tokens·hidden");
  require_span("d_expert_output", d_expert_output.size(), handle.rows() * h, "rows·hidden");
  // The adjoint of combine's transfer: dout rows travel as the tokens did.
  Wire in;
  Bytes recv = s.send_rows(hs, s.prefix + ".combine_backward", dout, in);
  const size_t stride = h * sizeof(float);
  std::fill(d_expert_output.begin(), d_expert_output.end(), 0.0f);
  hs.d_weight.assign(hs.received() * k, 0.0f);
  hs.for_received(in, [&](size_t, size_t w, size_t i) {
    const unsigned char* g = recv.data() + w * stride;
    for (size_t j = 0; j < k; ++j) {
      int64_t at = hs.position[i * k + j];
      if (at < 0) continue;
      float* dy = d_expert_output.data() + size_t(at) * h;
      const float* y = hs.output.data() + size_t(at) * h;
      double dot = 0;
      for (size_t c = 0; c < h; ++c) {
        float gc = get<float>(g + c * 4);
        dy[c] = hs.weight[i * k + j] * gc;
        dot += double(gc) * y[c];
      }
      hs.d_weight[i * k + j] = float(dot);
    }
  });
  hs.backward_started = true;
}

void MoeDispatcher::dispatch_backward(MoeHandle& handle, std::span<const float> d_expert_input,
                                      std::span<float> dx, std::span<float> d_weight) {
  const State& s = *state_;
  MoeHandle::State& hs = *handle.state_;
  const size_t k = s.k, h = s.h;
  require(hs.backward_started,
          "dispatch_backward needs a handle that combine_backward() has been called with");
  require_span("d_expert_input", d_expert_input.size(), handle.rows() * h, "rows·hidden");
  require_span("dx", dx.size(), hs.tokens * h, "tokens·hidden");
  require_span("d_weight", d_weight.size(), hs.tokens * k, "tokens·topk");
  // Per received row: the sum of its copies' gradients and its slots' weight
  // gradients, back to the source.
  Wire back = s.dispatch_recv(hs);
  const size_t stride = (h + k) * sizeof(float);
  Bytes send(back.total * stride, 0);
  hs.for_received(back, [&](size_t, size_t w, size_t i) {
    std::vector<float> record(h + k, 0.0f);
    for (size_t j = 0; j < k; ++j) {
      int64_t at = hs.position[i * k + j];
      if (at < 0) continue;
      const float* g = d_expert_input.data() + size_t(at) * h;
      for (size_t c = 0; c < h; ++c) record[c] += g[c];
      record[h + j] = hs.d_weight[i * k + j];
    }
    std::memcpy(send.data() + w * stride, record.data(), stride);
  });
  s.return_rows(hs, s.prefix + ".dispatch_backward", back, stride, send, dx, d_weight);
}

// ---------------------------------------------------------------------------
// Hierarchical dispatch: the inter-node stage is the flat dispatcher's
// source side with every slot sent to its node's proxy (records naming the
// expert in the node's numbering); the proxy's received rows are a batch
// for a flat dispatcher over the node.

struct HierMoeDispatcher::State {
  MoeDispatcher inter;
  weftComm_t node_comm = nullptr;
  std::unique_ptr<Axis> node_axis;
  std::unique_ptr<MoeDispatcher> intra;

  State(const Axis& ep, const MoeOptions& options) : inter(ep, options) {}
  ~State() {
    intra.reset();
    node_axis.reset();
    if (node_comm != nullptr) weftCommDestroy(node_comm);
  }
};

HierMoeDispatcher::HierMoeDispatcher(const Axis& ep, MoeOptions options, std::vector<int> nodes) {
  require(!options.pad, "pad is not offered by the hierarchical dispatcher");
  require(options.max_tokens == 0,
          "max_tokens (count-sync-free) is not offered by the hierarchical dispatcher");
  require(options.expert_ranks.empty(),
          "expert_ranks (attention-FFN disaggregation) is not offered by the hierarchical "
          "dispatcher");
  require(int(nodes.size()) == ep.size(), "nodes has " + std::to_string(nodes.size()) +
                                              " entries for the " + std::to_string(ep.size()) +
                                              " ranks of " + ep.name());
  for (size_t q = 0; q < nodes.size(); ++q)
    require(nodes[q] >= 0,
            "nodes[" + std::to_string(q) + "]=" + std::to_string(nodes[q]) + " must be >= 0");
  state_ = std::make_unique<State>(ep, options);
  MoeDispatcher::State& s = *state_->inter.state_;
  // Each rank's position in its node, and the members of every node.
  std::vector<int32_t> position(s.ranks);
  std::vector<std::vector<int32_t>> members(*std::max_element(nodes.begin(), nodes.end()) + 1);
  for (int q = 0; q < s.ranks; ++q) {
    position[q] = int32_t(members[nodes[q]].size());
    members[nodes[q]].push_back(q);
  }
  for (int q = 0; q < s.ranks; ++q) {
    const auto& node = members[nodes[q]];
    s.peer_of_rank[q] = node[size_t(position[s.rank]) % node.size()];
    s.shift[q] = (q - position[q]) * s.local;
  }
  s.prefix = "ep.inter";

  check(weftCommSplit(ep.comm(), nodes[s.rank], s.rank, &state_->node_comm, nullptr));
  state_->node_axis = std::make_unique<Axis>(state_->node_comm, ep.name() + ".node", ep.ledger());
  MoeOptions node_options;
  node_options.experts = s.local * int(members[nodes[s.rank]].size());
  node_options.hidden = s.h;
  node_options.capacity_factor = 0;  // drops are decided at the source
  state_->intra = std::make_unique<MoeDispatcher>(*state_->node_axis, node_options);
  // A node may hold fewer experts than a token has slots: keep the slot count.
  MoeDispatcher::State& n = *state_->intra->state_;
  n.options.topk = options.topk;
  n.k = s.k;
  n.prefix = "ep.intra";
  n.note = false;
}

HierMoeDispatcher::~HierMoeDispatcher() = default;
HierMoeDispatcher::HierMoeDispatcher(HierMoeDispatcher&&) noexcept = default;
HierMoeDispatcher& HierMoeDispatcher::operator=(HierMoeDispatcher&&) noexcept = default;

int HierMoeDispatcher::local_experts() const {
  return state_->inter.local_experts();
}
int HierMoeDispatcher::first_expert() const {
  return state_->inter.first_expert();
}
const Axis& HierMoeDispatcher::axis() const {
  return state_->inter.axis();
}

HierMoeHandle HierMoeDispatcher::dispatch(std::span<const float> x, size_t tokens,
                                          std::span<const int32_t> topk_index,
                                          std::span<const float> topk_weight) {
  const MoeDispatcher::State& s = *state_->inter.state_;
  const size_t h = s.h;
  s.validate(x, tokens, topk_index, topk_weight);
  HierMoeHandle handle;
  MoeHandle::State& hs = *handle.inter_.state_;
  hs.tokens = tokens;
  Wire in;
  Bytes recv = s.send_tokens(hs, x, topk_index, topk_weight, in);
  s.finish_load(hs, first_expert());
  // The proxy's batch: every received row with its slots on this node.
  std::vector<float> rows(hs.received() * h);
  hs.for_received(in, [&](size_t, size_t w, size_t i) {
    std::memcpy(rows.data() + i * h, recv.data() + w * s.record_stride(), h * sizeof(float));
  });
  handle.intra_ = state_->intra->dispatch(rows, hs.received(), hs.expert, hs.weight);
  return handle;
}

void HierMoeDispatcher::combine(HierMoeHandle& handle, std::span<const float> expert_output,
                                std::span<float> out) {
  const MoeDispatcher::State& s = *state_->inter.state_;
  const MoeHandle::State& hs = *handle.inter_.state_;
  require_span("out", out.size(), hs.tokens * s.h, "tokens·hidden");
  std::vector<float> node_sum(hs.received() * s.h);
  state_->intra->combine(handle.intra_, expert_output, node_sum);
  // One row per (token, node) back to the source.
  Wire back = s.dispatch_recv(hs);
  const size_t stride = s.h * sizeof(float);
  Bytes send(back.total * stride, 0);
  hs.for_received(back, [&](size_t, size_t w, size_t i) {
    std::memcpy(send.data() + w * stride, node_sum.data() + i * s.h, stride);
  });
  s.return_rows(hs, "ep.inter.combine", back, stride, send, out, {});
}

void HierMoeDispatcher::combine_backward(HierMoeHandle& handle, std::span<const float> dout,
                                         std::span<float> d_expert_output) {
  const MoeDispatcher::State& s = *state_->inter.state_;
  const MoeHandle::State& hs = *handle.inter_.state_;
  require(handle.intra_.state_->combined,
          "combine_backward needs a handle that combine() has been called with");
  require_span("dout", dout.size(), hs.tokens * s.h, "tokens·hidden");
  require_span("d_expert_output", d_expert_output.size(), handle.rows() * s.h, "rows·hidden");
  Wire in;
  Bytes recv = s.send_rows(hs, "ep.inter.combine_backward", dout, in);
  std::vector<float> node_dout(hs.received() * s.h);
  hs.for_received(in, [&](size_t, size_t w, size_t i) {
    std::memcpy(node_dout.data() + i * s.h, recv.data() + w * s.h * sizeof(float),
                s.h * sizeof(float));
  });
  state_->intra->combine_backward(handle.intra_, node_dout, d_expert_output);
}

void HierMoeDispatcher::dispatch_backward(HierMoeHandle& handle,
                                          std::span<const float> d_expert_input,
                                          std::span<float> dx, std::span<float> d_weight) {
  const MoeDispatcher::State& s = *state_->inter.state_;
  const MoeHandle::State& hs = *handle.inter_.state_;
  const size_t k = s.k, h = s.h;
  require(handle.intra_.state_->backward_started,
          "dispatch_backward needs a handle that combine_backward() has been called with");
  require_span("dx", dx.size(), hs.tokens * h, "tokens·hidden");
  require_span("d_weight", d_weight.size(), hs.tokens * k, "tokens·topk");
  const size_t n = hs.received();
  std::vector<float> node_dx(n * h), node_dw(n * k);
  state_->intra->dispatch_backward(handle.intra_, d_expert_input, node_dx, node_dw);
  Wire back = s.dispatch_recv(hs);
  const size_t stride = (h + k) * sizeof(float);
  Bytes send(back.total * stride, 0);
  hs.for_received(back, [&](size_t, size_t w, size_t i) {
    std::memcpy(send.data() + w * stride, node_dx.data() + i * h, h * sizeof(float));
    std::memcpy(send.data() + w * stride + h * sizeof(float), node_dw.data() + i * k,
                k * sizeof(float));
  });
  s.return_rows(hs, "ep.inter.dispatch_backward", back, stride, send, dx, d_weight);
}

std::vector<int> ep_nodes(const Mesh& mesh) {
  std::map<std::string, int> label;
  for (const std::string& host : mesh.hosts()) label.emplace(host, int(label.size()));
  std::vector<int> nodes;
  for (int world_rank : mesh.expert_group_ranks("ep", mesh.world_rank()))
    nodes.push_back(label.at(mesh.hosts()[world_rank]));
  return nodes;
}

}  // namespace weft::parallel
