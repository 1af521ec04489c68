/*
 * Fuzz target: lnormd's request path without a daemon.
 *
 * Input bytes are one NNG message body as lnormd receives it. They go
 * through lnorm__codec_decode_request (server/codec.h: protobuf-c unpack +
 * every validation rule), and then through what lnormd does next:
 *  - rejected: the error reply is packed (lnorm__codec_pack_error), decoded
 *    back, and must carry the request id and the status of the error code;
 *  - accepted normalize: the segment must pass lnorm_segment_validate (the
 *    codec promises the core will accept it), and is computed on the CPU
 *    into exact-size output buffers, reading x/residual/gamma/beta straight
 *    from the decoded message, as lnormd's backend does; so any
 *    disagreement between the sizes the codec checked and what the core
 *    reads is an ASan report;
 *  - accepted normalize_backward: the same for its backward segment
 *    (lnorm_bwd_segment_validate, lnorm_cpu_run_bwd into exact-size dx,
 *    dgamma and dbeta).
 * The same bytes then go through the borrowing decoder
 * (lnorm__codec_decode_request_borrow, what lnormd runs on the CPU
 * backend), from a copy in an NNG message as lnormd has them: it must give
 * the same status, request id, kind, segment and input bytes as the copying
 * decoder. Where lnormd would answer in place (x borrowed, y of x's element
 * size, no stats, no residual), y is computed over x inside the message,
 * the reply is encoded around it (lnorm__codec_pack_y_in_place) and must
 * decode with protobuf-c to the request id, status OK and exactly those y
 * bytes.
 * Limits are small (as an operator might set them) so compute stays cheap.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codec.h"
#include "lnorm/errors.h"
#include "lnorm_core.h"

static void check(int cond, const char *what)
{
    if (!cond) {
        fprintf(stderr, "fuzz_server_request: invariant broken: %s\n", what);
        abort();
    }
}

static void *xalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    check(p != NULL, "out of memory");
    return p;
}

/* Tensors by reference (ShmRef) point into a stand-in region, checked as
 * lnormd checks them against a client's region (server/regions.c); 0 when
 * one lies outside it (lnormd answers INVALID_ARGUMENT then). */
#define FAKE_REGION ((size_t)1 << 22)
static unsigned char *fake_region;

static int resolve_fake(lnorm__decoded *d)
{
    if (!d->nrefs)
        return 1;
    if (!fake_region)
        fake_region = calloc(1, FAKE_REGION);
    check(fake_region != NULL, "out of memory");
    void *p[LNORM__T_N] = {0};
    for (int t = 0; t < LNORM__T_N; t++) {
        const lnorm__tref *f = &d->ref[t];
        if (!f->set)
            continue;
        check(f->align >= 1 && f->offset % f->align == 0, "a reference accepted misaligned");
        if (f->offset > FAKE_REGION || f->bytes > FAKE_REGION - f->offset)
            return 0;
        p[t] = fake_region + f->offset;
    }
    lnorm_segment *s = &d->seg;
    if (p[LNORM__T_X]) s->x = p[LNORM__T_X];
    if (p[LNORM__T_RESIDUAL]) s->residual = p[LNORM__T_RESIDUAL];
    if (p[LNORM__T_GAMMA]) s->gamma = p[LNORM__T_GAMMA];
    if (p[LNORM__T_BETA]) s->beta = p[LNORM__T_BETA];
    return 1;
}

static void run_segment(const lnorm__decoded *d)
{
    lnorm_segment s = d->seg;
    const char *why = NULL;
    check(d->y_bytes == (size_t)s.rows * (size_t)s.hidden * lnorm_dtype_size(s.y_dtype),
          "y_bytes disagrees with the segment");
    s.y = xalloc(d->y_bytes);
    if (s.residual) {
        check(d->res_out_bytes == (size_t)s.rows * (size_t)s.hidden * lnorm_dtype_size(s.x_dtype),
              "res_out_bytes disagrees with the segment");
        s.residual_out = xalloc(d->res_out_bytes);
    }
    if (d->want_mean)
        s.mean = xalloc(d->stat_bytes);
    if (d->want_rstd)
        s.rstd = xalloc(d->stat_bytes);
    check(lnorm_segment_validate(&s, &why) == LNORM_OK, why ? why : "segment invalid");
    check(lnorm_cpu_run_segment(NULL, &s, &why) == LNORM_OK, why ? why : "compute failed");
    free(s.y);
    free(s.residual_out);
    free(s.mean);
    free(s.rstd);
}

