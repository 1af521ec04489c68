/*
 * The one way a test runs lnormd (tests/README.md): as a child process on
 * private endpoints (127.0.0.1 and ipc paths in a private temporary
 * folder), ready when its --ready-file appears, its stdout and stderr in a
 * log file. Every wait is bounded. Whatever happens, no daemon outlives
 * the test: each gets SIGKILL when the test exits or dies, and when the
 * test has failed checks (check.h) each daemon's log is printed at exit.
 *
 *   td_daemon d;
 *   if (td_start(&d, lnormd, NULL, args, TD_ENDPOINTS) != 0) ...;
 *   ... d.tcp_url, d.ipc_url, d.http ...
 *   td_stop_check(&d, "on SIGTERM");     // SIGTERM, exit status 0 checked
 */
#ifndef LNORM_TESTDAEMON_H
#define LNORM_TESTDAEMON_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#ifdef __cplusplus
extern "C" {
#endif

#define TD_MAX_LISTEN 8
#define TD_MAX_ARGS 48

/* td_start's flags. */
enum {
    /* Add --listen ipc://DIR/lnormd.sock --listen tcp://127.0.0.1:0. */
    TD_ENDPOINTS = 1,
    /* Add no --http (lnormd's default applies). Without it, --http
     * 127.0.0.1:0 is added unless args hold --http. */
    TD_DEFAULT_HTTP = 2,
};

typedef struct td_daemon {
    pid_t pid;                       /* 0 when not running */
    int status;                      /* wait status once it exited, -1 if it had to be killed */
    char dir[256];                   /* its private temporary folder */
    char ready[320];                 /* DIR/ready-N */
    char log[320];                   /* DIR/lnormd-N.log: stdout + stderr */
    int nlisten;
    char listen[TD_MAX_LISTEN][320]; /* the ready file's "listen" URLs */
    char ipc_url[320];               /* the first ipc:// one, or "" */
    char tcp_url[320];               /* the first tcp:// one, or "" */
    char tls_url[320];               /* the first tls+tcp:// one, or "" */
    char http[320];                  /* host:port of the HTTP endpoint, or "" */
    /* what td_restart starts again */
    char lnormd[512];
    unsigned flags;
    int nargs;
    char *args[TD_MAX_ARGS];         /* pointing into argbuf */
    char argbuf[4096];
} td_daemon;

/* Start lnormd (the path) with args (NULL-terminated, may be NULL) plus
 * --ready-file and what flags ask for, in dir (NULL: a fresh private
 * folder, removed when the test exits). Waits up to 20 s for the ready
 * file: 0 when serving; -1 when it exited first (d->status says how) or was
 * not ready in time (then killed), with its log printed. */
int td_start(td_daemon *d, const char *lnormd, const char *dir, const char *const *args, unsigned flags);

/* Start a stopped daemon again: same path, folder, arguments and flags
 * (a new ready file and log). As td_start. */
int td_restart(td_daemon *d);

/* Send sig (0: none, e.g. when it was already sent) and wait up to
 * timeout_ms for the exit. Returns the wait status, or -1 when it did not
 * exit in time (it is then killed with SIGKILL and reaped). A daemon that
 * is not running gives the status it exited with. */
int td_stop(td_daemon *d, int sig, int timeout_ms);

/* SIGTERM, wait up to 20 s, and check that it exited with status 0
 * (naming what, and any sanitizer report in its log, when not). */
void td_stop_check(td_daemon *d, const char *what);

/* Check a wait status from td_stop is "exited 0" (as td_stop_check). */
void td_check_exit0(const td_daemon *d, int status, const char *what);

/* Send a signal (if running). */
void td_signal(td_daemon *d, int sig);

/* 1 while the process is alive; 0 once it exited (it is then reaped). */
int td_alive(td_daemon *d);

/* Resident set size in KiB, or -1. */
long td_rss_kb(const td_daemon *d);

/* The first listen URL that starts with prefix, or NULL. */
const char *td_url(const td_daemon *d, const char *prefix);

/* 1 when the log holds needle (now, or within timeout_ms). */
int td_log_contains(const td_daemon *d, const char *needle);
int td_wait_log(const td_daemon *d, const char *needle, int timeout_ms);

/* GET path from the HTTP endpoint (10 s at most): the body (malloc'ed,
 * NUL-terminated) or NULL; *status the HTTP status (0: none). */
char *td_http_get(const td_daemon *d, const char *path, int *status);

/* The value of the /metrics line "name value" (name with its labels, as
 * lnormd_requests_total{status="OK"}), or -1 when absent. */
double td_metric(const td_daemon *d, const char *name);

/* Poll td_metric until it reads want (timeout_ms at most); the last value. */
double td_wait_metric(const td_daemon *d, const char *name, double want, int timeout_ms);

/* Print the last 8 KiB of the log on stderr. */
void td_dump_log(const td_daemon *d);

/* Run lnormd with args to its end (for command-line tests); its stdout and
 * stderr go to out (NUL-terminated, at most outlen bytes). Returns the
 * exit status, or -1 when it did not exit normally within 20 s. */
int td_run(const char *lnormd, const char *const *args, char *out, size_t outlen);

/* After secs, kill every daemon and exit 1 (a test that hangs). */
void td_watchdog(int secs);

/* What the test is doing now (a string that outlives the test, or NULL),
 * printed by the watchdog when it fires. */
void td_watchdog_note(const char *where);

/* A test's arguments: argc must be nargs (argv[0] included), else
 * "usage: PROG USAGE" goes to stderr. 1 when they are right, else 0 (the
 * test then exits 2). */
int td_usage(int argc, char **argv, int nargs, const char *usage);

/* A private (0700) temporary folder under $TMPDIR (or /tmp), named after
 * tag, removed when the test exits; 0 or -1. */
int td_tmpdir(char *out, size_t n, const char *tag);

/* The path of a file NAME in a new td_tmpdir folder (tag), in path (n
 * bytes); 0, or -1 after a CHECK_FAIL. */
int td_tmpfile(char *path, size_t n, const char *tag, const char *name);

/* Remove the files in dir (not recursively) and dir itself. */
void td_rmdir(const char *dir);

/* Milliseconds of a monotonic clock; a sleep that resumes after signals. */
int64_t td_now_ms(void);
void td_sleep_ms(int ms);

#ifdef __cplusplus
}
#endif
#endif /* LNORM_TESTDAEMON_H */
