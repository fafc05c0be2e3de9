// Element functors of the CUDA reduction kernels, written once for the host
// and the device: the kernels in reduce_kernels.cu run them on the GPU and the
// host tests run the very same code on the CPU against Weft's host kernels
// (lib/core/reduce), which they must equal bit for bit:
//  - integers: Sum and Prod wrap (unsigned arithmetic), Max and Min compare
//    signed or unsigned as the type is, Avg divides truncating (divide_int);
//  - fp32 / fp64: native IEEE arithmetic (the kernels build with -fmad=false:
//    a fused multiply-add would round once where the host rounds twice);
//  - fp16, bf16, fp8: decoded exactly to fp32, combined there, rounded back to
//    nearest even after every step (fp8 saturating to its largest finite
//    value), with CUDA's own conversions (cuda_fp16.h, cuda_bf16.h, cuda_fp8.h,
//    which have host implementations too);
//  - every NaN result is the type's one quiet NaN, Max and Min propagate NaN
//    from either input and return b when the inputs compare equal.
// Needs the CUDA headers (not the driver or a GPU).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "common/host_device.h"
#include "core/cuda/reduce_params.h"
#include "core/reduce/integer_divide.h"
#include "core/reduce/reduce.h"

namespace weft::cuda {

using reduce::Op;

template <class To, class From>
WEFT_HOST_DEVICE inline To bits_as(From from) {
  static_assert(sizeof(To) == sizeof(From));
  To to;
  memcpy(&to, &from, sizeof to);
  return to;
}

template <class T>
WEFT_HOST_DEVICE inline bool is_nan(T x) {
  return x != x;
}

// Per data type: Storage (as in memory), Value (what arithmetic runs on),
// load/store between them, and the quiet NaN results become.
template <weftDataType_t D>
struct Dtype;

template <class T>
struct NativeDtype {
  using Storage = T;
  using Value = T;
  WEFT_HOST_DEVICE static Value load(Storage s) { return s; }
  WEFT_HOST_DEVICE static Storage store(Value v) { return v; }
};
template <>
struct Dtype<weftInt8> : NativeDtype<int8_t> {};
template <>
struct Dtype<weftUint8> : NativeDtype<uint8_t> {};
template <>
struct Dtype<weftInt32> : NativeDtype<int32_t> {};
template <>
struct Dtype<weftUint32> : NativeDtype<uint32_t> {};
template <>
struct Dtype<weftInt64> : NativeDtype<int64_t> {};
template <>
struct Dtype<weftUint64> : NativeDtype<uint64_t> {};
template <>
struct Dtype<weftFloat32> : NativeDtype<float> {
  WEFT_HOST_DEVICE static float quiet_nan() { return bits_as<float>(0x7fc00000u); }
};
template <>
struct Dtype<weftFloat64> : NativeDtype<double> {
  WEFT_HOST_DEVICE static double quiet_nan() { return bits_as<double>(0x7ff8000000000000ull); }
};

// A narrow float: computed in fp32; a NaN result is stored as kNan directly,
// so CUDA's choice of NaN pattern in its conversions never matters.
template <class Codec, class S, S kNan>
struct NarrowDtype {
  using Storage = S;
  using Value = float;
  WEFT_HOST_DEVICE static Value load(Storage s) { return Codec::to_float(s); }
  WEFT_HOST_DEVICE static Storage store(Value v) { return is_nan(v) ? kNan : Codec::from_float(v); }
  WEFT_HOST_DEVICE static float quiet_nan() { return bits_as<float>(0x7fc00000u); }
};

// fp16 and bf16: CUDA's types, built from and read back as their raw bits.
WEFT_HOST_DEVICE inline float widen(__half h) {
  return __half2float(h);
}
WEFT_HOST_DEVICE inline float widen(__nv_bfloat16 h) {
  return __bfloat162float(h);
}
WEFT_HOST_DEVICE inline void round_into(float v, __half* out) {
  *out = __float2half_rn(v);
}
WEFT_HOST_DEVICE inline void round_into(float v, __nv_bfloat16* out) {
  *out = __float2bfloat16_rn(v);
}
template <class Narrow, class Raw>
struct HalfCodec {
  WEFT_HOST_DEVICE static float to_float(uint16_t s) {
    Raw raw;
    raw.x = s;
    return widen(Narrow(raw));
  }
  WEFT_HOST_DEVICE static uint16_t from_float(float v) {
    Narrow n;
    round_into(v, &n);
    return static_cast<Raw>(n).x;
  }
};
using Fp16Codec = HalfCodec<__half, __half_raw>;
using Bf16Codec = HalfCodec<__nv_bfloat16, __nv_bfloat16_raw>;
// fp8 decodes through fp16, which holds every fp8 value exactly.
template <__nv_fp8_interpretation_t kKind>
struct Fp8Codec {
  WEFT_HOST_DEVICE static float to_float(uint8_t s) {
    return __half2float(__half(__nv_cvt_fp8_to_halfraw(s, kKind)));
  }
  WEFT_HOST_DEVICE static uint8_t from_float(float v) {
    return __nv_cvt_float_to_fp8(v, __NV_SATFINITE, kKind);
  }
};

template <>
struct Dtype<weftFloat16> : NarrowDtype<Fp16Codec, uint16_t, 0x7e00> {};
template <>
struct Dtype<weftBfloat16> : NarrowDtype<Bf16Codec, uint16_t, 0x7fc0> {};
template <>
struct Dtype<weftFloat8e4m3> : NarrowDtype<Fp8Codec<__NV_E4M3>, uint8_t, 0x7f> {};
template <>
struct Dtype<weftFloat8e5m2> : NarrowDtype<Fp8Codec<__NV_E5M2>, uint8_t, 0x7e> {};

template <weftDataType_t D>
struct Reducer {
  using Traits = Dtype<D>;
  using S = typename Traits::Storage;
  using V = typename Traits::Value;
  static constexpr bool kFloat = std::is_floating_point_v<V>;
  // Integers wrap on Sum and Prod: computed unsigned.
  using Wrap =
      typename std::conditional_t<kFloat, std::type_identity<V>, std::make_unsigned<V>>::type;

