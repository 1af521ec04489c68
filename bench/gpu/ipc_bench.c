/*
 * lnorm-ipc-bench: a client whose tensors live on the GPU hands them to
 * lnormd by CUDA IPC (lnorm_shm_register_cuda) and has them normalized in
 * place, no PCIe. Against a running lnormd (--backend cuda --allow-shm):
 *
 *   1. checks: y, mean, rstd of a LayerNorm (gamma, beta) and an RMSNorm
 *      against float64, outputs poisoned on the device first; a region
 *      claiming more bytes than its allocation is refused;
 *   2. measures: end-to-end time of requests on a large tensor (message
 *      out, kernel, reply back), one at a time and with --concurrency N in
 *      flight (each with its own y), as GB/s of x read + y written, beside a
 *      device-to-device copy of the same bytes on the same GPU (the HBM
 *      ceiling) and the same kernel launched in this process on the same
 *      tensor, in one run; prints them with lnormd's own compute time (the
 *      reply's timings) and writes JSON (--json).
 *
 *   lnorm-ipc-bench --url ipc:///path [--gpu 0] [--rows R --hidden H]
 *                   [--dtype bf16|f16|f32] [--iters N] [--concurrency N]
 *                   [--no-checks] [--json FILE] [--commit C]
 * Exit status 0 only when every check passed.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cuda_runtime_api.h>

#include "check.h"
#include "lnorm/lnorm.h"
#include "lnorm_cuda.h"
#include "testutil.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

#define CU(call)                                                                                            \
    do {                                                                                                    \
        cudaError_t e_ = (call);                                                                            \
        if (e_ != cudaSuccess) {                                                                            \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_));         \
            exit(1);                                                                                        \
        }                                                                                                   \
    } while (0)

typedef struct dev_case {
    int op, dt;
    uint64_t rows, hidden;
    size_t xb, yb, pb, sb;
    unsigned char *d;          /* one allocation: x, y, gamma, beta, mean, rstd, more y */
    size_t off_x, off_y, off_g, off_b, off_m, off_r, total;
    int ny;                    /* y buffers: off_y, then off_more + k * up(yb) */
    size_t off_more;
    void *hx, *hg, *hb;        /* host copies of the inputs */
} dev_case;

static size_t up(size_t n)
{
    return (n + 255) / 256 * 256;
}

static void case_make(dev_case *c, int op, int dt, uint64_t rows, uint64_t hidden, int ny, lnorm_rng *g)
{
    memset(c, 0, sizeof *c);
    c->op = op;
    c->dt = dt;
    c->rows = rows;
    c->hidden = hidden;
    c->xb = c->yb = rows * hidden * lnorm_dtype_size(dt);
    c->pb = hidden * 4;
    c->sb = rows * 4;
    c->off_y = up(c->xb);
    c->off_g = c->off_y + up(c->yb);
    c->off_b = c->off_g + up(c->pb);
    c->off_m = c->off_b + up(c->pb);
    c->off_r = c->off_m + up(c->sb);
    c->off_more = c->off_r + up(c->sb);
    c->ny = ny < 1 ? 1 : ny;
    c->total = c->off_more + (size_t)(c->ny - 1) * up(c->yb);
    CU(cudaMalloc((void **)&c->d, c->total));
    c->hx = malloc(c->xb);
    c->hg = malloc(c->pb);
    c->hb = malloc(c->pb);
    if (!c->hx || !c->hg || !c->hb)
        exit(1);
    lnorm_test_fill(g, c->hx, dt, rows * hidden, 0.5, 2.0);
    lnorm_test_fill(g, c->hg, LNORM_DTYPE_F32, hidden, 1.0, 0.3);
    lnorm_test_fill(g, c->hb, LNORM_DTYPE_F32, hidden, 0.0, 0.3);
    CU(cudaMemcpy(c->d + c->off_x, c->hx, c->xb, cudaMemcpyHostToDevice));
    CU(cudaMemcpy(c->d + c->off_g, c->hg, c->pb, cudaMemcpyHostToDevice));
    CU(cudaMemcpy(c->d + c->off_b, c->hb, c->pb, cudaMemcpyHostToDevice));
}

static void case_free(dev_case *c)
{
    cudaFree(c->d);
    free(c->hx);
    free(c->hg);
    free(c->hb);
}

static unsigned char *y_of(const dev_case *c, int k)
{
    return c->d + (k == 0 ? c->off_y : c->off_more + (size_t)(k - 1) * up(c->yb));
}

