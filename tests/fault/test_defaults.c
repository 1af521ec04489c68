/*
 * fault.loopback_defaults: lnormd is safe by default.
 *
 *   fault_defaults LNORMD
 *
 * Runs lnormd with no --listen and no --http, i.e. its defaults
 * (tcp://127.0.0.1:7878, ipc:///tmp/lnormd.sock, http 127.0.0.1:7879).
 * So as not to collide with anything else on this machine, the test first
 * enters a private network namespace (its own loopback) and a private
 * mount namespace with a fresh tmpfs on /tmp; without the privilege for
 * that it exits 77 (ctest: skipped, never passed). Checks:
 *  - the ready file lists only 127.0.0.1 tcp URLs and the /tmp ipc path,
 *    and an http endpoint on 127.0.0.1;
 *  - every listening TCP socket lnormd owns (from /proc/PID/fd and
 *    /proc/PID/net/tcp{,6}) is bound to 127.0.0.1 or ::1, never a
 *    wildcard or another address;
 *  - the default ipc socket, and an ipc socket at a path given with
 *    --listen, are not writable by others (mode & 0002 == 0);
 *  - lnormd answers Health on both and exits 0 on SIGTERM;
 *  - tls+tcp:// without a certificate, or with unreadable certificate
 *    files, is refused at start (exit status 2).
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <net/if.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "testdaemon.h"
#include "wire.h"

static int isolate(void)
{
    if (unshare(CLONE_NEWNET | CLONE_NEWNS) != 0) {
        fprintf(stderr, "defaults: unshare: %s\n", strerror(errno));
        return -1;
    }
    if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0 ||
        mount("tmpfs", "/tmp", "tmpfs", 0, "mode=1777,size=64m") != 0) {
        fprintf(stderr, "defaults: mount: %s\n", strerror(errno));
        return -1;
    }
    int fd = socket(AF_INET, SOCK_DGRAM, 0);
    struct ifreq ifr;
    memset(&ifr, 0, sizeof ifr);
    snprintf(ifr.ifr_name, sizeof ifr.ifr_name, "lo");
    int ok = fd >= 0 && ioctl(fd, SIOCGIFFLAGS, &ifr) == 0;
    ifr.ifr_flags |= IFF_UP | IFF_RUNNING;
    ok = ok && ioctl(fd, SIOCSIFFLAGS, &ifr) == 0;
    if (fd >= 0)
        close(fd);
    if (!ok) {
        fprintf(stderr, "defaults: cannot bring up lo: %s\n", strerror(errno));
        return -1;
    }
    setenv("TMPDIR", "/tmp", 1);
    return 0;
}

/* Socket inodes of pid's open fds. */
static int socket_inodes(pid_t pid, unsigned long *out, int max)
{
    char p[64];
    snprintf(p, sizeof p, "/proc/%d/fd", (int)pid);
    DIR *d = opendir(p);
    if (!d)
        return 0;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL && n < max) {
        char lp[320], target[128];
        snprintf(lp, sizeof lp, "%s/%s", p, e->d_name);
        ssize_t k = readlink(lp, target, sizeof target - 1);
        if (k <= 0)
            continue;
        target[k] = 0;
        unsigned long ino;
        if (sscanf(target, "socket:[%lu]", &ino) == 1)
            out[n++] = ino;
    }
    closedir(d);
    return n;
}

/* Check the LISTEN sockets of pid in /proc/PID/net/FILE; returns how many. */
static int check_listeners(pid_t pid, const char *file, const unsigned long *inos, int ninos)
{
    char p[64], line[512];
    snprintf(p, sizeof p, "/proc/%d/net/%s", (int)pid, file);
    FILE *f = fopen(p, "r");
    if (!f)
        return 0;
    int count = 0;
    if (!fgets(line, sizeof line, f)) {
        fclose(f);
        return 0;
    }
    while (fgets(line, sizeof line, f)) {
        char local[64], remote[64];
        unsigned st;
        unsigned long ino;
        if (sscanf(line, " %*d: %63s %63s %x %*s %*s %*s %*s %*s %lu", local, remote, &st, &ino) != 4)
            continue;
        if (st != 0x0A)
            continue;
        int mine = 0;
        for (int i = 0; i < ninos; i++)
            mine |= inos[i] == ino;
        if (!mine)
            continue;
        count++;
        char *colon = strchr(local, ':');
        unsigned port = colon ? (unsigned)strtoul(colon + 1, NULL, 16) : 0;
        if (colon)
            *colon = 0;
        int loop4 = !strcmp(local, "0100007F");
        int loop6 = !strcmp(local, "00000000000000000000000001000000");
        printf("defaults: lnormd listens on %s %s port %u\n", file, local, port);
        CHECK(loop4 || loop6, "lnormd listens on non-loopback address %s (%s) port %u", local,
              file, port);
    }
    fclose(f);
    return count;
}

static void check_ipc_mode(const char *path)
{
    struct stat sb;
    CHECK(stat(path, &sb) == 0, "ipc socket %s missing: %s", path, strerror(errno));
    if (stat(path, &sb) != 0)
        return;
    printf("defaults: %s mode %04o\n", path, (unsigned)(sb.st_mode & 07777));
    CHECK(S_ISSOCK(sb.st_mode), "%s is not a socket", path);
    CHECK((sb.st_mode & S_IWOTH) == 0, "%s is world-writable (mode %04o)", path,
          (unsigned)(sb.st_mode & 07777));
}

