/*
 * gpu.bwd: the CUDA backward pass (lnorm_cuda_run_bwd) on a GPU.
 *  1. op x x dtype x hidden size inside every backward tier (odd sizes,
 *     the wide tier past 131072) x options rotating over the cases (gamma none /
 *     x dtype / f32, statistics given or recomputed, eps inside / outside,
 *     dres, dy and dx of other dtypes, padded strides, tensors shifted by
 *     one element) against a float64 reference computed here: dx by
 *     ||dx - ref|| / ||ref|| per segment and element by element within a
 *     bound of the row's scale, dgamma / dbeta likewise; outputs and row
 *     padding poisoned first (padding must stay poisoned).
 *  2. Rows at the edges: constant rows, |mean| >> spread, huge (sums past
 *     FLT_MAX) and tiny (subnormal squares) values, with statistics given
 *     and recomputed; a NaN row (that row's dx NaN, the others right).
 *  3. The wide tier at every length ("bwd_wide" 1): sizes from 1 to 65536,
 *     options rotating, random and edge rows.
 *  4. Rows two at a time for every dtype in every register tier
 *     ("bwd_pair" 2).
 *  5. Determinism: dx, dgamma and dbeta bit-identical for a segment run
 *     alone, inside a many-segment batch of mixed dtypes and tiers, and
 *     with the main launches' grid cut to a few CTAs ("bwd_grid": the SM
 *     count and the grid never change the bits), with rows two at a time
 *     nowhere and everywhere ("bwd_pair" 0 and 2).
 *  6. Bad input: EINVAL and nothing written (scratch too small, invalid
 *     segments).
 * Usage: test_gpu_bwd [--pair]  (needs a GPU: exits 1, never "passes",
 * without one). --pair: part 4 alone (for compute-sanitizer, whose full
 * run of every part takes too long).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "check.h"
#include "half.h"
#include "lnorm_core.h"
#include "lnorm_cuda.h"
#include "testutil.h"

static lnorm_rng g_rng;
static long g_cases;

/* ---- host tensors ------------------------------------------------------ */

static double ld_el(const void *p, int dt, size_t i)
{
    if (dt == LNORM_DTYPE_F32)
        return ((const float *)p)[i];
    if (dt == LNORM_DTYPE_F16)
        return lnorm_f16_to_f32(((const uint16_t *)p)[i]);
    return lnorm_bf16_to_f32(((const uint16_t *)p)[i]);
}

static void st_el(void *p, int dt, size_t i, double v)
{
    if (dt == LNORM_DTYPE_F32)
        ((float *)p)[i] = (float)v;
    else if (dt == LNORM_DTYPE_F16)
        ((uint16_t *)p)[i] = lnorm_f32_to_f16((float)v);
    else
        ((uint16_t *)p)[i] = lnorm_f32_to_bf16((float)v);
}

/* v rounded to dtype dt and back. */
static double ld_el_round(double v, int dt)
{
    uint16_t h[2];
    float f[1];
    if (dt == LNORM_DTYPE_F32) {
        f[0] = (float)v;
        return f[0];
    }
    st_el(h, dt, 0, v);
    return ld_el(h, dt, 0);
}

/* How a case's rows are drawn. */
enum { ROWS_RANDOM, ROWS_CONST, ROWS_BIGMEAN, ROWS_HUGE, ROWS_TINY, ROWS_NAN };

/* One backward case: host inputs and outputs, the segment (host pointers
 * until run), and its device mirror. Element offsets off shift every
 * tensor by one element (misaligned rows). */
typedef struct bcase {
    lnorm_bwd_segment s; /* host pointers */
    int off;
    int kind;
    void *x, *dy, *dx, *dres, *gamma;
    float *mean, *rstd, *dgamma, *dbeta;
    size_t x_n, dy_n, dx_n, dres_n;
} bcase;

static void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p) {
        fprintf(stderr, "out of memory\n");
        exit(1);
    }
    return p;
}

static size_t tensor_elems(int64_t rows, int64_t stride, int64_t hidden)
{
    return (size_t)((rows - 1) * stride + hidden);
}

/* The forward's statistics of row r in float64 (LayerNorm mean / variance,
 * RMSNorm mean square). */
static void ref_stats(const bcase *c, int64_t r, double *mean, double *var)
{
    const lnorm_bwd_segment *s = &c->s;
    const int64_t H = s->hidden;
    double m = 0.0, v = 0.0;
    if (s->op == LNORM_OP_LAYERNORM) {
        for (int64_t k = 0; k < H; k++)
            m += ld_el(c->x, s->x_dtype, (size_t)(r * s->x_stride + k));
        m /= (double)H;
    }
    for (int64_t k = 0; k < H; k++) {
        const double e = ld_el(c->x, s->x_dtype, (size_t)(r * s->x_stride + k)) - m;
        v += e * e;
    }
    *mean = m;
    *var = v / (double)H;
}

