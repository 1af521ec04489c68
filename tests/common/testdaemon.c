/* lnormd as a child process of a test (see testdaemon.h). */
#include "testdaemon.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "check.h"

enum { READY_TIMEOUT_MS = 20000, MAX_TRACKED = 64 };

/* Every daemon started (its pid while it runs, its log) and every folder
 * made, for the exit handler and the watchdog. Tests start daemons from
 * their main thread. */
static struct {
    pid_t pid;
    char log[320];
} g_started[MAX_TRACKED];
static int g_nstarted;
static char g_dirs[MAX_TRACKED][256];
static int g_ndirs;
static int g_exit_set;

static void kill_all(void)
{
    for (int i = 0; i < g_nstarted; i++)
        if (g_started[i].pid > 0) {
            kill(g_started[i].pid, SIGKILL);
            waitpid(g_started[i].pid, NULL, 0);
            g_started[i].pid = 0;
        }
}

static void dump_file_tail(const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return;
    if (fseek(f, 0, SEEK_END) == 0) {
        long sz = ftell(f);
        fseek(f, sz > 8192 ? sz - 8192 : 0, SEEK_SET);
    }
    static char buf[8193];
    size_t n = fread(buf, 1, 8192, f);
    buf[n] = 0;
    fclose(f);
    fprintf(stderr, "---- %s (last %zu bytes) ----\n%s%s---- end of log ----\n", path, n, buf,
            n && buf[n - 1] != '\n' ? "\n" : "");
}

static void at_exit(void)
{
    kill_all();
    if (check_failures() > 0)
        for (int i = 0; i < g_nstarted; i++)
            dump_file_tail(g_started[i].log);
    for (int i = 0; i < g_ndirs; i++)
        td_rmdir(g_dirs[i]);
}

static void ensure_exit_handler(void)
{
    if (!g_exit_set) {
        g_exit_set = 1;
        signal(SIGPIPE, SIG_IGN);
        atexit(at_exit);
    }
}

static const char *volatile g_watch_note; /* td_watchdog_note */

void td_watchdog_note(const char *where)
{
    g_watch_note = where;
}

static void on_alarm(int sig)
{
    (void)sig;
    static const char msg[] = "FAIL: watchdog expired, killing lnormd\n";
    ssize_t w = write(2, msg, sizeof msg - 1);
    const char *note = g_watch_note;
    if (note) {
        static const char at[] = "FAIL: the test was at: ";
        w = write(2, at, sizeof at - 1);
        w = write(2, note, strlen(note));
        w = write(2, "\n", 1);
    }
    (void)w;
    for (int i = 0; i < g_nstarted; i++)
        if (g_started[i].pid > 0)
            kill(g_started[i].pid, SIGKILL);
    _exit(1);
}

void td_watchdog(int secs)
{
    ensure_exit_handler();
    signal(SIGALRM, on_alarm);
    alarm((unsigned)secs);
}

int64_t td_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void td_sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

int td_usage(int argc, char **argv, int nargs, const char *usage)
{
    if (argc == nargs)
        return 1;
    fprintf(stderr, "usage: %s %s\n", argc > 0 ? argv[0] : "test", usage);
    return 0;
}

int td_tmpdir(char *out, size_t n, const char *tag)
{
    ensure_exit_handler();
    const char *base = getenv("TMPDIR");
    if (!base || !*base)
        base = "/tmp";
    if ((size_t)snprintf(out, n, "%s/lnorm-%s-XXXXXX", base, tag) >= n || !mkdtemp(out)) {
        fprintf(stderr, "td_tmpdir %s: %s\n", tag, strerror(errno));
        return -1;
    }
    if (g_ndirs < MAX_TRACKED)
        snprintf(g_dirs[g_ndirs++], sizeof g_dirs[0], "%s", out);
    return chmod(out, 0700);
}

int td_tmpfile(char *path, size_t n, const char *tag, const char *name)
{
    char dir[256];
    if (td_tmpdir(dir, sizeof dir, tag) != 0 || (size_t)snprintf(path, n, "%s/%s", dir, name) >= n) {
        CHECK_FAIL("no temporary file %s", name);
        return -1;
    }
    return 0;
}

static int remove_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb;
    (void)flag;
    (void)ftw;
    remove(path);
    return 0;
}

