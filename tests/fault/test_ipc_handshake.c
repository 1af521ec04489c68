/*
 * fault.ipc_handshake: local peers that connect to lnormd's ipc socket and
 * close before or during the SP handshake (which stops NNG 1.5.2's ipc
 * listener for good, see server/transport.c). After each round of them, a
 * new ipc client is served within 3 s, a tcp client that stayed connected
 * throughout is served, and /metrics counts the listener taken up again.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <nng/nng.h>

#include "check.h"
#include "testdaemon.h"
#include "wire.h"

#define ROWS 4
#define HIDDEN 256

/* Connect to the ipc socket of url and close: at once (nbytes 0), or after
 * writing nbytes of a REQ peer's SP header. */
static void touch(const char *url, int nbytes)
{
    struct sockaddr_un a;
    memset(&a, 0, sizeof a);
    a.sun_family = AF_UNIX;
    snprintf(a.sun_path, sizeof a.sun_path, "%s", url + strlen("ipc://"));
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    if (fd < 0)
        return;
    if (connect(fd, (struct sockaddr *)&a, sizeof a) == 0 && nbytes > 0) {
        static const unsigned char hdr[8] = {0, 'S', 'P', 0, 0, 0x30, 0, 0};
        ssize_t w = write(fd, hdr, (size_t)nbytes);
        (void)w;
    }
    close(fd);
}

/* One normalize on s, checked against the reference. 0 when right. */
static int call(nng_socket s, uint64_t id, const char *what)
{
    float *x = NULL;
    size_t len;
    uint8_t *buf = fw_pack_norm(id, LNORM__V1__OP__OP_LAYER_NORM, ROWS, HIDDEN, (uint32_t)id, &x, &len);
    Lnorm__V1__Response *r = NULL;
    int rv = fw_req_call(s, buf, len, &r);
    char why[256] = "";
    int bad = rv != 0 || fw_check_norm(r, LNORM__V1__OP__OP_LAYER_NORM, ROWS, HIDDEN, x, why, sizeof why) != 0;
    if (bad)
        printf("%s: %s %s\n", what, rv ? nng_strerror(rv) : "wrong reply:", why);
    if (r)
        lnorm__v1__response__free_unpacked(r, NULL);
    free(buf);
    free(x);
    return bad ? -1 : 0;
}

/* A new ipc client, served within 3 s (its dialer retries). */
static int new_ipc_client(const char *url, uint64_t id)
{
    int64_t end = td_now_ms() + 3000;
    while (td_now_ms() < end) {
        nng_socket s;
        if (fw_req_open(&s, url, 1000, 50) != 0)
            return -1;
        int ok = call(s, id, "new ipc client") == 0;
        nng_close(s);
        if (ok)
            return 0;
    }
    return -1;
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: %s LNORMD\n", argv[0]);
        return 2;
    }
    const char *args[] = {"--backend", "cpu", "--cpu-threads", "1", NULL};
    td_daemon d;
    if (td_start(&d, argv[1], NULL, args, TD_ENDPOINTS) != 0)
        return 1;
    nng_socket tcp;
    CHECK(fw_req_open(&tcp, d.tcp_url, 3000, 50) == 0, "tcp client open");
    CHECK(call(tcp, 1, "tcp client before") == 0, "tcp client served before");
    CHECK(new_ipc_client(d.ipc_url, 2) == 0, "ipc client served before");
    for (int round = 0; round < 3; round++) {
        /* closed at once, and after 3 and 8 bytes of the SP header */
        touch(d.ipc_url, 0);
        touch(d.ipc_url, 3);
        touch(d.ipc_url, 8);
        td_sleep_ms(100);
        CHECK(new_ipc_client(d.ipc_url, 10 + (uint64_t)round) == 0,
              "round %d: a new ipc client is served within 3 s after peers closed in the handshake", round + 1);
        CHECK(call(tcp, 20 + (uint64_t)round, "tcp client") == 0, "round %d: the tcp client is served", round + 1);
    }
    long n = (long)td_metric(&d, "lnormd_ipc_relistens_total");
    printf("lnormd_ipc_relistens_total %ld\n", n);
    CHECK(n >= 1, "the ipc listener was listened on again (lnormd_ipc_relistens_total %ld)", n);
    nng_close(tcp);
    td_stop_check(&d, "on SIGTERM");
    return check_finish("fault.ipc_handshake");
}
