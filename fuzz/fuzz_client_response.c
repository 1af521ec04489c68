/*
 * Fuzz target: the client library's handling of server replies.
 *
 * The real liblnorm (client/lib) is driven end to end: a client dialed to
 * an in-process REP socket (inproc://) makes a call, and the REP side
 * answers every request with the fuzz input's bytes as the reply. So the
 * reply goes through exactly the client's code: protobuf-c unpacking, the
 * status mapping, the timings, and the per-kind "take" that checks sizes
 * and copies y/mean/rstd/residual_out into the caller's buffers (which are
 * exact-size heap blocks, so ASan sees any overflow).
 *
 * Input: a 6-byte header choosing the call, then the reply bytes.
 *   h[0] % 5: 0 normalize, 1 health, 2 info, 3 register params, 4 drop params
 *   h[1]: bit 0 RMSNorm, bit 1 want stats, bit 2 residual, bit 3 y = f32,
 *         bit 4 one row per chunk (several chunks, each answered the same)
 *   h[2] % 3: x dtype f32, f16, bf16;  h[3] % 16 + 1: rows;  h[4] % 64 + 1: hidden
 *   h[5]: bit 0 clear: the REP side appends the request's own request_id
 *         (field 1, which wins over any earlier one), so that replies reach
 *         "take"; set: the reply bytes as they are (the id check)
 * fuzz/gen_corpus.c writes seeds in this format.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <nng/nng.h>
#include <nng/protocol/reqrep0/rep.h>
#include <nng/supplemental/util/platform.h>

#include "lnorm/lnorm.h"

#define FUZZ_URL "inproc://lnorm-fuzz-client-response"

static nng_socket g_rep;
static nng_mtx *g_mu;
static uint8_t *g_reply;
static size_t g_reply_len;
static int g_echo_id;
static lnorm_client *g_client[2]; /* [0] one chunk per call, [1] one row per chunk */

/* The REP side: answer every request with the current reply bytes. */
static void server_main(void *arg)
{
    (void)arg;
    for (;;) {
        nng_msg *req;
        if (nng_recvmsg(g_rep, &req, 0) != 0)
            return;
        /* liblnorm writes request_id first (field 1, a varint) */
        uint8_t idf[11];
        size_t idn = 0;
        const uint8_t *b = nng_msg_body(req);
        size_t bl = nng_msg_len(req);
        if (bl >= 2 && b[0] == 0x08) {
            idf[idn++] = 0x08;
            for (size_t k = 1; k < bl && idn < sizeof idf; k++) {
                idf[idn++] = b[k];
                if (!(b[k] & 0x80))
                    break;
            }
        }
        nng_msg_clear(req); /* keep the header (the REQ routing id) */
        nng_mtx_lock(g_mu);
        int rv = nng_msg_append(req, g_reply, g_reply_len);
        if (rv == 0 && g_echo_id && idn)
            rv = nng_msg_append(req, idf, idn);
        nng_mtx_unlock(g_mu);
        if (rv != 0 || nng_sendmsg(g_rep, req, 0) != 0)
            nng_msg_free(req);
    }
}

static void setup(void)
{
    static nng_thread *th;
    if (nng_mtx_alloc(&g_mu) != 0 || nng_rep0_open(&g_rep) != 0 ||
        nng_listen(g_rep, FUZZ_URL, NULL, 0) != 0 || nng_thread_create(&th, server_main, NULL) != 0) {
        fprintf(stderr, "fuzz_client_response: setup failed\n");
        abort();
    }
    const char *url = FUZZ_URL;
    for (int i = 0; i < 2; i++) {
        lnorm_client_opts o;
        lnorm_client_opts_init(&o);
        o.send_timeout_ms = 5000;
        o.recv_timeout_ms = 5000;
        o.reconnect_min_ms = 10;
        o.reconnect_max_ms = 10;
        o.chunk_bytes = i ? 1 : 0; /* 1 byte: the client rounds up to one row */
        if (lnorm_client_open(&g_client[i], &url, 1, &o) != LNORM_OK) {
            fprintf(stderr, "fuzz_client_response: client open failed\n");
            abort();
        }
    }
}

static size_t dsize(int dt)
{
    return dt == LNORM_DTYPE_F32 ? 4 : 2;
}

/* An exact-size buffer (so overruns are caught), 0xAB-filled. */
static void *xbuf(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p)
        abort();
    memset(p, 0xAB, n);
    return p;
}

static void do_normalize(lnorm_client *c, const uint8_t *h)
{
    int op = (h[1] & 1) ? LNORM_OP_RMSNORM : LNORM_OP_LAYERNORM;
    int xdt = 1 + h[2] % 3;
    uint64_t rows = 1 + h[3] % 16, hidden = 1 + h[4] % 64;
    lnorm_normalize_req r;
    lnorm_normalize_req_init(&r, op, xdt, rows, hidden);
    if (h[1] & 8)
        r.y_dtype = LNORM_DTYPE_F32;
    int ydt = r.y_dtype != LNORM_DTYPE_NONE ? (int)r.y_dtype : xdt;
    size_t n = (size_t)(rows * hidden);
    void *x = xbuf(n * dsize(xdt)), *y = xbuf(n * dsize(ydt));
    void *res = NULL, *res_out = NULL;
    float *mean = NULL, *rstd = NULL;
    r.x = x;
    r.y = y;
    if (h[1] & 4) {
        res = xbuf(n * dsize(xdt));
        res_out = xbuf(n * dsize(xdt));
        r.residual = res;
        r.residual_out = res_out;
    }
    if (h[1] & 2) {
        rstd = xbuf(rows * sizeof(float));
        r.rstd = rstd;
        if (op == LNORM_OP_LAYERNORM) {
            mean = xbuf(rows * sizeof(float));
            r.mean = mean;
        }
    }
    lnorm_result res_info;
    memset(&res_info, 0, sizeof res_info);
    (void)lnorm_normalize(c, &r, &res_info);
    free(x);
    free(y);
    free(res);
    free(res_out);
    free(mean);
    free(rstd);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static int ready;
    if (!ready) {
        setup();
        ready = 1;
    }
    if (size < 6)
        return 0;
    const uint8_t *h = data;
    nng_mtx_lock(g_mu);
    free(g_reply);
    g_reply_len = size - 6;
    g_reply = xbuf(g_reply_len);
    memcpy(g_reply, data + 6, g_reply_len);
    g_echo_id = !(h[5] & 1);
    nng_mtx_unlock(g_mu);

    lnorm_client *c = g_client[(h[1] >> 4) & 1];
    lnorm_result res;
    memset(&res, 0, sizeof res);
    switch (h[0] % 5) {
    case 0:
        do_normalize(c, h);
        break;
    case 1: {
        int serving = -1;
        (void)lnorm_health(c, &serving, &res);
        break;
    }
    case 2: {
        lnorm_server_info *info = xbuf(sizeof *info);
        (void)lnorm_info(c, info, &res);
        free(info);
        break;
    }
    case 3: {
        lnorm_params_desc p;
        memset(&p, 0, sizeof p);
        float g[8] = {1, 1, 1, 1, 1, 1, 1, 1};
        p.id = "fuzz.params";
        p.dtype = LNORM_DTYPE_F32;
        p.hidden = 8;
        p.gamma = g;
        (void)lnorm_register_params(c, &p, &res);
        break;
    }
    default:
        (void)lnorm_drop_params(c, "fuzz.params", &res);
        break;
    }
    return 0;
}