static double ref_rstd(double var, const lnorm_bwd_segment *s)
{
    return s->eps_mode == LNORM_EPS_OUTSIDE ? 1.0 / (sqrt(var) + s->eps) : 1.0 / sqrt(var + s->eps);
}

/* Fill a case's inputs; given: mean/rstd from float64 rounded to fp32 (as
 * a forward pass hands them over). */
static void bcase_fill(bcase *c, int given)
{
    lnorm_bwd_segment *s = &c->s;
    const int64_t H = s->hidden;
    for (int64_t r = 0; r < s->rows; r++) {
        const double base = c->kind == ROWS_BIGMEAN ? 3000.0 + 100.0 * (double)r : 0.0;
        const double scale = c->kind == ROWS_HUGE ? 4e19 : c->kind == ROWS_TINY ? 1e-24 : 1.0;
        const double cst = lnorm_rng_normal(&g_rng);
        for (int64_t k = 0; k < H; k++) {
            double v = c->kind == ROWS_CONST ? cst : base + scale * lnorm_rng_normal(&g_rng);
            if (c->kind == ROWS_NAN && r == s->rows / 2 && k == H / 2)
                v = NAN;
            st_el(c->x, s->x_dtype, (size_t)(r * s->x_stride + k), v);
            st_el(c->dy, s->dy_dtype, (size_t)(r * s->dy_stride + k), lnorm_rng_normal(&g_rng));
            if (c->dres)
                st_el(c->dres, s->x_dtype, (size_t)(r * s->dres_stride + k), lnorm_rng_normal(&g_rng));
        }
    }
    if (c->gamma)
        for (int64_t k = 0; k < H; k++)
            st_el(c->gamma, s->param_dtype, (size_t)k, 1.0 + 0.5 * lnorm_rng_normal(&g_rng));
    if (given) {
        for (int64_t r = 0; r < s->rows; r++) {
            double m, v;
            ref_stats(c, r, &m, &v);
            if (c->mean)
                c->mean[r] = (float)m;
            c->rstd[r] = (float)ref_rstd(v, s);
        }
    }
}

/* A case: op, dtypes, rows x hidden, the options in opt's bits. */
enum {
    O_GAMMA = 1,   /* gamma of x's dtype */
    O_GF32 = 2,    /* gamma of f32 (with O_GAMMA) */
    O_STATS = 4,   /* mean/rstd given */
    O_OUT = 8,     /* eps outside the sqrt */
    O_DRES = 16,   /* dres */
    O_DYF32 = 32,  /* dy of f32 (16-bit x) / bf16 (f32 x) */
    O_DXOTH = 64,  /* dx of another dtype */
    O_PAD = 128,   /* strides > hidden */
    O_OFF = 256,   /* every tensor one element off 16-byte alignment */
    O_NODG = 512,  /* no dgamma asked for */
    O_NODB = 1024, /* no dbeta asked for */
};

static int other_dtype(int dt)
{
    return dt == LNORM_DTYPE_F32 ? LNORM_DTYPE_BF16 : LNORM_DTYPE_F32;
}

static void bcase_make(bcase *c, int op, int xdt, int64_t rows, int64_t H, int opt, int kind)
{
    memset(c, 0, sizeof *c);
    lnorm_bwd_segment *s = &c->s;
    lnorm_bwd_segment_init(s, (lnorm_op)op, (lnorm_dtype)xdt, rows, H);
    c->kind = kind;
    c->off = (opt & O_OFF) ? 1 : 0;
    if (opt & O_DYF32)
        s->dy_dtype = other_dtype(xdt);
    if (opt & O_DXOTH)
        s->dx_dtype = xdt == LNORM_DTYPE_BF16 ? LNORM_DTYPE_F16 : other_dtype(xdt);
    s->param_dtype = (opt & O_GF32) ? LNORM_DTYPE_F32 : xdt;
    s->eps_mode = (opt & O_OUT) ? LNORM_EPS_OUTSIDE : LNORM_EPS_INSIDE;
    s->eps = kind == ROWS_TINY ? 2e-38f : 1e-5f; /* >= FLT_MIN: eps outside too */
    if (opt & O_PAD) {
        s->x_stride = H + 3;
        s->dy_stride = H + 5;
        s->dx_stride = H + 1;
        s->dres_stride = H + 2;
    }
    c->x_n = tensor_elems(rows, s->x_stride, H) + 1;
    c->dy_n = tensor_elems(rows, s->dy_stride, H) + 1;
    c->dx_n = tensor_elems(rows, s->dx_stride, H) + 1;
    c->x = xmalloc(c->x_n * 4);
    c->dy = xmalloc(c->dy_n * 4);
    c->dx = xmalloc(c->dx_n * 4);
    if (opt & O_DRES) {
        c->dres_n = tensor_elems(rows, s->dres_stride, H) + 1;
        c->dres = xmalloc(c->dres_n * 4);
    }
    if (opt & O_GAMMA)
        c->gamma = xmalloc((size_t)H * 4 + 4);
    c->rstd = (opt & O_STATS) ? xmalloc((size_t)rows * 4) : NULL;
    c->mean = (opt & O_STATS) && op == LNORM_OP_LAYERNORM ? xmalloc((size_t)rows * 4) : NULL;
    c->dgamma = (opt & O_NODG) ? NULL : xmalloc((size_t)H * 4 + 4);
    c->dbeta = (opt & O_NODB) ? NULL : xmalloc((size_t)H * 4 + 4);
    memset(c->x, 0, c->x_n * 4);
    memset(c->dy, 0, c->dy_n * 4);
    if (c->dres)
        memset(c->dres, 0, c->dres_n * 4);
    bcase_fill(c, (opt & O_STATS) != 0);
}

