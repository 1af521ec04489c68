/* The echo server: see echo.h. */
#include "echo.h"

#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <nng/nng.h>
#include <nng/protocol/reqrep0/rep.h>

typedef struct echo_ctx {
    nng_ctx ctx;
    nng_aio *aio;
    int sending;
} echo_ctx;

static void echo_cb(void *arg)
{
    echo_ctx *e = arg;
    int rv = nng_aio_result(e->aio);
    if (e->sending) {
        if (rv != 0)
            nng_msg_free(nng_aio_get_msg(e->aio));
        e->sending = 0;
        if (rv == NNG_ECLOSED)
            return;
        nng_ctx_recv(e->ctx, e->aio);
        return;
    }
    if (rv != 0) {
        if (rv != NNG_ECLOSED && rv != NNG_ECANCELED)
            nng_ctx_recv(e->ctx, e->aio);
        return;
    }
    /* the received message goes straight back */
    e->sending = 1;
    nng_ctx_send(e->ctx, e->aio);
}

static int write_ready(const char *path, const char *url)
{
    char tmp[600];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (!f)
        return -1;
    fprintf(f, "listen %s\n", url);
    if (fclose(f) != 0)
        return -1;
    return rename(tmp, path);
}

int lnorm__echo_serve(const char *url, int ncontexts, const char *ready_file, int max_seconds)
{
    nng_socket s;
    nng_listener l;
    int rv;
    if ((rv = nng_rep0_open(&s)) != 0) {
        fprintf(stderr, "echo: nng_rep0_open: %s\n", nng_strerror(rv));
        return 1;
    }
    nng_socket_set_size(s, NNG_OPT_RECVMAXSZ, 0);
    if ((rv = nng_listen(s, url, &l, 0)) != 0) {
        fprintf(stderr, "echo: listen %s: %s\n", url, nng_strerror(rv));
        nng_close(s);
        return 1;
    }
    char real[512];
    snprintf(real, sizeof real, "%s", url);
    int port = 0;
    if (!strncmp(url, "tcp://", 6) && nng_listener_get_int(l, NNG_OPT_TCP_BOUND_PORT, &port) == 0) {
        const char *colon = strrchr(url, ':');
        snprintf(real, sizeof real, "%.*s:%d", (int)(colon - url), url, port);
    }
    echo_ctx *ec = calloc((size_t)ncontexts, sizeof(*ec));
    if (!ec) {
        nng_close(s);
        return 1;
    }
    int n = 0;
    for (; n < ncontexts; n++) {
        if (nng_ctx_open(&ec[n].ctx, s) != 0 || nng_aio_alloc(&ec[n].aio, echo_cb, &ec[n]) != 0)
            break;
        nng_ctx_recv(ec[n].ctx, ec[n].aio);
    }
    int status = 0;
    if (n < ncontexts) {
        fprintf(stderr, "echo: could not open %d contexts\n", ncontexts);
        status = 1;
    } else if (ready_file && write_ready(ready_file, real) != 0) {
        fprintf(stderr, "echo: cannot write %s\n", ready_file);
        status = 1;
    }
    if (status == 0) {
        sigset_t set;
        sigemptyset(&set);
        sigaddset(&set, SIGTERM);
        sigaddset(&set, SIGINT);
        pthread_sigmask(SIG_BLOCK, &set, NULL);
        struct timespec to = {max_seconds, 0};
        sigtimedwait(&set, NULL, &to); /* a signal, or the safety lifetime */
    }
    nng_close(s);
    for (int i = 0; i < n; i++) {
        nng_aio_stop(ec[i].aio);
        nng_aio_free(ec[i].aio);
    }
    free(ec);
    return status;
}
