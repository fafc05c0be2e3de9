// The reduction kernels, written once over lanes and compiled once per
// instruction set. reduce_scalar.cc, reduce_avx2.cc and reduce_avx512.cc each
// include this file, the SIMD ones with WEFT_REDUCE_TARGET set to a target
// string, which then applies to every function below it in that unit (GCC:
// `#pragma GCC target`; clang: `#pragma clang attribute`, which such a unit
// closes with WEFT_REDUCE_TARGET_END). All of it has internal linkage, so the
// linker can never hand an AVX-512 copy of some inline function to scalar
// code on a CPU without it. The standard headers are included first, outside
// the target switch.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <utility>

#include "core/reduce/integer_divide.h"
#include "core/reduce/kernel_table.h"

#define WEFT_REDUCE_PRAGMA_STRING(x) #x
#define WEFT_REDUCE_PRAGMA(x) _Pragma(WEFT_REDUCE_PRAGMA_STRING(x))
#if !defined(WEFT_REDUCE_TARGET)
#define WEFT_REDUCE_TARGET_END
#elif defined(__clang__)
WEFT_REDUCE_PRAGMA(clang attribute push(__attribute__((target(WEFT_REDUCE_TARGET))),
                                        apply_to = function))
#define WEFT_REDUCE_TARGET_END WEFT_REDUCE_PRAGMA(clang attribute pop)
#else
WEFT_REDUCE_PRAGMA(GCC target(WEFT_REDUCE_TARGET))
#define WEFT_REDUCE_TARGET_END
#endif

#include "core/reduce/float_format.h"
#include "core/reduce/lanes.h"

namespace weft::reduce {
namespace {

template <class T>
using WrappingLane = typename std::conditional_t<std::is_integral_v<T>, std::make_unsigned<T>,
                                                 std::type_identity<T>>::type;

// Isa provides kBytes (vector width; 0 for scalar) and, when kBytes > 0, for
// N = kBytes / 4 lanes: widen (N bytes -> 16-bit lanes, N uint16 -> 32-bit
// lanes), narrow (the reverse, values known to fit), fp16_to_float,
// float_to_fp16 (to nearest even) and float_to_fp16_odd (rounded to odd).
template <class Isa>
struct Kernels {
  template <class T>
  static constexpr int kLanesOf = Isa::kBytes == 0 ? 1 : Isa::kBytes / static_cast<int>(sizeof(T));

  // Stored as T, computed on lanes of L (same size: unsigned to wrap).
  template <class T, class L = T>
  struct Native {
    using Value = L;
    static constexpr int kLanes = kLanesOf<T>;
    template <int N>
    static Vec<L, N> load(const void* p, size_t i) {
      return load_lanes<Vec<L, N>>(static_cast<const T*>(p) + i);
    }
    template <int N>
    static void store(void* p, size_t i, Vec<L, N> v) {
      store_lanes(static_cast<T*>(p) + i, v);
    }
  };

  // A narrow floating type, computed in fp32. One lane: the integer codec of
  // float_format.h. SIMD: fp16 through F16C, bf16 by shifts and the integer
  // codec, fp8 through F16C's fp16 (float_format.h says why that is exact).
  template <FloatFormat F>
  struct Narrow {
    using Storage = StorageOf<F>;
    using Value = float;
    static constexpr int kLanes = kLanesOf<float>;
    template <int N>
    static Vec<float, N> load(const void* p, size_t i) {
      const Storage* s = static_cast<const Storage*>(p) + i;
      if constexpr (N == 1) {
        return bitcast<float>(decode<F, 1>(load_lanes<Storage>(s)));
      } else if constexpr (F == kFp16) {
        return Isa::fp16_to_float(load_lanes<Vec<uint16_t, N>>(s));
      } else if constexpr (F == kBf16) {
        return bitcast<Vec<float, N>>(decode<F, N>(Isa::widen(s)));
      } else {
        return Isa::fp16_to_float(fp8_to_fp16_bits<F, N>(Isa::widen(s))) / kFp8InFp16<F>;
      }
    }
    template <int N>
    static void store(void* p, size_t i, Vec<float, N> v) {
      Storage* s = static_cast<Storage*>(p) + i;
      if constexpr (N == 1) {
        store_lanes(s, static_cast<Storage>(encode<F, 1>(bitcast<uint32_t>(v))));
      } else if constexpr (F == kFp16) {
        store_lanes(s, Isa::float_to_fp16(v));
      } else if constexpr (F == kBf16) {
        Isa::narrow(s, encode<F, N>(bitcast<Vec<uint32_t, N>>(v)));
      } else {
        Isa::narrow(s, fp16_odd_to_fp8<F, N>(Isa::float_to_fp16_odd(v * kFp8InFp16<F>)));
      }
    }
  };

  // Every NaN result becomes the one quiet NaN: which NaN x86 returns
  // depends on operand order, and compilers reorder (and fold) freely.
  // nan: where the result is NaN (a comparison mask).
  template <class V, class M>
  static V canonical(M nan, V r) {
    if constexpr (kFloatLanes<V>) {
      return select(nan, splat<V>(std::numeric_limits<typename LaneOf<V>::type>::quiet_NaN()), r);
    } else {
      return r;
    }
  }

