/* The load engine: see load.h. */
#include "load.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <dirent.h>
#include <sys/resource.h>
#include <unistd.h>

#include <nng/nng.h>
#include <nng/protocol/reqrep0/req.h>

#include "devmem.h"
#include "hist.h"
#include "lnorm/types.h"
#ifdef LNORM_BENCH_HAVE_LIB
#include "lnorm/lnorm.h"
#include "lnorm/ring.h"
#endif

volatile sig_atomic_t lnorm__interrupted;

uint64_t lnorm__now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

const char *lnorm__driver_name(int d)
{
    return d == LNORM__DRV_LIB    ? "lib"
           : d == LNORM__DRV_SHM  ? "shm"
           : d == LNORM__DRV_RING ? "ring"
           : d == LNORM__DRV_CUDA ? "cuda"
                                  : "raw";
}

const char *lnorm__ek_name(int k)
{
    static const char *codes[] = {"ok", "cancelled", "unknown", "invalid_argument",
                                  "deadline_exceeded", "not_found", "already_exists",
                                  "permission_denied", "resource_exhausted",
                                  "failed_precondition", "aborted", "out_of_range",
                                  "unimplemented", "internal", "unavailable", "data_loss",
                                  "unauthenticated"};
    if (k >= 0 && k <= 16)
        return codes[k];
    switch (k) {
    case LNORM__EK_TIMEOUT: return "client_timeout";
    case LNORM__EK_TRANSPORT: return "transport";
    case LNORM__EK_ABORTED: return "aborted_at_stop";
    case LNORM__EK_DECODE: return "bad_reply";
    case LNORM__EK_VERIFY: return "verify_mismatch";
    case LNORM__EK_UNSENT: return "never_sent";
    default: return "?";
    }
}

typedef struct sample {
    size_t tmpl;
    void *y, *mean, *rstd, *res_out;
    size_t y_len, mean_len, rstd_len, res_out_len;
} sample;

typedef struct run run;

typedef struct slot {
    run *r;
    int idx;
    int sending;
    uint64_t t0;     /* intended start (open loop) or actual start */
    size_t tmpl;
    uint64_t rng;
    nng_ctx ctx;
    int ctx_open;
    nng_aio *aio;
    void *y, *res_out; /* client library outputs */
    float *mean, *rstd;
} slot;

struct run {
    const lnorm__runcfg *cfg;
    const lnorm__work *w;
    nng_socket sock;
    int sock_open;
#ifdef LNORM_BENCH_HAVE_LIB
    lnorm_client *cli;
#endif
    slot *slots;
    int nslots;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int *free_stack;
    int nfree;
    int active;
    _Atomic int stop;
    _Atomic uint64_t started;
    uint64_t t_start, t_warm, t_end, t_hard;
    lnorm__hist *hist;
    /* under mu */
    uint64_t ok, errors, err_by[LNORM__EK_N], rows, tx, rx, last_done;
    uint64_t srv_n, srv_queue, srv_compute, srv_brows, srv_breqs;
    sample *samples;
    _Atomic unsigned nsamples;
    uint64_t backlogged; /* scheduler thread only */
    uint64_t unsent;     /* scheduler thread only */
    uint64_t ok_all;     /* under mu: successful replies, warm-up included */
    int closed;          /* under mu: the transport is closed */
    int leaked;          /* it did not close: never free what NNG may use */
#ifdef LNORM_BENCH_HAVE_LIB
    /* shm, ring and cuda drivers: inputs and outputs in one region */
    lnorm_shm *shm;
    void *dev;           /* cuda: the GPU allocation that is the region */
    _Atomic int dev_busy; /* cuda: a request ended without its reply (lnormd may
                             still use the region: never freed, left to exit) */
    void **tin;          /* per template: x, residual, gamma, beta in the region */
    lnorm_ring *ring;
    pthread_t reaper;
    int reaper_on;
    _Atomic int reaper_stop;
    pthread_mutex_t pmu; /* pending descriptors (slot indices) for the reaper to submit */
    int *pend;
    int npend;
#endif
};

static void slot_start(slot *s, uint64_t t0);

/* One process's threads from /proc/<pid>/task: run time from schedstat
 * (nanoseconds) added by thread name into out (*nout kinds); the total, -1
 * when none could be read. */
static double proc_threads(pid_t pid, lnorm__thread_cpu *out, int *nout)
{
    char path[96];
    snprintf(path, sizeof path, "/proc/%d/task", (int)pid);
    DIR *d = opendir(path);
    if (!d)
        return -1;
    double total = 0;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.')
            continue;
        char sp[160], name[32] = "?";
        snprintf(sp, sizeof sp, "/proc/%d/task/%.20s/schedstat", (int)pid, e->d_name);
        FILE *f = fopen(sp, "r");
        if (!f)
            continue;
        unsigned long long ns;
        int got = fscanf(f, "%llu", &ns) == 1;
        fclose(f);
        if (!got)
            continue;
        total += (double)ns / 1e3;
        n++;
        if (!out)
            continue;
        snprintf(sp, sizeof sp, "/proc/%d/task/%.20s/comm", (int)pid, e->d_name);
        if ((f = fopen(sp, "r"))) {
            if (fgets(name, sizeof name, f))
                name[strcspn(name, "\n")] = '\0';
            fclose(f);
        }
        int k = 0;
        while (k < *nout && strcmp(out[k].name, name) != 0)
            k++;
        if (k == *nout) {
            if (*nout == LNORM__THREAD_KINDS)
                continue;
            memset(&out[k], 0, sizeof out[k]);
            snprintf(out[k].name, sizeof out[k].name, "%s", name);
            (*nout)++;
        }
        out[k].us += (double)ns / 1e3;
        out[k].threads++;
    }
    closedir(d);
    return n > 0 ? total : -1;
}

/* Without schedstat: user + system ticks from /proc/<pid>/stat. */
static double proc_ticks_us(pid_t pid)
{
    char path[96];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    char buf[1024];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    char *p = strrchr(buf, ')'); /* fields after the command name */
    if (!p)
        return -1;
    unsigned long utime, stime;
    /* state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime stime */
    if (sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &utime, &stime) != 2)
        return -1;
    return (double)(utime + stime) * 1e6 / (double)sysconf(_SC_CLK_TCK);
}

double lnorm__proc_cpu_snap(pid_t pid, lnorm__thread_cpu *out, int *nout)
{
    int dummy = 0;
    if (!nout)
        nout = &dummy;
    *nout = 0;
    double total = proc_threads(pid, out, nout);
    if (total < 0)
        total = proc_ticks_us(pid);
    if (total < 0)
        return -1;
    /* Child processes too (the workers of lnormd --workers). */
    char path[96];
    snprintf(path, sizeof path, "/proc/%d/task/%d/children", (int)pid, (int)pid);
    FILE *f = fopen(path, "r");
    if (f) {
        int c;
        while (fscanf(f, "%d", &c) == 1) {
            double t = proc_threads((pid_t)c, out, nout);
            if (t < 0)
                t = proc_ticks_us((pid_t)c);
            if (t > 0)
                total += t;
        }
        fclose(f);
    }
    return total;
}

double lnorm__proc_cpu_us(pid_t pid)
{
    return lnorm__proc_cpu_snap(pid, NULL, NULL);
}

