/*
 * liblnorm: the C client library of lnormd.
 *
 * A client is one NNG REQ socket dialed to one or several lnormd URLs
 * (tcp://, ipc://, tls+tcp://); NNG reconnects by itself and spreads
 * requests over the connected servers, and liblnorm resends a request
 * whose server died or drained to another (docs/client.md). Every call is one or several
 * lnorm.v1.Request -> lnorm.v1.Response exchanges, each on its own NNG
 * context, so one client may be used from many threads at once and may
 * have many asynchronous requests in flight.
 *
 * Large normalize requests are split by rows into chunks of about
 * chunk_bytes of x each, with up to pipeline_depth chunks in flight at
 * once; the results are written straight into the caller's buffers.
 *
 * Buffers are always the caller's: the library never allocates an output
 * for the caller, and never keeps a pointer to an input after the call
 * (or, for asynchronous calls, after the completion callback).
 *
 * Every function returns LNORM_OK (0) or an lnorm error code (errors.h);
 * lnorm_strerror() describes it. Functions that talk to the server also
 * fill an optional lnorm_result with the server's status message.
 *
 * Minimal use:
 *
 *     lnorm_client *c;
 *     const char *url = "tcp://127.0.0.1:7878";
 *     if (lnorm_client_open(&c, &url, 1, NULL) != LNORM_OK) ...
 *     lnorm_normalize_req r;
 *     lnorm_normalize_req_init(&r, LNORM_OP_LAYERNORM, LNORM_DTYPE_F32, rows, hidden);
 *     r.x = x; r.y = y;
 *     lnorm_result res;
 *     int rv = lnorm_normalize(c, &r, &res);
 *     if (rv != LNORM_OK) fprintf(stderr, "%s: %s\n", lnorm_strerror(rv), res.message);
 *     lnorm_client_close(c);
 */
#ifndef LNORM_LNORM_H
#define LNORM_LNORM_H

#include <stddef.h>
#include <stdint.h>

#include "lnorm/errors.h"
#include "lnorm/types.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The library's version, "MAJOR.MINOR.PATCH". */
const char *lnorm_client_version(void);

/* Default chunk size (bytes of x per chunk) for large normalize requests,
 * chosen by measurement (docs/client.md). */
#define LNORM_DEFAULT_CHUNK_BYTES ((size_t)1 << 20)

/* Default number of chunks of one call in flight at once. */
#define LNORM_DEFAULT_PIPELINE_DEPTH 2

/* An opaque client: one socket, dialed to one or several servers. */
typedef struct lnorm_client lnorm_client;

/* Options for lnorm_client_open. Initialise with lnorm_client_opts_init and
 * change only the fields you need. Timeouts are in milliseconds; a negative
 * timeout means "wait forever". */
typedef struct lnorm_client_opts {
    int send_timeout_ms;     /* time to hand a request to a connection (default 10000) */
    int recv_timeout_ms;     /* time to wait for a reply once sent (default 30000) */
    int reconnect_min_ms;    /* NNG reconnect back-off, first wait (default 100) */
    int reconnect_max_ms;    /* NNG reconnect back-off, longest wait (default 2000) */
    int resend_ms;           /* resend a request with no reply after this long,
                                until its reply timeout; <= 0: never resend on a
                                live connection (default; requests on a dropped
                                connection are still resent elsewhere) */
    /* A request whose connection drops before its reply (server killed
     * or restarted, connection reset) is sent again, the same request, on
     * the next connection available (to the same server once it is back,
     * or to another of the client's URLs), up to 4 times per request and
     * only while the request's reply timeout, counted from its first
     * send, has not expired (each wait for a connection is also bounded by
     * send_timeout_ms). A request answered UNAVAILABLE (a draining
     * lnormd: not started) is sent to another server when the client has
     * a connection to one, and that server's URL gets nothing new for
     * max(reconnect_min_ms, reconnect_max_ms), at least 0.5 s; alone, the
     * call ends with it. The library does every resend itself (NNG's REQ
     * resend is off). A URL with no connection for 2 x max(reconnect_min_ms,
     * reconnect_max_ms), at least 1 s, has its dialer replaced (libnng
     * 1.5.2's dialer can stop for good after a server is killed). With
     * nobody listening at any URL a call fails with LNORM_EUNAVAIL ("no
     * lnormd is listening at URL"): at once when the client never had a
     * connection, else once nobody has listened for max(2 x max(
     * reconnect_min_ms, reconnect_max_ms), 2 s) (docs/client.md, Several
     * servers). Normalize, health and info are idempotent; for
     * register_params and drop_params see there. */
    size_t chunk_bytes;      /* bytes of x per chunk (0: LNORM_DEFAULT_CHUNK_BYTES) */
    int pipeline_depth;      /* chunks of one call in flight at once (0: default) */
    size_t max_recv_bytes;   /* largest reply accepted (0: 1 GiB) */
    int send_deadline;       /* non-zero: send the receive timeout as the
                                request's server-side deadline (default 0) */
    /* TLS, for tls+tcp:// URLs only. NULL: not set. */
    const char *tls_ca_file;       /* PEM file of CA certificates to trust */
    const char *tls_cert_key_file; /* PEM file with client certificate + key */
    const char *tls_server_name;   /* name to verify (default: the URL's host) */
    int tls_insecure;              /* non-zero: do not verify the server */
    /* Shared memory on the caller's behalf (docs/shm.md), off by default:
     * when > 0, a synchronous lnorm_normalize whose x + y (+ residual and
     * residual_out) is at least this many bytes, from a client whose URLs
     * are all ipc:// to a daemon that allows it shared memory, goes through
     * a region of the client's own (its tensors copied in and the outputs
     * out, instead of through the socket); calls it cannot take go over the
     * socket as usual. */
    size_t auto_shm_bytes;
} lnorm_client_opts;

