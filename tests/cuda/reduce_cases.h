// What the CUDA reduction tests share: the cases (dtype × op, PreMulSum and
// Avg included), inputs full of edge values, and the expected result computed
// with Weft's host reduction kernels (lib/core/reduce), chained pairwise as
// the host executor does.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/reduce/kernel_table.h"
#include "core/reduce/reduce.h"

namespace weft::cuda::testing {

// The reductions a collective can ask for: the four ops, Avg (a sum, then
// divided by the number of inputs) and PreMulSum with the scalar from host
// memory or from device memory.
enum class Math { Sum, Prod, Max, Min, Avg, PreMulHost, PreMulDevice };
inline constexpr Math kMaths[] = {Math::Sum, Math::Prod,       Math::Max,         Math::Min,
                                  Math::Avg, Math::PreMulHost, Math::PreMulDevice};

inline const char* math_name(Math m) {
  static const char* const kNames[] = {"sum", "prod",       "max",         "min",
                                       "avg", "premulhost", "premuldevice"};
  return kNames[static_cast<int>(m)];
}
inline reduce::Op op_of(Math m) {
  return m <= Math::Min ? static_cast<reduce::Op>(static_cast<int>(m)) : reduce::Op::Sum;
}
inline bool is_premul(Math m) {
  return m == Math::PreMulHost || m == Math::PreMulDevice;
}

inline constexpr weftDataType_t kDtypes[] = {
    weftInt8,    weftUint8,   weftInt32,   weftUint32,   weftInt64,      weftUint64,
    weftFloat16, weftFloat32, weftFloat64, weftBfloat16, weftFloat8e4m3, weftFloat8e5m2};

inline bool is_integer(weftDataType_t t) {
  return t <= weftUint64;
}

// Element values: mostly numbers of nearby magnitude (so that sums round and
// carry), one in six an edge value: zeros of both signs, infinities, NaNs of
// both signs with payloads (signalling ones too), subnormals, the largest
// finite values; integers: 0, 1, -1, the extremes (their sums and products
// wrap). Narrow floats draw every bit pattern.
inline std::vector<uint8_t> random_elements(weftDataType_t t, size_t count, std::mt19937_64& rng) {
  size_t size = reduce::dtype_size(t);
  std::vector<uint8_t> out(count * size);
  auto edge = [&](std::initializer_list<uint64_t> values) {
    return *(values.begin() + rng() % values.size());
  };
  for (size_t i = 0; i < count; ++i) {
    bool special = rng() % 6 == 0;
    uint64_t r = rng(), v = r;
    if (t == weftFloat32) {
      v = special ? edge({0x00000000, 0x80000000, 0x7f800000, 0xff800000, 0x7fc00000, 0xffc00123,
                          0x7f800001, 0x00000001, 0x807fffff, 0x7f7fffff, 0x00800000})
                  : (r & 0x807fffffu) | ((120 + (r >> 40) % 16) << 23);
    } else if (t == weftFloat64) {
      v = special ? edge({0x0, 0x8000000000000000, 0x7ff0000000000000, 0xfff0000000000000,
                          0x7ff8000000000000, 0xfff0000000000005, 0x0000000000000001,
                          0x800fffffffffffff, 0x7fefffffffffffff})
                  : (r & 0x800fffffffffffffu) | ((1016 + rng() % 16) << 52);
    } else if (is_integer(t) && special) {
      uint64_t top = uint64_t{1} << (8 * size - 1);
      v = edge({0, 1, ~uint64_t{0}, top, top - 1});
    }
    memcpy(out.data() + i * size, &v, size);  // little-endian: the low bytes
  }
  return out;
}

// A PreMulSum scalar of dtype t: small, so that products stay finite mostly.
inline std::vector<uint8_t> premul_scalar(weftDataType_t t, std::mt19937_64& rng) {
  std::vector<uint8_t> s(reduce::dtype_size(t));
  float f = static_cast<float>(rng() % 7) * 0.375f - 1.25f;
  if (is_integer(t)) {
    int64_t v = static_cast<int64_t>(rng() % 7) - 3;
    memcpy(s.data(), &v, s.size());
  } else if (t == weftFloat32) {
    memcpy(s.data(), &f, 4);
  } else if (t == weftFloat64) {
    double d = f;
    memcpy(s.data(), &d, 8);
  } else {
    reduce::kernels(reduce::Isa::Scalar).from_float[t](s.data(), &f, 1);
  }
  return s;
}

// The host executor's arithmetic: every input scaled first (PreMulSum),
// combined left to right with apply(), then divided (Avg).
inline std::vector<uint8_t> host_reduce(weftDataType_t t, Math m,
                                        const std::vector<std::vector<uint8_t>>& inputs,
                                        const uint8_t* scalar, size_t count) {
  std::vector<uint8_t> acc = inputs[0], next;
  if (is_premul(m)) reduce::scale(t, acc.data(), acc.data(), scalar, count);
  for (size_t k = 1; k < inputs.size(); ++k) {
    next = inputs[k];
    if (is_premul(m)) reduce::scale(t, next.data(), next.data(), scalar, count);
    reduce::apply(t, op_of(m), acc.data(), acc.data(), next.data(), count);
  }
  if (m == Math::Avg) reduce::divide(t, acc.data(), acc.data(), inputs.size(), count);
  return acc;
}

// The first element where two results differ, as text, or "" when equal.
inline std::string first_difference(weftDataType_t t, const uint8_t* got, const uint8_t* want,
                                    size_t count) {
  size_t size = reduce::dtype_size(t);
  for (size_t i = 0; i < count; ++i) {
    if (memcmp(got + i * size, want + i * size, size) == 0) continue;
    uint64_t g = 0, w = 0;
    memcpy(&g, got + i * size, size);
    memcpy(&w, want + i * size, size);
    char text[96];
    snprintf(text, sizeof text, "element %zu: got 0x%llx, host kernels 0x%llx", i,
             static_cast<unsigned long long>(g), static_cast<unsigned long long>(w));
    return text;
  }
  return "";
}

}  // namespace weft::cuda::testing
