// The parameter block of one n-ary reduction kernel launch, and how its count splits into
// element-wise head and tail and 16-byte packs: plain C++, shared by the launcher (host code
// without CUDA headers), the kernels and the functors' host tests.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/host_device.h"
#include "core/reduce/reduce.h"

namespace weft::cuda {

using reduce::Op;

// One n-ary reduction: out[i] = op over in[0..n)[i], folded left and rounded
// to the type after every step (the host's pairwise apply() in a chain).
// PreMulSum: each input is first multiplied by the scalar (rounded, as the
// host's scale() stages it), then summed. Avg: the fold, then divided by
// `divisor` (0: no division).
inline constexpr int kMaxInputs = 8;
struct ReduceParams {
  const void* in[kMaxInputs];
  void* out;
  uint64_t count;             // elements
  uint64_t head;              // elements reduced one by one before the 16-byte packs
  uint64_t packs;             // 16-byte packs after the head; the rest is the tail
  uint64_t divisor;           // Avg: the number of ranks; 0 otherwise
  const void* scalar_source;  // PreMulSum with a device scalar: read here
  uint8_t scalar[8];          // PreMulSum with a host scalar: its bytes
  int32_t n;
  Op op;
  bool premul;
};

// Work items: each pack is one, each head or tail element one.
WEFT_HOST_DEVICE inline uint64_t work_items(const ReduceParams& p, size_t element_size) {
  return p.count - p.packs * (16 / element_size) + p.packs;
}

// Splits p.count into head, packs and tail: the packs need every pointer
// 16-byte aligned at the same element, so pointers that disagree modulo 16
// bytes reduce element by element. Pointers must be element-aligned.
inline void plan_packs(ReduceParams& p, size_t element_size) {
  uintptr_t offset = reinterpret_cast<uintptr_t>(p.out) % 16;
  bool together = true;
  for (int k = 0; k < p.n; ++k) together &= reinterpret_cast<uintptr_t>(p.in[k]) % 16 == offset;
  uint64_t head = together ? (16 - offset) % 16 / element_size : p.count;
  p.head = head < p.count ? head : p.count;
  p.packs = together ? (p.count - p.head) / (16 / element_size) : 0;
}

}  // namespace weft::cuda
