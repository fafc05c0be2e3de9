// Prefill → decode KV-cache transfer: per layer one group of point-to-point
// messages on the axis stream, one message per (page, overlapping peer), each
// the contiguous head range the pair shares; an event after each layer's
// group lets the decode side wait for that layer alone.
#include <algorithm>
#include <set>

#include "parallel/internal.h"

namespace weft::parallel {

using detail::require;

namespace {

template <typename T>
std::string str(T v) {
  return std::to_string(v);
}

void require_shape(const KvCacheShape& s) {
  require(s.layers > 0, "layers=" + str(s.layers) + " must be positive");
  require(s.kv_heads > 0, "kv_heads=" + str(s.kv_heads) + " must be positive");
  require(s.head_dim > 0, "head_dim=" + str(s.head_dim) + " must be positive");
  require(s.page_tokens > 0, "page_tokens=" + str(s.page_tokens) + " must be positive");
}

// Heads [begin, end) of TP rank r of tp.
std::pair<int, int> head_range(int kv_heads, int tp, int r) {
  int per = kv_heads / tp;
  return {r * per, (r + 1) * per};
}

std::pair<int, int> overlap(std::pair<int, int> a, std::pair<int, int> b) {
  int begin = std::max(a.first, b.first), end = std::min(a.second, b.second);
  return begin < end ? std::pair{begin, end} : std::pair{0, 0};
}

// Floats of one head's K and V in a page.
size_t head_floats(const KvCacheShape& s) {
  return 2 * size_t(s.page_tokens) * size_t(s.head_dim);
}

void require_tp(const KvCacheShape& s, int tp, std::string_view what) {
  require(tp > 0, std::string(what) + "=" + str(tp) + " must be positive");
  require(s.kv_heads % tp == 0, "kv_heads=" + str(s.kv_heads) + " does not divide by " +
                                    std::string(what) + "=" + str(tp));
}

}  // namespace

// ---------------------------------------------------------------------------

struct PagedKvCache::State {
  KvCacheShape shape;
  int tp = 1, head_begin = 0, heads = 0;
  size_t pages = 0, page_floats = 0;
  std::vector<float> data;

