/*
 * The CPU backward (lnorm_cpu_run_bwd, lnorm_core.h), scalar code, in two
 * passes over the pool:
 *  A. rows, split into tasks like the forward's: the row's statistics
 *     (given, or recomputed by the forward's own row kernel, statistics
 *     only), then over the row, xh' = (x - mean) * rstd, g = dy * gamma and
 *     the sums of g, g * xh', xh' and xh'^2 (blocked and compensated like
 *     the forward's sums), then dx. LayerNorm re-centres xhat:
 *     xhat = xh' - delta with delta = mean_c(xh'), 0 in exact arithmetic
 *     but it takes the fp32 rounding of a given mean (ulp(mean), large when
 *     mean >> spread) out of dx and dgamma. With eps outside the sqrt,
 *     sigma * rstd is the RMS of xhat over the row (sqrt(mean_c(xhat^2))).
 *     The row's mean, rstd and delta are kept for pass B.
 *  B. columns, in blocks of CBLOCK: dgamma[c] = sum of dy * xhat and
 *     dbeta[c] = sum of dy over rows 0, 1, ..., rows - 1 in that order,
 *     each a compensated (Kahan) fp32 sum, xhat recomputed exactly as in A.
 * The reduction order of dgamma/dbeta is thus a function of rows alone: the
 * bits of a segment do not depend on its batch, the tasks or the threads
 * (nor on the row kernel's ISA when mean and rstd are given).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "cpu_pool.h"
#include "cpu_rows.h"
#include "half.h"
#include "lnorm_core.h"

/* A pass-A task is a run of whole rows of about this many elements. */
#define TASK_ELEMS (32 * 1024)
/* Batches smaller than this many elements run on the caller's thread. */
#define SMALL_ELEMS (64 * 1024)
/* Columns per pass-B task. */
#define CBLOCK 256
/* Columns summed plainly before the block sum joins a compensated sum. */
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

static inline const char *row_of(const void *p, int64_t r, int64_t stride, int dt)
{
    return (const char *)p + (size_t)(r * stride) * lnorm_dtype_size(dt);
}

/* A compensated sum that keeps a plain one too: compensation turns an
 * infinite sum into NaN, the plain sum keeps it (as the forward's). */
typedef struct csum {
    float sum, comp, plain;
} csum;

static inline void csum_add(csum *a, float v)
{
    float y = v - a->comp;
    float t = a->sum + y;
    a->comp = (t - a->sum) - y;
    a->sum = t;
    a->plain += v;
}

static inline float csum_get(const csum *a)
{
    return isfinite(a->plain) ? a->sum : a->plain;
}

/* Per segment: its statistics and re-centring for pass B. */
typedef struct seg_state {
    const float *mean; /* LayerNorm: given or recomputed; NULL for RMSNorm */
    const float *rstd;
    float *delta;
} seg_state;

typedef struct bwd_job {
    const lnorm_bwd_batch *b;
    lnorm__cpu_rows_fn *fwd;
    seg_state *st;
    const int64_t *first; /* first task of each segment; first[nsegs] = total */
    const int64_t *per;   /* rows (pass A) or columns (pass B) per task */
} bwd_job;

/* The segment holding task t (binary search over first[]). */
static size_t seg_of(const bwd_job *j, int64_t t)
{
    size_t lo = 0, hi = j->b->nsegs;
    while (hi - lo > 1) {
        size_t mid = lo + (hi - lo) / 2;
        if (j->first[mid] <= t)
            lo = mid;
        else
            hi = mid;
    }
    return lo;
}

