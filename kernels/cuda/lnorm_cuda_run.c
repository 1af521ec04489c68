/* Host side of the CUDA backend: validation, tier choice, grouping of a
 * batch by (x dtype, tier, fast variant), the segment table upload and the
 * launches. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "lnorm_cuda.h"
#include "lnorm_cuda_bwd_impl.h"
#include "lnorm_cuda_impl.h"

struct lnorm_cuda_ws {
    lnorm__kseg *host;   /* pinned staging */
    lnorm__kseg *dev;    /* device copy */
    size_t cap;          /* segments */
    cudaEvent_t copied;  /* recorded after the last upload from host */
    int pending;         /* an upload was recorded and not yet waited for */
    unsigned int *sched; /* device: the dynamic-tile counters (kparams.sched), zero between launches */
    lnorm__rescue *rescue; /* device: the fast launches' rescue list (kparams.rescue), empty between launches */
};

/* One tier's shape: TPR threads per row, NCH 16-byte chunks per thread, CL
 * CTAs per row, cap = TPR * NCH * CL chunks (0 for the streaming tier). */
typedef struct lnorm__tier_shape {
    int64_t cap;
    int tpr, nch, cl;
    const char *desc;
} lnorm__tier_shape;

/* The tiers, [0] for 16-bit x (LNORM__TIERS), [1] for f32 x
 * (LNORM__TIERS_F32); the streaming tier last. */
static const lnorm__tier_shape lnorm__tiers[2][LNORM__NREG_TIERS + 1] = {
#define LNORM__SHAPE(i, tpr, nch, cl) {(int64_t)(tpr) * (nch) * (cl), (tpr), (nch), (cl), "reg" #tpr "x" #nch "cl" #cl},
    {LNORM__TIERS(LNORM__SHAPE){0, 0, 0, 0, "stream1024"}},
    {LNORM__TIERS_F32(LNORM__SHAPE){0, 0, 0, 0, "stream1024"}},
#undef LNORM__SHAPE
};

/* The shape of tier `tier` for x of this dtype. */
static const lnorm__tier_shape *lnorm__shape(int x_dtype, int tier)
{
    return &lnorm__tiers[x_dtype == LNORM_DTYPE_F32][tier];
}

int lnorm_cuda_tier(int x_dtype, int64_t hidden, const char **desc)
{
    if (!lnorm_dtype_size(x_dtype) || hidden < 1)
        return -1;
    const int64_t vec = 16 / (int64_t)lnorm_dtype_size(x_dtype);
    const int64_t chunks = (hidden + vec - 1) / vec;
    int t = LNORM__NREG_TIERS;
    for (int i = 0; i < LNORM__NREG_TIERS; i++)
        if (chunks <= lnorm__shape(x_dtype, i)->cap) {
            t = i;
            break;
        }
    if (desc)
        *desc = lnorm__shape(x_dtype, t)->desc;
    return t;
}

/* The forms' initial settings ("defaults" restores them). */
#define LNORM__INIT_BULK 1
#define LNORM__INIT_FAST_ALIGNED 1
#define LNORM__INIT_FAST_REREAD 1
int lnorm__fast_enabled = 1;
int lnorm__bulk_enabled = LNORM__INIT_BULK;
int lnorm__bulk_stages_override = 0;
int lnorm__bulk_ctas_override = 0;
int lnorm__fast_grid = 0;
int lnorm__fwd_grid = 0;
int lnorm__fast_aligned = LNORM__INIT_FAST_ALIGNED;
int lnorm__fast_reread = LNORM__INIT_FAST_REREAD;
int lnorm__bwd_grid = 0; /* lnorm_cuda_bwd_impl.h */
int64_t lnorm__bwd_wide_min = 0; /* lnorm_cuda_bwd_impl.h */
int lnorm__bwd_pair = LNORM__INIT_BWD_PAIR; /* lnorm_cuda_bwd_impl.h */
long lnorm__al_launches = 0;
long lnorm__rr_launches = 0;
long lnorm__bulk_launches = 0;
long lnorm__bulk_fallbacks = 0;
long lnorm__dyn_launches = 0;

