/*
 * A zero-copy reader of lnorm.v1.Response: finds the status, the timings
 * and the body's bytes inside the received NNG message without copying
 * anything, so that normalize payloads go straight from the message into
 * the caller's buffers (one copy). Follows the protobuf wire format: last
 * occurrence of a field wins, unknown fields are skipped.
 */
#include <string.h>

#include "internal.h"
#include "lnorm_wire.h"

/* Fields are read with proto/lnorm_wire.h: anything malformed (truncated,
 * over-long varints, field 0, groups, lengths past the end) makes the whole
 * message LNORM_EPROTO. */

static lnorm__span span_of(const lnorm__wire_field *f)
{
    lnorm__span s = {f->data, f->len};
    return s;
}

int lnorm__resp_parse(const void *buf, size_t n, lnorm__resp_view *v)
{
    memset(v, 0, sizeof *v);
    lnorm__wire_rd r = lnorm__wire_reader(buf, n);
    while (r.p < r.end) {
        lnorm__wire_field f;
        if (lnorm__wire_next_field(&r, &f) != 0)
            return LNORM_EPROTO;
        if (f.num == 1 && f.wt == LNORM__WIRE_VARINT) {
            v->request_id = f.v;
        } else if (f.num == 2 && f.wt == LNORM__WIRE_LEN) {
            lnorm__wire_rd s = lnorm__wire_reader(f.data, f.len);
            while (s.p < s.end) {
                lnorm__wire_field g;
                if (lnorm__wire_next_field(&s, &g) != 0)
                    return LNORM_EPROTO;
                if (g.num == 1 && g.wt == LNORM__WIRE_VARINT)
                    v->code = (int)(int32_t)g.v;
                else if (g.num == 2 && g.wt == LNORM__WIRE_LEN)
                    v->message = span_of(&g);
            }
        } else if (f.num == 3 && f.wt == LNORM__WIRE_LEN) {
            lnorm__wire_rd s = lnorm__wire_reader(f.data, f.len);
            while (s.p < s.end) {
                lnorm__wire_field g;
                if (lnorm__wire_next_field(&s, &g) != 0)
                    return LNORM_EPROTO;
                if (g.wt != LNORM__WIRE_VARINT)
                    continue;
                if (g.num == 1)
                    v->queue_us = g.v;
                else if (g.num == 2)
                    v->compute_us = g.v;
                else if (g.num == 3)
                    v->batch_rows = (uint32_t)g.v;
                else if (g.num == 4)
                    v->batch_requests = (uint32_t)g.v;
            }
        } else if (f.num >= 10 && f.num <= 19 && f.wt == LNORM__WIRE_LEN) {
            v->body = (int)f.num;
            v->body_bytes = span_of(&f);
        }
    }
    return LNORM_OK;
}

int lnorm__norm_parse(lnorm__span body, lnorm__span out[5])
{
    memset(out, 0, 5 * sizeof out[0]);
    lnorm__wire_rd r = lnorm__wire_reader(body.p, body.n);
    while (r.p < r.end) {
        lnorm__wire_field f;
        if (lnorm__wire_next_field(&r, &f) != 0)
            return LNORM_EPROTO;
        if (f.num >= 1 && f.num <= 4 && f.wt == LNORM__WIRE_LEN)
            out[f.num] = span_of(&f);
    }
    return LNORM_OK;
}
