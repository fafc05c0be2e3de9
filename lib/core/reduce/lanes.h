// Lanes: the vocabulary the kernels are written in. Vec<T, N> is a GCC vector
// of N lanes, or plain T when N == 1, so that one source serves the scalar
// fallback and every SIMD width with the same operators and the same rounding.
// Everything here has internal linkage: see kernels.h for why.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>

namespace weft::reduce {
namespace {

template <class T, int N>
struct VecOf {
  typedef T type __attribute__((vector_size(N * sizeof(T))));
};
template <class T>
struct VecOf<T, 1> {
  using type = T;
};
template <class T, int N>
using Vec = typename VecOf<T, N>::type;

template <class V>
struct LaneOf {
  using type = std::remove_cvref_t<decltype(std::declval<V>()[0])>;
};
template <class V>
requires std::is_arithmetic_v<V>
struct LaneOf<V> {
  using type = V;
};
template <class V>
inline constexpr bool kFloatLanes = std::is_floating_point_v<typename LaneOf<V>::type>;

template <class V>
inline V load_lanes(const void* p) {
  V v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

template <class V>
inline void store_lanes(void* p, V v) {
  std::memcpy(p, &v, sizeof v);
}

template <class To, class From>
inline To bitcast(From v) {
  return __builtin_bit_cast(To, v);
}

// Value conversion lane by lane (int to float and the like).
template <class To, class From>
inline To convert(From v) {
  if constexpr (std::is_arithmetic_v<From>) {
    return static_cast<To>(v);
  } else {
    return __builtin_convertvector(v, To);
  }
}

template <class V, class T>
inline V splat(T x) {
  if constexpr (std::is_arithmetic_v<V>) {
    return static_cast<V>(x);
  } else {
    V v;
    for (size_t i = 0; i < sizeof(V) / sizeof(v[0]); ++i) v[i] = x;
    return v;
  }
}

// mask ? a : b lane by lane; mask is a bool or a comparison result.
template <class M, class V>
inline V select(M mask, V a, V b) {
  return mask ? a : b;
}

}  // namespace
}  // namespace weft::reduce
