#include "topo/json.h"

#include <cstdio>

namespace weft::topo::json {

namespace {

class Parser {
 public:
  explicit Parser(std::string_view text) : text_(text) {}

  Status document(Value* out) {
    skip_space();
    WEFT_RETURN_IF_ERROR(value(out, 0));
    skip_space();
    if (pos_ != text_.size()) return fail("unexpected text after the document");
    return Status::Ok();
  }

 private:
  Status fail(const char* what) const {
    return Error(weftInvalidArgument, "line %d, column %d: %s", line_, column(), what);
  }
  int column() const { return static_cast<int>(pos_ - line_start_) + 1; }
  bool at_end() const { return pos_ >= text_.size(); }
  char peek() const { return at_end() ? '\0' : text_[pos_]; }

  void skip_space() {
    while (!at_end()) {
      char c = text_[pos_];
      if (c == '\n') {
        ++pos_;
        ++line_;
        line_start_ = pos_;
      } else if (c == ' ' || c == '\t' || c == '\r') {
        ++pos_;
      } else {
        break;
      }
    }
  }

  bool consume_word(std::string_view word) {
    if (text_.substr(pos_, word.size()) != word) return false;
    pos_ += word.size();
    return true;
  }

  Status value(Value* out, int depth) {
    if (depth >= kMaxDepth) return fail("nesting is too deep");
    out->line = line_;
    out->column = column();
    char c = peek();
    if (c == '{') return object(out, depth);
    if (c == '[') return array(out, depth);
    if (c == '"') {
      out->type = Type::String;
      return string(&out->text);
    }
    if (c == '-' || (c >= '0' && c <= '9')) return number(out);
    bool is_true = consume_word("true");
    if (is_true || consume_word("false")) {
      out->type = Type::Bool;
      out->boolean = is_true;
      return Status::Ok();
    }
    if (consume_word("null")) {
      out->type = Type::Null;
      return Status::Ok();
    }
    if (at_end()) return fail("unexpected end of input, expected a value");
    return fail("expected a value");
  }

  Status object(Value* out, int depth) {
    out->type = Type::Object;
    ++pos_;
    skip_space();
    if (peek() == '}') {
      ++pos_;
      return Status::Ok();
    }
    while (true) {
      skip_space();
      if (peek() != '"') return fail("expected a quoted key");
      std::string key;
      WEFT_RETURN_IF_ERROR(string(&key));
      if (out->find(key) != nullptr) return fail(("duplicate key " + quote(key)).c_str());
      skip_space();
      if (peek() != ':') return fail("expected ':' after a key");
      ++pos_;
      skip_space();
      out->members.push_back({std::move(key), Value{}});
      WEFT_RETURN_IF_ERROR(value(&out->members.back().value, depth + 1));
      skip_space();
      if (peek() == ',') {
        ++pos_;
        continue;
      }
      if (peek() == '}') {
        ++pos_;
        return Status::Ok();
      }
      return fail("expected ',' or '}' in an object");
    }
  }

  Status array(Value* out, int depth) {
    out->type = Type::Array;
    ++pos_;
    skip_space();
    if (peek() == ']') {
      ++pos_;
      return Status::Ok();
    }
    while (true) {
      skip_space();
      out->items.emplace_back();
      WEFT_RETURN_IF_ERROR(value(&out->items.back(), depth + 1));
      skip_space();
      if (peek() == ',') {
        ++pos_;
        continue;
      }
      if (peek() == ']') {
        ++pos_;
        return Status::Ok();
      }
      return fail("expected ',' or ']' in an array");
    }
  }

  Status number(Value* out) {
    out->type = Type::Number;
    size_t start = pos_;
    auto digits = [&] {
      size_t first = pos_;
      while (!at_end() && text_[pos_] >= '0' && text_[pos_] <= '9') ++pos_;
      return pos_ > first;
    };
    if (peek() == '-') ++pos_;
    if (peek() == '0') {
      ++pos_;
    } else if (!digits()) {
      return fail("malformed number");
    }
    if (peek() == '.') {
      ++pos_;
      if (!digits()) return fail("malformed number: digits must follow '.'");
    }
    if (peek() == 'e' || peek() == 'E') {
      ++pos_;
      if (peek() == '+' || peek() == '-') ++pos_;
      if (!digits()) return fail("malformed number: digits must follow the exponent");
    }
    if (!at_end() && (text_[pos_] >= '0' && text_[pos_] <= '9'))
      return fail("malformed number: leading zero");
    out->text.assign(text_.substr(start, pos_ - start));
    return Status::Ok();
  }