static void bcase_free(bcase *c)
{
    free(c->x);
    free(c->dy);
    free(c->dx);
    free(c->dres);
    free(c->gamma);
    free(c->mean);
    free(c->rstd);
    free(c->dgamma);
    free(c->dbeta);
}

/* ---- device mirror -------------------------------------------------------- */

typedef struct dcase {
    lnorm_bwd_segment s; /* device pointers */
    void *blk[9];
} dcase;

static void *dev_copy(const void *h, size_t bytes, int poison, void **blk)
{
    void *d = NULL;
    if (cudaMalloc(&d, bytes + 16) != cudaSuccess) {
        fprintf(stderr, "cudaMalloc failed\n");
        exit(1);
    }
    *blk = d;
    if (poison)
        cudaMemset(d, 0xff, bytes + 16); /* NaN in every dtype */
    else
        cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice);
    return d;
}

/* Upload c (outputs poisoned) and describe it with device pointers. */
static void dcase_make(dcase *d, const bcase *c)
{
    const lnorm_bwd_segment *s = &c->s;
    const size_t xs = lnorm_dtype_size(s->x_dtype), ds = lnorm_dtype_size(s->dy_dtype),
                 os = lnorm_dtype_size(s->dx_dtype), ps = lnorm_dtype_size(s->param_dtype);
    memset(d, 0, sizeof *d);
    d->s = *s;
    const int off = c->off;
    /* shifted: the device tensor starts one element after its block */
    unsigned char *p;
    p = dev_copy(NULL, (c->x_n + 1) * xs, 1, &d->blk[0]);
    cudaMemcpy(p + off * xs, c->x, (c->x_n - 1) * xs, cudaMemcpyHostToDevice);
    d->s.x = p + off * xs;
    p = dev_copy(NULL, (c->dy_n + 1) * ds, 1, &d->blk[1]);
    cudaMemcpy(p + off * ds, c->dy, (c->dy_n - 1) * ds, cudaMemcpyHostToDevice);
    d->s.dy = p + off * ds;
    p = dev_copy(NULL, (c->dx_n + 1) * os, 1, &d->blk[2]);
    d->s.dx = p + off * os;
    if (c->dres) {
        p = dev_copy(NULL, (c->dres_n + 1) * xs, 1, &d->blk[3]);
        cudaMemcpy(p + off * xs, c->dres, (c->dres_n - 1) * xs, cudaMemcpyHostToDevice);
        d->s.dres = p + off * xs;
    }
    if (c->gamma) {
        p = dev_copy(NULL, ((size_t)s->hidden + 1) * ps, 1, &d->blk[4]);
        cudaMemcpy(p + off * ps, c->gamma, (size_t)s->hidden * ps, cudaMemcpyHostToDevice);
        d->s.gamma = p + off * ps;
    }
    if (c->mean)
        d->s.mean = dev_copy(c->mean, (size_t)s->rows * 4, 0, &d->blk[5]);
    if (c->rstd)
        d->s.rstd = dev_copy(c->rstd, (size_t)s->rows * 4, 0, &d->blk[6]);
    if (c->dgamma)
        d->s.dgamma = dev_copy(NULL, (size_t)s->hidden * 4, 1, &d->blk[7]);
    if (c->dbeta)
        d->s.dbeta = dev_copy(NULL, (size_t)s->hidden * 4, 1, &d->blk[8]);
}

/* Copy the outputs back into c (dx with its padding). */
static int dcase_fetch(const dcase *d, bcase *c)
{
    const size_t os = lnorm_dtype_size(c->s.dx_dtype);
    if (cudaDeviceSynchronize() != cudaSuccess)
        return -1;
    if (cudaMemcpy(c->dx, d->s.dx, (c->dx_n - 1) * os, cudaMemcpyDeviceToHost) != cudaSuccess)
        return -1;
    if (c->dgamma && cudaMemcpy(c->dgamma, d->s.dgamma, (size_t)c->s.hidden * 4, cudaMemcpyDeviceToHost))
        return -1;
    if (c->dbeta && cudaMemcpy(c->dbeta, d->s.dbeta, (size_t)c->s.hidden * 4, cudaMemcpyDeviceToHost))
        return -1;
    return 0;
}