/* Pass A for one row. */
static void bwd_row(const lnorm_bwd_segment *s, const seg_state *ss, int64_t r)
{
    const int64_t H = s->hidden;
    const int ln = s->op == LNORM_OP_LAYERNORM, outside = s->eps_mode == LNORM_EPS_OUTSIDE;
    const char *x = row_of(s->x, r, s->x_stride, s->x_dtype);
    const char *dy = row_of(s->dy, r, s->dy_stride, s->dy_dtype);
    const float m = ln ? ss->mean[r] : 0.0f, rs = ss->rstd[r];
    const void *gam = s->gamma;
    const int xdt = s->x_dtype, ddt = s->dy_dtype, pdt = s->param_dtype;

    csum sg = {0}, sgx = {0}, sx = {0}, sxx = {0};
    for (int64_t c0 = 0; c0 < H; c0 += BLOCK) {
        const int64_t c1 = c0 + BLOCK < H ? c0 + BLOCK : H;
        float bg = 0.0f, bgx = 0.0f, bx = 0.0f, bxx = 0.0f;
        for (int64_t c = c0; c < c1; c++) {
            const float xh = (ld(x, c, xdt) - m) * rs;
            float g = ld(dy, c, ddt);
            if (gam)
                g *= ld(gam, c, pdt);
            bg += g;
            bgx += g * xh;
            bx += xh;
            bxx += xh * xh;
        }
        csum_add(&sg, bg);
        csum_add(&sgx, bgx);
        csum_add(&sx, bx);
        csum_add(&sxx, bxx);
    }
    const float fh = (float)H;
    const float delta = ln ? csum_get(&sx) / fh : 0.0f;
    const float mg = csum_get(&sg) / fh;
    /* mean_c(g * xhat) = mean_c(g * xh') - delta * mean_c(g). */
    float k = ln ? csum_get(&sgx) / fh - delta * mg : csum_get(&sgx) / fh;
    if (outside) {
        /* sigma * rstd: the RMS of xhat (mean_c(xh'^2) - delta^2). */
        float q = csum_get(&sxx) / fh - delta * delta;
        if (q < 0.0f)
            q = 0.0f;
        const float sr = sqrtf(q);
        k = sr == 0.0f ? 0.0f : k / sr; /* sigma = 0: every xhat is 0 */
    }
    const float mgl = ln ? mg : 0.0f;
    if (ss->delta)
        ss->delta[r] = delta;

    char *dx = (char *)s->dx + (size_t)(r * s->dx_stride) * lnorm_dtype_size(s->dx_dtype);
    const char *dres = s->dres ? row_of(s->dres, r, s->dres_stride, xdt) : NULL;
    for (int64_t c = 0; c < H; c++) {
        const float xh = (ld(x, c, xdt) - m) * rs - delta;
        float g = ld(dy, c, ddt);
        if (gam)
            g *= ld(gam, c, pdt);
        float v = rs * ((g - mgl) - xh * k);
        if (dres)
            v += ld(dres, c, xdt);
        st(dx, c, s->dx_dtype, v);
    }
}

static void task_rows(void *arg, int64_t t)
{
    const bwd_job *j = arg;
    const size_t i = seg_of(j, t);
    const lnorm_bwd_segment *s = &j->b->segs[i];
    const seg_state *ss = &j->st[i];
    int64_t r0 = (t - j->first[i]) * j->per[i], r1 = r0 + j->per[i];
    if (r1 > s->rows)
        r1 = s->rows;
    if (!s->rstd) {
        /* The forward's own row kernel, statistics only. */
        lnorm_segment fs;
        lnorm_segment_init(&fs, (lnorm_op)s->op, (lnorm_dtype)s->x_dtype, s->rows, s->hidden);
        fs.eps = s->eps;
        fs.eps_mode = s->eps_mode;
        fs.x = s->x;
        fs.x_stride = s->x_stride;
        fs.mean = (float *)ss->mean;
        fs.rstd = (float *)ss->rstd;
        j->fwd(&fs, r0, r1);
    }
    for (int64_t r = r0; r < r1; r++)
        bwd_row(s, ss, r);
}

/* Pass B for columns [c0, c1) of a segment. */
static void task_cols(void *arg, int64_t t)
{
    const bwd_job *j = arg;
    const size_t i = seg_of(j, t);
    const lnorm_bwd_segment *s = &j->b->segs[i];
    const seg_state *ss = &j->st[i];
    const int64_t c0 = (t - j->first[i]) * j->per[i];
    const int64_t n = c0 + j->per[i] > s->hidden ? s->hidden - c0 : j->per[i];
    const int ln = s->op == LNORM_OP_LAYERNORM;
    csum dg[CBLOCK] = {{0}}, db[CBLOCK] = {{0}};
    for (int64_t r = 0; r < s->rows; r++) {
        const char *x = row_of(s->x, r, s->x_stride, s->x_dtype) + (size_t)c0 * lnorm_dtype_size(s->x_dtype);
        const char *dy = row_of(s->dy, r, s->dy_stride, s->dy_dtype) + (size_t)c0 * lnorm_dtype_size(s->dy_dtype);
        const float m = ln ? ss->mean[r] : 0.0f, rs = ss->rstd[r], delta = ss->delta[r];
        for (int64_t c = 0; c < n; c++) {
            const float d = ld(dy, c, s->dy_dtype);
            if (s->dgamma)
                csum_add(&dg[c], d * ((ld(x, c, s->x_dtype) - m) * rs - delta));
            if (s->dbeta)
                csum_add(&db[c], d);
        }
    }
    for (int64_t c = 0; c < n; c++) {
        if (s->dgamma)
            s->dgamma[c0 + c] = csum_get(&dg[c]);
        if (s->dbeta)
            s->dbeta[c0 + c] = csum_get(&db[c]);
    }
}

