/*
 * bench.procs: lnorm-bench --procs 3 against a real lnormd (CPU backend)
 * and against its NNG echo baseline: one report whose totals are the sums
 * of the three processes' own numbers, the merged latency histogram
 * holding every measured reply, every reply verified, no errors. Then the
 * failures: a load process killed mid-point, and load processes that
 * cannot connect, each a clear error and a nonzero exit, in bounded time.
 * usage: procs_test LNORM_BENCH LNORMD
 */
#include <dirent.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "testdaemon.h"

static const char *bench;
static char dir[256];

/* Start lnorm-bench with args (NULL-terminated), output into file. */
static pid_t start_bench(const char *const *args, const char *file)
{
    const char *argv[64];
    int n = 0;
    argv[n++] = bench;
    for (int i = 0; args[i] && n < 63; i++)
        argv[n++] = args[i];
    argv[n] = NULL;
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (!freopen(file, "w", stdout) || dup2(fileno(stdout), 2) < 0)
            _exit(126);
        execv(bench, (char *const *)argv);
        _exit(127);
    }
    return pid;
}

/* Wait up to ms for pid: its exit status, or -1 (killed: it hung). */
static int wait_bench(pid_t pid, int ms)
{
    int st;
    for (int64_t end = td_now_ms() + ms; td_now_ms() < end; td_sleep_ms(10))
        if (waitpid(pid, &st, WNOHANG) == pid)
            return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    kill(pid, SIGKILL);
    waitpid(pid, &st, 0);
    return -1;
}

static char *slurp(const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return NULL;
    char *buf = calloc(1, 1 << 20);
    if (buf)
        buf[fread(buf, 1, (1 << 20) - 1, f)] = '\0';
    fclose(f);
    return buf;
}

/* The number after `"key": ` at or after from (before end, if given); -1. */
static long long num_after(const char *from, const char *end, const char *key, const char **next)
{
    char pat[80];
    snprintf(pat, sizeof pat, "\"%s\": ", key);
    const char *p = strstr(from, pat);
    if (!p || (end && p >= end))
        return -1;
    p += strlen(pat);
    if (next)
        *next = p;
    return strtoll(p, NULL, 10);
}

/* One run of the JSON ("target": "lnormd" or "echo"): the merged numbers
 * against the sums of its per_process entries. */
static void check_run(const char *run, const char *end, const char *target, int want_verified)
{
    long long req = num_after(run, end, "requests", NULL);
    long long started = num_after(run, end, "started", NULL);
    long long errors = num_after(run, end, "errors", NULL);
    long long procs = num_after(run, end, "procs", NULL);
    long long lat = num_after(run, end, "latency_count", NULL);
    long long checked = num_after(run, end, "checked", NULL);
    long long mism = num_after(run, end, "mismatches", NULL);
    CHECK_EQ_INT(procs, 3, "%s: procs in the row", target);
    CHECK(req > 0, "%s: requests %lld", target, req);
    CHECK_EQ_INT(errors, 0, "%s: errors", target);
    CHECK_EQ_INT(lat, req, "%s: merged histogram count == requests completed", target);
    if (want_verified) {
        CHECK_EQ_INT(checked, req, "%s: every reply verified", target);
        CHECK_EQ_INT(mism, 0, "%s: verify mismatches", target);
    }
    const char *pp = strstr(run, "\"per_process\": [");
    CHECK(pp && pp < end, "%s: per_process present", target);
    if (!pp || pp >= end)
        return;
    long long sreq = 0, sstarted = 0, slat = 0, sver = 0;
    int n = 0;
    const char *p = pp;
    for (const char *q; (q = strstr(p, "{\"requests\": ")) && q < end; n++) {
        sreq += num_after(q, end, "requests", NULL);
        sstarted += num_after(q, end, "started", NULL);
        slat += num_after(q, end, "latency_count", NULL);
        long long v = num_after(q, end, "verified", NULL);
        long long r = num_after(q, end, "requests", NULL);
        sver += v;
        CHECK(r > 0, "%s: process %d sent requests (%lld)", target, n + 1, r);
        p = q + 1;
    }
    CHECK_EQ_INT(n, 3, "%s: per_process entries", target);
    CHECK_EQ_INT(sreq, req, "%s: requests == sum over the processes", target);
    CHECK_EQ_INT(sstarted, started, "%s: started == sum over the processes", target);
    CHECK_EQ_INT(slat, lat, "%s: histogram counts add up", target);
    if (want_verified)
        CHECK_EQ_INT(sver, checked, "%s: verified == sum over the processes", target);
}

