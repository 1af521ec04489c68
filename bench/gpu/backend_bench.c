/*
 * lnorm-backend-bench: what batching buys inside lnormd's CUDA pipeline,
 * with no transport in the way.
 *
 * It drives server/backend_cuda.c directly (lnorm__backend_cuda_create_opts,
 * submit, buf_alloc / buf_free, done callbacks), as lnormd's batcher does,
 * but with no sockets, no decoding and no batcher: the figures are the
 * backend's (gather into the pinned arenas, copies, launches, completion,
 * scatter) and the GPU's.
 *
 * Workload: single-row segments, hidden H (4096), bf16 LayerNorm with bf16
 * gamma / beta shared by pointer by every segment, mean and rstd requested.
 * Mode "unbatched": every job has one segment; mode "batched B": every job
 * has B one-row segments (what the batcher hands the backend when B
 * one-row requests are queued). A fixed number of lanes (--inflight, by
 * default 2 x the backend's slots over every GPU) each keep one job in
 * flight: a lane's done callback submits the lane's next job at once. Each
 * lane cycles through several input / output sets (--working-set-mb in all),
 * so inputs are random rows that were not just touched, as a daemon's are,
 * not one row hot in the cache. Outputs start poisoned.
 *
 * Per mode: a warm-up, then --seconds timed; completions in the timed
 * window give rows/s, jobs/s, mean / max job latency (submit to done) and
 * the backend's compute time per job. Then a check, not timed: fresh random
 * inputs and poisoned outputs for one set per lane, submitted together in
 * the same mode, and up to --check-rows rows of them (and a few rows of the
 * timed run's last outputs) compared with the float64 reference
 * (tests/common's lnorm_test_check_segment, test_gpu's tolerance). Any
 * mismatch, job error or submit failure makes the exit status 1.
 *
 * Output: a table on stdout; --json FILE writes devices, date (UTC), commit
 * (--commit, else $LNORM_COMMIT), settings, every mode's figures and the
 * batched/unbatched ratios of rows/s.
 *
 * Against tests/gpu/mock (a CPU stand-in for the CUDA runtime) it runs too:
 * the logic is exercised, the numbers mean nothing (bench.backend_mock).
 */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "backend_cuda.h"
#include "testutil.h"

#define MAX_MODES 16
#define MAX_DEVS 16

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* ---- fast random bf16 rows (the reference reads them back exactly) ------- */

static uint64_t xs_next(uint64_t *s)
{
    uint64_t x = *s;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return *s = x;
}

static uint16_t f32_to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7fffu + ((u >> 16) & 1u); /* round to nearest even; finite inputs only */
    return (uint16_t)(u >> 16);
}

/* n bf16 values mean + spread * uniform(-1, 1). */
static void fill_bf16(uint16_t *p, size_t n, uint64_t *s, float mean, float spread)
{
    size_t i = 0;
    while (i < n) {
        uint64_t r = xs_next(s);
        for (int k = 0; k < 4 && i < n; k++, i++) {
            float u = (float)((r >> (16 * k)) & 0xffffu) * (2.0f / 65535.0f) - 1.0f;
            p[i] = f32_to_bf16(mean + spread * u);
        }
    }
}

/* ---- jobs and lanes ----------------------------------------------------- */

typedef struct bjob {
    lnorm__job job;
    struct lane *lane;
    lnorm_segment *segs; /* B */
    unsigned char *mem;  /* x rows | y rows | mean | rstd, one buf_alloc block per lane */
    int ran;             /* completed at least once since the outputs were poisoned */
} bjob;

typedef struct lane {
    struct bench *b;
    bjob *sets;          /* depth */
    int depth;
    int cur;             /* set in flight */
    uint64_t gen;        /* submissions */
    uint64_t t_submit;
    int busy;            /* a job in flight */
    int check_left;      /* check round: jobs still to submit after this one */
    unsigned char *block;
} lane;

typedef struct bench {
    lnorm__backend *be;
    int B;
    int64_t H;
    int nlanes;
    lane *lanes;
    const void *gamma, *beta;
    size_t set_bytes;
    /* run state */
    atomic_int stop;     /* lanes stop resubmitting */
    atomic_int check_only; /* one job per lane, no resubmission */
    atomic_ullong jobs, rows, lat_sum, lat_max, compute_sum;
    atomic_ullong errors, submit_fail;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int busy;            /* lanes with a job in flight */
} bench;

