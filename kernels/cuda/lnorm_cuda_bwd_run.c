/* Host side of the CUDA backward pass: validation, tiers, row groups, the
 * scratch layout (segment table and dgamma/dbeta partials), the launches
 * (one per (x dtype, tier) group, then one reduction for the batch). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "lnorm_cuda.h"
#include "lnorm_cuda_bwd_impl.h"

#define LNORM__BWD_ALIGN 256 /* bytes; every scratch part starts aligned */
#define LNORM__BWD_NKEYS (3 * (LNORM__BWD_NTIERS + 1) * 2)

static size_t lnorm__bwd_align(size_t n)
{
    return (n + LNORM__BWD_ALIGN - 1) / LNORM__BWD_ALIGN * LNORM__BWD_ALIGN;
}

/* Threads a row (TPR) and CTAs a row (CL) of a register tier. */
static void lnorm__bwd_shape(int tier, int *tpr, int *cl)
{
    *tpr = tier < LNORM__BWD_CTA_TIERS ? 1 << tier : LNORM__BWD_TPR_MAX;
    *cl = tier < LNORM__BWD_CTA_TIERS ? 1 : 1 << (tier - LNORM__BWD_CTA_TIERS + 1);
}

int lnorm_cuda_bwd_tier(int x_dtype, int64_t hidden, const char **desc)
{
    static const char *const names[LNORM__BWD_NTIERS + 1] = {
        "bwd1cl1",   "bwd2cl1",   "bwd4cl1",   "bwd8cl1",    "bwd16cl1",     "bwd32cl1",
        "bwd64cl1",  "bwd128cl1", "bwd256cl1", "bwd512cl1",  "bwd512cl2",    "bwd512cl4",
        "bwd512cl8", "bwd512cl16", "bwdwide256cl8"};
    if (!lnorm_dtype_size(x_dtype) || hidden < 1)
        return -1;
    int t = LNORM__BWD_NTIERS;
    for (int i = 0; i < LNORM__BWD_NTIERS && !(lnorm__bwd_wide_min > 0 && hidden >= lnorm__bwd_wide_min); i++) {
        int tpr, cl;
        lnorm__bwd_shape(i, &tpr, &cl);
        if (hidden <= (int64_t)tpr * cl * LNORM__BWD_COLS) {
            t = i;
            break;
        }
    }
    if (desc)
        *desc = names[t];
    return t;
}

/* Rows a row group of a segment (rows, x dtype, hidden; its tier's CL CTAs
 * a row): G = 64, halved (down to 4) while the segment would have fewer
 * than 256 CTAs' worth of groups (ceil(rows / G) * CL). Why: every group
 * writes its partial dgamma and dbeta (8 bytes a column) and the reduction
 * reads them back, 16 / (3 * G * element bytes) of the main traffic (bf16:
 * 4% at G = 64, 8% at 32, 17% at 16), so groups want to be long; but a
 * group is one CTA's (cluster's) sequential work, so a segment of few rows
 * needs short groups to fill a GPU (256 CTAs: two per SM of a 132-SM H200;
 * a constant, never the device's SM count, so the grouping, and with it
 * the bits of dgamma/dbeta, is the same on every device). (512 CTAs' worth
 * in clusters of 8 and 16, fewer waves of 15 clusters on an H200: f32
 * +4-9%, bf16 RMSNorm +2-4%, LayerNorm -1-2%; not taken.) */
static int64_t lnorm__bwd_grows(const lnorm_bwd_segment *s)
{
    const int tier = lnorm_cuda_bwd_tier(s->x_dtype, s->hidden, NULL);
    int tpr = LNORM__BWD_WIDE_BLOCK, cl = LNORM__BWD_WIDE_CL;
    if (tier < LNORM__BWD_NTIERS)
        lnorm__bwd_shape(tier, &tpr, &cl);
    int64_t g = LNORM__BWD_GROWS_MAX;
    while (g > 4 && ((s->rows + g - 1) / g) * cl < 256)
        g >>= 1;
    return g;
}

static int64_t lnorm__bwd_ngroups(const lnorm_bwd_segment *s)
{
    const int64_t g = lnorm__bwd_grows(s);
    return (s->rows + g - 1) / g;
}

/* Bytes of one segment's partials (dgamma's and dbeta's, each aligned). */
static size_t lnorm__bwd_partial_bytes(const lnorm_bwd_segment *s)
{
    const size_t one = lnorm__bwd_align((size_t)lnorm__bwd_ngroups(s) * (size_t)s->hidden * sizeof(float));
    return (s->dgamma ? one : 0) + (s->dbeta ? one : 0);
}