/* Fill opts with the defaults. */
void lnorm_client_opts_init(lnorm_client_opts *opts);

/* Open a client dialed to nurls URLs (at least one). It probes whether
 * anybody listens at each tcp:// and ipc:// URL (at most 1 s, all at once;
 * calls then fail at once while nobody does) but does not wait for the
 * servers: a server that is down is dialed again in the background, and
 * requests wait for a connection up to send_timeout_ms. opts may be NULL
 * (defaults). Returns LNORM_OK and sets *out, LNORM_EINVAL for a malformed
 * URL or option, LNORM_ENOTSUP for an unsupported scheme, or another error
 * code. */
int lnorm_client_open(lnorm_client **out, const char *const *urls, size_t nurls,
                      const lnorm_client_opts *opts);

/* Close a client: calls in flight fail with LNORM_ECLOSED (their callbacks
 * run before this returns); replies still on their way are let arrive (at
 * most 1 s), then every resource is freed. NULL is a no-op.
 * Never call it from a completion callback of the same client (it waits
 * for that callback to return). */
void lnorm_client_close(lnorm_client *c);

/* The outcome of one call, with what the server said. */
typedef struct lnorm_result {
    int err;                 /* lnorm error code of the call (same as returned) */
    int status;              /* wire status code (lnorm.v1.Code) of the failing
                                reply, 0 if none; -1 if no reply was received */
    char message[256];       /* server's status message, or the client's reason;
                                "" on success */
    uint64_t queue_us;       /* server timings; for a chunked call the sums */
    uint64_t compute_us;     /*   over every chunk */
    uint32_t batch_rows;     /* rows / requests in the (last chunk's) batch */
    uint32_t batch_requests;
    uint32_t chunks;         /* requests the call was split into */
} lnorm_result;

/* A normalize request. Initialise with lnorm_normalize_req_init, then set
 * the pointers. Every buffer is the caller's, row-major, little-endian:
 *   x            rows * hidden elements of x_dtype (required)
 *   residual     rows * hidden elements of x_dtype (optional; then
 *                residual_out is required and receives x + residual)
 *   gamma, beta  hidden elements of param_dtype (optional, each)
 *   y            rows * hidden elements of y_dtype (required)
 *   mean, rstd   rows floats each (with want_stats; mean for LayerNorm only,
 *                either may be NULL to not receive it)
 * gamma/beta and params_id are exclusive: params_id names parameters
 * registered with lnorm_register_params.
 * An output may be exactly an input buffer (y == x normalizes in place):
 * each chunk's inputs are sent before its results are written, and a
 * resend rebuilds only chunks that have no result yet.
 * Any other overlap between an output and an input, or between two
 * outputs, is undefined (results would depend on chunking and timing). */