void lnorm__thread_cpu_diff(lnorm__thread_cpu *after, int nafter, const lnorm__thread_cpu *before, int nbefore)
{
    for (int i = 0; i < nafter; i++)
        for (int j = 0; j < nbefore; j++)
            if (!strcmp(after[i].name, before[j].name)) {
                after[i].us = after[i].us >= before[j].us ? after[i].us - before[j].us : 0;
                break;
            }
}

static double self_cpu_us(void)
{
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) != 0)
        return -1;
    return (double)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * 1e6 +
           (double)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec);
}

/* One request finished (kind 0 = success). */
static void complete(slot *s, int kind, const lnorm__reply *rep, size_t tx, size_t rx)
{
    run *r = s->r;
    uint64_t now = lnorm__now_ns();
    int measured = s->t0 >= r->t_warm;
    if (measured && kind == 0)
        lnorm__hist_record(r->hist, now - s->t0);
    pthread_mutex_lock(&r->mu);
    if (kind == 0)
        r->ok_all++;
    if (measured) {
        if (kind == 0) {
            r->ok++;
            r->rows += r->w->t[s->tmpl].sh.rows;
            r->tx += tx;
            r->rx += rx;
            if (rep && rep->has_timings) {
                r->srv_n++;
                r->srv_queue += rep->queue_us;
                r->srv_compute += rep->compute_us;
                r->srv_brows += rep->batch_rows;
                r->srv_breqs += rep->batch_requests;
            }
        } else {
            r->errors++;
            r->err_by[kind]++;
        }
        if (now > r->last_done)
            r->last_done = now;
    }
    int again = 0;
    if (!r->cfg->open_loop && !atomic_load(&r->stop) && now < r->t_end && kind != LNORM__EK_TRANSPORT)
        again = 1;
    if (!again) {
        r->active--;
        if (r->cfg->open_loop)
            r->free_stack[r->nfree++] = s->idx;
        pthread_cond_broadcast(&r->cv);
    }
    pthread_mutex_unlock(&r->mu);
    if (again)
        slot_start(s, now);
}

/* A host copy of p (gpu >= 0: memory of that GPU). */
static void *dup_bytes(const void *p, size_t n, int gpu)
{
    if (!p || !n)
        return NULL;
    void *d = malloc(n);
    if (d && gpu < 0)
        memcpy(d, p, n);
    else if (d && lnorm__devmem_get(gpu, d, p, n) != 0)
        memset(d, 0xFF, n); /* poison: the check then fails and says so */
    return d;
}

static void take_sample(slot *s, const void *y, size_t yl, const void *mean, size_t ml,
                        const void *rstd, size_t rl, const void *ro, size_t rol)
{
    run *r = s->r;
    if (r->cfg->target != LNORM__TARGET_LNORMD || s->t0 < r->t_warm)
        return;
    if (atomic_load_explicit(&r->nsamples, memory_order_relaxed) >= r->cfg->verify_n)
        return;
    unsigned i = atomic_fetch_add(&r->nsamples, 1);
    if (i >= r->cfg->verify_n)
        return;
    sample *sm = &r->samples[i];
    const int gpu = r->cfg->driver == LNORM__DRV_CUDA ? r->cfg->gpu : -1;
    sm->tmpl = s->tmpl;
    sm->y = dup_bytes(y, yl, gpu), sm->y_len = yl;
    sm->mean = dup_bytes(mean, ml, gpu), sm->mean_len = ml;
    sm->rstd = dup_bytes(rstd, rl, gpu), sm->rstd_len = rl;
    sm->res_out = dup_bytes(ro, rol, gpu), sm->res_out_len = rol;
}

static int nng_kind(const run *r, int rv)
{
    if (atomic_load(&r->stop))
        return LNORM__EK_ABORTED; /* we closed the socket at the hard stop */
    if (rv == NNG_ETIMEDOUT)
        return LNORM__EK_TIMEOUT;
    if (rv == NNG_ECLOSED || rv == NNG_ECANCELED)
        return LNORM__EK_ABORTED;
    return LNORM__EK_TRANSPORT;
}

/* ---- raw NNG driver -------------------------------------------------------- */

static void raw_cb(void *arg)
{
    slot *s = arg;
    run *r = s->r;
    int rv = nng_aio_result(s->aio);
    const lnorm__tmpl *t = &r->w->t[s->tmpl];
    if (s->sending) {
        if (rv != 0) {
            nng_msg_free(nng_aio_get_msg(s->aio));
            complete(s, nng_kind(r, rv), NULL, 0, 0);
            return;
        }
        s->sending = 0;
        nng_aio_set_timeout(s->aio, r->cfg->timeout_ms);
        nng_ctx_recv(s->ctx, s->aio);
        return;
    }
    if (rv != 0) {
        complete(s, nng_kind(r, rv), NULL, 0, 0);
        return;
    }
    nng_msg *m = nng_aio_get_msg(s->aio);
    size_t len = nng_msg_len(m);
    const void *body = nng_msg_body(m);
    int kind = 0;
    lnorm__reply rep;
    memset(&rep, 0, sizeof rep);
    if (r->cfg->target == LNORM__TARGET_ECHO) {
        if (len != t->msg_len)
            kind = LNORM__EK_DECODE;
    } else if (lnorm__reply_scan(body, len, &rep) != 0) {
        kind = LNORM__EK_DECODE;
    } else if (rep.code != 0) {
        kind = rep.code > 0 && rep.code <= 16 ? rep.code : LNORM__EK_DECODE;
    } else if (rep.y_len != t->y_bytes) {
        kind = LNORM__EK_DECODE;
    } else {
        take_sample(s, rep.y, rep.y_len, rep.mean, rep.mean_len, rep.rstd, rep.rstd_len,
                    rep.res_out, rep.res_out_len);
    }
    complete(s, kind, &rep, t->msg_len, len);
    nng_msg_free(m);
}

static void raw_start(slot *s)
{
    run *r = s->r;
    const lnorm__tmpl *t = &r->w->t[s->tmpl];
    nng_msg *m;
    if (nng_msg_alloc(&m, t->msg_len) != 0) {
        complete(s, LNORM__EK_TRANSPORT, NULL, 0, 0);
        return;
    }
    memcpy(nng_msg_body(m), t->msg, t->msg_len);
    s->sending = 1;
    nng_aio_set_msg(s->aio, m);
    nng_aio_set_timeout(s->aio, r->cfg->timeout_ms);
    nng_ctx_send(s->ctx, s->aio);
}

/* ---- client library driver ------------------------------------------------- */