static int lnorm__bwd_validate(const lnorm_bwd_batch *b, const char **why)
{
    if (!b || (b->nsegs && !b->segs)) {
        if (why)
            *why = "batch: NULL";
        return LNORM_EINVAL;
    }
    for (size_t i = 0; i < b->nsegs; i++) {
        int rc = lnorm_bwd_segment_validate(&b->segs[i], why);
        if (rc)
            return rc;
    }
    return LNORM_OK;
}

/* Table bytes: a device table only for batches of several segments. */
static size_t lnorm__bwd_table_bytes(const lnorm_bwd_batch *b)
{
    return b->nsegs > 1 ? lnorm__bwd_align(b->nsegs * sizeof(lnorm__bseg)) : 0;
}

size_t lnorm_cuda_bwd_scratch_bytes(const lnorm_bwd_batch *b)
{
    if (lnorm__bwd_validate(b, NULL))
        return SIZE_MAX;
    size_t n = lnorm__bwd_table_bytes(b);
    for (size_t i = 0; i < b->nsegs; i++)
        n += lnorm__bwd_partial_bytes(&b->segs[i]);
    return n;
}

/* Whether a segment takes the kernels' fast form: dy and dx of x's dtype,
 * no dres, and x and dy rows that start 16-byte aligned and are whole
 * 16-byte units long (copied into shared memory by cp.async, the next rows
 * in flight while one is reduced). Same arithmetic, same bits as the
 * general form. */
static int lnorm__bwd_fast_ok(const lnorm_bwd_segment *s)
{
    const size_t es = lnorm_dtype_size(s->x_dtype);
    if (s->dy_dtype != s->x_dtype || s->dx_dtype != s->x_dtype || s->dres)
        return 0;
    return ((uintptr_t)s->x % 16) == 0 && ((uintptr_t)s->dy % 16) == 0 && ((size_t)s->hidden * es) % 16 == 0 &&
           ((size_t)s->x_stride * es) % 16 == 0 && ((size_t)s->dy_stride * es) % 16 == 0;
}

/* Whether a segment's rows go two at a time (lnorm_cuda_bwd.cuh, k_bwd's
 * s->pair): the fast form in a register tier, with the statistics given
 * (rstd, and mean for LayerNorm) and eps inside the sqrt; by default for
 * 16-bit x only. Why: 16-bit rows wait on their reductions (half the bytes
 * an instruction of f32's), and two rows a reduction ran bf16 1.07-1.16x
 * faster from 8192 (512 threads a row, clusters) and 1.00-1.04x below;
 * f32 ran 0.93-1.01x, the second read of its larger stages costing more
 * than the barrier saved (H200). */
static int lnorm__bwd_pair_ok(const lnorm_bwd_segment *s)
{
    if (lnorm__bwd_pair == 0 || !lnorm__bwd_fast_ok(s) || !s->rstd || s->eps_mode != LNORM_EPS_INSIDE ||
        (s->op != LNORM_OP_RMSNORM && !s->mean))
        return 0;
    const int tier = lnorm_cuda_bwd_tier(s->x_dtype, s->hidden, NULL);
    if (tier >= LNORM__BWD_NTIERS)
        return 0;
    return lnorm__bwd_pair == 2 || s->x_dtype != LNORM_DTYPE_F32;
}

/* Launch group of a segment: x dtype, tier, form. */
static int lnorm__bwd_key(const lnorm_bwd_segment *s)
{
    return ((s->x_dtype - 1) * (LNORM__BWD_NTIERS + 1) + lnorm_cuda_bwd_tier(s->x_dtype, s->hidden, NULL)) * 2 +
           lnorm__bwd_fast_ok(s);
}

static void lnorm__to_bseg(lnorm__bseg *k, const lnorm_bwd_segment *s, int64_t group_begin, int64_t cblk_begin,
                           unsigned char **part)
{
    memset(k, 0, sizeof *k);
    k->x = s->x;
    k->dy = s->dy;
    k->dx = s->dx;
    k->dres = s->dres;
    k->gamma = s->gamma;
    k->mean = s->mean;
    k->rstd = s->rstd;
    k->dgamma = s->dgamma;
    k->dbeta = s->dbeta;
    k->x_stride = s->x_stride;
    k->dy_stride = s->dy_stride;
    k->dx_stride = s->dx_stride;
    k->dres_stride = s->dres_stride;
    k->hidden = s->hidden;
    k->rows = s->rows;
    k->group_begin = group_begin;
    k->cblk_begin = cblk_begin;
    k->grows = lnorm__bwd_grows(s);
    k->ngroups = lnorm__bwd_ngroups(s);
    k->eps = s->eps;
    k->op = s->op;
    k->dy_dtype = s->dy_dtype;
    k->dx_dtype = s->dx_dtype;
    k->param_dtype = s->param_dtype;
    k->eps_mode = s->eps_mode;
    k->pair = lnorm__bwd_pair_ok(s);
    const size_t one = lnorm__bwd_align((size_t)k->ngroups * (size_t)s->hidden * sizeof(float));
    if (s->dgamma) {
        k->pdg = (float *)*part;
        *part += one;
    }
    if (s->dbeta) {
        k->pdb = (float *)*part;
        *part += one;
    }
}