  template <Op kOp>
  struct Combine {
    template <class V>
    V operator()(V a, V b) const {
      if constexpr (kOp == Op::Sum) {
        V r = static_cast<V>(a + b);
        return canonical(r != r, r);
      } else if constexpr (kOp == Op::Prod) {
        V r = static_cast<V>(a * b);
        return canonical(r != r, r);
      } else if constexpr (kOp == Op::Max) {  // NaN in either input propagates
        return canonical((a != a) | (b != b), select(a > b, a, b));
      } else {
        return canonical((a != a) | (b != b), select(a < b, a, b));
      }
    }
  };
  struct Quotient {
    template <class V>
    V operator()(V a, V b) const {
      V r = a / b;
      return canonical(r != r, r);
    }
  };
  struct First {
    template <class V>
    V operator()(V a, V) const {
      return a;
    }
  };

  // Second operands: an array, or one value for every element.
  template <class P>
  struct Stream {
    const void* p;
    template <int N>
    Vec<typename P::Value, N> get(size_t i) const {
      return P::template load<N>(p, i);
    }
  };
  template <class P>
  struct Splat {
    typename P::Value v;
    template <int N>
    Vec<typename P::Value, N> get(size_t) const {
      return splat<Vec<typename P::Value, N>>(v);
    }
  };

  // dst[i] = f(a[i], b[i]): whole vectors, then the tail element by element.
  // Each vector is loaded before it is stored, so dst may alias a or b.
  template <class In, class Out, class B, class F>
  static void run(void* dst, const void* a, B b, size_t n, F f) {
    constexpr int N = In::kLanes;
    static_assert(N == Out::kLanes);
    size_t i = 0;
    if constexpr (N > 1) {
      for (; i + N <= n; i += N) {
        Out::template store<N>(dst, i, f(In::template load<N>(a, i), b.template get<N>(i)));
      }
    }
    for (; i < n; ++i) {
      Out::template store<1>(dst, i, f(In::template load<1>(a, i), b.template get<1>(i)));
    }
  }

  template <class P, Op kOp>
  static void apply_fn(void* dst, const void* a, const void* b, size_t n) {
    run<P, P>(dst, a, Stream<P>{b}, n, Combine<kOp>{});
  }
  template <class P>
  static void scale_fn(void* dst, const void* src, const void* scalar, size_t n) {
    if (n == 0) return;  // *scalar may then be absent
    run<P, P>(dst, src, Splat<P>{P::template load<1>(scalar, 0)}, n, Combine<Op::Prod>{});
  }
  template <class P>
  static void divide_fn(void* dst, const void* src, uint64_t divisor, size_t n) {
    using V = typename P::Value;
    if constexpr (std::is_integral_v<V>) {
      // No SIMD integer division; averaging integers is rare.
      for (size_t i = 0; i < n; ++i) {
        P::template store<1>(dst, i, divide_int(P::template load<1>(src, i), divisor));
      }
    } else {
      run<P, P>(dst, src, Splat<P>{static_cast<V>(divisor)}, n, Quotient{});
    }
  }
  // Conversions: run with First, the second operand unused.
  template <FloatFormat F>
  static void to_float_fn(float* dst, const void* src, size_t n) {
    run<Narrow<F>, Native<float>>(dst, src, Splat<Narrow<F>>{0.0f}, n, First{});
  }
  template <FloatFormat F>
  static void from_float_fn(void* dst, const float* src, size_t n) {
    run<Native<float>, Narrow<F>>(dst, src, Splat<Native<float>>{0.0f}, n, First{});
  }

  template <class T>
  struct NativeDtype {
    template <Op kOp>
    using For =
        Native<T, std::conditional_t<kOp == Op::Sum || kOp == Op::Prod, WrappingLane<T>, T>>;
    using Plain = Native<T>;
  };
  template <FloatFormat F>
  struct NarrowDtype {
    template <Op>
    using For = Narrow<F>;
    using Plain = Narrow<F>;
  };

  template <class D, size_t... kOps>
  static constexpr void fill_ops(KernelTable& t, weftDataType_t dtype,
                                 std::index_sequence<kOps...>) {
    ((t.apply[dtype][kOps] = &apply_fn<typename D::template For<Op(kOps)>, Op(kOps)>), ...);
  }
  template <class D>
  static constexpr void fill(KernelTable& t, weftDataType_t dtype) {
    fill_ops<D>(t, dtype, std::make_index_sequence<kNumOps>{});
    t.scale[dtype] = &scale_fn<typename D::template For<Op::Prod>>;
    t.divide[dtype] = &divide_fn<typename D::Plain>;
  }
  template <FloatFormat F>
  static constexpr void fill_narrow(KernelTable& t, weftDataType_t dtype) {
    fill<NarrowDtype<F>>(t, dtype);
    t.to_float[dtype] = &to_float_fn<F>;
    t.from_float[dtype] = &from_float_fn<F>;
  }

  static constexpr KernelTable table() {
    KernelTable t{};
    fill<NativeDtype<int8_t>>(t, weftInt8);
    fill<NativeDtype<uint8_t>>(t, weftUint8);
    fill<NativeDtype<int32_t>>(t, weftInt32);
    fill<NativeDtype<uint32_t>>(t, weftUint32);
    fill<NativeDtype<int64_t>>(t, weftInt64);
    fill<NativeDtype<uint64_t>>(t, weftUint64);
    fill<NativeDtype<float>>(t, weftFloat32);
    fill<NativeDtype<double>>(t, weftFloat64);
    fill_narrow<kFp16>(t, weftFloat16);
    fill_narrow<kBf16>(t, weftBfloat16);
    fill_narrow<kFp8e4m3>(t, weftFloat8e4m3);
    fill_narrow<kFp8e5m2>(t, weftFloat8e5m2);
    return t;
  }
};

}  // namespace
}  // namespace weft::reduce
