#include "check.h"

#include <cmath>
#include <cstring>
#include <functional>

namespace weft::train {

namespace {

bool same_bits(float a, float b) {
  return std::memcmp(&a, &b, sizeof a) == 0;
}

// Collects per tensor the largest |got − want| and |want|, then reports the worst ratio.
struct TensorDiff {
  double max_err = 0, max_ref = 0;
  void add(double got, double want) {
    max_err = std::max(max_err, std::isnan(got) ? INFINITY : std::abs(got - want));
    max_ref = std::max(max_ref, std::abs(want));  // max_ref may start at a larger scale
  }
  double relative() const { return max_err == 0 ? 0 : max_err / std::max(max_ref, 1e-30); }
};

void keep_worst(Worst& worst, const TensorDiff& diff, const std::string& name) {
  if (diff.relative() >= worst.value) worst = {diff.relative(), name};
}

// One element's value on the ranks `members` picks, which must agree bit for bit; NaN and a
// failure when they disagree or none holds it.
float agreed(const std::vector<RankReport>& ranks, const std::function<float(size_t)>& value,
             const std::function<bool(size_t)>& members, const std::string& what,
             std::vector<std::string>& failures) {
  float first = NAN;
  size_t holder = 0;
  for (size_t r = 0; r < ranks.size(); ++r) {
    if (!members(r) || std::isnan(value(r))) continue;
    if (std::isnan(first)) {
      first = value(r), holder = r;
    } else if (!same_bits(first, value(r))) {
      failures.push_back(what + " differs between ranks " + std::to_string(holder) + " and " +
                         std::to_string(r));
      return NAN;
    }
  }
  if (std::isnan(first)) failures.push_back(what + " is held by no rank");
  return first;
}

}  // namespace

Verdict verify(const std::vector<ParamSpec>& specs, const std::vector<RankReport>& ranks, int dp,
               const std::vector<double>& ref_losses, const std::vector<float>& ref_grads,
               const std::vector<float>& ref_params) {
  Verdict verdict;
  const size_t max_failures = 8;  // the first few name the problem; more add nothing
  auto in_replica = [&](int d) { return [&ranks, d](size_t r) { return ranks[r].dp == d; }; };
  auto everyone = [](size_t) { return true; };

  for (size_t step = 0; step < ref_losses.size(); ++step) {
    double sum = 0;
    for (int d = 0; d < dp; ++d) {
      double first = NAN;
      for (const RankReport& r : ranks)
        if (r.dp == d && !std::isnan(r.losses[step])) {  // NaN: a stage without the loss
          if (std::isnan(first)) first = r.losses[step];
          if (r.losses[step] != first)
            verdict.failures.push_back("loss of step " + std::to_string(step + 1) +
                                       " differs inside replica " + std::to_string(d));
        }
      sum += first;
    }
    verdict.losses.push_back(sum / dp);
    TensorDiff diff;
    diff.add(verdict.losses.back(), ref_losses[step]);
    keep_worst(verdict.loss, diff, "step " + std::to_string(step + 1));
  }

  for (const RankReport& r : ranks)
    for (float x : r.reduced) verdict.has_reduced |= !std::isnan(x);
  // Parameters are compared relative to the model's largest: Adam's step g/(|g| + eps) is
  // ill-conditioned for gradients near zero, and tensors initialised at zero (layernorm
  // biases) then hold values of the order of lr only, so a per-tensor ratio would measure
  // that conditioning rather than the distributed run.
  double max_param = 0;
  for (float p : ref_params) max_param = std::max(max_param, double(std::abs(p)));
  size_t offset = 0;
  for (const ParamSpec& spec : specs) {
    TensorDiff grads, reduced, params;
    params.max_ref = max_param;
    for (size_t e = offset; e < offset + spec.size(); ++e) {
      if (verdict.failures.size() >= max_failures) break;
      const std::string at = spec.name + "[" + std::to_string(e - offset) + "]";
      // The gradient the reduction must produce: the mean over dp of each replica's. An
      // expert's local gradient sums its EP group's replicas instead, and one rank of each
      // expert-DP group holds it: the mean is their sum over dp.
      double mean = 0;
      if (spec.split == Split::kExperts) {
        bool held = false;
        for (const RankReport& r : ranks)
          if (!std::isnan(r.grads[e])) mean += r.grads[e], held = true;
        if (!held) verdict.failures.push_back("gradient " + at + " is held by no rank");
      } else {
        for (int d = 0; d < dp; ++d)
          mean += agreed(
              ranks, [&](size_t r) { return ranks[r].grads[e]; }, in_replica(d),
              "gradient " + at + " in replica " + std::to_string(d), verdict.failures);
      }
      grads.add(mean / dp, ref_grads[e]);
      if (verdict.has_reduced)
        reduced.add(agreed(
                        ranks, [&](size_t r) { return ranks[r].reduced[e]; }, everyone,
                        "reduced gradient " + at, verdict.failures),
                    ref_grads[e]);
      params.add(agreed(
                     ranks, [&](size_t r) { return ranks[r].params[e]; }, everyone,
                     "parameter " + at, verdict.failures),
                 ref_params[e]);
    }
    keep_worst(verdict.grads, grads, spec.name);
    keep_worst(verdict.reduced, reduced, spec.name);
    keep_worst(verdict.params, params, spec.name);
    offset += spec.size();
  }
  return verdict;
}

}  // namespace weft::train
