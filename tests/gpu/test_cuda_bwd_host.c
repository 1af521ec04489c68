/*
 * gpu.cuda_bwd_host: the host side of the CUDA backward pass (kernels/cuda/
 * lnorm_cuda_bwd_run.c) without a GPU: the file compiled in with stand-ins
 * for its CUDA runtime calls and for the launchers, which record what they
 * were asked to launch. Checked:
 *   - the backward tier table (first tier that holds H, the wide tier past
 *     the largest cluster, or from "bwd_wide"'s size) and its descriptions;
 *   - the row-group rule: G the largest power of two <= 64 that leaves a
 *     segment 256 CTAs' worth of groups, at least 4, a function of (rows,
 *     hidden, dtype) alone;
 *   - scratch bytes (partials of the gradients asked for, the table for a
 *     batch), refusals (scratch short or NULL, invalid segments: nothing
 *     launched);
 *   - a batch: one launch per (dtype, tier, form) group, every segment in
 *     exactly one, groups numbered from 0 in each launch, partials inside
 *     the scratch and apart, the fast form only for segments that qualify,
 *     one reduction over every column block, lnorm_cuda_bwd_launch_count;
 *   - rows two at a time (s->pair): the fast form with the statistics
 *     given and eps inside, in every register tier, for 16-bit x by
 *     default, f32 too or nothing with "bwd_pair" 2 or 0, never in the
 *     wide tier; set in the segment table the kernels read.
 * test_gpu_bwd checks the kernels on a device.
 */
#include "check.h"
#include "lnorm_cuda_bwd_run.c"

#include <stdio.h>

int64_t lnorm__bwd_wide_min = 0; /* lnorm_cuda_run.c's, set here directly */
int lnorm__bwd_pair = LNORM__INIT_BWD_PAIR;

cudaError_t cudaMemcpyAsync(void *d, const void *s, size_t n, enum cudaMemcpyKind k, cudaStream_t st)
{
    (void)k;
    (void)st;
    memcpy(d, s, n);
    return cudaSuccess;
}

const char *cudaGetErrorString(cudaError_t e)
{
    (void)e;
    return "stand-in";
}

typedef struct rec {
    int x_dtype, tier, fast, reduce, nsegs;
    int64_t total;
    lnorm__bseg segs[64];
} rec;

static rec g_rec[64];
static int g_nrec;

static int record(int x_dtype, int tier, int fast, int reduce, const lnorm__bparams *p)
{
    if (g_nrec >= 64)
        return 1;
    rec *r = &g_rec[g_nrec++];
    r->x_dtype = x_dtype;
    r->tier = tier;
    r->fast = fast;
    r->reduce = reduce;
    r->nsegs = p->nsegs;
    r->total = p->total;
    for (int i = 0; i < p->nsegs && i < 64; i++)
        r->segs[i] = p->table ? p->table[i] : p->one;
    return 0;
}

int lnorm__cuda_bwd_launch_f32(int tier, int fast, const lnorm__bparams *p, void *st)
{
    (void)st;
    return record(LNORM_DTYPE_F32, tier, fast, 0, p);
}
int lnorm__cuda_bwd_launch_f16(int tier, int fast, const lnorm__bparams *p, void *st)
{
    (void)st;
    return record(LNORM_DTYPE_F16, tier, fast, 0, p);
}
int lnorm__cuda_bwd_launch_bf16(int tier, int fast, const lnorm__bparams *p, void *st)
{
    (void)st;
    return record(LNORM_DTYPE_BF16, tier, fast, 0, p);
}
int lnorm__cuda_bwd_reduce(const lnorm__bparams *p, void *st)
{
    (void)st;
    return record(0, -1, 0, 1, p);
}

static lnorm_bwd_segment seg(int op, int dt, int64_t rows, int64_t H, int aligned);