static void lane_submit(lane *l);

static void on_done(lnorm__job *j, int err, const char *why, uint64_t compute_ns)
{
    bjob *bj = (bjob *)j;
    lane *l = bj->lane;
    bench *b = l->b;
    uint64_t t = now_ns();
    uint64_t lat = t - l->t_submit;
    if (err != LNORM_OK) {
        if (atomic_fetch_add(&b->errors, 1) < 5)
            fprintf(stderr, "ERROR: job failed: %s (%s)\n", lnorm_errname(err), why ? why : "");
    } else {
        bj->ran = 1;
    }
    atomic_fetch_add_explicit(&b->jobs, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&b->rows, (unsigned long long)b->B, memory_order_relaxed);
    atomic_fetch_add_explicit(&b->lat_sum, lat, memory_order_relaxed);
    atomic_fetch_add_explicit(&b->compute_sum, compute_ns, memory_order_relaxed);
    unsigned long long m = atomic_load_explicit(&b->lat_max, memory_order_relaxed);
    while (lat > m && !atomic_compare_exchange_weak(&b->lat_max, &m, lat))
        ;
    int more = !atomic_load(&b->stop) && (!atomic_load(&b->check_only) || l->check_left-- > 0);
    if (err == LNORM_OK && more) {
        l->cur = (l->cur + 1) % l->depth;
        lane_submit(l); /* the lane stays busy */
        return;
    }
    pthread_mutex_lock(&b->mu);
    l->busy = 0;
    b->busy--;
    pthread_cond_broadcast(&b->cv);
    pthread_mutex_unlock(&b->mu);
}

/* Submit the lane's current set; on failure the lane goes idle. */
static void lane_submit(lane *l)
{
    bench *b = l->b;
    bjob *bj = &l->sets[l->cur];
    l->gen++;
    l->t_submit = now_ns();
    int rc = b->be->ops->submit(b->be, &bj->job);
    if (rc != LNORM_OK) {
        if (atomic_fetch_add(&b->submit_fail, 1) < 5)
            fprintf(stderr, "ERROR: submit: %s\n", lnorm_errname(rc));
        pthread_mutex_lock(&b->mu);
        l->busy = 0;
        b->busy--;
        pthread_cond_broadcast(&b->cv);
        pthread_mutex_unlock(&b->mu);
    }
}

static void start_lanes(bench *b)
{
    pthread_mutex_lock(&b->mu);
    for (int i = 0; i < b->nlanes; i++)
        b->lanes[i].busy = 1;
    b->busy = b->nlanes;
    pthread_mutex_unlock(&b->mu);
    for (int i = 0; i < b->nlanes; i++)
        lane_submit(&b->lanes[i]);
}

/* Wait until no lane has a job in flight; 0, or -1 after timeout_s. */
static int wait_idle(bench *b, int timeout_s)
{
    struct timespec dl;
    clock_gettime(CLOCK_REALTIME, &dl);
    dl.tv_sec += timeout_s;
    int rc = 0;
    pthread_mutex_lock(&b->mu);
    while (b->busy > 0)
        if (pthread_cond_timedwait(&b->cv, &b->mu, &dl) == ETIMEDOUT) {
            rc = -1;
            break;
        }
    pthread_mutex_unlock(&b->mu);
    return rc;
}

static size_t align_up(size_t v, size_t a) { return (v + a - 1) / a * a; }