#ifdef LNORM_BENCH_HAVE_LIB
static void lib_cb(void *arg, int err, const lnorm_result *res)
{
    slot *s = arg;
    const lnorm__tmpl *t = &s->r->w->t[s->tmpl];
    lnorm__reply rep;
    memset(&rep, 0, sizeof rep);
    int kind = 0;
    if (err != LNORM_OK) {
        if (res && res->status > 0 && res->status <= 16)
            kind = res->status;
        else if (atomic_load(&s->r->stop))
            kind = LNORM__EK_ABORTED;
        else if (err == LNORM_ETIMEDOUT)
            kind = LNORM__EK_TIMEOUT;
        else if (err == LNORM_ECLOSED || err == LNORM_ECANCELED)
            kind = LNORM__EK_ABORTED;
        else if (err == LNORM_EPROTO)
            kind = LNORM__EK_DECODE;
        else
            kind = LNORM__EK_TRANSPORT;
    } else {
        if (res) {
            rep.has_timings = 1;
            /* a chunked call reports sums over its chunks: per-request means */
            uint32_t ch = res->chunks ? res->chunks : 1;
            rep.queue_us = res->queue_us / ch;
            rep.compute_us = res->compute_us / ch;
            rep.batch_rows = res->batch_rows;
            rep.batch_requests = res->batch_requests;
        }
        int ln = t->sh.op == LNORM_OP_LAYERNORM;
        size_t sb = s->r->w->wl.stats ? t->sh.rows * 4 : 0;
        take_sample(s, s->y, t->y_bytes, ln ? s->mean : NULL, ln ? sb : 0, s->rstd, sb,
                    t->residual ? s->res_out : NULL, t->residual ? t->x_bytes : 0);
    }
    /* bytes the replies carried: y, residual_out, mean/rstd */
    size_t rx = t->y_bytes + (t->residual ? t->x_bytes : 0) +
                (s->r->w->wl.stats ? t->sh.rows * (t->sh.op == LNORM_OP_LAYERNORM ? 8 : 4) : 0);
    complete(s, kind, &rep, t->msg_len, kind == 0 ? rx : 0);
}

static void lib_start(slot *s)
{
    run *r = s->r;
    const lnorm__tmpl *t = &r->w->t[s->tmpl];
    lnorm_normalize_req q;
    lnorm_normalize_req_init(&q, (lnorm_op)t->sh.op, (lnorm_dtype)t->sh.x_dtype, t->sh.rows,
                             t->sh.hidden);
    q.y_dtype = (lnorm_dtype)t->sh.y_dtype;
    q.eps = r->w->wl.eps;
    q.x = t->x;
    q.y = s->y;
    if (t->residual) {
        q.residual = t->residual;
        q.residual_out = s->res_out;
    }
    if (r->w->wl.params == LNORM__PARAMS_INLINE) {
        q.param_dtype = LNORM_DTYPE_F32;
        q.gamma = t->gamma;
        q.beta = t->beta;
    } else if (r->w->wl.params == LNORM__PARAMS_REGISTERED) {
        q.params_id = t->params_id;
    }
    if (r->w->wl.stats) {
        q.want_stats = 1;
        q.rstd = s->rstd;
        if (t->sh.op == LNORM_OP_LAYERNORM)
            q.mean = s->mean;
    }
    q.timeout_ms = r->cfg->timeout_ms;
    q.chunk_bytes = r->cfg->chunk_bytes;
    if (lnorm_normalize_async(r->cli, &q, lib_cb, s) != LNORM_OK)
        complete(s, LNORM__EK_TRANSPORT, NULL, 0, 0);
}
#endif

/* The request of slot s with every tensor in the run's region. */
static void shm_req(slot *s, lnorm_normalize_req *q)
{
    run *r = s->r;
    const lnorm__tmpl *t = &r->w->t[s->tmpl];
    void **in = &r->tin[4 * s->tmpl];
    lnorm_normalize_req_init(q, (lnorm_op)t->sh.op, (lnorm_dtype)t->sh.x_dtype, t->sh.rows, t->sh.hidden);
    q->y_dtype = (lnorm_dtype)t->sh.y_dtype;
    q->eps = r->w->wl.eps;
    q->x = in[0];
    q->y = s->y;
    if (t->residual) {
        q->residual = in[1];
        q->residual_out = s->res_out;
    }
    if (r->w->wl.params == LNORM__PARAMS_INLINE) {
        q->param_dtype = LNORM_DTYPE_F32;
        q->gamma = in[2];
        q->beta = in[3];
    }
    if (r->w->wl.stats) {
        q->want_stats = 1;
        q->rstd = s->rstd;
        if (t->sh.op == LNORM_OP_LAYERNORM)
            q->mean = s->mean;
    }
    q->timeout_ms = r->cfg->timeout_ms;
}

/* x (and residual) go to lnormd by DMA from the region, y comes back the
 * same way: counted as bytes sent and received, as the socket's are. */
static void shm_complete(slot *s, int kind, const lnorm__reply *rep)
{
    const lnorm__tmpl *t = &s->r->w->t[s->tmpl];
    if (kind == 0) {
        int ln = t->sh.op == LNORM_OP_LAYERNORM;
        size_t sb = s->r->w->wl.stats ? t->sh.rows * 4 : 0;
        take_sample(s, s->y, t->y_bytes, ln ? s->mean : NULL, ln ? sb : 0, s->rstd, sb,
                    t->residual ? s->res_out : NULL, t->residual ? t->x_bytes : 0);
    }
    size_t tx = t->x_bytes * (t->residual ? 2 : 1);
    size_t rx = t->y_bytes + (t->residual ? t->x_bytes : 0) +
                (s->r->w->wl.stats ? t->sh.rows * (t->sh.op == LNORM_OP_LAYERNORM ? 8 : 4) : 0);
    complete(s, kind, rep, kind == 0 ? tx : 0, kind == 0 ? rx : 0);
}

static void shm_cb(void *arg, int err, const lnorm_result *res)
{
    slot *s = arg;
    lnorm__reply rep;
    memset(&rep, 0, sizeof rep);
    int kind = 0;
    if (err != LNORM_OK) {
        if (res && res->status > 0 && res->status <= 16)
            kind = res->status;
        else if (atomic_load(&s->r->stop) || err == LNORM_ECLOSED || err == LNORM_ECANCELED)
            kind = LNORM__EK_ABORTED;
        else if (err == LNORM_ETIMEDOUT)
            kind = LNORM__EK_TIMEOUT;
        else
            kind = LNORM__EK_TRANSPORT;
        if (kind == LNORM__EK_ABORTED || kind == LNORM__EK_TIMEOUT || kind == LNORM__EK_TRANSPORT)
            atomic_store(&s->r->dev_busy, 1);
    } else if (res) {
        rep.has_timings = 1;
        rep.queue_us = res->queue_us;
        rep.compute_us = res->compute_us;
        rep.batch_rows = res->batch_rows;
        rep.batch_requests = res->batch_requests;
    }
    shm_complete(s, kind, &rep);
}

static void shm_start(slot *s)
{
    lnorm_normalize_req q;
    shm_req(s, &q);
    if (lnorm_normalize_shm_async(s->r->cli, &q, shm_cb, s) != LNORM_OK)
        complete(s, LNORM__EK_TRANSPORT, NULL, 0, 0);
}

/* Ring: the slot's descriptor waits for the reaper thread, which alone
 * uses the ring (submits and reaps). */
static void ring_start(slot *s)
{
    run *r = s->r;
    pthread_mutex_lock(&r->pmu);
    r->pend[r->npend++] = s->idx;
    pthread_mutex_unlock(&r->pmu);
}

static uint64_t ring_off(const run *r, const void *p)
{
    return p ? (uint64_t)((const unsigned char *)p - (const unsigned char *)lnorm_shm_data(r->shm)) : LNORM_RING_NONE;
}