static void req_of(lnorm_normalize_req *q, const dev_case *c, int affine, int stats)
{
    lnorm_normalize_req_init(q, (lnorm_op)c->op, (lnorm_dtype)c->dt, c->rows, c->hidden);
    q->x = c->d + c->off_x;
    q->y = c->d + c->off_y;
    if (affine) {
        q->param_dtype = LNORM_DTYPE_F32;
        q->gamma = c->d + c->off_g;
        q->beta = c->d + c->off_b;
    }
    if (stats) {
        q->want_stats = 1;
        q->rstd = (float *)(void *)(c->d + c->off_r);
        if (c->op == LNORM_OP_LAYERNORM)
            q->mean = (float *)(void *)(c->d + c->off_m);
    }
}

static lnorm_shm *register_case(lnorm_client *cl, const dev_case *c, int gpu, size_t bytes, lnorm_result *res)
{
    cudaIpcMemHandle_t h;
    CU(cudaIpcGetMemHandle(&h, c->d));
    lnorm_shm *s = NULL;
    if (lnorm_shm_register_cuda(cl, &h, sizeof h, gpu, c->d, bytes, &s, res) != LNORM_OK)
        return NULL;
    return s;
}

/* One request, outputs poisoned first, checked against float64. */
static void check_case(lnorm_client *cl, int gpu, int op, int dt, uint64_t rows, uint64_t hidden, lnorm_rng *g)
{
    dev_case c;
    case_make(&c, op, dt, rows, hidden, 1, g);
    lnorm_result res;
    lnorm_shm *s = register_case(cl, &c, gpu, c.total, &res);
    CHECK(s != NULL, "register GPU memory: %s", res.message);
    if (!s) {
        case_free(&c);
        return;
    }
    CU(cudaMemset(c.d + c.off_y, 0xFF, c.yb));
    CU(cudaMemset(c.d + c.off_m, 0xFF, 2 * up(c.sb)));
    lnorm_normalize_req q;
    req_of(&q, &c, 1, 1);
    int rv = lnorm_normalize_shm(cl, &q, &res);
    CHECK(rv == LNORM_OK, "normalize on GPU memory: %s: %s", lnorm_strerror(rv), res.message);
    void *hy = malloc(c.yb);
    float *hm = malloc(c.sb), *hr = malloc(c.sb);
    CU(cudaMemcpy(hy, c.d + c.off_y, c.yb, cudaMemcpyDeviceToHost));
    CU(cudaMemcpy(hm, c.d + c.off_m, c.sb, cudaMemcpyDeviceToHost));
    CU(cudaMemcpy(hr, c.d + c.off_r, c.sb, cudaMemcpyDeviceToHost));
    lnorm_segment seg;
    lnorm_segment_init(&seg, (lnorm_op)op, (lnorm_dtype)dt, (int64_t)rows, (int64_t)hidden);
    seg.param_dtype = LNORM_DTYPE_F32;
    seg.x = c.hx;
    seg.gamma = c.hg;
    seg.beta = c.hb;
    seg.y = hy;
    seg.rstd = hr;
    seg.mean = op == LNORM_OP_LAYERNORM ? hm : NULL;
    if (rv == LNORM_OK)
        CHECK(lnorm_test_check_segment(&seg, NULL, "cuda-ipc") == 0, "op %d dtype %d %llux%llu vs float64", op, dt,
              (unsigned long long)rows, (unsigned long long)hidden);
    free(hy);
    free(hm);
    free(hr);
    lnorm_shm_destroy(s, NULL);
    case_free(&c);
}

/* Requests kept conc in flight (slot k writes y_of(c, k)): the callbacks
 * only mark their slot free; this thread sends the next request. */
typedef struct pipe_state {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int nfree, failed;
    int free_[64];
    uint64_t compute_sum;
    char why[320];
} pipe_state;

typedef struct pipe_slot {
    pipe_state *ps;
    int k;
} pipe_slot;

static void pipe_cb(void *arg, int err, const lnorm_result *res)
{
    pipe_slot *sl = arg;
    pipe_state *ps = sl->ps;
    pthread_mutex_lock(&ps->mu);
    if (err != LNORM_OK) {
        if (!ps->failed)
            snprintf(ps->why, sizeof ps->why, "%s: %s", lnorm_strerror(err), res ? res->message : "-");
        ps->failed++;
    } else if (res) {
        ps->compute_sum += res->compute_us;
    }
    ps->free_[ps->nfree++] = sl->k;
    pthread_cond_signal(&ps->cv);
    pthread_mutex_unlock(&ps->mu);
}