/* Lay out one set (B one-row segments) in mem. */
static void make_set(bench *b, bjob *bj, unsigned char *mem, uint64_t *rs)
{
    size_t row = (size_t)b->H * 2;
    size_t B = (size_t)b->B;
    unsigned char *x = mem, *y = mem + align_up(B * row, 256);
    float *mean = (float *)(y + align_up(B * row, 256));
    float *rstd = mean + align_up(B, 64);
    fill_bf16((uint16_t *)x, B * (size_t)b->H, rs, 0.5f, 2.0f);
    memset(y, 0xff, B * row); /* poison: NaN in bf16 */
    memset(mean, 0xff, B * 4);
    memset(rstd, 0xff, B * 4);
    bj->mem = mem;
    bj->ran = 0;
    for (size_t i = 0; i < B; i++) {
        lnorm_segment *s = &bj->segs[i];
        lnorm_segment_init(s, LNORM_OP_LAYERNORM, LNORM_DTYPE_BF16, 1, b->H);
        s->x = x + i * row;
        s->y = y + i * row;
        s->gamma = b->gamma;
        s->beta = b->beta;
        s->mean = mean + i;
        s->rstd = rstd + i;
    }
    bj->job.batch.segs = bj->segs;
    bj->job.batch.nsegs = B;
    bj->job.rows = B;
    bj->job.bytes = B * (2 * row + 8);
    bj->job.done = on_done;
    bj->job.arg = bj;
}

static size_t set_bytes(int B, int64_t H)
{
    size_t row = (size_t)H * 2;
    return 2 * align_up((size_t)B * row, 256) + 2 * align_up((size_t)B, 64) * 4 + 256;
}

static int bench_setup(bench *b, int B, int nlanes, size_t working_set, uint64_t seed)
{
    b->B = B;
    b->nlanes = nlanes;
    b->set_bytes = set_bytes(B, b->H);
    /* One buf_alloc block per lane; the pool rounds a block up to a power
     * of two with a 64-byte header, hence the 4 KiB kept aside. */
    size_t per_lane = working_set / (size_t)nlanes;
    int depth = per_lane > 4096 ? (int)((per_lane - 4096) / b->set_bytes) : 0;
    if (depth < 1)
        depth = 1;
    if (depth > 4096)
        depth = 4096;
    b->lanes = calloc((size_t)nlanes, sizeof *b->lanes);
    if (!b->lanes)
        return -1;
    uint64_t rs = seed ? seed : 0x9e3779b97f4a7c15ull;
    for (int i = 0; i < nlanes; i++) {
        lane *l = &b->lanes[i];
        l->b = b;
        l->depth = depth;
        l->sets = calloc((size_t)depth, sizeof *l->sets);
        l->block = b->be->ops->buf_alloc(b->be, (size_t)depth * b->set_bytes);
        if (!l->sets || !l->block)
            return -1;
        for (int k = 0; k < depth; k++) {
            bjob *bj = &l->sets[k];
            bj->lane = l;
            bj->segs = calloc((size_t)B, sizeof *bj->segs);
            if (!bj->segs)
                return -1;
            make_set(b, bj, l->block + (size_t)k * b->set_bytes, &rs);
        }
    }
    return 0;
}

static void bench_teardown(bench *b)
{
    for (int i = 0; i < b->nlanes && b->lanes; i++) {
        lane *l = &b->lanes[i];
        for (int k = 0; k < l->depth && l->sets; k++)
            free(l->sets[k].segs);
        free(l->sets);
        if (l->block)
            b->be->ops->buf_free(b->be, l->block);
    }
    free(b->lanes);
    b->lanes = NULL;
}

static void reset_counters(bench *b)
{
    atomic_store(&b->jobs, 0);
    atomic_store(&b->rows, 0);
    atomic_store(&b->lat_sum, 0);
    atomic_store(&b->lat_max, 0);
    atomic_store(&b->compute_sum, 0);
}

/* Check up to max_rows rows of a set's segments; returns mismatching rows. */
static long check_set(bjob *bj, int B, int max_rows, const char *label, long *checked)
{
    long bad = 0;
    int step = B <= max_rows ? 1 : (B + max_rows - 1) / max_rows;
    lnorm_test_tol tol;
    lnorm_test_tol_default(&tol);
    tol.max_report = 3;
    for (int i = 0; i < B; i += step) {
        long m = lnorm_test_check_segment(&bj->segs[i], &tol, label);
        (*checked)++;
        if (m != 0)
            bad++;
    }
    return bad;
}

/* ---- modes -------------------------------------------------------------- */

typedef struct mode_result {
    int B;
    int lanes;
    int depth;
    uint64_t jobs, rows;
    double seconds;
    double rows_s, jobs_s, lat_mean_us, lat_max_us, compute_mean_us;
    double gbytes_s; /* x in + y out */
    long checked, mismatches;
    uint64_t errors, submit_fail;
    uint64_t staged, direct, oversize;
} mode_result;

