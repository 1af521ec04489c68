/*
 * chunk_sweep: measure how the client's chunk size and pipeline depth change
 * the throughput of one large normalize call through a running lnormd.
 *
 *   lnorm_chunk_sweep URL [total_MB] [hidden] [repeats]
 *
 * Sends a total_MB (default 64) f32 LayerNorm tensor of rows x hidden
 * (default hidden 4096) with chunk sizes 256 KiB .. 16 MiB and pipeline
 * depths 1, 2, 4, 8, `repeats` (default 5) runs of each, round-robin, and
 * prints the median and best times and MB/s (x bytes in + y bytes out). Every run's
 * output is compared with the first run's: the result must not depend on
 * the chunking.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "lnorm/lnorm.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s URL [total_MB] [hidden] [repeats]\n", argv[0]);
        return 2;
    }
    const char *url = argv[1];
    size_t mb = argc > 2 ? strtoul(argv[2], NULL, 10) : 64;
    uint64_t hidden = argc > 3 ? strtoull(argv[3], NULL, 10) : 4096;
    int reps = argc > 4 ? atoi(argv[4]) : 5;
    if (mb == 0 || hidden == 0 || reps <= 0) {
        fprintf(stderr, "bad arguments\n");
        return 2;
    }
    uint64_t rows = (mb << 20) / (hidden * 4);
    if (rows == 0)
        rows = 1;
    size_t n = rows * hidden;
    float *x = malloc(n * 4), *y = malloc(n * 4), *ref = malloc(n * 4);
    if (!x || !y || !ref)
        return 1;
    srand(12345);
    for (size_t i = 0; i < n; i++)
        x[i] = (float)rand() / (float)RAND_MAX * 4.0f - 2.0f;

    enum { NC = 7, ND = 4, MAXREP = 64 };
    static const size_t chunks[NC] = {256u << 10, 512u << 10, 1u << 20, 2u << 20,
                                      4u << 20,   8u << 20,   16u << 20};
    static const int depths[ND] = {1, 2, 4, 8};
    static double t[ND][NC][MAXREP];
    static uint32_t nch[NC];
    if (reps > MAXREP)
        reps = MAXREP;
    lnorm_client *cl[ND];
    for (int d = 0; d < ND; d++) {
        lnorm_client_opts o;
        lnorm_client_opts_init(&o);
        o.pipeline_depth = depths[d];
        o.recv_timeout_ms = 120000;
        int rv = lnorm_client_open(&cl[d], &url, 1, &o);
        if (rv != LNORM_OK) {
            fprintf(stderr, "open %s: %s\n", url, lnorm_strerror(rv));
            return 1;
        }
    }
    int have_ref = 0, bad = 0;
    /* Round-robin over every configuration, rep after rep, so that load
     * changes on the machine spread evenly over the configurations. */
    for (int r = 0; r < reps; r++)
        for (int d = 0; d < ND; d++)
            for (int k = 0; k < NC; k++) {
                lnorm_normalize_req q;
                lnorm_normalize_req_init(&q, LNORM_OP_LAYERNORM, LNORM_DTYPE_F32, rows, hidden);
                q.x = x;
                q.y = y;
                q.chunk_bytes = chunks[k];
                memset(y, 0xff, n * 4);
                lnorm_result res;
                double t0 = now_s();
                int rv = lnorm_normalize(cl[d], &q, &res);
                t[d][k][r] = now_s() - t0;
                if (rv != LNORM_OK) {
                    fprintf(stderr, "normalize (chunk %zu, depth %d): %s: %s\n", chunks[k],
                            depths[d], lnorm_strerror(rv), res.message);
                    return 1;
                }
                nch[k] = res.chunks;
                if (!have_ref) {
                    memcpy(ref, y, n * 4);
                    have_ref = 1;
                } else if (memcmp(ref, y, n * 4) != 0) {
                    bad = 1;
                }
            }
    for (int d = 0; d < ND; d++)
        lnorm_client_close(cl[d]);
    printf("# %llu rows x %llu hidden f32 LayerNorm (%.1f MiB of x), %d runs each, round-robin\n",
           (unsigned long long)rows, (unsigned long long)hidden, (double)n * 4 / (1 << 20), reps);
    printf("# MB/s counts x in + y out: 2 * %.1f MB per call\n", (double)n * 4 / 1e6);
    printf("%10s %6s %7s %10s %10s %10s %10s\n", "chunk_KiB", "depth", "chunks", "median_ms",
           "best_ms", "MB/s_med", "MB/s_best");
    for (int d = 0; d < ND; d++)
        for (int k = 0; k < NC; k++) {
            double *v = t[d][k];
            for (int i = 1; i < reps; i++) /* insertion sort */
                for (int j = i; j > 0 && v[j] < v[j - 1]; j--) {
                    double tmp = v[j];
                    v[j] = v[j - 1];
                    v[j - 1] = tmp;
                }
            double med = reps % 2 ? v[reps / 2] : 0.5 * (v[reps / 2 - 1] + v[reps / 2]);
            printf("%10zu %6d %7u %10.1f %10.1f %10.0f %10.0f\n", chunks[k] >> 10, depths[d],
                   nch[k], med * 1e3, v[0] * 1e3, 2.0 * (double)n * 4 / med / 1e6,
                   2.0 * (double)n * 4 / v[0] / 1e6);
        }
    free(x);
    free(y);
    free(ref);
    if (bad) {
        fprintf(stderr, "ERROR: outputs differ between chunkings\n");
        return 1;
    }
    return 0;
}