static void run_backward(const lnorm__decoded *d)
{
    lnorm_bwd_segment s = d->bseg;
    const char *why = NULL;
    check(d->dx_bytes == (size_t)s.rows * (size_t)s.hidden * lnorm_dtype_size(s.dx_dtype),
          "dx_bytes disagrees with the segment");
    check(d->grad_bytes == (size_t)s.hidden * 4, "grad_bytes disagrees with the segment");
    check(d->want_dx || d->want_dgamma || d->want_dbeta, "a backward with no output accepted");
    if (d->params_id)
        return; /* gamma comes from the registry in lnormd */
    s.dx = xalloc(d->dx_bytes);
    if (d->want_dgamma)
        s.dgamma = xalloc(d->grad_bytes);
    if (d->want_dbeta)
        s.dbeta = xalloc(d->grad_bytes);
    check(lnorm_bwd_segment_validate(&s, &why) == LNORM_OK, why ? why : "backward segment invalid");
    static lnorm_cpu *cpu;
    if (!cpu)
        check(lnorm_cpu_create(&cpu, 1) == LNORM_OK, "lnorm_cpu_create failed");
    lnorm_bwd_batch b = {&s, 1};
    check(lnorm_cpu_run_bwd(cpu, &b, &why) == LNORM_OK, why ? why : "backward failed");
    free(s.dx);
    free(s.dgamma);
    free(s.dbeta);
}

static void check_error_reply(const lnorm__decoded *d, int rv, const char *msg)
{
    nng_msg *m = NULL;
    check(lnorm__codec_pack_error(d->request_id, rv, msg, &m) == LNORM_OK, "pack_error failed");
    Lnorm__V1__Response *r = lnorm__v1__response__unpack(NULL, nng_msg_len(m), nng_msg_body(m));
    check(r != NULL, "error reply does not decode");
    check(r->request_id == d->request_id, "error reply lost the request id");
    check(r->status && (int)r->status->code == lnorm_err_to_status(rv) && r->status->code != 0,
          "error reply has the wrong status");
    lnorm__v1__response__free_unpacked(r, NULL);
    nng_msg_free(m);
}

/* Bytes of an input tensor of the segment (rows x hidden of dtype). */
static size_t in_bytes(const lnorm_segment *s, int dt)
{
    return (size_t)s->rows * (size_t)s->hidden * lnorm_dtype_size(dt);
}

