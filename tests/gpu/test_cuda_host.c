/*
 * gpu.cuda_host: the host side of the CUDA backend (kernels/cuda/
 * lnorm_cuda_run.c) without a GPU. The file is compiled into this test with
 * stand-ins for the few CUDA runtime calls it makes (host memory, copies
 * done at once) and for the three per-dtype launchers, which record what
 * they were asked to launch instead of launching it. Checked:
 *   - the tier table: every hidden size gets the first tier that holds it,
 *     its description names that tier, rows past the largest cluster stream;
 *   - the fast variant of a segment (kernel form) under every setting of
 *     the "bulk" and "fast_aligned" knobs: the straight-line form (AL) only
 *     for segments whose x, y, gamma, beta, strides and H are whole
 *     16-byte units (by default for every op and dtype but RMSNorm with
 *     16-bit x), never in
 *     a cluster tier or the 1024-thread one-CTA tier (their bulk kernels
 *     hold the row in shared memory: the bulk form by default), never
 *     together with the bulk form; the bulk form only
 *     for rows that start 16-byte aligned and are whole 16-byte units;
 *   - a batch: one launch per (dtype, tier, variant) group, each segment in
 *     exactly one launch, the table entries of a launch in its rows order,
 *     every segment of an AL or bulk launch qualifying for it (the launch's
 *     variant comes from its group key), under each "fast_aligned" setting;
 *   - the rescue list (lnorm__rescue): every fast launch has one, empty,
 *     the workspace's or (without one) its own from the stream's pool,
 *     given back after the launch; segments whose y overlaps x, and a fast
 *     launch the pool has no list for, take the general kernel.
 * The GPU tests (test_gpu) check the kernels themselves on a device.
 */
#include "check.h"
#include "lnorm_cuda_run.c"

#include <stdio.h>

/* ---- CUDA runtime stand-ins (the calls lnorm_cuda_run.c makes) ---- */

static int g_event;

cudaError_t cudaMalloc(void **p, size_t n)
{
    *p = malloc(n);
    if (*p)
        memset(*p, 0xa5, n); /* device memory is not zeroed */
    return *p ? cudaSuccess : cudaErrorMemoryAllocation;
}

cudaError_t cudaFree(void *p)
{
    free(p);
    return cudaSuccess;
}

cudaError_t cudaMemset(void *p, int v, size_t n)
{
    memset(p, v, n);
    return cudaSuccess;
}

static int g_synced; /* cudaStreamSynchronize calls */

cudaError_t cudaStreamSynchronize(cudaStream_t st)
{
    (void)st;
    g_synced++;
    return cudaSuccess;
}

cudaError_t cudaMallocHost(void **p, size_t n)
{
    return cudaMalloc(p, n);
}

cudaError_t cudaFreeHost(void *p)
{
    return cudaFree(p);
}

cudaError_t cudaMemcpyAsync(void *d, const void *s, size_t n, enum cudaMemcpyKind k, cudaStream_t st)
{
    (void)k;
    (void)st;
    memcpy(d, s, n);
    return cudaSuccess;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned int f)
{
    (void)f;
    *e = (cudaEvent_t)(void *)&g_event;
    return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s)
{
    (void)e;
    (void)s;
    return cudaSuccess;
}

cudaError_t cudaEventSynchronize(cudaEvent_t e)
{
    (void)e;
    return cudaSuccess;
}

cudaError_t cudaEventDestroy(cudaEvent_t e)
{
    (void)e;
    return cudaSuccess;
}

/* The library's memory pool (rescue lists of launches without a
 * workspace): pools created, allocations outstanding, and the next
 * allocation refused on demand. */
static int g_pools, g_pool_live, g_pool_refuse;
static int g_pool_obj;

cudaError_t cudaGetDevice(int *dev)
{
    *dev = 0;
    return cudaSuccess;
}

cudaError_t cudaMemPoolCreate(cudaMemPool_t *p, const struct cudaMemPoolProps *pr)
{
    (void)pr;
    g_pools++;
    *p = (cudaMemPool_t)(void *)&g_pool_obj;
    return cudaSuccess;
}

cudaError_t cudaMemPoolSetAttribute(cudaMemPool_t p, enum cudaMemPoolAttr a, void *v)
{
    (void)p;
    (void)a;
    (void)v;
    return cudaSuccess;
}