static void merged_report(const char *url)
{
    char json[320], out[320];
    snprintf(json, sizeof json, "%s/procs.json", dir);
    snprintf(out, sizeof out, "%s/procs.out", dir);
    /* --requests 900: 300 per process, all measured (no warm-up), all verified */
    const char *args[] = {"--url", url, "--procs", "3", "--concurrency", "6", "--requests", "900",
                          "--verify", "900", "--duration", "10", "--grace", "1", "--echo",
                          "--no-progress", "--json", json, NULL};
    int rc = wait_bench(start_bench(args, out), 30000);
    char *text = slurp(out);
    CHECK_EQ_INT(rc, 0, "lnorm-bench --procs 3 exit status; output:\n%s", text ? text : "");
    CHECK(text && strstr(text, "c=6/p3"), "the table names the process count");
    free(text);
    char *j = slurp(json);
    CHECK(j != NULL, "JSON written");
    if (!j)
        return;
    CHECK_EQ_INT(num_after(j, strstr(j, "\"runs\""), "procs", NULL), 3, "top-level procs");
    const char *a = strstr(j, "{\"target\": \"lnormd\"");
    const char *e = strstr(j, "{\"target\": \"echo\"");
    const char *ratios = strstr(j, "\"ratios_vs_echo\"");
    CHECK(a && e && ratios && a < e && e < ratios, "one lnormd and one echo run");
    if (a && e && ratios && a < e && e < ratios) {
        check_run(a, e, "lnormd", 1);
        check_run(e, ratios, "echo", 0);
        CHECK(strstr(ratios, "\"throughput_ratio\"") != NULL, "lnormd/echo ratio at the same procs");
    }
    free(j);
}

/* A load process of lnorm-bench `parent`: a child named lnorm-bench; 0. */
static pid_t find_child(pid_t parent)
{
    char path[300], buf[512];
    for (int tries = 0; tries < 300; tries++, td_sleep_ms(10)) {
        DIR *d = opendir("/proc");
        if (!d)
            return 0;
        pid_t found = 0;
        for (struct dirent *e; !found && (e = readdir(d));) {
            int pid = atoi(e->d_name);
            if (pid <= 0)
                continue;
            snprintf(path, sizeof path, "/proc/%d/stat", pid);
            FILE *f = fopen(path, "r");
            if (!f)
                continue;
            size_t n = fread(buf, 1, sizeof buf - 1, f);
            fclose(f);
            buf[n] = '\0';
            char *rp = strrchr(buf, ')');
            int ppid = 0;
            if (rp && sscanf(rp + 2, "%*c %d", &ppid) == 1 && ppid == parent && strstr(buf, "(lnorm-bench)"))
                found = pid;
        }
        closedir(d);
        if (found)
            return found;
    }
    return 0;
}

static void killed_child(const char *url)
{
    char out[320];
    snprintf(out, sizeof out, "%s/killed.out", dir);
    const char *args[] = {"--url", url, "--procs", "3", "--concurrency", "3", "--duration", "5",
                          "--warmup", "0", "--no-progress", NULL};
    int64_t t0 = td_now_ms();
    pid_t pid = start_bench(args, out);
    pid_t child = find_child(pid);
    CHECK(child > 0, "a load process of lnorm-bench %d found", (int)pid);
    if (child > 0) {
        td_sleep_ms(300);
        kill(child, SIGKILL);
    }
    int rc = wait_bench(pid, 20000);
    char *text = slurp(out);
    CHECK_EQ_INT(rc, 1, "exit status with a load process killed; output:\n%s", text ? text : "");
    CHECK(text && strstr(text, "killed by signal 9"), "the report says a load process was killed");
    CHECK(td_now_ms() - t0 < 15000, "no hang: ended in %lld ms", (long long)(td_now_ms() - t0));
    free(text);
}

static void unreachable(void)
{
    char out[320], url[320];
    snprintf(out, sizeof out, "%s/unreachable.out", dir);
    snprintf(url, sizeof url, "ipc://%s/nobody.sock", dir);
    const char *drivers[] = {"raw", "lib"};
    for (int k = 0; k < 2; k++) {
        const char *args[] = {"--url", url, "--procs", "2", "--concurrency", "2", "--duration", "0.5",
                              "--warmup", "0", "--grace", "0.5", "--timeout", "300", "--driver",
                              drivers[k], "--no-progress", NULL};
        int rc = wait_bench(start_bench(args, out), 20000);
        char *text = slurp(out);
        CHECK_EQ_INT(rc, drivers[k][0] == 'r' ? 1 : 3, "%s driver, nothing listening: exit status; output:\n%s",
                     drivers[k], text ? text : "");
        if (drivers[k][0] == 'r')
            CHECK(text && strstr(text, "load process 1 of 2: dial"), "raw: the dial failure is named");
        free(text);
    }
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: %s LNORM_BENCH LNORMD\n", argv[0]);
        return 2;
    }
    bench = argv[1];
    td_watchdog(100);
    if (td_tmpdir(dir, sizeof dir, "bench-procs") != 0) {
        CHECK_FAIL("no temporary folder");
        return check_finish("bench.procs");
    }
    td_daemon d;
    const char *dargs[] = {"--backend", "cpu", "--cpu-threads", "1", NULL};
    if (td_start(&d, argv[2], NULL, dargs, TD_ENDPOINTS) != 0) {
        CHECK_FAIL("lnormd did not start");
        return check_finish("bench.procs");
    }
    merged_report(d.ipc_url);
    killed_child(d.ipc_url);
    unreachable();
    td_stop_check(&d, "after the lnorm-bench runs");
    return check_finish("bench.procs");
}
