/*
 * Test harness: start a real lnormd on private endpoints (an ipc path in a
 * fresh temporary folder, tcp://127.0.0.1:0, --http 127.0.0.1:0), wait for
 * its ready file, and stop it (SIGTERM, then SIGKILL after a bound).
 */
#ifndef LNORM_TEST_HARNESS_H
#define LNORM_TEST_HARNESS_H

#include <sys/types.h>

typedef struct lnorm__daemon {
    pid_t pid;
    char dir[256];       /* private temporary folder */
    char ipc_url[600];   /* listen URL on ipc */
    char tcp_url[512];   /* listen URL on tcp, real port */
    char http[512];     /* host:port of the HTTP endpoint */
} lnorm__daemon;

/* Start lnormd at path with the harness endpoints plus extra arguments
 * (NULL-terminated, may be NULL). Waits up to timeout_ms for the ready
 * file. Returns 0, or -1 with a message on stderr. The daemon is killed
 * when the test process exits, whatever happens. */
int lnorm__daemon_start(lnorm__daemon *d, const char *path, const char *const *extra,
                        int timeout_ms);

/* Send SIGTERM and wait up to timeout_ms; SIGKILL after that. Returns the
 * daemon's exit status (0 for a clean exit), or -1 if it had to be killed
 * or died from a signal. Removes the temporary folder. */
int lnorm__daemon_stop(lnorm__daemon *d, int timeout_ms);

/* Make a fresh private temporary folder into buf (cap bytes); 0 or -1. */
int lnorm__tmpdir(char *buf, size_t cap);

/* Remove a folder made by lnorm__tmpdir and every file in it. */
void lnorm__rmdir(const char *dir);

/* Milliseconds of a monotonic clock. */
double lnorm__now_ms(void);

#endif /* LNORM_TEST_HARNESS_H */