static void dcase_free(dcase *d)
{
    for (int i = 0; i < 9; i++)
        if (d->blk[i])
            cudaFree(d->blk[i]);
    memset(d, 0, sizeof *d);
}

/* Run a batch of device cases with a fresh scratch; returns the lnorm code. */
static int run_batch(const lnorm_bwd_segment *segs, size_t n, const char **why)
{
    lnorm_bwd_batch b = {segs, n};
    size_t need = lnorm_cuda_bwd_scratch_bytes(&b);
    if (need == SIZE_MAX)
        return lnorm_cuda_run_bwd(&b, NULL, NULL, 0, why);
    void *scr = NULL;
    if (need && cudaMalloc(&scr, need) != cudaSuccess) {
        *why = "cudaMalloc scratch";
        return LNORM_ECUDA;
    }
    if (scr)
        cudaMemset(scr, 0xff, need); /* partials are written before they are read */
    int rc = lnorm_cuda_run_bwd(&b, NULL, scr, need, why);
    if (cudaDeviceSynchronize() != cudaSuccess) {
        *why = cudaGetErrorString(cudaGetLastError());
        rc = LNORM_ECUDA;
    }
    cudaFree(scr);
    return rc;
}

/* ---- the check ---------------------------------------------------------- */

static double dtype_tol(int dt)
{
    return dt == LNORM_DTYPE_F32 ? 5e-5 : dt == LNORM_DTYPE_F16 ? 2e-3 : 1.6e-2;
}