static void *reaper_main(void *arg)
{
    run *r = arg;
    lnorm_ring_sqe q[64];
    lnorm_ring_cqe c[64];
    int pend[64];
    while (!atomic_load(&r->reaper_stop)) {
        int n = 0;
        pthread_mutex_lock(&r->pmu);
        while (n < 64 && r->npend > 0)
            pend[n++] = r->pend[--r->npend];
        pthread_mutex_unlock(&r->pmu);
        for (int i = 0; i < n; i++) {
            slot *s = &r->slots[pend[i]];
            lnorm_normalize_req rq;
            shm_req(s, &rq);
            lnorm_ring_sqe *e = &q[i];
            memset(e, 0, sizeof *e);
            e->tag = (uint64_t)pend[i];
            e->op = (uint8_t)rq.op;
            e->x_dtype = (uint8_t)rq.x_dtype;
            e->y_dtype = (uint8_t)rq.y_dtype;
            e->param_dtype = (uint8_t)rq.param_dtype;
            e->eps = rq.eps;
            e->want_stats = rq.want_stats ? 1 : 0;
            e->rows = rq.rows;
            e->hidden = rq.hidden;
            e->x = ring_off(r, rq.x);
            e->y = ring_off(r, rq.y);
            e->residual = ring_off(r, rq.residual);
            e->residual_out = ring_off(r, rq.residual_out);
            e->gamma = ring_off(r, rq.gamma);
            e->beta = ring_off(r, rq.beta);
            e->mean = ring_off(r, rq.want_stats ? rq.mean : NULL);
            e->rstd = ring_off(r, rq.want_stats ? rq.rstd : NULL);
            s->sending = 1;
        }
        /* The ring has room for every slot (entries >= slots). */
        if (n && lnorm_ring_submit(r->ring, q, n) != n)
            fprintf(stderr, "lnorm-bench: ring full (a bug: entries < requests in flight)\n");
        int got = lnorm_ring_reap(r->ring, c, 64, 1);
        for (int i = 0; i < got; i++) {
            if (c[i].tag >= (uint64_t)r->nslots)
                continue;
            slot *s = &r->slots[c[i].tag];
            lnorm__reply rep;
            memset(&rep, 0, sizeof rep);
            rep.has_timings = 1;
            rep.queue_us = c[i].queue_us;
            rep.compute_us = c[i].compute_us;
            rep.batch_rows = c[i].batch_rows;
            rep.batch_requests = c[i].batch_requests;
            s->sending = 0;
            int kind = c[i].err == LNORM_OK ? 0 : lnorm_err_to_status(c[i].err);
            shm_complete(s, kind > 0 && kind <= 16 ? kind : (c[i].err ? LNORM__EK_TRANSPORT : 0), &rep);
        }
    }
    return NULL;
}

static void slot_start(slot *s, uint64_t t0)
{
    run *r = s->r;
    uint64_t n = atomic_fetch_add(&r->started, 1);
    if (r->cfg->max_requests && n >= r->cfg->max_requests) {
        atomic_fetch_sub(&r->started, 1);
        pthread_mutex_lock(&r->mu);
        r->active--;
        if (r->cfg->open_loop)
            r->free_stack[r->nfree++] = s->idx;
        pthread_cond_broadcast(&r->cv);
        pthread_mutex_unlock(&r->mu);
        return;
    }
    s->rng ^= s->rng << 13;
    s->rng ^= s->rng >> 7;
    s->rng ^= s->rng << 17;
    s->tmpl = lnorm__work_pick(r->w, s->rng);
    s->t0 = t0;
#ifdef LNORM_BENCH_HAVE_LIB
    if (r->cfg->driver == LNORM__DRV_LIB) {
        lib_start(s);
        return;
    }
    if (r->cfg->driver == LNORM__DRV_SHM || r->cfg->driver == LNORM__DRV_CUDA) {
        shm_start(s);
        return;
    }
    if (r->cfg->driver == LNORM__DRV_RING) {
        ring_start(s);
        return;
    }
#endif
    raw_start(s);
}

/* ---- setup and teardown ----------------------------------------------------- */

static int open_raw(run *r, char *err, size_t errlen)
{
    int rv;
    if ((rv = nng_req0_open(&r->sock)) != 0) {
        snprintf(err, errlen, "nng_req0_open: %s", nng_strerror(rv));
        return -1;
    }
    r->sock_open = 1;
    nng_socket_set_ms(r->sock, NNG_OPT_REQ_RESENDTIME, NNG_DURATION_INFINITE);
    nng_socket_set_size(r->sock, NNG_OPT_RECVMAXSZ, 0);
    nng_socket_set_ms(r->sock, NNG_OPT_RECONNMINT, 20);
    char urls[LNORM__URLS_MAX][LNORM__URL_MAX];
    int nurls = lnorm__urls_split(r->cfg->url, urls);
    if (nurls == 0) {
        snprintf(err, errlen, "bad URL list '%s'", r->cfg->url);
        return -1;
    }
    for (int i = 0; i < nurls; i++) {
        if ((rv = nng_dial(r->sock, urls[i], NULL, 0)) != 0) {
            snprintf(err, errlen, "dial %.*s: %s", (int)(errlen > 64 ? errlen - 64 : 1), urls[i], nng_strerror(rv));
            return -1;
        }
    }
    for (int i = 0; i < r->nslots; i++) {
        slot *s = &r->slots[i];
        if ((rv = nng_ctx_open(&s->ctx, r->sock)) == 0)
            s->ctx_open = 1;
        if (rv != 0 || (rv = nng_aio_alloc(&s->aio, raw_cb, s)) != 0) {
            snprintf(err, errlen, "nng ctx/aio: %s", nng_strerror(rv));
            return -1;
        }
    }
    return 0;
}

#ifdef LNORM_BENCH_HAVE_LIB
static int open_lib(run *r, char *err, size_t errlen)
{
    lnorm_client_opts o;
    lnorm_client_opts_init(&o);
    o.send_timeout_ms = r->cfg->timeout_ms;
    o.recv_timeout_ms = r->cfg->timeout_ms;
    if (r->cfg->chunk_bytes)
        o.chunk_bytes = r->cfg->chunk_bytes;
    if (r->cfg->pipeline_depth)
        o.pipeline_depth = r->cfg->pipeline_depth;
    char urls[LNORM__URLS_MAX][LNORM__URL_MAX];
    const char *up[LNORM__URLS_MAX];
    int nurls = lnorm__urls_split(r->cfg->url, urls);
    for (int i = 0; i < nurls; i++)
        up[i] = urls[i];
    int rv = nurls ? lnorm_client_open(&r->cli, up, (size_t)nurls, &o) : LNORM_EINVAL;
    if (rv != LNORM_OK) {
        snprintf(err, errlen, "lnorm_client_open %s: %s", r->cfg->url, lnorm_strerror(rv));
        r->cli = NULL;
        return -1;
    }
    const lnorm__work *w = r->w;
    if (r->cfg->driver != LNORM__DRV_LIB)
        return 0; /* (shm and ring: outputs in the region, open_shm) */
    if (w->max_y_bytes > ((size_t)2 << 30) / (size_t)r->nslots) {
        snprintf(err, errlen, "%d requests in flight x %zu-byte outputs: too much memory",
                 r->nslots, w->max_y_bytes);
        return -1;
    }
    for (int i = 0; i < r->nslots; i++) {
        slot *s = &r->slots[i];
        s->y = malloc(w->max_y_bytes);
        s->res_out = malloc(w->max_x_bytes);
        s->mean = malloc(w->max_rows * 4);
        s->rstd = malloc(w->max_rows * 4);
        if (!s->y || !s->res_out || !s->mean || !s->rstd) {
            snprintf(err, errlen, "out of memory for outputs");
            return -1;
        }
    }
    return 0;
}
#endif

