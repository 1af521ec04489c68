/*
 * kernels.half: exact f16/bf16 conversions. (a) kernels/core/half.h: all
 * 65536 patterns of each type round-trip through f32; f16 -> f32 matches an
 * independent formula; f32 -> f16/bf16 rounds ties to even (every
 * midpoint between neighbours, and its f32 neighbours) and matches an
 * independent rounding on a million random f32 patterns. (b) each ISA path
 * of the CPU backend: residual_out = round(float(x) + float(r)) over every
 * f16/bf16 pattern of x, with r chosen to land on and beside ties.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "half.h"
#include "lnorm_core.h"
#include "testutil.h"


static float to_f32(uint16_t h, int dt)
{
    return dt == LNORM_DTYPE_F16 ? lnorm_f16_to_f32(h) : lnorm_bf16_to_f32(h);
}

static uint16_t from_f32(float f, int dt)
{
    return dt == LNORM_DTYPE_F16 ? lnorm_f32_to_f16(f) : lnorm_f32_to_bf16(f);
}

static int is_nan16(uint16_t h, int dt)
{
    return dt == LNORM_DTYPE_F16 ? (h & 0x7c00) == 0x7c00 && (h & 0x3ff) : (h & 0x7f80) == 0x7f80 && (h & 0x7f);
}

static void header_tests(int dt)
{
    const char *n = lnorm_dtype_name(dt);
    for (uint32_t b = 0; b < 65536; b++) {
        uint16_t h = (uint16_t)b;
        float f = to_f32(h, dt);
        if (is_nan16(h, dt)) {
            CHECK(isnan(f), "%s %04x -> not NaN", n, b);
            uint16_t back = from_f32(f, dt);
            CHECK(is_nan16(back, dt) && (back & 0x8000) == (h & 0x8000), "%s NaN %04x -> %04x", n, b, back);
            continue;
        }
        CHECK(from_f32(f, dt) == h, "%s %04x -> %a -> %04x", n, b, f, from_f32(f, dt));
        if (dt == LNORM_DTYPE_F16) {
            int e = (b >> 10) & 31, m = b & 1023;
            double v = e == 31 ? (m ? NAN : INFINITY) : e == 0 ? ldexp(m, -24) : ldexp(1024 + m, e - 25);
            if (b & 0x8000)
                v = -v;
            CHECK(f == v, "f16 %04x -> %a, want %a", b, f, v);
        }
        /* Ties between h and its upper neighbour (positive finite h only). */
        if (!(b & 0x8000) && isfinite(f)) {
            float up = to_f32((uint16_t)(h + 1), dt);
            if (!isfinite(up))
                continue;
            float mid = (float)(((double)f + (double)up) / 2); /* exact in f32 */
            uint16_t even = (h & 1) ? (uint16_t)(h + 1) : h;
            CHECK(from_f32(mid, dt) == even, "%s tie %a -> %04x, want %04x", n, mid, from_f32(mid, dt), even);
            CHECK(from_f32(-mid, dt) == (even | 0x8000), "%s tie -%a", n, mid);
            CHECK(from_f32(nextafterf(mid, 0.0f), dt) == h, "%s below tie %a", n, mid);
            CHECK(from_f32(nextafterf(mid, INFINITY), dt) == h + 1, "%s above tie %a", n, mid);
        }
    }
    /* Random f32 patterns against the independent double rounding. */
    lnorm_rng g;
    lnorm_rng_seed(&g, 7 + (uint64_t)dt);
    for (int i = 0; i < 1000000; i++) {
        float f = lnorm__u2f((uint32_t)lnorm_rng_next(&g));
        uint16_t got = from_f32(f, dt);
        if (isnan(f)) {
            CHECK(is_nan16(got, dt), "%s NaN %a", n, f);
            continue;
        }
        double want = lnorm_test_round((double)f, dt);
        double gv = to_f32(got, dt);
        CHECK(gv == want && signbit(gv) == signbit(want), "%s round %a -> %a, want %a", n, f, gv, want);
    }
    /* Overflow and underflow edges. */
    if (dt == LNORM_DTYPE_F16) {
        CHECK(lnorm_f32_to_f16(65519.99f) == 0x7bff, "65519.99");
        CHECK(lnorm_f32_to_f16(65520.0f) == 0x7c00, "65520 -> inf");
        CHECK(lnorm_f32_to_f16(0x1p-25f) == 0x0000, "2^-25 tie -> 0");
        CHECK(lnorm_f32_to_f16(nextafterf(0x1p-25f, 1.0f)) == 0x0001, "above 2^-25 -> min subnormal");
        CHECK(lnorm_f32_to_f16(0x3p-25f) == 0x0002, "1.5 * 2^-24 tie -> even 2");
    } else {
        CHECK(lnorm_f32_to_bf16(0x1.fffffep127f) == 0x7f80, "max f32 -> bf16 inf");
        CHECK(lnorm_f32_to_bf16(-INFINITY) == 0xff80, "-inf");
    }
}