cudaError_t cudaMemPoolDestroy(cudaMemPool_t p)
{
    (void)p;
    g_pools--;
    return cudaSuccess;
}

cudaError_t cudaMallocFromPoolAsync(void **p, size_t n, cudaMemPool_t pool, cudaStream_t st)
{
    (void)st;
    (void)pool;
    if (g_pool_refuse) {
        g_pool_refuse = 0;
        return cudaErrorMemoryAllocation;
    }
    cudaError_t e = cudaMalloc(p, n);
    g_pool_live += e == cudaSuccess;
    return e;
}

cudaError_t cudaFreeAsync(void *p, cudaStream_t st)
{
    (void)st;
    g_pool_live--;
    return cudaFree(p);
}

cudaError_t cudaMemsetAsync(void *p, int v, size_t n, cudaStream_t st)
{
    (void)st;
    return cudaMemset(p, v, n);
}

cudaError_t cudaGetLastError(void)
{
    return cudaSuccess;
}

const char *cudaGetErrorString(cudaError_t e)
{
    (void)e;
    return "stand-in";
}

/* ---- launch recorder ---- */

typedef struct launch {
    int x_dtype, tier, fast, nsegs;
    int64_t total_rows;
    const unsigned int *sched;
    int rescue; /* the launch's rescue list: -1 none, 0 present and empty, 1 present, not empty */
    lnorm__kseg segs[16]; /* the table entries (or the inline segment) */
} launch;

static launch g_l[64];
static int g_nl;

static int record(int x_dtype, int tier, const lnorm__kparams *p)
{
    if (g_nl >= 64)
        return 1;
    launch *l = &g_l[g_nl++];
    l->x_dtype = x_dtype;
    l->tier = tier;
    l->fast = p->fast;
    l->nsegs = p->nsegs;
    l->total_rows = p->total_rows;
    l->sched = p->sched;
    l->rescue = p->rescue == NULL ? -1 : (p->rescue->count != 0 || p->rescue->done != 0);
    if (p->table) {
        for (int i = 0; i < p->nsegs && i < 16; i++)
            l->segs[i] = p->table[i]; /* the stand-in "device" memory is host memory */
    } else {
        l->segs[0] = p->one;
    }
    return 0;
}

int lnorm__cuda_launch_f32(int tier, const lnorm__kparams *p, void *stream)
{
    (void)stream;
    return record(LNORM_DTYPE_F32, tier, p);
}

int lnorm__cuda_launch_f16(int tier, const lnorm__kparams *p, void *stream)
{
    (void)stream;
    return record(LNORM_DTYPE_F16, tier, p);
}

int lnorm__cuda_launch_bf16(int tier, const lnorm__kparams *p, void *stream)
{
    (void)stream;
    return record(LNORM_DTYPE_BF16, tier, p);
}

/* ---- checks ---- */

/* One arena of 16-byte-aligned memory; segments point into it at chosen
 * offsets (nothing is read or written through them here). */
static _Alignas(64) unsigned char g_mem[1 << 16];

static lnorm_segment seg(int op, int dt, int64_t rows, int64_t hidden, size_t xoff, size_t yoff, size_t poff)
{
    lnorm_segment s;
    lnorm_segment_init(&s, (lnorm_op)op, (lnorm_dtype)dt, rows, hidden);
    s.x = g_mem + xoff;
    /* y far from x (never dereferenced: the launches are recorded), so that
     * no segment's y overlaps its x (lnorm__rescue_ok) */
    s.y = (void *)((uintptr_t)(g_mem + 4096 + yoff) + ((uintptr_t)1 << 40));
    s.gamma = g_mem + 8192 + poff;
    s.beta = op == LNORM_OP_LAYERNORM ? g_mem + 12288 + poff : NULL;
    return s;
}

