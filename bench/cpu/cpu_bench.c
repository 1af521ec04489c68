/*
 * lnorm-cpu-bench: CPU LayerNorm / RMSNorm throughput of lnormd's CPU
 * backend beside memcpy (and oneDNN's layer normalization when built with
 * it), in the same process, over buffers much larger than the caches.
 * f32, bf16 and f16 (oneDNN: f32 and bf16).
 * GB/s = (bytes of x read + bytes of y written) / best time of several runs
 * (gamma/beta are read too but are tiny next to x and y; no mean/rstd).
 * memcpy's GB/s counts bytes read + bytes written the same way.
 *
 * Usage: lnorm-cpu-bench [--json FILE] [--commit SHA] [--mib N] [--runs N]
 *                        [--threads N] [--clock wall|thread] [--quick]
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "half.h"
#include "lnorm_core.h"
#ifdef LNORM_BENCH_HAVE_DNNL
#include "peer_onednn.h"
#endif

typedef struct result {
    char impl[16], op[16], dtype[8], isa[16];
    int64_t hidden, rows;
    int threads;
    double gbps, best_s, pct_memcpy;
} result;

static result *g_res;
static int g_nres, g_capres;

/* CLOCK_MONOTONIC (wall time), or with --clock thread the calling thread's
 * CPU time, which a busy shared machine disturbs far less (single-thread
 * runs only: everything then runs on the calling thread). */
static clockid_t g_clock = CLOCK_MONOTONIC;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(g_clock, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void add_result(const result *r)
{
    if (g_nres == g_capres) {
        int cap = g_capres ? 2 * g_capres : 64;
        result *n = realloc(g_res, (size_t)cap * sizeof *n);
        if (!n) {
            fprintf(stderr, "out of memory\n");
            exit(1);
        }
        g_res = n;
        g_capres = cap;
    }
    g_res[g_nres++] = *r;
    printf("%-8s %-10s %-5s %7lld %7lld %3d  %-7s %8.2f %8.1f%%\n", r->impl, r->op, r->dtype, (long long)r->hidden,
           (long long)r->rows, r->threads, r->isa, r->gbps, r->pct_memcpy);
    fflush(stdout);
}

/* ---- memcpy, one or more threads ----------------------------------------- */

typedef struct cpy_arg {
    char *dst;
    const char *src;
    size_t n;
} cpy_arg;

static void *cpy_main(void *p)
{
    cpy_arg *a = p;
    memcpy(a->dst, a->src, a->n);
    return NULL;
}

/* Best time of runs copies of n bytes with threads threads. */
static double time_memcpy(char *dst, const char *src, size_t n, int threads, int runs)
{
    double best = 1e30;
    for (int r = 0; r <= runs; r++) { /* run 0 warms up */
        pthread_t th[64];
        cpy_arg args[64];
        size_t per = (n / (size_t)threads) & ~(size_t)4095;
        double t0 = now_s();
        for (int i = 0; i < threads; i++) {
            args[i].dst = dst + (size_t)i * per;
            args[i].src = src + (size_t)i * per;
            args[i].n = i == threads - 1 ? n - (size_t)i * per : per;
            if (i > 0)
                pthread_create(&th[i], NULL, cpy_main, &args[i]);
        }
        cpy_main(&args[0]);
        for (int i = 1; i < threads; i++)
            pthread_join(th[i], NULL);
        double t = now_s() - t0;
        if (r > 0 && t < best)
            best = t;
    }
    return best;
}

/* ---- helpers -------------------------------------------------------------- */

static void cpu_model(char *out, size_t n)
{
    snprintf(out, n, "unknown CPU");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f)
        return;
    char line[512];
    while (fgets(line, sizeof line, f)) {
        if (!strncmp(line, "model name", 10)) {
            char *c = strchr(line, ':');
            if (c) {
                c++;
                while (*c == ' ')
                    c++;
                c[strcspn(c, "\n")] = 0;
                snprintf(out, n, "%s", c);
            }
            break;
        }
    }
    fclose(f);
}

