/*
 * fault.soak (30 s in ctest) and bench/soak/run.sh (5 min): full load from
 * several clients, zero errors, bounded memory.
 *
 *   fault_soak LNORMD [--seconds N] [--clients-per-url K] [--json PATH]
 *
 * lnormd listens on tcp://127.0.0.1:0 and an ipc path in a private temp
 * dir; K clients on each (default 2) send normalize requests back to back
 * (tcp: 32 x 1024 f32, ipc: 8 x 4096 f32, LayerNorm and RMSNorm
 * alternating) and check every reply against a float64 reference. RSS is
 * sampled every 250 ms. Warm-up is the first 20% of the run (at least
 * 5 s). Checks: zero wrong replies and zero transport errors; RSS at the end
 * is within 5% of RSS at the end of warm-up, with a floor of 1 MiB of
 * slack (on a 7 MiB daemon 5% is 350 KiB, inside glibc's own arena
 * jitter: a 30 s run cannot tell that from a leak, while a leak of one
 * reply per request would grow RSS by hundreds of MiB here); the growth in
 * percent is printed and written to the JSON (the 5-minute
 * bench/soak/run.sh figure is in docs/security.md). lnormd exits 0 on SIGTERM.
 * With --json, the figures are written there (bench/results/soak-*.json).
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>

#include "check.h"
#include "testdaemon.h"
#include "loadgen.h"

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s LNORMD [--seconds N] [--clients-per-url K] [--json PATH]\n", argv[0]);
        return 2;
    }
    int seconds = 30, k = 2;
    const char *json = NULL;
    for (int i = 2; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--seconds"))
            seconds = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--clients-per-url"))
            k = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--json"))
            json = argv[i + 1];
    }
    if (seconds < 10 || seconds > 3600 || k < 1 || k > 64) {
        fprintf(stderr, "soak: --seconds 10..3600, --clients-per-url 1..64\n");
        return 2;
    }
    const char *args[] = {"--backend", "cpu", NULL};
    td_daemon d;
    if (td_start(&d, argv[1], NULL, args, TD_ENDPOINTS) != 0)
        return 1;
    const char *tcp = d.tcp_url, *ipcu = d.ipc_url;
    fl_load *a = fl_start(tcp, k, 32, 1024, 10000);
    fl_load *b = fl_start(ipcu, k, 8, 4096, 10000);
    int64_t t0 = td_now_ms(), end = t0 + (int64_t)seconds * 1000;
    int64_t warm = t0 + (seconds * 1000 / 5 > 5000 ? seconds * 1000 / 5 : 5000);
    long rss_warm = -1, rss_max = 0, rss_end = -1, rss_peak_warmup = 0;
    int64_t next_report = t0 + 5000;
    while (td_now_ms() < end) {
        td_sleep_ms(250);
        long r = td_rss_kb(&d);
        if (r < 0) {
            CHECK_FAIL("lnormd is gone (RSS unreadable) after %lld ms", (long long)(td_now_ms() - t0));
            break;
        }
        if (rss_warm < 0) {
            if (r > rss_peak_warmup)
                rss_peak_warmup = r;
            if (td_now_ms() >= warm)
                rss_warm = r;
        } else if (r > rss_max) {
            rss_max = r;
        }
        rss_end = r;
        if (td_now_ms() >= next_report) {
            fl_stats sa, sb;
            fl_peek(a, &sa);
            fl_peek(b, &sb);
            printf("soak: t=%3llds ok %ld errors %ld rss %ld KiB\n", (long long)((td_now_ms() - t0) / 1000),
                   sa.ok + sb.ok, sa.wrong + sa.failed + sb.wrong + sb.failed, r);
            next_report += 5000;
        }
    }
    fl_stats sa, sb;
    fl_stop(a, &sa);
    fl_stop(b, &sb);
    double secs = (double)(td_now_ms() - t0) / 1000.0;
    long ok = sa.ok + sb.ok, errors = sa.wrong + sa.failed + sb.wrong + sb.failed;
    double growth = rss_warm > 0 ? 100.0 * (double)(rss_end - rss_warm) / (double)rss_warm : 100.0;
    int64_t max_ms = sa.max_ms > sb.max_ms ? sa.max_ms : sb.max_ms;
    printf("soak: %.1f s, %d+%d clients, %ld correct replies (%.0f/s), %ld errors, slowest %lld ms; "
           "RSS KiB: warm-up peak %ld, after warm-up %ld, max %ld, end %ld (growth %.2f%%)\n",
           secs, k, k, ok, ok / secs, errors, (long long)max_ms, rss_peak_warmup, rss_warm, rss_max,
           rss_end, growth);
    if (sa.first_problem[0])
        fprintf(stderr, "soak: tcp clients: %s\n", sa.first_problem);
    if (sb.first_problem[0])
        fprintf(stderr, "soak: ipc clients: %s\n", sb.first_problem);
    CHECK(errors == 0, "%ld errors under load", errors);
    CHECK(ok > 0, "no correct replies");
#if defined(__SANITIZE_ADDRESS__)
    /* ASan's quarantine of freed blocks makes RSS meaningless here;
     * LeakSanitizer checks lnormd's exit (non-zero on a leak) instead. */
    printf("soak: ASan build: RSS not judged; LeakSanitizer runs at lnormd's exit\n");
#else
    long slack_kb = rss_warm / 20 > 1024 ? rss_warm / 20 : 1024;
    CHECK(rss_warm > 0 && rss_end - rss_warm < slack_kb,
          "RSS grew %.2f%% after warm-up (%ld -> %ld KiB; allowed %ld KiB)", growth, rss_warm, rss_end,
          slack_kb);
#endif
    int st = td_stop(&d, SIGTERM, 20000);
    td_check_exit0(&d, st, "on SIGTERM after the soak");
    if (json) {
        FILE *f = fopen(json, "w");
        if (f) {
            char date[32];
            time_t now = time(NULL);
            strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", gmtime(&now));
            fprintf(f,
                    "{\n  \"date\": \"%s\",\n  \"seconds\": %.1f,\n  \"clients\": {\"tcp\": %d, \"ipc\": %d},\n"
                    "  \"requests\": {\"tcp\": \"32x1024 f32\", \"ipc\": \"8x4096 f32\"},\n"
                    "  \"correct_replies\": %ld,\n  \"replies_per_second\": %.1f,\n  \"errors\": %ld,\n"
                    "  \"slowest_ms\": %lld,\n  \"rss_kib\": {\"warmup_peak\": %ld, \"after_warmup\": %ld, "
                    "\"max\": %ld, \"end\": %ld},\n  \"rss_growth_pct\": %.2f,\n  \"exit_status\": %d,\n"
                    "  \"pass\": %s\n}\n",
                    date, secs, k, k, ok, ok / secs, errors, (long long)max_ms, rss_peak_warmup, rss_warm,
                    rss_max, rss_end, growth, st, check_failures() ? "false" : "true");
            fclose(f);
            printf("soak: wrote %s\n", json);
        } else {
            perror(json);
        }
    }
    return check_finish("fault.soak");
}