  size_t at(int layer, size_t page) const {
    require(layer >= 0 && layer < shape.layers,
            "layer=" + str(layer) + " is out of range [0, " + str(shape.layers) + ")");
    require(page < pages, "page=" + str((page)) + " is out of range [0, " + str((pages)) + ")");
    return (size_t(layer) * pages + page) * page_floats;
  }
  size_t at(int layer, size_t page, int head, int slot, bool value) const {
    size_t base = at(layer, page);
    require(head >= 0 && head < heads,
            "head=" + str(head) + " is out of range [0, " + str(heads) + ") (local heads)");
    require(
        slot >= 0 && slot < shape.page_tokens,
        "slot=" + str(slot) + " is out of range [0, page_tokens=" + str(shape.page_tokens) + ")");
    size_t per = size_t(shape.page_tokens) * size_t(shape.head_dim);
    return base + size_t(head) * 2 * per + (value ? per : 0) +
           size_t(slot) * size_t(shape.head_dim);
  }
};

PagedKvCache::PagedKvCache(const KvCacheShape& shape, int tp, int tp_rank, size_t pages)
    : state_(std::make_unique<State>()) {
  require_shape(shape);
  require_tp(shape, tp, "tp");
  require(tp_rank >= 0 && tp_rank < tp,
          "tp_rank=" + str(tp_rank) + " is out of range [0, tp=" + str(tp) + ")");
  State& s = *state_;
  s.shape = shape;
  s.tp = tp;
  s.heads = shape.kv_heads / tp;
  s.head_begin = tp_rank * s.heads;
  s.pages = pages;
  s.page_floats = size_t(s.heads) * head_floats(shape);
  s.data.assign(size_t(shape.layers) * pages * s.page_floats, 0.0f);
}

PagedKvCache::~PagedKvCache() = default;
PagedKvCache::PagedKvCache(PagedKvCache&&) noexcept = default;
PagedKvCache& PagedKvCache::operator=(PagedKvCache&&) noexcept = default;

const KvCacheShape& PagedKvCache::shape() const {
  return state_->shape;
}
int PagedKvCache::tp() const {
  return state_->tp;
}
int PagedKvCache::head_begin() const {
  return state_->head_begin;
}
int PagedKvCache::heads() const {
  return state_->heads;
}
size_t PagedKvCache::pages() const {
  return state_->pages;
}
size_t PagedKvCache::page_floats() const {
  return state_->page_floats;
}

std::span<float> PagedKvCache::page(int layer, size_t page) {
  return {state_->data.data() + state_->at(layer, page), state_->page_floats};
}
std::span<const float> PagedKvCache::page(int layer, size_t page) const {
  return {state_->data.data() + state_->at(layer, page), state_->page_floats};
}
std::span<float> PagedKvCache::key(int layer, size_t page, int head, int slot) {
  return {state_->data.data() + state_->at(layer, page, head, slot, false),
          size_t(state_->shape.head_dim)};
}
std::span<float> PagedKvCache::value(int layer, size_t page, int head, int slot) {
  return {state_->data.data() + state_->at(layer, page, head, slot, true),
          size_t(state_->shape.head_dim)};
}
std::span<const float> PagedKvCache::key(int layer, size_t page, int head, int slot) const {
  return {state_->data.data() + state_->at(layer, page, head, slot, false),
          size_t(state_->shape.head_dim)};
}
std::span<const float> PagedKvCache::value(int layer, size_t page, int head, int slot) const {
  return {state_->data.data() + state_->at(layer, page, head, slot, true),
          size_t(state_->shape.head_dim)};
}

// ---------------------------------------------------------------------------

struct KvTransfer::State {
  const Axis& axis;
  KvCacheShape shape;
  KvTransferGroups groups;
  bool prefill = false, decode = false;
  int tp_rank = -1;
  // The other side's TP ranks this rank shares heads with, and the heads.
  struct Peer {
    int tp_rank, comm_rank;
    std::pair<int, int> heads;
  };
  std::vector<Peer> peers;
  // Decode: one event per layer posted; both: the layers posted so far.
  std::vector<weft::Event> layer_done;
  int posted = 0;
  size_t pages = 0;
  double start = 0, waited = 0;

  State(const Axis& a) : axis(a) {}

  std::pair<int, int> mine() const {
    return head_range(shape.kv_heads, int(prefill ? groups.prefill.size() : groups.decode.size()),
                      tp_rank);
  }
  std::pair<int, int> heads_of_peer(int peer) const {
    return head_range(shape.kv_heads, int(prefill ? groups.decode.size() : groups.prefill.size()),
                      peer);
  }

  size_t pair_floats(const Peer& p) const {
    return size_t(p.heads.second - p.heads.first) * head_floats(shape);
  }

  void require_cache(const PagedKvCache& cache, std::span<const size_t> block_table) const {
    const KvCacheShape& c = cache.shape();
    require(c.layers == shape.layers && c.kv_heads == shape.kv_heads &&
                c.head_dim == shape.head_dim && c.page_tokens == shape.page_tokens,
            "cache: its shape differs from the transfer's");
    require(cache.head_begin() == mine().first && cache.heads() == mine().second - mine().first,
            "cache: it holds heads [" + str(cache.head_begin()) + ", " +
                str(cache.head_begin() + cache.heads()) + "), this rank's share is [" +
                str(mine().first) + ", " + str(mine().second) + ")");
    for (size_t i = 0; i < block_table.size(); ++i)
      require(block_table[i] < cache.pages(), "pages[" + str((i)) + "]=" + str((block_table[i])) +
                                                  " is out of range [0, " + str((cache.pages())) +
                                                  ")");
  }