long lnorm_cuda_stat(const char *name)
{
    if (name && !strcmp(name, "bulk_launches"))
        return __atomic_load_n(&lnorm__bulk_launches, __ATOMIC_RELAXED);
    if (name && !strcmp(name, "bulk_fallbacks"))
        return __atomic_load_n(&lnorm__bulk_fallbacks, __ATOMIC_RELAXED);
    if (name && !strcmp(name, "dynamic_launches"))
        return __atomic_load_n(&lnorm__dyn_launches, __ATOMIC_RELAXED);
    if (name && !strcmp(name, "aligned_launches"))
        return __atomic_load_n(&lnorm__al_launches, __ATOMIC_RELAXED);
    if (name && !strcmp(name, "reread_launches"))
        return __atomic_load_n(&lnorm__rr_launches, __ATOMIC_RELAXED);
    return -1;
}

int lnorm_cuda_set_tuning(const char *name, int value)
{
    if (!name)
        return LNORM_EINVAL;
    if (!strcmp(name, "defaults") && value == 0) {
        lnorm__fast_enabled = 1;
        lnorm__bulk_enabled = LNORM__INIT_BULK;
        lnorm__bulk_stages_override = 0;
        lnorm__bulk_ctas_override = 0;
        lnorm__fast_grid = 0;
        lnorm__fwd_grid = 0;
        lnorm__fast_aligned = LNORM__INIT_FAST_ALIGNED;
        lnorm__fast_reread = LNORM__INIT_FAST_REREAD;
        lnorm__bwd_grid = 0;
        lnorm__bwd_wide_min = 0;
        lnorm__bwd_pair = LNORM__INIT_BWD_PAIR;
    } else if (!strcmp(name, "fast") && value >= 0 && value <= 1)
        lnorm__fast_enabled = value;
    else if (!strcmp(name, "bulk") && value >= 0 && value <= 2)
        lnorm__bulk_enabled = value;
    else if (!strcmp(name, "bulk_stages") && value >= 0 && value <= 8)
        lnorm__bulk_stages_override = value;
    else if (!strcmp(name, "bulk_ctas") && value >= 0 && value <= 64)
        lnorm__bulk_ctas_override = value;
    else if (!strcmp(name, "fast_grid") && value >= 0 && value <= 2)
        lnorm__fast_grid = value;
    else if (!strcmp(name, "fwd_grid") && value >= 0)
        lnorm__fwd_grid = value;
    else if (!strcmp(name, "fast_aligned") && value >= 0 && value <= 2)
        lnorm__fast_aligned = value;
    else if (!strcmp(name, "fast_reread") && value >= 0 && value <= 2)
        lnorm__fast_reread = value;
    else if (!strcmp(name, "bwd_grid") && value >= 0)
        lnorm__bwd_grid = value;
    else if (!strcmp(name, "bwd_wide") && value >= 0)
        lnorm__bwd_wide_min = value;
    else if (!strcmp(name, "bwd_pair") && value >= 0 && value <= 2)
        lnorm__bwd_pair = value;
    else
        return LNORM_EINVAL;
    return LNORM_OK;
}

/* Whether every row of a segment can be brought in by bulk copies: rows
 * start 16-byte aligned and are a whole number of 16-byte units long. */
static int lnorm__bulk_ok(const lnorm_segment *s)
{
    const size_t xs = lnorm_dtype_size(s->x_dtype);
    return ((uintptr_t)s->x % 16) == 0 && ((size_t)s->x_stride * xs) % 16 == 0 && ((size_t)s->hidden * xs) % 16 == 0;
}

/* Whether a segment qualifies for k_fast's straight-line form: its x rows
 * as for the bulk copies, and y, gamma and beta 16-byte aligned with a y
 * stride of whole 16-byte units (parameters of f32 are then whole units
 * too), so every chunk of a row is either inside it or past its end. */
static int lnorm__al_ok(const lnorm_segment *s)
{
    const size_t xs = lnorm_dtype_size(s->x_dtype);
    return lnorm__bulk_ok(s) && ((uintptr_t)s->y % 16) == 0 && ((size_t)s->y_stride * xs) % 16 == 0 &&
           ((uintptr_t)s->gamma % 16) == 0 && ((uintptr_t)s->beta % 16) == 0;
}

/* Where k_fast's straight-line form is taken when "fast_aligned" is 1:
 * every op and dtype but RMSNorm with 16-bit x (bf16 LayerNorm +11-17%,
 * f32 within 1% either way, bf16 RMSNorm 2% slower; H200). */
static int lnorm__al_pays(const lnorm_segment *s)
{
    if (s->x_dtype == LNORM_DTYPE_F32)
        return 1;
    return s->op == LNORM_OP_LAYERNORM;
}