/* total requests, conc in flight; seconds a request (wall / total), or a
 * negative value after a failure. */
static double run_pipelined(lnorm_client *cl, const dev_case *c, int conc, int total, double *compute_us)
{
    pipe_state ps;
    memset(&ps, 0, sizeof ps);
    pthread_mutex_init(&ps.mu, NULL);
    pthread_cond_init(&ps.cv, NULL);
    pipe_slot slots[64];
    lnorm_normalize_req q[64];
    for (int k = 0; k < conc; k++) {
        slots[k].ps = &ps;
        slots[k].k = k;
        req_of(&q[k], c, 0, 0);
        q[k].y = y_of(c, k);
        ps.free_[ps.nfree++] = k;
    }
    int sent = 0;
    double t0 = now_s();
    pthread_mutex_lock(&ps.mu);
    /* (in flight: conc - nfree) */
    while (ps.nfree < conc || (sent < total && !ps.failed)) {
        while (ps.nfree > 0 && sent < total && !ps.failed) {
            int k = ps.free_[--ps.nfree];
            pthread_mutex_unlock(&ps.mu);
            int rv = lnorm_normalize_shm_async(cl, &q[k], pipe_cb, &slots[k]);
            pthread_mutex_lock(&ps.mu);
            if (rv != LNORM_OK) {
                snprintf(ps.why, sizeof ps.why, "send: %s", lnorm_strerror(rv));
                ps.failed++;
                ps.free_[ps.nfree++] = k;
                break;
            }
            sent++;
        }
        if (ps.nfree < conc)
            pthread_cond_wait(&ps.cv, &ps.mu);
    }
    pthread_mutex_unlock(&ps.mu);
    double per = (now_s() - t0) / (sent > 0 ? sent : 1);
    if (ps.failed)
        CHECK_FAIL("pipelined requests (%d in flight): %s", conc, ps.why);
    *compute_us = sent > 0 ? (double)ps.compute_sum / sent : 0;
    pthread_cond_destroy(&ps.cv);
    pthread_mutex_destroy(&ps.mu);
    return ps.failed ? -1.0 : per;
}