static void tiers(void)
{
    static const int dts[] = {LNORM_DTYPE_F32, LNORM_DTYPE_F16, LNORM_DTYPE_BF16};
    for (int di = 0; di < 3; di++) {
        const int64_t vec = 16 / (int64_t)lnorm_dtype_size(dts[di]);
        int prev = 0;
        for (int64_t h = 1; h <= (int64_t)1 << 21; h = h < 64 ? h + 1 : h + h / 7) {
            const char *desc = NULL;
            const int t = lnorm_cuda_tier(dts[di], h, &desc);
            const int64_t chunks = (h + vec - 1) / vec;
            CHECK(t >= prev, "tier of H=%lld goes down (%d after %d)", (long long)h, t, prev);
            prev = t;
            if (t < LNORM__NREG_TIERS) {
                const lnorm__tier_shape *sh = lnorm__shape(dts[di], t);
                CHECK(chunks <= sh->cap, "H=%lld does not fit tier %d", (long long)h, t);
                CHECK(t == 0 || chunks > lnorm__shape(dts[di], t - 1)->cap, "H=%lld fits tier %d, got %d",
                      (long long)h, t - 1, t);
                char want[64];
                snprintf(want, sizeof want, "reg%dx%dcl%d", sh->tpr, sh->nch, sh->cl);
                CHECK(desc && !strcmp(desc, want), "tier %d described as %s, want %s", t, desc ? desc : "NULL", want);
            } else {
                CHECK(chunks > lnorm__shape(dts[di], LNORM__NREG_TIERS - 1)->cap, "H=%lld streams but fits",
                      (long long)h);
                CHECK(desc && !strcmp(desc, "stream1024"), "streaming tier described as %s", desc ? desc : "NULL");
            }
        }
    }
    /* The f32 shapes keep the 16-bit tiers' capacities (tier numbers are
     * shared by both tables and the docs). */
    for (int t = 0; t < LNORM__NREG_TIERS; t++)
        CHECK(lnorm__shape(LNORM_DTYPE_BF16, t)->cap == lnorm__shape(LNORM_DTYPE_F32, t)->cap,
              "tier %d: capacity %lld (16-bit x), %lld (f32)", t, (long long)lnorm__shape(LNORM_DTYPE_BF16, t)->cap,
              (long long)lnorm__shape(LNORM_DTYPE_F32, t)->cap);
    CHECK(lnorm_cuda_tier(LNORM_DTYPE_BF16, 0, NULL) == -1, "H = 0 must be refused");
    CHECK(lnorm_cuda_tier(99, 128, NULL) == -1, "an unknown dtype must be refused");
}

static int tune(int bulk, int al)
{
    return lnorm_cuda_set_tuning("bulk", bulk) || lnorm_cuda_set_tuning("fast_aligned", al);
}

/* The fast variant one segment is launched with. */
static int variant_of(const lnorm_segment *s)
{
    g_nl = 0;
    const char *why = NULL;
    int rc = lnorm_cuda_run_segment(s, NULL, &why);
    CHECK(rc == LNORM_OK && g_nl == 1, "run_segment: rc %d (%s), %d launches", rc, why ? why : "", g_nl);
    CHECK(g_nl != 1 || g_l[0].sched == NULL, "run_segment has no workspace: no dynamic tiles");
    CHECK(g_nl != 1 || g_l[0].rescue == (g_l[0].fast == LNORM__FAST_NONE ? -1 : 0),
          "run_segment: a fast launch (%d) needs an empty rescue list of its own, a general one none (%d)",
          g_nl == 1 ? g_l[0].fast : -1, g_nl == 1 ? g_l[0].rescue : -2);
    CHECK(g_pool_live == 0, "run_segment: %d rescue lists not given back to the pool", g_pool_live);
    return g_nl == 1 ? g_l[0].fast : -1;
}