static void run_tasks(lnorm__pool *pool, int serial, lnorm__pool_task_fn *fn, bwd_job *j, int64_t n)
{
    if (serial) {
        for (int64_t t = 0; t < n; t++)
            fn(j, t);
    } else {
        lnorm__pool_run(pool, fn, j, n);
    }
}

int lnorm_cpu_run_bwd(lnorm_cpu *cpu, const lnorm_bwd_batch *b, const char **why)
{
    if (!cpu || !b || (b->nsegs && !b->segs)) {
        if (why)
            *why = "batch: NULL";
        return LNORM_EINVAL;
    }
    if (!b->nsegs)
        return LNORM_OK;
    int64_t elems = 0;
    size_t floats = 0;
    for (size_t i = 0; i < b->nsegs; i++) {
        int err = lnorm_bwd_segment_validate(&b->segs[i], why);
        if (err)
            return err;
        int64_t e = b->segs[i].rows * b->segs[i].hidden;
        elems = elems > INT64_MAX - e ? INT64_MAX : elems + e;
        if ((uint64_t)b->segs[i].rows > (SIZE_MAX / sizeof(float) - floats) / 3) {
            if (why)
                *why = "batch: too many rows";
            return LNORM_ENOMEM;
        }
        floats += 3 * (size_t)b->segs[i].rows;
    }
    /* One allocation: per segment the recomputed mean / rstd and delta
     * (rows floats each, used as needed), then the task tables. */
    const size_t n = b->nsegs;
    size_t bytes = floats * sizeof(float) + n * sizeof(seg_state) + (3 * n + 1) * sizeof(int64_t) + 16;
    char *mem = malloc(bytes);
    if (!mem) {
        if (why)
            *why = "batch: out of memory for the backward's row statistics";
        return LNORM_ENOMEM;
    }
    int64_t *first = (int64_t *)mem, *per_rows = first + n + 1, *per_cols = per_rows + n;
    seg_state *st = (seg_state *)(per_cols + n);
    float *f = (float *)(st + n);
    for (size_t i = 0; i < n; i++) {
        const lnorm_bwd_segment *s = &b->segs[i];
        const int ln = s->op == LNORM_OP_LAYERNORM;
        st[i].mean = ln ? (s->mean ? s->mean : f) : NULL;
        st[i].rstd = s->rstd ? s->rstd : f + s->rows;
        st[i].delta = s->dgamma || s->dbeta ? f + 2 * s->rows : NULL;
        f += 3 * s->rows;
        int64_t per = TASK_ELEMS / s->hidden;
        per_rows[i] = per < 1 ? 1 : per;
        per_cols[i] = CBLOCK;
    }
    lnorm__pool *pool = lnorm__cpu_pool_of(cpu);
    const int serial = lnorm_cpu_threads(cpu) <= 1 || elems < SMALL_ELEMS;
    bwd_job j = {b, lnorm__cpu_rows_of(cpu), st, first, per_rows};
    /* Pass A: rows. */
    int64_t total = 0, total_cols = 0;
    for (size_t i = 0; i < n; i++) {
        first[i] = total;
        total += (b->segs[i].rows + per_rows[i] - 1) / per_rows[i];
    }
    first[n] = total;
    run_tasks(pool, serial, task_rows, &j, total);
    /* Pass B: column blocks of the segments that want dgamma or dbeta. */
    for (size_t i = 0; i < n; i++) {
        first[i] = total_cols;
        if (st[i].delta)
            total_cols += (b->segs[i].hidden + CBLOCK - 1) / CBLOCK;
    }
    first[n] = total_cols;
    j.per = per_cols;
    if (total_cols)
        run_tasks(pool, serial, task_cols, &j, total_cols);
    free(mem);
    return LNORM_OK;
}
