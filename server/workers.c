/* Worker processes and their supervisor (workers.h). */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "lnorm/errors.h"
#include "log.h"
#include "stats.h" /* lnorm__now_ns */
#include "workers.h"

/* A worker that exits this soon after its start, this many times in a row,
 * is not restarted again (it would only fail again): lnormd stops. */
#define LNORM__WORKER_FAST_NS (5ull * 1000000000ull)
#define LNORM__WORKER_FAST_MAX 3

/* "....:PORT" with PORT plus i in out; 1 when s has no port at its end. */
static int lnorm__offset_port(const char *s, int i, char *out, size_t n)
{
    const char *colon = strrchr(s, ':');
    if (!colon || !colon[1] || strspn(colon + 1, "0123456789") != strlen(colon + 1))
        return 1;
    unsigned long port = strtoul(colon + 1, NULL, 10);
    if (port > 65535 || (port && port + (unsigned long)i > 65535))
        return 1;
    int m = snprintf(out, n, "%.*s:%lu", (int)(colon - s), s, port ? port + (unsigned long)i : 0ul);
    return m < 0 || (size_t)m >= n;
}

int lnorm__workers_config(const lnorm__config *cfg, int i, lnorm__config *out, char *errbuf, size_t errlen)
{
    *out = *cfg;
    if (i == 0)
        return LNORM_OK;
    for (int k = 0; k < cfg->nlisten; k++) {
        const char *u = cfg->listen[k];
        int bad;
        if (!strncmp(u, "ipc://", 6)) {
            int m = snprintf(out->listen[k], sizeof out->listen[k], "%s.%d", u, i);
            bad = m < 0 || (size_t)m >= sizeof out->listen[k];
        } else if (!strncmp(u, "tcp://", 6) || !strncmp(u, "tcp4://", 7) || !strncmp(u, "tcp6://", 7) ||
                   !strncmp(u, "tls+tcp://", 10)) {
            bad = lnorm__offset_port(u, i, out->listen[k], sizeof out->listen[k]);
        } else {
            bad = 1;
        }
        if (bad) {
            snprintf(errbuf, errlen,
                     "listen %s: with workers %llu every address must be ipc://PATH (worker i gets PATH.i) or "
                     "tcp://HOST:PORT (worker i gets PORT+i, at most 65535)",
                     u, (unsigned long long)cfg->workers);
            return LNORM_EINVAL;
        }
    }
    if (strcmp(cfg->http, "off") != 0 && lnorm__offset_port(cfg->http, i, out->http, sizeof out->http)) {
        snprintf(errbuf, errlen, "http %s: with workers %llu it must be HOST:PORT (worker i gets PORT+i)", cfg->http,
                 (unsigned long long)cfg->workers);
        return LNORM_EINVAL;
    }
    if (cfg->ready_file[0]) {
        int m = snprintf(out->ready_file, sizeof out->ready_file, "%s.w%d", cfg->ready_file, i);
        if (m < 0 || (size_t)m >= sizeof out->ready_file) {
            snprintf(errbuf, errlen, "ready-file %s: too long", cfg->ready_file);
            return LNORM_EINVAL;
        }
    }
    return LNORM_OK;
}

/* Worker 0's ready file too is at ".w0": the supervisor's own path holds
 * every worker's lines once all are ready. */
static void lnorm__worker_ready_path(const lnorm__config *cfg, int i, char *out, size_t n)
{
    snprintf(out, n, "%s.w%d", cfg->ready_file, i);
}

/* Every worker's ready file present: write their lines, in worker order,
 * into cfg's ready file (atomically). 1 written, 0 not yet, -1 error. */
static int lnorm__write_joint_ready(const lnorm__config *cfg, int n)
{
    char path[LNORM__STR_MAX + 32], tmp[LNORM__STR_MAX + 32], line[LNORM__STR_MAX + 64];
    struct stat sb;
    for (int i = 0; i < n; i++) {
        lnorm__worker_ready_path(cfg, i, path, sizeof path);
        if (stat(path, &sb) != 0)
            return 0;
    }
    snprintf(tmp, sizeof tmp, "%s.tmp.%d", cfg->ready_file, (int)getpid());
    FILE *f = fopen(tmp, "w");
    if (!f)
        return -1;
    for (int i = 0; i < n; i++) {
        lnorm__worker_ready_path(cfg, i, path, sizeof path);
        FILE *w = fopen(path, "r");
        if (!w) {
            fclose(f);
            unlink(tmp);
            return 0; /* gone again (a worker restarting) */
        }
        while (fgets(line, sizeof line, w))
            fputs(line, f);
        fclose(w);
    }
    if (fflush(f) != 0 || fclose(f) != 0 || rename(tmp, cfg->ready_file) != 0) {
        unlink(tmp);
        return -1;
    }
    return 1;
}

static void lnorm__forward(const pid_t *pids, int n, int sig)
{
    for (int i = 0; i < n; i++)
        if (pids[i] > 0)
            kill(pids[i], sig);
}