typedef struct lnorm_normalize_req {
    lnorm_op op;
    lnorm_dtype x_dtype;
    lnorm_dtype y_dtype;         /* LNORM_DTYPE_NONE: same as x_dtype */
    uint64_t rows;
    uint64_t hidden;
    float eps;                   /* > 0 and finite (init: LNORM_DEFAULT_EPS) */
    lnorm_eps_mode eps_mode;
    const void *x;
    const void *residual;
    lnorm_dtype param_dtype;     /* F32 or x_dtype (NONE: same as x_dtype) */
    const void *gamma;
    const void *beta;
    const char *params_id;       /* NULL or "": none */
    int want_stats;              /* non-zero: ask for mean/rstd */
    void *y;
    float *mean;
    float *rstd;
    void *residual_out;
    int timeout_ms;              /* this call's reply timeout (0: client's) */
    size_t chunk_bytes;          /* this call's chunk size (0: client's) */
    /* Batching on the server (every chunk of the call alike): */
    uint32_t priority;           /* level 1..the server's priority-levels, the
                                    highest taken first (0: its default-priority);
                                    out of range: LNORM_EINVAL from the server */
    uint64_t max_queue_us;       /* longest wait in the server's queue before
                                    compute starts; past it the chunk is answered
                                    LNORM_ETIMEDOUT, never computed (0: the
                                    server's max-queue-wait-us) */
} lnorm_normalize_req;

/* Fill a request with defaults: the given op, dtype and shape, eps =
 * LNORM_DEFAULT_EPS inside the square root, y and params of x's dtype,
 * every pointer NULL, no stats, the client's timeout and chunk size, the
 * server's default priority and queue wait. */
void lnorm_normalize_req_init(lnorm_normalize_req *req, lnorm_op op, lnorm_dtype x_dtype,
                              uint64_t rows, uint64_t hidden);

/* Check a request as the library does before sending it. Returns LNORM_OK
 * or LNORM_EINVAL; then, if why is not NULL, *why is a static message. */
int lnorm_normalize_req_check(const lnorm_normalize_req *req, const char **why);

/* Normalize synchronously: validate, read the servers' limits when a new
 * connection came up since they were last read (lnorm_info), send in
 * chunks that fit them (LNORM_ELIMIT, naming the limit, when one row
 * cannot), wait, and write y (and mean, rstd, residual_out) into the
 * caller's buffers. On failure the output buffers may be partly written.
 * res may be NULL. */
int lnorm_normalize(lnorm_client *c, const lnorm_normalize_req *req, lnorm_result *res);

/* Completion of an asynchronous call: err is the call's error code, res its
 * result (valid only during the callback), arg the caller's pointer. Runs
 * on an NNG thread: keep it short and never block in it waiting for another
 * lnorm call. */
typedef void (*lnorm_callback)(void *arg, int err, const lnorm_result *res);

/* Normalize asynchronously. The request struct is copied, but every buffer
 * it points to (and params_id) must stay valid until cb runs. Returns
 * LNORM_OK when the call was started: then cb runs exactly once, later,
 * on another thread. Any other return means the call was not started and
 * cb will not run. */
int lnorm_normalize_async(lnorm_client *c, const lnorm_normalize_req *req, lnorm_callback cb,
                          void *arg);

/* A backward request: the gradients of a LayerNorm / RMSNorm given the
 * gradient of its output (docs/client.md). Initialise with
 * lnorm_normalize_backward_req_init, then set the pointers. Buffers are the
 * caller's, row-major, little-endian:
 *   x            rows * hidden elements of x_dtype (required): what the
 *                forward normalized (x + residual when it fused one)
 *   dy           rows * hidden elements of dy_dtype (required)
 *   dres         rows * hidden elements of x_dtype (optional): the gradient
 *                that reached the forward's residual_out; added to dx
 *   gamma        hidden elements of param_dtype (optional; or params_id)
 *   mean, rstd   rows floats each, the forward's (optional: recomputed when
 *                NULL; LayerNorm takes both or neither, RMSNorm rstd only)
 *   dx           rows * hidden elements of dx_dtype (NULL: not asked for)
 *   dgamma,      hidden floats each (NULL: not asked for); at least one of
 *   dbeta        dx, dgamma, dbeta must be given
 * A large request is split by rows into chunks (chunk_bytes of x and dy
 * together) and the chunks' dgamma / dbeta are summed here, in chunk order,
 * in double: the bits depend on the chunking, not on timing. No output may
 * overlap an input. */
