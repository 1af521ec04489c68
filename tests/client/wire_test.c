/*
 * client.wire: liblnorm's zero-copy Response reader (client/lib/wire.c)
 * agrees with protobuf-c on random Responses, and rejects every truncation
 * and random corruption cleanly (EPROTO or a consistent view, never a read
 * outside the buffer: run under ASan in `make test-asan`).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "internal.h"
#include "testutil.h"

static int span_eq(lnorm__span s, const void *p, size_t n)
{
    return s.n == n && (n == 0 || memcmp(s.p, p, n) == 0);
}

int main(void)
{
    lnorm_rng g;
    lnorm_rng_seed(&g, 31337);
    for (int it = 0; it < 3000; it++) {
        Lnorm__V1__Response r = LNORM__V1__RESPONSE__INIT;
        Lnorm__V1__Status st = LNORM__V1__STATUS__INIT;
        Lnorm__V1__Timings tm = LNORM__V1__TIMINGS__INIT;
        Lnorm__V1__NormalizeResponse nr = LNORM__V1__NORMALIZE_RESPONSE__INIT;
        Lnorm__V1__HealthResponse hr = LNORM__V1__HEALTH_RESPONSE__INIT;
        uint8_t data[4][300];
        size_t lens[4];
        char msg[64];
        r.request_id = lnorm_rng_next(&g) >> (lnorm_rng_next(&g) % 64);
        if (lnorm_rng_next(&g) % 2) {
            st.code = (Lnorm__V1__Code)(lnorm_rng_next(&g) % 17);
            snprintf(msg, sizeof msg, "m%llu", (unsigned long long)(lnorm_rng_next(&g) % 100000));
            st.message = lnorm_rng_next(&g) % 2 ? msg : "";
            r.status = &st;
        }
        if (lnorm_rng_next(&g) % 2) {
            tm.queue_us = lnorm_rng_next(&g) >> 20;
            tm.compute_us = lnorm_rng_next(&g) >> 30;
            tm.batch_rows = (uint32_t)lnorm_rng_next(&g);
            tm.batch_requests = (uint32_t)(lnorm_rng_next(&g) % 1000);
            r.timings = &tm;
        }
        int kind = (int)(lnorm_rng_next(&g) % 3);
        for (int k = 0; k < 4; k++) {
            lens[k] = lnorm_rng_next(&g) % 300;
            for (size_t j = 0; j < lens[k]; j++)
                data[k][j] = (uint8_t)lnorm_rng_next(&g);
        }
        if (kind == 1) {
            nr.y = (ProtobufCBinaryData){lens[0], data[0]};
            nr.mean = (ProtobufCBinaryData){lens[1], data[1]};
            nr.rstd = (ProtobufCBinaryData){lens[2], data[2]};
            nr.residual_out = (ProtobufCBinaryData){lens[3], data[3]};
            r.body_case = LNORM__V1__RESPONSE__BODY_NORMALIZE;
            r.normalize = &nr;
        } else if (kind == 2) {
            hr.serving = 1;
            r.body_case = LNORM__V1__RESPONSE__BODY_HEALTH;
            r.health = &hr;
        }
        size_t n = lnorm__v1__response__get_packed_size(&r);
        uint8_t *buf = malloc(n + 1);
        lnorm__v1__response__pack(&r, buf);
        lnorm__resp_view v;
        int rv = lnorm__resp_parse(buf, n, &v);
        CHECK(rv == LNORM_OK, "iteration %d: valid message rejected", it);
        CHECK(v.request_id == r.request_id, "request_id");
        CHECK(v.code == (r.status ? (int)st.code : 0), "code");
        CHECK(!r.status || span_eq(v.message, st.message, strlen(st.message)), "message");
        CHECK(v.queue_us == (r.timings ? tm.queue_us : 0) &&
                  v.compute_us == (r.timings ? tm.compute_us : 0) &&
                  v.batch_rows == (r.timings ? tm.batch_rows : 0) &&
                  v.batch_requests == (r.timings ? tm.batch_requests : 0),
              "timings");
        CHECK(v.body == (int)r.body_case, "body %d vs %d", v.body, (int)r.body_case);
        if (kind == 1) {
            lnorm__span f[5];
            CHECK(lnorm__norm_parse(v.body_bytes, f) == LNORM_OK, "normalize body");
            for (int k = 0; k < 4; k++)
                CHECK(span_eq(f[k + 1], data[k], lens[k]), "field %d", k + 1);
        }
        /* every truncation: rejected or parsed inside the buffer */
        for (size_t cut = 0; cut < n; cut++) {
            uint8_t *t = malloc(cut ? cut : 1);
            memcpy(t, buf, cut);
            if (lnorm__resp_parse(t, cut, &v) == LNORM_OK && v.body) {
                lnorm__span f[5];
                CHECK(v.body_bytes.p >= t && v.body_bytes.p + v.body_bytes.n <= t + cut,
                      "body outside the buffer");
                if (lnorm__norm_parse(v.body_bytes, f) == LNORM_OK)
                    for (int k = 1; k < 5; k++)
                        CHECK(f[k].n == 0 || (f[k].p >= t && f[k].p + f[k].n <= t + cut),
                              "field outside the buffer");
            }
            free(t);
        }
        /* random corruption */
        for (int c = 0; c < 8 && n > 0; c++) {
            uint8_t *t = malloc(n);
            memcpy(t, buf, n);
            t[lnorm_rng_next(&g) % n] ^= (uint8_t)(1u << (lnorm_rng_next(&g) % 8));
            if (lnorm__resp_parse(t, n, &v) == LNORM_OK && v.body) {
                lnorm__span f[5];
                CHECK(v.body_bytes.p >= t && v.body_bytes.p + v.body_bytes.n <= t + n,
                      "body outside the buffer");
                (void)lnorm__norm_parse(v.body_bytes, f);
            }
            free(t);
        }
        free(buf);
    }
    printf("wire: 3000 random Responses, all truncations, 24000 corruptions\n");
    return check_finish("client.wire");
}
