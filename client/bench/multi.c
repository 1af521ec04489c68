/* Load from many processes: see multi.h. */
#include "multi.h"

#include <errno.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

int lnorm__multi_index = -1;
static int parent_gone; /* in a child: the go pipe reached its end */

#define RESULT_MAGIC "LNBRES1"

static void close_fd(int *fd)
{
    if (*fd >= 0)
        close(*fd);
    *fd = -1;
}

int lnorm__multi_start(lnorm__multi *m, int n, lnorm__multi_body body, void *arg, char *err,
                       size_t errlen)
{
    memset(m, 0, sizeof *m);
    for (int i = 0; i < LNORM__PROCS_MAX; i++)
        m->go_fd[i] = m->st_fd[i] = -1;
    if (n < 1 || n > LNORM__PROCS_MAX) {
        snprintf(err, errlen, "%d processes: give 1..%d", n, LNORM__PROCS_MAX);
        return -1;
    }
    snprintf(m->dir, sizeof m->dir, "/tmp/lnorm-bench-procs-XXXXXX");
    if (!mkdtemp(m->dir)) {
        snprintf(err, errlen, "mkdtemp: %s", strerror(errno));
        m->dir[0] = '\0';
        return -1;
    }
    fflush(NULL);
    pid_t parent = getpid();
    for (int i = 0; i < n; i++) {
        int go[2], st[2];
        if (pipe(go) != 0) {
            snprintf(err, errlen, "pipe: %s", strerror(errno));
            lnorm__multi_stop(m);
            return -1;
        }
        if (pipe(st) != 0) {
            snprintf(err, errlen, "pipe: %s", strerror(errno));
            close(go[0]), close(go[1]);
            lnorm__multi_stop(m);
            return -1;
        }
        pid_t pid = fork();
        if (pid < 0) {
            snprintf(err, errlen, "fork: %s", strerror(errno));
            close(go[0]), close(go[1]), close(st[0]), close(st[1]);
            lnorm__multi_stop(m);
            return -1;
        }
        if (pid == 0) {
            prctl(PR_SET_PDEATHSIG, SIGKILL);
            if (getppid() != parent)
                _exit(127);
            for (int j = 0; j < i; j++) {
                close_fd(&m->go_fd[j]);
                close_fd(&m->st_fd[j]);
            }
            close(go[1]);
            close(st[0]);
            m->n = n;
            m->go_fd[i] = go[0];
            m->st_fd[i] = st[1];
            lnorm__multi_index = i;
            _exit(body(arg, i));
        }
        close(go[0]);
        close(st[1]);
        m->pid[i] = pid;
        m->go_fd[i] = go[1];
        m->st_fd[i] = st[0];
        m->n = i + 1;
    }
    return 0;
}

/* ---- child side ----------------------------------------------------------- */

int lnorm__multi_child_ready(void *arg)
{
    lnorm__multi *m = arg;
    int i = lnorm__multi_index;
    char c = 'R';
    if (parent_gone || write(m->st_fd[i], &c, 1) != 1) {
        parent_gone = 1;
        return -1;
    }
    for (;;) {
        ssize_t r = read(m->go_fd[i], &c, 1);
        if (r == 1)
            return c == 'G' ? 0 : -1;
        if (r < 0 && errno == EINTR && !lnorm__interrupted)
            continue;
        if (r == 0)
            parent_gone = 1;
        return -1;
    }
}

static int write_all(FILE *f, const void *p, size_t n)
{
    return fwrite(p, 1, n, f) == n ? 0 : -1;
}

int lnorm__multi_child_done(lnorm__multi *m, const lnorm__runres *res, const lnorm__hist *h)
{
    int i = lnorm__multi_index;
    if (parent_gone)
        return -1;
    char path[320], tmp[330];
    snprintf(path, sizeof path, "%s/r%d.bin", m->dir, i);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "wb");
    int rc = f ? 0 : -1;
    if (f) {
        lnorm__runres r = *res;
        r.parts = NULL;
        uint64_t tail[4] = {atomic_load(&h->total), atomic_load(&h->min), atomic_load(&h->max),
                            atomic_load(&h->sum_lo)};
        rc |= write_all(f, RESULT_MAGIC, 8);
        rc |= write_all(f, &r, sizeof r);
        for (unsigned k = 0; k < LNORM__HIST_BUCKETS && rc == 0; k++) {
            uint64_t c = atomic_load_explicit(&h->counts[k], memory_order_relaxed);
            rc |= write_all(f, &c, sizeof c);
        }
        rc |= write_all(f, tail, sizeof tail);
        if (fclose(f) != 0)
            rc = -1;
        if (rc == 0 && rename(tmp, path) != 0)
            rc = -1;
    }
    char c = 'D'; /* without a file the parent reports the missing result */
    if (write(m->st_fd[i], &c, 1) != 1) {
        parent_gone = 1;
        return -1;
    }
    return 0;
}

