// Disaggregated serving, prefill → decode (PD): a sequence's paged KV cache
// moves from the prefill ranks to the decode ranks layer by layer and page by
// page, with its KV heads resharded from the prefill TP size to the decode TP
// size. The prefill side hands each layer over as soon as it is computed; the
// decode side can start a layer as soon as that layer has arrived. Included by
// weft/parallel.hpp. (Attention → FFN disaggregation is the MoE dispatcher
// with MoeOptions::expert_ranks, ep.hpp.)
#pragma once

#include <cstddef>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

namespace weft::parallel {

class Axis;
class Ledger;

// The model's KV cache: per layer, KV heads of head_dim values, in pages of
// page_tokens positions.
struct KvCacheShape {
  int layers = 0;
  int kv_heads = 0;
  int head_dim = 0;
  int page_tokens = 0;
};

// One rank's paged cache (fp32): `pages` pages per layer. The rank is TP rank
// tp_rank of tp and holds KV heads [tp_rank·kv_heads/tp, (tp_rank+1)·kv_heads/tp)
// (kv_heads must divide by tp). A page is head-major: for each local head,
// K [page_tokens, head_dim] then V [page_tokens, head_dim], so the K and V of
// a range of heads are one contiguous block of the page.
class PagedKvCache {
 public:
  PagedKvCache(const KvCacheShape& shape, int tp, int tp_rank, size_t pages);
  ~PagedKvCache();
  PagedKvCache(PagedKvCache&&) noexcept;
  PagedKvCache& operator=(PagedKvCache&&) noexcept;

  const KvCacheShape& shape() const;
  int tp() const;
  int head_begin() const;  // this rank's first KV head
  int heads() const;       // its KV heads
  size_t pages() const;
  size_t page_floats() const;  // heads · 2 · page_tokens · head_dim

  std::span<float> page(int layer, size_t page);
  std::span<const float> page(int layer, size_t page) const;
  // head_dim values of local head `head` at `slot` (< page_tokens) of a page.
  std::span<float> key(int layer, size_t page, int head, int slot);
  std::span<float> value(int layer, size_t page, int head, int slot);
  std::span<const float> key(int layer, size_t page, int head, int slot) const;
  std::span<const float> value(int layer, size_t page, int head, int slot) const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

// The ranks of the axis's communicator on each side, in TP order; the two
// lists are disjoint. Every (prefill, decode) pair whose head ranges overlap
// exchanges, per layer and page, the K and V of the overlap: one message.
struct KvTransferGroups {
  std::vector<int> prefill;
  std::vector<int> decode;
};

// Moves one sequence's cache at a time over `axis` (any communicator holding
// both sides, e.g. Axis(world, "pd", &ledger)); its transfers run on the
// axis's stream. A rank of neither side takes no part. Ledger: "pd.kv" with
// "send" on prefill ranks and "recv" on decode ranks, one entry per layer and
// peer, bytes per call = the pages' share of that pair (expected_kv_transfer
// gives the closed form). Pages are sent whole, filled or not.
class KvTransfer {
 public:
  KvTransfer(const Axis& axis, const KvCacheShape& shape, KvTransferGroups groups);
  ~KvTransfer();
  KvTransfer(KvTransfer&&) noexcept;
  KvTransfer& operator=(KvTransfer&&) noexcept;

  bool is_prefill() const;
  bool is_decode() const;
  // Its TP rank on its side (-1 on neither).
  int tp_rank() const;
  // The KV heads this rank and decode (or prefill) TP rank `peer` share,
  // as [begin, end) of the model's heads (empty when they share none).
  std::pair<int, int> shared_heads(int peer) const;

  // Prefill: sends `layer`'s pages (the sequence's block table in `cache`,
  // page i to the decode side's page i) and returns at once; the pages must
  // not change until finish(). Layers are sent in order, 0 first.
  void send_layer(const PagedKvCache& cache, int layer, std::span<const size_t> pages);
  // Decode: posts the receives of every layer into `pages` of `cache` (as
  // many pages as the sender's block table) and returns at once.
  void receive(PagedKvCache& cache, std::span<const size_t> pages);
  // Decode: blocks until `layer` is in the cache; returns the seconds it waited.
  double wait_layer(int layer);
  // Both sides: waits for everything posted; ready for the next sequence.
  void finish();

 private:
  struct State;
  std::unique_ptr<State> state_;
};

// The closed form of one sequence's transfer of `pages` pages on comm rank
// `rank`, as KvTransfer books it under `dim`: per layer and overlapping peer,
// pages · shared heads · 2 · page_tokens · head_dim · 4 bytes. Summed over
// the prefill ranks it is layers · pages · kv_heads · 2 · page_tokens ·
// head_dim · 4, whatever the two TP sizes.
void expected_kv_transfer(const KvCacheShape& shape, const KvTransferGroups& groups, size_t pages,
                          int rank, std::string_view dim, Ledger& ledger);

}  // namespace weft::parallel
