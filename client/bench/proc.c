/* Child processes: see proc.h. */
#include "proc.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

int lnorm__child_start(lnorm__child *c, char *const argv[], char *err, size_t errlen)
{
    unlink(c->ready_path);
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0) {
        snprintf(err, errlen, "fork: %s", strerror(errno));
        return -1;
    }
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGTERM);
        if (getppid() != parent)
            _exit(127);
        execv(argv[0], argv);
        fprintf(stderr, "lnorm-bench: exec %s: %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    c->pid = pid;
    return 0;
}

int lnorm__child_wait_ready(lnorm__child *c, int timeout_ms, char *err, size_t errlen)
{
    for (int waited = 0; waited <= timeout_ms; waited += 10) {
        int st;
        if (waitpid(c->pid, &st, WNOHANG) == c->pid) {
            c->pid = 0;
            snprintf(err, errlen, "child exited (status %d) before it was ready",
                     WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st));
            return -1;
        }
        FILE *f = fopen(c->ready_path, "r");
        if (f) {
            char line[600];
            int found = 0;
            size_t len = 0;
            while (fgets(line, sizeof line, f)) {
                if (!strncmp(line, "listen ", 7)) {
                    line[strcspn(line, "\r\n")] = '\0';
                    int m = snprintf(c->url + len, sizeof c->url - len, "%s%.500s", found ? "," : "", line + 7);
                    if (m < 0 || (size_t)m >= sizeof c->url - len)
                        break; /* the URLs that fit */
                    len += (size_t)m;
                    found = 1;
                }
            }
            fclose(f);
            if (found)
                return 0;
        }
        struct timespec ts = {0, 10000000};
        nanosleep(&ts, NULL);
    }
    snprintf(err, errlen, "no ready file %s after %d ms", c->ready_path, timeout_ms);
    return -1;
}

void lnorm__child_stop(lnorm__child *c)
{
    if (c->pid > 0) {
        kill(c->pid, SIGTERM);
        int st;
        int done = 0;
        for (int i = 0; i < 500 && !done; i++) {
            if (waitpid(c->pid, &st, WNOHANG) == c->pid)
                done = 1;
            else {
                struct timespec ts = {0, 10000000};
                nanosleep(&ts, NULL);
            }
        }
        if (!done) {
            kill(c->pid, SIGKILL);
            waitpid(c->pid, &st, 0);
        }
        c->pid = 0;
    }
    if (c->ready_path[0])
        unlink(c->ready_path);
}