/* Compare c's outputs with the float64 reference; label names the case. */
static void check_case(const bcase *c, const char *label)
{
    const lnorm_bwd_segment *s = &c->s;
    const int64_t H = s->hidden;
    const int ln = s->op == LNORM_OP_LAYERNORM;
    double *dg = calloc((size_t)H, sizeof *dg), *db = calloc((size_t)H, sizeof *db);
    double *dga = calloc((size_t)H, sizeof *dga), *dba = calloc((size_t)H, sizeof *dba); /* sums of |terms| */
    double *dgx = calloc((size_t)H, sizeof *dgx); /* sums of |dy| (1 + |mean| rstd): xhat's own error */
    double *g = xmalloc((size_t)H * sizeof *g), *xh = xmalloc((size_t)H * sizeof *xh);
    double e2 = 0.0, r2 = 0.0;
    long bad = 0, nan_rows = 0;
    const double tol = dtype_tol(s->dx_dtype);
    for (int64_t r = 0; r < s->rows; r++) {
        double m, v;
        ref_stats(c, r, &m, &v);
        const double sigma = sqrt(v);
        double rstd = ref_rstd(v, s);
        if (c->rstd)
            rstd = c->rstd[r];
        if (c->mean)
            m = c->mean[r];
        double a = 0.0, b = 0.0;
        for (int64_t k = 0; k < H; k++) {
            const double x = ld_el(c->x, s->x_dtype, (size_t)(r * s->x_stride + k));
            const double dy = ld_el(c->dy, s->dy_dtype, (size_t)(r * s->dy_stride + k));
            const double gm = c->gamma ? ld_el(c->gamma, s->param_dtype, (size_t)k) : 1.0;
            xh[k] = (x - (ln ? m : 0.0)) * rstd;
            g[k] = dy * gm;
            a += g[k];
            b += g[k] * xh[k];
            dg[k] += dy * xh[k];
            db[k] += dy;
            dga[k] += fabs(dy * xh[k]);
            dba[k] += fabs(dy);
            dgx[k] += fabs(dy) * (1.0 + (ln ? fabs(m) * rstd : 0.0));
        }
        double mb = b / (double)H;
        if (s->eps_mode == LNORM_EPS_OUTSIDE)
            mb = sigma == 0.0 ? 0.0 : mb / (sigma * rstd);
        const double ma = ln ? a / (double)H : 0.0;
        const int nan_row = isnan(a) || isnan(b) || isnan(rstd);
        nan_rows += nan_row;
        /* scale of the row's terms: rstd * (|g| + |g - ma| + |xhat| * |mb|) */
        double scale = 0.0;
        for (int64_t k = 0; k < H; k++) {
            const double t = rstd * (fabs(g[k]) + fabs(ma) + fabs(xh[k] * mb));
            if (t > scale)
                scale = t;
        }
        for (int64_t k = 0; k < H; k++) {
            double ref = rstd * (g[k] - ma - xh[k] * mb);
            double sc = scale;
            if (c->dres) {
                const double dr = ld_el(c->dres, s->x_dtype, (size_t)(r * s->dres_stride + k));
                ref += dr;
                sc += fabs(dr);
            }
            const double got = ld_el(c->dx, s->dx_dtype, (size_t)(r * s->dx_stride + k));
            if (nan_row) {
                if (!isnan(got) && bad++ < 3)
                    CHECK_FAIL("%s: row %lld col %lld: dx %g in a NaN row", label, (long long)r, (long long)k, got);
                continue;
            }
            /* past the dtype's range (f16 above 65504: eps outside the sqrt
             * makes a constant row's rstd 1 / eps), dx rounds to +-Inf */
            const double rounded = ld_el_round(ref, s->dx_dtype);
            if (isinf(rounded)) {
                if (!(got == rounded) && bad++ < 3)
                    CHECK_FAIL("%s: row %lld col %lld: dx %g, reference %g rounds to %g", label, (long long)r,
                               (long long)k, got, ref, rounded);
                continue;
            }
            if (!(fabs(got - ref) <= tol * sc + 1e-300) && bad++ < 3)
                CHECK_FAIL("%s: row %lld col %lld: dx %.9g, reference %.9g (scale %.3g)", label, (long long)r,
                           (long long)k, got, ref, sc);
            e2 += (got - ref) * (got - ref);
            r2 += ref * ref;
        }
        /* padding untouched (still the poison's all-ones bytes) */
        if (r + 1 < s->rows)
            for (int64_t k = H; k < s->dx_stride; k++) {
                const size_t os = lnorm_dtype_size(s->dx_dtype);
                const unsigned char *q = (const unsigned char *)c->dx + (size_t)(r * s->dx_stride + k) * os;
                for (size_t i = 0; i < os; i++)
                    if (q[i] != 0xff && bad++ < 3)
                        CHECK_FAIL("%s: row %lld: padding column %lld written", label, (long long)r, (long long)k);
            }
    }
    if (r2 > 0.0 && !(sqrt(e2 / r2) <= tol))
        CHECK_FAIL("%s: ||dx - ref|| / ||ref|| = %.3g > %.3g", label, sqrt(e2 / r2), tol);
    /* dgamma / dbeta: fp32 sums of one fp32 term a row, in any fixed
     * order: within rows roundings of the sum of |terms|, plus the terms'
     * own error. xhat comes from fp32 statistics over the row, whose
     * error is absolute, not relative to xhat: about log2(H) roundings of
     * (|mean| + sigma) * rstd, so |dy| * (1 + |mean| * rstd) a row times
     * (32 + log2 H) units of 2^-24 (H200: 3e-7 seen at xhat near 0 with 4
     * rows of 131072-300000, where a bound relative to |dy * xhat| alone
     * was 1e-7). */
    for (int w = 0; w < 2; w++) {
        const float *got = w ? c->dbeta : c->dgamma;
        const double *ref = w ? db : dg, *ab = w ? dba : dga;
        if (!got)
            continue;
        for (int64_t k = 0; k < H; k++) {
            if (isnan(ref[k])) {
                if (!isnan(got[k]) && bad++ < 3)
                    CHECK_FAIL("%s: %s[%lld] = %g, reference NaN", label, w ? "dbeta" : "dgamma", (long long)k,
                               got[k]);
                continue;
            }
            double bound = ((double)s->rows + 64.0) * 0x1p-24 * ab[k] + 1e-300;
            if (!w)
                bound += (32.0 + log2((double)H)) * 0x1p-24 * dgx[k];
            if (!(fabs(got[k] - ref[k]) <= bound) && bad++ < 3)
                CHECK_FAIL("%s: %s[%lld] = %.9g, reference %.9g (bound %.3g)", label, w ? "dbeta" : "dgamma",
                           (long long)k, got[k], ref[k], bound);
        }
    }
    if (c->kind == ROWS_NAN)
        CHECK(nan_rows == 1, "%s: %ld NaN rows in the reference, 1 expected", label, nan_rows);
    free(dg);
    free(db);
    free(dga);
    free(dgx);
    free(dba);
    free(g);
    free(xh);
}

static void label_of(char *buf, size_t n, const bcase *c, int opt)
{
    const char *desc = "?";
    lnorm_cuda_bwd_tier(c->s.x_dtype, c->s.hidden, &desc);
    snprintf(buf, n, "%s x=%s dy=%s dx=%s H=%lld rows=%lld opt=0x%x kind=%d (%s)",
             c->s.op == LNORM_OP_LAYERNORM ? "ln" : "rms", lnorm_dtype_name(c->s.x_dtype),
             lnorm_dtype_name(c->s.dy_dtype), lnorm_dtype_name(c->s.dx_dtype), (long long)c->s.hidden,
             (long long)c->s.rows, opt, c->kind, desc);
}

/* Make, run (alone) and check one case; keep it (c) for the caller. */
static void one_case(bcase *c, int op, int xdt, int64_t rows, int64_t H, int opt, int kind)
{
    char label[200];
    bcase_make(c, op, xdt, rows, H, opt, kind);
    label_of(label, sizeof label, c, opt);
    dcase d;
    dcase_make(&d, c);
    const char *why = "";
    int rc = run_batch(&d.s, 1, &why);
    CHECK(rc == LNORM_OK, "%s: lnorm_cuda_run_bwd: %d (%s)", label, rc, why);
    if (rc == LNORM_OK) {
        CHECK(dcase_fetch(&d, c) == 0, "%s: fetch", label);
        check_case(c, label);
    }
    dcase_free(&d);
    g_cases++;
}

