/*
 * Codec unit tests, no daemon: lnorm__codec_decode_request on valid
 * requests, on every kind of bad field, on every truncation of a valid
 * message and on random mutations (each either rejected with an error code
 * and a message, or accepted as a segment the core validates).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "codec.h"
#include "testutil.h"

static const lnorm__limits lim = {1 << 20, 1024, 8192};

/* A status text names its field by the path from Request, in the proto's
 * field names ("normalize.affine.params_id: ..."): 1 when the text starts
 * with such a path, ending in a field (then ':' or ' '). */
static int names_field_path(const char *err)
{
    const ProtobufCMessageDescriptor *m = &lnorm__v1__request__descriptor;
    const char *p = err;
    for (;;) {
        size_t n = strcspn(p, ".: ");
        char name[64];
        if (!n || n >= sizeof name || !m)
            return 0;
        memcpy(name, p, n);
        name[n] = 0;
        const ProtobufCFieldDescriptor *f = protobuf_c_message_descriptor_get_field_by_name(m, name);
        if (!f)
            return 0;
        p += n;
        if (*p != '.')
            return *p == ':' || *p == ' ';
        p++;
        m = f->type == PROTOBUF_C_TYPE_MESSAGE ? f->descriptor : NULL;
    }
}

static uint8_t *pack(const Lnorm__V1__Request *r, size_t *n)
{
    *n = lnorm__v1__request__get_packed_size(r);
    uint8_t *b = malloc(*n + 1);
    lnorm__v1__request__pack(r, b);
    return b;
}

static int decode(const Lnorm__V1__Request *r, lnorm__decoded *d, char *err, size_t errlen)
{
    size_t n;
    uint8_t *b = pack(r, &n);
    int rc = lnorm__codec_decode_request(b, n, &lim, NULL, d, err, errlen);
    free(b);
    return rc;
}

typedef struct req {
    Lnorm__V1__Request r;
    Lnorm__V1__NormalizeRequest n;
    Lnorm__V1__Affine a;
    uint8_t x[4 * 64 * 4], res[4 * 64 * 4], g[64 * 4], be[64 * 4];
} req;

static void mkreq(req *q, lnorm_rng *rng)
{
    lnorm__v1__request__init(&q->r);
    lnorm__v1__normalize_request__init(&q->n);
    lnorm__v1__affine__init(&q->a);
    lnorm_test_fill(rng, q->x, LNORM_DTYPE_F32, 4 * 64, 0, 1);
    lnorm_test_fill(rng, q->res, LNORM_DTYPE_F32, 4 * 64, 0, 1);
    lnorm_test_fill(rng, q->g, LNORM_DTYPE_F32, 64, 1, 0.1);
    lnorm_test_fill(rng, q->be, LNORM_DTYPE_F32, 64, 0, 0.1);
    q->r.request_id = 12345;
    q->r.deadline_us = 1000;
    q->r.body_case = LNORM__V1__REQUEST__BODY_NORMALIZE;
    q->r.normalize = &q->n;
    q->n.op = LNORM__V1__OP__OP_LAYER_NORM;
    q->n.x_dtype = LNORM__V1__DTYPE__DTYPE_F32;
    q->n.rows = 4;
    q->n.hidden = 64;
    q->n.x.data = q->x;
    q->n.x.len = sizeof q->x;
    q->n.residual.data = q->res;
    q->n.residual.len = sizeof q->res;
    q->n.want_stats = 1;
    q->a.dtype = LNORM__V1__DTYPE__DTYPE_F32;
    q->a.gamma.data = q->g;
    q->a.gamma.len = sizeof q->g;
    q->a.beta.data = q->be;
    q->a.beta.len = sizeof q->be;
    q->n.affine = &q->a;
}

