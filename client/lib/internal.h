/*
 * Internals of liblnorm shared by its source files: the client object, the
 * pool of NNG contexts, and the generic "call" that sends one or several
 * Request messages (chunks) and collects their Responses.
 */
#ifndef LNORM_CLIENT_INTERNAL_H
#define LNORM_CLIENT_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include <nng/nng.h>
#include <nng/supplemental/util/platform.h>

#include "lnorm.pb-c.h"
#include "lnorm/lnorm.h"

typedef struct lnorm__slot lnorm__slot;
typedef struct lnorm__call lnorm__call;

/* Bytes inside a received message (not NUL-terminated). */
typedef struct lnorm__span {
    const uint8_t *p;
    size_t n;
} lnorm__span;

/* What lnorm__resp_parse finds in a Response, pointing into the message. */
typedef struct lnorm__resp_view {
    uint64_t request_id;
    int code;                /* Status.code (0 when absent) */
    lnorm__span message;     /* Status.message */
    uint64_t queue_us, compute_us;
    uint32_t batch_rows, batch_requests;
    int body;                /* field number of the body (10..19), 0: none */
    lnorm__span body_bytes;  /* the body message's encoding */
} lnorm__resp_view;

/* Parse a Response without copying. LNORM_OK or LNORM_EPROTO. */
int lnorm__resp_parse(const void *buf, size_t n, lnorm__resp_view *v);

/* Find fields 1..4 (y, mean, rstd, residual_out) of a NormalizeResponse
 * body; out[0] is unused. LNORM_OK or LNORM_EPROTO. */
int lnorm__norm_parse(lnorm__span body, lnorm__span out[5]);

/* What a kind of call does with its chunks: build the request message of
 * chunk i with request id id (called again, with the same id, to resend the
 * chunk after its connection dropped: it must then build the same message),
 * and take the reply of chunk i (status already OK). */
typedef struct lnorm__call_ops {
    int (*make)(lnorm__call *call, uint64_t i, uint64_t id, nng_msg **out);
    int (*take)(lnorm__call *call, uint64_t i, const lnorm__resp_view *resp);
} lnorm__call_ops;

/* One call in flight: nchunks exchanges, at most depth at once. */
struct lnorm__call {
    lnorm_client *c;
    const lnorm__call_ops *ops;
    void *data;              /* the kind's own state */
    uint64_t nchunks;
    uint64_t next;           /* next chunk to start */
    uint64_t finished;       /* chunks whose reply has been handled */
    int inflight;
    int depth;
    nng_duration recv_timeout;
    uint64_t deadline_us;
    int failed;              /* set once: no more chunks are started */
    int completed;
    lnorm_result res;
    lnorm_callback cb;
    void *cb_arg;
    void (*cleanup)(lnorm__call *call); /* frees data; may be NULL */
};

/* Messages kept for reuse per client (at most; see lnorm__msg_put). */
#define LNORM__MSG_POOL 8

/* At most this many resends of one chunk after its connection dropped
 * (resends after resend_ms are bounded by the reply timeout instead). */
#define LNORM__MAX_RESENDS 4

/* One NNG context and its aio, reused from call to call. */
struct lnorm__slot {
    lnorm__slot *next_free;
    lnorm_client *c;
    nng_ctx ctx;
    nng_aio *aio;
    int sending;
    lnorm__call *call;
    uint64_t chunk;
    uint64_t id;             /* request id of the chunk (kept for resends) */
    int resends;             /* resends after a dropped connection */
    int timer_resends;       /* resends after resend_ms without a reply */
    int has_send_by;         /* 0: the wait for a connection is unbounded */
    nng_time send_by;        /* end of the current send's wait for a connection */
    int sent;                /* the chunk's first send has completed */
    int has_deadline;        /* 0: the reply timeout is infinite */
    nng_time deadline;       /* first send + reply timeout */
};

/* One URL of a client and the NNG dialer that keeps it connected. */
typedef struct lnorm__dial {
    char *url;
    nng_dialer d;
} lnorm__dial;

/* A send that finds no connection for this long (at least) has the
 * client's dialers replaced (see lnorm__redial_if_stuck). */
#define LNORM__REDIAL_MIN_MS 1000

