/* Table, JSON and CSV writers: see report.h. (The SVG is in plot.c.) */
#include "report.h"

#include <math.h>
#include <unistd.h>
#include <string.h>

const lnorm__runres *lnorm__report_echo_peer(const lnorm__report *rp, size_t i)
{
    const lnorm__runres *a = &rp->runs[i];
    if (strcmp(a->label, "echo") == 0)
        return NULL;
    for (size_t j = 0; j < rp->n; j++) {
        const lnorm__runres *b = &rp->runs[j];
        if (strcmp(b->label, "echo") == 0 && b->open_loop == a->open_loop && b->procs == a->procs &&
            (a->open_loop ? b->rate == a->rate : b->concurrency == a->concurrency))
            return b;
    }
    return NULL;
}

static void load_str(const lnorm__runres *r, char *buf, size_t n)
{
    int l = r->open_loop ? snprintf(buf, n, "rate=%.0f", r->rate) : snprintf(buf, n, "c=%d", r->concurrency);
    if (r->procs > 1 && l > 0 && (size_t)l < n)
        snprintf(buf + l, n - (size_t)l, "/p%d", r->procs);
}

static double us(uint64_t ns)
{
    return (double)ns / 1e3;
}

void lnorm__report_table(const lnorm__report *rp, FILE *o)
{
    fprintf(o, "lnorm-bench  %s  device: %s (%ld CPUs online)  url: %s\n", rp->date, rp->device,
            sysconf(_SC_NPROCESSORS_ONLN), rp->url);
    fprintf(o, "workload: %s  params=%s stats=%d residual=%d\n", rp->workload, rp->params,
            rp->stats, rp->residual);
    if (rp->procs > 1)
        fprintf(o, "load from %d processes (/pN): their shares summed, latencies from the summed histograms\n",
                rp->procs);
    fprintf(o, "%-7s %-4s %-10s %9s %6s %10s %11s %7s %9s %9s %9s %9s %9s %8s %8s %6s\n",
            "target", "drv", "load", "ok", "errors", "req/s", "rows/s", "GB/s", "p50 us",
            "p90 us", "p99 us", "p99.9 us", "max us", "srvq us", "comp us", "batch");
    for (size_t i = 0; i < rp->n; i++) {
        const lnorm__runres *r = &rp->runs[i];
        char load[32];
        load_str(r, load, sizeof load);
        if (r->error[0]) {
            fprintf(o, "%-7s %-4s %-10s  failed: %s\n", r->label, r->driver, load, r->error);
            continue;
        }
        char q[16] = "-", c[16] = "-", b[16] = "-";
        if (r->srv_n) {
            snprintf(q, sizeof q, "%.1f", r->srv_queue_us);
            snprintf(c, sizeof c, "%.1f", r->srv_compute_us);
            snprintf(b, sizeof b, "%.1f", r->batch_requests);
        }
        fprintf(o, "%-7s %-4s %-10s %9llu %6llu %10.0f %11.0f %7.3f %9.1f %9.1f %9.1f %9.1f %9.1f %8s %8s %6s\n",
                r->label, r->driver, load, (unsigned long long)r->ok,
                (unsigned long long)r->errors, r->rps, r->rows_ps, r->gbps, us(r->p50_ns),
                us(r->p90_ns), us(r->p99_ns), us(r->p999_ns), us(r->max_ns), q, c, b);
        if (r->errors) {
            fprintf(o, "        errors:");
            for (int k = 1; k < LNORM__EK_N; k++)
                if (r->err_by[k])
                    fprintf(o, " %s=%llu", lnorm__ek_name(k), (unsigned long long)r->err_by[k]);
            fprintf(o, "\n");
        }
        if (r->verified)
            fprintf(o, "        verified %llu replies against the f64 reference: %llu mismatch(es)%s%s\n",
                    (unsigned long long)r->verified, (unsigned long long)r->mismatches,
                    r->first_mismatch[0] ? "; first: " : "", r->first_mismatch);
        if (r->server_cpu_us_per_req >= 0 || r->client_cpu_us_per_req >= 0) {
            fprintf(o, "        CPU per request:");
            if (r->server_cpu_us_per_req >= 0)
                fprintf(o, " server %.1f us", r->server_cpu_us_per_req);
            if (r->client_cpu_us_per_req >= 0)
                fprintf(o, " lnorm-bench %.1f us", r->client_cpu_us_per_req);
            fprintf(o, "\n");
        }
        if (r->backlogged)
            fprintf(o, "        %llu sends waited for a free slot (in-flight limit)\n",
                    (unsigned long long)r->backlogged);
    }
    for (size_t i = 0; i < rp->n; i++) {
        const lnorm__runres *e = lnorm__report_echo_peer(rp, i), *r = &rp->runs[i];
        if (!e || e->rps <= 0 || r->error[0])
            continue;
        char load[32];
        load_str(r, load, sizeof load);
        fprintf(o, "ratio %s/echo at %s: throughput %.3f, p50 latency %.3f, p99 latency %.3f",
                r->label, load, r->rps / e->rps, e->p50_ns ? (double)r->p50_ns / (double)e->p50_ns : 0,
                e->p99_ns ? (double)r->p99_ns / (double)e->p99_ns : 0);
        if (r->server_cpu_us_per_req > 0 && e->server_cpu_us_per_req > 0)
            fprintf(o, ", server CPU per request %.2f", r->server_cpu_us_per_req / e->server_cpu_us_per_req);
        fprintf(o, "\n");
    }
}