/* residual_out through each ISA: x = every pattern, r = 0, then half an
 * ulp of x (a tie), then half an ulp plus a bit, then minus a bit. */
static void backend_tests(lnorm_cpu *cpu, int dt)
{
    const int64_t H = 65536, R = 4;
    uint16_t *x = malloc(H * R * 2), *r = malloc(H * R * 2), *ro = malloc(H * R * 2);
    float *y = malloc(H * R * 4);
    if (!x || !r || !ro || !y) {
        CHECK_FAIL("oom");
        goto out;
    }
    for (int64_t row = 0; row < R; row++)
        for (int64_t c = 0; c < H; c++) {
            uint16_t h = (uint16_t)c;
            float f = to_f32(h, dt);
            double u = 0;
            if (isfinite(f) && !(row == 0)) {
                float up = to_f32((uint16_t)((h & 0x7fff) + 1), dt);
                u = isfinite(up) ? ((double)up - fabs((double)f)) / 2 : 0;
                if (row == 2)
                    u *= 1.25;
                if (row == 3)
                    u *= 0.75;
                if (h & 0x8000)
                    u = -u;
            }
            x[row * H + c] = h;
            r[row * H + c] = from_f32((float)lnorm_test_round(u, dt), dt);
        }
    lnorm_segment s;
    lnorm_segment_init(&s, LNORM_OP_RMSNORM, dt, R, H);
    s.y_dtype = LNORM_DTYPE_F32;
    s.x = x;
    s.residual = r;
    s.residual_out = ro;
    s.y = y;
    memset(ro, 0xFF, H * R * 2);
    const char *why = NULL;
    int err = lnorm_cpu_run_segment(cpu, &s, &why);
    CHECK(err == LNORM_OK, "run: %s", why ? why : "");
    long bad = 0;
    for (int64_t k = 0; k < H * R; k++) {
        float sum = to_f32(x[k], dt) + to_f32(r[k], dt);
        double want = lnorm_test_round((double)sum, dt);
        double got = to_f32(ro[k], dt);
        int ok = isnan(want) ? isnan(got) : (got == want && signbit(got) == signbit(want));
        if (!ok && bad++ < 5)
            fprintf(stderr, "  isa %s %s: x=%04x r=%04x -> %04x, want %a\n", lnorm_cpu_isa(cpu),
                    lnorm_dtype_name(dt), x[k], r[k], ro[k], want);
    }
    CHECK(bad == 0, "isa %s %s: %ld residual_out roundings wrong", lnorm_cpu_isa(cpu), lnorm_dtype_name(dt), bad);
out:
    free(x);
    free(r);
    free(ro);
    free(y);
}

int main(void)
{
    header_tests(LNORM_DTYPE_F16);
    header_tests(LNORM_DTYPE_BF16);
    const char *isas[] = {"scalar", "avx2", "avx512"};
    lnorm_cpu *cpu;
    if (lnorm_cpu_create(&cpu, 1))
        return 1;
    for (int i = 0; i < 3; i++) {
        if (lnorm_cpu_set_isa(cpu, isas[i]) != LNORM_OK) {
            printf("isa %s: not available, not checked\n", isas[i]);
            continue;
        }
        backend_tests(cpu, LNORM_DTYPE_F16);
        backend_tests(cpu, LNORM_DTYPE_BF16);
        printf("isa %s: residual rounding checked\n", isas[i]);
    }
    lnorm_cpu_destroy(cpu);
    return check_finish("kernels.half_conversions");
}