/* Where the bulk kernels beat k_fast (bit-identical either way; H200):
 * every tier whose bulk kernel reads the row from shared memory (SMR: the
 * cluster tiers, where k_fast has no form and the bulk kernel runs at
 * 1.4-1.8x the general one, and the one-CTA tier 10: bf16 LayerNorm
 * H = 32768 +24% over k_fast), and LayerNorm with 16-bit x in the 4-chunk
 * tiers up to 512 threads a row (+3-15%). Not for f32 x (k_fast 9%
 * faster) nor RMSNorm (k_fast 3-13% faster). */
static int lnorm__bulk_pays(const lnorm_segment *s, int tier)
{
    const lnorm__tier_shape *t = lnorm__shape(s->x_dtype, tier);
    if (LNORM__SMR(t->tpr, t->cl))
        return 1;
    if (t->nch != 4 || s->op != LNORM_OP_LAYERNORM || s->x_dtype == LNORM_DTYPE_F32)
        return 0;
    return t->tpr <= 512;
}

/* Whether the fast kernels may take a segment: they leave the rows that
 * need the rescue to the general kernel (lnorm__rescue), which reads them
 * again from x after the fast kernel has written y, so y's memory must not
 * overlap x's. Else the general kernel, with the same bits. */
static int lnorm__rescue_ok(const lnorm_segment *s)
{
    const size_t ys = lnorm_dtype_size(s->y_dtype), xs = lnorm_dtype_size(s->x_dtype);
    if (s->rows <= 0)
        return 1;
    const uintptr_t x0 = (uintptr_t)s->x, y0 = (uintptr_t)s->y;
    const uintptr_t x1 = x0 + ((size_t)(s->rows - 1) * (size_t)s->x_stride + (size_t)s->hidden) * xs;
    const uintptr_t y1 = y0 + ((size_t)(s->rows - 1) * (size_t)s->y_stride + (size_t)s->hidden) * ys;
    return y1 <= x0 || x1 <= y0;
}

/* The fast-path variant of a segment (LNORM__FAST_*, plus LNORM__FAST_BULK
 * when its rows can be bulk-copied), from the segment alone (never from its
 * batch companions, so a row takes the same path alone or in any batch; the
 * paths give the same bits anyway): y dtype = x dtype, no residual,
 * parameters of x's dtype or f32 (or none). Cluster tiers have a fast
 * kernel only in its bulk form. */
static int lnorm__fast_variant(const lnorm_segment *s, int tier)
{
    if (tier < 0 || tier >= LNORM__NREG_TIERS || !lnorm__fast_enabled)
        return LNORM__FAST_NONE;
    if (s->y_dtype != s->x_dtype || s->residual)
        return LNORM__FAST_NONE;
    if (!lnorm__rescue_ok(s))
        return LNORM__FAST_NONE;
    const int rms = s->op == LNORM_OP_RMSNORM;
    const int has_param = s->gamma || s->beta;
    int v;
    if (!has_param || s->param_dtype == s->x_dtype)
        v = rms ? LNORM__FAST_RMS : LNORM__FAST_LN;
    else if (s->param_dtype == LNORM_DTYPE_F32)
        v = rms ? LNORM__FAST_RMS_PF32 : LNORM__FAST_LN_PF32;
    else
        return LNORM__FAST_NONE;
    if (lnorm__bulk_enabled == 2 && lnorm__bulk_ok(s))
        return v | LNORM__FAST_BULK;
    const lnorm__tier_shape *sh = lnorm__shape(s->x_dtype, tier);
    const int cl = sh->cl;
    /* k_fast's AL form where it pays, and where its re-read form (RR) is
     * chosen for the segment; the one-CTA SMR tier (1024 threads a row)
     * takes it only for RR, instead of the bulk kernel (otherwise the SMR
     * tiers take the bulk form where rows allow). */
    if (cl == 1 && lnorm__fast_aligned && lnorm__al_ok(s)) {
        const int rr = lnorm__rr_use(s->op == LNORM_OP_RMSNORM, sh->tpr);
        if (LNORM__SMR(sh->tpr, cl) ? rr : (lnorm__fast_aligned == 2 || lnorm__al_pays(s) || rr))
            return v | LNORM__FAST_AL;
    }
    if (lnorm__bulk_enabled && lnorm__bulk_ok(s) && lnorm__bulk_pays(s, tier))
        return v | LNORM__FAST_BULK;
    return cl == 1 ? v : LNORM__FAST_NONE;
}

