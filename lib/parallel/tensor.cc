// Tensor views, uneven split sizes, and pack/unpack along any dimension.
#include <cstring>

#include "parallel/internal.h"

namespace weft::parallel {

size_t dtype_bytes(weftDataType_t dtype) {
  size_t size = 0;
  check(weftDataTypeSize(dtype, &size));
  return size;
}

size_t Tensor::numel() const {
  size_t n = 1;
  for (size_t extent : shape) n *= extent;
  return n;
}

size_t Tensor::extent(int dim) const {
  int r = rank();
  detail::require(dim >= -r && dim < r, "dim " + std::to_string(dim) + " is out of range for a " +
                                            std::to_string(r) + "-dimensional tensor");
  return shape[static_cast<size_t>(dim < 0 ? dim + r : dim)];
}

std::vector<size_t> split_sizes(size_t total, int parts) {
  detail::require(parts > 0, "parts " + std::to_string(parts) + " must be positive");
  auto n = static_cast<size_t>(parts);
  std::vector<size_t> sizes(n, total / n);
  for (size_t p = 0; p < total % n; ++p) ++sizes[p];
  return sizes;
}

namespace {

// The tensor as [outer, extent(dim), inner] in bytes of inner rows.
struct Slabs {
  size_t outer = 1;
  size_t extent = 0;
  size_t inner_bytes = 0;
};

Slabs slabs_of(const Tensor& t, int dim, std::span<const size_t> sizes) {
  size_t extent = t.extent(dim);
  size_t d = static_cast<size_t>(dim < 0 ? dim + t.rank() : dim);
  Slabs s;
  s.extent = extent;
  s.inner_bytes = dtype_bytes(t.dtype);
  for (size_t i = 0; i < d; ++i) s.outer *= t.shape[i];
  for (size_t i = d + 1; i < t.shape.size(); ++i) s.inner_bytes *= t.shape[i];
  size_t sum = 0;
  for (size_t size : sizes) sum += size;
  detail::require(sum == extent, "sizes sum to " + std::to_string(sum) + ", not to extent " +
                                     std::to_string(extent) + " of dim " + std::to_string(dim));
  return s;
}

// Moves every part's slab between the strided tensor and contiguous blocks.
template <bool kPack>
void move_slabs(const Tensor& t, int dim, std::span<const size_t> sizes, char* blocks) {
  Slabs s = slabs_of(t, dim, sizes);
  auto* base = static_cast<char*>(t.data);
  size_t offset = 0;  // along dim
  for (size_t size : sizes) {
    size_t run = size * s.inner_bytes;
    for (size_t o = 0; o < s.outer; ++o) {
      char* strided = base + (o * s.extent + offset) * s.inner_bytes;
      if (run == 0) continue;
      if constexpr (kPack)
        memcpy(blocks, strided, run);
      else
        memcpy(strided, blocks, run);
      blocks += run;
    }
    offset += size;
  }
}

}  // namespace

void pack(const Tensor& in, int dim, std::span<const size_t> sizes, void* out) {
  move_slabs<true>(in, dim, sizes, static_cast<char*>(out));
}

void unpack(const void* in, int dim, std::span<const size_t> sizes, const Tensor& out) {
  move_slabs<false>(out, dim, sizes, const_cast<char*>(static_cast<const char*>(in)));
}

namespace detail {

void copy_slab(const Tensor& in, int dim, size_t offset, const Tensor& out) {
  size_t size = out.extent(dim);
  require(offset + size <= in.extent(dim), "slab [" + std::to_string(offset) + ", " +
                                               std::to_string(offset + size) +
                                               ") is out of range of dim " + std::to_string(dim));
  std::vector<size_t> sizes = {offset, size, in.extent(dim) - offset - size};
  Slabs s = slabs_of(in, dim, sizes);
  const auto* base = static_cast<const char*>(in.data);
  auto* target = static_cast<char*>(out.data);
  size_t run = size * s.inner_bytes;
  if (run == 0) return;
  for (size_t o = 0; o < s.outer; ++o)
    memcpy(target + o * run, base + (o * s.extent + offset) * s.inner_bytes, run);
}

}  // namespace detail

}  // namespace weft::parallel
