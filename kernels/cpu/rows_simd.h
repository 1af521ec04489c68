/*
 * The vector row kernel of the CPU runner, written once over a small set
 * of vector macros and included by one translation unit per ISA
 * (rows_avx2.c, rows_avx512.c), each compiled with its own -m flags.
 * Numerics as in cpu_rows.h; the block structure depends only on hidden
 * (never on addresses), so a row's bits do not depend on where it lies.
 *
 * The including file defines, for a vector V of W floats:
 *   VZERO() VSET1(f) VADD(a,b) VSUB(a,b) VMUL(a,b) VFMA(a,b,c) (= a*b+c)
 *   VLD_F32(p) VLD_F16(p) VLD_BF16(p)       full loads (unaligned)
 *   VST_F32(p,v) VST_F16(p,v) VST_BF16(p,v) full stores, rounding to nearest even
 *   VNT_F32(p,v) VNT_F16(p,v) VNT_BF16(p,v) the same, non-temporal (p aligned
 *                 to the vector's store width)
 *   VNT_ALIGN     the alignment (bytes) a row of y needs for non-temporal stores
 *   VKEEP(v, n)   lanes >= n set to 0
 *   VHSUM(v)      sum of the lanes: upper half added onto lower half, repeated
 *   ROWS_FN       the function name to define
 */
#include <math.h>
#include <string.h>

#include "cpu_rows.h"
#include "half.h"
#include "rescale.h"

#define INL static inline __attribute__((always_inline))
/* Vectors summed per accumulator before a block joins the compensated sum. */
#define BLOCK_VECS 16

INL V ld_full(const void *p, int64_t c, int dt)
{
    if (dt == LNORM_DTYPE_F32)
        return VLD_F32((const float *)p + c);
    if (dt == LNORM_DTYPE_F16)
        return VLD_F16((const uint16_t *)p + c);
    return VLD_BF16((const uint16_t *)p + c);
}

/* n (< W) elements from column c, the other lanes 0. */
INL V ld_tail(const void *p, int64_t c, int64_t n, int dt)
{
    size_t sz = lnorm_dtype_size(dt);
    _Alignas(64) unsigned char buf[W * 4];
    memset(buf, 0, sizeof buf);
    memcpy(buf, (const char *)p + (size_t)c * sz, (size_t)n * sz);
    return ld_full(buf, 0, dt);
}

INL void st_full(void *p, int64_t c, int dt, V v)
{
    if (dt == LNORM_DTYPE_F32)
        VST_F32((float *)p + c, v);
    else if (dt == LNORM_DTYPE_F16)
        VST_F16((uint16_t *)p + c, v);
    else
        VST_BF16((uint16_t *)p + c, v);
}

INL void st_nt(void *p, int64_t c, int dt, V v)
{
    if (dt == LNORM_DTYPE_F32)
        VNT_F32((float *)p + c, v);
    else if (dt == LNORM_DTYPE_F16)
        VNT_F16((uint16_t *)p + c, v);
    else
        VNT_BF16((uint16_t *)p + c, v);
}

/* The first n (< W) lanes of v to column c; nothing else is written. */
INL void st_tail(void *p, int64_t c, int64_t n, int dt, V v)
{
    size_t sz = lnorm_dtype_size(dt);
    _Alignas(64) unsigned char buf[W * 4];
    st_full(buf, 0, dt, v);
    memcpy((char *)p + (size_t)c * sz, buf, (size_t)n * sz);
}

INL float ld1(const void *p, int dt)
{
    if (dt == LNORM_DTYPE_F32)
        return *(const float *)p;
    if (dt == LNORM_DTYPE_F16)
        return lnorm_f16_to_f32(*(const uint16_t *)p);
    return lnorm_bf16_to_f32(*(const uint16_t *)p);
}

/* Lanes summed pairwise in a fixed order: upper half onto lower half until
 * one lane is left (VHSUM, in registers). */
INL float hsum(V v)
{
    return VHSUM(v);
}

/* The value a column contributes, before squaring: mode 0: h - K (summed);
 * 1: (h - K) - d (squared and summed); 2: h (squared and summed); the
 * rescue's sums (rescale.h): 3: t = (h - K) * sc (summed), 4: t - d
 * (squared and summed). */