static void json_str(FILE *f, const char *s)
{
    fputc('"', f);
    for (; s && *s; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\')
            fprintf(f, "\\%c", ch);
        else if (ch < 0x20)
            fprintf(f, "\\u%04x", ch);
        else
            fputc(ch, f);
    }
    fputc('"', f);
}

static void json_num(FILE *f, double v)
{
    if (isfinite(v))
        fprintf(f, "%.6g", v);
    else
        fprintf(f, "null");
}

/* --procs: each load process's own numbers, to see the shares add up. */
static void json_parts(FILE *f, const lnorm__runres *r)
{
    fprintf(f, ",\n     \"per_process\": [");
    for (int i = 0; i < r->procs; i++) {
        const lnorm__runres *p = &r->parts[i];
        fprintf(f, "%s\n       {\"requests\": %llu, \"started\": %llu, \"errors\": %llu, "
                   "\"latency_count\": %llu, \"verified\": %llu, \"mismatches\": %llu, \"requests_per_s\": ",
                i ? "," : "", (unsigned long long)p->ok, (unsigned long long)p->started,
                (unsigned long long)p->errors, (unsigned long long)p->lat_count,
                (unsigned long long)p->verified, (unsigned long long)p->mismatches);
        json_num(f, p->rps);
        fprintf(f, ", \"elapsed_s\": ");
        json_num(f, p->elapsed_s);
        fprintf(f, ", \"p50_us\": ");
        json_num(f, us(p->p50_ns));
        fprintf(f, ", \"p99_us\": ");
        json_num(f, us(p->p99_ns));
        fprintf(f, "}");
    }
    fprintf(f, "]");
}

