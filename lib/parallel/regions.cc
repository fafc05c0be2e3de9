// Tensor and sequence parallel region operations and the collectives along
// any dimension under them (pack -> collective on dim 0 -> unpack; uneven
// splits by AllToAllv or a padded ReduceScatter).
#include <algorithm>
#include <cstring>

#include "parallel/internal.h"

namespace weft::parallel {

namespace {

using detail::require;

std::string shape_text(const Tensor& t) {
  std::string text = "[";
  for (size_t i = 0; i < t.shape.size(); ++i) text += (i ? ", " : "") + std::to_string(t.shape[i]);
  return text + "]";
}

void require_same(const Tensor& in, const Tensor& out) {
  require(in.dtype == out.dtype, "in and out have different dtypes");
  require(in.numel() == out.numel(),
          "out " + shape_text(out) + " does not hold in " + shape_text(in));
}

// out = in unless they are the same memory.
void identity(const Tensor& in, const Tensor& out) {
  require_same(in, out);
  if (in.data != out.data && in.bytes() > 0) memmove(out.data, in.data, in.bytes());
}

// Checks that `part` is rank's piece of `whole` along dim and returns every
// rank's extent there.
std::vector<size_t> piece_sizes(const Axis& axis, const Tensor& whole, const Tensor& part, int dim,
                                std::span<const size_t> sizes) {
  require(whole.dtype == part.dtype, "in and out have different dtypes");
  require(whole.rank() == part.rank(),
          "in " + shape_text(whole) + " and out " + shape_text(part) + " differ in rank");
  size_t extent = whole.extent(dim);
  int d = dim < 0 ? dim + whole.rank() : dim;
  for (int i = 0; i < whole.rank(); ++i)
    require(i == d || whole.shape[i] == part.shape[i],
            "in " + shape_text(whole) + " and out " + shape_text(part) + " differ outside dim " +
                std::to_string(dim));
  std::vector<size_t> result = sizes.empty() ? split_sizes(extent, axis.size())
                                             : std::vector<size_t>(sizes.begin(), sizes.end());
  require(result.size() == static_cast<size_t>(axis.size()),
          "sizes has " + std::to_string(result.size()) + " entries for an axis of " +
              std::to_string(axis.size()) + " ranks");
  size_t sum = 0;
  for (size_t size : result) sum += size;
  require(sum == extent, "sizes sum to " + std::to_string(sum) + ", not to the extent " +
                             std::to_string(extent) + " of dim " + std::to_string(dim));
  require(part.extent(dim) == result[axis.rank()],
          "the piece of rank " + std::to_string(axis.rank()) + " along dim " + std::to_string(dim) +
              " has extent " + std::to_string(part.extent(dim)) + ", expected " +
              std::to_string(result[axis.rank()]));
  return result;
}

// True when the pieces along dim are already contiguous blocks in rank order.
bool outermost(const Tensor& t, int dim) {
  int d = dim < 0 ? dim + t.rank() : dim;
  for (int i = 0; i < d; ++i)
    if (t.shape[i] != 1) return false;
  return true;
}

// Scratch reused across calls of this thread (slot 0 or 1): a fresh
// allocation per call would fault its pages in every time.
char* scratch(size_t bytes, int slot) {
  thread_local std::vector<char> buffers[2];
  std::vector<char>& buffer = buffers[slot];
  if (buffer.size() < bytes) buffer.resize(bytes);
  return buffer.data();
}

size_t offset_of(const std::vector<size_t>& sizes, int rank) {
  size_t offset = 0;
  for (int r = 0; r < rank; ++r) offset += sizes[r];
  return offset;
}

}  // namespace

void slice_dim(const Axis& axis, const Tensor& in, const Tensor& out, int dim,
               std::span<const size_t> sizes) {
  std::vector<size_t> pieces = piece_sizes(axis, in, out, dim, sizes);
  detail::copy_slab(in, dim, offset_of(pieces, axis.rank()), out);
}

void all_gather_dim(const Axis& axis, const Tensor& in, const Tensor& out, int dim,
                    std::span<const size_t> sizes, std::string_view pattern) {
  std::vector<size_t> pieces = piece_sizes(axis, out, in, dim, sizes);
  int n = axis.size();
  if (n == 1) return identity(in, out);
  size_t row = out.numel() / std::max<size_t>(out.extent(dim), 1);  // elements per unit of dim
  bool even = std::all_of(pieces.begin(), pieces.end(), [&](size_t p) { return p == pieces[0]; });
  bool direct = outermost(out, dim);
  char* staging = direct ? nullptr : scratch(out.bytes(), 0);
  void* target = direct ? out.data : staging;
  size_t esize = dtype_bytes(in.dtype);
  if (even) {
    detail::blocking(axis, pattern, "allgather", out.bytes(), [&](weftComm_t c, weftStream_t s) {
      return weftAllGather(in.data, target, in.numel(), in.dtype, c, s);
    });
  } else {
    // AllGatherv as AllToAllv: this rank's block goes to every rank.
    std::vector<size_t> send_counts(n, in.numel()), send_offsets(n, 0), recv_counts(n),
        recv_offsets(n);
    for (int r = 0; r < n; ++r) {
      recv_counts[r] = pieces[r] * row;
      recv_offsets[r] = offset_of(pieces, r) * row;
    }
    detail::blocking(
        axis, pattern, "alltoallv", out.bytes(),
        [&](weftComm_t c, weftStream_t s) {
          return weftAllToAllv(in.data, send_counts.data(), send_offsets.data(), target,
                               recv_counts.data(), recv_offsets.data(), in.dtype, c, s);
        },
        in.numel() * esize * (n - 1));
  }
  if (!direct) unpack(staging, dim, pieces, out);
}

void reduce_scatter_dim(const Axis& axis, const Tensor& in, const Tensor& out, int dim,
                        std::span<const size_t> sizes, std::string_view pattern) {
  std::vector<size_t> pieces = piece_sizes(axis, in, out, dim, sizes);
  int n = axis.size();
  if (n == 1) return identity(in, out);
  size_t row = in.numel() / std::max<size_t>(in.extent(dim), 1);
  size_t widest = *std::max_element(pieces.begin(), pieces.end());
  bool even = widest == *std::min_element(pieces.begin(), pieces.end());
  size_t esize = dtype_bytes(in.dtype);
  size_t block = widest * row;  // elements per rank in the collective
  if (even && outermost(in, dim)) {
    detail::blocking(axis, pattern, "reducescatter", in.bytes(), [&](weftComm_t c, weftStream_t s) {
      return weftReduceScatter(in.data, out.data, block, in.dtype, weftSum, c, s);
    });
    return;
  }
  // Blocks in rank order, each padded with zeros to the widest: exact for sums.
  char* packed = scratch(in.bytes(), 0);
  pack(in, dim, pieces, packed);
  const char* send = packed;
  std::vector<char> padded, mine;
  if (!even) {
    padded.assign(n * block * esize, 0);
    size_t from = 0;
    for (int r = 0; r < n; ++r) {
      size_t bytes = pieces[r] * row * esize;
      memcpy(padded.data() + r * block * esize, packed + from, bytes);
      from += bytes;
    }
    send = padded.data();
    mine.resize(block * esize);
  }
  void* target = even ? out.data : mine.data();
  detail::blocking(axis, pattern, "reducescatter", n * block * esize,
                   [&](weftComm_t c, weftStream_t s) {
                     return weftReduceScatter(send, target, block, in.dtype, weftSum, c, s);
                   });
  if (!even && out.bytes() > 0) memcpy(out.data, mine.data(), out.bytes());
}

void all_reduce(const Axis& axis, const Tensor& tensor, std::string_view pattern, weftRedOp_t op) {
  if (axis.size() == 1) return;
  detail::blocking(axis, pattern, "allreduce", tensor.bytes(), [&](weftComm_t c, weftStream_t s) {
    return weftAllReduce(tensor.data, tensor.data, tensor.numel(), tensor.dtype, op, c, s);
  });
}

namespace {

void all_reduce_into(const Axis& axis, const Tensor& in, const Tensor& out,
                     std::string_view pattern) {
  require_same(in, out);
  if (axis.size() == 1) return identity(in, out);
  detail::blocking(axis, pattern, "allreduce", in.bytes(), [&](weftComm_t c, weftStream_t s) {
    return weftAllReduce(in.data, out.data, in.numel(), in.dtype, weftSum, c, s);
  });
}

}  // namespace

void copy_to_tp(const Axis& axis, Pass pass, const Tensor& in, const Tensor& out) {
  if (pass == Pass::forward) return identity(in, out);
  all_reduce_into(axis, in, out, "tp.copy_to");
}

void reduce_from_tp(const Axis& axis, Pass pass, const Tensor& in, const Tensor& out) {
  if (pass == Pass::backward) return identity(in, out);
  all_reduce_into(axis, in, out, "tp.reduce_from");
}

void scatter_to_tp(const Axis& axis, Pass pass, const Tensor& in, const Tensor& out, int dim,
                   std::span<const size_t> sizes) {
  if (pass == Pass::forward) return slice_dim(axis, in, out, dim, sizes);
  all_gather_dim(axis, in, out, dim, sizes, "tp.scatter_to");
}

void gather_from_tp(const Axis& axis, Pass pass, const Tensor& in, const Tensor& out, int dim,
                    std::span<const size_t> sizes) {
  if (pass == Pass::forward) return all_gather_dim(axis, in, out, dim, sizes, "tp.gather_from");
  slice_dim(axis, in, out, dim, sizes);
}

void scatter_to_sp(const Axis& axis, Pass pass, const Tensor& in, const Tensor& out, int dim,
                   std::span<const size_t> sizes) {
  if (pass == Pass::forward) return slice_dim(axis, in, out, dim, sizes);
  all_gather_dim(axis, in, out, dim, sizes, "sp.scatter_to");
}

void gather_from_sp(const Axis& axis, Pass pass, const Tensor& in, const Tensor& out, int dim,
                    std::span<const size_t> sizes) {
  if (pass == Pass::forward) return all_gather_dim(axis, in, out, dim, sizes, "sp.gather_from");
  reduce_scatter_dim(axis, in, out, dim, sizes, "sp.gather_from");
}

void reduce_scatter_to_sp(const Axis& axis, Pass pass, const Tensor& in, const Tensor& out, int dim,
                          std::span<const size_t> sizes) {
  if (pass == Pass::forward)
    return reduce_scatter_dim(axis, in, out, dim, sizes, "sp.reduce_scatter_to");
  all_gather_dim(axis, in, out, dim, sizes, "sp.reduce_scatter_to");
}

}  // namespace weft::parallel
