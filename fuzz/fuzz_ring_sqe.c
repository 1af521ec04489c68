/*
 * Fuzz target: a ring descriptor as lnormd takes it (include/lnorm/ring.h,
 * server/codec.h lnorm__codec_decode_sqe). The first 128 bytes are the
 * descriptor (zero-padded); the next 4 the size of the stand-in region.
 * Rejected: an error code and a message. Accepted: every tensor's reference
 * matches the shape (bytes) and its alignment; those that lie in the region
 * are computed on the CPU with the region's memory, as lnormd would, so a
 * size the decoder got wrong is an ASan report.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codec.h"
#include "lnorm/errors.h"
#include "lnorm/ring.h"
#include "lnorm_core.h"

static void check(int cond, const char *what)
{
    if (!cond) {
        fprintf(stderr, "fuzz_ring_sqe: invariant broken: %s\n", what);
        abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const lnorm__limits lim = {.max_message_bytes = 1u << 20, .max_rows = 64, .max_hidden = 4096};
    lnorm_ring_sqe q;
    memset(&q, 0, sizeof q);
    memcpy(&q, data, size < sizeof q ? size : sizeof q);
    uint32_t rsz = 0;
    if (size >= sizeof q + 4)
        memcpy(&rsz, data + sizeof q, 4);
    rsz %= 1u << 21;
    lnorm__decoded d;
    char err[256];
    int rv = lnorm__codec_decode_sqe(&q, 7, &lim, &d, err, sizeof err);
    if (rv != LNORM_OK) {
        check(rv == LNORM_EINVAL || rv == LNORM_ELIMIT, "unexpected error code");
        check(err[0] != 0, "rejection without a message");
        return 0;
    }
    check(d.request_id == q.tag, "tag lost");
    check(d.ref[LNORM__T_X].set && d.ref[LNORM__T_Y].set, "x or y missing");
    unsigned char *region = calloc(1, rsz ? rsz : 1);
    check(region != NULL, "out of memory");
    lnorm_segment s = d.seg;
    void *p[LNORM__T_N] = {0};
    int inside = 1;
    for (int t = 0; t < LNORM__T_N; t++) {
        const lnorm__tref *f = &d.ref[t];
        if (!f->set)
            continue;
        check(f->region == 7, "reference to another region");
        check(f->offset % f->align == 0, "misaligned reference accepted");
        if (f->offset > rsz || f->bytes > rsz - f->offset)
            inside = 0;
        else
            p[t] = region + f->offset;
    }
    check(d.ref[LNORM__T_X].bytes == (uint64_t)s.rows * (uint64_t)s.hidden * lnorm_dtype_size(s.x_dtype),
          "x bytes disagree with the shape");
    check(d.ref[LNORM__T_Y].bytes == d.y_bytes, "y bytes disagree with the shape");
    if (inside) {
        s.x = p[LNORM__T_X];
        s.y = p[LNORM__T_Y];
        s.residual = p[LNORM__T_RESIDUAL];
        s.residual_out = p[LNORM__T_RES_OUT];
        s.gamma = p[LNORM__T_GAMMA];
        s.beta = p[LNORM__T_BETA];
        s.mean = p[LNORM__T_MEAN];
        s.rstd = p[LNORM__T_RSTD];
        const char *why = NULL;
        check(lnorm_segment_validate(&s, &why) == LNORM_OK, why ? why : "segment invalid");
        check(lnorm_cpu_run_segment(NULL, &s, &why) == LNORM_OK, why ? why : "compute failed");
    }
    free(region);
    lnorm__codec_decoded_free(&d);
    return 0;
}