/* x filled with a cheap deterministic pseudo-random pattern in [-2, 2). */
static void fill(void *x, int dt, size_t n)
{
    uint64_t s = 0x9e3779b97f4a7c15ull;
    for (size_t i = 0; i < n; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        float v = (float)((s >> 40) & 0xffffff) / (float)(1 << 22) - 2.0f;
        if (dt == LNORM_DTYPE_F32)
            ((float *)x)[i] = v;
        else if (dt == LNORM_DTYPE_F16)
            ((uint16_t *)x)[i] = lnorm_f32_to_f16(v);
        else
            ((uint16_t *)x)[i] = lnorm_f32_to_bf16(v);
    }
}

static const char *opname(int op)
{
    return op == LNORM_OP_LAYERNORM ? "layernorm" : "rmsnorm";
}

/* ---- main ------------------------------------------------------------------- */

int main(int argc, char **argv)
{
    const char *json = NULL, *commit = "unknown";
    size_t mib = 256;
    int runs = 5, max_threads = 2, quick = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--json") && i + 1 < argc)
            json = argv[++i];
        else if (!strcmp(argv[i], "--commit") && i + 1 < argc)
            commit = argv[++i];
        else if (!strcmp(argv[i], "--mib") && i + 1 < argc)
            mib = (size_t)atol(argv[++i]);
        else if (!strcmp(argv[i], "--runs") && i + 1 < argc)
            runs = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc)
            max_threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--quick"))
            quick = 1;
        else if (!strcmp(argv[i], "--clock") && i + 1 < argc && !strcmp(argv[i + 1], "thread"))
            g_clock = CLOCK_THREAD_CPUTIME_ID, i++;
        else if (!strcmp(argv[i], "--clock") && i + 1 < argc && !strcmp(argv[i + 1], "wall"))
            i++;
        else {
            fprintf(stderr, "usage: %s [--json FILE] [--commit SHA] [--mib N] [--runs N] [--threads N] "
                            "[--clock wall|thread] [--quick]\n",
                    argv[0]);
            return 2;
        }
    }
    if (quick) {
        mib = 64;
        runs = 2;
    }
    if (g_clock == CLOCK_THREAD_CPUTIME_ID)
        max_threads = 1; /* thread CPU time means nothing for work on other threads */
    if (mib < 8 || runs < 1 || max_threads < 1 || max_threads > 64) {
        fprintf(stderr, "bad arguments\n");
        return 2;
    }
    char model[256], date[32];
    cpu_model(model, sizeof model);
    time_t t = time(NULL);
    strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", gmtime(&t));
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);

    const size_t bytes = mib << 20;
    char *x = aligned_alloc(4096, bytes), *y = aligned_alloc(4096, bytes);
    float *gamma = aligned_alloc(64, (1u << 20) * 4), *beta = aligned_alloc(64, (1u << 20) * 4);
    if (!x || !y || !gamma || !beta) {
        fprintf(stderr, "out of memory (%zu MiB buffers)\n", mib);
        return 1;
    }
    memset(y, 0, bytes);
    for (int i = 0; i < (1 << 20); i++) {
        gamma[i] = 1.0f + (float)(i % 7) * 0.01f;
        beta[i] = (float)(i % 5) * 0.01f;
    }

    printf("lnorm-cpu-bench: %s, %ld cpus, %s, commit %s\n", model, ncpu, date, commit);
    printf("buffers: x and y %zu MiB each (L3 is far smaller), best of %d runs, %s\n", mib, runs,
           g_clock == CLOCK_MONOTONIC ? "wall clock" : "calling thread's CPU time");
#ifdef LNORM_BENCH_HAVE_DNNL
    printf("peer: oneDNN %s layer normalization (forward inference, scale+shift)\n", bench_onednn_version());
#else
    printf("peer: oneDNN not built in (libdnnl not found at configure time)\n");
