#include "overlap_math.h"

#include <algorithm>

namespace weft::overlap {

float compute(std::span<float> data, long iterations) {
  for (long it = 0; it < iterations; ++it)
    for (float& x : data) x = x * 0.999f + 0.001f;
  float sum = 0;
  for (float x : data) sum += x;
  return sum;
}

double efficiency(const Times& t) {
  const double exposed = std::max(0.0, t.both - t.compute_in_both);
  const double slowdown = std::max(0.0, t.compute_in_both - t.compute);
  return 1 - (exposed + slowdown) / t.comm;
}

Spread spread(std::vector<double> values) {
  if (values.empty()) return {};
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  const double median = n % 2 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
  return {median, values.front(), values.back()};
}

}  // namespace weft::overlap