static void check_health(const char *url)
{
    nng_socket s;
    if (fw_req_open(&s, url, 5000, 50) != 0) {
        CHECK_FAIL("cannot open a socket to %s", url);
        return;
    }
    size_t len;
    uint8_t *b = fw_pack_health(5, &len);
    Lnorm__V1__Response *r = NULL;
    int rv = fw_req_call(s, b, len, &r);
    CHECK(rv == 0 && r->health && r->health->serving, "no Health on %s: %s", url,
          rv ? nng_strerror(rv) : "not serving");
    if (r)
        lnorm__v1__response__free_unpacked(r, NULL);
    free(b);
    nng_close(s);
}

int main(int argc, char **argv)
{
    if (!td_usage(argc, argv, 2, "LNORMD"))
        return 2;
    /* The private /tmp hides anything under the real /tmp, lnormd's build
     * folder included (CI clones there): keep it open and exec it through
     * /proc/self/fd (the fd is inherited by the child). */
    int exe_fd = open(argv[1], O_RDONLY);
    if (exe_fd < 0) {
        fprintf(stderr, "defaults: %s: %s\n", argv[1], strerror(errno));
        return 1;
    }
    static char exe[64];
    snprintf(exe, sizeof exe, "/proc/self/fd/%d", exe_fd);
    argv[1] = exe;
    if (isolate() != 0) {
        fprintf(stderr, "defaults: SKIPPED: needs root (CAP_SYS_ADMIN) for private net/mount "
                        "namespaces, so as not to bind the real default port and path\n");
        return 77;
    }
    char dir[256];
    if (td_tmpdir(dir, sizeof dir, "defaults") != 0)
        return 1;
    const char *args[] = {"--backend", "cpu", "--cpu-threads", "1", NULL};
    td_daemon d;
    if (td_start(&d, argv[1], dir, args, TD_DEFAULT_HTTP) != 0)
        return 1;
    int ntcp = 0, nipc = 0;
    for (int i = 0; i < d.nlisten; i++) {
        printf("defaults: ready file: listen %s\n", d.listen[i]);
        if (!strncmp(d.listen[i], "tcp://", 6)) {
            ntcp++;
            CHECK(!strncmp(d.listen[i], "tcp://127.0.0.1:", 16), "default listener %s is not loopback",
                  d.listen[i]);
        } else if (!strncmp(d.listen[i], "ipc://", 6)) {
            nipc++;
            check_ipc_mode(d.listen[i] + 6);
        } else {
            CHECK_FAIL("unexpected default listener %s", d.listen[i]);
        }
    }
    CHECK(ntcp == 1 && nipc == 1, "expected one tcp and one ipc default listener, got %d and %d",
          ntcp, nipc);
    printf("defaults: ready file: http %s\n", d.http);
    CHECK(d.http[0] == 0 || !strncmp(d.http, "127.0.0.1:", 10), "default http endpoint %s is not loopback",
          d.http);
    unsigned long inos[256];
    int n = socket_inodes(d.pid, inos, 256);
    int listening = check_listeners(d.pid, "tcp", inos, n) + check_listeners(d.pid, "tcp6", inos, n);
    CHECK(listening >= 1, "found no listening TCP socket of lnormd");
    for (int i = 0; i < d.nlisten; i++)
        check_health(d.listen[i]);
    td_stop_check(&d, "with defaults, on SIGTERM");

    /* An ipc path given on the command line. */
    char url[400];
    snprintf(url, sizeof url, "ipc://%s/custom.sock", dir);
    const char *args2[] = {"--listen", url, "--http", "off", "--backend", "cpu", "--cpu-threads", "1",
                           NULL};
    td_daemon d2;
    if (td_start(&d2, argv[1], dir, args2, 0) == 0) {
        check_ipc_mode(url + 6);
        check_health(url);
        td_stop_check(&d2, "with an ipc --listen, on SIGTERM");
    } else {
        CHECK_FAIL("lnormd did not start with --listen %s --http off", url);
    }
    /* Unsafe TLS setups are refused at start (exit status 2), never served. */
    static const char *const bad[][12] = {
        {"--listen", "tls+tcp://127.0.0.1:0", "--http", "off", NULL},
        {"--listen", "tls+tcp://127.0.0.1:0", "--http", "off", "--tls-cert", "/nonexistent/server.crt",
         "--tls-key", "/nonexistent/server.key", NULL},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        td_daemon b;
        int rc = td_start(&b, argv[1], dir, (const char *const *)bad[i], 0);
        int st = td_stop(&b, rc == 0 ? SIGKILL : 0, 5000);
        printf("defaults: unsafe TLS setup %zu: %s (wait status %d)\n", i,
               rc == 0 ? "SERVED" : "refused", st);
        CHECK(rc != 0 && st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 2,
              "lnormd started (or did not exit 2) with unsafe TLS setup %zu", i);
    }
    return check_finish("fault.loopback_defaults");
}