int main(int argc, char **argv)
{
    const char *url = NULL, *json = NULL, *commit = getenv("LNORM_COMMIT");
    int gpu = 0, iters = 50, dt = LNORM_DTYPE_BF16, conc = 1, checks = 1;
    uint64_t rows = 32768, hidden = 4096;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--no-checks")) {
            checks = 0;
            continue;
        }
        if (!v) {
            fprintf(stderr, "%s needs a value\n", a);
            return 2;
        }
        if (!strcmp(a, "--url"))
            url = v;
        else if (!strcmp(a, "--gpu"))
            gpu = atoi(v);
        else if (!strcmp(a, "--rows"))
            rows = strtoull(v, NULL, 10);
        else if (!strcmp(a, "--hidden"))
            hidden = strtoull(v, NULL, 10);
        else if (!strcmp(a, "--iters"))
            iters = atoi(v);
        else if (!strcmp(a, "--concurrency"))
            conc = atoi(v);
        else if (!strcmp(a, "--json"))
            json = v;
        else if (!strcmp(a, "--commit"))
            commit = v;
        else if (!strcmp(a, "--dtype"))
            dt = !strcmp(v, "f32") ? LNORM_DTYPE_F32 : !strcmp(v, "f16") ? LNORM_DTYPE_F16 : LNORM_DTYPE_BF16;
        else {
            fprintf(stderr, "unknown option %s\n", a);
            return 2;
        }
        i++;
    }
    if (!url || rows < 1 || hidden < 1 || iters < 1 || conc < 1 || conc > 64) {
        fprintf(stderr,
                "usage: %s --url URL [--gpu N] [--rows R] [--hidden H] [--dtype D] [--iters N] [--concurrency 1..64] "
                "[--no-checks] [--json F]\n",
                argv[0]);
        return 2;
    }
    CU(cudaSetDevice(gpu));
    lnorm_client *cl = NULL;
    lnorm_client_opts o;
    lnorm_client_opts_init(&o);
    o.recv_timeout_ms = 60000;
    if (lnorm_client_open(&cl, &url, 1, &o) != LNORM_OK) {
        fprintf(stderr, "cannot open %s\n", url);
        return 1;
    }
    lnorm_rng g;
    lnorm_rng_seed(&g, lnorm_test_seed(21));

    /* 1. correctness (--no-checks: the speed alone) */
    if (checks) {
        check_case(cl, gpu, LNORM_OP_LAYERNORM, LNORM_DTYPE_BF16, 257, 4096, &g);
        check_case(cl, gpu, LNORM_OP_RMSNORM, LNORM_DTYPE_F32, 100, 3000, &g);
        check_case(cl, gpu, LNORM_OP_LAYERNORM, LNORM_DTYPE_F16, 3, 65536, &g);
        {
            dev_case c;
            case_make(&c, LNORM_OP_RMSNORM, LNORM_DTYPE_F32, 4, 64, 1, &g);
            lnorm_result res;
            lnorm_shm *s = register_case(cl, &c, gpu, c.total + ((size_t)64 << 20), &res);
            CHECK(s == NULL && strstr(res.message, "allocation"), "a region larger than its allocation is refused: %s",
                  res.message);
            lnorm_shm_destroy(s, NULL);
            case_free(&c);
        }
    }

    /* 2. speed: one large tensor, requests one after another, then conc
     * in flight */
    dev_case c;
    case_make(&c, LNORM_OP_RMSNORM, dt, rows, hidden, conc, &g);
    lnorm_result res;
    lnorm_shm *s = register_case(cl, &c, gpu, c.total, &res);
    CHECK(s != NULL, "register the large tensor: %s", res.message);
    double gbps = 0, copy_gbps = 0, per_req_us = 0, compute_us = 0, kernel_gbps = 0;
    double pipe_us = 0, pipe_gbps = 0, pipe_compute_us = 0, queue_us = 0;
    if (s) {
        lnorm_normalize_req q;
        req_of(&q, &c, 0, 0);
        for (int i = 0; i < 3; i++)
            CHECK(lnorm_normalize_shm(cl, &q, &res) == LNORM_OK, "warm-up: %s", res.message);
        double t0 = now_s();
        uint64_t csum = 0, qsum = 0;
        for (int i = 0; i < iters; i++) {
            if (lnorm_normalize_shm(cl, &q, &res) != LNORM_OK) {
                CHECK_FAIL("request %d: %s", i, res.message);
                break;
            }
            csum += res.compute_us;
            qsum += res.queue_us;
        }
        queue_us = (double)qsum / iters;
        double dt_s = (now_s() - t0) / iters;
        compute_us = (double)csum / iters;
        per_req_us = dt_s * 1e6;
        gbps = (double)(c.xb + c.yb) / dt_s / 1e9;
        if (conc > 1) {
            for (int k = 1; k < conc; k++)
                CU(cudaMemset(y_of(&c, k), 0xFF, c.yb));
            double per = run_pipelined(cl, &c, conc, iters > 4 * conc ? iters : 4 * conc, &pipe_compute_us);
            if (per > 0) {
                pipe_us = per * 1e6;
                pipe_gbps = (double)(c.xb + c.yb) / per / 1e9;
                /* every y the same bits as the one-at-a-time y */
                unsigned char *h0 = malloc(c.yb), *hk = malloc(c.yb);
                if (!h0 || !hk)
                    exit(1);
                CU(cudaMemcpy(h0, y_of(&c, 0), c.yb, cudaMemcpyDeviceToHost));
                for (int k = 1; k < conc; k++) {
                    CU(cudaMemcpy(hk, y_of(&c, k), c.yb, cudaMemcpyDeviceToHost));
                    CHECK(memcmp(h0, hk, c.yb) == 0, "y of request slot %d (of %d in flight) differs from y", k, conc);
                }
                free(h0);
                free(hk);
            }
        }
        cudaEvent_t e0, e1;
        CU(cudaEventCreate(&e0));
        CU(cudaEventCreate(&e1));
        CU(cudaMemcpy(c.d + c.off_y, c.d + c.off_x, c.xb, cudaMemcpyDeviceToDevice));
        CU(cudaEventRecord(e0, 0));
        for (int i = 0; i < iters; i++)
            CU(cudaMemcpyAsync(c.d + c.off_y, c.d + c.off_x, c.xb, cudaMemcpyDeviceToDevice, 0));
        CU(cudaEventRecord(e1, 0));
        CU(cudaEventSynchronize(e1));
        float ms = 0;
        CU(cudaEventElapsedTime(&ms, e0, e1));
        copy_gbps = (double)(2 * c.xb) * iters / (ms * 1e-3) / 1e9;
        /* The kernel lnormd runs, here, on the same tensor. */
        lnorm_segment seg;
        lnorm_segment_init(&seg, (lnorm_op)c.op, (lnorm_dtype)c.dt, (int64_t)c.rows, (int64_t)c.hidden);
        seg.x = c.d + c.off_x;
        seg.y = c.d + c.off_y;
        const char *why = NULL;
        lnorm_batch one = {&seg, 1};
        lnorm_cuda_ws *ws = NULL; /* as lnormd's slots run it: with the stream's workspace */
        CHECK(lnorm_cuda_ws_create(&ws, 1) == LNORM_OK, "kernel in-process: lnorm_cuda_ws_create");
        CHECK(lnorm_cuda_run(&one, NULL, ws, &why) == LNORM_OK, "kernel in-process: %s", why ? why : "-");
        CU(cudaEventRecord(e0, 0));
        for (int i = 0; i < iters; i++)
            lnorm_cuda_run(&one, NULL, ws, &why);
        CU(cudaEventRecord(e1, 0));
        CU(cudaEventSynchronize(e1));
        CU(cudaEventElapsedTime(&ms, e0, e1));
        lnorm_cuda_ws_destroy(ws);
        kernel_gbps = (double)(c.xb + c.yb) * iters / (ms * 1e-3) / 1e9;
        lnorm_shm_destroy(s, NULL);
    }
    case_free(&c);
    struct cudaDeviceProp prop;
    CU(cudaGetDeviceProperties(&prop, gpu));
    printf("cuda-ipc: %s, rms %s %llu x %llu (%.0f MiB of x): %.1f us a request end to end (%.1f us of it "
           "computing in lnormd, %.1f us queued there), %.0f GB/s of x + y; device copy %.0f GB/s; ratio %.2f; the kernel in this "
           "process %.0f GB/s\n",
           prop.name, lnorm_dtype_name(dt), (unsigned long long)rows, (unsigned long long)hidden,
           (double)(rows * hidden * lnorm_dtype_size(dt)) / (1 << 20), per_req_us, compute_us, queue_us, gbps, copy_gbps,
           copy_gbps > 0 ? gbps / copy_gbps : 0, kernel_gbps);
    if (conc > 1)
        printf("cuda-ipc: %d in flight: %.1f us a request (%.1f us of it computing in lnormd), %.0f GB/s of x + y; "
               "ratio %.2f\n",
               conc, pipe_us, pipe_compute_us, pipe_gbps, copy_gbps > 0 ? pipe_gbps / copy_gbps : 0);
    if (json) {
        FILE *f = fopen(json, "w");
        if (f) {
            char date[32];
            time_t t = time(NULL);
            struct tm tm;
            gmtime_r(&t, &tm);
            strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", &tm);
            fprintf(f,
                    "{\"bench\": \"cuda-ipc\", \"device\": \"%s\", \"date\": \"%s\", \"commit\": \"%s\", "
                    "\"op\": \"rms\", \"dtype\": \"%s\", \"rows\": %llu, \"hidden\": %llu, \"iters\": %d, "
                    "\"us_per_request\": %.2f, \"server_compute_us\": %.2f, \"server_queue_us\": %.2f, \"gbps_x_plus_y\": %.1f, \"device_copy_gbps\": %.1f, \"kernel_in_process_gbps\": %.1f, "
                    "\"ratio_to_copy\": %.3f, \"concurrency\": %d, \"pipelined_us_per_request\": %.2f, "
                    "\"pipelined_server_compute_us\": %.2f, \"pipelined_gbps_x_plus_y\": %.1f, "
                    "\"pipelined_ratio_to_copy\": %.3f, \"checks_run\": %s, \"checks_failed\": %d}\n",
                    prop.name, date, commit ? commit : "unknown", lnorm_dtype_name(dt), (unsigned long long)rows,
                    (unsigned long long)hidden, iters, per_req_us, compute_us, queue_us, gbps, copy_gbps, kernel_gbps,
                    copy_gbps > 0 ? gbps / copy_gbps : 0, conc, pipe_us, pipe_compute_us, pipe_gbps,
                    copy_gbps > 0 ? pipe_gbps / copy_gbps : 0, checks ? "true" : "false", check_failures());
            fclose(f);
        }
    }
    lnorm_client_close(cl);
    return check_finish("cuda-ipc");
}