/* Copy n bytes into the region (gpu >= 0: memory of that GPU): 0 or -1. */
static int region_put(void *d, const void *src, size_t n, int gpu)
{
    if (gpu < 0) {
        memcpy(d, src, n);
        return 0;
    }
    return lnorm__devmem_put(gpu, d, src, n);
}

/* shm, ring and cuda drivers: one region (host memory; cuda: GPU memory
 * lent to lnormd by CUDA IPC) holds every template's inputs (copied in
 * once) and each slot's outputs; the ring, if any, at its start. */
static int open_shm(run *r, char *err, size_t errlen)
{
    const lnorm__work *w = r->w;
    const int dev = r->cfg->driver == LNORM__DRV_CUDA, gpu = dev ? r->cfg->gpu : -1;
    if (w->wl.params == LNORM__PARAMS_REGISTERED) {
        snprintf(err, errlen, "--transport shm|ring|cuda-ipc: registered params are not supported (use inline params)");
        return -1;
    }
    if (open_lib(r, err, errlen) != 0)
        return -1;
    uint32_t entries = 2;
    while (entries < (uint32_t)r->nslots)
        entries *= 2;
    size_t A = 4096, off = r->cfg->driver == LNORM__DRV_RING ? lnorm_ring_bytes(entries) : 0;
#define UP(x) (((x) + A - 1) / A * A)
    size_t need = UP(off);
    for (size_t i = 0; i < w->nt; i++) {
        const lnorm__tmpl *t = &w->t[i];
        need += UP(t->x_bytes) * (t->residual ? 2 : 1) + (t->gamma ? 2 * UP(t->sh.hidden * 4) : 0);
    }
    need += (size_t)r->nslots * (UP(w->max_y_bytes) + UP(w->max_x_bytes) + 2 * UP(w->max_rows * 4));
    lnorm_result res;
    int rv;
    if (dev) {
        unsigned char h[LNORM__DEVMEM_HANDLE_BYTES];
        if (lnorm__devmem_alloc(r->cfg->gpu, need, &r->dev, h, err, errlen) != 0)
            return -1;
        rv = lnorm_shm_register_cuda(r->cli, h, sizeof h, r->cfg->gpu, r->dev, need, &r->shm, &res);
        if (rv != LNORM_OK) {
            snprintf(err, errlen, "lnorm_shm_register_cuda (%zu bytes of GPU %d): %s: %.140s", need, r->cfg->gpu,
                     lnorm_strerror(rv), res.message);
            return -1;
        }
    } else {
        rv = lnorm_shm_create(r->cli, need, &r->shm, &res);
        if (rv != LNORM_OK) {
            snprintf(err, errlen, "lnorm_shm_create (%zu bytes): %s: %.140s", need, lnorm_strerror(rv),
                     res.message);
            return -1;
        }
    }
    unsigned char *b = lnorm_shm_data(r->shm);
    r->tin = calloc(4 * w->nt, sizeof *r->tin);
    r->pend = calloc((size_t)r->nslots, sizeof *r->pend);
    if (!r->tin || !r->pend) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    size_t o = UP(off);
    for (size_t i = 0; i < w->nt; i++) {
        const lnorm__tmpl *t = &w->t[i];
        int bad = region_put(b + o, t->x, t->x_bytes, gpu);
        r->tin[4 * i] = b + o;
        o += UP(t->x_bytes);
        if (t->residual) {
            bad |= region_put(b + o, t->residual, t->x_bytes, gpu);
            r->tin[4 * i + 1] = b + o;
            o += UP(t->x_bytes);
        }
        if (t->gamma) {
            bad |= region_put(b + o, t->gamma, t->sh.hidden * 4, gpu);
            r->tin[4 * i + 2] = b + o;
            o += UP(t->sh.hidden * 4);
            bad |= region_put(b + o, t->beta, t->sh.hidden * 4, gpu);
            r->tin[4 * i + 3] = b + o;
            o += UP(t->sh.hidden * 4);
        }
        if (bad) {
            snprintf(err, errlen, "copying the inputs into GPU memory failed");
            return -1;
        }
    }
    for (int i = 0; i < r->nslots; i++) {
        slot *s = &r->slots[i];
        s->y = b + o;
        o += UP(w->max_y_bytes);
        s->res_out = b + o;
        o += UP(w->max_x_bytes);
        s->mean = (float *)(void *)(b + o);
        o += UP(w->max_rows * 4);
        s->rstd = (float *)(void *)(b + o);
        o += UP(w->max_rows * 4);
    }
#undef UP
    if (r->cfg->driver == LNORM__DRV_RING) {
        rv = lnorm_ring_attach(r->shm, 0, entries, &r->ring, &res);
        if (rv != LNORM_OK) {
            snprintf(err, errlen, "lnorm_ring_attach: %s: %.150s", lnorm_strerror(rv), res.message);
            return -1;
        }
        pthread_mutex_init(&r->pmu, NULL);
        atomic_store(&r->reaper_stop, 0);
        if (pthread_create(&r->reaper, NULL, reaper_main, r) != 0) {
            snprintf(err, errlen, "cannot start the ring thread");
            return -1;
        }
        r->reaper_on = 1;
    }
    return 0;
}

/* Close the transport: everything still in flight completes (aborted).
 * Raw: abort each request (nng_aio_stop waits for its callback, which
 * does not start another once stop is set), close the contexts, then the
 * socket. */
static void close_transport_now(run *r)
{
#ifdef LNORM_BENCH_HAVE_LIB
    if (r->reaper_on) {
        /* Whatever is still in the ring or waiting for it ends aborted. */
        atomic_store(&r->reaper_stop, 1);
        pthread_join(r->reaper, NULL);
        r->reaper_on = 0;
        for (int i = 0; i < r->nslots; i++)
            if (r->slots[i].sending) {
                r->slots[i].sending = 0;
                complete(&r->slots[i], LNORM__EK_ABORTED, NULL, 0, 0);
            }
        pthread_mutex_lock(&r->pmu);
        int n = r->npend;
        r->npend = 0;
        pthread_mutex_unlock(&r->pmu);
        for (int i = 0; i < n; i++)
            complete(&r->slots[r->pend[i]], LNORM__EK_ABORTED, NULL, 0, 0);
    }
    int unregistered = 1;
    if (r->shm) {
        unregistered = lnorm_shm_destroy(r->shm, NULL) == LNORM_OK;
        r->shm = NULL;
        r->ring = NULL;
    }
    if (r->cli) {
        lnorm_client_close(r->cli); /* (every callback has run after it) */
        r->cli = NULL;
    }
    if (r->dev) {
        /* GPU memory lent to lnormd is freed only once lnormd let go of it:
         * unregistered, and no request of it left without a reply. */
        if (unregistered && !atomic_load(&r->dev_busy))
            lnorm__devmem_free(r->cfg->gpu, r->dev);
        else
            fprintf(stderr, "lnorm-bench: %s: the GPU region may still be in use by lnormd: kept until exit\n",
                    r->cfg->label);
        r->dev = NULL;
    }
#endif
    if (r->sock_open) {
        for (int i = 0; i < r->nslots; i++) {
            if (r->slots[i].aio)
                nng_aio_stop(r->slots[i].aio);
            if (r->slots[i].ctx_open)
                nng_ctx_close(r->slots[i].ctx);
            r->slots[i].ctx_open = 0;
        }
        nng_close(r->sock);
        r->sock_open = 0;
    }
}