INL V term(V h, V K, V d, V sc, int mode)
{
    if (mode == 2)
        return h;
    V t = VSUB(h, K);
    if (mode >= 3)
        t = VMUL(t, sc);
    return mode == 1 || mode == 4 ? VSUB(t, d) : t;
}

INL V accum(V acc, V t, int mode)
{
    return mode == 0 || mode == 3 ? VADD(acc, t) : VFMA(t, t, acc);
}

/* Sum over the row: blocks of BLOCK_VECS vectors in four accumulators
 * (vector j of a block goes to accumulator j % 4), blocks Kahan-added
 * lane-wise, lanes combined pairwise at the end. Depends on H only. */
INL float row_sum(const void *hp, int dt, int64_t H, float Kf, float df, float sc, int mode)
{
    const V K = VSET1(Kf), d = VSET1(df), Sc = VSET1(sc);
    V S = VZERO(), C = VZERO(), P = VZERO();
    const int64_t nfull = H / W, nvec = (H + W - 1) / W;
    for (int64_t v0 = 0; v0 < nvec; v0 += BLOCK_VECS) {
        const int64_t v1 = v0 + BLOCK_VECS < nvec ? v0 + BLOCK_VECS : nvec;
        V a[4] = {VZERO(), VZERO(), VZERO(), VZERO()};
        int64_t v = v0;
        for (; v + 4 <= v1 && v + 4 <= nfull; v += 4) {
            a[0] = accum(a[0], term(ld_full(hp, v * W, dt), K, d, Sc, mode), mode);
            a[1] = accum(a[1], term(ld_full(hp, (v + 1) * W, dt), K, d, Sc, mode), mode);
            a[2] = accum(a[2], term(ld_full(hp, (v + 2) * W, dt), K, d, Sc, mode), mode);
            a[3] = accum(a[3], term(ld_full(hp, (v + 3) * W, dt), K, d, Sc, mode), mode);
        }
        for (; v < v1; v++) {
            V tv = v < nfull ? term(ld_full(hp, v * W, dt), K, d, Sc, mode)
                             : VKEEP(term(ld_tail(hp, v * W, H - v * W, dt), K, d, Sc, mode), H - v * W);
            a[(v - v0) & 3] = accum(a[(v - v0) & 3], tv, mode);
        }
        V b = VADD(VADD(a[0], a[1]), VADD(a[2], a[3]));
        /* Kahan: S - C is the running sum, C its accumulated rounding error. */
        V y = VSUB(b, C);
        V t = VADD(S, y);
        C = VSUB(VSUB(t, S), y);
        S = t;
        P = VADD(P, b);
    }
    /* A non-finite block sum (or an overflow) leaves S - C non-finite too;
     * then the plain sum gives the Inf/NaN an uncompensated sum would. */
    float sum = hsum(VSUB(S, C));
    return isfinite(sum) ? sum : hsum(P);
}

/* The rescue of a row whose plain var failed (rescale.h): d and rstd from
 * sums of (h - K) scaled by a power of two. Out of line: the common case
 * only tests for it. */
static __attribute__((noinline)) void rescue(const void *hp, int xdt, const lnorm_segment *s, float K, float var,
                                             float *d, float *rstd)
{
    const int64_t H = s->hidden;
    const float sc = lnorm__rescale_factor(var);
    float ds = 0.0f, vs;
    if (xdt == LNORM_DTYPE_F32) {
        if (s->op == LNORM_OP_LAYERNORM)
            ds = row_sum(hp, LNORM_DTYPE_F32, H, K, 0.0f, sc, 3) / (float)H;
        vs = row_sum(hp, LNORM_DTYPE_F32, H, K, ds, sc, 4) / (float)H;
    } else if (xdt == LNORM_DTYPE_F16) {
        if (s->op == LNORM_OP_LAYERNORM)
            ds = row_sum(hp, LNORM_DTYPE_F16, H, K, 0.0f, sc, 3) / (float)H;
        vs = row_sum(hp, LNORM_DTYPE_F16, H, K, ds, sc, 4) / (float)H;
    } else {
        if (s->op == LNORM_OP_LAYERNORM)
            ds = row_sum(hp, LNORM_DTYPE_BF16, H, K, 0.0f, sc, 3) / (float)H;
        vs = row_sum(hp, LNORM_DTYPE_BF16, H, K, ds, sc, 4) / (float)H;
    }
    lnorm__rescaled(ds, vs, sc, s->eps, s->eps_mode, d, rstd);
}