/* Idle regions a client keeps for auto_shm_bytes calls. */
#define LNORM__AUTO_KEEP 4

struct lnorm_client {
    nng_socket sock;
    lnorm_client_opts opts;  /* the TLS strings are the client's own copies */
    lnorm__dial *dials;
    size_t ndials;
    int npipes;              /* connections up (NNG pipe events) */
    nng_time idle_since;     /* when npipes last fell to 0, or the last redial */
    int redialing;           /* a thread is replacing the dialers */
    nng_duration redial_ms;  /* no connection for this long: redial */
    nng_mtx *mtx;
    nng_cv *cv;
    int closing;
    int ncalls;              /* calls not yet completed */
    uint64_t next_id;
    lnorm__slot *free_slots;
    lnorm__slot **all_slots; /* every slot ever made, freed at close */
    size_t nslots, cap_slots;
    /* Reply messages kept to carry later requests (lnorm__msg_get/put):
     * NNG allocates message bodies zeroed, so a fresh 1 MiB request costs a
     * 1 MiB memset before its payload is even copied in. */
    nng_msg *msg_pool[LNORM__MSG_POOL];
    int npool;
    struct lnorm_shm *shms;  /* regions this client registered (under mtx) */
    /* auto_shm_bytes (auto_shm.c), under mtx: */
    int auto_state;          /* 0: not known yet, 1: on, -1: off */
    struct lnorm_shm *auto_idle[LNORM__AUTO_KEEP];
    int nauto_idle;
};

/* lnorm_normalize through a region of the client's own when
 * opts.auto_shm_bytes asks for it: the call's result, or LNORM__AUTO_NO when
 * the call should go over the socket. */
#define LNORM__AUTO_NO (-1000)
int lnorm__auto_normalize(lnorm_client *c, const lnorm_normalize_req *req, lnorm_result *res);
/* Forget the idle regions (at close, before lnorm__shm_forget_all). */
void lnorm__auto_forget(lnorm_client *c);

/* Start a call (already filled: ops, data, nchunks, depth, timeouts, cb).
 * On LNORM_OK the callback will run exactly once, on an NNG thread; on
 * error it will not, the call has been cleaned up and freed, and *res (may
 * be NULL) says why. An error can also come after some chunks were
 * exchanged (a later chunk could not be built): their outputs are then
 * written. The call must be malloc'ed. */
int lnorm__call_start(lnorm__call *call, lnorm_result *res);

/* Run a call synchronously: start it and wait; fills *res (may be NULL). */
int lnorm__call_sync(lnorm__call *call, lnorm_result *res);

/* Allocate a call for client c with the client's defaults. */
int lnorm__call_new(lnorm_client *c, const lnorm__call_ops *ops, lnorm__call **out);

/* Record a failure in a result (first one wins); the message is printf-like. */
void lnorm__result_fail(lnorm_result *r, int err, int status, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* Serialize a Request into a fresh NNG message. */
int lnorm__pack(const Lnorm__V1__Request *req, nng_msg **out);

/* A message with a body of n bytes (contents undefined): a kept one that
 * is large enough, else a new one. NULL when out of memory. */
nng_msg *lnorm__msg_get(lnorm_client *c, size_t n);

/* Keep a message that is no longer needed for a later lnorm__msg_get, or
 * free it (pool full, or larger than twice the chunk size plus 1 MiB). */
void lnorm__msg_put(lnorm_client *c, nng_msg *m);

/* Tests: the request message of chunk i of a normalize call (as sent, with
 * request id id); *nchunks is the call's number of chunks. */
int lnorm__normalize_chunk_msg(lnorm_client *c, const lnorm_normalize_req *req, uint64_t i, uint64_t id,
                               uint64_t *nchunks, nng_msg **out);

/* The next request id of a client. */
uint64_t lnorm__next_id(lnorm_client *c);

/* Whether id is 1..128 bytes of [A-Za-z0-9_.:-]. */
int lnorm__valid_params_id(const char *id);

/* Unmap and free every region of c (at close, the socket already closed). */
void lnorm__shm_forget_all(lnorm_client *c);

/* Map an NNG error to an lnorm error code. */
int lnorm__from_nng(int rv);

#endif /* LNORM_CLIENT_INTERNAL_H */
