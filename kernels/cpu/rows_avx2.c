/* The AVX2 + FMA + F16C row kernel (compiled with -mavx2 -mfma -mf16c). */
#include <immintrin.h>
#include <stdint.h>

#define V __m256
#define W 8
#define VZERO() _mm256_setzero_ps()
#define VSET1(f) _mm256_set1_ps(f)
#define VADD(a, b) _mm256_add_ps(a, b)
#define VSUB(a, b) _mm256_sub_ps(a, b)
#define VMUL(a, b) _mm256_mul_ps(a, b)
#define VFMA(a, b, c) _mm256_fmadd_ps(a, b, c)
#define VLD_F32(p) _mm256_loadu_ps(p)
#define VLD_F16(p) _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(p)))
#define VLD_BF16(p) \
    _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(const void *)(p))), 16))
#define VST_F32(p, v) _mm256_storeu_ps(p, v)
#define VST_F16(p, v) _mm_storeu_si128((__m128i *)(void *)(p), _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC))
#define VST_BF16(p, v) _mm_storeu_si128((__m128i *)(void *)(p), avx2_to_bf16(v))
#define VNT_F32(p, v) _mm256_stream_ps(p, v)
#define VNT_F16(p, v) _mm_stream_si128((__m128i *)(void *)(p), _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC))
#define VNT_BF16(p, v) _mm_stream_si128((__m128i *)(void *)(p), avx2_to_bf16(v))
#define VNT_ALIGN 32
#define VKEEP(v, n) _mm256_and_ps(v, _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32((int)(n)), \
                                                                            _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7))))
#define VHSUM(v) avx2_hsum(v)
#define ROWS_FN lnorm__cpu_rows_avx2

/* Lanes 4..7 onto 0..3, 2..3 onto 0..1, then lane 1 onto 0. */
static inline float avx2_hsum(__m256 v)
{
    __m128 b = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    __m128 c = _mm_add_ps(b, _mm_movehl_ps(b, b));
    return _mm_cvtss_f32(_mm_add_ss(c, _mm_shuffle_ps(c, c, 1)));
}

/* 8 floats to 8 bf16, round to nearest even, NaN kept (quiet). */
static inline __m128i avx2_to_bf16(__m256 v)
{
    __m256i u = _mm256_castps_si256(v);
    __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    __m256i r = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)), lsb), 16);
    __m256i qnan = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40));
    __m256i isnan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    r = _mm256_blendv_epi8(r, qnan, isnan);
    __m256i packed = _mm256_packus_epi32(r, r); /* per 128-bit lane: r0..3 r0..3 | r4..7 r4..7 */
    return _mm256_castsi256_si128(_mm256_permute4x64_epi64(packed, 0x08));
}

#include "rows_simd.h"
