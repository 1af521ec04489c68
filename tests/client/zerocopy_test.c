/*
 * The zero-copy path between liblnorm and lnormd, without a daemon:
 *
 * 1. liblnorm's hand-encoded chunk requests (client/lib/normalize.c) unpack
 *    with protobuf-c to exactly the fields of the request (op, dtypes, rows,
 *    hidden, eps, eps mode, x / residual rows of the chunk, affine or params
 *    id, want_stats, priority, max_queue_us, request id, deadline), carry only the padding field as
 *    an unknown field, and put x at the intended phase (12 mod 16).
 * 2. lnormd's borrowing decode (server/codec.c) gives the same result as the
 *    copying decode (status, message, request id, every segment field, the
 *    payload bytes) on those requests, on protobuf-c encodings, and on every
 *    truncation and thousands of random mutations of both; when it borrows,
 *    x points into the message.
 * 3. lnorm__codec_pack_y_in_place writes a Response that protobuf-c and
 *    liblnorm's reader both decode to the same request id, status, timings
 *    and y, without moving y (when there is room in front of it) or after
 *    moving it into headroom (when there is not).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <nng/nng.h>

#include "check.h"
#include "codec.h"
#include "internal.h"
#include "lnorm/lnorm.h"
#include "testutil.h"


static const lnorm__limits lim = {1u << 26, 1u << 20, 1u << 16};

/* ---- 1 + 2: requests -------------------------------------------------------- */

static size_t seg_x_bytes(const lnorm_segment *s)
{
    return (size_t)s->rows * (size_t)s->hidden * lnorm_dtype_size(s->x_dtype);
}

/* The fields protobuf-c kept as unknown in m and the sub-messages it
 * holds (the active member of a oneof only), and their encoded bytes: the
 * key, then the data protobuf-c keeps (the length's varint included). */
static void count_unknown(const ProtobufCMessage *m, unsigned *nf, size_t *nb)
{
    if (!m)
        return;
    for (unsigned i = 0; i < m->n_unknown_fields; i++) {
        uint64_t key = ((uint64_t)m->unknown_fields[i].tag << 3) | (uint64_t)m->unknown_fields[i].wire_type;
        size_t kl = 1;
        while (key >= 0x80) {
            key >>= 7;
            kl++;
        }
        (*nf)++;
        *nb += kl + m->unknown_fields[i].len;
    }
    const ProtobufCMessageDescriptor *d = m->descriptor;
    for (unsigned i = 0; i < d->n_fields; i++) {
        const ProtobufCFieldDescriptor *f = &d->fields[i];
        if (f->type != PROTOBUF_C_TYPE_MESSAGE || f->label == PROTOBUF_C_LABEL_REPEATED)
            continue;
        if ((f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) &&
            *(const uint32_t *)((const char *)m + f->quantifier_offset) != f->id)
            continue;
        count_unknown(*(ProtobufCMessage *const *)((const char *)m + f->offset), nf, nb);
    }
}

/* The two decodes of one message agree. Returns 1 when the borrowing one
 * borrowed. */
