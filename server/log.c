/* Log lines: "YYYY-MM-DDTHH:MM:SS.mmmZ lnormd[pid] LEVEL message" (UTC). */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "log.h"

atomic_int lnorm__log_level = LNORM__LOG_INFO;

static const char *const lnorm__level_names[] = {"error", "warn", "info", "debug"};

int lnorm__log_level_parse(const char *name)
{
    for (int i = 0; i < 4; i++)
        if (strcmp(name, lnorm__level_names[i]) == 0)
            return i;
    return -1;
}

const char *lnorm__log_level_name(int level)
{
    return level >= 0 && level < 4 ? lnorm__level_names[level] : "?";
}

void lnorm__log_write(int level, const char *fmt, ...)
{
    static const char *const tags[] = {"ERROR", "WARN", "INFO", "DEBUG"};
    char line[1024];
    struct timeval tv;
    struct tm tm;
    gettimeofday(&tv, NULL);
    gmtime_r(&tv.tv_sec, &tm);
    int n = snprintf(line, sizeof line, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ lnormd[%d] %s ",
                     tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min,
                     tm.tm_sec, (int)(tv.tv_usec / 1000), (int)getpid(),
                     tags[level < 0 ? 0 : level > 3 ? 3 : level]);
    va_list ap;
    va_start(ap, fmt);
    int m = vsnprintf(line + n, sizeof line - (size_t)n - 1, fmt, ap);
    va_end(ap);
    size_t len = (size_t)n + (m < 0 ? 0 : (size_t)m);
    if (len > sizeof line - 2)
        len = sizeof line - 2;
    line[len++] = '\n';
    /* One write per line: lines from several threads never interleave. */
    ssize_t w = write(STDERR_FILENO, line, len);
    (void)w;
}