/* What the output pass of one row needs. */
typedef struct out_args {
    const void *hp;
    void *y;
    const void *gamma, *beta;
    int64_t H;
    size_t xsz;
    V K, d, rs;
    int is_ln, nt;
    const char *next_x, *next_r;
    int pf_l1;
} out_args;

/* y = ((h - K) - d) * rstd * gamma + beta for one vector at column c. */
INL V out_value(const out_args *a, V h, V g, V b)
{
    V t = a->is_ln ? VSUB(VSUB(h, a->K), a->d) : h;
    V v = VMUL(t, a->rs);
    if (a->gamma && a->beta)
        return VFMA(v, g, b);
    if (a->gamma)
        return VMUL(v, g);
    if (a->beta)
        return VADD(v, b);
    return v;
}

/* The output pass; xdt, ydt and pdt are constants after inlining. */
INL void out_pass(const out_args *a, int xdt, int ydt, int pdt)
{
    const int64_t H = a->H, full = H - H % W;
    const V zero = VZERO();
    int64_t c = 0;
    for (; c < full; c += W) {
        if (a->next_x) {
            if (a->pf_l1) {
                _mm_prefetch(a->next_x + (size_t)c * a->xsz, _MM_HINT_T0);
                if (a->next_r)
                    _mm_prefetch(a->next_r + (size_t)c * a->xsz, _MM_HINT_T0);
            } else {
                _mm_prefetch(a->next_x + (size_t)c * a->xsz, _MM_HINT_T1);
                if (a->next_r)
                    _mm_prefetch(a->next_r + (size_t)c * a->xsz, _MM_HINT_T1);
            }
        }
        V g = a->gamma ? ld_full(a->gamma, c, pdt) : zero;
        V b = a->beta ? ld_full(a->beta, c, pdt) : zero;
        V v = out_value(a, ld_full(a->hp, c, xdt), g, b);
        if (a->nt)
            st_nt(a->y, c, ydt, v);
        else
            st_full(a->y, c, ydt, v);
    }
    if (c < H) {
        int64_t n = H - c;
        V g = a->gamma ? ld_tail(a->gamma, c, n, pdt) : zero;
        V b = a->beta ? ld_tail(a->beta, c, n, pdt) : zero;
        st_tail(a->y, c, n, ydt, out_value(a, ld_tail(a->hp, c, n, xdt), g, b));
    }
}

/* While a row's output pass runs, a later row (at least PF_AHEAD_BYTES of
 * rows ahead) is prefetched, so DRAM works while the core computes: into
 * L1 for rows up to PF_L1_ROW_BYTES, into L2 up to PF_L2_ROW_BYTES; longer
 * rows would only push their own data out of the caches. */
#define PF_AHEAD_BYTES (16u << 10)
#define PF_L1_ROW_BYTES (32u << 10)
#define PF_L2_ROW_BYTES (256u << 10)