static int compare_decodes(const uint8_t *b, size_t n, const char *what)
{
    lnorm__decoded a, z;
    char ea[256], ez[256];
    int ra = lnorm__codec_decode_request(b, n, &lim, NULL, &a, ea, sizeof ea);
    int rz = lnorm__codec_decode_request_borrow(b, n, &lim, &z, ez, sizeof ez);
    int borrowed = z.borrowed;
    /* protobuf-c on the whole message: the reference for the split */
    Lnorm__V1__Request *ref = n <= lim.max_message_bytes ? lnorm__v1__request__unpack(NULL, n, b) : NULL;
    /* The decode refuses, before protobuf-c, what protobuf-c would keep
     * beyond the schema (LNORM__MAX_UNKNOWN_*), strings with a NUL
     * (protobuf-c would cut them there), and a field given twice or two
     * bodies (protobuf-c would merge them or keep the last). */
    const int refused_unknown = ra == LNORM_EINVAL && strstr(ea, "not in the lnorm.v1 schema") != NULL;
    const int refused_nul = ra == LNORM_EINVAL && (strstr(ea, "a string with a NUL byte") != NULL ||
                                                   strstr(ea, ": given twice") || strstr(ea, ": given with "));
    if (ref) {
        unsigned nf = 0;
        size_t nb = 0;
        count_unknown(&ref->base, &nf, &nb);
        const int over = nf > LNORM__MAX_UNKNOWN_FIELDS || nb > LNORM__MAX_UNKNOWN_BYTES;
        CHECK(over == refused_unknown || (refused_nul && !over),
              "%s: protobuf-c keeps %u unknown fields of %zu bytes, the decode says '%s'", what, nf, nb, ea);
    }
    if (n <= lim.max_message_bytes) {
        CHECK(!ref == !a.msg || (ref && (refused_unknown || refused_nul)),
              "%s: protobuf-c %s the message, the split decode %s", what, ref ? "accepts" : "rejects",
              a.msg ? "accepts" : "rejects");
        if (ref && a.msg) {
            CHECK(ref->request_id == a.msg->request_id && ref->deadline_us == a.msg->deadline_us &&
                      ref->body_case == a.msg->body_case,
                  "%s: envelope differs from protobuf-c's", what);
            if (ref->body_case == LNORM__V1__REQUEST__BODY_NORMALIZE && a.msg->body_case == ref->body_case) {
                const Lnorm__V1__NormalizeRequest *p = ref->normalize, *q = a.msg->normalize;
                CHECK(p->op == q->op && p->x_dtype == q->x_dtype && p->y_dtype == q->y_dtype && p->rows == q->rows &&
                          p->hidden == q->hidden && p->eps_present_case == q->eps_present_case &&
                          (p->eps_present_case != LNORM__V1__NORMALIZE_REQUEST__EPS_PRESENT_EPS ||
                           memcmp(&p->eps, &q->eps, 4) == 0) &&
                          p->eps_mode == q->eps_mode && p->want_stats == q->want_stats && !p->affine == !q->affine,
                      "%s: normalize fields differ from protobuf-c's", what);
                CHECK(p->x.len == q->x.len && (!p->x.len || memcmp(p->x.data, q->x.data, p->x.len) == 0),
                      "%s: x differs from protobuf-c's", what);
                CHECK(p->residual.len == q->residual.len &&
                          (!p->residual.len || memcmp(p->residual.data, q->residual.data, p->residual.len) == 0),
                      "%s: residual differs from protobuf-c's", what);
            }
        }
    }
    if (ref)
        lnorm__v1__request__free_unpacked(ref, NULL);
    CHECK(ra == rz, "%s: copy rc %d '%s', borrow rc %d '%s'", what, ra, ea, rz, ez);
    CHECK(strcmp(ea, ez) == 0, "%s: messages differ: '%s' vs '%s'", what, ea, ez);
    CHECK(a.request_id == z.request_id, "%s: request ids differ", what);
    CHECK(!a.borrowed, "%s: the copying decode borrowed", what);
    if (ra == LNORM_OK && rz == LNORM_OK) {
        CHECK(a.kind == z.kind && a.deadline_us == z.deadline_us, "%s: kind/deadline differ", what);
        if (a.kind == LNORM__REQ_NORMALIZE && z.kind == LNORM__REQ_NORMALIZE) {
            const lnorm_segment *sa = &a.seg, *sz = &z.seg;
            CHECK(sa->op == sz->op && sa->x_dtype == sz->x_dtype && sa->y_dtype == sz->y_dtype &&
                      sa->param_dtype == sz->param_dtype && sa->rows == sz->rows && sa->hidden == sz->hidden &&
                      sa->eps == sz->eps && sa->eps_mode == sz->eps_mode,
                  "%s: segment fields differ", what);
            CHECK(a.y_bytes == z.y_bytes && a.in_bytes == z.in_bytes && a.res_out_bytes == z.res_out_bytes &&
                      a.want_mean == z.want_mean && a.want_rstd == z.want_rstd,
                  "%s: sizes differ", what);
            size_t xb = seg_x_bytes(sa);
            CHECK(memcmp(sa->x, sz->x, xb) == 0, "%s: x differs", what);
            CHECK(!sa->residual == !sz->residual, "%s: residual presence differs", what);
            if (sa->residual && sz->residual)
                CHECK(memcmp(sa->residual, sz->residual, xb) == 0, "%s: residual differs", what);
            size_t pb = (size_t)sa->hidden * lnorm_dtype_size(sa->param_dtype);
            CHECK(!sa->gamma == !sz->gamma && !sa->beta == !sz->beta, "%s: affine presence differs", what);
            if (sa->gamma && sz->gamma)
                CHECK(memcmp(sa->gamma, sz->gamma, pb) == 0, "%s: gamma differs", what);
            if (sa->beta && sz->beta)
                CHECK(memcmp(sa->beta, sz->beta, pb) == 0, "%s: beta differs", what);
            CHECK(!a.params_id == !z.params_id && (!a.params_id || strcmp(a.params_id, z.params_id) == 0),
                  "%s: params id differs", what);
            if (z.borrowed & LNORM__BORROWED_X)
                CHECK((uintptr_t)sz->x % 4 == 0, "%s: borrowed x is not aligned", what);
            if (z.borrowed & LNORM__BORROWED_X)
                CHECK((const uint8_t *)sz->x >= b && (const uint8_t *)sz->x + xb <= b + n,
                      "%s: borrowed x is not inside the message", what);
        }
    }
    lnorm__codec_decoded_free(&a);
    lnorm__codec_decoded_free(&z);
    return borrowed;
}

