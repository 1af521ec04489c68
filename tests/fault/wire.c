/* Wire helpers for fault tests (see wire.h). */
#include "wire.h"

#include <arpa/inet.h>
#include <errno.h>
#include <math.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <nng/protocol/reqrep0/req.h>

uint8_t *fw_pack(const Lnorm__V1__Request *req, size_t *len)
{
    size_t n = lnorm__v1__request__get_packed_size(req);
    uint8_t *buf = malloc(n ? n : 1);
    if (!buf)
        return NULL;
    *len = lnorm__v1__request__pack(req, buf);
    return buf;
}

uint8_t *fw_pack_body(uint64_t id, Lnorm__V1__Request__BodyCase body, void *msg, size_t *len)
{
    Lnorm__V1__Request req = LNORM__V1__REQUEST__INIT;
    req.request_id = id;
    req.body_case = body;
    switch (body) {
    case LNORM__V1__REQUEST__BODY_NORMALIZE: req.normalize = msg; break;
    case LNORM__V1__REQUEST__BODY_REGISTER_PARAMS: req.register_params = msg; break;
    case LNORM__V1__REQUEST__BODY_DROP_PARAMS: req.drop_params = msg; break;
    case LNORM__V1__REQUEST__BODY_HEALTH: req.health = msg; break;
    case LNORM__V1__REQUEST__BODY_INFO: req.info = msg; break;
    default: break;
    }
    return fw_pack(&req, len);
}

static float det_value(uint32_t seed, uint64_t i)
{
    uint64_t z = (uint64_t)seed * 0x9E3779B97F4A7C15ull + i * 0xBF58476D1CE4E5B9ull;
    z ^= z >> 31;
    z *= 0x94D049BB133111EBull;
    z ^= z >> 29;
    return (float)((double)(z >> 11) / 9007199254740992.0 * 4.0 - 2.0);
}

uint8_t *fw_pack_norm(uint64_t id, int op, uint64_t rows, uint64_t hidden, uint32_t seed,
                      float **x_out, size_t *len)
{
    size_t n = (size_t)(rows * hidden);
    float *x = malloc(n * sizeof *x);
    if (!x)
        return NULL;
    for (size_t i = 0; i < n; i++)
        x[i] = det_value(seed, i);
    Lnorm__V1__NormalizeRequest nr = LNORM__V1__NORMALIZE_REQUEST__INIT;
    nr.op = op;
    nr.x_dtype = LNORM__V1__DTYPE__DTYPE_F32;
    nr.rows = rows;
    nr.hidden = hidden;
    nr.x.data = (uint8_t *)x;
    nr.x.len = n * sizeof *x;
    uint8_t *buf = fw_pack_body(id, LNORM__V1__REQUEST__BODY_NORMALIZE, &nr, len);
    if (x_out)
        *x_out = x;
    else
        free(x);
    return buf;
}

uint8_t *fw_pack_health(uint64_t id, size_t *len)
{
    Lnorm__V1__HealthRequest h = LNORM__V1__HEALTH_REQUEST__INIT;
    return fw_pack_body(id, LNORM__V1__REQUEST__BODY_HEALTH, &h, len);
}

Lnorm__V1__Response *fw_unpack(const uint8_t *buf, size_t len)
{
    return lnorm__v1__response__unpack(NULL, len, buf);
}

int fw_check_norm(const Lnorm__V1__Response *r, int op, uint64_t rows, uint64_t hidden,
                  const float *x, char *why, size_t whylen)
{
    if (!r->status || r->status->code != LNORM__V1__CODE__OK) {
        snprintf(why, whylen, "status %d: %s", r->status ? (int)r->status->code : -1,
                 r->status && r->status->message ? r->status->message : "(none)");
        return -1;
    }
    if (r->body_case != LNORM__V1__RESPONSE__BODY_NORMALIZE || !r->normalize) {
        snprintf(why, whylen, "OK without a normalize body (body %d)", (int)r->body_case);
        return -1;
    }
    if (r->normalize->y.len != rows * hidden * 4) {
        snprintf(why, whylen, "y is %zu bytes, expected %llu", r->normalize->y.len,
                 (unsigned long long)(rows * hidden * 4));
        return -1;
    }
    const uint8_t *y = r->normalize->y.data;
    for (uint64_t i = 0; i < rows; i++) {
        const float *row = x + i * hidden;
        double mean = 0, var = 0;
        if (op == LNORM__V1__OP__OP_LAYER_NORM) {
            for (uint64_t c = 0; c < hidden; c++)
                mean += row[c];
            mean /= (double)hidden;
        }
        for (uint64_t c = 0; c < hidden; c++)
            var += ((double)row[c] - mean) * ((double)row[c] - mean);
        double rstd = 1.0 / sqrt(var / (double)hidden + 1e-5);
        for (uint64_t c = 0; c < hidden; c++) {
            float got;
            memcpy(&got, y + 4 * (i * hidden + c), 4);
            double want = ((double)row[c] - mean) * rstd;
            if (!(fabs(got - want) <= 1e-4 * (1.0 + fabs(want)))) {
                snprintf(why, whylen, "y[%llu][%llu] = %.7g, reference %.7g",
                         (unsigned long long)i, (unsigned long long)c, got, want);
                return -1;
            }
        }
    }
    return 0;
}