int lnorm_cuda_plain_io(const lnorm_segment *s)
{
    if (!s || lnorm_segment_validate(s, NULL) != LNORM_OK)
        return 0;
    const int tier = lnorm_cuda_tier(s->x_dtype, s->hidden, NULL);
    if (tier < 0 || tier >= LNORM__NREG_TIERS)
        return 0; /* the streaming tier: kept to device memory */
    return !(lnorm__fast_variant(s, tier) & LNORM__FAST_BULK);
}

/* Index (0 .. 3 * LNORM__NFAST - 1) of a fast value in a group key (BULK
 * and AL never come together), and back. */
static int lnorm__fast_index(int fast)
{
    return (fast & LNORM__FAST_VMASK) + ((fast & LNORM__FAST_BULK) ? LNORM__NFAST : 0) +
           ((fast & LNORM__FAST_AL) ? 2 * LNORM__NFAST : 0);
}

static int lnorm__fast_of_key(int key)
{
    const int i = key % (3 * LNORM__NFAST);
    static const int flag[3] = {0, LNORM__FAST_BULK, LNORM__FAST_AL};
    return (i % LNORM__NFAST) | flag[i / LNORM__NFAST];
}

/* Group key of a segment: x dtype (1..3), tier and fast variant. */
static int lnorm__group_key(const lnorm_segment *s)
{
    const int tier = lnorm_cuda_tier(s->x_dtype, s->hidden, NULL);
    return ((s->x_dtype - 1) * (LNORM__NREG_TIERS + 1) + tier) * (3 * LNORM__NFAST) +
           lnorm__fast_index(lnorm__fast_variant(s, tier));
}

#define LNORM__NKEYS (3 * (LNORM__NREG_TIERS + 1) * 3 * LNORM__NFAST)

static void lnorm__to_kseg(lnorm__kseg *k, const lnorm_segment *s, int64_t row_begin)
{
    memset(k, 0, sizeof *k);
    k->x = s->x;
    k->res = s->residual;
    k->y = s->y;
    k->res_out = s->residual_out;
    k->gamma = s->gamma;
    k->beta = s->beta;
    k->mean = s->mean;
    k->rstd = s->rstd;
    k->x_stride = s->x_stride;
    k->y_stride = s->y_stride;
    k->res_stride = s->res_stride;
    k->res_out_stride = s->res_out_stride;
    k->hidden = s->hidden;
    k->row_begin = row_begin;
    k->eps = s->eps;
    k->op = s->op;
    k->y_dtype = s->y_dtype;
    k->param_dtype = s->param_dtype;
    k->eps_mode = s->eps_mode;
}

static int lnorm__launch(int x_dtype, int tier, const lnorm__kparams *p, void *stream)
{
    switch (x_dtype) {
    case LNORM_DTYPE_F32:
        return lnorm__cuda_launch_f32(tier, p, stream);
    case LNORM_DTYPE_F16:
        return lnorm__cuda_launch_f16(tier, p, stream);
    default:
        return lnorm__cuda_launch_bf16(tier, p, stream);
    }
}

static int lnorm__validate(const lnorm_batch *b, const char **why)
{
    if (!b || (b->nsegs && !b->segs)) {
        if (why)
            *why = "batch: NULL";
        return LNORM_EINVAL;
    }
    for (size_t i = 0; i < b->nsegs; i++) {
        int rc = lnorm_segment_validate(&b->segs[i], why);
        if (rc)
            return rc;
    }
    return LNORM_OK;
}

int lnorm_cuda_launch_count(const lnorm_batch *b)
{
    if (lnorm__validate(b, NULL))
        return -1;
    unsigned char seen[LNORM__NKEYS] = {0};
    int n = 0;
    for (size_t i = 0; i < b->nsegs; i++) {
        int k = lnorm__group_key(&b->segs[i]);
        if (!seen[k]) {
            seen[k] = 1;
            n++;
        }
    }
    return n;
}

/* The dynamic-tile counters a launch of total_rows rows may use: the
 * workspace's, unless there is none, and rows stay far below the counter's
 * 2^32 (a launch takes at most total_rows + 10 tickets a CTA: stages + 2). */
