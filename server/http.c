/* The observability endpoints on NNG's HTTP server (no HTTP parsing here). */
#include <arpa/inet.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <nng/nng.h>
#include <nng/supplemental/http/http.h>

#include "http.h"
#include "lnorm/errors.h"
#include "log.h"

/* Shared by the three handlers and the owner: NNG frees a handler (and
 * calls its data destructor) only once no request uses it, which may be
 * after lnorm__http_stop returns, so the last of them frees this. */
struct lnorm__http {
    nng_http_server *srv;
    lnorm__http_hooks hooks;
    atomic_int refs;
};

static void lnorm__http_unref(void *arg)
{
    lnorm__http *h = arg;
    if (atomic_fetch_sub(&h->refs, 1) == 1)
        free(h);
}

static void lnorm__http_reply(nng_aio *aio, uint16_t status, const char *ctype, const void *body, size_t len)
{
    nng_http_res *res;
    int rv = nng_http_res_alloc(&res);
    if (rv != 0) {
        nng_aio_finish(aio, rv);
        return;
    }
    if ((rv = nng_http_res_set_status(res, status)) != 0 ||
        (rv = nng_http_res_set_header(res, "Content-Type", ctype)) != 0 ||
        (rv = nng_http_res_copy_data(res, body, len)) != 0) {
        nng_http_res_free(res);
        nng_aio_finish(aio, rv);
        return;
    }
    nng_aio_set_output(aio, 0, res);
    nng_aio_finish(aio, 0);
}

static lnorm__http *lnorm__http_of(nng_aio *aio)
{
    return nng_http_handler_get_data(nng_aio_get_input(aio, 1));
}

static void lnorm__on_metrics(nng_aio *aio)
{
    lnorm__http *h = lnorm__http_of(aio);
    char *body;
    size_t len;
    if (h->hooks.metrics(h->hooks.arg, &body, &len) != 0) {
        lnorm__http_reply(aio, 500, "text/plain", "out of memory\n", 14);
        return;
    }
    lnorm__http_reply(aio, 200, "text/plain; version=0.0.4; charset=utf-8", body, len);
    free(body);
}

static void lnorm__on_healthz(nng_aio *aio)
{
    lnorm__http_reply(aio, 200, "text/plain", "ok\n", 3);
}

static void lnorm__on_readyz(nng_aio *aio)
{
    lnorm__http *h = lnorm__http_of(aio);
    if (h->hooks.ready(h->hooks.arg))
        lnorm__http_reply(aio, 200, "text/plain", "ready\n", 6);
    else
        lnorm__http_reply(aio, 503, "text/plain", "not ready\n", 10);
}

int lnorm__http_start(lnorm__http **out, const char *hostport, const lnorm__http_hooks *hooks, char *bound,
                      size_t boundlen, char *err, size_t errlen)
{
    char url[1100];
    nng_url *u = NULL;
    snprintf(url, sizeof url, "http://%s", hostport);
    const char *colon = strrchr(hostport, ':');
    if (!colon || colon == hostport || !colon[1] || nng_url_parse(&u, url) != 0) {
        snprintf(err, errlen, "http %s: expected HOST:PORT", hostport);
        return LNORM_EINVAL;
    }
    lnorm__http *h = calloc(1, sizeof *h);
    if (!h) {
        nng_url_free(u);
        return LNORM_ENOMEM;
    }
    h->hooks = *hooks;
    atomic_init(&h->refs, 1); /* the owner's */
    int rv = nng_http_server_hold(&h->srv, u);
    nng_url_free(u);
    if (rv != 0) {
        snprintf(err, errlen, "http %s: %s", hostport, nng_strerror(rv));
        lnorm__http_unref(h);
        return LNORM_ETRANSPORT;
    }
    static const struct {
        const char *path;
        void (*cb)(nng_aio *);
    } routes[] = {{"/metrics", lnorm__on_metrics}, {"/healthz", lnorm__on_healthz}, {"/readyz", lnorm__on_readyz}};
    for (size_t i = 0; i < sizeof routes / sizeof routes[0]; i++) {
        nng_http_handler *hd;
        if ((rv = nng_http_handler_alloc(&hd, routes[i].path, routes[i].cb)) != 0)
            break;
        if ((rv = nng_http_handler_set_method(hd, "GET")) != 0) {
            nng_http_handler_free(hd);
            break;
        }
        atomic_fetch_add(&h->refs, 1); /* the handler's, dropped by its destructor */
        if ((rv = nng_http_handler_set_data(hd, h, lnorm__http_unref)) != 0) {
            atomic_fetch_sub(&h->refs, 1);
            nng_http_handler_free(hd);
            break;
        }
        if ((rv = nng_http_server_add_handler(h->srv, hd)) != 0) {
            nng_http_handler_free(hd); /* (runs the destructor) */
            break;
        }
    }
    if (rv == 0)
        rv = nng_http_server_start(h->srv);
    if (rv != 0) {
        snprintf(err, errlen, "http %s: %s", hostport, nng_strerror(rv));
        nng_http_server_release(h->srv);
        lnorm__http_unref(h);
        return LNORM_ETRANSPORT;
    }
    nng_sockaddr sa;
    char host[64] = "?";
    int port = 0;
    if (nng_http_server_get_addr(h->srv, &sa) == 0) {
        if (sa.s_family == NNG_AF_INET) {
            inet_ntop(AF_INET, &sa.s_in.sa_addr, host, sizeof host);
            port = ntohs(sa.s_in.sa_port);
        } else if (sa.s_family == NNG_AF_INET6) {
            char h6[48];
            inet_ntop(AF_INET6, sa.s_in6.sa_addr, h6, sizeof h6);
            snprintf(host, sizeof host, "[%s]", h6);
            port = ntohs(sa.s_in6.sa_port);
        }
    }
    snprintf(bound, boundlen, "%s:%d", host, port);
    LOG_INFO("http on %s (/metrics /healthz /readyz)", bound);
    *out = h;
    return LNORM_OK;
}

void lnorm__http_stop(lnorm__http *h)
{
    if (!h)
        return;
    nng_http_server_stop(h->srv);
    nng_http_server_release(h->srv);
    lnorm__http_unref(h); /* freed now, or by the last handler NNG frees */
}