/* ---- parent side ---------------------------------------------------------- */

static void kill_all(lnorm__multi *m)
{
    for (int i = 0; i < m->n; i++)
        if (m->pid[i] > 0)
            kill(m->pid[i], SIGKILL);
    for (int i = 0; i < m->n; i++) {
        if (m->pid[i] > 0)
            waitpid(m->pid[i], NULL, 0);
        m->pid[i] = 0;
    }
}

/* Child i closed its status pipe: reap it and say how it ended. */
static void died(lnorm__multi *m, int i, char *why, size_t n)
{
    int st = 0;
    pid_t pid = m->pid[i];
    pid_t w = 0;
    for (int k = 0; k < 200 && (w = waitpid(pid, &st, WNOHANG)) == 0; k++)
        usleep(10000);
    if (w == pid) {
        m->pid[i] = 0;
        if (WIFSIGNALED(st))
            snprintf(why, n, "load process %d of %d (pid %d) was killed by signal %d", i + 1, m->n,
                     (int)pid, WTERMSIG(st));
        else
            snprintf(why, n, "load process %d of %d (pid %d) exited with status %d mid-point", i + 1,
                     m->n, (int)pid, WIFEXITED(st) ? WEXITSTATUS(st) : -1);
    } else {
        snprintf(why, n, "load process %d of %d (pid %d) closed its pipe", i + 1, m->n, (int)pid);
    }
}

/* Wait until every child's state is want or 'D' (states: 0, 'R', 'D').
 * 0, or -1 with the reason in why. */
static int wait_states(lnorm__multi *m, char *state, char want, int timeout_ms, int forward_sigint,
                       char *why, size_t n)
{
    uint64_t deadline = lnorm__now_ns() + (uint64_t)timeout_ms * 1000000ull;
    int forwarded = 0;
    for (;;) {
        struct pollfd pf[LNORM__PROCS_MAX];
        int idx[LNORM__PROCS_MAX], np = 0;
        for (int i = 0; i < m->n; i++) {
            if (state[i] == want || state[i] == 'D')
                continue;
            pf[np].fd = m->st_fd[i];
            pf[np].events = POLLIN;
            idx[np++] = i;
        }
        if (np == 0)
            return 0;
        if (lnorm__interrupted) {
            if (!forward_sigint) {
                snprintf(why, n, "interrupted");
                return -1;
            }
            if (!forwarded) {
                for (int k = 0; k < np; k++)
                    kill(m->pid[idx[k]], SIGINT);
                forwarded = 1;
            }
        }
        uint64_t now = lnorm__now_ns();
        if (now >= deadline) {
            int i = idx[0];
            snprintf(why, n, "load process %d of %d (pid %d) did not %s within %d ms", i + 1, m->n,
                     (int)m->pid[i], want == 'R' ? "get ready" : "finish", timeout_ms);
            return -1;
        }
        uint64_t left = (deadline - now) / 1000000ull + 1;
        int rv = poll(pf, (nfds_t)np, left > 200 ? 200 : (int)left);
        if (rv < 0 && errno != EINTR) {
            snprintf(why, n, "poll: %s", strerror(errno));
            return -1;
        }
        for (int k = 0; rv > 0 && k < np; k++) {
            if (!pf[k].revents)
                continue;
            int i = idx[k];
            char c;
            ssize_t r = read(m->st_fd[i], &c, 1);
            if (r == 1 && (c == 'R' || c == 'D')) {
                state[i] = c;
            } else if (r < 0 && errno == EINTR) {
                continue;
            } else {
                died(m, i, why, n);
                return -1;
            }
        }
    }
}