static unsigned int *lnorm__sched(const lnorm_cuda_ws *ws, int64_t total_rows)
{
    if (!ws || total_rows > (int64_t)1 << 30)
        return NULL;
    return ws->sched;
}

/* The fast variant of a launch of total_rows rows whose segments' variant
 * is `fast`: none (the general kernel, same bits) past 2^32 - 1 rows, where
 * the rescue list's 32-bit count could wrap (each row is counted at most
 * once). */
static int lnorm__fast_for_rows(int fast, int64_t total_rows)
{
    return total_rows > (int64_t)UINT32_MAX ? LNORM__FAST_NONE : fast;
}

/* The memory pool of this device from which launches without a workspace
 * take their rescue lists: this library's own, keeping its memory (release
 * threshold: all of it), so that a list costs no new mapping of memory
 * after the first (the device's default pool gives its memory back at
 * every synchronization: test_gpu, whose launches are each synchronized,
 * ran past 280 s on it and in 309 s on this pool, H200). Created once per
 * device; NULL if it cannot be. */
static cudaMemPool_t lnorm__pools[64];

static cudaMemPool_t lnorm__rescue_pool(void)
{
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) {
        (void)cudaGetLastError();
        return NULL;
    }
    cudaMemPool_t p = __atomic_load_n(&lnorm__pools[dev], __ATOMIC_ACQUIRE);
    if (p)
        return p;
    struct cudaMemPoolProps pr;
    memset(&pr, 0, sizeof pr);
    pr.allocType = cudaMemAllocationTypePinned;
    pr.location.type = cudaMemLocationTypeDevice;
    pr.location.id = dev;
    if (cudaMemPoolCreate(&p, &pr) != cudaSuccess) {
        (void)cudaGetLastError();
        return NULL;
    }
    uint64_t keep = UINT64_MAX;
    if (cudaMemPoolSetAttribute(p, cudaMemPoolAttrReleaseThreshold, &keep) != cudaSuccess)
        (void)cudaGetLastError();
    cudaMemPool_t none = NULL;
    if (!__atomic_compare_exchange_n(&lnorm__pools[dev], &none, p, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
        cudaMemPoolDestroy(p); /* another thread's pool won */
        p = none;
    }
    return p;
}

/* Validate and launch one segment; ws may be NULL (no dynamic tiles, and
 * for a fast launch a rescue list of lnorm__rescue_pool, given back after
 * the launch: where none can be had, the general kernel, with the same
 * bits). */
static int lnorm__run_one(const lnorm_segment *s, void *stream, lnorm_cuda_ws *ws, const char **why)
{
    int rc = lnorm_segment_validate(s, why);
    if (rc)
        return rc;
    lnorm__kparams p;
    memset(&p, 0, sizeof p);
    lnorm__to_kseg(&p.one, s, 0);
    p.total_rows = s->rows;
    p.nsegs = 1;
    p.sched = lnorm__sched(ws, s->rows);
    const int tier = lnorm_cuda_tier(s->x_dtype, s->hidden, NULL);
    p.fast = lnorm__fast_for_rows(lnorm__fast_variant(s, tier), s->rows);
    lnorm__rescue *own = NULL;
    if (ws) {
        p.rescue = ws->rescue;
    } else if (p.fast != LNORM__FAST_NONE) {
        cudaStream_t st = (cudaStream_t)stream;
        cudaMemPool_t pool = lnorm__rescue_pool();
        if (!pool || cudaMallocFromPoolAsync((void **)&own, sizeof *own, pool, st) != cudaSuccess) {
            own = NULL;
            (void)cudaGetLastError();
            p.fast = LNORM__FAST_NONE;
        } else if (cudaMemsetAsync(own, 0, 2 * sizeof(unsigned int), st) != cudaSuccess) {
            (void)cudaGetLastError();
            p.fast = LNORM__FAST_NONE;
        } else {
            p.rescue = own;
        }
    }
    int e = lnorm__launch(s->x_dtype, tier, &p, stream);
    if (own && cudaFreeAsync(own, (cudaStream_t)stream) != cudaSuccess && !e)
        e = (int)cudaGetLastError();
    if (e) {
        if (why)
            *why = cudaGetErrorString((cudaError_t)e);
        return LNORM_ECUDA;
    }
    return LNORM_OK;
}

int lnorm_cuda_run_segment(const lnorm_segment *s, void *stream, const char **why)
{
    return lnorm__run_one(s, stream, NULL, why);
}

