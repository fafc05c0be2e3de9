// Facts about the public data types, shared by every layer.
#pragma once

#include <cstddef>

#include "weft/weft.h"

namespace weft {

inline bool dtype_valid(weftDataType_t dtype) {
  return static_cast<int>(dtype) >= 0 && static_cast<int>(dtype) < weftNumTypes;
}

// Bytes per element; 0 for an invalid type.
inline size_t dtype_size(weftDataType_t dtype) {
  switch (dtype) {
    case weftInt8:
    case weftUint8:
    case weftFloat8e4m3:
    case weftFloat8e5m2:
      return 1;
    case weftFloat16:
    case weftBfloat16:
      return 2;
    case weftInt32:
    case weftUint32:
    case weftFloat32:
      return 4;
    case weftInt64:
    case weftUint64:
    case weftFloat64:
      return 8;
    default:
      return 0;
  }
}

inline bool dtype_is_floating(weftDataType_t dtype) {
  return dtype == weftFloat16 || dtype == weftBfloat16 || dtype == weftFloat32 ||
         dtype == weftFloat64 || dtype == weftFloat8e4m3 || dtype == weftFloat8e5m2;
}

// The names nccl-tests prints.
inline const char* dtype_name(weftDataType_t dtype) {
  static const char* const kNames[] = {"int8", "uint8", "int32",  "uint32",   "int64",  "uint64",
                                       "half", "float", "double", "bfloat16", "f8e4m3", "f8e5m2"};
  return dtype_valid(dtype) ? kNames[dtype] : "invalid";
}

}  // namespace weft
