/*
 * The assertion vocabulary of every test of lnormd (tests/README.md).
 *
 *   CHECK(cond, fmt, ...)           cond must hold; fmt says what was seen
 *   CHECK_EQ_INT(got, want, fmt, ...)  two integers must be equal (both printed)
 *   CHECK_FAIL(fmt, ...)            a failure with no condition to test
 *   check_failures()                failures so far (e.g. to dump a log)
 *   return check_finish("name");    main's last line: 0 if none failed, else 1
 *
 * A failed check prints "FAIL file:line: cond: message" on stderr and is
 * counted; it never aborts, so one run reports every failure. Checks may
 * run on any thread. After 100 printed failures the rest are only counted.
 */
#ifndef LNORM_TEST_CHECK_H
#define LNORM_TEST_CHECK_H

#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

void check_fail_at(const char *file, int line, const char *cond, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
void check_fail_eq_at(const char *file, int line, const char *got_expr, long long got, long long want,
                      const char *fmt, ...) __attribute__((format(printf, 6, 7)));

#define CHECK(cond, ...)                                                                                    \
    do {                                                                                                    \
        if (!(cond))                                                                                        \
            check_fail_at(__FILE__, __LINE__, #cond, __VA_ARGS__);                                          \
    } while (0)

#define CHECK_EQ_INT(got, want, ...)                                                                        \
    do {                                                                                                    \
        long long check_got_ = (long long)(got), check_want_ = (long long)(want);                           \
        if (check_got_ != check_want_)                                                                      \
            check_fail_eq_at(__FILE__, __LINE__, #got, check_got_, check_want_, __VA_ARGS__);                \
    } while (0)

#define CHECK_FAIL(...) check_fail_at(__FILE__, __LINE__, NULL, __VA_ARGS__)

/* The number of failed checks so far (every thread). */
int check_failures(void);

/* Print "name: passed" on stdout, or "name: N check(s) failed" on stderr;
 * returns main's exit status (0 or 1). */
int check_finish(const char *name);

#ifdef __cplusplus
}
#endif
#endif /* LNORM_TEST_CHECK_H */