int lnorm__report_json(const lnorm__report *rp, const char *path)
{
    FILE *f = fopen(path, "w");
    if (!f)
        return -1;
    fprintf(f, "{\n  \"tool\": \"lnorm-bench\",\n  \"date\": ");
    json_str(f, rp->date);
    fprintf(f, ",\n  \"device\": ");
    json_str(f, rp->device);
    fprintf(f, ",\n  \"commit\": ");
    json_str(f, rp->commit);
    fprintf(f, ",\n  \"cpus_online\": %ld", sysconf(_SC_NPROCESSORS_ONLN));
    fprintf(f, ",\n  \"procs\": %d", rp->procs > 0 ? rp->procs : 1);
    fprintf(f, ",\n  \"host\": ");
    json_str(f, rp->host);
    fprintf(f, ",\n  \"command\": ");
    json_str(f, rp->cmdline);
    fprintf(f, ",\n  \"url\": ");
    json_str(f, rp->url);
    fprintf(f, ",\n  \"workload\": {\"mix\": ");
    json_str(f, rp->workload);
    fprintf(f, ", \"params\": ");
    json_str(f, rp->params);
    fprintf(f, ", \"stats\": %s, \"residual\": %s, \"duration_s\": ", rp->stats ? "true" : "false",
            rp->residual ? "true" : "false");
    json_num(f, rp->duration_s);
    fprintf(f, ", \"warmup_s\": ");
    json_num(f, rp->warmup_s);
    fprintf(f, "},\n  \"tags\": {");
    for (size_t i = 0; i < rp->ntags; i++) {
        const char *eq = strchr(rp->tags[i], '=');
        char key[128];
        snprintf(key, sizeof key, "%.*s", eq ? (int)(eq - rp->tags[i]) : (int)strlen(rp->tags[i]),
                 rp->tags[i]);
        fprintf(f, "%s", i ? ", " : "");
        json_str(f, key);
        fprintf(f, ": ");
        json_str(f, eq ? eq + 1 : "");
    }
    fprintf(f, "},\n  \"runs\": [");
    for (size_t i = 0; i < rp->n; i++) {
        const lnorm__runres *r = &rp->runs[i];
        fprintf(f, "%s\n    {\"target\": ", i ? "," : "");
        json_str(f, r->label);
        fprintf(f, ", \"driver\": ");
        json_str(f, r->driver);
        fprintf(f, ", \"mode\": \"%s\", \"procs\": %d, ", r->open_loop ? "open" : "closed",
                r->procs > 0 ? r->procs : 1);
        if (r->open_loop) {
            fprintf(f, "\"offered_rate\": ");
            json_num(f, r->rate);
            fprintf(f, ", \"max_in_flight\": %d", r->concurrency);
        } else {
            fprintf(f, "\"concurrency\": %d", r->concurrency);
        }
        if (r->error[0]) {
            fprintf(f, ", \"error\": ");
            json_str(f, r->error);
            fprintf(f, "}");
            continue;
        }
        fprintf(f, ",\n     \"requests\": %llu, \"started\": %llu, \"errors\": %llu, \"errors_by_kind\": {",
                (unsigned long long)r->ok, (unsigned long long)r->started,
                (unsigned long long)r->errors);
        int first = 1;
        for (int k = 1; k < LNORM__EK_N; k++) {
            if (!r->err_by[k])
                continue;
            fprintf(f, "%s\"%s\": %llu", first ? "" : ", ", lnorm__ek_name(k),
                    (unsigned long long)r->err_by[k]);
            first = 0;
        }
        fprintf(f, "},\n     \"elapsed_s\": ");
        json_num(f, r->elapsed_s);
        fprintf(f, ", \"throughput\": {\"requests_per_s\": ");
        json_num(f, r->rps);
        fprintf(f, ", \"rows_per_s\": ");
        json_num(f, r->rows_ps);
        fprintf(f, ", \"gb_per_s\": ");
        json_num(f, r->gbps);
        fprintf(f, ", \"tx_bytes\": %llu, \"rx_bytes\": %llu},\n     \"latency_us\": {",
                (unsigned long long)r->tx_bytes, (unsigned long long)r->rx_bytes);
        fprintf(f, "\"min\": ");
        json_num(f, us(r->min_ns));
        fprintf(f, ", \"mean\": ");
        json_num(f, r->mean_ns / 1e3);
        fprintf(f, ", \"p50\": ");
        json_num(f, us(r->p50_ns));
        fprintf(f, ", \"p90\": ");
        json_num(f, us(r->p90_ns));
        fprintf(f, ", \"p99\": ");
        json_num(f, us(r->p99_ns));
        fprintf(f, ", \"p99_9\": ");
        json_num(f, us(r->p999_ns));
        fprintf(f, ", \"max\": ");
        json_num(f, us(r->max_ns));
        fprintf(f, "},\n     \"latency_spectrum_us\": [");
        for (int k = 0; k < LNORM__SPECTRUM_N; k++) {
            fprintf(f, "%s[", k ? ", " : "");
            json_num(f, 100.0 * (1.0 - pow(10.0, -k / 10.0)));
            fprintf(f, ", ");
            json_num(f, r->spectrum_ns[k] / 1e3);
            fprintf(f, "]");
        }
        fprintf(f, "],\n     \"server\": {\"replies_with_timings\": %llu, \"queue_us_mean\": ",
                (unsigned long long)r->srv_n);
        json_num(f, r->srv_queue_us);
        fprintf(f, ", \"compute_us_mean\": ");
        json_num(f, r->srv_compute_us);
        fprintf(f, ", \"batch_rows_mean\": ");
        json_num(f, r->batch_rows);
        fprintf(f, ", \"batch_requests_mean\": ");
        json_num(f, r->batch_requests);
        fprintf(f, "},\n     \"verify\": {\"checked\": %llu, \"mismatches\": %llu",
                (unsigned long long)r->verified, (unsigned long long)r->mismatches);
        if (r->first_mismatch[0]) {
            fprintf(f, ", \"first\": ");
            json_str(f, r->first_mismatch);
        }
        fprintf(f, "},\n     \"cpu_us_per_request\": {\"server\": ");
        if (r->server_cpu_us_per_req >= 0)
            json_num(f, r->server_cpu_us_per_req);
        else
            fprintf(f, "null");
        fprintf(f, ", \"client\": ");
        if (r->client_cpu_us_per_req >= 0)
            json_num(f, r->client_cpu_us_per_req);
        else
            fprintf(f, "null");
        fprintf(f, "}, \"backlogged_sends\": %llu, \"loadavg_at_start\": ", (unsigned long long)r->backlogged);
        json_str(f, r->loadavg);
        fprintf(f, ", \"latency_count\": %llu", (unsigned long long)r->lat_count);
        if (r->n_srv_threads) {
            /* where the server's CPU went, by thread name (its workers included) */
            fprintf(f, ",\n     \"server_threads\": [");
            for (int k = 0; k < r->n_srv_threads; k++) {
                fprintf(f, "%s{\"name\": ", k ? ", " : "");
                json_str(f, r->srv_threads[k].name);
                fprintf(f, ", \"threads\": %d, \"cpu_s\": ", r->srv_threads[k].threads);
                json_num(f, r->srv_threads[k].us / 1e6);
                fprintf(f, "}");
            }
            fprintf(f, "]");
        }
        if (r->parts)
            json_parts(f, r);
        fprintf(f, "}");
    }
    fprintf(f, "\n  ],\n  \"ratios_vs_echo\": [");
    int first = 1;
    for (size_t i = 0; i < rp->n; i++) {
        const lnorm__runres *e = lnorm__report_echo_peer(rp, i), *r = &rp->runs[i];
        if (!e || e->rps <= 0 || r->error[0])
            continue;
        fprintf(f, "%s\n    {\"target\": ", first ? "" : ",");
        json_str(f, r->label);
        fprintf(f, ", \"driver\": ");
        json_str(f, r->driver);
        if (r->open_loop) {
            fprintf(f, ", \"offered_rate\": ");
            json_num(f, r->rate);
        } else {
            fprintf(f, ", \"concurrency\": %d", r->concurrency);
        }
        fprintf(f, ", \"throughput_ratio\": ");
        json_num(f, r->rps / e->rps);
        fprintf(f, ", \"p50_latency_ratio\": ");
        json_num(f, e->p50_ns ? (double)r->p50_ns / (double)e->p50_ns : NAN);
        fprintf(f, ", \"p99_latency_ratio\": ");
        json_num(f, e->p99_ns ? (double)r->p99_ns / (double)e->p99_ns : NAN);
        fprintf(f, ", \"server_cpu_per_request_ratio\": ");
        if (r->server_cpu_us_per_req > 0 && e->server_cpu_us_per_req > 0)
            json_num(f, r->server_cpu_us_per_req / e->server_cpu_us_per_req);
        else
            fprintf(f, "null");
        fprintf(f, "}");
        first = 0;
    }
    fprintf(f, "\n  ]\n}\n");
    return fclose(f) == 0 ? 0 : -1;
}