static void check_tiers(void)
{
    static const int64_t hs[] = {1, 8, 9, 16, 17, 1024, 1025, 8192, 8193, 16384, 16385, 131072, 131073, 1 << 24};
    for (size_t i = 0; i < sizeof hs / sizeof *hs; i++)
        for (int dt = 1; dt <= 3; dt++) {
            const char *desc = NULL;
            const int t = lnorm_cuda_bwd_tier(dt, hs[i], &desc);
            int64_t cap = 0, prev = 0;
            if (t < LNORM__BWD_NTIERS) {
                int tpr, cl;
                lnorm__bwd_shape(t, &tpr, &cl);
                cap = (int64_t)tpr * cl * LNORM__BWD_COLS;
                if (t > 0) {
                    lnorm__bwd_shape(t - 1, &tpr, &cl);
                    prev = (int64_t)tpr * cl * LNORM__BWD_COLS;
                }
                char want[32];
                snprintf(want, sizeof want, "bwd%dcl%d", t < 10 ? 1 << t : 512, t < 10 ? 1 : 1 << (t - 9));
                CHECK(desc && !strcmp(desc, want), "H=%lld: tier %d desc %s, want %s", (long long)hs[i], t,
                      desc ? desc : "(null)", want);
                CHECK(hs[i] <= cap && hs[i] > prev, "H=%lld: tier %d holds %lld, the one before %lld",
                      (long long)hs[i], t, (long long)cap, (long long)prev);
            } else {
                CHECK(hs[i] > 131072, "H=%lld in the wide tier", (long long)hs[i]);
                CHECK(desc && !strcmp(desc, "bwdwide256cl8"), "wide desc %s", desc ? desc : "(null)");
            }
        }
    CHECK(lnorm_cuda_bwd_tier(0, 10, NULL) == -1 && lnorm_cuda_bwd_tier(1, 0, NULL) == -1, "invalid -> -1");
    /* "bwd_wide": the wide tier from that size on, the register tiers below */
    lnorm__bwd_wide_min = 4000;
    const char *desc = NULL;
    CHECK(lnorm_cuda_bwd_tier(LNORM_DTYPE_BF16, 3999, NULL) == 8, "3999 below bwd_wide");
    CHECK(lnorm_cuda_bwd_tier(LNORM_DTYPE_BF16, 4000, &desc) == LNORM__BWD_NTIERS && desc &&
              !strcmp(desc, "bwdwide256cl8"),
          "4000 from bwd_wide on");
    lnorm_bwd_segment w = seg(LNORM_OP_LAYERNORM, LNORM_DTYPE_BF16, 256, 4096, 1);
    CHECK(lnorm__bwd_grows(&w) == 8 && lnorm__bwd_fast_ok(&w), "a wide segment: G 8 (32 clusters of 8), fast");
    w.dres = w.x;
    CHECK(!lnorm__bwd_fast_ok(&w), "a wide segment with dres: general form");
    lnorm__bwd_wide_min = 0;
    CHECK(lnorm_cuda_bwd_tier(LNORM_DTYPE_BF16, 4000, NULL) == 8, "bwd_wide 0: the register tiers");
}

/* A described segment (host addresses stand in for device ones). */
static unsigned char g_mem[1 << 16];

static lnorm_bwd_segment seg(int op, int dt, int64_t rows, int64_t H, int aligned)
{
    lnorm_bwd_segment s;
    lnorm_bwd_segment_init(&s, (lnorm_op)op, (lnorm_dtype)dt, rows, H);
    unsigned char *base = (unsigned char *)(((uintptr_t)g_mem + 255) & ~(uintptr_t)255);
    s.x = base + (aligned ? 0 : 2);
    s.dy = base + 64;
    s.dx = base + 128;
    s.dgamma = (float *)(base + 192);
    s.dbeta = (float *)(base + 256);
    return s;
}

static void check_groups(void)
{
    static const int64_t rows[] = {1, 3, 100, 1000, 4096, 16384, 65536, 1 << 20};
    static const int64_t hs[] = {64, 1024, 4096, 8192, 16384, 65536, 131072, 262144};
    for (size_t i = 0; i < sizeof rows / sizeof *rows; i++)
        for (size_t j = 0; j < sizeof hs / sizeof *hs; j++) {
            lnorm_bwd_segment s = seg(LNORM_OP_LAYERNORM, LNORM_DTYPE_BF16, rows[i], hs[j], 1);
            const int t = lnorm_cuda_bwd_tier(s.x_dtype, s.hidden, NULL);
            int tpr = LNORM__BWD_WIDE_BLOCK, cl = LNORM__BWD_WIDE_CL;
            if (t < LNORM__BWD_NTIERS)
                lnorm__bwd_shape(t, &tpr, &cl);
            const int64_t g = lnorm__bwd_grows(&s);
            CHECK(g >= 4 && g <= 64 && (g & (g - 1)) == 0, "G %lld", (long long)g);
            const int64_t ctas = (rows[i] + g - 1) / g * cl;
            CHECK(ctas >= 256 || g == 4, "rows %lld H %lld: G %lld leaves %lld CTAs", (long long)rows[i],
                  (long long)hs[j], (long long)g, (long long)ctas);
            if (g < 64)
                CHECK((rows[i] + 2 * g - 1) / (2 * g) * cl < 256, "rows %lld H %lld: G %lld not the largest",
                      (long long)rows[i], (long long)hs[j], (long long)g);
            /* the pointers do not matter */
            lnorm_bwd_segment s2 = seg(LNORM_OP_RMSNORM, LNORM_DTYPE_BF16, rows[i], hs[j], 0);
            CHECK(lnorm__bwd_grows(&s2) == g, "G depends on the segment's pointers or op");
        }
}

