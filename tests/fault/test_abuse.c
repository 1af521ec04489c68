/*
 * fault.disconnect, fault.half_frame, fault.no_read: misbehaving clients.
 *
 *   fault_abuse LNORMD MODE      MODE = disconnect | half_frame | no_read | http
 *
 * lnormd listens on tcp://127.0.0.1:0 and on an ipc path in a private temp
 * dir. Two well-behaved clients load it over ipc the whole time and check
 * every reply. The misbehaving clients, over tcp, in each round:
 *  - disconnect: 20 NNG REQ sockets (in a helper process) and 40 raw
 *    SP/TCP peers send a 1 MiB request and hang up at once (NNG close
 *    after the send; FIN after the whole frame, RST after the whole frame,
 *    RST after half the body), so replies have nowhere to go;
 *  - half_frame: connect and close; half an SP header; a bad SP header; a
 *    frame header with part of its body, then close; a frame claiming 2^40
 *    bytes; and 32 connections left open holding half a frame;
 *  - no_read: 4 connections each pipeline up to 48 requests of 1 MiB and
 *    never read a reply, held open for 3 s;
 *  - http (the /metrics port): garbage, a 256 KiB header line, and 64
 *    connections holding half a request while /healthz must answer 200
 *    (and /metrics 200 at the end).
 * (five rounds) Checks: the good clients get every reply right and keep
 * making progress during each round; the lower of lnormd's RSS after the
 * last two rounds is at most max(16 MiB, 15%) above the highest RSS of the
 * rounds before them (a leak per abandoned request would add ~40 MiB a
 * round; one high round alone is allocator noise) and never above
 * 512 MiB (in ASan builds LeakSanitizer at lnormd's exit replaces these
 * RSS checks); lnormd is
 * alive after, and exits 0 on SIGTERM.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include <nng/nng.h>
#include <nng/protocol/reqrep0/req.h>

#include "check.h"
#include "testdaemon.h"
#include "loadgen.h"
#include "wire.h"

#define BIG_ROWS 256
#define BIG_HIDDEN 1024 /* 1 MiB of f32 */

static const char *g_tcp;

static void set_timeouts(int fd, int ms)
{
    struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
}

/* 1 when the server closes fd within ms (reads and discards until EOF). */
static int closed_by_server(int fd, int ms)
{
    int64_t end = td_now_ms() + ms;
    char buf[4096];
    set_timeouts(fd, 200);
    while (td_now_ms() < end) {
        ssize_t n = recv(fd, buf, sizeof buf, 0);
        if (n == 0)
            return 1;
        if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
            return 1; /* reset */
    }
    return 0;
}

/* Close fd with a TCP reset instead of a FIN. */
static void close_rst(int fd)
{
    struct linger lg = {1, 0};
    setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
    close(fd);
}

/* The helper process (mode "nng-peer"): n NNG REQ sockets, each dialed,
 * sent the 1 MiB request and closed at once. */
static int nng_peer_main(const char *url, int n)
{
    size_t len;
    uint8_t *big = fw_pack_norm(1, LNORM__V1__OP__OP_LAYER_NORM, BIG_ROWS, BIG_HIDDEN, 3, NULL, &len);
    for (int i = 0; i < n; i++) {
        nng_socket s;
        if (nng_req0_open(&s) != 0)
            continue;
        nng_socket_set_ms(s, NNG_OPT_SENDTIMEO, 2000);
        if (nng_dial(s, url, NULL, 0) == 0)
            nng_send(s, big, len, 0);
        nng_close(s);
    }
    free(big);
    return 0;
}

/* Run nng_peer_main in a fresh process, bounded to 30 s: NNG 1.5.2's
 * nng_close occasionally hangs on the client side in this pattern, and
 * that must not hang the test (it is no fault of lnormd's). */
static void run_nng_peers(int n)
{
    char count[16];
    snprintf(count, sizeof count, "%d", n);
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        execl("/proc/self/exe", "fault_abuse", "-", "nng-peer", g_tcp, count, (char *)NULL);
        _exit(127);
    }
    if (pid < 0)
        return;
    int64_t end = td_now_ms() + 30000;
    int st;
    while (waitpid(pid, &st, WNOHANG) == 0) {
        if (td_now_ms() > end) {
            printf("disconnect: NNG peer helper stuck (nng_close in the client); killed\n");
            kill(pid, SIGKILL);
            waitpid(pid, &st, 0);
            return;
        }
        td_sleep_ms(20);
    }
}