int lnorm__report_csv(const lnorm__report *rp, const char *path)
{
    FILE *f = fopen(path, "w");
    if (!f)
        return -1;
    fprintf(f, "date,device,commit,target,driver,mode,concurrency,offered_rate,requests,errors,"
               "elapsed_s,req_per_s,rows_per_s,gb_per_s,p50_us,p90_us,p99_us,p99_9_us,max_us,"
               "mean_us,srv_queue_us,srv_compute_us,batch_rows,batch_requests,verified,"
               "mismatches,procs\n");
    for (size_t i = 0; i < rp->n; i++) {
        const lnorm__runres *r = &rp->runs[i];
        if (r->error[0])
            continue;
        fprintf(f, "%s,\"%s\",%s,%s,%s,%s,%d,%.6g,%llu,%llu,%.6g,%.6g,%.6g,%.6g,%.6g,%.6g,%.6g,"
                   "%.6g,%.6g,%.6g,%.6g,%.6g,%.6g,%.6g,%llu,%llu,%d\n",
                rp->date, rp->device, rp->commit, r->label, r->driver,
                r->open_loop ? "open" : "closed", r->concurrency, r->open_loop ? r->rate : 0,
                (unsigned long long)r->ok, (unsigned long long)r->errors, r->elapsed_s, r->rps,
                r->rows_ps, r->gbps, us(r->p50_ns), us(r->p90_ns), us(r->p99_ns),
                us(r->p999_ns), us(r->max_ns), r->mean_ns / 1e3, r->srv_queue_us,
                r->srv_compute_us, r->batch_rows, r->batch_requests,
                (unsigned long long)r->verified, (unsigned long long)r->mismatches,
                r->procs > 0 ? r->procs : 1);
    }
    return fclose(f) == 0 ? 0 : -1;
}