static void variants(void)
{
    /* name, segment, expected fast flags (AL / BULK / NONE) for (bulk, fast_aligned) settings
     * (1,1) default, (1,0), (1,2), (0,2), (2,1). */
    enum { AL = LNORM__FAST_AL, BU = LNORM__FAST_BULK, NO = -1, PLAIN = 0 };
    /* fast_aligned 1 for 16-bit RMSNorm (AR) and for f32 (AF): the policy's choice. */
    const int AR = PLAIN;
    const int AF = AL;
    /* Tier 10 (H <= 32768 16-bit, <= 16384 f32): one 1024-thread CTA whose
     * bulk kernel holds the row in shared memory (the bulk form wherever
     * rows allow, never AL); without the bulk form: k_fast. */
    const int T10 = lnorm__shape(LNORM_DTYPE_BF16, 10)->cl == 1 ? PLAIN : NO;
    /* RMSNorm in tier 10, whose aligned rows take k_fast's re-read form by
     * default ("fast_reread" 1): the AL form where the AL form is allowed,
     * else the bulk kernel (bulk off and AL allowed: AL). */
    const int RR10 = T10 == PLAIN && lnorm__rr_use(1, lnorm__shape(LNORM_DTYPE_BF16, 10)->tpr);
    const int R_ON = RR10 ? AL : BU, R_OFF = RR10 ? AL : T10;
    struct {
        const char *name;
        lnorm_segment s;
        int want[5];
    } const cases[] = {
        {"bf16 LN H=1024 aligned", seg(LNORM_OP_LAYERNORM, LNORM_DTYPE_BF16, 4, 1024, 0, 0, 0), {AL, BU, AL, AL, BU}},
        {"f16 LN H=4096 aligned", seg(LNORM_OP_LAYERNORM, LNORM_DTYPE_F16, 4, 4096, 0, 0, 0), {AL, BU, AL, AL, BU}},
        {"bf16 RMS H=1024 aligned", seg(LNORM_OP_RMSNORM, LNORM_DTYPE_BF16, 4, 1024, 0, 0, 0), {AR, PLAIN, AL, AL, BU}},
        {"f32 LN H=1024 aligned", seg(LNORM_OP_LAYERNORM, LNORM_DTYPE_F32, 4, 1024, 0, 0, 0), {AF, PLAIN, AL, AL, BU}},
        {"bf16 LN H=1024 y misaligned", seg(LNORM_OP_LAYERNORM, LNORM_DTYPE_BF16, 4, 1024, 0, 2, 0), {BU, BU, BU, PLAIN, BU}},
        {"bf16 LN H=1024 gamma misaligned", seg(LNORM_OP_LAYERNORM, LNORM_DTYPE_BF16, 4, 1024, 0, 0, 4), {BU, BU, BU, PLAIN, BU}},
        {"bf16 LN H=1024 x misaligned", seg(LNORM_OP_LAYERNORM, LNORM_DTYPE_BF16, 4, 1024, 2, 0, 0), {PLAIN, PLAIN, PLAIN, PLAIN, PLAIN}},
        {"bf16 LN H=1004 (not whole units)", seg(LNORM_OP_LAYERNORM, LNORM_DTYPE_BF16, 4, 1004, 0, 0, 0), {PLAIN, PLAIN, PLAIN, PLAIN, PLAIN}},
        {"bf16 LN H=65536 (cluster) aligned", seg(LNORM_OP_LAYERNORM, LNORM_DTYPE_BF16, 2, 65536, 0, 0, 0), {BU, BU, BU, NO, BU}},
        {"bf16 RMS H=20000 (tier 10) aligned", seg(LNORM_OP_RMSNORM, LNORM_DTYPE_BF16, 2, 20000, 0, 0, 0), {R_ON, BU, R_ON, R_OFF, BU}},
        {"f32 LN H=16384 (tier 10) aligned", seg(LNORM_OP_LAYERNORM, LNORM_DTYPE_F32, 2, 16384, 0, 0, 0), {BU, BU, BU, T10, BU}},
        {"bf16 LN H=20000 (tier 10) x misaligned", seg(LNORM_OP_LAYERNORM, LNORM_DTYPE_BF16, 2, 20000, 2, 0, 0), {T10, T10, T10, T10, T10}},
        {"bf16 RMS H=65536 (cluster) x misaligned", seg(LNORM_OP_RMSNORM, LNORM_DTYPE_BF16, 2, 65536, 2, 0, 0), {NO, NO, NO, NO, NO}},
    };
    static const int set[5][2] = {{1, 1}, {1, 0}, {1, 2}, {0, 2}, {2, 1}};
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
        for (int k = 0; k < 5; k++) {
            if (tune(set[k][0], set[k][1])) {
                CHECK_FAIL("lnorm_cuda_set_tuning refused");
                continue;
            }
            const int v = variant_of(&cases[i].s);
            const int flags = v < 0 ? -2 : v == LNORM__FAST_NONE ? NO : v & (LNORM__FAST_AL | LNORM__FAST_BULK);
            CHECK(flags == cases[i].want[k], "%s, bulk %d, fast_aligned %d: variant %d, flags %d, want %d",
                  cases[i].name, set[k][0], set[k][1], v, flags, cases[i].want[k]);
            CHECK(v < 0 || (v & LNORM__FAST_AL) == 0 || (v & LNORM__FAST_BULK) == 0, "%s: AL and BULK together",
                  cases[i].name);
        }
    /* No fast variant with a residual, or with y of another dtype. */
    tune(1, 2);
    lnorm_segment r = seg(LNORM_OP_LAYERNORM, LNORM_DTYPE_BF16, 4, 1024, 0, 0, 0);
    r.residual = g_mem + 16384;
    r.residual_out = g_mem + 20480;
    CHECK(variant_of(&r) == LNORM__FAST_NONE, "a residual must take the general kernel");
    lnorm_segment y32 = seg(LNORM_OP_LAYERNORM, LNORM_DTYPE_BF16, 4, 1024, 0, 0, 0);
    y32.y_dtype = LNORM_DTYPE_F32;
    CHECK(variant_of(&y32) == LNORM__FAST_NONE, "y of another dtype must take the general kernel");
    CHECK(lnorm_cuda_set_tuning("fast_aligned", 3) == LNORM_EINVAL, "fast_aligned 3 must be refused");
    /* "fast_reread" 2: tier 10's aligned rows take k_fast's AL form (whose
     * launcher then runs the re-read form) instead of the bulk kernel,
     * unless bulk is forced or the AL form is off; misaligned rows and the
     * cluster tiers are not affected. */
    if (T10 == PLAIN) {
        const lnorm_segment t10 = seg(LNORM_OP_RMSNORM, LNORM_DTYPE_BF16, 2, 20000, 0, 0, 0);
        const lnorm_segment t10f = seg(LNORM_OP_LAYERNORM, LNORM_DTYPE_F32, 2, 16384, 0, 0, 0);
        const lnorm_segment t10m = seg(LNORM_OP_LAYERNORM, LNORM_DTYPE_BF16, 2, 20000, 2, 0, 0);
        const lnorm_segment clu = seg(LNORM_OP_LAYERNORM, LNORM_DTYPE_BF16, 2, 65536, 0, 0, 0);
        CHECK(lnorm_cuda_set_tuning("fast_reread", 2) == LNORM_OK, "fast_reread 2");
        tune(1, 1);
        CHECK((variant_of(&t10) & (LNORM__FAST_AL | LNORM__FAST_BULK)) == LNORM__FAST_AL,
              "fast_reread 2: bf16 RMS H=20000 aligned must take the AL form");
        CHECK((variant_of(&t10f) & (LNORM__FAST_AL | LNORM__FAST_BULK)) == LNORM__FAST_AL,
              "fast_reread 2: f32 LN H=16384 aligned must take the AL form");
        CHECK((variant_of(&t10m) & (LNORM__FAST_AL | LNORM__FAST_BULK)) == 0,
              "fast_reread 2: a misaligned tier-10 row keeps k_fast's general form");
        CHECK((variant_of(&clu) & (LNORM__FAST_AL | LNORM__FAST_BULK)) == LNORM__FAST_BULK,
              "fast_reread 2: cluster tiers keep the bulk kernel");
        tune(2, 1);
        CHECK((variant_of(&t10) & (LNORM__FAST_AL | LNORM__FAST_BULK)) == LNORM__FAST_BULK,
              "fast_reread 2, bulk forced: tier 10 must take the bulk kernel");
        tune(1, 0);
        CHECK((variant_of(&t10) & (LNORM__FAST_AL | LNORM__FAST_BULK)) == LNORM__FAST_BULK,
              "fast_reread 2, fast_aligned 0: tier 10 must take the bulk kernel");
        CHECK(lnorm_cuda_set_tuning("fast_reread", 0) == LNORM_OK, "fast_reread 0");
        tune(1, 1);
        CHECK((variant_of(&t10) & (LNORM__FAST_AL | LNORM__FAST_BULK)) == LNORM__FAST_BULK,
              "fast_reread 0: tier 10 must take the bulk kernel");
        /* The default policy: RMSNorm there takes RR, LayerNorm the bulk kernel. */
        CHECK(lnorm_cuda_set_tuning("fast_reread", 1) == LNORM_OK, "fast_reread 1");
        CHECK((variant_of(&t10f) & (LNORM__FAST_AL | LNORM__FAST_BULK)) ==
                  (lnorm__rr_use(0, 1024) ? LNORM__FAST_AL : LNORM__FAST_BULK),
              "fast_reread 1: f32 LN H=16384 as the policy says");
        CHECK(!lnorm__rr_use(0, 1024), "fast_reread 1: not for LayerNorm");
        CHECK(lnorm__rr_use(1, 1024), "fast_reread 1: RMSNorm in tier 10");
        CHECK(!lnorm__rr_use(1, 512), "fast_reread 1: not in tiers 7-9");
        CHECK(lnorm_cuda_set_tuning("fast_reread", 3) == LNORM_EINVAL, "fast_reread 3 must be refused");
    }
    /* "defaults" puts every setting back. */
    tune(0, 0);
    CHECK(!lnorm_cuda_set_tuning("fast_reread", 2), "fast_reread 2 must be accepted");
    CHECK(!lnorm_cuda_set_tuning("bulk_stages", 2) && !lnorm_cuda_set_tuning("bulk_ctas", 3) &&
              !lnorm_cuda_set_tuning("fast_grid", 2) && !lnorm_cuda_set_tuning("bwd_grid", 5) &&
              !lnorm_cuda_set_tuning("bwd_wide", 4096) && !lnorm_cuda_set_tuning("bwd_pair", 2),
          "settings must be taken");
    CHECK(lnorm__bwd_grid == 5 && lnorm__bwd_wide_min == 4096 && lnorm__bwd_pair == 2,
          "bwd_grid 5, bwd_wide 4096, bwd_pair 2");
    CHECK(lnorm_cuda_set_tuning("bwd_pair", 3) == LNORM_EINVAL &&
              lnorm_cuda_set_tuning("bwd_pair", -1) == LNORM_EINVAL && lnorm__bwd_pair == 2,
          "bwd_pair 3 and -1 must be refused and change nothing");
    CHECK(lnorm_cuda_set_tuning("bwd_wide", -1) == LNORM_EINVAL && lnorm__bwd_wide_min == 4096,
          "bwd_wide -1 must be refused and change nothing");
    CHECK(lnorm_cuda_set_tuning("no_such_setting", 1) == LNORM_EINVAL, "an unknown name must be refused");
    CHECK(lnorm_cuda_set_tuning(NULL, 0) == LNORM_EINVAL, "a NULL name must be refused");
    CHECK(lnorm_cuda_set_tuning("defaults", 0) == LNORM_OK, "defaults 0 must be accepted");
    CHECK(lnorm__bulk_enabled == 1 && lnorm__fast_aligned == 1 && lnorm__bulk_stages_override == 0 &&
              lnorm__bulk_ctas_override == 0 && lnorm__fast_grid == 0 && lnorm__fast_reread == 1 &&
              lnorm__bwd_grid == 0 && lnorm__bwd_wide_min == 0 && lnorm__bwd_pair == LNORM__INIT_BWD_PAIR,
          "defaults: a setting was kept");
    const lnorm_segment al = seg(LNORM_OP_LAYERNORM, LNORM_DTYPE_BF16, 4, 1024, 0, 0, 0);
    CHECK((variant_of(&al) & (LNORM__FAST_AL | LNORM__FAST_BULK)) == LNORM__FAST_AL,
          "after defaults: bf16 LN H=1024 aligned must take the AL form again");
    CHECK(lnorm_cuda_set_tuning("defaults", 1) == LNORM_EINVAL, "defaults 1 must be refused");
    tune(1, 1);
}

