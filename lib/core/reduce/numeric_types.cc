#include "core/reduce/numeric_types.h"

#include <bit>

#include "core/reduce/float_format.h"

namespace weft::reduce {

namespace {
template <FloatFormat F>
float to_float(uint32_t bits) {
  return std::bit_cast<float>(decode<F, 1>(bits));
}
template <FloatFormat F>
StorageOf<F> from_float(float value) {
  return static_cast<StorageOf<F>>(encode<F, 1>(std::bit_cast<uint32_t>(value)));
}
}  // namespace

float fp16_to_float(uint16_t bits) {
  return to_float<kFp16>(bits);
}
uint16_t float_to_fp16(float value) {
  return from_float<kFp16>(value);
}
float bf16_to_float(uint16_t bits) {
  return to_float<kBf16>(bits);
}
uint16_t float_to_bf16(float value) {
  return from_float<kBf16>(value);
}
float fp8e4m3_to_float(uint8_t bits) {
  return to_float<kFp8e4m3>(bits);
}
uint8_t float_to_fp8e4m3(float value) {
  return from_float<kFp8e4m3>(value);
}
float fp8e5m2_to_float(uint8_t bits) {
  return to_float<kFp8e5m2>(bits);
}
uint8_t float_to_fp8e5m2(float value) {
  return from_float<kFp8e5m2>(value);
}

}  // namespace weft::reduce