int lnorm__workers_run(lnorm__config *cfg)
{
    int n = (int)cfg->workers;
    char err[512];
    lnorm__config *wc = calloc((size_t)n, sizeof *wc);
    pid_t *pids = calloc((size_t)n, sizeof *pids);
    uint64_t *started = calloc((size_t)n, sizeof *started);
    int *fast = calloc((size_t)n, sizeof *fast);
    if (!wc || !pids || !started || !fast) {
        fprintf(stderr, "lnormd: out of memory\n");
        free(wc), free(pids), free(started), free(fast);
        return 1;
    }
    for (int i = 0; i < n; i++) {
        if (lnorm__workers_config(cfg, i, &wc[i], err, sizeof err) != LNORM_OK) {
            fprintf(stderr, "lnormd: %s\n", err);
            free(wc), free(pids), free(started), free(fast);
            return 2;
        }
        if (cfg->ready_file[0]) /* worker 0 too: see lnorm__worker_ready_path */
            lnorm__worker_ready_path(cfg, i, wc[i].ready_file, sizeof wc[i].ready_file);
    }
    /* Signals wait in the mask: the supervisor takes them with
     * sigtimedwait; a worker keeps INT/TERM/HUP blocked until its loop
     * handles them (main.c unblocks them), so none is lost at start. */
    sigset_t set, old;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGHUP);
    sigaddset(&set, SIGCHLD);
    sigprocmask(SIG_BLOCK, &set, &old);
    pid_t self = getpid();
    int alive = 0, stopping = 0, exit_code = 0, ready = 0;
    int first = 1, respawn = -1;
    for (;;) {
        /* Start the workers: all at first, later one that died. */
        int lo = first ? 0 : respawn >= 0 ? respawn : n, hi = first ? n : respawn >= 0 ? respawn + 1 : n;
        first = 0;
        for (int k = lo; k < hi && !stopping; k++) {
            pid_t pid = fork();
            if (pid == 0) {
                sigset_t chld;
                sigemptyset(&chld);
                sigaddset(&chld, SIGCHLD);
                sigprocmask(SIG_UNBLOCK, &chld, NULL);
                prctl(PR_SET_PDEATHSIG, SIGTERM); /* the supervisor gone: drain and exit */
                if (getppid() != self)
                    _exit(1);
                *cfg = wc[k];
                free(wc), free(pids), free(started), free(fast);
                return -1;
            }
            if (pid < 0) {
                LOG_ERROR("workers: fork: %s", strerror(errno));
                if (!stopping)
                    lnorm__forward(pids, n, SIGTERM);
                stopping = 1;
                exit_code = 1;
                break;
            }
            pids[k] = pid;
            started[k] = lnorm__now_ns();
            alive++;
            LOG_INFO("worker %d started (pid %d, listen %s%s)", k, (int)pid, wc[k].listen[0],
                     wc[k].nlisten > 1 ? " ..." : "");
        }
        respawn = -1;
        if (alive == 0)
            break;
        struct timespec ts = {0, 50 * 1000 * 1000};
        siginfo_t si;
        int sig = sigtimedwait(&set, &si, &ts);
        if (sig == SIGINT || sig == SIGTERM) {
            if (!stopping)
                LOG_INFO("%s: stopping %d workers (each drains)", sig == SIGINT ? "SIGINT" : "SIGTERM", alive);
            stopping = 1;
            lnorm__forward(pids, n, sig); /* a second one makes them exit at once */
        } else if (sig == SIGHUP) {
            lnorm__forward(pids, n, SIGHUP);
        }
        int st;
        pid_t pid;
        while ((pid = waitpid(-1, &st, WNOHANG)) > 0) {
            int k = 0;
            while (k < n && pids[k] != pid)
                k++;
            if (k == n)
                continue;
            pids[k] = 0;
            alive--;
            int code = WIFEXITED(st) ? WEXITSTATUS(st) : 1;
            char how[64];
            if (WIFEXITED(st))
                snprintf(how, sizeof how, "exit %d", WEXITSTATUS(st));
            else
                snprintf(how, sizeof how, "signal %d", WIFSIGNALED(st) ? WTERMSIG(st) : 0);
            if (stopping) {
                LOG_INFO("worker %d (pid %d) ended (%s)", k, (int)pid, how);
                if (code > exit_code)
                    exit_code = code;
                continue;
            }
            uint64_t now = lnorm__now_ns();
            fast[k] = now - started[k] < LNORM__WORKER_FAST_NS ? fast[k] + 1 : 0;
            if (code == 2 || fast[k] >= LNORM__WORKER_FAST_MAX) {
                LOG_ERROR("worker %d (pid %d) ended (%s)%s; stopping lnormd", k, (int)pid, how,
                          code == 2 ? ", its configuration is refused" : ", again soon after its start");
                exit_code = code == 2 ? 2 : 1;
                stopping = 1;
                lnorm__forward(pids, n, SIGTERM);
                continue;
            }
            LOG_ERROR("worker %d (pid %d) ended (%s); starting it again", k, (int)pid, how);
            respawn = k; /* one at a time: the loop comes round at once for any other */
            break;
        }
        if (!ready && !stopping && cfg->ready_file[0]) {
            int rc = lnorm__write_joint_ready(cfg, n);
            if (rc < 0) {
                LOG_ERROR("ready-file %s: %s; stopping", cfg->ready_file, strerror(errno));
                exit_code = 1;
                stopping = 1;
                lnorm__forward(pids, n, SIGTERM);
            }
            ready = rc > 0;
            if (ready)
                LOG_INFO("%d workers serving", n);
        }
    }
    if (ready)
        unlink(cfg->ready_file);
    free(wc), free(pids), free(started), free(fast);
    return exit_code;
}
