/* Fault-test harness: lnormd as a child process (see harness.h). */
#include "harness.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

int fh_failures;
int fh_keep_default_http;

int64_t fh_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void fh_sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

int fh_mkdtemp(char *out, size_t n, const char *tag)
{
    const char *base = getenv("TMPDIR");
    if (!base || !*base)
        base = "/tmp";
    if ((size_t)snprintf(out, n, "%s/lnorm-%s-XXXXXX", base, tag) >= n)
        return -1;
    if (!mkdtemp(out))
        return -1;
    return chmod(out, 0700);
}

void fh_rmdir(const char *dir)
{
    DIR *d = opendir(dir);
    if (d) {
        struct dirent *e;
        while ((e = readdir(d)) != NULL) {
            if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
                continue;
            char p[600];
            snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
            unlink(p);
        }
        closedir(d);
    }
    rmdir(dir);
}

static int read_ready(fh_daemon *d)
{
    FILE *f = fopen(d->ready, "r");
    if (!f)
        return -1;
    char line[512];
    d->nlisten = 0;
    d->http[0] = 0;
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\r\n")] = 0;
        if (!strncmp(line, "listen ", 7) && d->nlisten < FH_MAX_LISTEN)
            snprintf(d->listen[d->nlisten++], sizeof d->listen[0], "%s", line + 7);
        else if (!strncmp(line, "http ", 5))
            snprintf(d->http, sizeof d->http, "%s", line + 5);
    }
    fclose(f);
    return d->nlisten > 0 ? 0 : -1;
}

int fh_daemon_start(fh_daemon *d, const char *lnormd, const char *dir,
                    const char *const *args, int timeout_ms)
{
    static int seq;
    int n = 0, has_http = 0;
    setvbuf(stdout, NULL, _IOLBF, 0); /* progress lines survive a ctest timeout */
    while (args && args[n]) {
        if (!strcmp(args[n], "--http"))
            has_http = 1;
        n++;
    }
    memset(d, 0, sizeof *d);
    snprintf(d->dir, sizeof d->dir, "%s", dir);
    seq++;
    snprintf(d->ready, sizeof d->ready, "%s/ready-%d", dir, seq);
    snprintf(d->log, sizeof d->log, "%s/lnormd-%d.log", dir, seq);
    unlink(d->ready);

    const char **argv = calloc((size_t)n + 8, sizeof *argv);
    if (!argv)
        return -1;
    int k = 0;
    argv[k++] = lnormd;
    for (int i = 0; i < n; i++)
        argv[k++] = args[i];
    argv[k++] = "--ready-file";
    argv[k++] = d->ready;
    if (!has_http && !fh_keep_default_http) {
        argv[k++] = "--http";
        argv[k++] = "127.0.0.1:0";
    }
    argv[k] = NULL;

    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) {
        free(argv);
        return -1;
    }
    if (pid == 0) {
        int fd = open(d->log, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
        }
        execv(lnormd, (char *const *)argv);
        fprintf(stderr, "exec %s: %s\n", lnormd, strerror(errno));
        _exit(127);
    }
    free(argv);
    d->pid = pid;
    int64_t end = fh_now_ms() + timeout_ms;
    while (fh_now_ms() < end) {
        if (read_ready(d) == 0)
            return 0;
        if (!fh_daemon_alive(d)) {
            fprintf(stderr, "harness: lnormd exited before it was ready\n");
            fh_daemon_dump_log(d);
            return -1;
        }
        fh_sleep_ms(10);
    }
    fprintf(stderr, "harness: lnormd not ready after %d ms\n", timeout_ms);
    fh_daemon_dump_log(d);
    fh_daemon_stop(d, SIGKILL, 5000);
    return -1;
}

const char *fh_daemon_url(const fh_daemon *d, const char *prefix)
{
    for (int i = 0; i < d->nlisten; i++)
        if (!strncmp(d->listen[i], prefix, strlen(prefix)))
            return d->listen[i];
    return NULL;
}

static int reaped_status;

int fh_daemon_alive(fh_daemon *d)
{
    if (d->pid <= 0)
        return 0;
    int st;
    pid_t r = waitpid(d->pid, &st, WNOHANG);
    if (r == d->pid) {
        reaped_status = st;
        d->pid = 0;
        return 0;
    }
    return 1;
}

int fh_daemon_stop(fh_daemon *d, int sig, int timeout_ms)
{
    if (d->pid <= 0)
        return reaped_status;
    kill(d->pid, sig);
    int64_t end = fh_now_ms() + timeout_ms;
    while (fh_now_ms() < end) {
        if (!fh_daemon_alive(d))
            return reaped_status;
        fh_sleep_ms(5);
    }
    fprintf(stderr, "harness: lnormd (pid %d) did not exit %d ms after signal %d; killing it\n",
            (int)d->pid, timeout_ms, sig);
    kill(d->pid, SIGKILL);
    int st;
    waitpid(d->pid, &st, 0);
    d->pid = 0;
    return -1;
}

long fh_rss_kb(pid_t pid)
{
    char p[64], line[256];
    snprintf(p, sizeof p, "/proc/%d/status", (int)pid);
    FILE *f = fopen(p, "r");
    if (!f)
        return -1;
    long kb = -1;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "VmRSS: %ld kB", &kb) == 1)
            break;
    fclose(f);
    return kb;
}

void fh_check_exit0(const fh_daemon *d, int status, const char *what)
{
    if (status >= 0 && WIFEXITED(status) && WEXITSTATUS(status) == 0)
        return;
    const char *san = "";
    FILE *f = fopen(d->log, "r");
    char line[512];
    while (f && fgets(line, sizeof line, f)) {
        if (strstr(line, "LeakSanitizer"))
            san = " - LeakSanitizer reported leaks (see the log)";
        else if (strstr(line, "ERROR: AddressSanitizer") && !*san)
            san = " - AddressSanitizer report (see the log)";
        else if (strstr(line, "runtime error:") && !*san)
            san = " - UndefinedBehaviorSanitizer report (see the log)";
    }
    if (f)
        fclose(f);
    fh_failures++;
    if (status >= 0 && WIFSIGNALED(status))
        fprintf(stderr, "FAIL: lnormd %s: killed by signal %d%s\n", what, WTERMSIG(status), san);
    else if (status >= 0)
        fprintf(stderr, "FAIL: lnormd %s: exit status %d, expected 0%s\n", what, WEXITSTATUS(status), san);
    else
        fprintf(stderr, "FAIL: lnormd %s: did not exit in time%s\n", what, san);
}

void fh_daemon_dump_log(const fh_daemon *d)
{
    FILE *f = fopen(d->log, "r");
    if (!f)
        return;
    if (fseek(f, 0, SEEK_END) == 0) {
        long sz = ftell(f);
        fseek(f, sz > 4096 ? sz - 4096 : 0, SEEK_SET);
    }
    char buf[4097];
    size_t n = fread(buf, 1, 4096, f);
    buf[n] = 0;
    fclose(f);
    fprintf(stderr, "---- lnormd log (%s, last %zu bytes) ----\n%s\n---- end of log ----\n",
            d->log, n, buf);
}

int fh_finish(const char *name)
{
    if (fh_failures) {
        fprintf(stderr, "%s: %d check(s) failed\n", name, fh_failures);
        return 1;
    }
    printf("%s: all checks passed\n", name);
    return 0;
}