typedef struct config {
    double seconds;
    int inflight;
    size_t working_set;
    int check_rows;
    int64_t hidden;
    int modes[MAX_MODES];
    int nmodes;
} config;

static void sleep_s(double s)
{
    struct timespec ts;
    ts.tv_sec = (time_t)s;
    ts.tv_nsec = (long)((s - (double)ts.tv_sec) * 1e9);
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

static int run_mode(bench *b, const config *cf, int B, mode_result *r, uint64_t seed)
{
    memset(r, 0, sizeof *r);
    r->B = B;
    r->lanes = cf->inflight;
    if (bench_setup(b, B, cf->inflight, cf->working_set, seed) != 0) {
        fprintf(stderr, "ERROR: out of memory setting up mode B=%d\n", B);
        bench_teardown(b);
        return -1;
    }
    r->depth = b->lanes[0].depth;
    atomic_store(&b->errors, 0);
    atomic_store(&b->submit_fail, 0);
    atomic_store(&b->stop, 0);
    atomic_store(&b->check_only, 0);
    lnorm__backend_counters c0, c1;
    memset(&c0, 0, sizeof c0);
    memset(&c1, 0, sizeof c1);

    /* Warm-up, then the timed window. */
    double warm = cf->seconds / 4 < 0.25 ? cf->seconds / 4 : 0.25;
    start_lanes(b);
    sleep_s(warm);
    if (b->be->ops->counters)
        b->be->ops->counters(b->be, &c0);
    reset_counters(b);
    uint64_t t0 = now_ns();
    sleep_s(cf->seconds);
    uint64_t jobs = atomic_load(&b->jobs), rows = atomic_load(&b->rows);
    uint64_t lat = atomic_load(&b->lat_sum), comp = atomic_load(&b->compute_sum);
    uint64_t lmax = atomic_load(&b->lat_max);
    uint64_t t1 = now_ns();
    if (b->be->ops->counters)
        b->be->ops->counters(b->be, &c1);
    atomic_store(&b->stop, 1);
    int idle = wait_idle(b, 120);
    if (idle != 0) {
        fprintf(stderr, "ERROR: mode B=%d: jobs still in flight 120 s after the stop\n", B);
        return -2; /* lanes still referenced by the backend: do not free */
    }
    r->jobs = jobs;
    r->rows = rows;
    r->seconds = (double)(t1 - t0) / 1e9;
    r->rows_s = (double)rows / r->seconds;
    r->jobs_s = (double)jobs / r->seconds;
    r->lat_mean_us = jobs ? (double)lat / (double)jobs / 1e3 : 0;
    r->lat_max_us = (double)lmax / 1e3;
    r->compute_mean_us = jobs ? (double)comp / (double)jobs / 1e3 : 0;
    r->gbytes_s = r->rows_s * (double)b->H * 2 * 2 / 1e9;
    r->staged = c1.staged_segments - c0.staged_segments;
    r->direct = c1.direct_segments - c0.direct_segments;
    r->oversize = c1.oversize_batches - c0.oversize_batches;

    /* The timed run's last outputs of each lane (inputs unchanged since). */
    char label[64];
    snprintf(label, sizeof label, "B=%d timed", B);
    for (int i = 0; i < b->nlanes; i++) {
        lane *l = &b->lanes[i];
        if (l->sets[l->cur].ran)
            r->mismatches += check_set(&l->sets[l->cur], B, 4, label, &r->checked);
    }

    /* Check round: fresh inputs and poisoned outputs in nchk sets per lane,
     * each lane running them one after the other (all lanes at once). */
    uint64_t rs = (seed ^ 0xc0ffee1234567ull) + (uint64_t)B;
    int nchk = (cf->check_rows + b->nlanes * B - 1) / (b->nlanes * B);
    if (nchk > b->lanes[0].depth)
        nchk = b->lanes[0].depth;
    if (nchk < 1)
        nchk = 1;
    for (int i = 0; i < b->nlanes; i++) {
        lane *l = &b->lanes[i];
        l->cur = (l->cur + 1) % l->depth;
        for (int k = 0; k < nchk; k++) {
            bjob *bj = &l->sets[(l->cur + k) % l->depth];
            make_set(b, bj, bj->mem, &rs);
        }
        l->check_left = nchk - 1;
    }
    atomic_store(&b->stop, 0);
    atomic_store(&b->check_only, 1);
    start_lanes(b);
    if (wait_idle(b, 120) != 0) {
        fprintf(stderr, "ERROR: mode B=%d: check jobs still in flight after 120 s\n", B);
        return -2;
    }
    snprintf(label, sizeof label, "B=%d check", B);
    int per_job = cf->check_rows / (b->nlanes * nchk);
    if (per_job < 1)
        per_job = 1;
    for (int i = 0; i < b->nlanes; i++) {
        lane *l = &b->lanes[i];
        for (int k = 0; k < nchk; k++) {
            bjob *bj = &l->sets[(l->cur - k + l->depth) % l->depth];
            if (!bj->ran) {
                r->mismatches++; /* never completed: its error is counted too */
                continue;
            }
            r->mismatches += check_set(bj, B, per_job, label, &r->checked);
        }
    }
    r->errors = atomic_load(&b->errors);
    r->submit_fail = atomic_load(&b->submit_fail);
    bench_teardown(b);
    return 0;
}

/* ---- output ------------------------------------------------------------- */

static void json_str(FILE *f, const char *s)
{
    fputc('"', f);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\')
            fprintf(f, "\\%c", c);
        else if (c < 0x20)
            fprintf(f, "\\u%04x", c);
        else
            fputc(c, f);
    }
    fputc('"', f);
}

