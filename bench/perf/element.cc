#include "element.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "minifloat.h"

namespace weft::perf {

namespace {

constexpr int64_t kLimitCap = int64_t{1} << 20;
constexpr int kPowerCap = 30;

template <typename T>
T read_as(const void* buffer, size_t index) {
  T value;
  std::memcpy(&value, static_cast<const char*>(buffer) + index * sizeof(T), sizeof(T));
  return value;
}

template <typename T>
void write_as(void* buffer, size_t index, T value) {
  std::memcpy(static_cast<char*>(buffer) + index * sizeof(T), &value, sizeof(T));
}

// The narrow float types' formats; nullptr for the others.
const MiniFloatFormat* minifloat_format(weftDataType_t dtype) {
  switch (dtype) {
    case weftFloat16:
      return &kFloat16Format;
    case weftBfloat16:
      return &kBfloat16Format;
    case weftFloat8e4m3:
      return &kFloat8e4m3Format;
    case weftFloat8e5m2:
      return &kFloat8e5m2Format;
    default:
      return nullptr;
  }
}

// Mantissa bits (without the implicit one) of a float type.
int mantissa_bits(weftDataType_t dtype) {
  if (const MiniFloatFormat* format = minifloat_format(dtype)) return format->mantissa_bits;
  return dtype == weftFloat32 ? 23 : 52;
}

int min_normal_exponent(weftDataType_t dtype) {
  if (const MiniFloatFormat* format = minifloat_format(dtype))
    return 2 - (1 << (format->exponent_bits - 1));
  return dtype == weftFloat32 ? -126 : -1022;
}

}  // namespace

double load_element(weftDataType_t dtype, const void* buffer, size_t index) {
  switch (dtype) {
    case weftInt8:
      return read_as<int8_t>(buffer, index);
    case weftUint8:
      return read_as<uint8_t>(buffer, index);
    case weftInt32:
      return read_as<int32_t>(buffer, index);
    case weftUint32:
      return read_as<uint32_t>(buffer, index);
    case weftInt64:
      return static_cast<double>(read_as<int64_t>(buffer, index));
    case weftUint64:
      return static_cast<double>(read_as<uint64_t>(buffer, index));
    case weftFloat32:
      return read_as<float>(buffer, index);
    case weftFloat64:
      return read_as<double>(buffer, index);
    case weftFloat16:
    case weftBfloat16:
      return minifloat_decode(*minifloat_format(dtype), read_as<uint16_t>(buffer, index));
    case weftFloat8e4m3:
    case weftFloat8e5m2:
      return minifloat_decode(*minifloat_format(dtype), read_as<uint8_t>(buffer, index));
    default:
      return NAN;
  }
}

void store_element(weftDataType_t dtype, void* buffer, size_t index, double value) {
  switch (dtype) {
    case weftInt8:
      return write_as(buffer, index, static_cast<int8_t>(value));
    case weftUint8:
      return write_as(buffer, index, static_cast<uint8_t>(value));
    case weftInt32:
      return write_as(buffer, index, static_cast<int32_t>(value));
    case weftUint32:
      return write_as(buffer, index, static_cast<uint32_t>(value));
    case weftInt64:
      return write_as(buffer, index, static_cast<int64_t>(value));
    case weftUint64:
      return write_as(buffer, index, static_cast<uint64_t>(value));
    case weftFloat32:
      return write_as(buffer, index, static_cast<float>(value));
    case weftFloat64:
      return write_as(buffer, index, value);
    case weftFloat16:
    case weftBfloat16:
      return write_as(buffer, index,
                      static_cast<uint16_t>(minifloat_encode(*minifloat_format(dtype), value)));
    case weftFloat8e4m3:
    case weftFloat8e5m2:
      return write_as(buffer, index,
                      static_cast<uint8_t>(minifloat_encode(*minifloat_format(dtype), value)));
    default:
      return;
  }
}

bool is_float_type(weftDataType_t dtype) {
  return dtype == weftFloat32 || dtype == weftFloat64 || minifloat_format(dtype) != nullptr;
}

int64_t exact_integer_limit(weftDataType_t dtype) {
  switch (dtype) {
    case weftInt8:
      return 127;
    case weftUint8:
      return 255;
    default:
      break;
  }
  if (!is_float_type(dtype)) return kLimitCap;
  // Integers are exact up to 2^(mantissa bits + 1).
  return std::min(kLimitCap, int64_t{1} << (mantissa_bits(dtype) + 1));
}

int max_power_of_two(weftDataType_t dtype) {
  switch (dtype) {
    case weftInt8:
      return 6;
    case weftUint8:
      return 7;
    case weftFloat16:
      return 15;
    case weftFloat8e4m3:
      return 8;  // 2^9 = 512 is past its largest finite value, 448
    case weftFloat8e5m2:
      return 15;
    default:
      return kPowerCap;
  }
}

double ulp(weftDataType_t dtype, double value) {
  if (!is_float_type(dtype)) return 0;
  const double magnitude = std::fabs(value);
  int exponent = min_normal_exponent(dtype);
  if (magnitude > 0) {
    int frexp_exponent;
    std::frexp(magnitude, &frexp_exponent);
    exponent = std::max(exponent, frexp_exponent - 1);
  }
  return std::ldexp(1.0, exponent - mantissa_bits(dtype));
}

}  // namespace weft::perf
