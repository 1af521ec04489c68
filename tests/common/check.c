/* The assertion vocabulary of the tests (see check.h). */
#include "check.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <string.h>

enum { MAX_PRINTED = 100 };

static atomic_int g_failures;

/* Count one failure and print it in one write (threads do not interleave). */
static void report(const char *file, int line, const char *what, const char *fmt, va_list ap)
{
    int n = atomic_fetch_add(&g_failures, 1);
    if (n > MAX_PRINTED)
        return;
    char buf[1024];
    if (n == MAX_PRINTED) {
        snprintf(buf, sizeof buf, "FAIL: more than %d failures; the rest are only counted\n", MAX_PRINTED);
    } else {
        int k = snprintf(buf, sizeof buf, "FAIL %s:%d: %s%s", file, line, what ? what : "", what ? ": " : "");
        if (k < 0 || (size_t)k >= sizeof buf)
            k = 0;
        vsnprintf(buf + k, sizeof buf - (size_t)k, fmt, ap);
        size_t len = strlen(buf);
        if (len + 1 < sizeof buf) {
            buf[len] = '\n';
            buf[len + 1] = 0;
        }
    }
    fputs(buf, stderr);
}

void check_fail_at(const char *file, int line, const char *cond, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    report(file, line, cond, fmt, ap);
    va_end(ap);
}

void check_fail_eq_at(const char *file, int line, const char *got_expr, long long got, long long want,
                      const char *fmt, ...)
{
    char what[256];
    snprintf(what, sizeof what, "%s is %lld, want %lld", got_expr, got, want);
    va_list ap;
    va_start(ap, fmt);
    report(file, line, what, fmt, ap);
    va_end(ap);
}

int check_failures(void)
{
    return atomic_load(&g_failures);
}

int check_finish(const char *name)
{
    int n = check_failures();
    if (n) {
        fprintf(stderr, "%s: %d check(s) failed\n", name, n);
        return 1;
    }
    printf("%s: passed\n", name);
    return 0;
}