  WEFT_HOST_DEVICE static V canonical(V r) {
    if constexpr (kFloat) {
      return is_nan(r) ? Traits::quiet_nan() : r;
    } else {
      return r;
    }
  }
  WEFT_HOST_DEVICE static V combine(Op op, V a, V b) {
    if constexpr (kFloat) {
      // Max and Min propagate NaN too (Sum and Prod do by themselves).
      if (is_nan(a) || is_nan(b)) return Traits::quiet_nan();
    }
    switch (op) {
      case Op::Sum:
        return canonical(static_cast<V>(static_cast<Wrap>(a) + static_cast<Wrap>(b)));
      case Op::Prod:
        return canonical(static_cast<V>(static_cast<Wrap>(a) * static_cast<Wrap>(b)));
      case Op::Max:
        return a > b ? a : b;
      case Op::Min:
        return a < b ? a : b;
    }
    return a;
  }
  // One step on stored values: what the host's apply() does per element.
  WEFT_HOST_DEVICE static S apply(Op op, S a, S b) {
    return Traits::store(combine(op, Traits::load(a), Traits::load(b)));
  }
  WEFT_HOST_DEVICE static S divide(S a, uint64_t divisor) {
    if constexpr (kFloat) {
      return Traits::store(canonical(Traits::load(a) / static_cast<V>(divisor)));
    } else {
      return reduce::divide_int(a, divisor);
    }
  }
};

template <weftDataType_t D>
struct Element {
  using R = Reducer<D>;
  using S = typename R::S;
  static constexpr int kPack = 16 / static_cast<int>(sizeof(S));
  struct alignas(16) Pack {
    S v[kPack];
  };