/* The borrowing decoder on the same bytes, against the copying one (d, rv). */
static void check_borrow(const uint8_t *data, size_t size, const lnorm__limits *lim, const lnorm__decoded *d,
                         int rv)
{
    nng_msg *m = NULL;
    check(nng_msg_alloc(&m, size) == 0, "nng_msg_alloc failed");
    if (size)
        memcpy(nng_msg_body(m), data, size);
    lnorm__decoded b;
    char err[256];
    int rb = lnorm__codec_decode_request_borrow(nng_msg_body(m), size, lim, &b, err, sizeof err);
    check(rb == rv, "borrowing decoder: different status");
    check(b.request_id == d->request_id, "borrowing decoder: different request id");
    if (rv == LNORM_OK) {
        check(b.kind == d->kind, "borrowing decoder: different kind");
        if (d->kind == LNORM__REQ_NORMALIZE && (d->nrefs || b.nrefs)) {
            check(d->nrefs == b.nrefs && !memcmp(d->ref, b.ref, sizeof d->ref),
                  "borrowing decoder: different references");
        } else if (d->kind == LNORM__REQ_NORMALIZE) {
            const lnorm_segment *x = &d->seg, *y = &b.seg;
            check(x->op == y->op && x->x_dtype == y->x_dtype && x->y_dtype == y->y_dtype &&
                      x->param_dtype == y->param_dtype && x->rows == y->rows && x->hidden == y->hidden &&
                      x->eps == y->eps && x->eps_mode == y->eps_mode && (x->gamma == NULL) == (y->gamma == NULL) &&
                      (x->beta == NULL) == (y->beta == NULL) && (x->residual == NULL) == (y->residual == NULL),
                  "borrowing decoder: different segment");
            check(!memcmp(x->x, y->x, in_bytes(x, x->x_dtype)), "borrowing decoder: different x");
            if (x->residual)
                check(!memcmp(x->residual, y->residual, in_bytes(x, x->x_dtype)),
                      "borrowing decoder: different residual");
            if (b.borrowed & LNORM__BORROWED_X) {
                const uint8_t *bx = (const uint8_t *)y->x, *body = nng_msg_body(m);
                check(bx >= body && bx + in_bytes(y, y->x_dtype) <= body + size,
                      "borrowed x outside the message");
                check(((uintptr_t)bx & 3) == 0, "borrowed x not 4-byte aligned");
            }
            run_segment(&b);
            /* lnormd's in-place answer, where it would give one. */
            if ((b.borrowed & LNORM__BORROWED_X) && !y->residual && !b.want_mean && !b.want_rstd &&
                lnorm_dtype_size(y->y_dtype) == lnorm_dtype_size(y->x_dtype)) {
                lnorm_segment s = *y;
                void *out = xalloc(b.y_bytes);
                s.y = out;
                const char *why = NULL;
                check(lnorm_cpu_run_segment(NULL, &s, &why) == LNORM_OK, "compute failed");
                memcpy((void *)y->x, out, b.y_bytes); /* what computing over x leaves there */
                Lnorm__V1__Timings tm = LNORM__V1__TIMINGS__INIT;
                tm.queue_us = 1;
                tm.compute_us = 2;
                tm.batch_rows = (uint64_t)s.rows;
                tm.batch_requests = 1;
                int rp = lnorm__codec_pack_y_in_place(m, y->x, b.y_bytes, b.request_id, &tm);
                check(rp == LNORM_OK || rp == LNORM_ENOMEM, "in-place reply refused");
                if (rp == LNORM_OK) {
                    Lnorm__V1__Response *r =
                        lnorm__v1__response__unpack(NULL, nng_msg_len(m), nng_msg_body(m));
                    check(r != NULL, "in-place reply does not decode");
                    check(r->request_id == b.request_id, "in-place reply lost the request id");
                    check(!r->status || r->status->code == 0, "in-place reply is not OK");
                    check(r->body_case == LNORM__V1__RESPONSE__BODY_NORMALIZE && r->normalize &&
                              r->normalize->y.len == b.y_bytes && !memcmp(r->normalize->y.data, out, b.y_bytes),
                          "in-place reply does not carry y");
                    lnorm__v1__response__free_unpacked(r, NULL);
                }
                free(out);
            }
        }
    }
    lnorm__codec_decoded_free(&b);
    nng_msg_free(m);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const lnorm__limits lim = {
        .max_message_bytes = 1u << 20,
        .max_rows = 64,
        .max_hidden = 4096,
    };
    lnorm__decoded d;
    char err[256];
    int rv = lnorm__codec_decode_request(data, size, &lim, NULL, &d, err, sizeof err);
    if (rv != LNORM_OK) {
        check(rv == LNORM_EINVAL || rv == LNORM_ELIMIT || rv == LNORM_ENOMEM, "unexpected error code");
        check(err[0] != 0, "rejection without a message");
        check_error_reply(&d, rv, err);
    } else {
        check(d.msg != NULL, "accepted without a message");
        if (d.kind == LNORM__REQ_NORMALIZE) {
            check(d.seg.rows >= 1 && (uint64_t)d.seg.rows <= lim.max_rows, "rows out of limits");
            check(d.seg.hidden >= 1 && (uint64_t)d.seg.hidden <= lim.max_hidden, "hidden out of limits");
            if (resolve_fake(&d))
                run_segment(&d);
        } else if (d.kind == LNORM__REQ_BACKWARD) {
            check(d.bseg.rows >= 1 && (uint64_t)d.bseg.rows <= lim.max_rows, "rows out of limits");
            check(d.bseg.hidden >= 1 && (uint64_t)d.bseg.hidden <= lim.max_hidden, "hidden out of limits");
            run_backward(&d);
        } else {
            check(d.kind == LNORM__REQ_REGISTER || d.kind == LNORM__REQ_DROP ||
                      d.kind == LNORM__REQ_HEALTH || d.kind == LNORM__REQ_INFO ||
                      (d.kind >= LNORM__V1__REQUEST__BODY_REGISTER_REGION &&
                       d.kind <= LNORM__V1__REQUEST__BODY_ATTACH_RING),
                  "accepted an unknown kind");
        }
    }
    check_borrow(data, size, &lim, &d, rv);
    lnorm__codec_decoded_free(&d);
    return 0;
}
