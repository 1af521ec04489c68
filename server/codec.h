/*
 * The codec: lnorm.v1 protobuf messages <-> lnormd's request description.
 * Decoding VALIDATES EVERYTHING before any work is done; a request that
 * passes describes a segment the core will accept. Pure functions: no
 * daemon, no threads, no global state (usable from a fuzzer).
 */
#ifndef LNORM_SERVER_CODEC_H
#define LNORM_SERVER_CODEC_H

#include <stddef.h>
#include <stdint.h>

#include <nng/nng.h>
#include <protobuf-c/protobuf-c.h>

#include "lnorm.pb-c.h"
#include "lnorm_core.h"

/* Limits applied while decoding. */
typedef struct lnorm__limits {
    uint64_t max_message_bytes;
    uint64_t max_rows;
    uint64_t max_hidden;  /* also capped at LNORM_CORE_MAX_HIDDEN */
} lnorm__limits;

/* The field number liblnorm pads requests with (in NormalizeRequest, before
 * x) and lnormd pads in-place replies with (in Response): bytes, unknown to
 * the schema, skipped by every reader. */
#define LNORM__PAD_FIELD 2047u

/* LNORM__MAX_UNKNOWN_FIELDS / _BYTES (lnorm_scan.h): a request with more
 * fields outside the schema is INVALID_ARGUMENT (docs/protocol.md). */
#include "lnorm_scan.h"

/* lnorm__decoded.borrowed */
#define LNORM__BORROWED_X 1
#define LNORM__BORROWED_RESIDUAL 2

/* Kinds of request (the body of lnorm.v1.Request). */
enum {
    LNORM__REQ_NONE = 0,
    LNORM__REQ_NORMALIZE = LNORM__V1__REQUEST__BODY_NORMALIZE,
    LNORM__REQ_REGISTER = LNORM__V1__REQUEST__BODY_REGISTER_PARAMS,
    LNORM__REQ_DROP = LNORM__V1__REQUEST__BODY_DROP_PARAMS,
    LNORM__REQ_HEALTH = LNORM__V1__REQUEST__BODY_HEALTH,
    LNORM__REQ_INFO = LNORM__V1__REQUEST__BODY_INFO,
    LNORM__REQ_BACKWARD = LNORM__V1__REQUEST__BODY_NORMALIZE_BACKWARD
};

/* Tensors of a Normalize request that may be given by reference (ShmRef,
 * or an offset in a ring descriptor): lnorm__decoded.ref[] */
enum {
    LNORM__T_X, LNORM__T_RESIDUAL, LNORM__T_Y, LNORM__T_MEAN, LNORM__T_RSTD, LNORM__T_RES_OUT,
    LNORM__T_GAMMA, LNORM__T_BETA, LNORM__T_N
};

/* A tensor by reference, checked against the shape (bytes) and aligned to
 * its element (align); resolved against the client's region by dispatch. */
typedef struct lnorm__tref {
    int set;
    uint64_t region, offset, bytes, align;
} lnorm__tref;

/* A decoded, validated request. */
typedef struct lnorm__decoded {
    Lnorm__V1__Request *msg;       /* owned (NULL when unpacking failed) */
    ProtobufCAllocator *alloc;     /* what msg was unpacked with (NULL: default) */
    uint64_t request_id;           /* 0 when unknown */
    uint64_t deadline_us;
    int kind;
    /* Normalize only: */
    lnorm_segment seg;             /* inputs point into msg; outputs NULL;
                                      gamma/beta NULL when params_id is set */
    const char *params_id;         /* affine by registered id (points into msg) */
    int want_mean, want_rstd;
    size_t y_bytes;                /* rows * hidden * size(y_dtype) */
    size_t res_out_bytes;          /* 0 without residual */
    size_t stat_bytes;             /* rows * 4 */
    size_t in_bytes;               /* x + residual + inline params (inline ones only) */
    unsigned priority;             /* as asked (0: the server's default) */
    uint64_t max_queue_us;         /* as asked (0: the server's) */
    lnorm__tref ref[LNORM__T_N];   /* tensors by reference (their seg pointers NULL) */
    /* NormalizeBackward only (params_id, in_bytes, priority and
     * max_queue_us as above): */
    lnorm_bwd_segment bseg;        /* inputs point into msg; dx, dgamma, dbeta NULL;
                                      gamma NULL when params_id is set */
    int want_dx, want_dgamma, want_dbeta;
    size_t dx_bytes;               /* rows * hidden * size(dx_dtype), wanted or not */
    size_t grad_bytes;             /* hidden * 4 (dgamma, dbeta) */
    int nrefs;
    /* Borrowing decode only (lnorm__codec_decode_request_borrow): which of
     * x and residual of msg->normalize point into the caller's buffer (not
     * into memory of msg: they are detached before msg is freed). */
    int borrowed;                  /* LNORM__BORROWED_* bits */
    /* Left to the caller (dispatch): the message the payload is borrowed
     * from (owned, freed after lnorm__codec_decoded_free), and whether y is
     * computed over x inside it and sent back in it. */
    nng_msg *src;
    int in_place;
} lnorm__decoded;