typedef struct rcase {
    lnorm_normalize_req q;
    void *x, *res, *g, *b, *y, *ro;
    float *mean, *rstd;
    char id[32];
} rcase;

static void rcase_make(rcase *c, lnorm_rng *g)
{
    memset(c, 0, sizeof *c);
    static const uint64_t hid[] = {1, 3, 64, 1000, 1024, 4097};
    lnorm_op op = lnorm_rng_next(g) % 2 ? LNORM_OP_LAYERNORM : LNORM_OP_RMSNORM;
    lnorm_dtype xd = (lnorm_dtype)(1 + lnorm_rng_next(g) % 3);
    uint64_t rows = 1 + lnorm_rng_next(g) % 300, h = hid[lnorm_rng_next(g) % 6];
    lnorm_normalize_req_init(&c->q, op, xd, rows, h);
    int yc = (int)(lnorm_rng_next(g) % 3);
    c->q.y_dtype = yc == 0 ? LNORM_DTYPE_NONE : yc == 1 ? LNORM_DTYPE_F32 : xd;
    size_t xs = lnorm_dtype_size(xd), n = rows * h;
    c->x = malloc(n * xs);
    c->y = malloc(n * 4);
    for (size_t i = 0; i < n * xs; i++)
        ((uint8_t *)c->x)[i] = (uint8_t)lnorm_rng_next(g);
    c->q.x = c->x;
    c->q.y = c->y;
    c->q.eps = lnorm_rng_next(g) % 2 ? 1e-5f : 0.25f;
    c->q.eps_mode = lnorm_rng_next(g) % 2 ? LNORM_EPS_OUTSIDE : LNORM_EPS_INSIDE;
    if (lnorm_rng_next(g) % 3 == 0) {
        c->res = malloc(n * xs);
        c->ro = malloc(n * xs);
        memset(c->res, 0x5a, n * xs);
        c->q.residual = c->res;
        c->q.residual_out = c->ro;
    }
    int aff = (int)(lnorm_rng_next(g) % 3);
    if (aff == 1) {
        c->q.param_dtype = lnorm_rng_next(g) % 2 ? LNORM_DTYPE_F32 : xd;
        size_t pb = h * lnorm_dtype_size(c->q.param_dtype);
        c->g = malloc(pb);
        memset(c->g, 0x3c, pb);
        c->q.gamma = c->g;
        if (lnorm_rng_next(g) % 2) {
            c->b = malloc(pb);
            memset(c->b, 0x11, pb);
            c->q.beta = c->b;
        }
    } else if (aff == 2) {
        snprintf(c->id, sizeof c->id, "p.%u", (unsigned)(lnorm_rng_next(g) % 1000));
        c->q.params_id = c->id;
    }
    if (lnorm_rng_next(g) % 2) {
        c->rstd = malloc(rows * 4);
        c->q.rstd = c->rstd;
        if (op == LNORM_OP_LAYERNORM) {
            c->mean = malloc(rows * 4);
            c->q.mean = c->mean;
        }
    }
    c->q.chunk_bytes = lnorm_rng_next(g) % 2 ? 0 : 1 + lnorm_rng_next(g) % 20000;
    static const uint64_t big[] = {0, 1, 127, 128, 300, 1ull << 35, UINT64_MAX};
    c->q.priority = lnorm_rng_next(g) % 2 ? 0 : (uint32_t)big[lnorm_rng_next(g) % 7];
    c->q.max_queue_us = lnorm_rng_next(g) % 2 ? 0 : big[lnorm_rng_next(g) % 7];
}

