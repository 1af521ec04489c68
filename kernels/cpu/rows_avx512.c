/* The AVX-512 (F/BW/VL) row kernel (compiled with -mavx512f -mavx512bw -mavx512vl -mfma -mf16c). */
#include <immintrin.h>
#include <stdint.h>

#define V __m512
#define W 16
#define VZERO() _mm512_setzero_ps()
#define VSET1(f) _mm512_set1_ps(f)
#define VADD(a, b) _mm512_add_ps(a, b)
#define VSUB(a, b) _mm512_sub_ps(a, b)
#define VMUL(a, b) _mm512_mul_ps(a, b)
#define VFMA(a, b, c) _mm512_fmadd_ps(a, b, c)
#define VLD_F32(p) _mm512_loadu_ps(p)
#define VLD_F16(p) _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(const void *)(p)))
#define VLD_BF16(p) \
    _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(const void *)(p))), 16))
#define VST_F32(p, v) _mm512_storeu_ps(p, v)
#define VST_F16(p, v) \
    _mm256_storeu_si256((__m256i *)(void *)(p), _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC))
#define VST_BF16(p, v) _mm256_storeu_si256((__m256i *)(void *)(p), avx512_to_bf16(v))
#define VNT_F32(p, v) _mm512_stream_ps(p, v)
#define VNT_F16(p, v) \
    _mm256_stream_si256((__m256i *)(void *)(p), _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC))
#define VNT_BF16(p, v) _mm256_stream_si256((__m256i *)(void *)(p), avx512_to_bf16(v))
#define VNT_ALIGN 64
#define VKEEP(v, n) _mm512_maskz_mov_ps((__mmask16)((1u << (n)) - 1u), v)
#define VHSUM(v) avx512_hsum(v)
#define ROWS_FN lnorm__cpu_rows_avx512

/* Lanes 8..15 onto 0..7, 4..7 onto 0..3, 2..3 onto 0..1, then lane 1 onto 0. */
static inline float avx512_hsum(__m512 v)
{
    __m256 a = _mm256_add_ps(_mm512_castps512_ps256(v),
                             _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
    __m128 b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    __m128 c = _mm_add_ps(b, _mm_movehl_ps(b, b));
    return _mm_cvtss_f32(_mm_add_ss(c, _mm_shuffle_ps(c, c, 1)));
}

/* 16 floats to 16 bf16, round to nearest even, NaN kept (quiet). */
static inline __m256i avx512_to_bf16(__m512 v)
{
    __m512i u = _mm512_castps_si512(v);
    __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    __m512i r = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), lsb), 16);
    __mmask16 isnan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    r = _mm512_mask_mov_epi32(r, isnan, _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40)));
    return _mm512_cvtepi32_epi16(r);
}

#include "rows_simd.h"