typedef struct lnorm_normalize_backward_req {
    lnorm_op op;
    lnorm_dtype x_dtype;
    lnorm_dtype dy_dtype;        /* LNORM_DTYPE_NONE: same as x_dtype */
    lnorm_dtype dx_dtype;        /* LNORM_DTYPE_NONE: same as x_dtype */
    uint64_t rows;
    uint64_t hidden;
    float eps;                   /* the forward's (init: LNORM_DEFAULT_EPS) */
    lnorm_eps_mode eps_mode;     /* the forward's */
    const void *x;
    const void *dy;
    const void *dres;
    lnorm_dtype param_dtype;     /* F32 or x_dtype (NONE: same as x_dtype) */
    const void *gamma;
    const char *params_id;       /* NULL or "": none (gamma of registered params) */
    const float *mean;
    const float *rstd;
    void *dx;
    float *dgamma;
    float *dbeta;
    int timeout_ms;              /* as lnorm_normalize_req */
    size_t chunk_bytes;
    uint32_t priority;
    uint64_t max_queue_us;
} lnorm_normalize_backward_req;

/* Fill a backward request with defaults, as lnorm_normalize_req_init. */
void lnorm_normalize_backward_req_init(lnorm_normalize_backward_req *req, lnorm_op op, lnorm_dtype x_dtype,
                                       uint64_t rows, uint64_t hidden);

/* Check a backward request as the library does before sending it. */
int lnorm_normalize_backward_req_check(const lnorm_normalize_backward_req *req, const char **why);

/* The backward, synchronously: dx (and dgamma, dbeta) into the caller's
 * buffers. On failure the outputs may be partly written. res may be NULL. */
int lnorm_normalize_backward(lnorm_client *c, const lnorm_normalize_backward_req *req, lnorm_result *res);

/* The backward, asynchronously (as lnorm_normalize_async). */
int lnorm_normalize_backward_async(lnorm_client *c, const lnorm_normalize_backward_req *req, lnorm_callback cb,
                                   void *arg);

/* Parameters to register on the server for later use by id. */
typedef struct lnorm_params_desc {
    const char *id;          /* 1..128 bytes of [A-Za-z0-9_.:-] */
    lnorm_dtype dtype;       /* F32, F16 or BF16 */
    uint64_t hidden;
    const void *gamma;       /* hidden elements, or NULL */
    const void *beta;        /* hidden elements, or NULL */
} lnorm_params_desc;

/* Register gamma/beta under an id (LNORM_EEXIST if the id is taken). If
 * the connection drops after the server applied the request but before its
 * reply arrived, the request is resent (see resend_ms) and may then fail
 * with LNORM_EEXIST although this very call registered the id. */
int lnorm_register_params(lnorm_client *c, const lnorm_params_desc *p, lnorm_result *res);

/* Drop registered parameters (LNORM_ENOTFOUND if the id is unknown). As
 * for register, a resend after a dropped connection may answer
 * LNORM_ENOTFOUND for parameters that this very call dropped. */
int lnorm_drop_params(lnorm_client *c, const char *id, lnorm_result *res);

/* Ask a server whether it is serving; *serving is set to 0 or 1. */
int lnorm_health(lnorm_client *c, int *serving, lnorm_result *res);

/* The most backends and devices lnorm_info reports. */
#define LNORM_INFO_MAX_BACKENDS 8
#define LNORM_INFO_MAX_DEVICES 16

/* One compute device of a server. */
typedef struct lnorm_device_desc {
    char backend[16];        /* "cpu" or "cuda" */
    char name[128];
    uint64_t memory_bytes;
    uint32_t index;
} lnorm_device_desc;

/* What lnorm_info reports about a server: version, backends, devices and
 * limits (0 for a limit the server did not report). Strings are truncated
 * to fit and always NUL-terminated. */
typedef struct lnorm_server_info {
    char version[64];
    int nbackends;
    char backends[LNORM_INFO_MAX_BACKENDS][16];
    int ndevices;
    lnorm_device_desc devices[LNORM_INFO_MAX_DEVICES];
    uint64_t max_message_bytes;
    uint64_t max_rows;
    uint64_t max_hidden;
    uint64_t max_batch_rows;
    uint64_t max_batch_bytes;
    uint64_t max_queue_requests;
    uint64_t max_params_bytes;
    uint64_t max_inflight_bytes; /* inputs + outputs of all requests the server holds */
    int shm;                     /* this caller may use shared memory (lnorm_shm_create) */
} lnorm_server_info;