static void check_batch(void)
{
    lnorm_bwd_segment segs[7] = {
        seg(LNORM_OP_LAYERNORM, LNORM_DTYPE_BF16, 1000, 4096, 1),  seg(LNORM_OP_RMSNORM, LNORM_DTYPE_BF16, 7, 4096, 1),
        seg(LNORM_OP_LAYERNORM, LNORM_DTYPE_BF16, 300, 4096, 0),   seg(LNORM_OP_LAYERNORM, LNORM_DTYPE_F32, 50, 100000, 1),
        seg(LNORM_OP_RMSNORM, LNORM_DTYPE_F16, 9, 300000, 1),      seg(LNORM_OP_LAYERNORM, LNORM_DTYPE_BF16, 4096, 4090, 1),
        seg(LNORM_OP_LAYERNORM, LNORM_DTYPE_BF16, 64, 4096, 1)};
    segs[1].dbeta = NULL;
    segs[6].dgamma = segs[6].dbeta = NULL;
    lnorm_bwd_batch b = {segs, 7};
    const size_t need = lnorm_cuda_bwd_scratch_bytes(&b);
    size_t parts = 0;
    for (int i = 0; i < 7; i++)
        parts += lnorm__bwd_partial_bytes(&segs[i]);
    CHECK(need == parts + lnorm__bwd_align(7 * sizeof(lnorm__bseg)), "scratch %zu", need);
    unsigned char *scr = malloc(need);
    const char *why = NULL;
    g_nrec = 0;
    CHECK_EQ_INT(lnorm_cuda_run_bwd(&b, NULL, scr, need - 1, &why), LNORM_EINVAL, "short scratch");
    CHECK_EQ_INT(lnorm_cuda_run_bwd(&b, NULL, NULL, need, &why), LNORM_EINVAL, "NULL scratch");
    CHECK_EQ_INT(g_nrec, 0, "launches after a refusal");
    CHECK_EQ_INT(lnorm_cuda_run_bwd(&b, NULL, scr, need, &why), LNORM_OK, "run: %s", why ? why : "");
    /* launches: bf16 tier 9 fast {0,1,6}, bf16 tier 9 general {2 (misaligned), 5 (H*2 % 16 != 0)},
     * f32 tier 13 fast {3}, f16 wide tier fast {4}, reduce */
    CHECK_EQ_INT(g_nrec, 5, "launches");
    CHECK_EQ_INT(lnorm_cuda_bwd_launch_count(&b), g_nrec, "launch count");
    int seen[7] = {0};
    for (int l = 0; l < g_nrec; l++) {
        const rec *r = &g_rec[l];
        if (r->reduce) {
            CHECK(l == g_nrec - 1, "the reduction runs last");
            int64_t cb = 0;
            for (int i = 0; i < r->nsegs; i++) {
                CHECK(r->segs[i].cblk_begin == cb, "cblk_begin %lld, want %lld", (long long)r->segs[i].cblk_begin,
                      (long long)cb);
                if (r->segs[i].pdg || r->segs[i].pdb)
                    cb += (r->segs[i].hidden + LNORM__BWD_RCOLS - 1) / LNORM__BWD_RCOLS;
            }
            CHECK(r->total == cb && cb > 0, "reduction over %lld blocks, want %lld", (long long)r->total,
                  (long long)cb);
            continue;
        }
        int64_t gb = 0;
        for (int i = 0; i < r->nsegs; i++) {
            const lnorm__bseg *k = &r->segs[i];
            int which = -1;
            for (int j = 0; j < 7; j++)
                if (segs[j].x == k->x && segs[j].rows == k->rows && segs[j].hidden == k->hidden)
                    which = j;
            CHECK(which >= 0, "unknown segment in a launch");
            if (which < 0)
                continue;
            seen[which]++;
            CHECK(r->x_dtype == segs[which].x_dtype, "dtype");
            CHECK(r->tier == lnorm_cuda_bwd_tier(segs[which].x_dtype, segs[which].hidden, NULL), "tier");
            CHECK(r->fast == lnorm__bwd_fast_ok(&segs[which]), "segment %d in a launch of form %d", which, r->fast);
            CHECK(k->group_begin == gb, "group_begin %lld, want %lld", (long long)k->group_begin, (long long)gb);
            CHECK(k->ngroups == (k->rows + k->grows - 1) / k->grows, "ngroups");
            gb += k->ngroups;
            CHECK((k->pdg != NULL) == (segs[which].dgamma != NULL) && (k->pdb != NULL) == (segs[which].dbeta != NULL),
                  "partials of segment %d", which);
            const size_t pbytes = (size_t)k->ngroups * (size_t)k->hidden * 4;
            for (int w = 0; w < 2; w++) {
                const unsigned char *q = (const unsigned char *)(w ? k->pdb : k->pdg);
                if (!q)
                    continue;
                CHECK(q >= scr + lnorm__bwd_align(7 * sizeof(lnorm__bseg)) && q + pbytes <= scr + need,
                      "partials of segment %d outside the scratch", which);
                CHECK(((uintptr_t)(q - scr) % LNORM__BWD_ALIGN) == 0, "partials aligned");
            }
        }
        CHECK(r->total == gb, "launch total %lld, groups %lld", (long long)r->total, (long long)gb);
    }
    for (int i = 0; i < 7; i++)
        CHECK_EQ_INT(seen[i], 1, "segment %d launched", i);
    CHECK(!lnorm__bwd_fast_ok(&segs[2]) && !lnorm__bwd_fast_ok(&segs[5]) && lnorm__bwd_fast_ok(&segs[0]),
          "fast form");
    /* partials of different segments apart */
    const lnorm__bseg *all[16];
    int na = 0;
    for (int l = 0; l < g_nrec; l++)
        if (!g_rec[l].reduce)
            for (int i = 0; i < g_rec[l].nsegs; i++)
                all[na++] = &g_rec[l].segs[i];
    for (int i = 0; i < na; i++)
        for (int j = 0; j < na; j++)
            for (int wi = 0; wi < 2; wi++)
                for (int wj = 0; wj < 2; wj++) {
                    const unsigned char *p = (const unsigned char *)(wi ? all[i]->pdb : all[i]->pdg);
                    const unsigned char *q = (const unsigned char *)(wj ? all[j]->pdb : all[j]->pdg);
                    if (!p || !q || (i == j && wi == wj))
                        continue;
                    const size_t n = (size_t)all[i]->ngroups * (size_t)all[i]->hidden * 4;
                    CHECK(p + n <= q || p >= q + (size_t)all[j]->ngroups * (size_t)all[j]->hidden * 4,
                          "partials overlap");
                }
    /* one segment: no table, partials from the scratch's start */
    lnorm_bwd_batch one = {&segs[0], 1};
    g_nrec = 0;
    CHECK(lnorm_cuda_bwd_scratch_bytes(&one) == lnorm__bwd_partial_bytes(&segs[0]), "one segment's scratch");
    CHECK_EQ_INT(lnorm_cuda_run_bwd(&one, NULL, scr, need, &why), LNORM_OK, "one segment");
    CHECK(g_nrec == 2 && g_rec[0].segs[0].pdg == (float *)scr, "one segment: launch then reduction");
    /* invalid: nothing launched */
    lnorm_bwd_segment bad[2] = {segs[0], segs[0]};
    bad[1].hidden = 0;
    lnorm_bwd_batch bb = {bad, 2};
    g_nrec = 0;
    CHECK(lnorm_cuda_bwd_scratch_bytes(&bb) == SIZE_MAX, "invalid batch's scratch");
    CHECK_EQ_INT(lnorm_cuda_run_bwd(&bb, NULL, scr, need, &why), LNORM_EINVAL, "invalid batch");
    CHECK_EQ_INT(g_nrec, 0, "launches for an invalid batch");
    CHECK_EQ_INT(lnorm_cuda_bwd_launch_count(&bb), -1, "launch count of an invalid batch");
    free(scr);
}