/* NNG REQ sockets closed right after sending (in a helper process, 20),
 * and raw SP/TCP REQ peers: the whole 1 MiB request then close (20), the
 * whole request then a reset (10), half the body then a reset (10). */
static void round_disconnect(const uint8_t *big, size_t biglen)
{
    run_nng_peers(20);
    for (int i = 0; i < 40; i++) {
        int fd = fw_tcp_connect(g_tcp);
        CHECK(fd >= 0, "connect %s", g_tcp);
        if (fd < 0)
            continue;
        set_timeouts(fd, 2000);
        if (fw_sp_handshake(fd, 2000) == 0) {
            if (i < 30) {
                fw_sp_send(fd, 7000u + (uint32_t)i, big, biglen);
            } else {
                uint8_t hdr[12] = {0};
                uint64_t n = (uint64_t)biglen + 4;
                for (int b = 7; b >= 0; b--, n >>= 8)
                    hdr[b] = (uint8_t)n;
                hdr[8] = 0x80;
                hdr[11] = (uint8_t)i;
                fw_write_all(fd, hdr, sizeof hdr);
                fw_write_all(fd, big, biglen / 2);
            }
        }
        if (i < 20)
            close(fd);
        else
            close_rst(fd);
    }
}

static void round_half_frame(void)
{
    static const uint8_t hello[8] = {0, 'S', 'P', 0, 0, 0x30, 0, 0};
    for (int i = 0; i < 10; i++) {
        /* connect, close */
        int fd = fw_tcp_connect(g_tcp);
        if (fd >= 0)
            close(fd);
        /* half an SP header */
        fd = fw_tcp_connect(g_tcp);
        if (fd >= 0) {
            fw_write_all(fd, hello, 3);
            close(fd);
        }
        /* a frame header and part of the body */
        fd = fw_tcp_connect(g_tcp);
        if (fd >= 0) {
            set_timeouts(fd, 2000);
            if (fw_sp_handshake(fd, 2000) == 0) {
                uint8_t part[12 + 1000];
                memset(part, 0x5a, sizeof part);
                uint64_t n = 100000;
                for (int b = 7; b >= 0; b--, n >>= 8)
                    part[b] = (uint8_t)n;
                part[8] = 0x80;
                fw_write_all(fd, part, i % 2 ? 8 : sizeof part);
            }
            close(fd);
        }
    }
    /* A bad SP header, and a frame claiming 2^40 bytes: the server must hang up. */
    for (int i = 0; i < 3; i++) {
        int fd = fw_tcp_connect(g_tcp);
        if (fd >= 0) {
            static const uint8_t junk[8] = {'G', 'E', 'T', ' ', '/', ' ', 'H', 'T'};
            fw_write_all(fd, junk, sizeof junk);
            CHECK(closed_by_server(fd, 5000), "server kept a connection with a bad SP header");
            close(fd);
        }
        fd = fw_tcp_connect(g_tcp);
        if (fd >= 0) {
            set_timeouts(fd, 2000);
            if (fw_sp_handshake(fd, 2000) == 0) {
                uint8_t hdr[8] = {0, 0, 1, 0, 0, 0, 0, 0}; /* 2^40 */
                fw_write_all(fd, hdr, sizeof hdr);
                CHECK(closed_by_server(fd, 5000),
                      "server kept a connection announcing a 2^40-byte message");
            }
            close(fd);
        }
    }
}

/* Connections held open with half a frame while the good clients work. */
static int hold_half_frames(int *fds, int n)
{
    int k = 0;
    for (int i = 0; i < n; i++) {
        int fd = fw_tcp_connect(g_tcp);
        if (fd < 0)
            continue;
        set_timeouts(fd, 2000);
        if (fw_sp_handshake(fd, 2000) == 0) {
            uint8_t part[8 + 4 + 100] = {0, 0, 0, 0, 0, 0, 0x10, 0, 0x80, 0, 0, 1};
            fw_write_all(fd, part, sizeof part);
        }
        fds[k++] = fd;
    }
    return k;
}

