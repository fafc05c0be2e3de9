// A small strict JSON reader and writer for Weft's topology files. Strict on
// purpose: these files are written by people and by weft-topo, and a typo
// should be an error naming its line and column, never a silent default.
// Bounded: nesting depth and input size are limited, so hostile input costs
// little and cannot exhaust the stack.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace weft::topo::json {

enum class Type : uint8_t { Null, Bool, Number, String, Array, Object };

struct Member;

struct Value {
  Type type = Type::Null;
  bool boolean = false;
  std::string text;  // a String's contents, or a Number's literal as written
  std::vector<Value> items;
  std::vector<Member> members;  // in file order, keys unique
  int line = 0, column = 0;     // where the value starts

  // The member named `key`, or null.
  const Value* find(std::string_view key) const;
};

// An object's member. Not a std::pair: a pair of a still incomplete Value does not compile
// with clang and libstdc++ (its constructors' traits need Value complete).
struct Member {
  std::string key;
  Value value;
};

const char* type_name(Type type);

inline constexpr int kMaxDepth = 64;
inline constexpr size_t kMaxInputBytes = size_t{64} << 20;

// Parses one JSON document (RFC 8259; duplicate object keys are an error).
Status parse(std::string_view text, Value* out);

// `text` as a JSON string literal, quotes included.
std::string quote(std::string_view text);

}  // namespace weft::topo::json
