// Single-process parts of the adapter layer: pack/unpack, split sizes,
// bucket assignment, the reference parameter list, Adam, and the ledger's
// closed forms and comparison.
#include <gtest/gtest.h>

#include <numeric>
#include <string>

#include "weft/parallel.hpp"

namespace weft::parallel {
namespace {

TEST(Tensor, PackUnpackRoundTripAlongEveryDim) {
  std::vector<size_t> shape = {3, 5, 4};
  std::vector<int32_t> data(60);
  std::iota(data.begin(), data.end(), 0);
  for (int dim = -3; dim < 3; ++dim) {
    Tensor t = view(data.data(), shape);
    std::vector<size_t> sizes = split_sizes(t.extent(dim), 2);
    std::vector<int32_t> blocks(60, -1), back(60, -1);
    pack(t, dim, sizes, blocks.data());
    // Block 0 holds, in order, the elements whose coordinate along dim is < sizes[0].
    int d = dim < 0 ? dim + 3 : dim;
    size_t inner = 1;
    for (int i = d + 1; i < 3; ++i) inner *= shape[i];
    std::vector<int32_t> first;
    for (int32_t v : data)
      if ((static_cast<size_t>(v) / inner) % shape[d] < sizes[0]) first.push_back(v);
    EXPECT_TRUE(std::equal(first.begin(), first.end(), blocks.begin())) << "dim " << dim;
    unpack(blocks.data(), dim, sizes, view(back.data(), shape));
    EXPECT_EQ(back, data) << "dim " << dim;
  }
  std::vector<size_t> wrong = {1, 1};
  EXPECT_THROW(pack(view(data.data(), shape), 0, wrong, data.data()), weft::Error);
}

TEST(Tensor, SplitSizesGiveTheRemainderToTheFirstRanks) {
  EXPECT_EQ(split_sizes(10, 4), (std::vector<size_t>{3, 3, 2, 2}));
  EXPECT_EQ(split_sizes(2, 3), (std::vector<size_t>{1, 1, 0}));
  EXPECT_THROW(split_sizes(2, 0), weft::Error);
  EXPECT_EQ(dtype_bytes(weftBfloat16), 2u);
  EXPECT_THROW(dtype_bytes(static_cast<weftDataType_t>(77)), weft::Error);
}

TEST(Buckets, ReverseOrderFirstBucketSmall) {
  std::vector<size_t> numels = {100, 50, 300, 10, 200};  // fp32: 400, 200, 1200, 40, 800 B
  auto buckets = assign_buckets(numels, 4, 500, 1000);
  // Reverse order: 4 (800 B >= 500 closes the first), then 3+2 (1240), then 1+0.
  ASSERT_EQ(buckets.size(), 3u);
  EXPECT_EQ(buckets[0], (std::vector<size_t>{4}));
  EXPECT_EQ(buckets[1], (std::vector<size_t>{3, 2}));
  EXPECT_EQ(buckets[2], (std::vector<size_t>{1, 0}));
  EXPECT_THROW(assign_buckets(numels, 4, 500, 0), weft::Error);
  EXPECT_THROW(assign_buckets(numels, 4, 0, 10), weft::Error);
}

TEST(Adam, MatchesTheTextbookUpdate) {
  std::vector<float> p = {1.0f, -2.0f}, g = {0.5f, -0.25f}, m(2, 0.0f), v(2, 0.0f);
  AdamOptions options;
  options.lr = 0.1f;
  adam_step(p, g, m, v, 1, options);
  // Step 1: m̂ = g, v̂ = g², so the update is lr·g/(|g| + eps).
  EXPECT_NEAR(p[0], 1.0f - 0.1f * 0.5f / (0.5f + 1e-8f), 1e-6);
  EXPECT_NEAR(p[1], -2.0f + 0.1f, 1e-6);
  EXPECT_FLOAT_EQ(m[0], 0.05f);
  EXPECT_NEAR(v[1], 0.001 * 0.0625, 1e-9);
  EXPECT_THROW(adam_step(p, g, m, v, 0, options), weft::Error);
}

TEST(TransformerParameters, ShardedByTpAndChecked) {
  ModelConfig c;
  c.tp = 2;
  auto specs = transformer_parameters(c);
  size_t h = 64, f = 256, v = 128, s = 32;
  ASSERT_EQ(specs.size(), 2u + 12 * 2 + 3);
  size_t total = 0;
  for (const auto& spec : specs) total += spec.numel;
  size_t per_layer =
      4 * h + (3 * h * h + 3 * h) / 2 + h * h / 2 + h + (f * h + f) / 2 + h * f / 2 + h;
  EXPECT_EQ(total, v / 2 * h + s * h + 2 * per_layer + 2 * h + v / 2 * h);
  EXPECT_EQ(specs.back().layer, 3);
  c.tp = 3;
  try {
    transformer_parameters(c);
    ADD_FAILURE() << "hidden 64 with tp 3 accepted";
  } catch (const weft::Error& error) {
    EXPECT_NE(std::string(error.what()).find("hidden=64 does not divide by tp=3"),
              std::string::npos)
        << error.what();
  }
  c.tp = 1;
  c.heads = 5;
  EXPECT_THROW(transformer_parameters(c), weft::Error);
}

const LedgerEntry* find(const Ledger& ledger, std::string_view pattern,
                        std::string_view primitive) {
  for (const LedgerEntry& e : ledger.entries())
    if (e.pattern == pattern && e.primitive == primitive) return &e;
  return nullptr;
}

size_t total_calls(const Ledger& ledger, std::string_view prefix) {
  size_t calls = 0;
  for (const LedgerEntry& e : ledger.entries())
    if (e.pattern.starts_with(prefix)) calls += e.calls;
  return calls;
}

size_t total_bytes(const Ledger& ledger, std::string_view prefix) {
  size_t bytes = 0;
  for (const LedgerEntry& e : ledger.entries())
    if (e.pattern.starts_with(prefix)) bytes += e.calls * e.bytes_per_call;
  return bytes;
}

TEST(LedgerExpected, TensorParallelTwoAllReducesPerLayerEachWay) {
  ModelConfig c;
  c.tp = 4;
  c.steps = 3;
  size_t act = static_cast<size_t>(c.batch) * c.seq * c.hidden * 4;
  Ledger e = Ledger::expected(c);
  const LedgerEntry* fwd = find(e, "tp.reduce_from", "allreduce");
  const LedgerEntry* bwd = find(e, "tp.copy_to", "allreduce");
  ASSERT_TRUE(fwd && bwd);
  EXPECT_EQ(fwd->calls, 2u * c.layers * c.steps);
  EXPECT_EQ(bwd->calls, (2u * c.layers + 1) * c.steps);  // + the LM head's dgrad
  EXPECT_EQ(fwd->bytes_per_call, act);
  EXPECT_EQ(fwd->bytes_sent, fwd->calls * 2 * 3 * (act / 4));  // ring: 2(n-1)/n
  EXPECT_EQ(find(e, "tp.cross_entropy", "allreduce")->calls, 3u * c.steps);
  EXPECT_EQ(find(e, "dp.bucket", "allreduce"), nullptr);  // dp = 1

  // SP: the same bytes as ReduceScatter + AllGather, plus the re-gathers.
  c.sp = true;
  Ledger sp = Ledger::expected(c);
  size_t rs = 0, ag = 0;
  for (const LedgerEntry& entry : sp.entries()) {
    if (entry.pattern == "sp.regather" || entry.pattern == "tp.sp_grads" ||
        entry.pattern == "tp.cross_entropy")
      continue;
    (entry.primitive == "reducescatter" ? rs : ag) += entry.calls * entry.bytes_per_call;
  }
  EXPECT_EQ(rs, total_bytes(e, "tp.") - find(e, "tp.cross_entropy", "allreduce")->calls * 256);
  EXPECT_EQ(ag, rs);
  EXPECT_EQ(find(sp, "sp.regather", "allgather")->calls, (2u * c.layers + 1) * c.steps);
  c.seq = 3;
  c.batch = 1;
  EXPECT_THROW(Ledger::expected(c), weft::Error);  // 3 tokens over tp 4 with SP
}

TEST(LedgerExpected, DataParallelAndZeroClosedForms) {
  ModelConfig c;
  c.dp = 4;
  c.bucket_bytes = 64 << 10;
  c.first_bucket_bytes = 16 << 10;
  size_t phi = 0;
  for (const auto& spec : transformer_parameters(c)) phi += spec.numel;
  Ledger dp = Ledger::expected(c);
  EXPECT_EQ(total_bytes(dp, "dp."), phi * 4);  // 2Φ of ring traffic: one AllReduce of Φ
  EXPECT_GT(total_calls(dp, "dp."), 2u);

  c.zero = 1;
  Ledger z1 = Ledger::expected(c);
  EXPECT_EQ(total_calls(z1, "zero1."), 2u);
  size_t padded = (phi + 3) / 4 * 4;
  EXPECT_EQ(total_bytes(z1, "zero1."), 2 * padded * 4);

  c.zero = 2;
  Ledger z2 = Ledger::expected(c);
  EXPECT_EQ(find(z2, "zero2.params", "allgather")->calls, 1u);
  EXPECT_GT(total_calls(z2, "zero2.grads"), 1u);  // L ReduceScatters + 1 AllGather

  c.zero = 3;
  Ledger z3 = Ledger::expected(c);
  size_t units = static_cast<size_t>(c.layers) + 2;
  EXPECT_EQ(total_calls(z3, "zero3."), 3 * units);
  EXPECT_GE(total_bytes(z3, "zero3."), 3 * phi * 4);
  EXPECT_LT(total_bytes(z3, "zero3."), 3 * (phi + units * 4) * 4);

  c.hsdp = 2;
  Ledger hsdp = Ledger::expected(c);
  EXPECT_EQ(total_calls(hsdp, "hsdp."), units);
  EXPECT_EQ(hsdp.entries().front().dim, "dp_shard");
  c.hsdp = 3;
  EXPECT_THROW(Ledger::expected(c), weft::Error);
}

TEST(LedgerCompare, NamesEveryDifferingEntry) {
  Ledger expected, got;
  expected.record("tp.reduce_from", "allreduce", "tp", 1024, 0, "", 0, 0);
  expected.record("tp.reduce_from", "allreduce", "tp", 1024, 0, "", 0, 0);
  expected.record("dp.bucket", "allreduce", "dp", 4096, 0, "", 0, 0);
  got.record("tp.reduce_from", "allreduce", "tp", 1024, 1536, "ring", 1e-3, 1e-4);
  got.record("zero1.grads", "reducescatter", "dp", 64, 48, "ring", 1e-3, 1e-3);
  auto differences = got.compare(expected);
  ASSERT_EQ(differences.size(), 3u);
  EXPECT_NE(differences[0].find("tp.reduce_from allreduce over tp of 1024 B: 1 calls, 2 expected"),
            std::string::npos)
      << differences[0];
  EXPECT_NE(differences[1].find("dp.bucket"), std::string::npos) << differences[1];
  EXPECT_NE(differences[2].find("zero1.grads"), std::string::npos) << differences[2];
  got.record("tp.reduce_from", "allreduce", "tp", 1024, 1536, "ring", 1e-3, 1e-4);
  got.record("dp.bucket", "allreduce", "dp", 4096, 6144, "ring", 1e-3, 1e-4);
  Ledger copy = expected;
  copy.record("zero1.grads", "reducescatter", "dp", 64, 0, "", 0, 0);
  EXPECT_TRUE(got.compare(copy).empty());
  EXPECT_NE(got.table(&copy).find("zero1.grads"), std::string::npos);
  EXPECT_EQ(got.entries()[0].bytes_sent, 3072u);
  got.add_compute("dp", 0.5);
  got.add_compute("dp", 0.25);
  EXPECT_DOUBLE_EQ(got.compute_s("dp"), 0.75);
}

}  // namespace
}  // namespace weft::parallel