static void rcase_free(rcase *c)
{
    free(c->x);
    free(c->res);
    free(c->g);
    free(c->b);
    free(c->y);
    free(c->ro);
    free(c->mean);
    free(c->rstd);
}

/* Chunk i of c, unpacked by protobuf-c, against the request. */
static void check_chunk(const rcase *c, const nng_msg *m, uint64_t i, uint64_t nchunks, uint64_t id, uint64_t dl)
{
    const lnorm_normalize_req *q = &c->q;
    uint8_t *body = nng_msg_body((nng_msg *)m);
    size_t n = nng_msg_len((nng_msg *)m);
    Lnorm__V1__Request *r = lnorm__v1__request__unpack(NULL, n, body);
    CHECK(r != NULL, "chunk %llu does not unpack", (unsigned long long)i);
    if (!r)
        return;
    (void)nchunks;
    size_t xs = lnorm_dtype_size(q->x_dtype), row = q->hidden * xs;
    /* rows per chunk as the library computes it */
    size_t chunk = q->chunk_bytes ? q->chunk_bytes : LNORM_DEFAULT_CHUNK_BYTES;
    uint64_t rpc = chunk / row < 1 ? 1 : chunk / row > q->rows ? q->rows : chunk / row;
    uint64_t r0 = i * rpc, nr = q->rows - r0 < rpc ? q->rows - r0 : rpc;
    CHECK(r->request_id == id && r->deadline_us == dl, "request id / deadline");
    CHECK(r->body_case == LNORM__V1__REQUEST__BODY_NORMALIZE && r->normalize, "not a normalize request");
    if (r->body_case == LNORM__V1__REQUEST__BODY_NORMALIZE && r->normalize) {
        const Lnorm__V1__NormalizeRequest *nq = r->normalize;
        lnorm_dtype yd = q->y_dtype == LNORM_DTYPE_NONE ? q->x_dtype : q->y_dtype;
        CHECK((int)nq->op == (int)q->op && (int)nq->x_dtype == (int)q->x_dtype && (int)nq->y_dtype == (int)yd,
              "op/dtypes");
        CHECK(nq->rows == nr && nq->hidden == q->hidden, "rows %llu (want %llu) hidden %llu",
              (unsigned long long)nq->rows, (unsigned long long)nr, (unsigned long long)nq->hidden);
        CHECK(nq->eps_present_case == LNORM__V1__NORMALIZE_REQUEST__EPS_PRESENT_EPS && nq->eps == q->eps, "eps");
        CHECK((int)nq->eps_mode == (int)q->eps_mode, "eps mode");
        CHECK(nq->x.len == nr * row && memcmp(nq->x.data, (const uint8_t *)q->x + r0 * row, nr * row) == 0, "x");
        if (q->residual)
            CHECK(nq->residual.len == nr * row &&
                      memcmp(nq->residual.data, (const uint8_t *)q->residual + r0 * row, nr * row) == 0,
                  "residual");
        else
            CHECK(nq->residual.len == 0, "residual present");
        int stats = q->want_stats || q->mean || q->rstd;
        CHECK(nq->want_stats == stats, "want_stats");
        CHECK(nq->priority == q->priority && nq->max_queue_us == q->max_queue_us,
              "priority %u (want %u), max_queue_us %llu (want %llu)", nq->priority, q->priority,
              (unsigned long long)nq->max_queue_us, (unsigned long long)q->max_queue_us);
        if (q->params_id && q->params_id[0]) {
            CHECK(nq->affine && nq->affine->params_id && strcmp(nq->affine->params_id, q->params_id) == 0 &&
                      !nq->affine->gamma.len && !nq->affine->beta.len,
                  "params id");
        } else if (q->gamma || q->beta) {
            lnorm_dtype pd = q->param_dtype == LNORM_DTYPE_NONE ? q->x_dtype : q->param_dtype;
            size_t pb = q->hidden * lnorm_dtype_size(pd);
            CHECK(nq->affine && (int)nq->affine->dtype == (int)pd, "affine dtype");
            if (nq->affine) {
                CHECK(nq->affine->gamma.len == (q->gamma ? pb : 0) &&
                          (!q->gamma || memcmp(nq->affine->gamma.data, q->gamma, pb) == 0),
                      "gamma");
                CHECK(nq->affine->beta.len == (q->beta ? pb : 0) &&
                          (!q->beta || memcmp(nq->affine->beta.data, q->beta, pb) == 0),
                      "beta");
            }
        } else {
            CHECK(nq->affine == NULL, "affine present");
        }
        /* the padding is the only unknown field, and x is at the phase */
        size_t unknown = nq->base.n_unknown_fields;
        CHECK(unknown <= 1, "%zu unknown fields", unknown);
        if (unknown == 1)
            CHECK(nq->base.unknown_fields[0].tag == 2047, "unknown field %u", nq->base.unknown_fields[0].tag);
        const uint8_t *xp = NULL;
        for (size_t k = 0; k + nr * row <= n; k++)
            if (memcmp(body + k, (const uint8_t *)q->x + r0 * row, nr * row) == 0) {
                xp = body + k;
                break;
            }
        CHECK(xp && (size_t)(xp - body) % 16 == 12 && xp - body >= 64, "x at offset %zd (want 12 mod 16, >= 64)",
              xp ? xp - body : -1);
    }
    lnorm__v1__request__free_unpacked(r, NULL);
}

