// Reading and writing single elements of any Weft data type as doubles, for filling
// inputs and checking results. Every value the checker uses is an integer small enough
// to be exact in the type, so a double holds it without loss.
#pragma once

#include <cstddef>
#include <cstdint>

#include "weft/weft.h"

namespace weft::perf {

double load_element(weftDataType_t dtype, const void* buffer, size_t index);
// value must be representable; floats round to nearest even, integers are truncated.
void store_element(weftDataType_t dtype, void* buffer, size_t index, double value);

bool is_float_type(weftDataType_t dtype);
// Largest M such that every integer in [0, M] is exact in dtype, capped at 2^20 (the
// checker never needs more).
int64_t exact_integer_limit(weftDataType_t dtype);
// Largest E such that 2^E is exact and finite in dtype (also capped), for products.
int max_power_of_two(weftDataType_t dtype);
// Distance from |value| to the next larger representable magnitude; 0 for integer types.
double ulp(weftDataType_t dtype, double value);

}  // namespace weft::perf
