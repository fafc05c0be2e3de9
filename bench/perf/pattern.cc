#include "pattern.h"

#include <algorithm>

#include "element.h"

namespace weft::perf {

namespace {

// Labels repeat with this period at most: distinct enough to expose misplaced data.
constexpr int64_t kLabelPeriod = 61;
// Reduction inputs stay in [0, kMaxSmall) when the dtype allows it.
constexpr int64_t kMaxSmall = 4;

// True for index % period of the nranks ranks (so the count varies from element to
// element); which ranks those are shifts every period elements, so every rank is picked.
bool selected(int rank, size_t index, int nranks, size_t period) {
  const size_t picked = index % period;
  return (static_cast<size_t>(rank) + index / period) % static_cast<size_t>(nranks) < picked;
}

}  // namespace

InputPattern::InputPattern(weftDataType_t dtype, std::optional<weftRedOp_t> op, int nranks)
    : dtype_(dtype), op_(op), nranks_(nranks), limit_(exact_integer_limit(dtype)) {
  label_mod_ = std::min(limit_ + 1, kLabelPeriod);
  // n values below sum_mod_ add up to at most n * (sum_mod_ - 1) <= limit_.
  sum_mod_ = std::min(kMaxSmall, limit_ / nranks + 1);
  if (sum_mod_ < 2) sum_mod_ = 0;
  // The mean m is spread as m+1, m-1 and m's: partial sums reach n*m + 1 <= limit_.
  avg_mod_ = std::min(kMaxSmall, (limit_ - 1) / nranks + 1);
  prod_powers_ = std::min(max_power_of_two(dtype), nranks);
}

double InputPattern::input(int rank, size_t index) const {
  if (!op_ || *op_ == weftMax || *op_ == weftMin)
    return static_cast<double>((static_cast<int64_t>(rank) * 7 + index) % label_mod_);
  switch (*op_) {
    case weftSum:
      if (sum_mod_ > 0) return static_cast<double>((rank + index) % sum_mod_);
      // More ranks than exact integers: at most limit_ ranks give 1, the rest 0.
      return selected(rank, index, nranks_, static_cast<size_t>(limit_) + 1) ? 1 : 0;
    case weftProd:  // at most prod_powers_ factors of 2
      return selected(rank, index, nranks_, static_cast<size_t>(prod_powers_) + 1) ? 2 : 1;
    case weftAvg: {
      const auto mean = static_cast<int64_t>(index % avg_mod_);
      if (mean == 0 || nranks_ < 2) return static_cast<double>(mean);
      // One rank above the mean and one below, so that the sum is n * mean exactly.
      const auto position = static_cast<int>(index % nranks_);
      if (rank == position) return static_cast<double>(mean + 1);
      if (rank == (position + 1) % nranks_) return static_cast<double>(mean - 1);
      return static_cast<double>(mean);
    }
    default:
      return 0;
  }
}

double InputPattern::reduced(size_t index) const {
  double result = input(0, index);
  for (int rank = 1; rank < nranks_; ++rank) {
    const double value = input(rank, index);
    switch (op_.value_or(weftSum)) {
      case weftProd:
        result *= value;
        break;
      case weftMax:
        result = std::max(result, value);
        break;
      case weftMin:
        result = std::min(result, value);
        break;
      default:  // sum and avg
        result += value;
        break;
    }
  }
  return op_ == weftAvg ? result / nranks_ : result;
}

double InputPattern::tolerance(double expected) const {
  return op_ == weftAvg ? 2 * ulp(dtype_, expected) : 0;
}

}  // namespace weft::perf