static void *closer_main(void *arg)
{
    run *r = arg;
    close_transport_now(r);
    pthread_mutex_lock(&r->mu);
    r->closed = 1;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
    return NULL;
}

/* Close on a helper thread and wait at most 5 s, so that a transport that
 * does not close cannot hold the run past its hard stop. If it does not
 * close in time, the run's transport state is leaked (never freed while
 * NNG may still use it). Returns 0 if closed. */
static int close_transport(run *r)
{
    if (r->leaked)
        return -1;
    pthread_t th;
    if (pthread_create(&th, NULL, closer_main, r) != 0) {
        close_transport_now(r);
        return 0;
    }
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += 5;
    pthread_mutex_lock(&r->mu);
    while (!r->closed) {
        if (pthread_cond_timedwait(&r->cv, &r->mu, &ts) == ETIMEDOUT)
            break;
    }
    int closed = r->closed;
    pthread_mutex_unlock(&r->mu);
    if (closed) {
        pthread_join(th, NULL);
        return 0;
    }
    pthread_detach(th);
    r->leaked = 1;
    fprintf(stderr, "lnorm-bench: %s: the transport did not close within 5 s; abandoning it\n",
            r->cfg->label);
    return -1;
}

static void free_run(run *r)
{
    close_transport(r);
    if (r->leaked)
        return; /* NNG may still call back into it: keep all of it */
    if (r->slots) {
        for (int i = 0; i < r->nslots; i++) {
            slot *s = &r->slots[i];
            if (s->aio) {
                nng_aio_stop(s->aio);
                nng_aio_free(s->aio);
            }
#ifdef LNORM_BENCH_HAVE_LIB
            if (r->tin) /* (shm and ring: the outputs were in the region) */
                continue;
#endif
            free(s->y);
            free(s->res_out);
            free(s->mean);
            free(s->rstd);
        }
    }
#ifdef LNORM_BENCH_HAVE_LIB
    free(r->tin);
    free(r->pend);
#endif
    if (r->samples) {
        for (unsigned i = 0; i < r->cfg->verify_n; i++) {
            free(r->samples[i].y);
            free(r->samples[i].mean);
            free(r->samples[i].rstd);
            free(r->samples[i].res_out);
        }
    }
    free(r->samples);
    free(r->slots);
    free(r->free_stack);
    lnorm__hist_free(r->hist);
    pthread_mutex_destroy(&r->mu);
    pthread_cond_destroy(&r->cv);
}

static void fmt_ns(char *buf, size_t n, double ns)
{
    if (ns < 1e6)
        snprintf(buf, n, "%.1f us", ns / 1e3);
    else if (ns < 1e9)
        snprintf(buf, n, "%.2f ms", ns / 1e6);
    else
        snprintf(buf, n, "%.2f s", ns / 1e9);
}

static void progress(run *r, uint64_t now)
{
    pthread_mutex_lock(&r->mu);
    uint64_t ok = r->ok, errs = r->errors;
    pthread_mutex_unlock(&r->mu);
    double el = now > r->t_warm ? (double)(now - r->t_warm) / 1e9 : 0;
    char p99[32];
    fmt_ns(p99, sizeof p99, (double)lnorm__hist_quantile(r->hist, 0.99));
    char load[32];
    if (r->cfg->open_loop)
        snprintf(load, sizeof load, "rate %.0f/s", r->cfg->rate);
    else
        snprintf(load, sizeof load, "c=%d", r->cfg->concurrency);
    fprintf(stderr, "\r\033[K[%s %s] %s %.1fs  %.0f req/s  errors %llu  p99 %s", r->cfg->label,
            load, now < r->t_warm ? "warm-up" : "measuring", el,
            el > 0 ? (double)ok / el : 0.0, (unsigned long long)errs, p99);
    fflush(stderr);
}

/* Wait until nothing is in flight, or the hard stop; then close. */
static void drain(run *r)
{
    uint64_t last_progress = 0;
    pthread_mutex_lock(&r->mu);
    while (r->active > 0) {
        uint64_t now = lnorm__now_ns();
        if (lnorm__interrupted)
            atomic_store(&r->stop, 1);
        if (now >= r->t_hard)
            break;
        if (r->cfg->progress && now - last_progress >= 250000000ull) {
            pthread_mutex_unlock(&r->mu);
            progress(r, now);
            last_progress = now;
            pthread_mutex_lock(&r->mu);
        }
        uint64_t until = r->t_hard < now + 250000000ull ? r->t_hard : now + 250000000ull;
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        uint64_t d = until - now;
        ts.tv_sec += (time_t)(d / 1000000000ull);
        ts.tv_nsec += (long)(d % 1000000000ull);
        if (ts.tv_nsec >= 1000000000L)
            ts.tv_sec++, ts.tv_nsec -= 1000000000L;
        pthread_cond_timedwait(&r->cv, &r->mu, &ts);
    }
    pthread_mutex_unlock(&r->mu);
    atomic_store(&r->stop, 1);
    close_transport(r); /* in-flight requests now complete as aborted */
    /* give the aborted callbacks a moment to run (they do at once) */
    uint64_t limit = lnorm__now_ns() + 2000000000ull;
    pthread_mutex_lock(&r->mu);
    while (r->active > 0 && lnorm__now_ns() < limit) {
        pthread_mutex_unlock(&r->mu);
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
        pthread_mutex_lock(&r->mu);
    }
    pthread_mutex_unlock(&r->mu);
    if (r->cfg->progress)
        fprintf(stderr, "\r\033[K");
}

static void sleep_until(uint64_t t)
{
    struct timespec ts = {(time_t)(t / 1000000000ull), (long)(t % 1000000000ull)};
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR)
        ;
}

static void open_loop(run *r)
{
    const lnorm__runcfg *c = r->cfg;
    uint64_t next = r->t_start;
    uint64_t rng = 0x2545F4914F6CDD1Dull ^ (0xD1B54A32D192ED03ull * c->stream);
    uint64_t last_progress = lnorm__now_ns();
    double gap_ns = 1e9 / c->rate;
    /* process k of n starts k/n of a gap late: n processes interleave */
    double phase = c->nstreams > 1 ? (double)c->stream / (double)c->nstreams : 0;
    next += (uint64_t)(phase * gap_ns);
    while (!atomic_load(&r->stop) && !lnorm__interrupted && next < r->t_end) {
        if (c->max_requests && atomic_load(&r->started) >= c->max_requests)
            break;
        uint64_t now = lnorm__now_ns();
        if (c->progress && now - last_progress >= 250000000ull) {
            progress(r, now);
            last_progress = now;
        }
        if (next > now) {
            uint64_t wake = next - now > 250000000ull ? now + 250000000ull : next;
            sleep_until(wake);
            continue;
        }
        pthread_mutex_lock(&r->mu);
        int waited = 0;
        while (r->nfree == 0 && lnorm__now_ns() < r->t_hard) {
            waited = 1;
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_nsec += 50000000L;
            if (ts.tv_nsec >= 1000000000L)
                ts.tv_sec++, ts.tv_nsec -= 1000000000L;
            pthread_cond_timedwait(&r->cv, &r->mu, &ts);
        }
        if (r->nfree == 0) {
            pthread_mutex_unlock(&r->mu);
            break;
        }
        slot *s = &r->slots[r->free_stack[--r->nfree]];
        r->active++;
        pthread_mutex_unlock(&r->mu);
        if (waited && next >= r->t_warm)
            r->backlogged++;
        slot_start(s, next);
        if (c->poisson) {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            double u = ((double)(rng >> 11) + 0.5) / 9007199254740992.0;
            next += (uint64_t)(-log(u) * gap_ns);
        } else {
            next = r->t_start + (uint64_t)(((double)atomic_load(&r->started) + phase) * gap_ns);
        }
    }
    /* Arrivals the schedule had before the end but never sent (the
     * in-flight limit stayed full until the hard stop): the offered load
     * was not carried; count the measured ones. */
    uint64_t from = next > r->t_warm ? next : r->t_warm;
    if (from < r->t_end && !lnorm__interrupted &&
        !(c->max_requests && atomic_load(&r->started) >= c->max_requests))
        r->unsent = (uint64_t)((double)(r->t_end - from) / gap_ns);
}

