/* The portable C row kernel of the CPU runner (numerics in cpu_rows.h). */
#include <math.h>

#include "cpu_rows.h"
#include "half.h"
#include "rescale.h"

/* Columns summed plainly before the block sum joins the compensated total. */
#define BLOCK 8

static inline float ld(const void *p, int64_t i, int dt)
{
    if (dt == LNORM_DTYPE_F32)
        return ((const float *)p)[i];
    if (dt == LNORM_DTYPE_F16)
        return lnorm_f16_to_f32(((const uint16_t *)p)[i]);
    return lnorm_bf16_to_f32(((const uint16_t *)p)[i]);
}

static inline void st(void *p, int64_t i, int dt, float v)
{
    if (dt == LNORM_DTYPE_F32)
        ((float *)p)[i] = v;
    else if (dt == LNORM_DTYPE_F16)
        ((uint16_t *)p)[i] = lnorm_f32_to_f16(v);
    else
        ((uint16_t *)p)[i] = lnorm_f32_to_bf16(v);
}

/* Kahan addition of a block sum into (*sum, *comp). */
static inline void kahan_add(float *sum, float *comp, float v)
{
    float y = v - *comp;
    float t = *sum + y;
    *comp = (t - *sum) - y;
    *sum = t;
}

/* sum over the row of (h - K) (mode 0), ((h - K) - d)^2 (mode 1) or h^2
 * (mode 2), blocked and compensated; the rescue's sums (rescale.h) of
 * t = (h - K) * sc (mode 3) and (t - d)^2 (mode 4). Inlined with mode a
 * constant: each mode is its own loop. */
static inline __attribute__((always_inline)) float row_sum(const void *hp, int dt, int64_t H, float K, float d,
                                                           float sc, int mode)
{
    float sum = 0.0f, comp = 0.0f, plain = 0.0f;
    for (int64_t c0 = 0; c0 < H; c0 += BLOCK) {
        int64_t c1 = c0 + BLOCK < H ? c0 + BLOCK : H;
        float bs = 0.0f;
        for (int64_t c = c0; c < c1; c++) {
            float h = ld(hp, c, dt);
            float t = mode == 2 ? h : h - K;
            if (mode >= 3)
                t *= sc;
            if (mode == 1 || mode == 4)
                t -= d;
            bs += mode == 0 || mode == 3 ? t : t * t;
        }
        kahan_add(&sum, &comp, bs);
        plain += bs;
    }
    /* Compensation turns an infinite sum into NaN; the plain sum keeps it. */
    return isfinite(plain) ? sum : plain;
}

/* The rescue of a row whose plain var failed (rescale.h): d and rstd from
 * sums of (h - K) scaled by a power of two. */
static __attribute__((noinline)) void rescue(const lnorm_segment *s, const void *hp, float K, float var, float *d,
                                             float *rstd)
{
    const int64_t H = s->hidden;
    const float sc = lnorm__rescale_factor(var);
    const float ds = s->op == LNORM_OP_LAYERNORM ? row_sum(hp, s->x_dtype, H, K, 0.0f, sc, 3) / (float)H : 0.0f;
    const float vs = row_sum(hp, s->x_dtype, H, K, ds, sc, 4) / (float)H;
    lnorm__rescaled(ds, vs, sc, s->eps, s->eps_mode, d, rstd);
}

static void one_row(const lnorm_segment *s, int64_t r)
{
    const int64_t H = s->hidden;
    const int xdt = s->x_dtype;
    const size_t xsz = lnorm_dtype_size(xdt);
    const char *x = (const char *)s->x + (size_t)(r * s->x_stride) * xsz;
    const void *hp = x;

    if (s->residual) {
        const char *res = (const char *)s->residual + (size_t)(r * s->res_stride) * xsz;
        char *ro = (char *)s->residual_out + (size_t)(r * s->res_out_stride) * xsz;
        for (int64_t c = 0; c < H; c++)
            st(ro, c, xdt, ld(x, c, xdt) + ld(res, c, xdt));
        hp = ro; /* h, rounded to x's dtype, is read back from residual_out */
    }

    float K = 0.0f, d = 0.0f, var;
    if (s->op == LNORM_OP_LAYERNORM) {
        K = ld(hp, 0, xdt);
        if (!isfinite(K))
            K = 0.0f; /* keep an Inf/NaN first element from poisoning the mean */
        d = row_sum(hp, xdt, H, K, 0.0f, 1.0f, 0) / (float)H;
        var = row_sum(hp, xdt, H, K, d, 1.0f, 1) / (float)H;
    } else {
        var = row_sum(hp, xdt, H, 0.0f, 0.0f, 1.0f, 2) / (float)H;
    }
    float rstd = lnorm__rstd(var, s->eps, s->eps_mode);
    if (lnorm__rescale_needed(var, s->eps))
        rescue(s, hp, K, var, &d, &rstd);
    if (s->mean)
        s->mean[r] = K + d;
    if (s->rstd)
        s->rstd[r] = rstd;
    if (!s->y)
        return; /* statistics only (the backward's recomputation) */

    char *y = (char *)s->y + (size_t)(r * s->y_stride) * lnorm_dtype_size(s->y_dtype);
    const int pdt = s->param_dtype;
    for (int64_t c = 0; c < H; c++) {
        float v = ((ld(hp, c, xdt) - K) - d) * rstd;
        if (s->gamma)
            v = v * ld(s->gamma, c, pdt);
        if (s->beta)
            v = v + ld(s->beta, c, pdt);
        st(y, c, s->y_dtype, v);
    }
}

void lnorm__cpu_rows_scalar(const lnorm_segment *s, int64_t r0, int64_t r1)
{
    for (int64_t r = r0; r < r1; r++)
        one_row(s, r);
}