/* A decoded Normalize must be a segment the core accepts. */
static void check_segment_ok(lnorm__decoded *d, const char *what)
{
    if (d->kind != LNORM__REQ_NORMALIZE || d->params_id)
        return;
    static uint8_t out[1 << 16];
    lnorm_segment s = d->seg;
    s.y = out;
    if (s.residual)
        s.residual_out = out;
    const char *why = NULL;
    CHECK(lnorm_segment_validate(&s, &why) == LNORM_OK, "%s: accepted but the core rejects it: %s", what, why);
}

static void expect_err(req *q, int want, const char *needle, const char *what)
{
    lnorm__decoded d;
    char err[256];
    int rc = decode(&q->r, &d, err, sizeof err);
    CHECK(rc == want, "%s: rc %d (%s), want %d", what, rc, err, want);
    CHECK(rc == LNORM_OK || strstr(err, needle), "%s: message '%s' lacks '%s'", what, err, needle);
    CHECK(d.request_id == 12345, "%s: request_id %llu", what, (unsigned long long)d.request_id);
    lnorm__codec_decoded_free(&d);
}

int main(void)
{
    lnorm_rng rng;
    lnorm_rng_seed(&rng, 2026);
    req q;
    lnorm__decoded d;
    char err[256];

    /* Valid: every field lands where it should. */
    mkreq(&q, &rng);
    int rc = decode(&q.r, &d, err, sizeof err);
    CHECK(rc == LNORM_OK, "valid: %s", err);
    CHECK(d.kind == LNORM__REQ_NORMALIZE && d.request_id == 12345 && d.deadline_us == 1000, "header");
    CHECK(d.seg.rows == 4 && d.seg.hidden == 64 && d.seg.eps == LNORM_DEFAULT_EPS && d.seg.y_dtype == LNORM_DTYPE_F32,
          "segment");
    CHECK(d.seg.x && !memcmp(d.seg.x, q.x, sizeof q.x) && d.seg.residual && !memcmp(d.seg.residual, q.res, sizeof q.res),
          "x/residual bytes");
    CHECK(d.seg.gamma && d.seg.beta && d.seg.param_dtype == LNORM_DTYPE_F32, "params");
    CHECK(d.want_mean && d.want_rstd && d.y_bytes == sizeof q.x && d.res_out_bytes == sizeof q.x && d.stat_bytes == 16,
          "outputs");
    check_segment_ok(&d, "valid");
    lnorm__codec_decoded_free(&d);

    /* Each bad field. */
    mkreq(&q, &rng); q.n.op = 3; expect_err(&q, LNORM_EINVAL, "normalize.op", "op 3");
    mkreq(&q, &rng); q.n.op = 0; expect_err(&q, LNORM_EINVAL, "normalize.op", "op 0");
    mkreq(&q, &rng); q.n.x_dtype = 0; expect_err(&q, LNORM_EINVAL, "normalize.x_dtype", "x dtype 0");
    mkreq(&q, &rng); q.n.x_dtype = 100; expect_err(&q, LNORM_EINVAL, "normalize.x_dtype", "x dtype 100");
    mkreq(&q, &rng); q.n.y_dtype = -1; expect_err(&q, LNORM_EINVAL, "normalize.y_dtype", "y dtype -1");
    mkreq(&q, &rng); q.n.eps_mode = 5; expect_err(&q, LNORM_EINVAL, "normalize.eps_mode", "eps mode");
    float eps[] = {0.0f, -0.0f, -1.0f, NAN, INFINITY, -INFINITY};
    for (int i = 0; i < 6; i++) {
        mkreq(&q, &rng);
        q.n.eps_present_case = LNORM__V1__NORMALIZE_REQUEST__EPS_PRESENT_EPS;
        q.n.eps = eps[i];
        expect_err(&q, LNORM_EINVAL, "normalize.eps", "bad eps");
    }
    mkreq(&q, &rng);
    q.n.eps_present_case = LNORM__V1__NORMALIZE_REQUEST__EPS_PRESENT_EPS;
    q.n.eps = 1e-3f;
    CHECK(decode(&q.r, &d, err, sizeof err) == LNORM_OK && d.seg.eps == 1e-3f, "eps given");
    lnorm__codec_decoded_free(&d);
    mkreq(&q, &rng); q.n.rows = 0; expect_err(&q, LNORM_EINVAL, "normalize.rows", "rows 0");
    mkreq(&q, &rng); q.n.hidden = 0; expect_err(&q, LNORM_EINVAL, "normalize.hidden", "hidden 0");
    mkreq(&q, &rng); q.n.rows = 5; expect_err(&q, LNORM_EINVAL, "normalize.x", "rows disagree");
    mkreq(&q, &rng); q.n.rows = 2000; expect_err(&q, LNORM_ELIMIT, "max-rows", "rows over limit");
    mkreq(&q, &rng); q.n.hidden = 9000; expect_err(&q, LNORM_ELIMIT, "max-hidden", "hidden over limit");
    mkreq(&q, &rng); q.n.rows = 1000; q.n.hidden = 8000; expect_err(&q, LNORM_ELIMIT, "max-message-bytes", "shape too big");
    mkreq(&q, &rng); q.n.x.len = 3; expect_err(&q, LNORM_EINVAL, "normalize.x", "x short");
    mkreq(&q, &rng); q.n.x.len = 0; expect_err(&q, LNORM_EINVAL, "normalize.x", "x empty");
    mkreq(&q, &rng); q.n.residual.len = 4; expect_err(&q, LNORM_EINVAL, "normalize.residual", "residual size");
    mkreq(&q, &rng); q.a.gamma.len = 8; expect_err(&q, LNORM_EINVAL, "normalize.affine.gamma", "gamma size");
    mkreq(&q, &rng); q.a.beta.len = 128; expect_err(&q, LNORM_EINVAL, "normalize.affine.beta", "beta size (x dtype)");
    mkreq(&q, &rng); q.a.dtype = LNORM__V1__DTYPE__DTYPE_F16; expect_err(&q, LNORM_EINVAL, "normalize.affine.dtype", "param dtype");
    mkreq(&q, &rng); q.a.params_id = "abc"; expect_err(&q, LNORM_EINVAL, "exclusive", "id + inline");
    mkreq(&q, &rng);
    q.a.gamma.len = q.a.beta.len = 0;
    q.a.dtype = 0;
    q.a.params_id = "a b";
    expect_err(&q, LNORM_EINVAL, "params_id", "bad id chars");
    q.a.params_id = "ok.id:1-2_3";
    CHECK(decode(&q.r, &d, err, sizeof err) == LNORM_OK && d.params_id && !strcmp(d.params_id, "ok.id:1-2_3") &&
              !d.seg.gamma,
          "params by id: %s", err);
    lnorm__codec_decoded_free(&d);

    /* Message over the limit: ELIMIT before unpacking, id still recovered. */
    {
        lnorm__limits small = {100, 1024, 8192};
        size_t n;
        mkreq(&q, &rng);
        uint8_t *b = pack(&q.r, &n);
        rc = lnorm__codec_decode_request(b, n, &small, NULL, &d, err, sizeof err);
        CHECK(rc == LNORM_ELIMIT && strstr(err, "max-message-bytes") && d.request_id == 12345, "oversize: %d %s", rc, err);
        lnorm__codec_decoded_free(&d);
        /* Every truncation: an error or (rarely) a valid shorter message, never a crash. */
        int accepted = 0;
        for (size_t cut = 0; cut < n; cut++) {
            rc = lnorm__codec_decode_request(b, cut, &lim, NULL, &d, err, sizeof err);
            CHECK(rc != LNORM_OK ? strlen(err) > 0 : 1, "truncation %zu: error without message", cut);
            if (rc == LNORM_OK) {
                accepted++;
                check_segment_ok(&d, "truncation");
            }
            lnorm__codec_decoded_free(&d);
        }
        CHECK(accepted == 0, "%d truncations accepted", accepted);
        /* Random mutations. */
        uint8_t *m = malloc(n);
        int ok = 0;
        for (int it = 0; it < 20000; it++) {
            memcpy(m, b, n);
            int k = 1 + (int)(lnorm_rng_next(&rng) % 4);
            for (int j = 0; j < k; j++)
                m[lnorm_rng_next(&rng) % n] = (uint8_t)lnorm_rng_next(&rng);
            rc = lnorm__codec_decode_request(m, n, &lim, NULL, &d, err, sizeof err);
            if (rc == LNORM_OK) {
                ok++;
                check_segment_ok(&d, "mutation");
            } else {
                CHECK(strlen(err) > 0 && (rc == LNORM_EINVAL || rc == LNORM_ELIMIT), "mutation: rc %d '%s'", rc, err);
            }
            lnorm__codec_decoded_free(&d);
        }
        fprintf(stderr, "mutations: %d of 20000 still valid requests\n", ok);
        free(m);
        free(b);
    }

    /* Fields outside the schema: a few are skipped (liblnorm's padding, a
     * newer client's fields), many or large ones are refused before
     * protobuf-c would copy each; in sub-messages too. */
    {
        /* (protobuf-c packs an unknown field as its key, then data as
         * is: for a length-delimited one, the length's varint and the
         * bytes.) */
        ProtobufCMessageUnknownField uf[LNORM__MAX_UNKNOWN_FIELDS + 1];
        static uint8_t empty[1] = {0}, big[2 + LNORM__MAX_UNKNOWN_BYTES];
        memset(big, 0x5a, sizeof big);
        for (size_t i = 0; i < sizeof uf / sizeof uf[0]; i++) {
            uf[i].tag = 2000 + (uint32_t)i;
            uf[i].wire_type = PROTOBUF_C_WIRE_TYPE_LENGTH_PREFIXED;
            uf[i].len = 1;
            uf[i].data = empty;
        }
        /* 16 empty ones (3 bytes each), at the top: accepted, same request. */
        mkreq(&q, &rng);
        q.r.base.n_unknown_fields = LNORM__MAX_UNKNOWN_FIELDS;
        q.r.base.unknown_fields = uf;
        rc = decode(&q.r, &d, err, sizeof err);
        CHECK(rc == LNORM_OK && d.seg.rows == 4 && d.seg.x && !memcmp(d.seg.x, q.x, sizeof q.x),
              "16 unknown fields: %d %s", rc, err);
        lnorm__codec_decoded_free(&d);
        /* 17: refused, the id recovered. */
        q.r.base.n_unknown_fields = LNORM__MAX_UNKNOWN_FIELDS + 1;
        expect_err(&q, LNORM_EINVAL, "not in the lnorm.v1 schema", "17 unknown fields");
        /* 17 split between Request, NormalizeRequest and Affine. */
        mkreq(&q, &rng);
        q.r.base.n_unknown_fields = 6;
        q.r.base.unknown_fields = uf;
        q.n.base.n_unknown_fields = 6;
        q.n.base.unknown_fields = uf + 6;
        q.a.base.n_unknown_fields = 5;
        q.a.base.unknown_fields = uf + 12;
        expect_err(&q, LNORM_EINVAL, "not in the lnorm.v1 schema", "17 unknown fields, nested");
        q.a.base.n_unknown_fields = 4;
        CHECK(decode(&q.r, &d, err, sizeof err) == LNORM_OK, "16 unknown fields, nested: %s", err);
        lnorm__codec_decoded_free(&d);
        /* One unknown field of 4096 bytes in all (a 2-byte key, a 2-byte
         * length, 4092 bytes), then one byte more. */
        mkreq(&q, &rng);
        size_t payload = LNORM__MAX_UNKNOWN_BYTES - 4;
        big[0] = (uint8_t)(0x80 | (payload & 0x7f));
        big[1] = (uint8_t)(payload >> 7);
        uf[0].len = 2 + payload;
        uf[0].data = big;
        q.n.base.n_unknown_fields = 1;
        q.n.base.unknown_fields = uf;
        CHECK(decode(&q.r, &d, err, sizeof err) == LNORM_OK, "unknown field of 4096 bytes: %s", err);
        lnorm__codec_decoded_free(&d);
        payload++;
        big[0] = (uint8_t)(0x80 | (payload & 0x7f));
        big[1] = (uint8_t)(payload >> 7);
        uf[0].len = 2 + payload;
        expect_err(&q, LNORM_EINVAL, "not in the lnorm.v1 schema", "unknown field of 4097 bytes");
        uf[0].len = 1;
        uf[0].data = empty;
    }

    /* A string with a NUL byte (a C string would end there): refused,
     * never read as a shorter id or as no id. */
    {
        static const char *const ids[] = {"\001abc", "abc\001def", "abc\001"};
        for (int i = 0; i < 3; i++) {
            char id[16];
            strcpy(id, ids[i]);
            mkreq(&q, &rng);
            q.a.gamma.len = q.a.beta.len = 0;
            q.a.dtype = 0;
            q.a.params_id = id;
            size_t n;
            uint8_t *b = pack(&q.r, &n);
            /* the id's bytes in the message; its 0x01 becomes 0x00 */
            size_t il = strlen(id), at = n;
            for (size_t o = 0; o + il <= n && at == n; o++)
                if (!memcmp(b + o, id, il))
                    at = o;
            CHECK(at < n, "NUL id %d: id not found in the message", i);
            if (at < n)
                b[at + (size_t)(strchr(id, 0x01) - id)] = 0;
            rc = lnorm__codec_decode_request(b, n, &lim, NULL, &d, err, sizeof err);
            CHECK(rc == LNORM_EINVAL && !strncmp(err, "normalize.affine.params_id: ", 28) && strstr(err, "NUL") &&
                      d.request_id == 12345,
                  "NUL id %d: %d %s", i, rc, err);
            lnorm__codec_decoded_free(&d);
            free(b);
        }
    }

    /* RegisterParams / DropParams / Health / Info / no body. */
    Lnorm__V1__Request r = LNORM__V1__REQUEST__INIT;
    Lnorm__V1__RegisterParamsRequest rp = LNORM__V1__REGISTER_PARAMS_REQUEST__INIT;
    r.request_id = 12345;
    r.body_case = LNORM__V1__REQUEST__BODY_REGISTER_PARAMS;
    r.register_params = &rp;
    rp.params_id = "p";
    rp.dtype = LNORM__V1__DTYPE__DTYPE_BF16;
    rp.hidden = 64;
    rp.gamma.data = q.g;
    rp.gamma.len = 128;
    CHECK(decode(&r, &d, err, sizeof err) == LNORM_OK && d.kind == LNORM__REQ_REGISTER, "register: %s", err);
    lnorm__codec_decoded_free(&d);
    rp.gamma.len = 256;
    CHECK(decode(&r, &d, err, sizeof err) == LNORM_EINVAL && strstr(err, "register_params.gamma"), "register size: %s", err);
    lnorm__codec_decoded_free(&d);
    rp.gamma.len = 0;
    CHECK(decode(&r, &d, err, sizeof err) == LNORM_EINVAL, "register nothing: %s", err);
    lnorm__codec_decoded_free(&d);
    rp.gamma.len = 128;
    rp.hidden = 100000;
    CHECK(decode(&r, &d, err, sizeof err) == LNORM_ELIMIT && strstr(err, "max-hidden"), "register hidden: %s", err);
    lnorm__codec_decoded_free(&d);
    char longid[200];
    memset(longid, 'a', sizeof longid - 1);
    longid[sizeof longid - 1] = 0;
    rp.hidden = 64;
    rp.params_id = longid;
    CHECK(decode(&r, &d, err, sizeof err) == LNORM_EINVAL && strstr(err, "params_id"), "long id: %s", err);
    lnorm__codec_decoded_free(&d);
    Lnorm__V1__DropParamsRequest dp = LNORM__V1__DROP_PARAMS_REQUEST__INIT;
    r.body_case = LNORM__V1__REQUEST__BODY_DROP_PARAMS;
    r.drop_params = &dp;
    CHECK(decode(&r, &d, err, sizeof err) == LNORM_EINVAL, "drop empty id");
    lnorm__codec_decoded_free(&d);
    Lnorm__V1__HealthRequest hr = LNORM__V1__HEALTH_REQUEST__INIT;
    r.body_case = LNORM__V1__REQUEST__BODY_HEALTH;
    r.health = &hr;
    CHECK(decode(&r, &d, err, sizeof err) == LNORM_OK && d.kind == LNORM__REQ_HEALTH, "health");
    lnorm__codec_decoded_free(&d);
    r.body_case = LNORM__V1__REQUEST__BODY__NOT_SET;
    CHECK(decode(&r, &d, err, sizeof err) == LNORM_EINVAL && strstr(err, "body"), "no body");
    lnorm__codec_decoded_free(&d);

    /* Status texts name fields one way, by their path from Request: a NUL in
     * each string field, and a sample of other bad fields. */
    {
        char nul_id[] = "ab\001cd";
        struct {
            Lnorm__V1__Request__BodyCase body;
            const char *want; /* the path expected, or NULL: any path of the schema */
        } cases[] = {
            {LNORM__V1__REQUEST__BODY_REGISTER_PARAMS, "register_params.params_id"},
            {LNORM__V1__REQUEST__BODY_DROP_PARAMS, "drop_params.params_id"},
            {LNORM__V1__REQUEST__BODY_REGISTER_PARAMS, NULL}, /* hidden 0 */
            {LNORM__V1__REQUEST__BODY_NORMALIZE, NULL},       /* bad op */
            {LNORM__V1__REQUEST__BODY_NORMALIZE, NULL},       /* x of the wrong size */
        };
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
            req q2;
            mkreq(&q2, &rng);
            Lnorm__V1__RegisterParamsRequest rp2 = LNORM__V1__REGISTER_PARAMS_REQUEST__INIT;
            Lnorm__V1__DropParamsRequest dp2 = LNORM__V1__DROP_PARAMS_REQUEST__INIT;
            rp2.params_id = nul_id;
            rp2.dtype = LNORM__V1__DTYPE__DTYPE_F32;
            rp2.hidden = 64;
            rp2.gamma.data = q2.g;
            rp2.gamma.len = 256;
            dp2.params_id = nul_id;
            q2.r.body_case = cases[i].body;
            if (cases[i].body == LNORM__V1__REQUEST__BODY_REGISTER_PARAMS)
                q2.r.register_params = &rp2;
            if (cases[i].body == LNORM__V1__REQUEST__BODY_DROP_PARAMS)
                q2.r.drop_params = &dp2;
            if (i == 2) {
                rp2.params_id = "ok";
                rp2.hidden = 0;
            }
            if (i == 3)
                q2.n.op = 7;
            if (i == 4)
                q2.n.x.len -= 4;
            size_t n;
            uint8_t *b = pack(&q2.r, &n);
            if (cases[i].want) { /* the id's 0x01 becomes 0x00 */
                for (size_t o = 0; o + 5 <= n; o++)
                    if (!memcmp(b + o, nul_id, 5))
                        b[o + 2] = 0;
            }
            rc = lnorm__codec_decode_request(b, n, &lim, NULL, &d, err, sizeof err);
            CHECK(rc == LNORM_EINVAL && names_field_path(err) &&
                      (!cases[i].want || (!strncmp(err, cases[i].want, strlen(cases[i].want)) &&
                                          err[strlen(cases[i].want)] == ':')),
                  "status text %zu does not name its field by its path from Request%s%s: %d '%s'", i,
                  cases[i].want ? " as " : "", cases[i].want ? cases[i].want : "", rc, err);
            lnorm__codec_decoded_free(&d);
            free(b);
        }
    }

    /* An empty Affine is no affine; a field given twice and two bodies in
     * one Request are INVALID_ARGUMENT naming the field (docs/protocol.md). */
    {
        req q2;
        mkreq(&q2, &rng);
        lnorm__v1__affine__init(&q2.a);
        q2.n.affine = &q2.a;
        rc = decode(&q2.r, &d, err, sizeof err);
        CHECK(rc == LNORM_OK && !d.seg.gamma && !d.seg.beta && !d.params_id &&
                  d.seg.param_dtype == (int)q2.n.x_dtype,
              "an empty Affine is not the same as none: %d %s", rc, err);
        lnorm__codec_decoded_free(&d);
        q2.n.affine = NULL;

        /* Request{normalize} twice; Request{normalize} then Request{health}. */
        q2.r.request_id = 0;
        q2.r.deadline_us = 0;
        Lnorm__V1__Request h = LNORM__V1__REQUEST__INIT;
        Lnorm__V1__HealthRequest hb = LNORM__V1__HEALTH_REQUEST__INIT;
        h.body_case = LNORM__V1__REQUEST__BODY_HEALTH;
        h.health = &hb;
        size_t n1, n2;
        uint8_t *b1 = pack(&q2.r, &n1), *b2 = pack(&h, &n2);
        uint8_t *cat = malloc(2 * n1 + n2 + 16);
        memcpy(cat, b1, n1);
        memcpy(cat + n1, b1, n1);
        rc = lnorm__codec_decode_request(cat, 2 * n1, &lim, NULL, &d, err, sizeof err);
        CHECK(rc == LNORM_EINVAL && !strncmp(err, "normalize: given twice", 22), "normalize twice: %d '%s'", rc, err);
        lnorm__codec_decoded_free(&d);
        memcpy(cat + n1, b2, n2);
        rc = lnorm__codec_decode_request(cat, n1 + n2, &lim, NULL, &d, err, sizeof err);
        CHECK(rc == LNORM_EINVAL && !strncmp(err, "health: given with normalize", 28) && strstr(err, "one body"),
              "two bodies: %d '%s'", rc, err);
        lnorm__codec_decoded_free(&d);

        /* normalize { ...; x } with a second x (both of the right size). */
        Lnorm__V1__NormalizeRequest xonly = LNORM__V1__NORMALIZE_REQUEST__INIT;
        xonly.x = q2.n.x;
        size_t nn = lnorm__v1__normalize_request__get_packed_size(&q2.n),
               nx = lnorm__v1__normalize_request__get_packed_size(&xonly);
        uint8_t *body = malloc(nn + nx);
        lnorm__v1__normalize_request__pack(&q2.n, body);
        lnorm__v1__normalize_request__pack(&xonly, body + nn);
        size_t o = 0;
        cat[o++] = (10 << 3) | 2;
        for (uint64_t v = nn + nx; ; v >>= 7) {
            cat[o++] = (uint8_t)(v & 0x7f) | (v >= 0x80 ? 0x80 : 0);
            if (v < 0x80)
                break;
        }
        uint8_t *m = malloc(o + nn + nx);
        memcpy(m, cat, o);
        memcpy(m + o, body, nn + nx);
        rc = lnorm__codec_decode_request(m, o + nn + nx, &lim, NULL, &d, err, sizeof err);
        CHECK(rc == LNORM_EINVAL && !strncmp(err, "normalize.x: given twice", 24), "x twice: %d '%s'", rc, err);
        lnorm__codec_decoded_free(&d);
        free(m);
        free(body);
        free(cat);
        free(b1);
        free(b2);
    }

    /* Packing an error reply. */
    nng_msg *msg;
    CHECK(lnorm__codec_pack_error(9, LNORM_ENOTFOUND, "x: gone", &msg) == LNORM_OK, "pack error");
    Lnorm__V1__Response *resp = lnorm__v1__response__unpack(NULL, nng_msg_len(msg), nng_msg_body(msg));
    CHECK(resp && resp->request_id == 9 && resp->status && resp->status->code == 5 && !strcmp(resp->status->message, "x: gone"),
          "error reply round trip");
    if (resp)
        lnorm__v1__response__free_unpacked(resp, NULL);
    nng_msg_free(msg);

    return check_finish("server.codec");
}