static void test_requests(void)
{
    lnorm_rng g;
    lnorm_rng_seed(&g, 0x2e40c0u);
    const char *url = "ipc:///tmp/lnorm-zerocopy-test-nobody.sock";
    lnorm_client *c;
    lnorm_client_opts o;
    lnorm_client_opts_init(&o);
    int rv = lnorm_client_open(&c, &url, 1, &o);
    CHECK(rv == LNORM_OK, "open: %s", lnorm_strerror(rv));
    if (rv != LNORM_OK)
        return;
    int borrowed = 0, total = 0;
    for (int it = 0; it < 300; it++) {
        rcase rc;
        rcase_make(&rc, &g);
        uint64_t nchunks = 0, id = lnorm_rng_next(&g) % 3 == 0 ? 0 : lnorm_rng_next(&g) >> (lnorm_rng_next(&g) % 64);
        nng_msg *m = NULL;
        rv = lnorm__normalize_chunk_msg(c, &rc.q, 0, id, &nchunks, &m);
        CHECK(rv == LNORM_OK, "encode: %s", lnorm_strerror(rv));
        if (rv == LNORM_OK) {
            uint64_t which[3] = {0, nchunks / 2, nchunks - 1};
            for (int k = 0; k < 3; k++) {
                if (k > 0) {
                    nng_msg_free(m);
                    m = NULL;
                    rv = lnorm__normalize_chunk_msg(c, &rc.q, which[k], id, &nchunks, &m);
                    CHECK(rv == LNORM_OK, "encode chunk %llu: %s", (unsigned long long)which[k], lnorm_strerror(rv));
                    if (rv != LNORM_OK)
                        break;
                }
                check_chunk(&rc, m, which[k], nchunks, id, 0);
                uint8_t *b = nng_msg_body(m);
                size_t n = nng_msg_len(m);
                borrowed += (compare_decodes(b, n, "liblnorm chunk") & LNORM__BORROWED_X) != 0;
                total++;
                if (it % 10 == 0 && n < 20000) {
                    /* every truncation, and mutations */
                    for (size_t cut = 0; cut < n; cut += 1 + n / 400)
                        compare_decodes(b, cut, "truncated chunk");
                    uint8_t *mm = malloc(n);
                    for (int j = 0; j < 200; j++) {
                        memcpy(mm, b, n);
                        int kk = 1 + (int)(lnorm_rng_next(&g) % 3);
                        for (int q = 0; q < kk; q++) {
                            /* mostly the framing in front of x */
                            size_t at = lnorm_rng_next(&g) % (n < 64 ? n : (j % 2 ? 64 : n));
                            mm[at] = (uint8_t)lnorm_rng_next(&g);
                        }
                        compare_decodes(mm, n, "mutated chunk");
                    }
                    free(mm);
                }
            }
            nng_msg_free(m);
        }
        rcase_free(&rc);
    }
    CHECK(borrowed == total, "only %d of %d chunks had x borrowed", borrowed, total);
    printf("requests: %d chunks, %d decoded borrowing\n", total, borrowed);

    /* protobuf-c encodings (fields in number order, no padding) and odd
     * shapes: two normalize fields (merged by protobuf-c: not borrowed), x
     * twice, a oneof overridden by a later body. */
    Lnorm__V1__Request r = LNORM__V1__REQUEST__INIT;
    Lnorm__V1__NormalizeRequest nq = LNORM__V1__NORMALIZE_REQUEST__INIT;
    uint8_t x[4 * 8 * 4], res[4 * 8 * 4];
    for (size_t i = 0; i < sizeof x; i++) {
        x[i] = (uint8_t)(i * 7);
        res[i] = (uint8_t)(i * 13);
    }
    /* f32 values that are finite */
    for (size_t i = 0; i < sizeof x; i += 4) {
        float v = (float)i * 0.25f;
        memcpy(x + i, &v, 4);
        memcpy(res + i, &v, 4);
    }
    nq.op = LNORM__V1__OP__OP_LAYER_NORM;
    nq.x_dtype = LNORM__V1__DTYPE__DTYPE_F32;
    nq.rows = 4;
    nq.hidden = 8;
    nq.x.data = x;
    nq.x.len = sizeof x;
    nq.residual.data = res;
    nq.residual.len = sizeof res;
    r.request_id = 77;
    r.body_case = LNORM__V1__REQUEST__BODY_NORMALIZE;
    r.normalize = &nq;
    size_t n = lnorm__v1__request__get_packed_size(&r);
    uint8_t *b = malloc(2 * n + 64);
    lnorm__v1__request__pack(&r, b);
    compare_decodes(b, n, "protobuf-c normalize");
    /* the same at every alignment of the buffer: x and residual borrowed
     * exactly when 4-byte aligned */
    for (size_t sh = 1; sh < 8; sh++) {
        uint8_t *b2 = malloc(n + 8);
        memcpy(b2 + sh, b, n);
        compare_decodes(b2 + sh, n, "protobuf-c normalize, shifted");
        free(b2);
    }
    for (size_t cut = 0; cut < n; cut++)
        compare_decodes(b, cut, "truncated protobuf-c normalize");
    /* the message twice: normalize repeated (protobuf-c merges; x / residual
     * of the second win) */
    memcpy(b + n, b, n);
    CHECK(compare_decodes(b, 2 * n, "normalize twice") == 0, "repeated normalize borrowed");
    /* a health body after the normalize: the oneof says health */
    uint8_t tail[2] = {(13 << 3) | 2, 0};
    memcpy(b + n, tail, 2);
    compare_decodes(b, n + 2, "normalize then health");
    /* x repeated inside normalize (last wins in protobuf-c) */
    {
        Lnorm__V1__Request r2 = r;
        Lnorm__V1__NormalizeRequest n2 = nq;
        n2.residual.len = 0;
        n2.residual.data = NULL;
        r2.normalize = &n2;
        size_t k = lnorm__v1__request__get_packed_size(&r2);
        uint8_t *b2 = malloc(k + sizeof x + 16);
        lnorm__v1__request__pack(&r2, b2);
        /* normalize is the last field: append another x to its value and fix the length */
        size_t vo = 0;
        while (vo < k && b2[vo] != ((10 << 3) | 2))
            vo++; /* request_id 77 is one byte of value: no false match before */
        CHECK(vo < k, "normalize key not found");
        uint64_t inner = 0;
        size_t p = vo + 1, sh = 0;
        while (b2[p] & 0x80) {
            inner |= (uint64_t)(b2[p++] & 0x7f) << sh;
            sh += 7;
        }
        inner |= (uint64_t)b2[p++] << sh;
        CHECK(p + inner == k, "normalize is not last");
        uint8_t *b3 = malloc(k + sizeof x + 32);
        size_t o = 0;
        memcpy(b3, b2, vo + 1);
        o = vo + 1;
        uint64_t ni = inner + 2 + sizeof x;
        while (ni >= 0x80) {
            b3[o++] = (uint8_t)(ni | 0x80);
            ni >>= 7;
        }
        b3[o++] = (uint8_t)ni;
        memcpy(b3 + o, b2 + p, inner);
        o += inner;
        b3[o++] = (8 << 3) | 2;
        b3[o++] = (uint8_t)sizeof x;
        for (size_t i = 0; i < sizeof x; i++)
            b3[o++] = (uint8_t)(x[i] ^ 0x5a);
        CHECK(compare_decodes(b3, o, "x twice") == 0, "repeated x borrowed");
        free(b3);
        free(b2);
    }
    free(b);
    lnorm_client_close(c);
}