/* Whether kernel-table entry k satisfies what the form with these flags
 * assumes. */
static int qualifies(const lnorm__kseg *k, int x_dtype, int fast)
{
    const size_t xs = lnorm_dtype_size(x_dtype);
    const int bulk = ((uintptr_t)k->x % 16) == 0 && ((size_t)k->x_stride * xs) % 16 == 0 &&
                     ((size_t)k->hidden * xs) % 16 == 0;
    const int al = bulk && ((uintptr_t)k->y % 16) == 0 && ((size_t)k->y_stride * xs) % 16 == 0 &&
                   ((uintptr_t)k->gamma % 16) == 0 && ((uintptr_t)k->beta % 16) == 0;
    if (fast & LNORM__FAST_AL)
        return al;
    if (fast & LNORM__FAST_BULK)
        return bulk;
    return 1;
}

static void batch(int al_setting)
{
    enum { NS = 8 };
    lnorm_segment s[NS] = {
        seg(LNORM_OP_LAYERNORM, LNORM_DTYPE_BF16, 3, 1024, 0, 0, 0),      /* AL */
        seg(LNORM_OP_LAYERNORM, LNORM_DTYPE_BF16, 5, 960, 2048, 2048, 0), /* AL, same tier */
        seg(LNORM_OP_LAYERNORM, LNORM_DTYPE_BF16, 2, 1000, 2, 6, 0),      /* same tier, misaligned */
        seg(LNORM_OP_RMSNORM, LNORM_DTYPE_BF16, 4, 1024, 0, 0, 0),        /* RMS: another group */
        seg(LNORM_OP_LAYERNORM, LNORM_DTYPE_BF16, 1, 65536, 0, 0, 0),     /* cluster, bulk */
        seg(LNORM_OP_LAYERNORM, LNORM_DTYPE_BF16, 1, 40000, 0, 0, 0),     /* cluster, bulk */
        seg(LNORM_OP_LAYERNORM, LNORM_DTYPE_F32, 6, 512, 0, 0, 0),        /* f32 */
        seg(LNORM_OP_LAYERNORM, LNORM_DTYPE_F32, 1, 512, 1024, 1024, 0),  /* f32, same group */
    };
    tune(1, al_setting);
    lnorm_batch b = {s, NS};
    const int want_launches = lnorm_cuda_launch_count(&b);
    lnorm_cuda_ws *ws = NULL;
    const int synced = g_synced;
    CHECK(lnorm_cuda_ws_create(&ws, 16) == LNORM_OK, "ws_create");
    CHECK(g_synced > synced, "ws_create must wait for the zeroing of its counters");
    if (!ws)
        return;
    g_nl = 0;
    const char *why = NULL;
    int rc = lnorm_cuda_run(&b, NULL, ws, &why);
    CHECK(rc == LNORM_OK, "batch run: %d (%s)", rc, why ? why : "");
    CHECK(g_nl == want_launches, "fast_aligned %d: %d launches, launch_count says %d", al_setting, g_nl, want_launches);
    int seen[NS] = {0}, launch_of[NS] = {0}, al_launches = 0;
    for (int i = 0; i < g_nl; i++) {
        const launch *l = &g_l[i];
        int64_t rows = 0;
        for (int j = 0; j < l->nsegs && j < 16; j++) {
            const lnorm__kseg *k = &l->segs[j];
            CHECK(k->row_begin == rows, "launch %d entry %d: row_begin %lld, want %lld", i, j, (long long)k->row_begin,
                  (long long)rows);
            int found = -1;
            for (int q = 0; q < NS; q++)
                if (k->x == s[q].x && k->y == s[q].y && k->hidden == s[q].hidden && k->op == s[q].op)
                    found = q;
            CHECK(found >= 0, "launch %d entry %d is no segment of the batch", i, j);
            if (found < 0)
                continue;
            seen[found]++;
            launch_of[found] = i;
            rows += s[found].rows;
            CHECK(s[found].x_dtype == l->x_dtype && lnorm_cuda_tier(l->x_dtype, s[found].hidden, NULL) == l->tier,
                  "segment %d launched with another dtype or tier", found);
            CHECK(qualifies(k, l->x_dtype, l->fast), "segment %d in a launch of form %d it does not qualify for", found,
                  l->fast);
        }
        CHECK(rows == l->total_rows, "launch %d: %lld rows in its entries, total_rows %lld", i, (long long)rows,
              (long long)l->total_rows);
        al_launches += (l->fast & LNORM__FAST_AL) != 0;
    }
    for (int q = 0; q < NS; q++)
        CHECK(seen[q] == 1, "segment %d launched %d times", q, seen[q]);
    if (al_setting)
        CHECK(launch_of[0] == launch_of[1] && g_l[launch_of[0]].nsegs == 2 && (g_l[launch_of[0]].fast & LNORM__FAST_AL),
              "segments 0 and 1 (aligned, same tier) must share one AL launch of 2 segments");
    /* Segments 0 and 1 (16-bit LayerNorm) and 6-7 (f32) with fast_aligned
     * 1; 3 (16-bit RMSNorm) too with fast_aligned 2. */
    const int want_al[3] = {0, 2, 3};
    CHECK(al_launches == want_al[al_setting], "fast_aligned %d: %d AL launches, want %d", al_setting, al_launches,
          want_al[al_setting]);
    /* Dynamic tiles: every launch of a batch run with a workspace gets its
     * counters, zero (the stand-in device memory is host memory). */
    for (int i = 0; i < g_nl; i++) {
        CHECK(g_l[i].sched != NULL && g_l[i].sched[0] == 0 && g_l[i].sched[1] == 0,
              "launch %d: no (or nonzero) dynamic-tile counters", i);
        CHECK(g_l[i].rescue == 0, "launch %d: the workspace's rescue list missing or not empty (%d)", i,
              g_l[i].rescue);
    }
    CHECK(g_pool_live == 0, "a batch with a workspace took %d rescue lists from the pool", g_pool_live);
    lnorm_cuda_ws_destroy(ws);
    tune(1, 1);
}