static const char *mode_name(int B, char *buf, size_t n)
{
    if (B == 1)
        snprintf(buf, n, "unbatched");
    else
        snprintf(buf, n, "batched_%d", B);
    return buf;
}

static size_t parse_bytes(const char *s, int *ok)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    *ok = errno == 0 && end != s && v >= 0;
    switch (*end) {
    case 'k': case 'K': v *= 1024; end++; break;
    case 'm': case 'M': v *= 1024 * 1024; end++; break;
    case 'g': case 'G': v *= 1024.0 * 1024 * 1024; end++; break;
    default: break;
    }
    if (*end == 'i')
        end++;
    if (*end == 'B')
        end++;
    if (*end)
        *ok = 0;
    return (size_t)v;
}

static void usage(FILE *f)
{
    fprintf(f,
            "usage: lnorm-backend-bench [options]\n"
            "  --seconds S          timed seconds per mode (default 2)\n"
            "  --modes LIST         segments per job, 1 = unbatched (default 1,8,64,256)\n"
            "  --hidden H           row length (default 4096)\n"
            "  --inflight N         jobs kept in flight (default 2 x slots per GPU x GPUs)\n"
            "  --working-set-mb M   input+output sets cycled through, in all (default 256)\n"
            "  --check-rows N       rows checked per mode against float64 (default 512)\n"
            "  --devices LIST       GPU indices (default: all)\n"
            "  --slots N            slots per GPU (default: the backend's, 2)\n"
            "  --slot-bytes N       device arena per slot (default: the backend's, 256M)\n"
            "  --sync spin|yield|block   cuda-sync (default: the backend's, spin)\n"
            "  --staging-bytes N    pinned staging arenas per slot, 0 = off (default: the backend's, 16M)\n"
            "  --stage-max-bytes N  largest staged segment (default: the backend's, 256K)\n"
            "  --json FILE          write the results as JSON\n"
            "  --commit C           commit to record (default: $LNORM_COMMIT)\n"
            "  --seed N             input seed\n");
}