  // Four hex digits after "\u".
  bool hex4(uint32_t* out) {
    if (pos_ + 4 > text_.size()) return false;
    uint32_t value = 0;
    for (int i = 0; i < 4; ++i) {
      char c = text_[pos_++];
      value <<= 4;
      if (c >= '0' && c <= '9')
        value |= static_cast<uint32_t>(c - '0');
      else if (c >= 'a' && c <= 'f')
        value |= static_cast<uint32_t>(c - 'a' + 10);
      else if (c >= 'A' && c <= 'F')
        value |= static_cast<uint32_t>(c - 'A' + 10);
      else
        return false;
    }
    *out = value;
    return true;
  }

  static void append_utf8(uint32_t code, std::string* out) {
    if (code < 0x80) {
      out->push_back(static_cast<char>(code));
    } else if (code < 0x800) {
      out->push_back(static_cast<char>(0xC0 | (code >> 6)));
      out->push_back(static_cast<char>(0x80 | (code & 0x3F)));
    } else if (code < 0x10000) {
      out->push_back(static_cast<char>(0xE0 | (code >> 12)));
      out->push_back(static_cast<char>(0x80 | ((code >> 6) & 0x3F)));
      out->push_back(static_cast<char>(0x80 | (code & 0x3F)));
    } else {
      out->push_back(static_cast<char>(0xF0 | (code >> 18)));
      out->push_back(static_cast<char>(0x80 | ((code >> 12) & 0x3F)));
      out->push_back(static_cast<char>(0x80 | ((code >> 6) & 0x3F)));
      out->push_back(static_cast<char>(0x80 | (code & 0x3F)));
    }
  }

  Status string(std::string* out) {
    ++pos_;  // the opening quote
    out->clear();
    while (true) {
      if (at_end()) return fail("unterminated string");
      char c = text_[pos_];
      if (c == '"') {
        ++pos_;
        return Status::Ok();
      }
      if (static_cast<unsigned char>(c) < 0x20) return fail("control character in a string");
      ++pos_;
      if (c != '\\') {
        out->push_back(c);
        continue;
      }
      char escape = peek();
      ++pos_;
      switch (escape) {
        case '"':
          out->push_back('"');
          break;
        case '\\':
          out->push_back('\\');
          break;
        case '/':
          out->push_back('/');
          break;
        case 'b':
          out->push_back('\b');
          break;
        case 'f':
          out->push_back('\f');
          break;
        case 'n':
          out->push_back('\n');
          break;
        case 'r':
          out->push_back('\r');
          break;
        case 't':
          out->push_back('\t');
          break;
        case 'u': {
          uint32_t code = 0;
          if (!hex4(&code)) return fail("malformed \\u escape");
          if (code >= 0xD800 && code < 0xDC00) {
            uint32_t low = 0;
            if (!consume_word("\\u") || !hex4(&low) || low < 0xDC00 || low >= 0xE000)
              return fail("unpaired surrogate in a \\u escape");
            code = 0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00);
          } else if (code >= 0xDC00 && code < 0xE000) {
            return fail("unpaired surrogate in a \\u escape");
          }
          append_utf8(code, out);
          break;
        }
        default:
          return fail("unknown escape in a string");
      }
    }
  }

  std::string_view text_;
  size_t pos_ = 0;
  int line_ = 1;
  size_t line_start_ = 0;
};

}  // namespace

const Value* Value::find(std::string_view key) const {
  for (const auto& [name, value] : members)
    if (name == key) return &value;
  return nullptr;
}

const char* type_name(Type type) {
  switch (type) {
    case Type::Null:
      return "null";
    case Type::Bool:
      return "a boolean";
    case Type::Number:
      return "a number";
    case Type::String:
      return "a string";
    case Type::Array:
      return "an array";
    case Type::Object:
      return "an object";
  }
  return "?";
}

Status parse(std::string_view text, Value* out) {
  if (text.size() > kMaxInputBytes)
    return Error(weftInvalidArgument, "document is larger than %zu bytes", kMaxInputBytes);
  *out = Value{};
  return Parser(text).document(out);
}

std::string quote(std::string_view text) {
  std::string out = "\"";
  for (char c : text) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\r':
        out += "\\r";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buffer[8];
          snprintf(buffer, sizeof(buffer), "\\u%04x", static_cast<unsigned char>(c));
          out += buffer;
        } else {
          out.push_back(c);
        }
    }
  }
  out += "\"";
  return out;
}

}  // namespace weft::topo::json
