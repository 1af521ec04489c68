/* /metrics, /healthz and /readyz over HTTP, served by NNG's HTTP server. */
#ifndef LNORM_SERVER_HTTP_H
#define LNORM_SERVER_HTTP_H

#include <stddef.h>

typedef struct lnorm__http lnorm__http;

typedef struct lnorm__http_hooks {
    /* /metrics body (malloc'ed) or -1. */
    int (*metrics)(void *arg, char **out, size_t *len);
    /* 1 when ready to take requests (/readyz). */
    int (*ready)(void *arg);
    void *arg;
} lnorm__http_hooks;

/* Serve on "HOST:PORT" (port 0: a free one). The bound "host:port" is
 * written to bound. LNORM_EINVAL for a bad address, LNORM_ETRANSPORT. */
int lnorm__http_start(lnorm__http **out, const char *hostport, const lnorm__http_hooks *hooks,
                      char *bound, size_t boundlen, char *err, size_t errlen);
void lnorm__http_stop(lnorm__http *h);

#endif