/* 4 connections pipelining requests they never read. */
static int hold_no_read(int *fds, const uint8_t *big, size_t biglen)
{
    int k = 0, sent = 0;
    for (int c = 0; c < 4; c++) {
        int fd = fw_tcp_connect(g_tcp);
        if (fd < 0)
            continue;
        fds[k++] = fd;
        set_timeouts(fd, 1000);
        if (fw_sp_handshake(fd, 2000) != 0)
            continue;
        for (int i = 0; i < 48; i++) {
            if (fw_sp_send(fd, 100u * (uint32_t)c + (uint32_t)i, big, biglen) != 0)
                break; /* send buffer full: the server stopped reading us */
            sent++;
        }
    }
    printf("no_read: %d requests pipelined on %d connections that never read\n", sent, k);
    return k;
}

static char g_http_url[600];      /* tcp://127.0.0.1:PORT of the HTTP endpoint */
static const td_daemon *g_daemon; /* the lnormd under test */

/* GET path on the HTTP endpoint; the status code, or -1. */
static int http_get(const char *path)
{
    int code;
    free(td_http_get(g_daemon, path, &code));
    return code ? code : -1;
}

/* Garbage, an endless header line and half-sent requests on the HTTP port,
 * with 64 connections left holding half a request. */
static int round_http(int *fds, int n)
{
    for (int i = 0; i < 10; i++) {
        int fd = fw_tcp_connect(g_http_url);
        if (fd < 0)
            continue;
        static const char junk[] = "\x16\x03\x01 NOT HTTP \xff\xfe\r\n\r\n";
        fw_write_all(fd, junk, sizeof junk - 1);
        closed_by_server(fd, 2000);
        close(fd);
    }
    static char line[256 * 1024];
    memset(line, 'A', sizeof line);
    memcpy(line, "GET /", 5);
    for (int i = 0; i < 3; i++) {
        int fd = fw_tcp_connect(g_http_url);
        if (fd < 0)
            continue;
        set_timeouts(fd, 2000);
        fw_write_all(fd, line, sizeof line); /* may stop early: the server hung up */
        closed_by_server(fd, 2000);
        close(fd);
    }
    int k = 0;
    for (int i = 0; i < n; i++) {
        int fd = fw_tcp_connect(g_http_url);
        if (fd < 0)
            continue;
        static const char half[] = "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ";
        fw_write_all(fd, half, sizeof half - 1);
        fds[k++] = fd;
    }
    int code = http_get("/healthz");
    printf("http: /healthz while %d connections hold half a request: %d\n", k, code);
    CHECK(code == 200, "/healthz answered %d while the HTTP port was abused", code);
    return k;
}

static int progress_during(fl_load *l, long before, const char *what)
{
    fl_stats st;
    fl_peek(l, &st);
    CHECK(st.ok > before, "good clients made no progress during %s (ok stayed %ld)", what,
          before);
    return (int)(st.ok - before);
}

