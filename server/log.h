/* Level-filtered log lines on stderr with timestamps. The level is checked
 * before any formatting happens. */
#ifndef LNORM_SERVER_LOG_H
#define LNORM_SERVER_LOG_H

#include <stdatomic.h>

enum { LNORM__LOG_ERROR = 0, LNORM__LOG_WARN = 1, LNORM__LOG_INFO = 2, LNORM__LOG_DEBUG = 3 };

extern atomic_int lnorm__log_level;

void lnorm__log_write(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* The level for a name ("error", "warn", "info", "debug"), or -1. */
int lnorm__log_level_parse(const char *name);
const char *lnorm__log_level_name(int level);

#define lnorm__log(level, ...)                                                    \
    do {                                                                          \
        if ((level) <= atomic_load_explicit(&lnorm__log_level, memory_order_relaxed)) \
            lnorm__log_write((level), __VA_ARGS__);                               \
    } while (0)

#define LOG_ERROR(...) lnorm__log(LNORM__LOG_ERROR, __VA_ARGS__)
#define LOG_WARN(...) lnorm__log(LNORM__LOG_WARN, __VA_ARGS__)
#define LOG_INFO(...) lnorm__log(LNORM__LOG_INFO, __VA_ARGS__)
#define LOG_DEBUG(...) lnorm__log(LNORM__LOG_DEBUG, __VA_ARGS__)

#endif