/* Read child i's result file. 0 or -1 (why). */
static int read_result(const lnorm__multi *m, int i, lnorm__runres *res, lnorm__hist *h, char *why,
                       size_t n)
{
    char path[320];
    snprintf(path, sizeof path, "%s/r%d.bin", m->dir, i);
    FILE *f = fopen(path, "rb");
    char magic[8];
    int ok = f && fread(magic, 1, 8, f) == 8 && !memcmp(magic, RESULT_MAGIC, 8) &&
             fread(res, sizeof *res, 1, f) == 1;
    lnorm__hist_reset(h);
    for (unsigned k = 0; ok && k < LNORM__HIST_BUCKETS; k++) {
        uint64_t c;
        ok = fread(&c, sizeof c, 1, f) == 1;
        atomic_store_explicit(&h->counts[k], c, memory_order_relaxed);
    }
    uint64_t tail[4];
    ok = ok && fread(tail, sizeof tail, 1, f) == 1;
    if (ok) {
        atomic_store(&h->total, tail[0]);
        atomic_store(&h->min, tail[1]);
        atomic_store(&h->max, tail[2]);
        atomic_store(&h->sum_lo, tail[3]);
    }
    if (f)
        fclose(f);
    unlink(path);
    res->parts = NULL;
    if (!ok)
        snprintf(why, n, "no readable result from load process %d of %d (%.100s)", i + 1, m->n, path);
    return ok ? 0 : -1;
}

int lnorm__multi_point(lnorm__multi *m, int server_pid, int ready_ms, int done_ms, lnorm__runres *res)
{
    memset(res, 0, sizeof *res);
    res->procs = m->n;
    res->server_cpu_us_per_req = res->client_cpu_us_per_req = -1;
    res->server_cpu_us = res->client_cpu_us = -1;
    if (m->failed) {
        snprintf(res->error, sizeof res->error, "not run: the load processes were stopped after a failure");
        return 0;
    }
    char state[LNORM__PROCS_MAX] = {0}, early[LNORM__PROCS_MAX] = {0};
    char why[200] = "";
    double srv0 = -1, srv1 = -1;
    lnorm__thread_cpu thr0[LNORM__THREAD_KINDS];
    int nthr0 = 0;
    int failed = wait_states(m, state, 'R', ready_ms, 0, why, sizeof why);
    if (!failed) {
        int any_early = 0;
        for (int i = 0; i < m->n; i++)
            any_early |= early[i] = state[i] == 'D';
        srv0 = server_pid > 0 ? lnorm__proc_cpu_snap(server_pid, thr0, &nthr0) : -1;
        /* all together, or none when one could not start */
        char c = any_early ? 'Q' : 'G';
        for (int i = 0; i < m->n && !failed; i++) {
            if (state[i] == 'R' && write(m->go_fd[i], &c, 1) != 1) {
                died(m, i, why, sizeof why);
                failed = 1;
            }
        }
    }
    if (!failed)
        failed = wait_states(m, state, 'D', done_ms, 1, why, sizeof why);
    lnorm__thread_cpu thr1[LNORM__THREAD_KINDS];
    int nthr1 = 0;
    srv1 = server_pid > 0 ? lnorm__proc_cpu_snap(server_pid, thr1, &nthr1) : -1;
    lnorm__thread_cpu_diff(thr1, nthr1, thr0, nthr0);
    lnorm__runres *parts = failed ? NULL : calloc((size_t)m->n, sizeof *parts);
    lnorm__hist *h = failed ? NULL : lnorm__hist_new();
    lnorm__hist *sum = failed ? NULL : lnorm__hist_new();
    if (!failed && (!parts || !h || !sum)) {
        snprintf(why, sizeof why, "out of memory");
        failed = 1;
    }
    for (int i = 0; i < m->n && !failed; i++) {
        if (read_result(m, i, &parts[i], h, why, sizeof why) != 0)
            failed = 1;
        else
            lnorm__hist_merge(sum, h);
    }
    if (failed) {
        m->failed = 1;
        kill_all(m);
        snprintf(res->error, sizeof res->error, "%s", why);
        free(parts);
    } else {
        lnorm__runres_merge(res, parts, m->n, sum);
        res->parts = parts;
        /* a process that could not start names the point's failure */
        for (int i = 0; i < m->n; i++) {
            if (early[i] && parts[i].error[0]) {
                snprintf(res->error, sizeof res->error, "load process %d of %d: %.150s", i + 1, m->n,
                         parts[i].error);
                break;
            }
        }
        memcpy(res->srv_threads, thr1, sizeof thr1);
        res->n_srv_threads = nthr1;
        if (res->ok_all && srv0 >= 0 && srv1 >= srv0) {
            res->server_cpu_us = srv1 - srv0;
            res->server_cpu_us_per_req = res->server_cpu_us / (double)res->ok_all;
        }
    }
    lnorm__hist_free(h);
    lnorm__hist_free(sum);
    return 0;
}