int fw_req_open(nng_socket *s, const char *url, int recv_timeout_ms, int reconnect_ms)
{
    int rv = nng_req0_open(s);
    if (rv)
        return rv;
    nng_socket_set_ms(*s, NNG_OPT_RECVTIMEO, recv_timeout_ms);
    nng_socket_set_ms(*s, NNG_OPT_SENDTIMEO, recv_timeout_ms);
    nng_socket_set_ms(*s, NNG_OPT_RECONNMINT, reconnect_ms);
    nng_socket_set_ms(*s, NNG_OPT_RECONNMAXT, reconnect_ms);
    nng_socket_set_size(*s, NNG_OPT_RECVMAXSZ, 0);
    rv = nng_dial(*s, url, NULL, NNG_FLAG_NONBLOCK);
    if (rv)
        nng_close(*s);
    return rv;
}

int fw_req_call(nng_socket s, const uint8_t *buf, size_t len, Lnorm__V1__Response **out)
{
    *out = NULL;
    int rv = nng_send(s, (void *)buf, len, 0);
    if (rv)
        return rv;
    void *rbuf = NULL;
    size_t rlen = 0;
    rv = nng_recv(s, &rbuf, &rlen, NNG_FLAG_ALLOC);
    if (rv)
        return rv;
    *out = fw_unpack(rbuf, rlen);
    nng_free(rbuf, rlen);
    return *out ? 0 : -1;
}

int fw_tcp_connect(const char *url)
{
    const char *pre = "tcp://127.0.0.1:";
    if (strncmp(url, pre, strlen(pre)) != 0) {
        fprintf(stderr, "wire: refusing non-loopback url %s\n", url);
        return -1;
    }
    int port = atoi(url + strlen(pre));
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    struct sockaddr_in sa;
    memset(&sa, 0, sizeof sa);
    sa.sin_family = AF_INET;
    sa.sin_port = htons((uint16_t)port);
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
        close(fd);
        return -1;
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return fd;
}

/* Send (out) or receive exactly len bytes: 0; 1 when a read waited
 * timeout_ms for data; -1 when the connection closed or broke (a send
 * blocks, within the socket's SO_SNDTIMEO). */
static int transfer(int fd, uint8_t *p, size_t len, int out, int timeout_ms)
{
    while (len) {
        if (!out) {
            struct pollfd pfd = {fd, POLLIN, 0};
            int r = poll(&pfd, 1, timeout_ms);
            if (r < 0 && errno == EINTR)
                continue;
            if (r <= 0)
                return r == 0 ? 1 : -1;
        }
        ssize_t n = out ? send(fd, p, len, MSG_NOSIGNAL) : recv(fd, p, len, 0);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return -1;
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

int fw_write_all(int fd, const void *buf, size_t len)
{
    return transfer(fd, (uint8_t *)buf, len, 1, -1) ? -1 : 0;
}

static int read_full(int fd, uint8_t *p, size_t len, int timeout_ms)
{
    return transfer(fd, p, len, 0, timeout_ms);
}

int fw_sp_handshake(int fd, int timeout_ms)
{
    /* 0x00 'S' 'P' version 0, protocol 48 (req0) big-endian, reserved. */
    static const uint8_t hello[8] = {0, 'S', 'P', 0, 0, 0x30, 0, 0};
    uint8_t peer[8];
    if (fw_write_all(fd, hello, sizeof hello) != 0)
        return -1;
    if (read_full(fd, peer, sizeof peer, timeout_ms) != 0)
        return -1;
    if (peer[0] != 0 || peer[1] != 'S' || peer[2] != 'P' || peer[3] != 0 || peer[4] != 0 ||
        peer[5] != 0x31)
        return -1;
    return 0;
}

static void be64(uint8_t *p, uint64_t v)
{
    for (int i = 7; i >= 0; i--, v >>= 8)
        p[i] = (uint8_t)v;
}

int fw_sp_send(int fd, uint32_t reqid, const uint8_t *body, size_t len)
{
    uint8_t hdr[12];
    be64(hdr, (uint64_t)len + 4);
    uint32_t id = reqid | 0x80000000u;
    hdr[8] = (uint8_t)(id >> 24);
    hdr[9] = (uint8_t)(id >> 16);
    hdr[10] = (uint8_t)(id >> 8);
    hdr[11] = (uint8_t)id;
    if (fw_write_all(fd, hdr, sizeof hdr) != 0)
        return -1;
    return len ? fw_write_all(fd, body, len) : 0;
}

int fw_sp_recv(int fd, uint32_t *reqid, uint8_t **body, size_t *len, int timeout_ms)
{
    uint8_t hdr[12];
    *body = NULL;
    *len = 0;
    int r = read_full(fd, hdr, 8, timeout_ms);
    if (r)
        return r;
    uint64_t n = 0;
    for (int i = 0; i < 8; i++)
        n = (n << 8) | hdr[i];
    if (n < 4 || n > (1ull << 31))
        return -1;
    r = read_full(fd, hdr + 8, 4, timeout_ms);
    if (r)
        return r < 0 ? -1 : r;
    *reqid = ((uint32_t)hdr[8] << 24 | (uint32_t)hdr[9] << 16 | (uint32_t)hdr[10] << 8 | hdr[11]) &
             0x7FFFFFFFu;
    *len = (size_t)n - 4;
    *body = malloc(*len ? *len : 1);
    if (!*body)
        return -1;
    r = read_full(fd, *body, *len, timeout_ms);
    if (r) {
        free(*body);
        *body = NULL;
        return r < 0 ? -1 : r;
    }
    return 0;
}