#endif
    printf("%-8s %-10s %-5s %7s %7s %3s  %-7s %8s %9s\n", "impl", "op", "dtype", "H", "rows", "thr", "isa", "GB/s",
           "%memcpy");

    double memcpy_gbps[65] = {0};
    for (int th = 1; th <= max_threads; th++) {
        fill(x, LNORM_DTYPE_F32, bytes / 4);
        /* memcpy is the yardstick: give it twice the runs to find its best. */
        double best = time_memcpy(y, x, bytes, th, 2 * runs);
        result r = {.impl = "memcpy", .op = "-", .dtype = "-", .isa = "-", .threads = th};
        r.best_s = best;
        r.gbps = 2.0 * (double)bytes / best / 1e9;
        r.pct_memcpy = 100.0;
        memcpy_gbps[th] = r.gbps;
        add_result(&r);
    }

    const int64_t hs_full[] = {768, 4096, 16384, 65536};
    const int64_t hs_quick[] = {4096};
    const int64_t *hs = quick ? hs_quick : hs_full;
    const int nh = quick ? 1 : 4;
    const int dts[] = {LNORM_DTYPE_F32, LNORM_DTYPE_BF16, LNORM_DTYPE_F16};
    for (int th = 1; th <= max_threads; th++) {
        lnorm_cpu *cpu;
        if (lnorm_cpu_create(&cpu, th)) {
            fprintf(stderr, "lnorm_cpu_create failed\n");
            return 1;
        }
        for (int di = 0; di < 3; di++) {
            int dt = dts[di];
            size_t esz = lnorm_dtype_size(dt);
            fill(x, dt, bytes / esz);
            for (int hi = 0; hi < nh; hi++) {
                int64_t H = hs[hi];
                int64_t rows = (int64_t)(bytes / esz) / H;
                /* ISA sweep once: f32 LayerNorm H=4096, 1 thread. */
                const char *isas[] = {"scalar", "avx2", "avx512"};
                int sweep = th == 1 && dt == LNORM_DTYPE_F32 && H == 4096;
                for (int op = LNORM_OP_LAYERNORM; op <= LNORM_OP_RMSNORM; op++) {
                    for (int k = 0; k < 3; k++) {
                        const char *def = lnorm_cpu_isa(cpu);
                        char keep[16];
                        snprintf(keep, sizeof keep, "%s", def);
                        if (sweep && op == LNORM_OP_LAYERNORM) {
                            if (lnorm_cpu_set_isa(cpu, isas[k]) != LNORM_OK)
                                continue;
                        } else if (k > 0) {
                            break;
                        }
                        lnorm_segment s;
                        lnorm_segment_init(&s, (lnorm_op)op, (lnorm_dtype)dt, rows, H);
                        s.param_dtype = LNORM_DTYPE_F32;
                        s.x = x;
                        s.y = y;
                        s.gamma = gamma;
                        s.beta = beta;
                        lnorm_batch b = {&s, 1};
                        double best = 1e30;
                        for (int rr = 0; rr <= runs; rr++) {
                            double t0 = now_s();
                            if (lnorm_cpu_run(cpu, &b, NULL) != LNORM_OK) {
                                fprintf(stderr, "lnorm_cpu_run failed\n");
                                return 1;
                            }
                            double dtm = now_s() - t0;
                            if (rr > 0 && dtm < best)
                                best = dtm;
                        }
                        result r = {.threads = th, .hidden = H, .rows = rows};
                        snprintf(r.impl, sizeof r.impl, "lnormd");
                        snprintf(r.op, sizeof r.op, "%s", opname(op));
                        snprintf(r.dtype, sizeof r.dtype, "%s", lnorm_dtype_name(dt));
                        snprintf(r.isa, sizeof r.isa, "%s", lnorm_cpu_isa(cpu));
                        r.best_s = best;
                        r.gbps = 2.0 * (double)(rows * H) * (double)esz / best / 1e9;
                        r.pct_memcpy = 100.0 * r.gbps / memcpy_gbps[th];
                        add_result(&r);
                        if (sweep && op == LNORM_OP_LAYERNORM)
                            lnorm_cpu_set_isa(cpu, keep);
                    }
                }
#ifdef LNORM_BENCH_HAVE_DNNL
                if (dt != LNORM_DTYPE_F16) {
                    const char *why = NULL;
                    bench_onednn *p = bench_onednn_create(dt, rows, H, LNORM_DEFAULT_EPS, x, y, gamma, beta, th, &why);
                    if (!p) {
                        printf("onednn   layernorm  %-5s %7lld: not run (%s)\n", lnorm_dtype_name(dt), (long long)H, why);
                    } else {
                        double best = 1e30;
                        int ok = 1;
                        for (int rr = 0; rr <= runs && ok; rr++) {
                            double t0 = now_s();
                            ok = bench_onednn_run(p) == 0;
                            double dtm = now_s() - t0;
                            if (rr > 0 && dtm < best)
                                best = dtm;
                        }
                        if (ok) {
                            result r = {.threads = th, .hidden = H, .rows = rows};
                            snprintf(r.impl, sizeof r.impl, "onednn");
                            snprintf(r.op, sizeof r.op, "layernorm");
                            snprintf(r.dtype, sizeof r.dtype, "%s", lnorm_dtype_name(dt));
                            snprintf(r.isa, sizeof r.isa, "-");
                            r.best_s = best;
                            r.gbps = 2.0 * (double)(rows * H) * (double)esz / best / 1e9;
                            r.pct_memcpy = 100.0 * r.gbps / memcpy_gbps[th];
                            add_result(&r);
                        }
                        bench_onednn_destroy(p);
                    }
                }
#endif
            }
        }
        lnorm_cpu_destroy(cpu);
    }

    if (json) {
        FILE *f = fopen(json, "w");
        if (!f) {
            fprintf(stderr, "cannot write %s: %s\n", json, strerror(errno));
            return 1;
        }
        fprintf(f, "{\n  \"benchmark\": \"lnorm-cpu-bench\",\n  \"device\": \"%s\",\n  \"cpus\": %ld,\n", model, ncpu);
        fprintf(f, "  \"date\": \"%s\",\n  \"commit\": \"%s\",\n  \"buffer_mib\": %zu,\n  \"runs\": %d,\n", date, commit,
                mib, runs);
        fprintf(f, "  \"clock\": \"%s\",\n", g_clock == CLOCK_MONOTONIC ? "wall" : "thread-cpu-time");
        fprintf(f, "  \"metric\": \"GB/s = (bytes of x read + bytes of y written) / best time; memcpy: read + written\",\n");
#ifdef LNORM_BENCH_HAVE_DNNL
        fprintf(f, "  \"onednn\": \"%s\",\n", bench_onednn_version());
#else
        fprintf(f, "  \"onednn\": null,\n");
#endif
        fprintf(f, "  \"results\": [\n");
        for (int i = 0; i < g_nres; i++) {
            const result *r = &g_res[i];
            fprintf(f,
                    "    {\"impl\": \"%s\", \"op\": \"%s\", \"dtype\": \"%s\", \"hidden\": %lld, \"rows\": %lld, "
                    "\"threads\": %d, \"isa\": \"%s\", \"best_s\": %.6f, \"gbps\": %.3f, \"pct_of_memcpy\": %.1f}%s\n",
                    r->impl, r->op, r->dtype, (long long)r->hidden, (long long)r->rows, r->threads, r->isa, r->best_s,
                    r->gbps, r->pct_memcpy, i + 1 < g_nres ? "," : "");
        }
        fprintf(f, "  ]\n}\n");
        fclose(f);
        printf("wrote %s\n", json);
    }
    free(x);
    free(y);
    free(gamma);
    free(beta);
    free(g_res);
    return 0;
}
