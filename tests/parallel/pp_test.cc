// Pipeline executor: a chain of tanh(W·x + b) stages split over the PP ranks
// (v chunks each), every schedule, against the whole chain on one process
// over the full batch: the gradient accumulated over micro-batches must equal
// the full-batch gradient. Also pp × dp on one mesh, the ledger against the
// closed form, and bad input.
#include <cmath>
#include <string>
#include <vector>

#include "parallel/support.h"

namespace weft::testing {
namespace {

using parallel::Axis;
using parallel::Ledger;
using parallel::Mesh;
using parallel::MeshShape;
using parallel::Pipeline;
using parallel::PipelineOptions;
using parallel::PipelineSchedule;
using parallel::StageFunctions;

constexpr size_t kHidden = 8;
constexpr size_t kRows = 3;  // rows per micro-batch

// Stage s of the chain: y = tanh(W_s x + b_s), W_s [h, h], rows [n, h].
struct StageParams {
  std::vector<float> w, b;
};
StageParams stage_params(int stage) {
  return {random_floats(kHidden * kHidden, 100 + stage), random_floats(kHidden, 200 + stage)};
}

void stage_forward(const StageParams& p, const float* x, size_t rows, float* y) {
  for (size_t r = 0; r < rows; ++r)
    for (size_t o = 0; o < kHidden; ++o) {
      float z = p.b[o];
      for (size_t i = 0; i < kHidden; ++i) z += p.w[o * kHidden + i] * x[r * kHidden + i];
      y[r * kHidden + o] = std::tanh(z);
    }
}
// dz = dy ⊙ (1 − y²); dx = dzᵀ·W (when dx), the weight gradient separately.
void stage_dz(const float* y, const float* dy, size_t rows, float* dz) {
  for (size_t k = 0; k < rows * kHidden; ++k) dz[k] = dy[k] * (1 - y[k] * y[k]);
}
void stage_dx(const StageParams& p, const float* dz, size_t rows, float* dx) {
  for (size_t r = 0; r < rows; ++r)
    for (size_t i = 0; i < kHidden; ++i) {
      float sum = 0;
      for (size_t o = 0; o < kHidden; ++o) sum += dz[r * kHidden + o] * p.w[o * kHidden + i];
      dx[r * kHidden + i] = sum;
    }
}
void stage_dw(const float* x, const float* dz, size_t rows, StageParams& grad) {
  for (size_t r = 0; r < rows; ++r)
    for (size_t o = 0; o < kHidden; ++o) {
      grad.b[o] += dz[r * kHidden + o];
      for (size_t i = 0; i < kHidden; ++i)
        grad.w[o * kHidden + i] += dz[r * kHidden + o] * x[r * kHidden + i];
    }
}

// Loss = ½ Σ y² over the last stage's output: dy = y.
std::vector<float> batch_input(int microbatches, int replica) {
  return random_floats(size_t(microbatches) * kRows * kHidden, 7 + replica);
}

// The whole chain over all rows at once; returns each stage's gradient.
std::vector<StageParams> reference_grads(int stages, const std::vector<float>& x0) {
  const size_t rows = x0.size() / kHidden;
  std::vector<std::vector<float>> acts{x0};
  for (int s = 0; s < stages; ++s) {
    acts.emplace_back(x0.size());
    stage_forward(stage_params(s), acts[s].data(), rows, acts[s + 1].data());
  }
  std::vector<float> dy = acts.back(), dz(x0.size()), dx(x0.size());
  std::vector<StageParams> grads(
      stages, {std::vector<float>(kHidden * kHidden), std::vector<float>(kHidden)});
  for (int s = stages - 1; s >= 0; --s) {
    stage_dz(acts[s + 1].data(), dy.data(), rows, dz.data());
    stage_dw(acts[s].data(), dz.data(), rows, grads[s]);
    stage_dx(stage_params(s), dz.data(), rows, dx.data());
    dy = dx;
  }
  return grads;
}

// This rank's chunks of the chain driven by a Pipeline.
struct ChainStages {
  ChainStages(const Pipeline& pipe, int microbatches, std::vector<float> input)
      : pipeline(pipe), x0(std::move(input)) {
    for (int c = 0; c < pipe.chunks(); ++c) {
      params.push_back(stage_params(pipe.stage(c)));
      grads.push_back({std::vector<float>(kHidden * kHidden), std::vector<float>(kHidden)});
    }
    const size_t cells = size_t(pipe.chunks()) * microbatches, n = kRows * kHidden;
    x.assign(cells, std::vector<float>(n));
    y = dz = x;
    m = microbatches;
  }
  size_t cell(int mb, int c) const { return size_t(c) * m + mb; }
  StageFunctions functions(bool split) {
    StageFunctions f;
    f.forward = [this](int mb, int c, std::span<const float> in, std::span<float> out) {
      std::vector<float>& xin = x[cell(mb, c)];
      if (pipeline.first_stage(c)) {
        EXPECT_TRUE(in.empty());
        std::copy_n(x0.begin() + long(size_t(mb) * kRows * kHidden), xin.size(), xin.begin());
      } else {
        ASSERT_EQ(in.size(), xin.size());
        std::copy(in.begin(), in.end(), xin.begin());
      }
      stage_forward(params[c], xin.data(), kRows, y[cell(mb, c)].data());
      if (!pipeline.last_stage(c))
        std::copy(y[cell(mb, c)].begin(), y[cell(mb, c)].end(), out.begin());
    };
    f.backward = [this, split](int mb, int c, std::span<const float> dout, std::span<float> din) {
      const std::vector<float>& out = y[cell(mb, c)];
      std::vector<float>& d = dz[cell(mb, c)];
      stage_dz(out.data(), pipeline.last_stage(c) ? out.data() : dout.data(), kRows, d.data());
      if (!split) stage_dw(x[cell(mb, c)].data(), d.data(), kRows, grads[c]);
      if (!pipeline.first_stage(c)) stage_dx(params[c], d.data(), kRows, din.data());
    };
    f.backward_weight = [this](int mb, int c) {
      stage_dw(x[cell(mb, c)].data(), dz[cell(mb, c)].data(), kRows, grads[c]);
    };
    return f;
  }
  const Pipeline& pipeline;
  std::vector<float> x0;
  int m = 1;
  std::vector<StageParams> params, grads;
  std::vector<std::vector<float>> x, y, dz;
};

struct Case {
  PipelineSchedule schedule;
  int microbatches, virtual_stages;
};

void run_chain(int nranks, int dp, const Case& k) {
  run_ranks(nranks, [&](const RankContext& context) {
    weft::Comm world = world_of(context);
    MeshShape shape;
    shape.pp = nranks / dp, shape.dp = dp;
    Mesh mesh(world, shape);
    Ledger ledger;
    Axis pp(mesh, "pp", &ledger);
    PipelineOptions options;
    options.schedule = k.schedule, options.microbatches = k.microbatches;
    options.virtual_stages = k.virtual_stages, options.activation_numel = kRows * kHidden;
    Pipeline pipeline(pp, options);
    const int replica = mesh.coord("dp");
    ChainStages chain(pipeline, k.microbatches, batch_input(k.microbatches, replica));
    pipeline.run(chain.functions(k.schedule == PipelineSchedule::zero_bubble));
    if (dp > 1) {
      Axis dp_axis(mesh, "dp");
      for (StageParams& g : chain.grads) {
        parallel::all_reduce(dp_axis, parallel::view(g.w.data(), {g.w.size()}), "dp.grads");
        parallel::all_reduce(dp_axis, parallel::view(g.b.data(), {g.b.size()}), "dp.grads");
      }
    }
    // The full batch: every replica's micro-batches, on one process.
    std::vector<float> all;
    for (int r = 0; r < dp; ++r) {
      std::vector<float> part = batch_input(k.microbatches, r);
      all.insert(all.end(), part.begin(), part.end());
    }
    const std::vector<StageParams> want =
        reference_grads(pipeline.stages() * pipeline.chunks(), all);
    for (int c = 0; c < pipeline.chunks(); ++c) {
      const std::string what = "stage " + std::to_string(pipeline.stage(c));
      expect_close(chain.grads[c].w, want[pipeline.stage(c)].w, 1e-5, (what + " weight").c_str());
      expect_close(chain.grads[c].b, want[pipeline.stage(c)].b, 1e-5, (what + " bias").c_str());
    }
    Ledger expected;
    parallel::expected_pipeline(options, pipeline.stages(), pipeline.rank(), "pp", 1, expected);
    const std::vector<std::string> deviations = ledger.compare(expected);
    EXPECT_TRUE(deviations.empty()) << deviations.front();
    const parallel::PipelineProfile& profile = pipeline.profile();
    EXPECT_GT(profile.compute_s, 0);
    EXPECT_LE(profile.compute_s, profile.wall_s);
  });
}

const Case kCases[] = {{PipelineSchedule::gpipe, 4, 1},
                       {PipelineSchedule::one_f_one_b, 5, 1},
                       {PipelineSchedule::interleaved, 4, 2},
                       {PipelineSchedule::zero_bubble, 5, 1}};

class PipelineExecutor : public ::testing::TestWithParam<int> {};

TEST_P(PipelineExecutor, EverySchedule) {
  for (const Case& k : kCases) {
    SCOPED_TRACE(parallel::pipeline_schedule_name(k.schedule));
    run_chain(GetParam(), 1, k);
  }
}

INSTANTIATE_TEST_SUITE_P(Ranks, PipelineExecutor, ::testing::Values(1, 2, 4));

TEST(PipelineExecutor, ThreeStagesInterleaved) {
  run_chain(3, 1, {PipelineSchedule::interleaved, 6, 3});
  run_chain(3, 1, {PipelineSchedule::one_f_one_b, 2, 1});  // fewer micro-batches than stages
}

// Eight stages, as a node's ranks would hold them: every schedule (interleaved needs
// micro-batches in multiples of the stages).
TEST(PipelineExecutor, EightStagesEverySchedule) {
  run_chain(8, 1, {PipelineSchedule::gpipe, 4, 1});
  run_chain(8, 1, {PipelineSchedule::one_f_one_b, 9, 1});
  run_chain(8, 1, {PipelineSchedule::interleaved, 8, 2});
  run_chain(8, 1, {PipelineSchedule::zero_bubble, 9, 1});
}

TEST(PipelineExecutor, PipelineTimesDataParallel) {
  run_chain(4, 2, {PipelineSchedule::one_f_one_b, 3, 1});
  run_chain(4, 2, {PipelineSchedule::zero_bubble, 4, 1});
}

TEST(PipelineExecutor, BadInputNamesTheArgument) {
  run_ranks(2, [](const RankContext& context) {
    weft::Comm world = world_of(context);
    MeshShape shape;
    shape.pp = 2;
    Mesh mesh(world, shape);
    Axis pp(mesh, "pp");
    PipelineOptions options;
    options.activation_numel = 4;
    options.schedule = PipelineSchedule::interleaved, options.virtual_stages = 2;
    options.microbatches = 3;
    expect_error([&] { Pipeline bad(pp, options); },
                 "microbatches 3 must be a multiple of stages 2");
    options.schedule = PipelineSchedule::gpipe, options.microbatches = 4;
    expect_error([&] { Pipeline bad(pp, options); }, "virtual_stages 2");
    options.virtual_stages = 1, options.activation_numel = 0;
    expect_error([&] { Pipeline bad(pp, options); }, "activation_numel");
    options.activation_numel = 4, options.schedule = PipelineSchedule::zero_bubble;
    Pipeline pipeline(pp, options);
    StageFunctions f;
    f.forward = [](int, int, std::span<const float>, std::span<float>) {};
    f.backward = [](int, int, std::span<const float>, std::span<float>) {};
    expect_error([&] { pipeline.run(f); }, "backward_weight");
    parallel::PipelineSchedule parsed;
    EXPECT_TRUE(parallel::parse_pipeline_schedule("interleaved", &parsed));
    EXPECT_EQ(parsed, PipelineSchedule::interleaved);
    EXPECT_FALSE(parallel::parse_pipeline_schedule("dualpipe", &parsed));
  });
}

// The closed form of a pipeline rank: TP calls of its layers per micro-batch, the
// embedding's on the first stage, the head's on the last, and its transfers.
TEST(PipelineLedger, ExpectedPerPipelineRank) {
  auto calls = [](const Ledger& ledger, const std::string& pattern, const std::string& primitive) {
    size_t n = 0;
    for (const parallel::LedgerEntry& e : ledger.entries())
      if (e.pattern == pattern && e.primitive == primitive) n += e.calls;
    return n;
  };
  parallel::ModelConfig config;
  config.layers = 4, config.tp = 2, config.pp = 2, config.microbatches = 3, config.batch = 6;
  config.steps = 2, config.param_numels = {100, 200};
  config.param_layers = {1, 2};
  for (int rank : {0, 1}) {
    config.pp_rank = rank;
    const Ledger e = Ledger::expected(config);
    EXPECT_EQ(calls(e, "tp.embedding", "allreduce"), rank == 0 ? 6u : 0u);
    EXPECT_EQ(calls(e, "tp.reduce_from", "allreduce"), 2u * 2 * 6);  // 2 layers here
    EXPECT_EQ(calls(e, "tp.copy_to", "allreduce"), (2u * 2 + rank) * 6);
    EXPECT_EQ(calls(e, "tp.cross_entropy", "allreduce"), rank == 1 ? 18u : 0u);
    EXPECT_EQ(calls(e, "pp.forward", rank == 0 ? "send" : "recv"), 6u);
    EXPECT_EQ(calls(e, "pp.backward", rank == 0 ? "recv" : "send"), 6u);
    EXPECT_EQ(calls(e, "pp.forward", rank == 0 ? "recv" : "send"), 0u);
    for (const parallel::LedgerEntry& entry : e.entries())
      if (entry.pattern.rfind("pp.", 0) == 0) {
        EXPECT_EQ(entry.bytes_per_call, size_t(2) * config.seq * config.hidden * 4);
      }
  }
  config.virtual_stages = 2, config.pp_rank = 0;
  EXPECT_EQ(calls(Ledger::expected(config), "pp.forward", "send"), 12u);  // both chunks
  EXPECT_EQ(calls(Ledger::expected(config), "pp.forward", "recv"), 6u);   // chunk 1 only
  // Without param_numels, the parameters are this rank's share of transformer_parameters:
  // over dp 2 its buckets hold exactly the units of its chunks.
  config.param_numels.clear(), config.param_layers.clear(), config.dp = 2;
  size_t held = 0;  // rank 0 of pp 2 with v 2 over 4 layers: embeddings, layers 0 and 2
  for (const parallel::ParamSpec& p : parallel::transformer_parameters(config))
    if (p.layer == 0 || p.layer == 1 || p.layer == 3) held += p.numel;
  size_t bucketed = 0;
  const Ledger derived = Ledger::expected(config);
  for (const parallel::LedgerEntry& entry : derived.entries())
    if (entry.pattern == "dp.bucket") bucketed += entry.bytes_per_call * entry.calls;
  EXPECT_EQ(bucketed, held * sizeof(float) * size_t(config.steps));
  config.param_numels = {1}, config.param_layers = {1}, config.zero = 1;
  expect_error([&] { Ledger::expected(config); }, "supports neither sp nor zero");
}

}  // namespace
}  // namespace weft::testing