/*
 * Decode and validate one request message. Returns LNORM_OK, or an error
 * (LNORM_EINVAL, LNORM_ELIMIT, LNORM_ENOMEM) with a message naming the field
 * in errbuf. Either way *out is filled as far as known (request_id is set
 * whenever it could be read) and must be released with
 * lnorm__codec_decoded_free. alloc may be NULL (malloc).
 */
int lnorm__codec_decode_request(const uint8_t *buf, size_t len, const lnorm__limits *lim,
                                ProtobufCAllocator *alloc, lnorm__decoded *out,
                                char *errbuf, size_t errlen);
void lnorm__codec_decoded_free(lnorm__decoded *d);

/*
 * The same, without copying the payload: when the message has the plain
 * shape (one normalize body, x and residual each at most once), everything
 * but x and residual is unpacked by protobuf-c from a small copy of the
 * message (the "skeleton": the message without those two fields) and x /
 * residual then point into buf itself where they are 4-byte aligned
 * (out->borrowed: LNORM__BORROWED_* bits; a field that is not aligned is
 * copied, the kernels read whole elements); buf must stay valid and
 * unchanged until lnorm__codec_decoded_free. Any other shape is
 * unpacked whole, as lnorm__codec_decode_request does (borrowed = 0). The
 * result (status, message, every field) is the same as that function's.
 * lnorm__codec_decode_request uses the same split and copies x / residual
 * into buffers of alloc, so both paths are covered by its tests and fuzzers.
 */
int lnorm__codec_decode_request_borrow(const uint8_t *buf, size_t len, const lnorm__limits *lim,
                                       lnorm__decoded *out, char *errbuf, size_t errlen);

/*
 * A Response with normalize{y} only (no stats, no residual_out), encoded
 * around y where y already lies inside msg's body: normalize's and y's keys
 * and lengths are written right in front of y, request_id, status (OK) and
 * timings in front of those when the body has room there (what is left in
 * front becomes a padding field, LNORM__PAD_FIELD), else after y, and the
 * body is cut to exactly the encoded Response. y's bytes are not copied
 * (unless fewer than ~10 bytes precede it: then y is moved). Returns
 * LNORM_OK; LNORM_EINVAL with msg unchanged when y is not inside the body;
 * another error (out of memory) leaves msg unusable.
 */
int lnorm__codec_pack_y_in_place(nng_msg *msg, const void *y, size_t y_len, uint64_t request_id,
                                 const Lnorm__V1__Timings *t);

/*
 * Decode and validate a ring descriptor (include/lnorm/ring.h), already
 * copied out of the ring, whose tensors are all offsets into region: the
 * same checks as a Normalize message with every tensor by reference (x and
 * y required). out->msg stays NULL; request_id is the descriptor's tag.
 */
struct lnorm_ring_sqe;
int lnorm__codec_decode_sqe(const struct lnorm_ring_sqe *sqe, uint64_t region, const lnorm__limits *lim,
                            lnorm__decoded *out, char *errbuf, size_t errlen);

/* Validate a RegisterParams body (kind LNORM__REQ_REGISTER). */
int lnorm__codec_check_register(const Lnorm__V1__RegisterParamsRequest *r, const lnorm__limits *lim,
                                char *errbuf, size_t errlen);

/* 1 if id is a valid params id: 1..128 bytes of [A-Za-z0-9_.:-]. */
int lnorm__codec_params_id_ok(const char *id);

/* Pack a response into a fresh NNG message. LNORM_OK or LNORM_ENOMEM. */
int lnorm__codec_pack(const Lnorm__V1__Response *r, nng_msg **out);

/* A response carrying only request_id and the status of err (+ message). */
int lnorm__codec_pack_error(uint64_t request_id, int err, const char *message, nng_msg **out);

#endif