  WEFT_HOST_DEVICE static S scalar(const ReduceParams& p) {
    S s;
    memcpy(&s, p.scalar_source != nullptr ? p.scalar_source : p.scalar, sizeof s);
    return s;
  }
  // The fold over `kLanes` consecutive values at x[k] of every input k.
  template <int kLanes, class Load>
  WEFT_HOST_DEVICE static void fold(const ReduceParams& p, S scale, S (&acc)[kLanes], Load load) {
    S x[kLanes];
    load(0, acc);
    if (p.premul) {
      for (int l = 0; l < kLanes; ++l) acc[l] = R::apply(Op::Prod, acc[l], scale);
    }
    for (int k = 1; k < p.n; ++k) {
      load(k, x);
      for (int l = 0; l < kLanes; ++l) {
        S v = p.premul ? R::apply(Op::Prod, x[l], scale) : x[l];
        acc[l] = R::apply(p.op, acc[l], v);
      }
    }
    if (p.divisor != 0) {
      for (int l = 0; l < kLanes; ++l) acc[l] = R::divide(acc[l], p.divisor);
    }
  }
  WEFT_HOST_DEVICE static void one(const ReduceParams& p, S scale, uint64_t i) {
    S acc[1];
    fold<1>(p, scale, acc, [&](int k, S(&x)[1]) { x[0] = static_cast<const S*>(p.in[k])[i]; });
    static_cast<S*>(p.out)[i] = acc[0];
  }
  // Pack j of the aligned body: one 16-byte load per input, one store.
  WEFT_HOST_DEVICE static void pack(const ReduceParams& p, S scale, uint64_t j) {
    Pack acc;
    fold<kPack>(p, scale, acc.v, [&](int k, S(&x)[kPack]) {
      Pack in = reinterpret_cast<const Pack*>(static_cast<const S*>(p.in[k]) + p.head)[j];
      for (int l = 0; l < kPack; ++l) x[l] = in.v[l];
    });
    reinterpret_cast<Pack*>(static_cast<S*>(p.out) + p.head)[j] = acc;
  }
  // Work item `w` of head + packs + tail, in the order the kernel hands them out.
  WEFT_HOST_DEVICE static void item(const ReduceParams& p, S scale, uint64_t w) {
    if (w < p.packs) {
      pack(p, scale, w);
    } else {
      uint64_t e = w - p.packs;  // head, then tail
      one(p, scale, e < p.head ? e : e + p.packs * kPack);
    }
  }
  WEFT_HOST_DEVICE static uint64_t items(const ReduceParams& p) { return work_items(p, sizeof(S)); }
};

// Calls f(std::integral_constant<weftDataType_t, D>{}) for a valid dtype.
template <class F>
bool with_dtype(weftDataType_t dtype, F&& f) {
  switch (dtype) {
#define WEFT_CUDA_DTYPE_CASE(D)                     \
  case D:                                           \
    f(std::integral_constant<weftDataType_t, D>{}); \
    return true;
    WEFT_CUDA_DTYPE_CASE(weftInt8)
    WEFT_CUDA_DTYPE_CASE(weftUint8)
    WEFT_CUDA_DTYPE_CASE(weftInt32)
    WEFT_CUDA_DTYPE_CASE(weftUint32)
    WEFT_CUDA_DTYPE_CASE(weftInt64)
    WEFT_CUDA_DTYPE_CASE(weftUint64)
    WEFT_CUDA_DTYPE_CASE(weftFloat16)
    WEFT_CUDA_DTYPE_CASE(weftFloat32)
    WEFT_CUDA_DTYPE_CASE(weftFloat64)
    WEFT_CUDA_DTYPE_CASE(weftBfloat16)
    WEFT_CUDA_DTYPE_CASE(weftFloat8e4m3)
    WEFT_CUDA_DTYPE_CASE(weftFloat8e5m2)
#undef WEFT_CUDA_DTYPE_CASE
    default:
      return false;
  }
}

}  // namespace weft::cuda
