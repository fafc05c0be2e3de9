// Prefill → decode KV-cache transfer: every prefill TP size to every decode TP
// size (heads resharded), pages scattered differently on the two sides, a rank
// of neither side, two sequences in a row, each layer usable before the next
// is even sent, the ledger against its closed form, and bad input named.
#include <numeric>
#include <tuple>

#include "parallel/support.h"

namespace weft::testing {
namespace {

using parallel::Axis;
using parallel::KvCacheShape;
using parallel::KvTransfer;
using parallel::KvTransferGroups;
using parallel::PagedKvCache;

constexpr KvCacheShape kShape{3, 12, 4, 5};  // layers, kv_heads, head_dim, page_tokens

// The value a prefill rank writes for (sequence, layer, model head, position,
// K or V, element): distinct everywhere, so a misplaced block shows.
float value_of(int sequence, int layer, int head, int position, bool v, int i) {
  return float(((((sequence * 7 + layer) * 16 + head) * 64 + position) * 2 + (v ? 1 : 0)) * 8 + i);
}

// A communicator of its own for the transfer (with its own stream).
struct PdComm {
  weftComm_t comm = nullptr;
  explicit PdComm(const weft::Comm& world) {
    check(weftCommSplit(world.get(), 0, world.rank(), &comm, nullptr));
  }
  ~PdComm() { weftCommDestroy(comm); }
};

// Prefill TP ranks first, then decode, then (idle) ranks of neither side.
KvTransferGroups groups_of(int prefill, int decode) {
  KvTransferGroups g;
  for (int r = 0; r < prefill; ++r) g.prefill.push_back(r);
  for (int r = 0; r < decode; ++r) g.decode.push_back(prefill + r);
  return g;
}

// Block tables: the sequence's pages, scattered (and different) on each side.
std::vector<size_t> block_table(size_t pages, size_t cache_pages, size_t seed) {
  std::vector<size_t> all(cache_pages);
  std::iota(all.begin(), all.end(), 0);
  for (size_t i = cache_pages; i > 1; --i) std::swap(all[i - 1], all[(seed * 31 + i * 17) % i]);
  all.resize(pages);
  return all;
}

void fill(PagedKvCache& cache, int sequence, int layer, const std::vector<size_t>& table,
          int tokens) {
  for (int t = 0; t < tokens; ++t)
    for (int j = 0; j < cache.heads(); ++j)
      for (int i = 0; i < kShape.head_dim; ++i) {
        size_t page = table[t / kShape.page_tokens];
        int slot = t % kShape.page_tokens, head = cache.head_begin() + j;
        cache.key(layer, page, j, slot)[i] = value_of(sequence, layer, head, t, false, i);
        cache.value(layer, page, j, slot)[i] = value_of(sequence, layer, head, t, true, i);
      }
}

// Mismatches of one received layer (0 when every filled position is right).
int mismatches(const PagedKvCache& cache, int sequence, int layer, const std::vector<size_t>& table,
               int tokens) {
  int bad = 0;
  for (int t = 0; t < tokens; ++t)
    for (int j = 0; j < cache.heads(); ++j)
      for (int i = 0; i < kShape.head_dim; ++i) {
        size_t page = table[t / kShape.page_tokens];
        int slot = t % kShape.page_tokens, head = cache.head_begin() + j;
        bad += cache.key(layer, page, j, slot)[i] != value_of(sequence, layer, head, t, false, i);
        bad += cache.value(layer, page, j, slot)[i] != value_of(sequence, layer, head, t, true, i);
      }
  return bad;
}

class PdReshard : public ::testing::TestWithParam<std::tuple<int, int, int>> {};

TEST_P(PdReshard, EveryHeadArrivesInItsPageOnTheDecodeSide) {
  auto [prefill, decode, idle] = GetParam();
  run_ranks(prefill + decode + idle, [prefill, decode](const RankContext& context) {
    weft::Comm world = world_of(context);
    PdComm pd(world);
    parallel::Ledger ledger;
    Axis axis(pd.comm, "pd", &ledger);
    const KvTransferGroups groups = groups_of(prefill, decode);
    KvTransfer transfer(axis, kShape, groups);
    const int rank = world.rank();
    const bool on_prefill = rank < prefill, on_decode = !on_prefill && rank < prefill + decode;
    EXPECT_EQ(transfer.is_prefill(), on_prefill);
    EXPECT_EQ(transfer.is_decode(), on_decode);
    constexpr size_t kCachePages = 9;
    // Two sequences: 13 tokens (3 pages, the last one partly filled), then 10 (2 full pages).
    size_t total_pages = 0;
    for (int sequence = 0; sequence < 2; ++sequence) {
      const int tokens = sequence == 0 ? 13 : 10;
      const size_t pages = size_t((tokens + kShape.page_tokens - 1) / kShape.page_tokens);
      total_pages += pages;
      if (on_prefill) {
        PagedKvCache cache(kShape, prefill, rank, kCachePages);
        auto table = block_table(pages, kCachePages, 3 + sequence);
        for (int l = 0; l < kShape.layers; ++l) {
          fill(cache, sequence, l, table, tokens);
          transfer.send_layer(cache, l, table);
        }
        transfer.finish();
      } else if (on_decode) {
        PagedKvCache cache(kShape, decode, rank - prefill, kCachePages);
        auto table = block_table(pages, kCachePages, 11 + sequence);
        transfer.receive(cache, table);
        for (int l = 0; l < kShape.layers; ++l) {
          transfer.wait_layer(l);
          EXPECT_EQ(mismatches(cache, sequence, l, table, tokens), 0)
              << "sequence " << sequence << " layer " << l;
        }
        transfer.finish();
      }
    }
    // The ledger equals its closed form, and the prefill side sends every
    // head of every page exactly once, whatever the two TP sizes.
    parallel::Ledger want;
    parallel::expected_kv_transfer(kShape, groups, 3, rank, "pd", want);
    parallel::expected_kv_transfer(kShape, groups, 2, rank, "pd", want);
    for (const std::string& line : ledger.compare(want)) ADD_FAILURE() << line;
    uint64_t sent = 0;
    for (const auto& e : ledger.entries()) sent += e.bytes_sent;
    uint64_t all = 0;
    check(weftAllReduce(&sent, &all, 1, weftUint64, weftSum, world.get(), nullptr));
    EXPECT_EQ(all, uint64_t(kShape.layers) * total_pages * kShape.kv_heads * 2 *
                       kShape.page_tokens * kShape.head_dim * sizeof(float));
  });
}

INSTANTIATE_TEST_SUITE_P(PrefillDecodeIdle, PdReshard,
                         ::testing::Values(std::tuple{1, 1, 0}, std::tuple{2, 1, 0},
                                           std::tuple{1, 2, 0}, std::tuple{2, 2, 0},
                                           std::tuple{3, 2, 1}, std::tuple{2, 3, 0},
                                           std::tuple{4, 3, 1}, std::tuple{2, 6, 0}),
                         [](const auto& info) {
                           return "p" + std::to_string(std::get<0>(info.param)) + "_d" +
                                  std::to_string(std::get<1>(info.param)) + "_idle" +
                                  std::to_string(std::get<2>(info.param));
                         });

// The decode side reads layer 0 and answers before the prefill side sends
// layer 1: were wait_layer(0) to wait for more than layer 0, this would
// never finish (the communicator's timeout then fails it).
TEST(PdLayers, ALayerIsUsableBeforeTheNextIsSent) {
  run_ranks(3, [](const RankContext& context) {
    weft::Comm world = world_of(context);
    PdComm pd(world);
    Axis axis(pd.comm, "pd");
    const KvTransferGroups groups = groups_of(1, 2);
    KvTransfer transfer(axis, kShape, groups);
    const int tokens = 7, rank = world.rank();
    const std::vector<size_t> table = {1, 0};
    int32_t ack = 0;
    if (rank == 0) {
      PagedKvCache cache(kShape, 1, 0, 2);
      for (int l = 0; l < kShape.layers; ++l) {
        fill(cache, 0, l, table, tokens);
        transfer.send_layer(cache, l, table);
        // Layer l + 1 goes only after every decode rank has read layer l.
        for (int d : groups.decode) check(weftRecv(&ack, 1, weftInt32, d, world.get(), nullptr));
        EXPECT_EQ(ack, l);
      }
      transfer.finish();
    } else {
      PagedKvCache cache(kShape, 2, rank - 1, 2);
      transfer.receive(cache, table);
      for (int l = 0; l < kShape.layers; ++l) {
        transfer.wait_layer(l);
        EXPECT_EQ(mismatches(cache, 0, l, table, tokens), 0) << "layer " << l;
        ack = l;
        check(weftSend(&ack, 1, weftInt32, 0, world.get(), nullptr));
      }
      transfer.finish();
    }
  });
}

TEST(PdErrors, BadInputIsNamed) {
  run_ranks(2, [](const RankContext& context) {
    weft::Comm world = world_of(context);
    PdComm pd(world);
    Axis axis(pd.comm, "pd");
    expect_error([] { PagedKvCache c({2, 6, 4, 0}, 1, 0, 1); }, "page_tokens=0");
    expect_error([] { PagedKvCache c(kShape, 5, 0, 1); }, "kv_heads=12 does not divide by tp=5");
    expect_error([] { PagedKvCache c(kShape, 2, 2, 1); }, "tp_rank=2 is out of range [0, tp=2)");
    PagedKvCache cache(kShape, 1, 0, 2);
    expect_error([&] { cache.key(3, 0, 0, 0); }, "layer=3 is out of range [0, 3)");
    expect_error([&] { cache.key(0, 2, 0, 0); }, "page=2 is out of range [0, 2)");
    expect_error([&] { cache.value(0, 0, 12, 0); }, "head=12 is out of range [0, 12)");
    expect_error([&] { cache.value(0, 0, 0, 5); }, "slot=5 is out of range [0, page_tokens=5)");
    expect_error([&] { KvTransfer t(axis, kShape, {{0}, {0}}); }, "rank 0 appears twice");
    expect_error([&] { KvTransfer t(axis, kShape, {{0}, {2}}); }, "rank 2 is out of range [0, 2)");
    expect_error([&] { KvTransfer t(axis, kShape, {{}, {1}}); }, "groups.prefill is empty");
    expect_error([&] { KvTransfer t(axis, kShape, {{0}, {}}); }, "groups.decode is empty");
    expect_error([&] { KvTransfer t(axis, {0, 12, 4, 5}, {{0}, {1}}); }, "layers=0");
    KvTransfer transfer(axis, kShape, {{0}, {1}});
    const std::vector<size_t> table = {0, 1}, bad_table = {0, 2};
    if (world.rank() == 0) {
      expect_error([&] { transfer.receive(cache, table); }, "not on the decode side");
      expect_error([&] { transfer.wait_layer(0); }, "not on the decode side");
      expect_error([&] { transfer.send_layer(cache, 1, table); }, "layers are sent in order");
      expect_error([&] { transfer.send_layer(cache, 0, bad_table); }, "pages[1]=2 is out of range");
      PagedKvCache half(kShape, 2, 0, 2);
      expect_error([&] { transfer.send_layer(half, 0, table); }, "cache: it holds heads [0, 6)");
      expect_error([&] { transfer.shared_heads(1); }, "peer=1 is out of range [0, 1)");
      EXPECT_EQ(transfer.shared_heads(0), std::pair(0, 12));
    } else {
      expect_error([&] { transfer.send_layer(cache, 0, table); }, "not on the prefill side");
      expect_error([&] { transfer.wait_layer(0); }, "layer=0 is out of range [0, 0)");
    }
  });
}

}  // namespace
}  // namespace weft::testing