int lnorm_cuda_ws_create(lnorm_cuda_ws **out, size_t max_segs)
{
    if (!out || max_segs == 0)
        return LNORM_EINVAL;
    lnorm_cuda_ws *ws = calloc(1, sizeof *ws);
    if (!ws)
        return LNORM_ENOMEM;
    ws->cap = max_segs;
    if (cudaMallocHost((void **)&ws->host, max_segs * sizeof(lnorm__kseg)) != cudaSuccess)
        goto fail;
    if (cudaMalloc((void **)&ws->dev, max_segs * sizeof(lnorm__kseg)) != cudaSuccess)
        goto fail;
    if (cudaMalloc((void **)&ws->sched, 2 * sizeof(unsigned int)) != cudaSuccess) {
        ws->sched = NULL;
        goto fail;
    }
    if (cudaMalloc((void **)&ws->rescue, sizeof *ws->rescue) != cudaSuccess) {
        ws->rescue = NULL;
        goto fail;
    }
    /* Zero before any launch may use them: the memsets run on the default
     * stream, which a non-blocking stream (lnormd's slots) does not wait
     * for, so wait for them here. */
    if (cudaMemset(ws->sched, 0, 2 * sizeof(unsigned int)) != cudaSuccess ||
        cudaMemset(ws->rescue, 0, 2 * sizeof(unsigned int)) != cudaSuccess || cudaStreamSynchronize(0) != cudaSuccess)
        goto fail;
    if (cudaEventCreateWithFlags(&ws->copied, cudaEventDisableTiming) != cudaSuccess) {
        ws->copied = NULL;
        goto fail;
    }
    *out = ws;
    return LNORM_OK;
fail:
    lnorm_cuda_ws_destroy(ws);
    return LNORM_ECUDA;
}

void lnorm_cuda_ws_destroy(lnorm_cuda_ws *ws)
{
    if (!ws)
        return;
    if (ws->copied) {
        if (ws->pending)
            cudaEventSynchronize(ws->copied);
        cudaEventDestroy(ws->copied);
    }
    if (ws->dev)
        cudaFree(ws->dev);
    if (ws->sched)
        cudaFree(ws->sched);
    if (ws->rescue)
        cudaFree(ws->rescue);
    if (ws->host)
        cudaFreeHost(ws->host);
    free(ws);
}