/* Segments whose y overlaps x take the general kernel (lnorm__rescue_ok:
 * the drain reads x again after y is written): in place, or overlapping.
 * The same segments apart take the fast path, whatever the length of a y
 * row. A launch without a workspace whose pool has no rescue list to give
 * takes the general kernel too, and so does a launch of 2^32 rows or more. */
static void rescue_routing(void)
{
    lnorm_segment s = seg(LNORM_OP_RMSNORM, LNORM_DTYPE_BF16, 4, 1024, 0, 0, 0);
    CHECK(variant_of(&s) != LNORM__FAST_NONE, "bf16 RMS H=1024, y apart: the fast path");
    s.y = (void *)s.x;
    CHECK(variant_of(&s) == LNORM__FAST_NONE, "in place: the general kernel");
    s.y = g_mem + 2 * 1024 * 2; /* rows 2-3 of x */
    CHECK(variant_of(&s) == LNORM__FAST_NONE, "y overlapping x: the general kernel");
    s.y = g_mem + 4 * 1024 * 2; /* just past x */
    CHECK(variant_of(&s) != LNORM__FAST_NONE, "y just past x: the fast path");
    g_pool_refuse = 1;
    CHECK(variant_of(&s) == LNORM__FAST_NONE, "no rescue list from the pool: the general kernel");
    CHECK(g_pool_refuse == 0, "run_segment did not ask the pool for a rescue list");
    CHECK(g_pools == 1, "%d pools for the rescue lists of one device, want 1 (kept)", g_pools);
    CHECK(lnorm_cuda_set_tuning("fast", 0) == LNORM_OK, "fast 0 must be taken");
    CHECK(variant_of(&s) == LNORM__FAST_NONE, "fast 0: the general kernel");
    CHECK(lnorm_cuda_set_tuning("fast", 2) == LNORM_EINVAL, "fast 2 must be refused");
    CHECK(lnorm_cuda_set_tuning("defaults", 0) == LNORM_OK && variant_of(&s) != LNORM__FAST_NONE,
          "defaults: the fast path again");
    /* The list's 32-bit count: a launch past 2^32 - 1 rows takes the
     * general kernel (y far past x, as in seg). */
    lnorm_segment u = seg(LNORM_OP_RMSNORM, LNORM_DTYPE_BF16, (int64_t)UINT32_MAX, 8, 0, 0, 0);
    u.y = (void *)((uintptr_t)u.y + ((uintptr_t)1 << 44));
    CHECK(variant_of(&u) != LNORM__FAST_NONE, "2^32 - 1 rows: the fast path");
    u.rows = (int64_t)UINT32_MAX + 1;
    CHECK(variant_of(&u) == LNORM__FAST_NONE, "2^32 rows: the general kernel (the rescue list's count)");
    lnorm_segment t = seg(LNORM_OP_LAYERNORM, LNORM_DTYPE_BF16, 8, 1, 0, 0, 0);
    CHECK(variant_of(&t) != LNORM__FAST_NONE, "bf16 H=1 (2-byte y rows): the fast path");
    t = seg(LNORM_OP_LAYERNORM, LNORM_DTYPE_F32, 8, 1, 0, 0, 0);
    CHECK(variant_of(&t) != LNORM__FAST_NONE, "f32 H=1: the fast path");
    CHECK(lnorm_cuda_set_tuning("fwd_grid", 3) == LNORM_OK && lnorm__fwd_grid == 3, "fwd_grid 3 must be taken");
    CHECK(lnorm_cuda_set_tuning("fwd_grid", -1) == LNORM_EINVAL, "fwd_grid -1 must be refused");
    CHECK(lnorm_cuda_set_tuning("defaults", 0) == LNORM_OK && lnorm__fwd_grid == 0, "defaults: fwd_grid back to 0");
}

int main(void)
{
    tiers();
    variants();
    rescue_routing();
    batch(1);
    batch(0);
    batch(2);
    printf("tiers, fast variants, batch grouping checked\n");
    return check_finish("gpu.cuda_host");
}