  // One layer's group: a message per (page, peer).
  template <typename PagePointer>
  void post(int layer, std::span<const size_t> block_table, PagePointer page_data) {
    check(weftGroupStart());
    for (const Peer& p : peers) {
      size_t n = pair_floats(p);
      size_t offset = size_t(p.heads.first - mine().first) * head_floats(shape);
      for (size_t page : block_table) {
        float* data = page_data(layer, page) + offset;
        weftResult_t rc =
            prefill ? weftSend(data, n, weftFloat32, p.comm_rank, axis.comm(), axis.stream())
                    : weftRecv(data, n, weftFloat32, p.comm_rank, axis.comm(), axis.stream());
        if (rc != weftSuccess) {
          weftGroupEnd();
          check(rc);
        }
      }
    }
    check(weftGroupEnd());
    layer_done.emplace_back();
    check(weftEventRecord(layer_done.back().get(), axis.stream()));
    ++posted;
  }

  void book(double waited) const {
    Ledger* ledger = axis.ledger();
    if (ledger == nullptr) return;
    double elapsed = detail::now_s() - start;
    for (int l = 0; l < posted; ++l)
      for (const Peer& p : peers) {
        size_t bytes = pages * pair_floats(p) * sizeof(float);
        ledger->record("pd.kv", prefill ? "send" : "recv", axis.name(), bytes, prefill ? bytes : 0,
                       "p2p", elapsed / double(posted * peers.size()),
                       waited / double(posted * peers.size()));
      }
  }
};

KvTransfer::KvTransfer(const Axis& axis, const KvCacheShape& shape, KvTransferGroups groups)
    : state_(std::make_unique<State>(axis)) {
  State& s = *state_;
  require_shape(shape);
  require(!groups.prefill.empty(), "groups.prefill is empty");
  require(!groups.decode.empty(), "groups.decode is empty");
  require_tp(shape, int(groups.prefill.size()), "groups.prefill.size()");
  require_tp(shape, int(groups.decode.size()), "groups.decode.size()");
  std::set<int> seen;
  for (const auto* list : {&groups.prefill, &groups.decode})
    for (int r : *list) {
      require(r >= 0 && r < axis.size(), "groups: rank " + str(r) + " is out of range [0, " +
                                             str(axis.size()) + ") of " + axis.name());
      require(seen.insert(r).second,
              "groups: rank " + str(r) + " appears twice (the sides must be disjoint)");
    }
  s.shape = shape;
  s.groups = std::move(groups);
  const int me = axis.rank();
  auto find = [&](const std::vector<int>& list) {
    auto it = std::find(list.begin(), list.end(), me);
    return it == list.end() ? -1 : int(it - list.begin());
  };
  if (int p = find(s.groups.prefill); p >= 0) s.prefill = true, s.tp_rank = p;
  if (int d = find(s.groups.decode); d >= 0) s.decode = true, s.tp_rank = d;
  if (s.tp_rank < 0) return;
  const std::vector<int>& other = s.prefill ? s.groups.decode : s.groups.prefill;
  for (int q = 0; q < int(other.size()); ++q) {
    auto shared = overlap(s.mine(), s.heads_of_peer(q));
    if (shared.first < shared.second) s.peers.push_back({q, other[q], shared});
  }
}

KvTransfer::~KvTransfer() {
  // The stream may still read or write the caches: wait before they go.
  if (state_ != nullptr && state_->posted > 0) weftStreamSynchronize(state_->axis.stream());
}
KvTransfer::KvTransfer(KvTransfer&&) noexcept = default;
KvTransfer& KvTransfer::operator=(KvTransfer&&) noexcept = default;

bool KvTransfer::is_prefill() const {
  return state_->prefill;
}
bool KvTransfer::is_decode() const {
  return state_->decode;
}
int KvTransfer::tp_rank() const {
  return state_->tp_rank;
}
std::pair<int, int> KvTransfer::shared_heads(int peer) const {
  const State& s = *state_;
  int others = int(s.prefill ? s.groups.decode.size() : s.groups.prefill.size());
  require(s.tp_rank >= 0, "shared_heads: this rank is on neither side");
  require(peer >= 0 && peer < others,
          "peer=" + str(peer) + " is out of range [0, " + str(others) + ")");
  return overlap(s.mine(), s.heads_of_peer(peer));
}

void KvTransfer::send_layer(const PagedKvCache& cache, int layer, std::span<const size_t> pages) {
  State& s = *state_;
  require(s.prefill, "send_layer: this rank is not on the prefill side");
  require(layer == s.posted,
          "layer=" + str(layer) + ": layers are sent in order, next is " + str(s.posted));
  require(s.posted == 0 || pages.size() == s.pages,
          "pages: " + str((pages.size())) + " pages, layer 0 sent " + str((s.pages)));
  s.require_cache(cache, pages);
  if (s.posted == 0) s.start = detail::now_s(), s.pages = pages.size();
  // The sends only read; the pointers are the cache's own.
  s.post(layer, pages,
         [&](int l, size_t p) { return const_cast<float*>(cache.page(l, p).data()); });
}

void KvTransfer::receive(PagedKvCache& cache, std::span<const size_t> pages) {
  State& s = *state_;
  require(s.decode, "receive: this rank is not on the decode side");
  require(s.posted == 0, "receive: the previous sequence's transfer is not finished");
  s.require_cache(cache, pages);
  s.start = detail::now_s();
  s.pages = pages.size();
  for (int l = 0; l < s.shape.layers; ++l)
    s.post(l, pages, [&](int layer, size_t p) { return cache.page(layer, p).data(); });
}

double KvTransfer::wait_layer(int layer) {
  State& s = *state_;
  require(s.decode, "wait_layer: this rank is not on the decode side");
  require(layer >= 0 && layer < s.posted,
          "layer=" + str(layer) + " is out of range [0, " + str(s.posted) + ") (posted layers)");
  double t0 = detail::now_s();
  check(weftEventSynchronize(s.layer_done[layer].get()));
  double waited = detail::now_s() - t0;
  s.waited += waited;
  return waited;
}

void KvTransfer::finish() {
  State& s = *state_;
  if (s.posted == 0) return;
  require(!s.prefill || s.posted == s.shape.layers,
          "finish: " + str(s.posted) + " of " + str(s.shape.layers) + " layers were sent");
  double t0 = detail::now_s();
  check(weftStreamSynchronize(s.axis.stream()));
  s.waited += detail::now_s() - t0;
  s.book(s.waited);
  s.layer_done.clear();
  s.posted = 0;
  s.waited = 0;
}

void expected_kv_transfer(const KvCacheShape& shape, const KvTransferGroups& groups, size_t pages,
                          int rank, std::string_view dim, Ledger& ledger) {
  require_shape(shape);
  auto side = [&](const std::vector<int>& list) {
    auto it = std::find(list.begin(), list.end(), rank);
    return it == list.end() ? -1 : int(it - list.begin());
  };
  const int p = side(groups.prefill), d = side(groups.decode);
  if (p < 0 && d < 0) return;
  const bool prefill = p >= 0;
  const int mine = prefill ? p : d;
  const int tp = int(prefill ? groups.prefill.size() : groups.decode.size());
  const int other = int(prefill ? groups.decode.size() : groups.prefill.size());
  require_tp(shape, tp, "tp");
  require_tp(shape, other, "tp of the other side");
  for (int l = 0; l < shape.layers; ++l)
    for (int q = 0; q < other; ++q) {
      auto shared =
          overlap(head_range(shape.kv_heads, tp, mine), head_range(shape.kv_heads, other, q));
      if (shared.first >= shared.second) continue;
      size_t bytes =
          pages * size_t(shared.second - shared.first) * head_floats(shape) * sizeof(float);
      ledger.record("pd.kv", prefill ? "send" : "recv", dim, bytes, prefill ? bytes : 0, "", 0, 0);
    }
}

}  // namespace weft::parallel