/* ---- 3: replies in place ----------------------------------------------------- */

static void check_reply(nng_msg *m, const uint8_t *y, size_t yn, uint64_t id, const Lnorm__V1__Timings *t,
                        const char *what)
{
    uint8_t *body = nng_msg_body(m);
    size_t n = nng_msg_len(m);
    Lnorm__V1__Response *r = lnorm__v1__response__unpack(NULL, n, body);
    CHECK(r != NULL, "%s: reply does not unpack", what);
    if (r) {
        CHECK(r->request_id == id, "%s: request id", what);
        CHECK(r->status && r->status->code == 0, "%s: status", what);
        CHECK(r->timings && r->timings->queue_us == t->queue_us && r->timings->compute_us == t->compute_us &&
                  r->timings->batch_rows == t->batch_rows && r->timings->batch_requests == t->batch_requests,
              "%s: timings", what);
        CHECK(r->body_case == LNORM__V1__RESPONSE__BODY_NORMALIZE && r->normalize && r->normalize->y.len == yn &&
                  memcmp(r->normalize->y.data, y, yn) == 0 && !r->normalize->mean.len && !r->normalize->rstd.len &&
                  !r->normalize->residual_out.len,
              "%s: body", what);
        lnorm__v1__response__free_unpacked(r, NULL);
    }
    lnorm__resp_view v;
    lnorm__span f[5];
    CHECK(lnorm__resp_parse(body, n, &v) == LNORM_OK && v.request_id == id && v.code == 0 &&
              v.queue_us == t->queue_us && v.compute_us == t->compute_us && v.batch_rows == t->batch_rows &&
              v.batch_requests == t->batch_requests && v.body == LNORM__V1__RESPONSE__BODY_NORMALIZE,
          "%s: liblnorm's reader", what);
    CHECK(lnorm__norm_parse(v.body_bytes, f) == LNORM_OK && f[1].n == yn && memcmp(f[1].p, y, yn) == 0,
          "%s: liblnorm's reader: y", what);
}

