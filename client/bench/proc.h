/*
 * Child processes of lnorm-bench (a spawned lnormd, the echo server): start
 * with a private ready file, wait until it names the listen URL, stop.
 */
#ifndef LNORM_BENCH_PROC_H
#define LNORM_BENCH_PROC_H

#include <stddef.h>
#include <sys/types.h>

typedef struct lnorm__child {
    pid_t pid;
    char ready_path[256];
    char url[4096];     /* the "listen" lines of the ready file, comma-separated
                           (one per worker of lnormd --workers) */
} lnorm__child;

/* Start argv[0] with argv (NULL-terminated), the child dying with us.
 * Returns 0 or -1 (message in err). */
int lnorm__child_start(lnorm__child *c, char *const argv[], char *err, size_t errlen);

/* Wait up to timeout_ms for c->ready_path to exist with "listen" lines;
 * fills c->url. Returns 0, or -1 if it timed out or the child exited. */
int lnorm__child_wait_ready(lnorm__child *c, int timeout_ms, char *err, size_t errlen);

/* SIGTERM, wait up to 5 s, then SIGKILL; removes the ready file. */
void lnorm__child_stop(lnorm__child *c);

#endif /* LNORM_BENCH_PROC_H */