void lnorm__multi_stop(lnorm__multi *m)
{
    for (int i = 0; i < m->n; i++)
        close_fd(&m->go_fd[i]);
    for (int k = 0; k < 500; k++) {
        int left = 0;
        for (int i = 0; i < m->n; i++) {
            if (m->pid[i] > 0 && waitpid(m->pid[i], NULL, WNOHANG) == m->pid[i])
                m->pid[i] = 0;
            left += m->pid[i] > 0;
        }
        if (!left)
            break;
        usleep(10000);
    }
    kill_all(m);
    for (int i = 0; i < m->n; i++)
        close_fd(&m->st_fd[i]);
    if (m->dir[0]) {
        char path[320];
        for (int i = 0; i < m->n; i++) {
            snprintf(path, sizeof path, "%s/r%d.bin", m->dir, i);
            unlink(path);
            snprintf(path, sizeof path, "%s/r%d.bin.tmp", m->dir, i);
            unlink(path);
        }
        rmdir(m->dir);
        m->dir[0] = '\0';
    }
    m->n = 0;
}

/* ---- merging -------------------------------------------------------------- */

void lnorm__runres_merge(lnorm__runres *out, const lnorm__runres *parts, int n, const lnorm__hist *h)
{
    memset(out, 0, sizeof *out);
    if (n < 1)
        return;
    snprintf(out->label, sizeof out->label, "%s", parts[0].label);
    snprintf(out->driver, sizeof out->driver, "%s", parts[0].driver);
    snprintf(out->loadavg, sizeof out->loadavg, "%s", parts[0].loadavg);
    out->open_loop = parts[0].open_loop;
    out->procs = n;
    double srv_q = 0, srv_c = 0, brows = 0, breqs = 0, cli_cpu = 0;
    int cli_known = 1;
    for (int i = 0; i < n; i++) {
        const lnorm__runres *p = &parts[i];
        if (p->error[0] && !out->error[0])
            snprintf(out->error, sizeof out->error, "load process %d of %d: %.150s", i + 1, n, p->error);
        out->concurrency += p->concurrency;
        out->rate += p->rate;
        if (p->elapsed_s > out->elapsed_s)
            out->elapsed_s = p->elapsed_s;
        out->started += p->started;
        out->ok += p->ok;
        out->errors += p->errors;
        for (int k = 0; k < LNORM__EK_N; k++)
            out->err_by[k] += p->err_by[k];
        out->rows += p->rows;
        out->tx_bytes += p->tx_bytes;
        out->rx_bytes += p->rx_bytes;
        /* the windows coincide (a barrier): the total rate is the sum */
        out->rps += p->rps;
        out->rows_ps += p->rows_ps;
        out->gbps += p->gbps;
        out->srv_n += p->srv_n;
        srv_q += p->srv_queue_us * (double)p->srv_n;
        srv_c += p->srv_compute_us * (double)p->srv_n;
        brows += p->batch_rows * (double)p->srv_n;
        breqs += p->batch_requests * (double)p->srv_n;
        out->verified += p->verified;
        out->mismatches += p->mismatches;
        if (p->first_mismatch[0] && !out->first_mismatch[0])
            snprintf(out->first_mismatch, sizeof out->first_mismatch, "%s", p->first_mismatch);
        out->backlogged += p->backlogged;
        out->ok_all += p->ok_all;
        if (p->client_cpu_us >= 0)
            cli_cpu += p->client_cpu_us;
        else
            cli_known = 0;
    }
    if (out->srv_n) {
        out->srv_queue_us = srv_q / (double)out->srv_n;
        out->srv_compute_us = srv_c / (double)out->srv_n;
        out->batch_rows = brows / (double)out->srv_n;
        out->batch_requests = breqs / (double)out->srv_n;
    }
    out->server_cpu_us = -1;
    out->server_cpu_us_per_req = -1;
    out->client_cpu_us = cli_known ? cli_cpu : -1;
    out->client_cpu_us_per_req = cli_known && out->ok_all ? cli_cpu / (double)out->ok_all : -1;
    out->lat_count = lnorm__hist_count(h);
    out->min_ns = lnorm__hist_quantile(h, 0);
    out->p50_ns = lnorm__hist_quantile(h, 0.5);
    out->p90_ns = lnorm__hist_quantile(h, 0.9);
    out->p99_ns = lnorm__hist_quantile(h, 0.99);
    out->p999_ns = lnorm__hist_quantile(h, 0.999);
    out->max_ns = lnorm__hist_quantile(h, 1);
    out->mean_ns = lnorm__hist_mean(h);
    for (int k = 0; k < LNORM__SPECTRUM_N; k++)
        out->spectrum_ns[k] = (double)lnorm__hist_quantile(h, 1.0 - pow(10.0, -k / 10.0));
}
