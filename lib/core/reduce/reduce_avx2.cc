// AVX2 variant: 256-bit vectors; fp16 and fp8 through F16C.
#include <immintrin.h>

#define WEFT_REDUCE_TARGET "avx2,fma,f16c"
#include "core/reduce/kernels.h"

namespace weft::reduce {

namespace {
struct Avx2 {
  static constexpr int kBytes = 32;
  using U16 = Vec<uint16_t, 8>;
  using U32 = Vec<uint32_t, 8>;
  using F32 = Vec<float, 8>;

  static U16 widen(const uint8_t* p) {
    return bitcast<U16>(_mm_cvtepu8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
  }
  static U32 widen(const uint16_t* p) {
    return bitcast<U32>(
        _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
  }
  // GCC's generic narrowing goes element by element here.
  static void narrow(uint8_t* p, U16 v) {
    __m128i x = bitcast<__m128i>(v);
    _mm_storel_epi64(reinterpret_cast<__m128i*>(p), _mm_packus_epi16(x, x));
  }
  static void narrow(uint16_t* p, U32 v) {
    __m256i x = bitcast<__m256i>(v);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p),
                     _mm_packus_epi32(_mm256_castsi256_si128(x), _mm256_extracti128_si256(x, 1)));
  }
  static F32 fp16_to_float(U16 h) { return bitcast<F32>(_mm256_cvtph_ps(bitcast<__m128i>(h))); }
  static U16 float_to_fp16(F32 f) {
    return bitcast<U16>(_mm256_cvtps_ph(bitcast<__m256>(f), _MM_FROUND_TO_NEAREST_INT));
  }
  static U16 float_to_fp16_odd(F32 f) {
    __m256 x = bitcast<__m256>(f);
    __m128i h = _mm256_cvtps_ph(x, _MM_FROUND_TO_ZERO);
    __m256i inexact = _mm256_castps_si256(_mm256_cmp_ps(_mm256_cvtph_ps(h), x, _CMP_NEQ_UQ));
    __m128i inexact16 =
        _mm_packs_epi32(_mm256_castsi256_si128(inexact), _mm256_extracti128_si256(inexact, 1));
    return bitcast<U16>(_mm_or_si128(h, _mm_srli_epi16(inexact16, 15)));
  }
};
}  // namespace

constinit const KernelTable kAvx2Kernels = Kernels<Avx2>::table();

}  // namespace weft::reduce

WEFT_REDUCE_TARGET_END