void td_rmdir(const char *dir)
{
    if (dir && dir[0])
        nftw(dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
}

static void untrack(pid_t pid)
{
    for (int i = 0; i < g_nstarted; i++)
        if (g_started[i].pid == pid)
            g_started[i].pid = 0;
}

/* Read the ready file; 0 once it lists a listener. */
static int read_ready(td_daemon *d)
{
    FILE *f = fopen(d->ready, "r");
    if (!f)
        return -1;
    char line[320];
    d->nlisten = 0;
    d->http[0] = d->ipc_url[0] = d->tcp_url[0] = d->tls_url[0] = 0;
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\r\n")] = 0;
        if (!strncmp(line, "listen ", 7) && d->nlisten < TD_MAX_LISTEN)
            snprintf(d->listen[d->nlisten++], sizeof d->listen[0], "%s", line + 7);
        else if (!strncmp(line, "http ", 5))
            snprintf(d->http, sizeof d->http, "%s", line + 5);
    }
    fclose(f);
    const char *u;
    if ((u = td_url(d, "ipc://")) != NULL)
        snprintf(d->ipc_url, sizeof d->ipc_url, "%s", u);
    if ((u = td_url(d, "tcp://")) != NULL)
        snprintf(d->tcp_url, sizeof d->tcp_url, "%s", u);
    if ((u = td_url(d, "tls+tcp://")) != NULL)
        snprintf(d->tls_url, sizeof d->tls_url, "%s", u);
    return d->nlisten > 0 ? 0 : -1;
}

/* Fork and exec lnormd with the saved arguments; wait for the ready file. */
static int launch(td_daemon *d)
{
    static int seq;
    ensure_exit_handler();
    seq++;
    snprintf(d->ready, sizeof d->ready, "%s/ready-%d", d->dir, seq);
    snprintf(d->log, sizeof d->log, "%s/lnormd-%d.log", d->dir, seq);
    unlink(d->ready);
    char ipc[320];
    snprintf(ipc, sizeof ipc, "ipc://%s/lnormd.sock", d->dir);
    const char *argv[TD_MAX_ARGS + 12];
    int n = 0, has_http = 0;
    argv[n++] = d->lnormd;
    if (d->flags & TD_ENDPOINTS) {
        argv[n++] = "--listen";
        argv[n++] = ipc;
        argv[n++] = "--listen";
        argv[n++] = "tcp://127.0.0.1:0";
    }
    for (int i = 0; i < d->nargs; i++) {
        has_http |= !strcmp(d->args[i], "--http");
        argv[n++] = d->args[i];
    }
    if (!has_http && !(d->flags & TD_DEFAULT_HTTP)) {
        argv[n++] = "--http";
        argv[n++] = "127.0.0.1:0";
    }
    argv[n++] = "--ready-file";
    argv[n++] = d->ready;
    argv[n] = NULL;

    setvbuf(stdout, NULL, _IOLBF, 0); /* progress lines survive a ctest timeout */
    fflush(NULL);
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0) {
        perror("fork");
        return -1;
    }
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent)
            _exit(127);
        int fd = open(d->log, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
        }
        execv(d->lnormd, (char *const *)argv);
        fprintf(stderr, "exec %s: %s\n", d->lnormd, strerror(errno));
        _exit(127);
    }
    d->pid = pid;
    d->status = -1;
    if (g_nstarted < MAX_TRACKED) {
        g_started[g_nstarted].pid = pid;
        snprintf(g_started[g_nstarted].log, sizeof g_started[0].log, "%s", d->log);
        g_nstarted++;
    }
    int64_t end = td_now_ms() + READY_TIMEOUT_MS;
    while (td_now_ms() < end) {
        if (read_ready(d) == 0)
            return 0;
        if (!td_alive(d)) {
            fprintf(stderr, "lnormd exited before it was ready (wait status 0x%x)\n", (unsigned)d->status);
            td_dump_log(d);
            return -1;
        }
        td_sleep_ms(10);
    }
    fprintf(stderr, "lnormd not ready after %d ms\n", READY_TIMEOUT_MS);
    td_dump_log(d);
    td_stop(d, SIGKILL, 5000);
    return -1;
}

