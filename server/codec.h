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

/* Kinds of request (the body of lnorm.v1.Request). */
enum {
    LNORM__REQ_NONE = 0,
    LNORM__REQ_NORMALIZE = LNORM__V1__REQUEST__BODY_NORMALIZE,
    LNORM__REQ_REGISTER = LNORM__V1__REQUEST__BODY_REGISTER_PARAMS,
    LNORM__REQ_DROP = LNORM__V1__REQUEST__BODY_DROP_PARAMS,
    LNORM__REQ_HEALTH = LNORM__V1__REQUEST__BODY_HEALTH,
    LNORM__REQ_INFO = LNORM__V1__REQUEST__BODY_INFO
};

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
    size_t in_bytes;               /* x + residual + inline params */
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