static void check_pair(void)
{
    float st[4] = {0};
    lnorm_bwd_segment s = seg(LNORM_OP_LAYERNORM, LNORM_DTYPE_BF16, 100, 8192, 1);
    s.rstd = s.mean = st;
    CHECK(lnorm__bwd_pair_ok(&s), "LayerNorm bf16 8192, statistics given: rows two at a time");
    s.hidden = 8;
    CHECK(lnorm__bwd_pair_ok(&s), "bf16 8 (a thread a row): rows two at a time");
    lnorm_bwd_segment f = seg(LNORM_OP_LAYERNORM, LNORM_DTYPE_F32, 100, 4096, 1);
    f.rstd = f.mean = st;
    CHECK(!lnorm__bwd_pair_ok(&f), "f32: one row at a time by default");
    lnorm_bwd_segment h = seg(LNORM_OP_LAYERNORM, LNORM_DTYPE_F16, 100, 4096, 1);
    h.rstd = h.mean = st;
    CHECK(lnorm__bwd_pair_ok(&h), "f16: rows two at a time");
    lnorm__bwd_pair = 2;
    CHECK(lnorm__bwd_pair_ok(&f), "bwd_pair 2: f32 too");
    s.hidden = 300000;
    f.hidden = 300000;
    CHECK(!lnorm__bwd_pair_ok(&s) && !lnorm__bwd_pair_ok(&f), "never in the wide tier");
    s.hidden = 8192;
    s.mean = NULL;
    CHECK(!lnorm__bwd_pair_ok(&s), "LayerNorm without the mean: statistics recomputed, one row at a time");
    s.op = LNORM_OP_RMSNORM;
    CHECK(lnorm__bwd_pair_ok(&s), "RMSNorm with rstd alone");
    s.eps_mode = LNORM_EPS_OUTSIDE;
    CHECK(!lnorm__bwd_pair_ok(&s), "eps outside (sigma recomputed): one row at a time");
    s.eps_mode = LNORM_EPS_INSIDE;
    s.rstd = NULL;
    CHECK(!lnorm__bwd_pair_ok(&s), "no rstd: one row at a time");
    s.rstd = st;
    lnorm_bwd_segment m = seg(LNORM_OP_RMSNORM, LNORM_DTYPE_BF16, 100, 8192, 0);
    m.rstd = st;
    CHECK(!lnorm__bwd_pair_ok(&m), "the general form: one row at a time");
    lnorm__bwd_pair = 0;
    CHECK(!lnorm__bwd_pair_ok(&s), "bwd_pair 0: nowhere");
    lnorm__bwd_pair = LNORM__INIT_BWD_PAIR;
    /* the rule reaches the table the kernels read */
    lnorm_bwd_segment two[2] = {s, seg(LNORM_OP_RMSNORM, LNORM_DTYPE_BF16, 100, 8192, 1)};
    lnorm_bwd_batch b = {two, 2};
    const size_t need = lnorm_cuda_bwd_scratch_bytes(&b);
    unsigned char *scr = malloc(need);
    const char *why = NULL;
    g_nrec = 0;
    CHECK_EQ_INT(lnorm_cuda_run_bwd(&b, NULL, scr, need, &why), LNORM_OK, "pair batch: %s", why ? why : "");
    int npair = 0, nsingle = 0;
    for (int l = 0; l < g_nrec; l++)
        for (int i = 0; !g_rec[l].reduce && i < g_rec[l].nsegs; i++) {
            const int given = g_rec[l].segs[i].rstd != NULL;
            CHECK(g_rec[l].segs[i].pair == given, "segment with%s rstd: pair %d", given ? "" : "out",
                  g_rec[l].segs[i].pair);
            npair += given;
            nsingle += !given;
        }
    CHECK(npair == 1 && nsingle == 1, "pair batch: %d, %d", npair, nsingle);
    free(scr);
}

int main(void)
{
    check_tiers();
    check_groups();
    check_batch();
    check_pair();
    return check_finish("gpu.cuda_bwd_host");
}
