/*
 * Fault-test harness: runs lnormd as a child process per the daemon's
 * command-line contract (--listen, --http, --ready-file, ...), in a private
 * temporary directory, and watches it (RSS, exit status, log).
 *
 * Every daemon the harness starts listens only on 127.0.0.1 or on ipc paths
 * inside its private directory, and every wait is bounded in time.
 */
#ifndef LNORM_FAULT_HARNESS_H
#define LNORM_FAULT_HARNESS_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define FH_MAX_LISTEN 8

typedef struct fh_daemon {
    pid_t pid;                       /* 0 when not running */
    char dir[256];                   /* private temp dir (the caller's) */
    char ready[320];                 /* dir/ready-N */
    char log[320];                   /* dir/lnormd-N.log: stdout + stderr */
    int nlisten;
    char listen[FH_MAX_LISTEN][512]; /* "listen" lines of the ready file */
    char http[512];                  /* "http" line: host:port, or "" */
} fh_daemon;

/* Monotonic milliseconds. */
int64_t fh_now_ms(void);

/* Sleep for ms milliseconds. */
void fh_sleep_ms(int ms);

/* Make a private (0700) temporary directory; out gets its path. 0 or -1. */
int fh_mkdtemp(char *out, size_t n, const char *tag);

/* Remove every entry of dir (not recursive) and dir itself. */
void fh_rmdir(const char *dir);

/* When set, fh_daemon_start adds no --http (the daemon's default applies). */
extern int fh_keep_default_http;

/* Start lnormd (path) with args (NULL-terminated) plus --ready-file, and
 * --http 127.0.0.1:0 unless args hold --http (or fh_keep_default_http). dir must be a private temp
 * dir. Waits up to timeout_ms for the ready file; 0 when serving, -1 (and
 * the log printed) if it exited or timed out (then it is killed). */
int fh_daemon_start(fh_daemon *d, const char *lnormd, const char *dir,
                    const char *const *args, int timeout_ms);

/* The first listen URL that starts with prefix ("tcp://", "ipc://",
 * "tls+tcp://"), or NULL. */
const char *fh_daemon_url(const fh_daemon *d, const char *prefix);

/* Send sig, then wait up to timeout_ms for the exit. Returns the wait
 * status (as waitpid), or -1 if it did not exit in time (it is then killed
 * with SIGKILL and reaped). */
int fh_daemon_stop(fh_daemon *d, int sig, int timeout_ms);

/* 1 while the daemon process is alive (not exited), else 0 (reaps it). */
int fh_daemon_alive(fh_daemon *d);

/* Resident set size of a process in KiB, from /proc/PID/status; -1 on error. */
long fh_rss_kb(pid_t pid);

/* Check a wait status from fh_daemon_stop is "exited 0"; otherwise count a
 * failure naming what (and any sanitizer report found in the log). */
void fh_check_exit0(const fh_daemon *d, int status, const char *what);

/* Print the last bytes of the daemon's log to stderr (for failures). */
void fh_daemon_dump_log(const fh_daemon *d);

/* Test bookkeeping: FH_CHECK prints and counts a failure, never aborts. */
extern int fh_failures;
#define FH_CHECK(cond, ...)                                                  \
    do {                                                                     \
        if (!(cond)) {                                                       \
            fh_failures++;                                                   \
            fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);  \
            fprintf(stderr, __VA_ARGS__);                                    \
            fputc('\n', stderr);                                             \
        }                                                                    \
    } while (0)

/* Print the harness's view of a test's end and return its exit code. */
int fh_finish(const char *name);

#endif /* LNORM_FAULT_HARNESS_H */
