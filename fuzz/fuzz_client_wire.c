/*
 * Fuzz target: liblnorm's zero-copy Response reader (client/lib/wire.c:
 * lnorm__resp_parse, lnorm__norm_parse), directly and fast, with protobuf-c
 * as a differential oracle.
 *
 * Memory safety: every span the reader returns must lie inside the input.
 * Agreement: when protobuf-c also accepts the bytes as an lnorm.v1.Response,
 * request_id, status code, timings and the body kind must be equal, and
 * each normalize payload the reader finds (non-empty y, mean, rstd,
 * residual_out) must be byte-identical to protobuf-c's. (The reader is
 * allowed to be more lenient than protobuf-c, not to disagree with it.)
 * Message fields that occur more than once are not compared: protobuf
 * merges them (so does the reader, field by field), protobuf-c 1.4 does not.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "lnorm.pb-c.h"

static void check(int cond, const char *what)
{
    if (!cond) {
        fprintf(stderr, "fuzz_client_wire: %s\n", what);
        abort();
    }
}

static void inside(lnorm__span s, const uint8_t *buf, size_t n)
{
    if (s.n == 0)
        return;
    check(s.p >= buf && s.p + s.n <= buf + n && s.p + s.n >= s.p, "span outside the input");
}

static void same_bytes(lnorm__span s, ProtobufCBinaryData b, const char *what)
{
    if (s.n == 0)
        return; /* the reader found none: protobuf-c may have merged an earlier one */
    if (s.n != b.len || memcmp(s.p, b.data, s.n) != 0) {
        fprintf(stderr, "fuzz_client_wire: %s differs (reader %zu bytes, protobuf-c %zu)\n", what, s.n,
                b.len);
        abort();
    }
}

/* How many times each top-level field (1..15) occurs; -1 if not walkable.
 * Protobuf merges repeated occurrences of a message field where protobuf-c
 * 1.4 keeps the last one, so fields seen twice are not compared. */
static int count_fields(const uint8_t *p, size_t n, int count[16])
{
    memset(count, 0, 16 * sizeof count[0]);
    const uint8_t *end = p + n;
    while (p < end) {
        uint64_t key = 0, v = 0;
        int shift = 0;
        do {
            if (p >= end || shift > 63)
                return -1;
            key |= (uint64_t)(*p & 0x7f) << shift;
            shift += 7;
        } while (*p++ & 0x80);
        uint64_t f = key >> 3;
        int wt = (int)(key & 7);
        if (f < 16)
            count[f]++;
        if (wt == 0 || wt == 2) {
            shift = 0;
            do {
                if (p >= end || shift > 63)
                    return -1;
                v |= (uint64_t)(*p & 0x7f) << shift;
                shift += 7;
            } while (*p++ & 0x80);
            if (wt == 2) {
                if (v > (uint64_t)(end - p))
                    return -1;
                p += v;
            }
        } else if (wt == 1 || wt == 5) {
            size_t k = wt == 1 ? 8 : 4;
            if ((size_t)(end - p) < k)
                return -1;
            p += k;
        } else {
            return -1;
        }
    }
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    lnorm__resp_view v;
    int rv = lnorm__resp_parse(data, size, &v);
    if (rv != LNORM_OK) {
        check(rv == LNORM_EPROTO, "unexpected error code");
        return 0;
    }
    inside(v.message, data, size);
    inside(v.body_bytes, data, size);
    lnorm__span out[5];
    int nrv = v.body == 10 ? lnorm__norm_parse(v.body_bytes, out) : LNORM_EPROTO;
    if (nrv == LNORM_OK)
        for (int i = 1; i <= 4; i++)
            inside(out[i], v.body_bytes.p, v.body_bytes.n);

    Lnorm__V1__Response *r = lnorm__v1__response__unpack(NULL, size, data);
    if (!r)
        return 0;
    int cnt[16];
    if (count_fields(data, size, cnt) != 0) {
        lnorm__v1__response__free_unpacked(r, NULL);
        return 0;
    }
    int bodies = cnt[10] + cnt[11] + cnt[12] + cnt[13] + cnt[14];
    check(r->request_id == v.request_id, "request_id differs");
    if (cnt[2] <= 1 && (r->status ? (int)r->status->code : 0) != v.code) {
        fprintf(stderr, "status code: protobuf-c %d, reader %d\n", r->status ? (int)r->status->code : 0,
                v.code);
        check(0, "status code differs");
    }
    if (r->timings && cnt[3] <= 1) {
        check(r->timings->queue_us == v.queue_us && r->timings->compute_us == v.compute_us &&
                  r->timings->batch_rows == v.batch_rows &&
                  r->timings->batch_requests == v.batch_requests,
              "timings differ");
    }
    check((int)r->body_case == v.body, "body kind differs");
    if (v.body == 10 && nrv == LNORM_OK && r->normalize && bodies == 1) {
        same_bytes(out[1], r->normalize->y, "y");
        same_bytes(out[2], r->normalize->mean, "mean");
        same_bytes(out[3], r->normalize->rstd, "rstd");
        same_bytes(out[4], r->normalize->residual_out, "residual_out");
    }
    lnorm__v1__response__free_unpacked(r, NULL);
    return 0;
}
