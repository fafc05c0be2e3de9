// Element access by weftDataType_t for tests: values go in and out as
// doubles, converted with the library's own rounding for fp16/bf16/fp8.
#pragma once

#include <cstdint>
#include <cstring>
#include <vector>

#include "common/dtype.h"
#include "core/reduce/numeric_types.h"

namespace weft::testing {

inline void store_value(weftDataType_t dtype, void* base, size_t index, double value) {
  auto* p = static_cast<uint8_t*>(base) + index * dtype_size(dtype);
  auto put = [p](auto v) { memcpy(p, &v, sizeof(v)); };
  switch (dtype) {
    case weftInt8:
      put(static_cast<int8_t>(value));
      break;
    case weftUint8:
      put(static_cast<uint8_t>(value));
      break;
    case weftInt32:
      put(static_cast<int32_t>(value));
      break;
    case weftUint32:
      put(static_cast<uint32_t>(value));
      break;
    case weftInt64:
      put(static_cast<int64_t>(value));
      break;
    case weftUint64:
      put(static_cast<uint64_t>(value));
      break;
    case weftFloat16:
      put(reduce::float_to_fp16(static_cast<float>(value)));
      break;
    case weftFloat32:
      put(static_cast<float>(value));
      break;
    case weftFloat64:
      put(value);
      break;
    case weftBfloat16:
      put(reduce::float_to_bf16(static_cast<float>(value)));
      break;
    case weftFloat8e4m3:
      put(reduce::float_to_fp8e4m3(static_cast<float>(value)));
      break;
    case weftFloat8e5m2:
      put(reduce::float_to_fp8e5m2(static_cast<float>(value)));
      break;
    default:
      break;
  }
}

inline double load_value(weftDataType_t dtype, const void* base, size_t index) {
  const auto* p = static_cast<const uint8_t*>(base) + index * dtype_size(dtype);
  auto get = [p](auto v) {
    memcpy(&v, p, sizeof(v));
    return v;
  };
  switch (dtype) {
    case weftInt8:
      return get(int8_t{});
    case weftUint8:
      return get(uint8_t{});
    case weftInt32:
      return get(int32_t{});
    case weftUint32:
      return get(uint32_t{});
    case weftInt64:
      return static_cast<double>(get(int64_t{}));
    case weftUint64:
      return static_cast<double>(get(uint64_t{}));
    case weftFloat16:
      return reduce::fp16_to_float(get(uint16_t{}));
    case weftFloat32:
      return get(float{});
    case weftFloat64:
      return get(double{});
    case weftBfloat16:
      return reduce::bf16_to_float(get(uint16_t{}));
    case weftFloat8e4m3:
      return reduce::fp8e4m3_to_float(get(uint8_t{}));
    case weftFloat8e5m2:
      return reduce::fp8e5m2_to_float(get(uint8_t{}));
    default:
      return 0;
  }
}

inline bool is_float_type(weftDataType_t dtype) {
  return dtype == weftFloat16 || dtype == weftFloat32 || dtype == weftFloat64 ||
         dtype == weftBfloat16 || dtype == weftFloat8e4m3 || dtype == weftFloat8e5m2;
}

}  // namespace weft::testing
