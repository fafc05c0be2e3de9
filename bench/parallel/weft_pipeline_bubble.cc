// Pipeline bubble per schedule, measured: the executor runs every schedule
// over the PP ranks with stage compute emulated by waiting a fixed time per
// action (forward, input-gradient and weight-gradient backward t each, a
// fused backward 2t), so the idle time is the schedule's plus the transfers'.
// Waiting, not spinning, leaves the cores to the transfers when the ranks
// outnumber them. Per schedule: the median over rounds of 1 − Σ compute /
// (p · the slowest rank's step), against the checker's and the formula's.
//   weftrun -n P weft-pipeline-bubble [-m MICROBATCHES] [-v VIRTUAL] [-t US] [-r ROUNDS]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "weft/parallel.hpp"

namespace {

namespace par = weft::parallel;

void compute_for(std::chrono::microseconds t) {
  std::this_thread::sleep_until(std::chrono::steady_clock::now() + t);
}

}  // namespace

int main(int argc, char** argv) {
  int microbatches = 8, virtual_stages = 2, rounds = 5, us = 2000;
  for (int i = 1; i + 1 < argc; i += 2) {
    const int value = std::atoi(argv[i + 1]);
    if (std::strcmp(argv[i], "-m") == 0)
      microbatches = value;
    else if (std::strcmp(argv[i], "-v") == 0)
      virtual_stages = value;
    else if (std::strcmp(argv[i], "-t") == 0)
      us = value;
    else if (std::strcmp(argv[i], "-r") == 0)
      rounds = value;
    else {
      std::fprintf(stderr, "weft-pipeline-bubble: unknown option %s\n", argv[i]);
      return 2;
    }
  }
  if (microbatches < 1 || virtual_stages < 1 || rounds < 1 || us < 1) {
    std::fprintf(stderr, "weft-pipeline-bubble: -m, -v, -r and -t must be >= 1\n");
    return 2;
  }
  weft::Comm world = weft::Comm::from_env();
  par::MeshShape shape;
  shape.pp = world.size();
  par::Mesh mesh(world, shape);
  par::Axis pp(mesh, "pp");
  const std::chrono::microseconds t(us);
  if (world.rank() == 0)
    std::printf("# pipeline bubble: p %d, m %d, t %d us per action (fused backward 2t)\n",
                world.size(), microbatches, us);
  if (world.rank() == 0)
    std::printf("# %-12s %3s %10s %10s %10s %8s\n", "schedule", "v", "measured", "simulated",
                "formula", "diff");
  for (auto schedule : {par::PipelineSchedule::gpipe, par::PipelineSchedule::one_f_one_b,
                        par::PipelineSchedule::interleaved, par::PipelineSchedule::zero_bubble}) {
    par::PipelineOptions options;
    options.schedule = schedule, options.microbatches = microbatches;
    options.virtual_stages = schedule == par::PipelineSchedule::interleaved ? virtual_stages : 1;
    options.activation_numel = 1024;
    if (schedule == par::PipelineSchedule::interleaved && microbatches % world.size() != 0)
      continue;
    par::Pipeline pipeline(pp, options);
    const bool split = schedule == par::PipelineSchedule::zero_bubble;
    par::StageFunctions f;
    f.forward = [&](int, int, std::span<const float>, std::span<float>) { compute_for(t); };
    f.backward = [&](int, int, std::span<const float>, std::span<float>) {
      compute_for(split ? t : 2 * t);
    };
    f.backward_weight = [&](int, int) { compute_for(t); };
    std::vector<double> bubbles;
    for (int round = 0; round <= rounds; ++round) {
      weft::check(weftBarrier(world.get(), nullptr));
      pipeline.run(f);
      // As the checker counts it: 1 − Σ compute / (p · the slowest rank's wall time).
      double compute = pipeline.profile().compute_s, wall = pipeline.profile().wall_s;
      weft::check(weftAllReduce(&compute, &compute, 1, weftFloat64, weftSum, world.get(), nullptr));
      weft::check(weftAllReduce(&wall, &wall, 1, weftFloat64, weftMax, world.get(), nullptr));
      if (round > 0) bubbles.push_back(1 - compute / (world.size() * wall));  // 0 warms up
    }
    std::sort(bubbles.begin(), bubbles.end());
    const double measured = bubbles[bubbles.size() / 2];
    if (world.rank() == 0)
      std::printf("  %-12s %3d %9.1f%% %9.1f%% %9.1f%% %+7.1f\n",
                  par::pipeline_schedule_name(schedule), options.virtual_stages, 100 * measured,
                  100 * pipeline.simulated_bubble(), 100 * pipeline.formula_bubble(),
                  100 * (measured - pipeline.simulated_bubble()));
  }
  return 0;
}