int td_start(td_daemon *d, const char *lnormd, const char *dir, const char *const *args, unsigned flags)
{
    memset(d, 0, sizeof *d);
    d->status = -1;
    snprintf(d->lnormd, sizeof d->lnormd, "%s", lnormd);
    d->flags = flags;
    size_t used = 0;
    for (int i = 0; args && args[i]; i++) {
        size_t len = strlen(args[i]) + 1;
        if (d->nargs == TD_MAX_ARGS || used + len > sizeof d->argbuf) {
            fprintf(stderr, "td_start: too many arguments\n");
            return -1;
        }
        d->args[d->nargs++] = memcpy(d->argbuf + used, args[i], len);
        used += len;
    }
    if (dir)
        snprintf(d->dir, sizeof d->dir, "%s", dir);
    else if (td_tmpdir(d->dir, sizeof d->dir, "lnormd") != 0)
        return -1;
    return launch(d);
}

int td_restart(td_daemon *d)
{
    if (d->pid > 0) {
        fprintf(stderr, "td_restart: lnormd (pid %d) is still running\n", (int)d->pid);
        return -1;
    }
    return launch(d);
}

int td_alive(td_daemon *d)
{
    if (d->pid <= 0)
        return 0;
    int st;
    if (waitpid(d->pid, &st, WNOHANG) == d->pid) {
        untrack(d->pid);
        d->status = st;
        d->pid = 0;
        return 0;
    }
    return 1;
}

int td_stop(td_daemon *d, int sig, int timeout_ms)
{
    if (d->pid <= 0)
        return d->status;
    if (sig)
        kill(d->pid, sig);
    int64_t end = td_now_ms() + timeout_ms;
    while (td_now_ms() < end) {
        if (!td_alive(d))
            return d->status;
        td_sleep_ms(5);
    }
    fprintf(stderr, "lnormd (pid %d) did not exit %d ms after signal %d; killing it\n", (int)d->pid, timeout_ms,
            sig);
    kill(d->pid, SIGKILL);
    waitpid(d->pid, NULL, 0);
    untrack(d->pid);
    d->pid = 0;
    d->status = -1;
    return -1;
}

void td_check_exit0(const td_daemon *d, int status, const char *what)
{
    if (status >= 0 && WIFEXITED(status) && WEXITSTATUS(status) == 0)
        return;
    const char *san = "";
    if (td_log_contains(d, "LeakSanitizer"))
        san = " - LeakSanitizer reported leaks (see the log)";
    else if (td_log_contains(d, "ERROR: AddressSanitizer"))
        san = " - AddressSanitizer report (see the log)";
    else if (td_log_contains(d, "runtime error:"))
        san = " - UndefinedBehaviorSanitizer report (see the log)";
    if (status >= 0 && WIFSIGNALED(status))
        CHECK_FAIL("lnormd %s: killed by signal %d%s", what, WTERMSIG(status), san);
    else if (status >= 0)
        CHECK_FAIL("lnormd %s: exit status %d, want 0%s", what, WEXITSTATUS(status), san);
    else
        CHECK_FAIL("lnormd %s: did not exit in time%s", what, san);
}

void td_stop_check(td_daemon *d, const char *what)
{
    td_check_exit0(d, td_stop(d, SIGTERM, 20000), what);
}

void td_signal(td_daemon *d, int sig)
{
    if (d->pid > 0)
        kill(d->pid, sig);
}

long td_rss_kb(const td_daemon *d)
{
    char p[64], line[256];
    snprintf(p, sizeof p, "/proc/%d/status", (int)d->pid);
    FILE *f = d->pid > 0 ? fopen(p, "r") : NULL;
    if (!f)
        return -1;
    long kb = -1;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "VmRSS: %ld kB", &kb) == 1)
            break;
    fclose(f);
    return kb;
}

const char *td_url(const td_daemon *d, const char *prefix)
{
    for (int i = 0; i < d->nlisten; i++)
        if (!strncmp(d->listen[i], prefix, strlen(prefix)))
            return d->listen[i];
    return NULL;
}

int td_log_contains(const td_daemon *d, const char *needle)
{
    FILE *f = fopen(d->log, "r");
    if (!f)
        return 0;
    char line[4096];
    int found = 0;
    while (!found && fgets(line, sizeof line, f))
        found = strstr(line, needle) != NULL;
    fclose(f);
    return found;
}

int td_wait_log(const td_daemon *d, const char *needle, int timeout_ms)
{
    int64_t end = td_now_ms() + timeout_ms;
    for (;;) {
        if (td_log_contains(d, needle))
            return 1;
        if (td_now_ms() >= end)
            return 0;
        td_sleep_ms(10);
    }
}

void td_dump_log(const td_daemon *d)
{
    dump_file_tail(d->log);
}

