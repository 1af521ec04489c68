/*
 * Exact fp16 / bf16 <-> fp32 conversions (round to nearest even, NaN and
 * Inf preserved, subnormals handled), portable C with no intrinsics. Used
 * by the CPU runner's scalar path, tests, the client CLI and benchmarks.
 */
#ifndef LNORM_HALF_H
#define LNORM_HALF_H

#include <stdint.h>
#include <string.h>

static inline uint32_t lnorm__f2u(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static inline float lnorm__u2f(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* bf16 -> f32: exact. */
static inline float lnorm_bf16_to_f32(uint16_t h)
{
    return lnorm__u2f((uint32_t)h << 16);
}

/* f32 -> bf16: round to nearest even; NaN stays NaN (quiet). */
static inline uint16_t lnorm_f32_to_bf16(float f)
{
    uint32_t u = lnorm__f2u(f);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x0040u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* f16 -> f32: exact, subnormals included. */
static inline float lnorm_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;
    if (exp == 0x1f)
        return lnorm__u2f(sign | 0x7f800000u | (man << 13));
    if (exp == 0) {
        /* zero or subnormal: man * 2^-24, exact in f32 */
        float v = (float)man * 5.9604644775390625e-8f;
        return sign ? -v : v;
    }
    return lnorm__u2f(sign | ((exp + 112u) << 23) | (man << 13));
}

/* f32 -> f16: round to nearest even, overflow to Inf, subnormals, NaN kept. */
static inline uint16_t lnorm_f32_to_f16(float f)
{
    uint32_t u = lnorm__f2u(f);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t a = u & 0x7fffffffu;
    if (a >= 0x7f800000u)
        return (uint16_t)(sign | 0x7c00u | (a > 0x7f800000u ? 0x200u | ((a >> 13) & 0x3ffu) : 0));
    if (a >= 0x477ff000u) /* >= 65520 rounds to Inf */
        return (uint16_t)(sign | 0x7c00u);
    if (a < 0x38800000u) { /* below 2^-14: subnormal or zero */
        if (a < 0x33000000u) /* < 2^-25: rounds to 0 (ties at 2^-25 go to even 0) */
            return sign;
        uint32_t e = a >> 23;
        uint32_t m = (a & 0x7fffffu) | 0x800000u;
        uint32_t shift = 126u - e; /* 14..24 */
        uint32_t r = m >> shift;
        uint32_t rem = m & ((1u << shift) - 1u);
        uint32_t half = 1u << (shift - 1u);
        if (rem > half || (rem == half && (r & 1u)))
            r++;
        return (uint16_t)(sign | r);
    }
    uint32_t r = a - 0x38000000u; /* rebias exponent 127 -> 15 */
    r += 0xfffu + ((r >> 13) & 1u);
    return (uint16_t)(sign | (r >> 13));
}

#endif /* LNORM_HALF_H */