static const int64_t tier_h[] = {1, 3, 8, 63, 100, 256, 1000, 1024, 4097, 8192, 12000, 16384, 40000, 65536, 131072, 300000};
static const int dts[] = {LNORM_DTYPE_F32, LNORM_DTYPE_F16, LNORM_DTYPE_BF16};

static int64_t rows_for(int64_t H)
{
    int64_t r = ((int64_t)1 << 21) / H;
    return r < 3 ? 3 : r > 700 ? 700 : r;
}

/* Case i's options, rotating over every combination's parts: gamma none /
 * x dtype / f32, statistics given, eps outside, dres, dy f32, dx of another
 * dtype, padded strides, tensors shifted, no dgamma, no dbeta. */
static int rotating_opts(int i)
{
    int o = (i % 3 == 0) ? 0 : (i % 3 == 1) ? O_GAMMA : O_GAMMA | O_GF32;
    o |= (i / 3) % 2 ? O_STATS : 0;
    o |= (i / 2) % 2 ? O_OUT : 0;
    o |= (i % 5 == 1) ? O_DRES : 0;
    o |= (i % 7 == 2) ? O_DYF32 : 0;
    o |= (i % 7 == 4) ? O_DXOTH : 0;
    o |= (i % 4 == 3) ? O_PAD : 0;
    o |= (i % 6 == 5) ? O_OFF : 0;
    o |= (i % 11 == 7) ? O_NODG : 0;
    o |= (i % 13 == 8) ? O_NODB : 0;
    return o;
}

static void part_matrix(void)
{
    int n = 0;
    for (int op = 1; op <= 2; op++)
        for (int di = 0; di < 3; di++)
            for (size_t hi = 0; hi < sizeof tier_h / sizeof *tier_h; hi++) {
                const int64_t H = tier_h[hi];
                /* the fast form (gamma, statistics given), then rotating options */
                int opts[3] = {O_GAMMA | O_STATS, 0, 0};
                for (int k = 1; k < 3; k++)
                    opts[k] = rotating_opts(n++);
                for (int k = 0; k < 3; k++) {
                    bcase c;
                    one_case(&c, op, dts[di], rows_for(H), H, opts[k], ROWS_RANDOM);
                    bcase_free(&c);
                }
            }
}

static void part_edges(void)
{
    static const int64_t hs[] = {8, 100, 1024, 8192, 20000, 131072, 300000};
    for (int op = 1; op <= 2; op++)
        for (int di = 0; di < 3; di++)
            for (size_t hi = 0; hi < sizeof hs / sizeof *hs; hi++)
                for (int kind = ROWS_CONST; kind <= ROWS_NAN; kind++) {
                    if ((kind == ROWS_HUGE) && dts[di] == LNORM_DTYPE_F16)
                        continue; /* f16 holds no 4e19 */
                    if ((kind == ROWS_TINY) && dts[di] == LNORM_DTYPE_F16)
                        continue; /* nor 1e-24 */
                    for (int given = 0; given < 2; given++) {
                        const int64_t H = hs[hi];
                        bcase c;
                        int opt = O_GAMMA | (given ? O_STATS : 0) | ((hi + kind) % 2 ? O_OUT : 0);
                        one_case(&c, op, dts[di], H >= 100000 ? 4 : 40, H, opt, kind);
                        bcase_free(&c);
                    }
                }
}

/* The wide tier at sizes the register tiers hold ("bwd_wide"), down to
 * rows shorter than one thread's chunk, options rotating: its passes, the
 * statistics sweeps and the rescue at every length, not only past 131072. */
static void part_wide(void)
{
    static const int64_t hs[] = {1, 7, 100, 1000, 4097, 16384, 40000, 65536};
    CHECK(lnorm_cuda_set_tuning("bwd_wide", 1) == LNORM_OK, "bwd_wide");
    int n = 0;
    for (int op = 1; op <= 2; op++)
        for (int di = 0; di < 3; di++)
            for (size_t hi = 0; hi < sizeof hs / sizeof *hs; hi++)
                for (int k = 0; k < 3; k++) {
                    const int i = n++;
                    int o = k == 0 ? O_GAMMA | O_STATS : rotating_opts(i);
                    const int kind = k == 2 && hs[hi] > 1 ? ROWS_CONST + i % (ROWS_NAN - ROWS_CONST + 1) : ROWS_RANDOM;
                    if (kind != ROWS_RANDOM)
                        o &= ~O_DXOTH; /* a dx of 1e-20 has no f16 value */
                    if ((kind == ROWS_HUGE || kind == ROWS_TINY) && dts[di] == LNORM_DTYPE_F16)
                        continue; /* f16 holds neither */
                    bcase c;
                    one_case(&c, op, dts[di], hs[hi] >= 16384 ? 70 : 300, hs[hi], o, kind);
                    bcase_free(&c);
                }
    lnorm_cuda_set_tuning("defaults", 0);
}

