/* The lnormd test harness (see harness.h). */
#include "harness.h"

#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAX_DAEMONS 8
static pid_t live[MAX_DAEMONS];
static int atexit_set;

static void kill_all(void)
{
    for (int i = 0; i < MAX_DAEMONS; i++)
        if (live[i] > 0) {
            kill(live[i], SIGKILL);
            waitpid(live[i], NULL, 0);
            live[i] = 0;
        }
}

double lnorm__now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

int lnorm__tmpdir(char *buf, size_t cap)
{
    const char *base = getenv("TMPDIR");
    snprintf(buf, cap, "%s/lnorm-test-XXXXXX", base && *base ? base : "/tmp");
    if (!mkdtemp(buf)) {
        perror("mkdtemp");
        return -1;
    }
    return 0;
}

void lnorm__rmdir(const char *dir)
{
    DIR *dp = opendir(dir);
    if (dp) {
        struct dirent *e;
        char p[1024];
        while ((e = readdir(dp)) != NULL) {
            if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
                continue;
            snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
            unlink(p);
        }
        closedir(dp);
    }
    rmdir(dir);
}

static int read_ready(lnorm__daemon *d, const char *path)
{
    FILE *fp = fopen(path, "r");
    if (!fp)
        return -1;
    char line[512];
    d->tcp_url[0] = d->http[0] = 0;
    int ipc_seen = 0;
    while (fgets(line, sizeof line, fp)) {
        line[strcspn(line, "\r\n")] = 0;
        if (strncmp(line, "listen ", 7) == 0) {
            const char *u = line + 7;
            if (strncmp(u, "tcp://", 6) == 0)
                snprintf(d->tcp_url, sizeof d->tcp_url, "%s", u);
            else if (strncmp(u, "ipc://", 6) == 0)
                ipc_seen = 1;
        } else if (strncmp(line, "http ", 5) == 0) {
            snprintf(d->http, sizeof d->http, "%s", line + 5);
        }
    }
    fclose(fp);
    return (d->tcp_url[0] && ipc_seen && d->http[0]) ? 0 : -1;
}

int lnorm__daemon_start(lnorm__daemon *d, const char *path, const char *const *extra,
                        int timeout_ms)
{
    memset(d, 0, sizeof *d);
    if (!atexit_set) {
        atexit(kill_all);
        atexit_set = 1;
    }
    if (access(path, X_OK) != 0) {
        fprintf(stderr, "harness: lnormd not found or not executable at %s\n", path);
        return -1;
    }
    if (lnorm__tmpdir(d->dir, sizeof d->dir) != 0)
        return -1;
    snprintf(d->ipc_url, sizeof d->ipc_url, "ipc://%s/lnormd.sock", d->dir);
    char ready[300];
    snprintf(ready, sizeof ready, "%s/ready", d->dir);
    const char *argv[64];
    int n = 0;
    argv[n++] = path;
    argv[n++] = "--listen";
    argv[n++] = d->ipc_url;
    argv[n++] = "--listen";
    argv[n++] = "tcp://127.0.0.1:0";
    argv[n++] = "--http";
    argv[n++] = "127.0.0.1:0";
    argv[n++] = "--ready-file";
    argv[n++] = ready;
    for (int i = 0; extra && extra[i] && n < 62; i++)
        argv[n++] = extra[i];
    argv[n] = NULL;
    pid_t ppid = getpid();
    pid_t pid = fork();
    if (pid < 0) {
        perror("fork");
        return -1;
    }
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != ppid)
            _exit(127);
        execv(path, (char *const *)argv);
        perror("execv lnormd");
        _exit(127);
    }
    d->pid = pid;
    for (int i = 0; i < MAX_DAEMONS; i++)
        if (live[i] == 0) {
            live[i] = pid;
            break;
        }
    double t0 = lnorm__now_ms();
    while (lnorm__now_ms() - t0 < timeout_ms) {
        if (read_ready(d, ready) == 0)
            return 0;
        int st;
        if (waitpid(pid, &st, WNOHANG) == pid) {
            fprintf(stderr, "harness: lnormd exited early (status 0x%x)\n", st);
            d->pid = 0;
            for (int i = 0; i < MAX_DAEMONS; i++)
                if (live[i] == pid)
                    live[i] = 0;
            return -1;
        }
        usleep(20000);
    }
    fprintf(stderr, "harness: lnormd not ready after %d ms\n", timeout_ms);
    lnorm__daemon_stop(d, 1000);
    return -1;
}

int lnorm__daemon_stop(lnorm__daemon *d, int timeout_ms)
{
    int result = -1;
    if (d->pid > 0) {
        kill(d->pid, SIGTERM);
        double t0 = lnorm__now_ms();
        int st = 0, done = 0;
        while (lnorm__now_ms() - t0 < timeout_ms) {
            if (waitpid(d->pid, &st, WNOHANG) == d->pid) {
                done = 1;
                break;
            }
            usleep(10000);
        }
        if (!done) {
            fprintf(stderr, "harness: lnormd did not exit within %d ms of SIGTERM; killing\n",
                    timeout_ms);
            kill(d->pid, SIGKILL);
            waitpid(d->pid, &st, 0);
        } else if (WIFEXITED(st)) {
            result = WEXITSTATUS(st);
        }
        for (int i = 0; i < MAX_DAEMONS; i++)
            if (live[i] == d->pid)
                live[i] = 0;
        d->pid = 0;
    }
    if (d->dir[0])
        lnorm__rmdir(d->dir);
    d->dir[0] = 0;
    return result;
}
