/*
 * lnormd_loadcheck: a small closed-loop load generator for lnormd (not a
 * test; the project's benchmarks live in bench/). THREADS threads, each with
 * its own req0 socket, send REQS Normalize requests of ROWS x HIDDEN f32
 * rows and report requests/s, rows/s, latency percentiles and the mean
 * batch size seen in the replies' timings.
 *
 *   lnormd_loadcheck URL THREADS REQS ROWS HIDDEN
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "harness.h"

static const char *url;
static int nreq, rows, hidden;

typedef struct lw {
    pthread_t t;
    int id;
    double *lat;
    long errors;
    double batch_req_sum;
} lw;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void *lw_main(void *arg)
{
    lw *w = arg;
    nng_socket s;
    if (ts_dial(&s, url) != 0) {
        w->errors = nreq;
        return NULL;
    }
    lnorm_rng g;
    lnorm_rng_seed(&g, (uint64_t)w->id + 1);
    lnorm_test_case_cfg c = {.op = LNORM_OP_RMSNORM, .x_dtype = LNORM_DTYPE_F32, .rows = rows, .hidden = hidden,
                             .gamma = 1};
    lnorm_test_case tc;
    if (lnorm_test_case_make(&tc, &c, &g) != LNORM_OK) {
        w->errors = nreq;
        return NULL;
    }
    ts_norm m;
    ts_norm_from_case(&m, &tc, 1, 1);
    size_t n = lnorm__v1__request__get_packed_size(&m.req);
    uint8_t *buf = malloc(n);
    lnorm__v1__request__pack(&m.req, buf);
    for (int i = 0; i < nreq; i++) {
        double t0 = now_s();
        Lnorm__V1__Response *r = ts_call_raw(s, buf, n);
        w->lat[i] = now_s() - t0;
        if (!r || ts_code(r) != 0)
            w->errors++;
        else if (r->timings)
            w->batch_req_sum += r->timings->batch_requests;
        if (r)
            lnorm__v1__response__free_unpacked(r, NULL);
    }
    free(buf);
    lnorm_test_case_free(&tc);
    nng_close(s);
    return NULL;
}

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
    if (argc != 6) {
        fprintf(stderr, "usage: %s URL THREADS REQS ROWS HIDDEN\n", argv[0]);
        return 2;
    }
    url = argv[1];
    int nt = atoi(argv[2]);
    nreq = atoi(argv[3]);
    rows = atoi(argv[4]);
    hidden = atoi(argv[5]);
    if (nt < 1 || nreq < 1 || rows < 1 || hidden < 1)
        return 2;
    lw *ws = calloc((size_t)nt, sizeof *ws);
    double *lat = calloc((size_t)nt * (size_t)nreq, sizeof *lat);
    double t0 = now_s();
    for (int i = 0; i < nt; i++) {
        ws[i].id = i;
        ws[i].lat = lat + (size_t)i * (size_t)nreq;
        pthread_create(&ws[i].t, NULL, lw_main, &ws[i]);
    }
    long errors = 0;
    double bsum = 0;
    for (int i = 0; i < nt; i++) {
        pthread_join(ws[i].t, NULL);
        errors += ws[i].errors;
        bsum += ws[i].batch_req_sum;
    }
    double el = now_s() - t0;
    size_t total = (size_t)nt * (size_t)nreq;
    qsort(lat, total, sizeof *lat, cmp);
    printf("%d threads x %d requests of %d x %d f32 RMSNorm: %.0f req/s, %.3g rows/s, %.1f MB/s in, "
           "latency p50 %.1f us p99 %.1f us, mean requests per batch %.2f, errors %ld\n",
           nt, nreq, rows, hidden, (double)total / el, (double)total * rows / el,
           (double)total * rows * hidden * 4 / el / 1e6, lat[total / 2] * 1e6, lat[total * 99 / 100] * 1e6,
           bsum / (double)(total - (size_t)errors ? total - (size_t)errors : 1), errors);
    free(lat);
    free(ws);
    return errors ? 1 : 0;
}