/* Rows two at a time ("bwd_pair" 2: every dtype, every register tier's
 * fast form with the statistics given): odd and even row counts (a last
 * pair of one row), several rows a CTA below 512 threads a row, random and
 * edge rows. */
static void part_pair(void)
{
    static const int64_t hs[] = {8, 64, 256, 1024, 2048, 4096, 8192, 16384, 65536, 131072};
    static const int64_t rows[] = {1, 2, 37, 300};
    CHECK(lnorm_cuda_set_tuning("bwd_pair", 2) == LNORM_OK, "bwd_pair");
    int n = 0;
    for (int op = 1; op <= 2; op++)
        for (int di = 0; di < 3; di++)
            for (size_t hi = 0; hi < sizeof hs / sizeof *hs; hi++)
                for (int k = 0; k < 2; k++) {
                    const int i = n++;
                    const int o = O_STATS | (i % 3 ? O_GAMMA : 0) | (i % 3 == 2 ? O_GF32 : 0) |
                                  (i % 4 == 1 ? O_PAD : 0) | (i % 7 == 3 ? O_NODB : 0);
                    int kind = ROWS_RANDOM;
                    if (k == 1)
                        kind = ROWS_CONST + i % (ROWS_NAN - ROWS_CONST + 1);
                    if ((kind == ROWS_HUGE || kind == ROWS_TINY) && dts[di] == LNORM_DTYPE_F16)
                        kind = ROWS_RANDOM; /* f16 holds neither */
                    const int64_t r = hs[hi] >= 65536 ? rows[i % 3] : rows[i % 4];
                    bcase c;
                    one_case(&c, op, dts[di], r, hs[hi], o, kind);
                    bcase_free(&c);
                }
    lnorm_cuda_set_tuning("defaults", 0);
}

/* Bit-identical outputs: alone, in a batch of many segments, with the grid
 * cut to a few CTAs, with rows two at a time nowhere and everywhere. */
static int same_outputs(const bcase *a, const bcase *b)
{
    const size_t os = lnorm_dtype_size(a->s.dx_dtype);
    if (memcmp(a->dx, b->dx, (a->dx_n - 1) * os))
        return 0;
    if (a->dgamma && memcmp(a->dgamma, b->dgamma, (size_t)a->s.hidden * 4))
        return 0;
    if (a->dbeta && memcmp(a->dbeta, b->dbeta, (size_t)a->s.hidden * 4))
        return 0;
    return 1;
}

static void part_invariance(void)
{
    enum { NS = 24 };
    static const int64_t hs[] = {100, 1024, 4096, 8192, 12000, 40000, 131072, 300000};
    bcase alone[NS], again[NS];
    dcase dev[NS];
    lnorm_bwd_segment segs[NS];
    for (int i = 0; i < NS; i++) {
        const int64_t H = hs[i % 8];
        const int op = 1 + (i % 2), xdt = dts[(i / 2) % 3];
        int opt = O_GAMMA | ((i % 3) ? O_STATS : 0) | ((i % 5 == 2) ? O_PAD : 0) | ((i % 7 == 3) ? O_DRES : 0);
        one_case(&alone[i], op, xdt, H >= 100000 ? 9 : 300 + 37 * i, H, opt, ROWS_RANDOM);
        /* the same inputs again, outputs poisoned */
        again[i] = alone[i];
        again[i].dx = xmalloc(alone[i].dx_n * 4);
        again[i].dgamma = alone[i].dgamma ? xmalloc((size_t)H * 4) : NULL;
        again[i].dbeta = alone[i].dbeta ? xmalloc((size_t)H * 4) : NULL;
    }
    for (int round = 0; round < 5; round++) {
        /* 0: every segment in one batch; 1: the same with bwd_grid 3;
         * 2: alone with bwd_grid 1; 3, 4: in one batch with bwd_pair 0
         * and 2 (bwd_grid 2) */
        if (round >= 1 && round <= 2)
            CHECK(lnorm_cuda_set_tuning("bwd_grid", round == 1 ? 3 : 1) == LNORM_OK, "bwd_grid");
        if (round >= 3) {
            CHECK(lnorm_cuda_set_tuning("bwd_pair", round == 3 ? 0 : 2) == LNORM_OK, "bwd_pair");
            CHECK(lnorm_cuda_set_tuning("bwd_grid", round == 3 ? 0 : 2) == LNORM_OK, "bwd_grid");
        }
        for (int i = 0; i < NS; i++) {
            dcase_make(&dev[i], &again[i]);
            segs[i] = dev[i].s;
        }
        const char *why = "";
        int rc = LNORM_OK;
        if (round != 2) {
            lnorm_bwd_batch b = {segs, NS};
            CHECK(lnorm_cuda_bwd_launch_count(&b) >= 2, "launch count %d", lnorm_cuda_bwd_launch_count(&b));
            rc = run_batch(segs, NS, &why);
        } else {
            for (int i = 0; i < NS && rc == LNORM_OK; i++)
                rc = run_batch(&segs[i], 1, &why);
        }
        CHECK(rc == LNORM_OK, "invariance round %d: %d (%s)", round, rc, why);
        for (int i = 0; i < NS; i++) {
            char label[200];
            label_of(label, sizeof label, &again[i], 0);
            CHECK(dcase_fetch(&dev[i], &again[i]) == 0, "fetch");
            CHECK(same_outputs(&alone[i], &again[i]), "round %d: %s: outputs differ from the segment run alone",
                  round, label);
            dcase_free(&dev[i]);
        }
        lnorm_cuda_set_tuning("defaults", 0);
    }
    for (int i = 0; i < NS; i++) {
        free(again[i].dx);
        free(again[i].dgamma);
        free(again[i].dbeta);
        bcase_free(&alone[i]);
    }
}