static void verify_samples(run *r, lnorm__runres *res)
{
    unsigned n = atomic_load(&r->nsamples);
    if (n > r->cfg->verify_n)
        n = r->cfg->verify_n;
    for (unsigned i = 0; i < n; i++) {
        sample *sm = &r->samples[i];
        char why[200];
        res->verified++;
        if (lnorm__verify(r->w, &r->w->t[sm->tmpl], sm->y, sm->y_len, sm->mean, sm->mean_len,
                          sm->rstd, sm->rstd_len, sm->res_out, sm->res_out_len, why,
                          sizeof why) != 0) {
            res->mismatches++;
            if (!res->first_mismatch[0])
                snprintf(res->first_mismatch, sizeof res->first_mismatch, "%s", why);
        }
    }
    /* a mismatch is an error of that request */
    res->errors += res->mismatches;
    res->err_by[LNORM__EK_VERIFY] += res->mismatches;
    res->ok -= res->mismatches < res->ok ? res->mismatches : res->ok;
}

int lnorm__run(const lnorm__runcfg *cfg, const lnorm__work *w, lnorm__runres *res)
{
    memset(res, 0, sizeof(*res));
    snprintf(res->label, sizeof res->label, "%s", cfg->label);
    snprintf(res->driver, sizeof res->driver, "%s", lnorm__driver_name(cfg->driver));
    res->open_loop = cfg->open_loop;
    res->concurrency = cfg->concurrency;
    res->rate = cfg->rate;
    res->procs = 1;
    FILE *la = fopen("/proc/loadavg", "r");
    if (la) {
        double l1, l5, l15;
        if (fscanf(la, "%lf %lf %lf", &l1, &l5, &l15) == 3)
            snprintf(res->loadavg, sizeof res->loadavg, "%.2f %.2f %.2f", l1, l5, l15);
        fclose(la);
    }
    run *rp = calloc(1, sizeof(*rp));
    if (!rp) {
        snprintf(res->error, sizeof res->error, "out of memory");
        return -1;
    }
    rp->cfg = cfg;
    rp->w = w;
    pthread_mutex_init(&rp->mu, NULL);
    pthread_cond_init(&rp->cv, NULL);
    rp->nslots = cfg->concurrency > 0 ? cfg->concurrency : 1;
    rp->slots = calloc((size_t)rp->nslots, sizeof(slot));
    rp->free_stack = calloc((size_t)rp->nslots, sizeof(int));
    rp->samples = calloc(cfg->verify_n ? cfg->verify_n : 1, sizeof(sample));
    rp->hist = lnorm__hist_new();
    if (!rp->slots || !rp->free_stack || !rp->samples || !rp->hist) {
        snprintf(res->error, sizeof res->error, "out of memory");
        free_run(rp);
        if (!rp->leaked)
            free(rp);
        return -1;
    }
    for (int i = 0; i < rp->nslots; i++) {
        rp->slots[i].r = rp;
        rp->slots[i].idx = i;
        rp->slots[i].rng = (0x9E3779B97F4A7C15ull * (uint64_t)(i + 1) ^ (0xBF58476D1CE4E5B9ull * cfg->stream)) | 1u;
        rp->free_stack[i] = rp->nslots - 1 - i;
    }
    rp->nfree = rp->nslots;
    int rc;
#ifdef LNORM_BENCH_HAVE_LIB
    if (cfg->driver == LNORM__DRV_LIB)
        rc = open_lib(rp, res->error, sizeof res->error);
    else if (cfg->driver == LNORM__DRV_SHM || cfg->driver == LNORM__DRV_RING || cfg->driver == LNORM__DRV_CUDA)
        rc = open_shm(rp, res->error, sizeof res->error);
    else
#endif
        rc = open_raw(rp, res->error, sizeof res->error);
    if (rc != 0) {
        free_run(rp);
        if (!rp->leaked)
            free(rp);
        return -1;
    }

    if (cfg->before_start && cfg->before_start(cfg->before_arg) != 0) {
        snprintf(res->error, sizeof res->error, "not started (the other load processes failed)");
        free_run(rp);
        if (!rp->leaked)
            free(rp);
        return -1;
    }
    double total_s = cfg->warmup_s + cfg->duration_s;
    lnorm__thread_cpu thr0[LNORM__THREAD_KINDS];
    int nthr0 = 0;
    double srv_cpu0 = cfg->server_pid > 0 ? lnorm__proc_cpu_snap(cfg->server_pid, thr0, &nthr0) : -1;
    double cli_cpu0 = self_cpu_us();
    rp->t_start = lnorm__now_ns();
    rp->t_warm = rp->t_start + (uint64_t)(cfg->warmup_s * 1e9);
    rp->t_end = rp->t_start + (uint64_t)(total_s * 1e9);
    rp->t_hard = rp->t_end + (uint64_t)(cfg->grace_s * 1e9);

    if (cfg->open_loop) {
        open_loop(rp);
    } else {
        pthread_mutex_lock(&rp->mu);
        rp->active = rp->nslots;
        rp->nfree = 0;
        pthread_mutex_unlock(&rp->mu);
        for (int i = 0; i < rp->nslots; i++)
            slot_start(&rp->slots[i], lnorm__now_ns());
    }
    drain(rp);
    double srv_cpu1 = cfg->server_pid > 0 ? lnorm__proc_cpu_snap(cfg->server_pid, res->srv_threads, &res->n_srv_threads) : -1;
    lnorm__thread_cpu_diff(res->srv_threads, res->n_srv_threads, thr0, nthr0);
    double cli_cpu1 = self_cpu_us();

    /* gather */
    pthread_mutex_lock(&rp->mu);
    res->ok = rp->ok;
    res->errors = rp->errors;
    memcpy(res->err_by, rp->err_by, sizeof rp->err_by);
    res->rows = rp->rows;
    res->tx_bytes = rp->tx;
    res->rx_bytes = rp->rx;
    uint64_t last = rp->last_done;
    res->srv_n = rp->srv_n;
    if (rp->srv_n) {
        res->srv_queue_us = (double)rp->srv_queue / (double)rp->srv_n;
        res->srv_compute_us = (double)rp->srv_compute / (double)rp->srv_n;
        res->batch_rows = (double)rp->srv_brows / (double)rp->srv_n;
        res->batch_requests = (double)rp->srv_breqs / (double)rp->srv_n;
    }
    res->err_by[LNORM__EK_UNSENT] = rp->unsent;
    res->errors += rp->unsent;
    res->backlogged = rp->backlogged;
    /* requests never answered (still in flight at the hard stop) */
    pthread_mutex_unlock(&rp->mu);
    res->started = atomic_load(&rp->started);
    res->server_cpu_us_per_req = -1;
    res->client_cpu_us_per_req = -1;
    res->ok_all = rp->ok_all;
    res->server_cpu_us = srv_cpu0 >= 0 && srv_cpu1 >= srv_cpu0 ? srv_cpu1 - srv_cpu0 : -1;
    res->client_cpu_us = cli_cpu0 >= 0 && cli_cpu1 >= cli_cpu0 ? cli_cpu1 - cli_cpu0 : -1;
    res->procs = 1;
    if (rp->ok_all) {
        if (srv_cpu0 >= 0 && srv_cpu1 >= srv_cpu0)
            res->server_cpu_us_per_req = (srv_cpu1 - srv_cpu0) / (double)rp->ok_all;
        if (cli_cpu0 >= 0 && cli_cpu1 >= cli_cpu0)
            res->client_cpu_us_per_req = (cli_cpu1 - cli_cpu0) / (double)rp->ok_all;
    }
    res->elapsed_s = last > rp->t_warm ? (double)(last - rp->t_warm) / 1e9 : 0;
    if (cfg->open_loop && cfg->duration_s > 0 && res->elapsed_s < cfg->duration_s * 0.5)
        res->elapsed_s = cfg->duration_s; /* nearly nothing answered: don't inflate rates */
    verify_samples(rp, res);
    if (res->elapsed_s > 0) {
        res->rps = (double)res->ok / res->elapsed_s;
        res->rows_ps = (double)res->rows / res->elapsed_s;
        res->gbps = (double)(res->tx_bytes + res->rx_bytes) / res->elapsed_s / 1e9;
    }
    lnorm__hist *h = rp->hist;
    res->lat_count = lnorm__hist_count(h);
    if (cfg->hist_out)
        lnorm__hist_merge(cfg->hist_out, h);
    res->min_ns = lnorm__hist_quantile(h, 0);
    res->p50_ns = lnorm__hist_quantile(h, 0.5);
    res->p90_ns = lnorm__hist_quantile(h, 0.9);
    res->p99_ns = lnorm__hist_quantile(h, 0.99);
    res->p999_ns = lnorm__hist_quantile(h, 0.999);
    res->max_ns = lnorm__hist_quantile(h, 1);
    res->mean_ns = lnorm__hist_mean(h);
    for (int k = 0; k < LNORM__SPECTRUM_N; k++)
        res->spectrum_ns[k] = (double)lnorm__hist_quantile(h, 1.0 - pow(10.0, -k / 10.0));
    int leaked = rp->leaked;
    free_run(rp);
    if (!leaked)
        free(rp);
    return 0;
}