static int lnorm__bwd_launch(const lnorm_bwd_segment *s, const lnorm__bparams *p, void *stream)
{
    const int tier = lnorm_cuda_bwd_tier(s->x_dtype, s->hidden, NULL);
    const int fast = lnorm__bwd_fast_ok(s);
    switch (s->x_dtype) {
    case LNORM_DTYPE_F32:
        return lnorm__cuda_bwd_launch_f32(tier, fast, p, stream);
    case LNORM_DTYPE_F16:
        return lnorm__cuda_bwd_launch_f16(tier, fast, p, stream);
    default:
        return lnorm__cuda_bwd_launch_bf16(tier, fast, p, stream);
    }
}

static int lnorm__bwd_cuda_fail(int e, const char **why)
{
    if (why)
        *why = cudaGetErrorString((cudaError_t)e);
    return LNORM_ECUDA;
}

static int64_t lnorm__bwd_cblks(const lnorm_bwd_segment *s)
{
    return (s->dgamma || s->dbeta) ? (s->hidden + LNORM__BWD_RCOLS - 1) / LNORM__BWD_RCOLS : 0;
}

int lnorm_cuda_run_bwd(const lnorm_bwd_batch *b, void *stream, void *scratch, size_t scratch_bytes,
                       const char **why)
{
    int rc = lnorm__bwd_validate(b, why);
    if (rc)
        return rc;
    if (b->nsegs == 0)
        return LNORM_OK;
    const size_t need = lnorm_cuda_bwd_scratch_bytes(b);
    if (need > 0 && (!scratch || scratch_bytes < need || ((uintptr_t)scratch % 16) != 0)) {
        if (why)
            *why = "scratch: NULL, not 16-byte aligned or smaller than lnorm_cuda_bwd_scratch_bytes";
        return LNORM_EINVAL;
    }
    unsigned char *part = (unsigned char *)scratch + lnorm__bwd_table_bytes(b);
    lnorm__bparams p;
    memset(&p, 0, sizeof p);
    if (b->nsegs == 1) {
        const lnorm_bwd_segment *s = &b->segs[0];
        lnorm__to_bseg(&p.one, s, 0, 0, &part);
        p.nsegs = 1;
        p.total = p.one.ngroups;
        int e = lnorm__bwd_launch(s, &p, stream);
        if (e)
            return lnorm__bwd_cuda_fail(e, why);
        p.total = lnorm__bwd_cblks(s);
        if (p.total > 0 && (e = lnorm__cuda_bwd_reduce(&p, stream)) != 0)
            return lnorm__bwd_cuda_fail(e, why);
        return LNORM_OK;
    }
    /* Segments ordered by group key (counting sort, stable): the table
     * holds each launch's segments together, group_begin counted from the
     * launch's first, cblk_begin over the whole table. */
    size_t *idx = malloc(b->nsegs * sizeof *idx);
    lnorm__bseg *tab = malloc(b->nsegs * sizeof *tab);
    if (!idx || !tab) {
        free(idx);
        free(tab);
        return LNORM_ENOMEM;
    }
    size_t start[LNORM__BWD_NKEYS + 1] = {0};
    for (size_t i = 0; i < b->nsegs; i++)
        start[lnorm__bwd_key(&b->segs[i]) + 1]++;
    for (int k = 0; k < LNORM__BWD_NKEYS; k++)
        start[k + 1] += start[k];
    size_t fill[LNORM__BWD_NKEYS];
    memcpy(fill, start, sizeof fill);
    for (size_t i = 0; i < b->nsegs; i++)
        idx[fill[lnorm__bwd_key(&b->segs[i])]++] = i;
    int64_t cblk = 0;
    for (int k = 0; k < LNORM__BWD_NKEYS; k++) {
        int64_t grp = 0;
        for (size_t i = start[k]; i < start[k + 1]; i++) {
            const lnorm_bwd_segment *s = &b->segs[idx[i]];
            lnorm__to_bseg(&tab[i], s, grp, cblk, &part);
            grp += tab[i].ngroups;
            cblk += lnorm__bwd_cblks(s);
        }
    }
    /* The table travels in the scratch; from pageable memory, so tab may be
     * freed once the call returns. */
    lnorm__bseg *dtab = (lnorm__bseg *)scratch;
    if (cudaMemcpyAsync(dtab, tab, b->nsegs * sizeof *tab, cudaMemcpyHostToDevice, (cudaStream_t)stream) !=
        cudaSuccess) {
        rc = LNORM_ECUDA;
        if (why)
            *why = "cudaMemcpyAsync (backward segment table)";
    }
    for (int k = 0; k < LNORM__BWD_NKEYS && rc == LNORM_OK; k++) {
        if (start[k + 1] == start[k])
            continue;
        p.table = dtab + start[k];
        p.nsegs = (int32_t)(start[k + 1] - start[k]);
        p.total = 0;
        for (size_t i = start[k]; i < start[k + 1]; i++)
            p.total += tab[i].ngroups;
        const lnorm_bwd_segment *s0 = &b->segs[idx[start[k]]];
        int e = lnorm__bwd_launch(s0, &p, stream);
        if (e)
            rc = lnorm__bwd_cuda_fail(e, why);
    }
    if (rc == LNORM_OK && cblk > 0) {
        p.table = dtab;
        p.nsegs = (int32_t)b->nsegs;
        p.total = cblk;
        int e = lnorm__cuda_bwd_reduce(&p, stream);
        if (e)
            rc = lnorm__bwd_cuda_fail(e, why);
    }
    free(idx);
    free(tab);
    return rc;
}