static void part_bad_input(void)
{
    bcase c;
    bcase_make(&c, LNORM_OP_LAYERNORM, LNORM_DTYPE_BF16, 64, 1024, O_GAMMA | O_STATS, ROWS_RANDOM);
    dcase d;
    dcase_make(&d, &c);
    lnorm_bwd_batch b = {&d.s, 1};
    const char *why = NULL;
    const size_t need = lnorm_cuda_bwd_scratch_bytes(&b);
    CHECK(need > 0 && need != SIZE_MAX, "scratch bytes %zu", need);
    void *scr = NULL;
    cudaMalloc(&scr, need);
    CHECK_EQ_INT(lnorm_cuda_run_bwd(&b, NULL, scr, need - 1, &why), LNORM_EINVAL, "scratch one byte short");
    CHECK(why && strstr(why, "scratch"), "why: %s", why ? why : "(null)");
    CHECK_EQ_INT(lnorm_cuda_run_bwd(&b, NULL, NULL, need, &why), LNORM_EINVAL, "scratch NULL");
    lnorm_bwd_segment bad[6];
    for (int i = 0; i < 6; i++)
        bad[i] = d.s;
    bad[0].dx = NULL;
    bad[1].dy_stride = 5;
    bad[2].rstd = NULL; /* a LayerNorm mean without rstd */
    bad[3].op = LNORM_OP_RMSNORM; /* with a mean */
    bad[4].eps = -1.0f;
    bad[5].param_dtype = LNORM_DTYPE_F16; /* neither f32 nor x's */
    for (int i = 0; i < 6; i++) {
        lnorm_bwd_batch bb = {&bad[i], 1};
        why = NULL;
        CHECK_EQ_INT(lnorm_cuda_run_bwd(&bb, NULL, scr, need, &why), LNORM_EINVAL, "bad segment %d", i);
        CHECK(why != NULL, "bad segment %d: no reason", i);
        CHECK(lnorm_cuda_bwd_scratch_bytes(&bb) == SIZE_MAX, "bad segment %d: scratch bytes", i);
    }
    /* a batch with one bad segment runs nothing */
    lnorm_bwd_segment two[2] = {d.s, bad[0]};
    lnorm_bwd_batch b2 = {two, 2};
    CHECK_EQ_INT(lnorm_cuda_run_bwd(&b2, NULL, scr, need, &why), LNORM_EINVAL, "batch with a bad segment");
    cudaDeviceSynchronize();
    CHECK(dcase_fetch(&d, &c) == 0, "fetch");
    long written = 0;
    const uint16_t *dx = c.dx;
    for (size_t i = 0; i < c.dx_n - 1; i++)
        written += dx[i] != 0xffffu;
    CHECK(written == 0, "%ld dx elements written by refused calls", written);
    cudaFree(scr);
    dcase_free(&d);
    bcase_free(&c);
}

int main(int argc, char **argv)
{
    int pair_only = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--pair")) {
            pair_only = 1;
        } else {
            fprintf(stderr, "usage: test_gpu_bwd [--pair]\n");
            return 2;
        }
    }
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev < 1) {
        fprintf(stderr, "FAIL: no usable CUDA device\n");
        return 1;
    }
    const uint64_t seed = lnorm_test_seed(0xb4c0ffeeULL);
    lnorm_rng_seed(&g_rng, seed);
    if (pair_only) {
        part_pair();
        printf("rows two at a time: %ld cases\n", g_cases);
        return check_finish("gpu.bwd --pair");
    }
    part_matrix();
    printf("matrix: %ld cases\n", g_cases);
    fflush(stdout);
    part_edges();
    printf("edges: %ld cases in all\n", g_cases);
    fflush(stdout);
    part_wide();
    printf("wide tier throughout: %ld cases in all\n", g_cases);
    fflush(stdout);
    part_pair();
    printf("rows two at a time throughout: %ld cases in all\n", g_cases);
    fflush(stdout);
    part_invariance();
    printf("invariance: done (%ld cases in all)\n", g_cases);
    part_bad_input();
    return check_finish("gpu.bwd");
}
