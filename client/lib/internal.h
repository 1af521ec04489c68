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
    lnorm__slot *next_held;  /* in the client's held_slots */
    nng_msg *held_reply;     /* the UNAVAILABLE reply it holds */
};

/* One URL of a client, the NNG dialer that keeps it connected, and
 * whether anybody listens there (reach.c). Fields under the client's mtx. */
typedef struct lnorm__dial {
    char *url;
    nng_dialer d;
    int npipes;              /* its connections up */
    nng_time idle_since;     /* when npipes last fell to 0, or the dialer was replaced */
    int refused;             /* the latest probe found nobody listening */
    int probing;             /* a probe is in flight */
    int held;                /* answered UNAVAILABLE: no dialer until held_until */
    nng_time held_until;
    int close_now;           /* the keeper is to close its dialer */
    nng_stream_dialer *probe; /* NULL: the scheme is not probed */
    nng_aio *probe_aio;
    nng_stream *probe_conn;  /* the probe's connection, during its handshake */
    int probe_step;          /* 1 connect, 2 send the SP header, 3 receive the server's */
    size_t probe_done;       /* bytes of the step done */
    uint8_t probe_hdr[8];
    struct lnorm_client *owner;
} lnorm__dial;

/* A connection of the client: from its ADD_PRE to its REM_POST event. */
typedef struct lnorm__pipe_rec {
    uint32_t id;
    int dial;                /* index into dials, -1: not known */
    int closed;              /* closed by the client (its server answered UNAVAILABLE) */
} lnorm__pipe_rec;

/* A URL with no connection for this long (at least) has its dialer
 * replaced (see keeper in client.c). */
#define LNORM__REDIAL_MIN_MS 1000

/* Idle regions a client keeps for auto_shm_bytes calls. */
#define LNORM__AUTO_KEEP 4

/* A client that had a connection and lost every one waits at least this
 * long for a server to listen again (a restart) before a request fails
 * with LNORM_EUNAVAIL (see lnorm__no_server). */
#define LNORM__UNAVAIL_MIN_MS 2000

/* A URL whose server answered UNAVAILABLE (draining) while others serve
 * is dialed again after max(reconnect_min_ms, reconnect_max_ms), at
 * least this long. */
#define LNORM__HOLD_MIN_MS 500
/* The longest lnorm_client_close waits for replies still on their way
 * (client.c: await_replies). */
#define LNORM__CLOSE_LINGER_MS 1000
/* The longest the keeper waits for replies due on connections it closes
 * (a server answering UNAVAILABLE answers the rest at once). */
#define LNORM__PIPE_LINGER_MS 250

/* Connections (of no known URL) waiting for the keeper to close them. */
#define LNORM__CLOSE_QUEUE 16

/* How long a probe waits for its connect; how often probes are repeated
 * while requests wait without a connection. */
#define LNORM__PROBE_TIMEOUT_MS 1000
#define LNORM__PROBE_EVERY_MS 200

struct lnorm_client {
    nng_socket sock;
    lnorm_client_opts opts;  /* the TLS strings are the client's own copies */
    lnorm__dial *dials;
    size_t ndials;
    int npipes;              /* connections up (NNG pipe events) */
    int nlive;               /* of those, not closed by the client */
    lnorm__pipe_rec *pipes;  /* the connections up */
    size_t cap_pipes;
    uint64_t pipes_gen;      /* connections ever added */
    int ever_connected;
    nng_time idle_since;     /* when nlive last fell to 0 */
    nng_thread *keeper;      /* changes dialers and connections (client.c) */
    nng_cv *keeper_cv;
    nng_pipe close_pipes[LNORM__CLOSE_QUEUE]; /* for the keeper to close */
    int nclose;
    lnorm__slot *held_slots; /* answered UNAVAILABLE, for the keeper to resend */
    nng_duration redial_ms;  /* a URL with no connection for this long: redial */
    nng_duration unavail_ms; /* see LNORM__UNAVAIL_MIN_MS */
    nng_duration hold_ms;    /* see LNORM__HOLD_MIN_MS */
    nng_time probe_at;       /* when the last probe round started */
    int nprobing;            /* probes in flight */
    /* The servers' limits (Info), read once per new connection (limits.c). */
    int lim_tried;           /* an Info call was made */
    int lim_fetching;
    uint64_t lim_gen;        /* pipes_gen when the last read started */
    nng_time lim_at;
    uint64_t max_message_bytes; /* the smallest reported; 0: none */
    nng_mtx *mtx;
    nng_cv *cv;
    int closing;
    int gate_shut;           /* no more nng_ctx_send/recv (client.c: gate_enter) */
    int in_nng;              /* threads inside one */
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

/* ---- reach.c: whether anybody listens at the client's URLs --------------- */

/* Set up the probes of c's URLs (at open). LNORM_OK or LNORM_ENOMEM. */
int lnorm__probe_init(lnorm_client *c);

/* Start a probe of every URL not being probed. Called with c->mtx held. */
void lnorm__probe_start_locked(lnorm_client *c);

/* Stop and free the probes (at close, the socket closed). */
void lnorm__probe_fini(lnorm_client *c);

/* Whether a request must fail for want of a server (then *why says so,
 * naming the URLs): no connection, the latest probe found nobody
 * listening at any URL, and the client either never had a connection or
 * has had none for unavail_ms. With no connection, starts a probe round
 * when the last is older than LNORM__PROBE_EVERY_MS. */
int lnorm__no_server(lnorm_client *c, char *why, size_t n);

/* ---- limits.c: the servers' limits ------------------------------------------ */

/* The largest request message a server of c accepts (0: not known). */
uint64_t lnorm__max_message(lnorm_client *c);

/* Read the limits now (synchronously, within timeout_ms: 0 the client's)
 * when they were never read, or a new connection came up since they last
 * were (at most once a second). LNORM_OK, or the error of an Info call
 * that reached no server (then *res says why; res may be NULL); a server
 * that answers Info with an error leaves the limits as they were. */
int lnorm__limits_refresh(lnorm_client *c, int timeout_ms, lnorm_result *res);

/* The same, asynchronously: the call that asks does not wait. */
void lnorm__limits_kick(lnorm_client *c);

/* Cap *rows (rows per chunk of a normalize call) so that a chunk's request
 * stays within the servers' max-message-bytes and its reply within
 * max_recv_bytes: req_row / reply_row bytes per row, fixed bytes per
 * request besides. LNORM_ELIMIT when one row does not fit: *why then
 * names the limit (thread-local text, valid until the next call). */
int lnorm__fit_rows(lnorm_client *c, size_t req_row, size_t fixed, size_t reply_row, uint64_t *rows,
                    const char **why);

/* lnorm_info with a reply timeout (0: the client's); cb NULL: synchronous,
 * *res filled (may be NULL). With cb, info must live until cb runs. */
int lnorm__info_call(lnorm_client *c, lnorm_server_info *info, int timeout_ms, lnorm_callback cb, void *arg,
                     lnorm_result *res);

/* Fold an Info reply's limits into c's. */
void lnorm__limits_note(lnorm_client *c, const lnorm_server_info *info);

/* Map an NNG error to an lnorm error code. */
int lnorm__from_nng(int rv);

#endif /* LNORM_CLIENT_INTERNAL_H */