int main(int argc, char **argv)
{
    if (argc != 3 && !(argc == 5 && !strcmp(argv[2], "nng-peer"))) {
        fprintf(stderr, "usage: %s LNORMD disconnect|half_frame|no_read|http\n", argv[0]);
        return 2;
    }
    signal(SIGPIPE, SIG_IGN);
    if (argc == 5 && !strcmp(argv[2], "nng-peer"))
        return nng_peer_main(argv[3], atoi(argv[4]));
    const char *mode = argv[2];
    /* lnormd's RSS is judged after every round (a leak adds every round).
     * With glibc's dynamic mmap threshold, the 1 MiB request and reply
     * buffers move into the malloc arenas after the first ones are freed,
     * and RSS then follows each arena's high-water mark, not the memory in
     * use: a round that happens to peak in another arena steps RSS up by
     * some 80 MiB for good (fault.no_read: 77 MiB in rounds 1-3, 158 and
     * 170 MiB in rounds 4-5). A fixed threshold keeps blocks
     * of 64 KiB and more in their own mappings, returned at free, so RSS
     * tracks what lnormd holds. (The daemon inherits it; the ASan build
     * ignores it and judges leaks at exit instead.) */
    setenv("MALLOC_MMAP_THRESHOLD_", "65536", 1);
    const char *args[] = {"--backend", "cpu", "--cpu-threads", "1", NULL};
    td_daemon d;
    if (td_start(&d, argv[1], NULL, args, TD_ENDPOINTS) != 0)
        return 1;
    g_tcp = d.tcp_url;
    snprintf(g_http_url, sizeof g_http_url, "tcp://%s", d.http);
    g_daemon = &d;
    const char *ipc_url = d.ipc_url;

    size_t biglen = 0;
    uint8_t *big = fw_pack_norm(1, LNORM__V1__OP__OP_LAYER_NORM, BIG_ROWS, BIG_HIDDEN, 3, NULL,
                                &biglen);
    fl_load *load = fl_start(ipc_url, 2, 16, 256, 10000);
    td_sleep_ms(1000);
    /* FAULT_ROUNDS (3..64, default 5) for longer investigations. */
    int rounds = getenv("FAULT_ROUNDS") ? atoi(getenv("FAULT_ROUNDS")) : 5;
    if (rounds < 3 || rounds > 64)
        rounds = 5;
    long rss0 = td_rss_kb(&d), rss[64] = {0};

    for (int round = 0; round < rounds; round++) {
        fl_stats st;
        fl_peek(load, &st);
        long before = st.ok;
        int fds[64], nfds = 0;
        printf("%s round %d: start\n", mode, round + 1);
        if (!strcmp(mode, "disconnect")) {
            round_disconnect(big, biglen);
        } else if (!strcmp(mode, "half_frame")) {
            round_half_frame();
            nfds = hold_half_frames(fds, 32);
            td_sleep_ms(1500);
        } else if (!strcmp(mode, "http")) {
            nfds = round_http(fds, 64);
            td_sleep_ms(500);
        } else if (!strcmp(mode, "no_read")) {
            nfds = hold_no_read(fds, big, biglen);
            td_sleep_ms(3000);
        } else {
            fprintf(stderr, "unknown mode %s\n", mode);
            return 2;
        }
        int got = progress_during(load, before, mode);
        for (int i = 0; i < nfds; i++)
            close(fds[i]);
        td_sleep_ms(500);
        rss[round] = td_rss_kb(&d);
        printf("%s round %d: good replies during round %d, lnormd RSS %ld KiB\n", mode, round + 1,
               got, rss[round]);
        CHECK(td_alive(&d), "lnormd died in round %d", round + 1);
        if (!td_alive(&d))
            break;
    }

    fl_stats st;
    fl_stop(load, &st);
    printf("%s: good clients: %ld ok, %ld wrong, %ld failed, slowest %lld ms; RSS KiB: "
           "start %ld, rounds 1-4 %ld %ld %ld %ld, last %ld\n",
           mode, st.ok, st.wrong, st.failed, (long long)st.max_ms, rss0, rss[0], rss[1], rss[2],
           rss[3], rss[rounds - 1]);
    CHECK(st.wrong == 0 && st.failed == 0, "good clients hit problems: %s", st.first_problem);
#if defined(__SANITIZE_ADDRESS__)
    /* Under ASan, RSS swings by hundreds of MiB with the quarantine of freed
     * blocks: no RSS verdict; LeakSanitizer checks lnormd's exit instead
     * (a leak makes it exit non-zero, which fails the exit check below). */
    printf("%s: ASan build: RSS not judged; LeakSanitizer runs at lnormd's exit\n", mode);
#else
    /* Buffers held for clients that do not read, and allocator caches, make
     * RSS swing from round to round (one round can stand 25 MiB above the
     * others, with the round after it back down); a leak
     * keeps adding every round. So the lower of the last two rounds must
     * not exceed the highest of the rounds before them by more than
     * max(16 MiB, 15%): a steady leak of more than that per round fails, a
     * single high round does not. */
    long prev_max = 0;
    for (int i = 0; i < rounds - 2; i++)
        prev_max = rss[i] > prev_max ? rss[i] : prev_max;
    const long last2 = rss[rounds - 1] < rss[rounds - 2] ? rss[rounds - 1] : rss[rounds - 2];
    long allow = prev_max * 15 / 100;
    if (allow < 16 * 1024)
        allow = 16 * 1024;
    CHECK(last2 > 0 && last2 - prev_max <= allow,
          "RSS in the last two rounds %ld and %ld KiB, the lower %ld KiB over the earlier rounds' highest "
          "%ld KiB (allowed %ld)",
          rss[rounds - 2], rss[rounds - 1], last2 - prev_max, prev_max, allow);
    long maxrss = 0;
    for (int i = 0; i < rounds; i++)
        maxrss = rss[i] > maxrss ? rss[i] : maxrss;
    long bound = 512 * 1024;
    CHECK(maxrss < bound, "RSS reached %ld KiB (bound %ld KiB)", maxrss, bound);
#endif

    if (!strcmp(mode, "http"))
        CHECK(http_get("/metrics") == 200, "/metrics does not answer 200 after the abuse");
    td_stop_check(&d, "on SIGTERM");
    free(big);
    return check_finish(mode);
}