int lnorm_cuda_run(const lnorm_batch *b, void *stream, lnorm_cuda_ws *ws, const char **why)
{
    int rc = lnorm__validate(b, why);
    if (rc)
        return rc;
    if (b->nsegs == 0)
        return LNORM_OK;
    if (b->nsegs == 1)
        return lnorm__run_one(&b->segs[0], stream, ws, why);
    if (!ws) {
        if (why)
            *why = "ws: a workspace is required for more than one segment";
        return LNORM_EINVAL;
    }
    /* Order segments by group (counting sort, stable). */
    size_t *idx = malloc(b->nsegs * sizeof *idx);
    if (!idx)
        return LNORM_ENOMEM;
    size_t start[LNORM__NKEYS + 1] = {0};
    for (size_t i = 0; i < b->nsegs; i++)
        start[lnorm__group_key(&b->segs[i]) + 1]++;
    for (int k = 0; k < LNORM__NKEYS; k++)
        start[k + 1] += start[k];
    size_t fill[LNORM__NKEYS];
    memcpy(fill, start, sizeof fill);
    for (size_t i = 0; i < b->nsegs; i++)
        idx[fill[lnorm__group_key(&b->segs[i])]++] = i;

    /* Pieces of at most ws->cap table entries: stage, upload once, launch
     * each group of the piece. The staging buffer is reused only once the
     * previous upload from it has completed. */
    rc = LNORM_OK;
    int k = 0;
    size_t pos = 0; /* within group k */
    while (rc == LNORM_OK) {
        while (k < LNORM__NKEYS && pos >= start[k + 1] - start[k]) {
            k++;
            pos = 0;
        }
        if (k >= LNORM__NKEYS)
            break;
        if (ws->pending) {
            if (cudaEventSynchronize(ws->copied) != cudaSuccess) {
                rc = LNORM_ECUDA;
                if (why)
                    *why = "cudaEventSynchronize";
                break;
            }
            ws->pending = 0;
        }
        /* Collect groups (k, pos...) until the table is full. */
        size_t used = 0;
        int gk[LNORM__NKEYS];
        size_t gpos[LNORM__NKEYS], gn[LNORM__NKEYS], gslot[LNORM__NKEYS];
        int ng = 0;
        while (k < LNORM__NKEYS && used < ws->cap) {
            size_t left = start[k + 1] - start[k] - pos;
            if (left == 0) {
                k++;
                pos = 0;
                continue;
            }
            size_t take = left < ws->cap - used ? left : ws->cap - used;
            gk[ng] = k;
            gpos[ng] = pos;
            gn[ng] = take;
            gslot[ng] = used;
            ng++;
            if (take > 1)
                used += take;
            else
                gslot[ng - 1] = (size_t)-1; /* inline, no table entry */
            pos += take;
        }
        /* Stage the table entries (lnorm__run_group fills them) first, then
         * upload, then launch: do it in two passes. */
        int any_table = 0;
        for (int g = 0; g < ng; g++)
            if (gn[g] > 1) {
                const size_t *ix = idx + start[gk[g]] + gpos[g];
                int64_t rows = 0;
                for (size_t i = 0; i < gn[g]; i++) {
                    lnorm__to_kseg(&ws->host[gslot[g] + i], &b->segs[ix[i]], rows);
                    rows += b->segs[ix[i]].rows;
                }
                any_table = 1;
            }
        if (any_table) {
            if (cudaMemcpyAsync(ws->dev, ws->host, used * sizeof(lnorm__kseg), cudaMemcpyHostToDevice,
                                (cudaStream_t)stream) != cudaSuccess ||
                cudaEventRecord(ws->copied, (cudaStream_t)stream) != cudaSuccess) {
                rc = LNORM_ECUDA;
                if (why)
                    *why = "cudaMemcpyAsync (segment table)";
                break;
            }
            ws->pending = 1;
        }
        for (int g = 0; g < ng && rc == LNORM_OK; g++) {
            const size_t *ix = idx + start[gk[g]] + gpos[g];
            if (gn[g] == 1) {
                rc = lnorm__run_one(&b->segs[ix[0]], stream, ws, why);
            } else {
                const lnorm_segment *s0 = &b->segs[ix[0]];
                lnorm__kparams p;
                memset(&p, 0, sizeof p);
                p.table = ws->dev + gslot[g];
                p.nsegs = (int32_t)gn[g];
                for (size_t i = 0; i < gn[g]; i++)
                    p.total_rows += b->segs[ix[i]].rows;
                p.sched = lnorm__sched(ws, p.total_rows);
                p.rescue = ws->rescue;
                const int tier = lnorm_cuda_tier(s0->x_dtype, s0->hidden, NULL);
                /* The group's variant, from its key: the same for every
                 * segment of the group even if the settings changed
                 * since the batch was grouped. */
                p.fast = lnorm__fast_for_rows(lnorm__fast_of_key(gk[g]), p.total_rows);
                int e = lnorm__launch(s0->x_dtype, tier, &p, stream);
                if (e) {
                    rc = LNORM_ECUDA;
                    if (why)
                        *why = cudaGetErrorString((cudaError_t)e);
                }
            }
        }
    }
    free(idx);
    return rc;
}

int lnorm_cuda_norm(int op, int x_dtype, int y_dtype, int param_dtype, int64_t rows, int64_t hidden,
                    int64_t x_stride, int64_t y_stride, const void *x, void *y, const void *residual,
                    void *residual_out, const void *gamma, const void *beta, float *mean, float *rstd,
                    float eps, int eps_mode, void *stream, lnorm_cuda_ws *ws)
{
    lnorm_segment s;
    lnorm_segment_init(&s, (lnorm_op)op, (lnorm_dtype)x_dtype, rows, hidden);
    if (y_dtype)
        s.y_dtype = y_dtype;
    if (param_dtype)
        s.param_dtype = param_dtype;
    if (x_stride)
        s.x_stride = s.res_stride = s.res_out_stride = x_stride;
    if (y_stride)
        s.y_stride = y_stride;
    s.x = x;
    s.y = y;
    s.residual = residual;
    s.residual_out = residual_out;
    s.gamma = gamma;
    s.beta = beta;
    s.mean = mean;
    s.rstd = rstd;
    s.eps = eps;
    s.eps_mode = eps_mode;
    return lnorm__run_one(&s, stream, ws, NULL);
}