char *td_http_get(const td_daemon *d, const char *path, int *status)
{
    const char *hostport = d->http;
    *status = 0;
    char host[64];
    int port;
    const char *c = strrchr(hostport, ':');
    if (!c || (size_t)(c - hostport) >= sizeof host)
        return NULL;
    memcpy(host, hostport, (size_t)(c - hostport));
    host[c - hostport] = 0;
    port = atoi(c + 1);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0)
        return NULL;
    struct sockaddr_in sa = {0};
    sa.sin_family = AF_INET;
    sa.sin_port = htons((uint16_t)port);
    inet_pton(AF_INET, host, &sa.sin_addr);
    struct timeval tv = {10, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
        close(fd);
        return NULL;
    }
    char req[512];
    int n = snprintf(req, sizeof req, "GET %s HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", path, hostport);
    if (write(fd, req, (size_t)n) != n) {
        close(fd);
        return NULL;
    }
    size_t len = 0, cap = 65536;
    char *buf = malloc(cap);
    for (;;) {
        if (len + 4096 >= cap) {
            cap *= 2;
            buf = realloc(buf, cap);
        }
        ssize_t r = read(fd, buf + len, cap - len - 1);
        if (r <= 0)
            break;
        len += (size_t)r;
        buf[len] = 0;
        /* Stop once the whole body (Content-Length) is in. */
        char *hdr_end = strstr(buf, "\r\n\r\n");
        char *cl = strcasestr(buf, "Content-Length:");
        if (hdr_end && cl && cl < hdr_end && len >= (size_t)(hdr_end + 4 - buf) + (size_t)atol(cl + 15))
            break;
    }
    close(fd);
    buf[len] = 0;
    *status = 0;
    sscanf(buf, "HTTP/1.%*d %d", status);
    char *body = strstr(buf, "\r\n\r\n");
    if (!body) {
        free(buf);
        return NULL;
    }
    memmove(buf, body + 4, strlen(body + 4) + 1);
    return buf;
}

double td_metric(const td_daemon *d, const char *name)
{
    int st;
    char *body = td_http_get(d, "/metrics", &st);
    if (!body)
        return -1;
    double v = -1;
    size_t nl = strlen(name);
    for (char *line = body; line && *line;) {
        char *next = strchr(line, '\n');
        if (!strncmp(line, name, nl) && line[nl] == ' ') {
            v = atof(line + nl + 1);
            break;
        }
        line = next ? next + 1 : NULL;
    }
    free(body);
    return v;
}

double td_wait_metric(const td_daemon *d, const char *name, double want, int timeout_ms)
{
    int64_t end = td_now_ms() + timeout_ms;
    double v = td_metric(d, name);
    while (v != want && td_now_ms() < end) {
        td_sleep_ms(2);
        v = td_metric(d, name);
    }
    return v;
}

int td_run(const char *lnormd, const char *const *args, char *out, size_t outlen)
{
    ensure_exit_handler();
    int pfd[2];
    if (pipe(pfd) != 0)
        return -1;
    const char *argv[TD_MAX_ARGS + 2];
    int n = 0;
    argv[n++] = lnormd;
    for (int i = 0; args && args[i] && n < TD_MAX_ARGS; i++)
        argv[n++] = args[i];
    argv[n] = NULL;
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        dup2(pfd[1], 1);
        dup2(pfd[1], 2);
        close(pfd[0]);
        close(pfd[1]);
        execv(lnormd, (char *const *)argv);
        _exit(127);
    }
    close(pfd[1]);
    if (g_nstarted < MAX_TRACKED)
        g_started[g_nstarted++].pid = pid;
    size_t len = 0;
    int64_t end = td_now_ms() + READY_TIMEOUT_MS;
    fcntl(pfd[0], F_SETFL, O_NONBLOCK);
    int st = 0, done = 0;
    while (td_now_ms() < end) {
        char tmp[4096];
        ssize_t r = read(pfd[0], tmp, sizeof tmp);
        if (r > 0) {
            size_t c = (size_t)r;
            if (outlen && len + c > outlen - 1)
                c = outlen - 1 - len;
            memcpy(out + len, tmp, c);
            len += c;
            continue;
        }
        if (r == 0 && (done = waitpid(pid, &st, 0) == pid))
            break;
        td_sleep_ms(2);
    }
    close(pfd[0]);
    if (outlen)
        out[len] = 0;
    if (!done) {
        kill(pid, SIGKILL);
        waitpid(pid, &st, 0);
    }
    untrack(pid);
    return done && WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}