/* Fill *info with a server's description. */
int lnorm_info(lnorm_client *c, lnorm_server_info *info, lnorm_result *res);

/* ---- Shared memory with a local lnormd (docs/shm.md) -----------------------
 *
 * A client whose lnormd runs on the same host (ipc:// URL, lnormd started
 * with allow-shm, same uid or one of its shm-uids) can keep its tensors in
 * regions both processes map: requests then name them instead of carrying
 * them, and lnormd reads x and writes y in place (DMA to and from the GPU).
 * A region lives until lnorm_shm_destroy, or until the connection that
 * registered it closes. */

typedef struct lnorm_shm lnorm_shm;

/* Create a region of `bytes` bytes (a sealed memfd, mapped here, zeroed)
 * and register it with the daemon. LNORM_EPERM when the daemon does not
 * allow this caller shared memory (res says why). */
int lnorm_shm_create(lnorm_client *c, size_t bytes, lnorm_shm **out, lnorm_result *res);
/* Register GPU memory of this process with the daemon (CUDA IPC): handle
 * is the cudaIpcMemHandle_t (handle_len 64) of the allocation holding
 * [dev_ptr, dev_ptr + bytes) on GPU device (dev_ptr is where the handle's
 * allocation starts here). Requests whose tensors all lie in such regions
 * of one GPU are computed there in place, with no copy. The region is the
 * caller's memory: lnorm_shm_destroy only unregisters it. liblnorm itself
 * does not use CUDA. */
int lnorm_shm_register_cuda(lnorm_client *c, const void *handle, size_t handle_len, int device, void *dev_ptr,
                            size_t bytes, lnorm_shm **out, lnorm_result *res);
/* The region's memory, size and id (as the daemon knows it). */
void *lnorm_shm_data(const lnorm_shm *s);
size_t lnorm_shm_size(const lnorm_shm *s);
uint64_t lnorm_shm_id(const lnorm_shm *s);
/* Unregister and unmap (no request using it may be in flight); frees s
 * (lnorm_client_close frees the regions left, without asking the daemon)
 * whatever the daemon answers. NULL: nothing. */
int lnorm_shm_destroy(lnorm_shm *s, lnorm_result *res);

/* Normalize with every buffer of req (x, y, and any of residual,
 * residual_out, gamma, beta, mean, rstd given) inside regions of this
 * client: one small message names them, nothing is copied, and the call
 * is not chunked (chunk_bytes is ignored; lnormd splits large requests
 * itself). LNORM_EINVAL when a buffer is not inside a region. */
int lnorm_normalize_shm(lnorm_client *c, const lnorm_normalize_req *req, lnorm_result *res);
/* The same, asynchronously (see lnorm_normalize_async). */
int lnorm_normalize_shm_async(lnorm_client *c, const lnorm_normalize_req *req, lnorm_callback cb, void *arg);

/* A submission ring (include/lnorm/ring.h) in a region: requests go
 * through shared memory, not the socket. One thread at a time may use a
 * ring (submit and reap); at most lnorm_ring_entries requests may be
 * submitted and not yet reaped. The ring lives as long as its region. */
typedef struct lnorm_ring lnorm_ring;
struct lnorm_ring_sqe;
struct lnorm_ring_cqe;

/* Attach a ring of `entries` entries (a power of two, 2..65536) at offset
 * (a multiple of 64) of region s; lnorm_ring_bytes(entries) bytes there
 * belong to the ring from now on. */
int lnorm_ring_attach(lnorm_shm *s, size_t offset, uint32_t entries, lnorm_ring **out, lnorm_result *res);
uint32_t lnorm_ring_entries(const lnorm_ring *r);
/* Requests submitted and not yet reaped. */
uint32_t lnorm_ring_outstanding(const lnorm_ring *r);
/* Publish up to n descriptors (offsets into the ring's region); returns how
 * many went (fewer when the ring is full), and wakes lnormd if it sleeps. */
int lnorm_ring_submit(lnorm_ring *r, const struct lnorm_ring_sqe *sqes, int n);
/* Take up to max completions; wait up to timeout_ms (< 0: forever) for
 * the first when none is there. Returns how many (0: timed out). */
int lnorm_ring_reap(lnorm_ring *r, struct lnorm_ring_cqe *out, int max, int timeout_ms);

#ifdef __cplusplus
}
#endif
#endif /* LNORM_LNORM_H */