static void test_replies(void)
{
    lnorm_rng g;
    lnorm_rng_seed(&g, 0x7e91u);
    for (int it = 0; it < 400; it++) {
        size_t yn = it % 50 == 0 ? (size_t)1 << 20 : 1 + lnorm_rng_next(&g) % 5000;
        size_t front = it % 3 == 0 ? lnorm_rng_next(&g) % 30 : 40 + lnorm_rng_next(&g) % 100;
        size_t back = lnorm_rng_next(&g) % 64;
        nng_msg *m;
        CHECK(nng_msg_alloc(&m, front + yn + back) == 0, "alloc");
        uint8_t *body = nng_msg_body(m);
        memset(body, 0xee, front + yn + back);
        uint8_t *want = malloc(yn);
        for (size_t i = 0; i < yn; i++)
            want[i] = body[front + i] = (uint8_t)lnorm_rng_next(&g);
        Lnorm__V1__Timings t = LNORM__V1__TIMINGS__INIT;
        t.queue_us = lnorm_rng_next(&g) % 3 ? lnorm_rng_next(&g) >> (lnorm_rng_next(&g) % 64) : 0;
        t.compute_us = lnorm_rng_next(&g) >> (lnorm_rng_next(&g) % 64);
        t.batch_rows = (uint32_t)lnorm_rng_next(&g);
        t.batch_requests = (uint32_t)(lnorm_rng_next(&g) % 1000);
        uint64_t id = it % 7 == 0 ? 0 : lnorm_rng_next(&g) >> (lnorm_rng_next(&g) % 64);
        const uint8_t *yp = body + front;
        int rv = lnorm__codec_pack_y_in_place(m, yp, yn, id, &t);
        CHECK(rv == LNORM_OK, "pack in place: %d", rv);
        if (rv == LNORM_OK) {
            check_reply(m, want, yn, id, &t, front >= 64 ? "room in front" : "little room in front");
            const uint8_t *b = nng_msg_body(m);
            size_t n = nng_msg_len(m);
            if (front >= 64) {
                CHECK(b + n - yn == yp, "y moved although there was room");
                CHECK(n == front + yn, "reply of %zu bytes, want the request's %zu (front kept as padding)", n,
                      front + yn);
            }
            else if (front >= 12 && back >= 60) /* room for the other fields after y */
                CHECK(b <= yp && yp + yn <= b + n, "y moved although there was room for its keys");
        }
        /* y outside the body is refused, the message unchanged */
        nng_msg *o;
        CHECK(nng_msg_alloc(&o, 100) == 0, "alloc");
        CHECK(lnorm__codec_pack_y_in_place(o, want, yn, id, &t) == LNORM_EINVAL && nng_msg_len(o) == 100,
              "y outside the message accepted");
        nng_msg_free(o);
        nng_msg_free(m);
        free(want);
    }
}

int main(void)
{
    test_requests();
    test_replies();
    return check_finish("client.zerocopy");
}