int main(int argc, char **argv)
{
    config cf;
    memset(&cf, 0, sizeof cf);
    cf.seconds = 2;
    cf.inflight = 0;
    cf.working_set = (size_t)256 << 20;
    cf.check_rows = 512;
    cf.hidden = 4096;
    int defmodes[] = {1, 8, 64, 256};
    memcpy(cf.modes, defmodes, sizeof defmodes);
    cf.nmodes = 4;
    const char *json = NULL, *commit = getenv("LNORM_COMMIT");
    uint64_t seed = 0x5eed1234abcdull;
    lnorm__cuda_opts o;
    lnorm__cuda_opts_init(&o);
    static const char *const sync_names[] = {"spin", "yield", "block"};
    setvbuf(stdout, NULL, _IOLBF, 0); /* a log keeps stdout and stderr in order */

    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        int ok = 1;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        }
        if (!v) {
            fprintf(stderr, "lnorm-backend-bench: %s needs a value (or is unknown)\n", a);
            usage(stderr);
            return 2;
        }
        i++;
        if (!strcmp(a, "--seconds")) {
            cf.seconds = atof(v);
            ok = cf.seconds > 0;
        } else if (!strcmp(a, "--modes")) {
            cf.nmodes = 0;
            char *dup = strdup(v), *save = NULL;
            for (char *t = strtok_r(dup, ",", &save); t && ok; t = strtok_r(NULL, ",", &save)) {
                int m = atoi(t);
                if (m < 1 || m > 4096 || cf.nmodes == MAX_MODES)
                    ok = 0;
                else
                    cf.modes[cf.nmodes++] = m;
            }
            free(dup);
            ok = ok && cf.nmodes > 0;
        } else if (!strcmp(a, "--hidden")) {
            cf.hidden = atoll(v);
            ok = cf.hidden >= 1 && cf.hidden <= (1 << 20);
        } else if (!strcmp(a, "--inflight")) {
            cf.inflight = atoi(v);
            ok = cf.inflight >= 1 && cf.inflight <= 1024;
        } else if (!strcmp(a, "--working-set-mb")) {
            double mb = atof(v);
            ok = mb >= 0;
            cf.working_set = (size_t)(mb * 1024 * 1024);
        } else if (!strcmp(a, "--check-rows")) {
            cf.check_rows = atoi(v);
            ok = cf.check_rows >= 1;
        } else if (!strcmp(a, "--devices")) {
            o.devices = v;
        } else if (!strcmp(a, "--slots")) {
            o.slots_per_gpu = atoi(v);
            ok = o.slots_per_gpu >= 1 && o.slots_per_gpu <= 64;
        } else if (!strcmp(a, "--slot-bytes")) {
            o.slot_bytes = parse_bytes(v, &ok);
        } else if (!strcmp(a, "--sync")) {
            o.sync = !strcmp(v, "spin") ? LNORM__CUDA_SYNC_SPIN
                     : !strcmp(v, "yield") ? LNORM__CUDA_SYNC_YIELD
                     : !strcmp(v, "block") ? LNORM__CUDA_SYNC_BLOCK
                                           : -1;
            ok = o.sync >= 0;
        } else if (!strcmp(a, "--staging-bytes")) {
            o.staging_bytes = parse_bytes(v, &ok);
        } else if (!strcmp(a, "--stage-max-bytes")) {
            o.stage_max_bytes = parse_bytes(v, &ok);
        } else if (!strcmp(a, "--json")) {
            json = v;
        } else if (!strcmp(a, "--commit")) {
            commit = v;
        } else if (!strcmp(a, "--seed")) {
            seed = strtoull(v, NULL, 0);
        } else {
            fprintf(stderr, "lnorm-backend-bench: unknown option %s\n", a);
            usage(stderr);
            return 2;
        }
        if (!ok) {
            fprintf(stderr, "lnorm-backend-bench: bad value for %s: %s\n", a, v);
            return 2;
        }
    }
    if (!commit || !*commit)
        commit = "unknown";

    char date[32];
    time_t tnow = time(NULL);
    struct tm tm;
    gmtime_r(&tnow, &tm);
    strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", &tm);

    bench b;
    memset(&b, 0, sizeof b);
    b.H = cf.hidden;
    pthread_mutex_init(&b.mu, NULL);
    pthread_cond_init(&b.cv, NULL);
    int rc = lnorm__backend_cuda_create_opts(&b.be, &o);
    if (rc != LNORM_OK) {
        fprintf(stderr, "ERROR: lnorm__backend_cuda_create_opts: %s (needs a GPU)\n", lnorm_errname(rc));
        return 1;
    }
    lnorm__device_info dev[MAX_DEVS];
    int ndev = b.be->ops->devices(b.be, dev, MAX_DEVS);
    for (int i = 0; i < ndev; i++)
        printf("device %u: %s, %llu MiB\n", dev[i].index, dev[i].name,
               (unsigned long long)(dev[i].memory_bytes >> 20));
    char desc[512] = "";
    if (b.be->ops->describe)
        b.be->ops->describe(b.be, desc, sizeof desc);
    if (desc[0])
        printf("backend: %s\n", desc);
    int maxin = b.be->ops->max_inflight(b.be);
    if (!cf.inflight)
        cf.inflight = 2 * maxin;
    printf("workload: 1-row segments, hidden %lld, bf16 LayerNorm, bf16 gamma/beta shared, mean+rstd; "
           "%d jobs in flight (backend slots %d), %.2f s per mode, working set %.0f MiB, commit %s\n",
           (long long)cf.hidden, cf.inflight, maxin, cf.seconds, (double)cf.working_set / (1 << 20), commit);
    fflush(stdout);

    /* gamma / beta: pinned, shared by pointer by every segment of every mode. */
    size_t pbytes = (size_t)cf.hidden * 2;
    void *gamma = b.be->ops->buf_alloc(b.be, pbytes), *beta = b.be->ops->buf_alloc(b.be, pbytes);
    if (!gamma || !beta) {
        fprintf(stderr, "ERROR: out of memory\n");
        return 1;
    }
    uint64_t ps = seed * 3 + 7;
    fill_bf16(gamma, (size_t)cf.hidden, &ps, 1.0f, 0.5f);
    fill_bf16(beta, (size_t)cf.hidden, &ps, 0.0f, 0.5f);
    b.gamma = gamma;
    b.beta = beta;

    mode_result res[MAX_MODES];
    int failed = 0, nres = 0;
    for (int m = 0; m < cf.nmodes; m++) {
        int st = run_mode(&b, &cf, cf.modes[m], &res[m], seed + (uint64_t)m);
        if (st == -2) {
            /* Jobs still in flight: the backend may still use our memory. */
            fprintf(stderr, "FAIL: backend stuck\n");
            fflush(NULL);
            _exit(1);
        }
        if (st != 0) {
            failed = 1;
            break;
        }
        nres = m + 1;
        mode_result *r = &res[m];
        if (r->mismatches || r->errors || r->submit_fail || r->jobs == 0)
            failed = 1;
        char nm[32];
        fprintf(stderr, "mode %s: %llu jobs, %ld rows checked, %ld mismatching, %llu errors\n",
                mode_name(r->B, nm, sizeof nm), (unsigned long long)r->jobs, r->checked, r->mismatches,
                (unsigned long long)(r->errors + r->submit_fail));
    }

    /* Table. */
    printf("\n%-12s %5s %6s %12s %11s %10s %10s %10s %9s %7s %8s\n", "mode", "segs", "lanes", "rows/s",
           "jobs/s", "lat_us", "max_us", "comp_us", "GB/s", "ratio", "check");
    double base = 0;
    for (int m = 0; m < nres; m++)
        if (res[m].B == 1)
            base = res[m].rows_s;
    for (int m = 0; m < nres; m++) {
        mode_result *r = &res[m];
        char nm[32], ratio[16];
        if (base > 0)
            snprintf(ratio, sizeof ratio, "%.2f", r->rows_s / base);
        else
            snprintf(ratio, sizeof ratio, "-");
        printf("%-12s %5d %6d %12.0f %11.0f %10.1f %10.1f %10.1f %9.2f %7s %8s\n", mode_name(r->B, nm, sizeof nm),
               r->B, r->lanes, r->rows_s, r->jobs_s, r->lat_mean_us, r->lat_max_us, r->compute_mean_us,
               r->gbytes_s, ratio, (r->mismatches || r->errors || r->submit_fail) ? "FAIL" : "ok");
    }
    printf("(rows/s: one-row segments completed per second; lat: submit to done per job; comp: the backend's "
           "compute_ns per job; GB/s: x in + y out; ratio: rows/s over unbatched)\n");

    if (json) {
        FILE *f = fopen(json, "w");
        if (!f) {
            fprintf(stderr, "ERROR: cannot write %s: %s\n", json, strerror(errno));
            failed = 1;
        } else {
            fprintf(f, "{\n  \"bench\": \"lnorm-backend-bench\",\n  \"date\": \"%s\",\n  \"commit\": ", date);
            json_str(f, commit);
            fprintf(f, ",\n  \"devices\": [");
            for (int i = 0; i < ndev; i++) {
                fprintf(f, "%s{\"index\": %u, \"name\": ", i ? ", " : "", dev[i].index);
                json_str(f, dev[i].name);
                fprintf(f, ", \"memory_mib\": %llu}", (unsigned long long)(dev[i].memory_bytes >> 20));
            }
            fprintf(f, "],\n  \"backend\": ");
            json_str(f, desc);
            fprintf(f,
                    ",\n  \"config\": {\"op\": \"layernorm\", \"dtype\": \"bf16\", \"param_dtype\": \"bf16\", "
                    "\"hidden\": %lld, \"rows_per_segment\": 1, \"stats\": true, \"seconds\": %.3f, "
                    "\"inflight\": %d, \"backend_slots\": %d, \"slots_per_gpu\": %d, \"slot_bytes\": %zu, "
                    "\"sync\": \"%s\", \"staging_bytes\": %zu, \"stage_max_bytes\": %zu, "
                    "\"working_set_bytes\": %zu, \"check_rows\": %d},\n  \"modes\": [",
                    (long long)cf.hidden, cf.seconds, cf.inflight, maxin, o.slots_per_gpu, o.slot_bytes,
                    sync_names[o.sync], o.staging_bytes, o.stage_max_bytes, cf.working_set, cf.check_rows);
            for (int m = 0; m < nres; m++) {
                mode_result *r = &res[m];
                char nm[32];
                fprintf(f,
                        "%s\n    {\"mode\": \"%s\", \"segments_per_job\": %d, \"lanes\": %d, \"sets_per_lane\": %d, "
                        "\"jobs\": %llu, \"rows\": %llu, \"seconds\": %.4f, \"rows_per_s\": %.1f, "
                        "\"jobs_per_s\": %.1f, \"mean_latency_us\": %.2f, \"max_latency_us\": %.2f, "
                        "\"mean_compute_us\": %.2f, \"gbytes_per_s\": %.3f, \"staged_segments\": %llu, "
                        "\"direct_segments\": %llu, \"oversize_batches\": %llu, \"checked_rows\": %ld, "
                        "\"mismatches\": %ld, \"errors\": %llu}",
                        m ? "," : "", mode_name(r->B, nm, sizeof nm), r->B, r->lanes, r->depth,
                        (unsigned long long)r->jobs, (unsigned long long)r->rows, r->seconds, r->rows_s, r->jobs_s,
                        r->lat_mean_us, r->lat_max_us, r->compute_mean_us, r->gbytes_s,
                        (unsigned long long)r->staged, (unsigned long long)r->direct,
                        (unsigned long long)r->oversize, r->checked, r->mismatches,
                        (unsigned long long)(r->errors + r->submit_fail));
            }
            fprintf(f, "\n  ],\n  \"ratios\": {");
            int first = 1;
            for (int m = 0; m < nres && base > 0; m++) {
                if (res[m].B == 1)
                    continue;
                char nm[32];
                fprintf(f, "%s\"%s\": %.4f", first ? "" : ", ", mode_name(res[m].B, nm, sizeof nm),
                        res[m].rows_s / base);
                first = 0;
            }
            fprintf(f, "},\n  \"ratio_of\": \"rows_per_s of the mode / rows_per_s unbatched\",\n  \"ok\": %s\n}\n",
                    failed ? "false" : "true");
            if (fclose(f) != 0) {
                fprintf(stderr, "ERROR: writing %s failed\n", json);
                failed = 1;
            }
        }
    }

    b.be->ops->buf_free(b.be, gamma);
    b.be->ops->buf_free(b.be, beta);
    b.be->ops->destroy(b.be);
    printf("%s: lnorm-backend-bench, %d mode(s)%s%s\n", failed ? "FAIL" : "PASS", nres, json ? ", JSON in " : "",
           json ? json : "");
    return failed ? 1 : 0;
}
