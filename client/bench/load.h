/*
 * The load engine of lnorm-bench: one measured run (one concurrency or one
 * offered rate) against one target, closed or open loop, over raw NNG
 * (req0 contexts, one per request in flight) or over the client library's
 * asynchronous API. Every run stops by itself: at the duration or request
 * bound, each request has a timeout, and at duration + grace the socket is
 * closed, which ends whatever is still in flight.
 */
#ifndef LNORM_BENCH_LOAD_H
#define LNORM_BENCH_LOAD_H

#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "work.h"

enum { LNORM__TARGET_LNORMD = 0, LNORM__TARGET_ECHO = 1 };
/* raw NNG; the client library over the socket; the client library with
 * every tensor in shared memory (--transport shm); a submission ring
 * (--transport ring). */
enum { LNORM__DRV_RAW = 0, LNORM__DRV_LIB = 1, LNORM__DRV_SHM = 2, LNORM__DRV_RING = 3, LNORM__DRV_CUDA = 4 };
const char *lnorm__driver_name(int d);

/* Error kinds: wire codes 1..16 as themselves, then the client's own. */
enum {
    LNORM__EK_TIMEOUT = 17,   /* no reply within the request timeout */
    LNORM__EK_TRANSPORT = 18, /* NNG or client library failure */
    LNORM__EK_ABORTED = 19,   /* still in flight at the hard stop */
    LNORM__EK_DECODE = 20,    /* malformed or mis-sized reply */
    LNORM__EK_VERIFY = 21,    /* reply differs from the reference */
    LNORM__EK_UNSENT = 22,    /* open loop: scheduled in the measured time, never
                                 sent (the in-flight limit stayed full) */
    LNORM__EK_N = 23
};
const char *lnorm__ek_name(int k);

/* Points of the latency spectrum kept per run: quantile 1 - 10^(-k/10),
 * k = 0..LNORM__SPECTRUM_N-1 (0 .. 99.999%). */
#define LNORM__SPECTRUM_N 51

/* CPU time of a group of threads of the same name (server processes). */
#define LNORM__THREAD_KINDS 24
typedef struct lnorm__thread_cpu {
    char name[20];
    int threads;
    double us;
} lnorm__thread_cpu;

/* CPU time in microseconds of pid and its child processes (-1: unknown);
 * with out, also by thread name (at most LNORM__THREAD_KINDS, *nout). */
double lnorm__proc_cpu_snap(pid_t pid, lnorm__thread_cpu *out, int *nout);
double lnorm__proc_cpu_us(pid_t pid); /* the same without the names */
/* after -= before, name by name. */
void lnorm__thread_cpu_diff(lnorm__thread_cpu *after, int nafter, const lnorm__thread_cpu *before, int nbefore);

/* Longest URL, most URLs in a --url list. */
#define LNORM__URL_MAX 512
#define LNORM__URLS_MAX 64

/* Split a comma-separated URL list into out; the count (0: none, or an
 * entry too long, or more than LNORM__URLS_MAX). */
int lnorm__urls_split(const char *list, char out[][LNORM__URL_MAX]);

typedef struct lnorm__runcfg {
    const char *url;        /* one URL or several, comma-separated: every
                               socket dials them all (NNG spreads requests) */
    const char *label;      /* "lnormd" or "echo" */
    int target;             /* LNORM__TARGET_* */
    int driver;             /* LNORM__DRV_* */
    int open_loop;
    int concurrency;        /* closed: requests in flight; open: the most in flight */
    double rate;            /* open loop: requests/s offered */
    int poisson;            /* open loop: exponential gaps (else constant) */
    double duration_s;      /* measured time (after warm-up); 0: none */
    double warmup_s;
    double grace_s;         /* after the end, wait this long for replies */
    uint64_t max_requests;  /* 0: none */
    int timeout_ms;         /* per request */
    unsigned verify_n;      /* replies to check against the reference */
    int progress;           /* live line on stderr */
    size_t chunk_bytes;     /* client library: chunk size (0: its default) */
    int pipeline_depth;     /* client library: chunks in flight (0: default) */
    int gpu;                /* cuda driver: the GPU whose memory holds the tensors */
    int server_pid;         /* the server's process id when known (spawned), else 0:
                               its CPU time per request is then reported */
    unsigned stream;        /* this process's index among nstreams load processes */
    unsigned nstreams;      /* (0 or 1: one): varies the random streams and the
                               open-loop phase, so processes do not send in lockstep */
    /* Called once the transport is open, just before the clock starts (a
     * barrier across processes); nonzero ends the run unmeasured. */
    int (*before_start)(void *arg);
    void *before_arg;
    struct lnorm__hist *hist_out; /* when set, the run's latencies are added to it */
} lnorm__runcfg;

typedef struct lnorm__runres {
    char label[32];
    char driver[8];
    int open_loop;
    int concurrency;
    double rate;
    double elapsed_s;
    uint64_t started, ok, errors;
    uint64_t err_by[LNORM__EK_N];
    uint64_t rows, tx_bytes, rx_bytes;
    double rps, rows_ps, gbps;
    uint64_t min_ns, p50_ns, p90_ns, p99_ns, p999_ns, max_ns;
    double mean_ns;
    double spectrum_ns[LNORM__SPECTRUM_N];
    uint64_t srv_n;
    double srv_queue_us, srv_compute_us, batch_rows, batch_requests; /* means */
    uint64_t verified, mismatches;
    char first_mismatch[200];
    uint64_t backlogged;    /* open loop: sends delayed by the in-flight limit */
    char error[200];        /* set when the run could not start */
    double server_cpu_us_per_req; /* server process CPU (user+sys) per answered
                                     request, warm-up included; -1 unknown */
    double client_cpu_us_per_req; /* lnorm-bench's own, the same way */
    char loadavg[32];       /* /proc/loadavg (1, 5, 15 min) when the point began */
    uint64_t ok_all;        /* successful replies, warm-up included */
    double server_cpu_us, client_cpu_us; /* CPU over the run (both -1: unknown) */
    lnorm__thread_cpu srv_threads[LNORM__THREAD_KINDS]; /* server CPU over the run by thread name */
    int n_srv_threads;
    uint64_t lat_count;     /* latencies in the histogram (measured successes) */
    int procs;              /* load processes merged into this result (>= 1) */
    struct lnorm__runres *parts; /* procs > 1: each process's own result */
} lnorm__runres;

/* Run one measurement. Returns 0 (then res is filled, errors counted in
 * it) or -1 if the run could not start (res->error says why). */
int lnorm__run(const lnorm__runcfg *cfg, const lnorm__work *w, lnorm__runres *res);

/* Register (or drop, with drop != 0) every template's params on the target
 * at url over raw NNG. Returns 0 or -1 with a message in err. */
int lnorm__params_setup(const char *url, const lnorm__work *w, int drop, char *err, size_t errlen);

/* Set (by a SIGINT handler) to end the current run early. */
extern volatile sig_atomic_t lnorm__interrupted;


/* Monotonic clock in nanoseconds. */
uint64_t lnorm__now_ns(void);

#endif /* LNORM_BENCH_LOAD_H */
