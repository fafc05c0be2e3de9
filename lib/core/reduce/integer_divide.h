// Average finalisation for integers: the truncating quotient of the exact
// values, shared by the host kernels and the CUDA functors so that both round
// identically. Header-only and free of any instruction-set pragma.
#pragma once

#include <cstdint>
#include <type_traits>

#include "common/host_device.h"

namespace weft::reduce {

// x / d truncated, for a signed or unsigned x and an unsigned d; d == 0 gives 0.
template <class T>
WEFT_HOST_DEVICE inline T divide_int(T x, uint64_t d) {
  if (d == 0) return 0;
  if constexpr (std::is_unsigned_v<T>) {
    return static_cast<T>(x / d);
  } else {
    // Past INT64_MAX only INT64_MIN / 2^63 is not 0.
    if (d > static_cast<uint64_t>(INT64_MAX)) {
      return static_cast<T>(static_cast<int64_t>(x) == INT64_MIN && d == (uint64_t{1} << 63) ? -1
                                                                                             : 0);
    }
    return static_cast<T>(static_cast<int64_t>(x) / static_cast<int64_t>(d));
  }
}

}  // namespace weft::reduce
