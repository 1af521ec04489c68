/*
 * A zero-copy reader of lnorm.v1.Response: finds the status, the timings
 * and the body's bytes inside the received NNG message without copying
 * anything, so that normalize payloads go straight from the message into
 * the caller's buffers (one copy). Follows the protobuf wire format: last
 * occurrence of a field wins, unknown fields are skipped.
 */
#include <string.h>

#include "internal.h"

typedef struct rd {
    const uint8_t *p, *end;
} rd;

static int rd_varint(rd *r, uint64_t *v)
{
    uint64_t x = 0;
    for (int shift = 0; shift < 64; shift += 7) {
        if (r->p >= r->end)
            return -1;
        uint8_t b = *r->p++;
        x |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80)) {
            *v = x;
            return 0;
        }
    }
    return -1;
}

/* Read one field's key and, for length-delimited fields, its bytes; skip
 * the value of other wire types (their value is returned in *val). */
static int rd_field(rd *r, uint32_t *field, int *wt, uint64_t *val, lnorm__span *bytes)
{
    uint64_t key;
    if (rd_varint(r, &key) != 0)
        return -1;
    *field = (uint32_t)(key >> 3);
    *wt = (int)(key & 7);
    if (*field == 0)
        return -1;
    switch (*wt) {
    case 0:
        return rd_varint(r, val);
    case 1:
        if (r->end - r->p < 8)
            return -1;
        r->p += 8;
        return 0;
    case 5:
        if (r->end - r->p < 4)
            return -1;
        r->p += 4;
        return 0;
    case 2: {
        uint64_t len;
        if (rd_varint(r, &len) != 0 || len > (uint64_t)(r->end - r->p))
            return -1;
        bytes->p = r->p;
        bytes->n = (size_t)len;
        r->p += len;
        return 0;
    }
    default:
        return -1; /* groups are not part of proto3 */
    }
}

int lnorm__resp_parse(const void *buf, size_t n, lnorm__resp_view *v)
{
    memset(v, 0, sizeof *v);
    rd r = {buf, (const uint8_t *)buf + n};
    while (r.p < r.end) {
        uint32_t f;
        int wt;
        uint64_t val = 0;
        lnorm__span b = {NULL, 0};
        if (rd_field(&r, &f, &wt, &val, &b) != 0)
            return LNORM_EPROTO;
        if (f == 1 && wt == 0) {
            v->request_id = val;
        } else if (f == 2 && wt == 2) {
            rd s = {b.p, b.p + b.n};
            while (s.p < s.end) {
                uint32_t g;
                int w2;
                uint64_t v2 = 0;
                lnorm__span b2 = {NULL, 0};
                if (rd_field(&s, &g, &w2, &v2, &b2) != 0)
                    return LNORM_EPROTO;
                if (g == 1 && w2 == 0)
                    v->code = (int)(int32_t)v2;
                else if (g == 2 && w2 == 2)
                    v->message = b2;
            }
        } else if (f == 3 && wt == 2) {
            rd s = {b.p, b.p + b.n};
            while (s.p < s.end) {
                uint32_t g;
                int w2;
                uint64_t v2 = 0;
                lnorm__span b2 = {NULL, 0};
                if (rd_field(&s, &g, &w2, &v2, &b2) != 0)
                    return LNORM_EPROTO;
                if (w2 != 0)
                    continue;
                if (g == 1)
                    v->queue_us = v2;
                else if (g == 2)
                    v->compute_us = v2;
                else if (g == 3)
                    v->batch_rows = (uint32_t)v2;
                else if (g == 4)
                    v->batch_requests = (uint32_t)v2;
            }
        } else if (f >= 10 && f <= 14 && wt == 2) {
            v->body = (int)f;
            v->body_bytes = b;
        }
    }
    return LNORM_OK;
}

int lnorm__norm_parse(lnorm__span body, lnorm__span out[5])
{
    memset(out, 0, 5 * sizeof out[0]);
    rd r = {body.p, body.p + body.n};
    while (r.p < r.end) {
        uint32_t f;
        int wt;
        uint64_t val = 0;
        lnorm__span b = {NULL, 0};
        if (rd_field(&r, &f, &wt, &val, &b) != 0)
            return LNORM_EPROTO;
        if (f >= 1 && f <= 4 && wt == 2)
            out[f] = b;
    }
    return LNORM_OK;
}