int lnorm_cuda_bwd_launch_count(const lnorm_bwd_batch *b)
{
    if (lnorm__bwd_validate(b, NULL))
        return -1;
    unsigned char seen[LNORM__BWD_NKEYS] = {0};
    int n = 0, red = 0;
    for (size_t i = 0; i < b->nsegs; i++) {
        const int k = lnorm__bwd_key(&b->segs[i]);
        if (!seen[k]) {
            seen[k] = 1;
            n++;
        }
        if (lnorm__bwd_cblks(&b->segs[i]) > 0)
            red = 1;
    }
    return n + red;
}

int64_t lnorm_cuda_norm_bwd_scratch(int op, int x_dtype, int64_t rows, int64_t hidden, int dgamma, int dbeta)
{
    lnorm_bwd_segment s;
    lnorm_bwd_segment_init(&s, (lnorm_op)op, (lnorm_dtype)x_dtype, rows, hidden);
    s.x = s.dy = s.dx = (void *)&s; /* described, not read */
    s.dgamma = dgamma ? (float *)&s : NULL;
    s.dbeta = dbeta ? (float *)&s : NULL;
    lnorm_bwd_batch b = {&s, 1};
    const size_t n = lnorm_cuda_bwd_scratch_bytes(&b);
    return n == SIZE_MAX ? -1 : (int64_t)n;
}

int lnorm_cuda_norm_bwd(int op, int x_dtype, int dy_dtype, int dx_dtype, int param_dtype, int64_t rows,
                        int64_t hidden, int64_t x_stride, int64_t dy_stride, int64_t dx_stride, const void *x,
                        const void *dy, void *dx, const void *dres, const void *gamma, const float *mean,
                        const float *rstd, float *dgamma, float *dbeta, float eps, int eps_mode, void *stream,
                        void *scratch, size_t scratch_bytes)
{
    lnorm_bwd_segment s;
    lnorm_bwd_segment_init(&s, (lnorm_op)op, (lnorm_dtype)x_dtype, rows, hidden);
    if (dy_dtype)
        s.dy_dtype = dy_dtype;
    if (dx_dtype)
        s.dx_dtype = dx_dtype;
    if (param_dtype)
        s.param_dtype = param_dtype;
    if (x_stride)
        s.x_stride = s.dres_stride = x_stride;
    if (dy_stride)
        s.dy_stride = dy_stride;
    if (dx_stride)
        s.dx_stride = dx_stride;
    s.x = x;
    s.dy = dy;
    s.dx = dx;
    s.dres = dres;
    s.gamma = gamma;
    s.mean = mean;
    s.rstd = rstd;
    s.dgamma = dgamma;
    s.dbeta = dbeta;
    s.eps = eps;
    s.eps_mode = eps_mode;
    lnorm_bwd_batch b = {&s, 1};
    return lnorm_cuda_run_bwd(&b, stream, scratch, scratch_bytes, NULL);
}