/* ---- registered params over raw NNG ----------------------------------------- */

static int call_raw(nng_socket s, const void *buf, size_t len, int *code, char *err, size_t errlen)
{
    int rv;
    nng_msg *m;
    if ((rv = nng_msg_alloc(&m, len)) != 0) {
        snprintf(err, errlen, "%s", nng_strerror(rv));
        return -1;
    }
    memcpy(nng_msg_body(m), buf, len);
    if ((rv = nng_sendmsg(s, m, 0)) != 0) {
        nng_msg_free(m);
        snprintf(err, errlen, "send: %s", nng_strerror(rv));
        return -1;
    }
    if ((rv = nng_recvmsg(s, &m, 0)) != 0) {
        snprintf(err, errlen, "recv: %s", nng_strerror(rv));
        return -1;
    }
    lnorm__reply rep;
    rv = lnorm__reply_scan(nng_msg_body(m), nng_msg_len(m), &rep);
    nng_msg_free(m);
    if (rv != 0) {
        snprintf(err, errlen, "malformed reply");
        return -1;
    }
    *code = rep.code;
    return 0;
}

int lnorm__urls_split(const char *list, char out[][LNORM__URL_MAX])
{
    int n = 0;
    for (const char *p = list; p && *p;) {
        size_t len = strcspn(p, ",");
        if (n == LNORM__URLS_MAX || len == 0 || len >= LNORM__URL_MAX)
            return 0;
        memcpy(out[n], p, len);
        out[n++][len] = '\0';
        p += len;
        if (*p == ',')
            p++;
    }
    return n;
}

static int params_setup_one(const char *url, const lnorm__work *w, int drop, char *err, size_t errlen);

int lnorm__params_setup(const char *url, const lnorm__work *w, int drop, char *err, size_t errlen)
{
    if (w->wl.params != LNORM__PARAMS_REGISTERED)
        return 0;
    /* Each server of the list (each lnormd worker) keeps its own registry. */
    char urls[LNORM__URLS_MAX][LNORM__URL_MAX];
    int nurls = lnorm__urls_split(url, urls);
    if (nurls == 0) {
        snprintf(err, errlen, "bad URL list '%s'", url);
        return -1;
    }
    for (int i = 0; i < nurls; i++)
        if (params_setup_one(urls[i], w, drop, err, errlen) != 0)
            return -1;
    return 0;
}

static int params_setup_one(const char *url, const lnorm__work *w, int drop, char *err, size_t errlen)
{
    nng_socket s;
    int rv;
    if ((rv = nng_req0_open(&s)) != 0) {
        snprintf(err, errlen, "nng_req0_open: %s", nng_strerror(rv));
        return -1;
    }
    nng_socket_set_ms(s, NNG_OPT_SENDTIMEO, 5000);
    nng_socket_set_ms(s, NNG_OPT_RECVTIMEO, 10000);
    nng_socket_set_size(s, NNG_OPT_RECVMAXSZ, 0);
    if ((rv = nng_dial(s, url, NULL, 0)) != 0) {
        snprintf(err, errlen, "dial %s: %s", url, nng_strerror(rv));
        nng_close(s);
        return -1;
    }
    int result = 0;
    for (size_t i = 0; i < w->nt && result == 0; i++) {
        const lnorm__tmpl *t = &w->t[i];
        int seen = 0; /* one call per distinct id */
        for (size_t j = 0; j < i; j++)
            if (!strcmp(w->t[j].params_id, t->params_id))
                seen = 1;
        if (seen)
            continue;
        void *buf;
        size_t len;
        int code = 0;
        if ((drop ? lnorm__encode_drop(t->params_id, &buf, &len) : lnorm__encode_register(t, &buf, &len)) != 0) {
            snprintf(err, errlen, "out of memory");
            result = -1;
            break;
        }
        if (call_raw(s, buf, len, &code, err, errlen) != 0) {
            result = -1;
        } else if (code != 0) {
            snprintf(err, errlen, "%s params '%s': status %s", drop ? "drop" : "register",
                     t->params_id, lnorm__ek_name(code));
            result = -1;
        }
        free(buf);
    }
    nng_close(s);
    return result;
}
