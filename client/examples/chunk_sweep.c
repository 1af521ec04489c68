/*
 * chunk_sweep: measure how the client's chunk size and pipeline depth change
 * the throughput of one large normalize call through a running lnormd.
 *
 *   lnorm_chunk_sweep URL [total_MB] [hidden] [repeats]
 *
 * Sends a total_MB (default 64) f32 LayerNorm tensor of rows x hidden
 * (default hidden 4096) with chunk sizes 256 KiB .. 16 MiB and pipeline
 * depths 1, 2, 4, 8, and prints the best time of `repeats` (default 3) runs
 * and the resulting MB/s (x bytes in + y bytes out per second). Every run's
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
    int reps = argc > 4 ? atoi(argv[4]) : 3;
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

    static const size_t chunks[] = {256u << 10, 512u << 10, 1u << 20, 2u << 20,
                                    4u << 20,  8u << 20,   16u << 20};
    static const int depths[] = {1, 2, 4, 8};
    int have_ref = 0, bad = 0;
    printf("# %llu rows x %llu hidden f32 LayerNorm (%.1f MiB of x), best of %d\n",
           (unsigned long long)rows, (unsigned long long)hidden, (double)n * 4 / (1 << 20), reps);
    printf("%10s %6s %8s %10s %10s\n", "chunk_KiB", "depth", "chunks", "best_ms", "MB/s");
    for (size_t d = 0; d < sizeof depths / sizeof depths[0]; d++) {
        lnorm_client_opts o;
        lnorm_client_opts_init(&o);
        o.pipeline_depth = depths[d];
        o.recv_timeout_ms = 120000;
        lnorm_client *c;
        int rv = lnorm_client_open(&c, &url, 1, &o);
        if (rv != LNORM_OK) {
            fprintf(stderr, "open %s: %s\n", url, lnorm_strerror(rv));
            return 1;
        }
        for (size_t k = 0; k < sizeof chunks / sizeof chunks[0]; k++) {
            double best = 1e30;
            lnorm_result res;
            for (int r = 0; r < reps; r++) {
                lnorm_normalize_req q;
                lnorm_normalize_req_init(&q, LNORM_OP_LAYERNORM, LNORM_DTYPE_F32, rows, hidden);
                q.x = x;
                q.y = y;
                q.chunk_bytes = chunks[k];
                memset(y, 0xff, n * 4);
                double t0 = now_s();
                rv = lnorm_normalize(c, &q, &res);
                double t = now_s() - t0;
                if (rv != LNORM_OK) {
                    fprintf(stderr, "normalize (chunk %zu, depth %d): %s: %s\n", chunks[k],
                            depths[d], lnorm_strerror(rv), res.message);
                    lnorm_client_close(c);
                    return 1;
                }
                if (!have_ref) {
                    memcpy(ref, y, n * 4);
                    have_ref = 1;
                } else if (memcmp(ref, y, n * 4) != 0) {
                    bad = 1;
                }
                if (t < best)
                    best = t;
            }
            printf("%10zu %6d %8u %10.1f %10.1f\n", chunks[k] >> 10, depths[d], res.chunks,
                   best * 1e3, 2.0 * (double)n * 4 / best / 1e6);
            fflush(stdout);
        }
        lnorm_client_close(c);
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
