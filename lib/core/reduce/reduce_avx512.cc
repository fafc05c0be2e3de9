// AVX-512 variant (F, BW, DQ, VL): 512-bit vectors; fp16 and fp8 through the
// AVX-512F fp16 conversions.
// GCC 12 warns about the _mm512_undefined_*() inside its own intrinsics
// (GCC bug 105593, fixed in 13).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

#define WEFT_REDUCE_TARGET "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c"
#include "core/reduce/kernels.h"

namespace weft::reduce {

namespace {
struct Avx512 {
  static constexpr int kBytes = 64;
  using U16 = Vec<uint16_t, 16>;
  using U32 = Vec<uint32_t, 16>;
  using F32 = Vec<float, 16>;

  static U16 widen(const uint8_t* p) {
    return bitcast<U16>(_mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
  }
  static U32 widen(const uint16_t* p) {
    return bitcast<U32>(
        _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))));
  }
  static void narrow(uint8_t* p, U16 v) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_cvtepi16_epi8(bitcast<__m256i>(v)));
  }
  static void narrow(uint16_t* p, U32 v) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtepi32_epi16(bitcast<__m512i>(v)));
  }
  static F32 fp16_to_float(U16 h) { return bitcast<F32>(_mm512_cvtph_ps(bitcast<__m256i>(h))); }
  static U16 float_to_fp16(F32 f) {
    return bitcast<U16>(_mm512_cvtps_ph(bitcast<__m512>(f), _MM_FROUND_TO_NEAREST_INT));
  }
  static U16 float_to_fp16_odd(F32 f) {
    __m512 x = bitcast<__m512>(f);
    __m256i h = _mm512_cvtps_ph(x, _MM_FROUND_TO_ZERO);
    __mmask16 inexact = _mm512_cmp_ps_mask(_mm512_cvtph_ps(h), x, _CMP_NEQ_UQ);
    return bitcast<U16>(
        _mm256_mask_mov_epi16(h, inexact, _mm256_or_si256(h, _mm256_set1_epi16(1))));
  }
};
}  // namespace

constinit const KernelTable kAvx512Kernels = Kernels<Avx512>::table();

}  // namespace weft::reduce

WEFT_REDUCE_TARGET_END