/* One row, x dtype xdt known at compile time after inlining. */
INL void one_row(const lnorm_segment *s, int64_t r, int xdt, int nt, const char *next_x, const char *next_r,
                 int pf_l1)
{
    const int64_t H = s->hidden;
    const size_t xsz = lnorm_dtype_size(xdt);
    const char *x = (const char *)s->x + (size_t)(r * s->x_stride) * xsz;
    const void *hp = x;
    const int64_t full = H - H % W;

    if (s->residual) {
        const char *res = (const char *)s->residual + (size_t)(r * s->res_stride) * xsz;
        char *ro = (char *)s->residual_out + (size_t)(r * s->res_out_stride) * xsz;
        int64_t c = 0;
        for (; c < full; c += W)
            st_full(ro, c, xdt, VADD(ld_full(x, c, xdt), ld_full(res, c, xdt)));
        if (c < H)
            st_tail(ro, c, H - c, xdt, VADD(ld_tail(x, c, H - c, xdt), ld_tail(res, c, H - c, xdt)));
        hp = ro; /* h, rounded to x's dtype, is read back from residual_out */
    }

    float Kf = 0.0f, df = 0.0f, var;
    if (s->op == LNORM_OP_LAYERNORM) {
        Kf = ld1(hp, xdt);
        if (!isfinite(Kf))
            Kf = 0.0f;
        df = row_sum(hp, xdt, H, Kf, 0.0f, 1.0f, 0) / (float)H;
        var = row_sum(hp, xdt, H, Kf, df, 1.0f, 1) / (float)H;
    } else {
        var = row_sum(hp, xdt, H, 0.0f, 0.0f, 1.0f, 2) / (float)H;
    }
    float rstd = lnorm__rstd(var, s->eps, s->eps_mode);
    if (__builtin_expect(lnorm__rescale_needed(var, s->eps), 0))
        rescue(hp, xdt, s, Kf, var, &df, &rstd);
    if (s->mean)
        s->mean[r] = Kf + df;
    if (s->rstd)
        s->rstd[r] = rstd;
    if (!s->y)
        return; /* statistics only (the backward's recomputation) */

    char *y = (char *)s->y + (size_t)(r * s->y_stride) * lnorm_dtype_size(s->y_dtype);
    /* Non-temporal stores only change how y reaches memory, never its bits. */
    nt = nt && ((uintptr_t)y % VNT_ALIGN) == 0;
    out_args a = {hp, y, s->gamma, s->beta, H, xsz, VSET1(Kf), VSET1(df), VSET1(rstd),
                  s->op == LNORM_OP_LAYERNORM, nt, next_x, next_r, pf_l1};
    /* Instantiate the output loop for each y dtype / parameter dtype pair. */
    const int f32p = s->param_dtype == LNORM_DTYPE_F32;
    if (s->y_dtype == LNORM_DTYPE_F32)
        f32p ? out_pass(&a, xdt, LNORM_DTYPE_F32, LNORM_DTYPE_F32) : out_pass(&a, xdt, LNORM_DTYPE_F32, xdt);
    else if (s->y_dtype == LNORM_DTYPE_F16)
        f32p ? out_pass(&a, xdt, LNORM_DTYPE_F16, LNORM_DTYPE_F32) : out_pass(&a, xdt, LNORM_DTYPE_F16, xdt);
    else
        f32p ? out_pass(&a, xdt, LNORM_DTYPE_BF16, LNORM_DTYPE_F32) : out_pass(&a, xdt, LNORM_DTYPE_BF16, xdt);
}

/* y of a segment at least this large bypasses the caches (it would not stay
 * in them anyway), saving the read-for-ownership of every output line. */
#define NT_MIN_BYTES (4u << 20)

void ROWS_FN(const lnorm_segment *s, int64_t r0, int64_t r1)
{
    const int nt = (uint64_t)s->rows * (uint64_t)s->y_stride * lnorm_dtype_size(s->y_dtype) >= NT_MIN_BYTES;
    const size_t xsz = lnorm_dtype_size(s->x_dtype);
    const uint64_t row_bytes = (uint64_t)s->hidden * xsz;
    const int pf = row_bytes <= PF_L2_ROW_BYTES, pf_l1 = row_bytes <= PF_L1_ROW_BYTES;
    const int64_t ahead = (int64_t)((PF_AHEAD_BYTES + row_bytes - 1) / row_bytes);
    for (int64_t r = r0; r < r1; r++) {
        const char *nx = NULL, *nr = NULL;
        if (pf && r + ahead < r1) {
            nx = (const char *)s->x + (size_t)((r + ahead) * s->x_stride) * xsz;
            if (s->residual)
                nr = (const char *)s->residual + (size_t)((r + ahead) * s->res_stride) * xsz;
        }
        if (s->x_dtype == LNORM_DTYPE_F32)
            one_row(s, r, LNORM_DTYPE_F32, nt, nx, nr, pf_l1);
        else if (s->x_dtype == LNORM_DTYPE_F16)
            one_row(s, r, LNORM_DTYPE_F16, nt, nx, nr, pf_l1);
        else
            one_row(s, r, LNORM_DTYPE_BF16, nt, nx, nr, pf_l1);
    }
    if (nt)
        _mm_sfence(); /* order the streamed stores before the caller's "done" */
}
