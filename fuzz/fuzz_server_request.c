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
 *    reads is an ASan report.
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
            run_segment(&d);
        } else {
            check(d.kind == LNORM__REQ_REGISTER || d.kind == LNORM__REQ_DROP ||
                      d.kind == LNORM__REQ_HEALTH || d.kind == LNORM__REQ_INFO,
                  "accepted an unknown kind");
        }
    }
    lnorm__codec_decoded_free(&d);
    return 0;
}
