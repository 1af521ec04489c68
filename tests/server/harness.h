/*
 * Test harness for lnormd: start the daemon on a private ipc path +
 * tcp://127.0.0.1:0 + --http 127.0.0.1:0 with --ready-file, wait for it,
 * stop it (SIGTERM, then SIGKILL after a bound), and talk to it with raw
 * NNG req0 + protobuf-c. A watchdog (alarm) ends any test that hangs.
 */
#ifndef LNORM_TEST_SERVER_HARNESS_H
#define LNORM_TEST_SERVER_HARNESS_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include <nng/nng.h>

#include "lnorm.pb-c.h"
#include "lnorm_core.h"
#include "testcase.h"
#include "testutil.h"

#define TS_MAX_ARGS 48

typedef struct ts_daemon {
    pid_t pid;
    char dir[256];
    char ready[300];
    char log[300];
    char ipc_url[320];
    char tcp_url[320];
    char tls_url[320];  /* when a tls+tcp:// listener was asked for */
    char http[256];     /* host:port */
} ts_daemon;

extern int ts_failures;

#define TS_CHECK(cond, ...)                                                         \
    do {                                                                            \
        if (!(cond)) {                                                              \
            ts_failures++;                                                          \
            fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);         \
            fprintf(stderr, __VA_ARGS__);                                           \
            fputc('\n', stderr);                                                    \
        }                                                                           \
    } while (0)

/* Arm the watchdog: after secs, kill every daemon started and exit 1. */
void ts_watchdog(int secs);

/* Start lnormd with extra args (NULL-terminated list). 0 or -1. */
int ts_start(ts_daemon *d, const char *lnormd, const char *const *extra);
/* SIGTERM and wait (at most 15 s, then SIGKILL). Returns the exit status
 * (0..255), or -1 when it had to be killed or died of a signal. */
int ts_stop(ts_daemon *d);
/* Send a signal. */
void ts_signal(ts_daemon *d, int sig);
/* Print the daemon's log to stderr (on failure). */
void ts_dump_log(ts_daemon *d);

/* Run lnormd to completion with args (for config tests); stdout+stderr go
 * to out (up to outlen). Returns the exit status or -1. */
int ts_run(const char *lnormd, const char *const *args, char *out, size_t outlen);

/* A req0 socket dialed to url (recv timeout 20 s). */
int ts_dial(nng_socket *s, const char *url);
/* A req0 socket dialed over TLS: trust ca, present cert/key when given
 * (NULL: none), recv timeout ms. 0, or -1 when the dial fails. */
int ts_dial_tls(nng_socket *s, const char *url, const char *ca, const char *cert, const char *key, int timeout_ms);
/* Send raw bytes, receive and unpack the reply (NULL on error). */
Lnorm__V1__Response *ts_call_raw(nng_socket s, const void *buf, size_t len);
/* Pack req, then as ts_call_raw. */
Lnorm__V1__Response *ts_call(nng_socket s, const Lnorm__V1__Request *req);
/* The reply's status code (0 when status absent). */
int ts_code(const Lnorm__V1__Response *r);
const char *ts_msg(const Lnorm__V1__Response *r);

/* HTTP GET path on host:port; body (malloc'ed, NUL-terminated) or NULL;
 * *status set to the HTTP status. */
char *ts_http_get(const char *hostport, const char *path, int *status);
/* The value of a metric line "name value" in /metrics (exact name incl.
 * labels), or -1 when absent. */
double ts_metric(const char *hostport, const char *name);

/* A Normalize request for a test case (the request points into tc). */
typedef struct ts_norm {
    Lnorm__V1__Request req;
    Lnorm__V1__NormalizeRequest n;
    Lnorm__V1__Affine aff;
} ts_norm;
void ts_norm_from_case(ts_norm *m, const lnorm_test_case *tc, uint64_t id, int inline_params);

/* Check a Normalize reply against the float64 reference (lnorm_test_check)
 * and bit-for-bit against lnorm_cpu_run_segment on the same inputs.
 * Returns the number of problems (0: good). */
long ts_check_reply(const lnorm_test_case *tc, const Lnorm__V1__Response *r, const char *label);

#endif
