// Minimal little-endian serialisation for bootstrap payloads and transport addresses. The
// reader never trusts lengths: every read checks the bytes left.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

namespace weft {

class WireWriter {
 public:
  template <typename T>
  void put(const T& value) {
    static_assert(std::is_trivially_copyable_v<T>);
    append(&value, sizeof(T));
  }
  void put_bytes(const void* bytes, size_t size) {
    put<uint32_t>(static_cast<uint32_t>(size));
    append(bytes, size);
  }
  void put_blob(const std::vector<uint8_t>& blob) { put_bytes(blob.data(), blob.size()); }
  void put_string(const std::string& text) { put_bytes(text.data(), text.size()); }
  std::vector<uint8_t>& data() { return data_; }

 private:
  void append(const void* bytes, size_t size) {
    if (size == 0) return;
    size_t old = data_.size();
    data_.resize(old + size);
    memcpy(data_.data() + old, bytes, size);
  }
  std::vector<uint8_t> data_;
};

class WireReader {
 public:
  WireReader(const uint8_t* data, size_t size) : data_(data), left_(size) {}
  explicit WireReader(const std::vector<uint8_t>& data) : WireReader(data.data(), data.size()) {}

  template <typename T>
  bool get(T* value) {
    static_assert(std::is_trivially_copyable_v<T>);
    if (left_ < sizeof(T)) return false;
    memcpy(value, data_, sizeof(T));
    advance(sizeof(T));
    return true;
  }
  bool get_blob(std::vector<uint8_t>* blob) {
    uint32_t size = 0;
    if (!get(&size) || left_ < size) return false;
    blob->assign(data_, data_ + size);
    advance(size);
    return true;
  }
  bool get_string(std::string* text) {
    uint32_t size = 0;
    if (!get(&size) || left_ < size) return false;
    text->assign(reinterpret_cast<const char*>(data_), size);
    advance(size);
    return true;
  }
  size_t left() const { return left_; }

 private:
  void advance(size_t size) {
    data_ += size;
    left_ -= size;
  }
  const uint8_t* data_;
  size_t left_;
};

}  // namespace weft
