/* lnormd test harness (see harness.h). */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <nng/nng.h>
#include <nng/protocol/reqrep0/req.h>
#include <nng/supplemental/tls/tls.h>

#include "harness.h"

int ts_failures = 0;

static pid_t ts_pids[16];
static int ts_npids;

static void ts_on_alarm(int sig)
{
    (void)sig;
    static const char msg[] = "FAIL: watchdog expired, killing lnormd\n";
    ssize_t w = write(2, msg, sizeof msg - 1);
    (void)w;
    for (int i = 0; i < ts_npids; i++)
        if (ts_pids[i] > 0)
            kill(ts_pids[i], SIGKILL);
    _exit(1);
}

static void ts_atexit(void)
{
    for (int i = 0; i < ts_npids; i++)
        if (ts_pids[i] > 0)
            kill(ts_pids[i], SIGKILL);
}

void ts_watchdog(int secs)
{
    signal(SIGALRM, ts_on_alarm);
    signal(SIGPIPE, SIG_IGN);
    atexit(ts_atexit);
    alarm((unsigned)secs);
}

static void ts_sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

int ts_start(ts_daemon *d, const char *lnormd, const char *const *extra)
{
    memset(d, 0, sizeof *d);
    snprintf(d->dir, sizeof d->dir, "%s/lnormd-test-XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    if (!mkdtemp(d->dir)) {
        perror("mkdtemp");
        return -1;
    }
    snprintf(d->ready, sizeof d->ready, "%s/ready", d->dir);
    snprintf(d->log, sizeof d->log, "%s/lnormd.log", d->dir);
    snprintf(d->ipc_url, sizeof d->ipc_url, "ipc://%s/lnormd.sock", d->dir);
    const char *argv[TS_MAX_ARGS + 16];
    int n = 0;
    argv[n++] = lnormd;
    argv[n++] = "--listen";
    argv[n++] = d->ipc_url;
    argv[n++] = "--listen";
    argv[n++] = "tcp://127.0.0.1:0";
    argv[n++] = "--http";
    argv[n++] = "127.0.0.1:0";
    argv[n++] = "--ready-file";
    argv[n++] = d->ready;
    argv[n++] = "--cpu-threads";
    argv[n++] = "2";
    for (int i = 0; extra && extra[i] && n < TS_MAX_ARGS + 14; i++)
        argv[n++] = extra[i];
    argv[n] = NULL;
    pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        int fd = open(d->log, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
            close(fd);
        }
        execv(lnormd, (char *const *)argv);
        _exit(127);
    }
    d->pid = pid;
    if (ts_npids < 16)
        ts_pids[ts_npids++] = pid;
    for (int waited = 0; waited < 20000; waited += 10) {
        FILE *f = fopen(d->ready, "r");
        if (f) {
            char line[256];
            while (fgets(line, sizeof line, f)) {
                line[strcspn(line, "\n")] = 0;
                if (!strncmp(line, "listen tls+tcp://", 17))
                    snprintf(d->tls_url, sizeof d->tls_url, "%s", line + 7);
                else if (!strncmp(line, "listen tcp://", 13))
                    snprintf(d->tcp_url, sizeof d->tcp_url, "%s", line + 7);
                else if (!strncmp(line, "http ", 5))
                    snprintf(d->http, sizeof d->http, "%s", line + 5);
            }
            fclose(f);
            if (!d->tcp_url[0] || !d->http[0]) {
                fprintf(stderr, "ready file lacks tcp or http line\n");
                return -1;
            }
            return 0;
        }
        int st;
        if (waitpid(pid, &st, WNOHANG) == pid) {
            fprintf(stderr, "lnormd exited before ready (status %d)\n", st);
            d->pid = 0;
            ts_dump_log(d);
            return -1;
        }
        ts_sleep_ms(10);
    }
    fprintf(stderr, "lnormd not ready after 20 s\n");
    ts_dump_log(d);
    return -1;
}

void ts_signal(ts_daemon *d, int sig)
{
    if (d->pid > 0)
        kill(d->pid, sig);
}

int ts_stop(ts_daemon *d)
{
    if (d->pid <= 0)
        return -1;
    kill(d->pid, SIGTERM);
    int st = 0, rc = -1;
    for (int waited = 0; waited < 15000; waited += 10) {
        pid_t w = waitpid(d->pid, &st, WNOHANG);
        if (w == d->pid) {
            rc = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
            break;
        }
        ts_sleep_ms(10);
    }
    if (rc == -1 && !WIFEXITED(st)) {
        kill(d->pid, SIGKILL);
        waitpid(d->pid, &st, 0);
    }
    for (int i = 0; i < ts_npids; i++)
        if (ts_pids[i] == d->pid)
            ts_pids[i] = 0;
    d->pid = 0;
    if (rc != 0)
        ts_dump_log(d);
    /* Leave nothing behind. */
    char p[400];
    snprintf(p, sizeof p, "%s/lnormd.sock", d->dir);
    unlink(p);
    unlink(d->ready);
    unlink(d->log);
    rmdir(d->dir);
    return rc;
}

void ts_dump_log(ts_daemon *d)
{
    FILE *f = fopen(d->log, "r");
    if (!f)
        return;
    char line[1024];
    fprintf(stderr, "---- lnormd log ----\n");
    while (fgets(line, sizeof line, f))
        fputs(line, stderr);
    fprintf(stderr, "--------------------\n");
    fclose(f);
}

int ts_run(const char *lnormd, const char *const *args, char *out, size_t outlen)
{
    int pfd[2];
    if (pipe(pfd) != 0)
        return -1;
    const char *argv[TS_MAX_ARGS + 2];
    int n = 0;
    argv[n++] = lnormd;
    for (int i = 0; args[i] && n < TS_MAX_ARGS; i++)
        argv[n++] = args[i];
    argv[n] = NULL;
    pid_t pid = fork();
    if (pid == 0) {
        dup2(pfd[1], 1);
        dup2(pfd[1], 2);
        close(pfd[0]);
        close(pfd[1]);
        execv(lnormd, (char *const *)argv);
        _exit(127);
    }
    close(pfd[1]);
    if (ts_npids < 16)
        ts_pids[ts_npids++] = pid;
    size_t len = 0;
    for (;;) {
        char tmp[4096];
        ssize_t r = read(pfd[0], tmp, sizeof tmp);
        if (r <= 0)
            break;
        size_t c = (size_t)r;
        if (outlen && len + c > outlen - 1)
            c = outlen - 1 - len;
        memcpy(out + len, tmp, c);
        len += c;
    }
    close(pfd[0]);
    if (outlen)
        out[len] = 0;
    int st;
    waitpid(pid, &st, 0);
    for (int i = 0; i < ts_npids; i++)
        if (ts_pids[i] == pid)
            ts_pids[i] = 0;
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* NNG 1.5's lazy initialisation races when threads open their first
 * sockets at once (ThreadSanitizer, in libnng): the first open goes
 * through pthread_once, as in liblnorm. */
static pthread_once_t ts_nng_once = PTHREAD_ONCE_INIT;

static void ts_nng_first_use(void)
{
    nng_socket s;
    if (nng_req0_open(&s) == 0)
        nng_close(s);
}

int ts_dial(nng_socket *s, const char *url)
{
    pthread_once(&ts_nng_once, ts_nng_first_use);
    int rv = nng_req0_open(s);
    if (rv == 0)
        rv = nng_socket_set_ms(*s, NNG_OPT_RECVTIMEO, 20000);
    if (rv == 0)
        rv = nng_socket_set_ms(*s, NNG_OPT_REQ_RESENDTIME, NNG_DURATION_INFINITE);
    if (rv == 0)
        rv = nng_socket_set_size(*s, NNG_OPT_RECVMAXSZ, 0);
    if (rv == 0)
        rv = nng_dial(*s, url, NULL, 0);
    if (rv != 0)
        fprintf(stderr, "dial %s: %s\n", url, nng_strerror(rv));
    return rv ? -1 : 0;
}

int ts_dial_tls(nng_socket *s, const char *url, const char *ca, const char *cert, const char *key, int timeout_ms)
{
    nng_tls_config *tls = NULL;
    nng_dialer dl;
    int rv = nng_req0_open(s);
    if (rv == 0)
        rv = nng_socket_set_ms(*s, NNG_OPT_RECVTIMEO, timeout_ms);
    if (rv == 0)
        rv = nng_socket_set_ms(*s, NNG_OPT_REQ_RESENDTIME, NNG_DURATION_INFINITE);
    if (rv == 0)
        rv = nng_tls_config_alloc(&tls, NNG_TLS_MODE_CLIENT);
    if (rv == 0)
        rv = nng_tls_config_ca_file(tls, ca);
    if (rv == 0)
        rv = nng_tls_config_server_name(tls, "localhost");
    if (rv == 0)
        rv = nng_tls_config_auth_mode(tls, NNG_TLS_AUTH_MODE_REQUIRED);
    if (rv == 0 && cert) {
        /* NNG wants the certificate and the key in one file. */
        char both[512];
        snprintf(both, sizeof both, "%s.both.pem", cert);
        FILE *o = fopen(both, "w");
        const char *parts[2] = {cert, key};
        for (int i = 0; o && i < 2; i++) {
            FILE *in = fopen(parts[i], "r");
            char buf[4096];
            size_t n;
            while (in && (n = fread(buf, 1, sizeof buf, in)) > 0)
                fwrite(buf, 1, n, o);
            if (in)
                fclose(in);
        }
        if (o)
            fclose(o);
        rv = nng_tls_config_cert_key_file(tls, both, NULL);
        unlink(both);
    }
    if (rv == 0)
        rv = nng_dialer_create(&dl, *s, url);
    if (rv == 0)
        rv = nng_dialer_set_ptr(dl, NNG_OPT_TLS_CONFIG, tls);
    if (rv == 0)
        rv = nng_dialer_start(dl, 0);
    if (tls)
        nng_tls_config_free(tls);
    if (rv != 0)
        fprintf(stderr, "tls dial %s: %s\n", url, nng_strerror(rv));
    return rv ? -1 : 0;
}

Lnorm__V1__Response *ts_call_raw(nng_socket s, const void *buf, size_t len)
{
    nng_msg *m;
    if (nng_msg_alloc(&m, len) != 0)
        return NULL;
    if (len)
        memcpy(nng_msg_body(m), buf, len);
    int rv = nng_sendmsg(s, m, 0);
    if (rv != 0) {
        fprintf(stderr, "send: %s\n", nng_strerror(rv));
        nng_msg_free(m);
        return NULL;
    }
    if ((rv = nng_recvmsg(s, &m, 0)) != 0) {
        fprintf(stderr, "recv: %s\n", nng_strerror(rv));
        return NULL;
    }
    Lnorm__V1__Response *r = lnorm__v1__response__unpack(NULL, nng_msg_len(m), nng_msg_body(m));
    nng_msg_free(m);
    if (!r)
        fprintf(stderr, "reply is not a valid lnorm.v1.Response\n");
    return r;
}

Lnorm__V1__Response *ts_call(nng_socket s, const Lnorm__V1__Request *req)
{
    size_t n = lnorm__v1__request__get_packed_size(req);
    uint8_t *buf = malloc(n ? n : 1);
    if (!buf)
        return NULL;
    lnorm__v1__request__pack(req, buf);
    Lnorm__V1__Response *r = ts_call_raw(s, buf, n);
    free(buf);
    return r;
}

int ts_code(const Lnorm__V1__Response *r)
{
    return r && r->status ? (int)r->status->code : (r ? 0 : -1);
}

const char *ts_msg(const Lnorm__V1__Response *r)
{
    return r && r->status && r->status->message ? r->status->message : "";
}

char *ts_http_get(const char *hostport, const char *path, int *status)
{
    char host[64];
    int port;
    const char *c = strrchr(hostport, ':');
    if (!c || (size_t)(c - hostport) >= sizeof host)
        return NULL;
    memcpy(host, hostport, (size_t)(c - hostport));
    host[c - hostport] = 0;
    port = atoi(c + 1);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0)
        return NULL;
    struct sockaddr_in sa = {0};
    sa.sin_family = AF_INET;
    sa.sin_port = htons((uint16_t)port);
    inet_pton(AF_INET, host, &sa.sin_addr);
    struct timeval tv = {10, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
        close(fd);
        return NULL;
    }
    char req[512];
    int n = snprintf(req, sizeof req, "GET %s HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", path, hostport);
    if (write(fd, req, (size_t)n) != n) {
        close(fd);
        return NULL;
    }
    size_t len = 0, cap = 65536;
    char *buf = malloc(cap);
    for (;;) {
        if (len + 4096 >= cap) {
            cap *= 2;
            buf = realloc(buf, cap);
        }
        ssize_t r = read(fd, buf + len, cap - len - 1);
        if (r <= 0)
            break;
        len += (size_t)r;
        buf[len] = 0;
        /* Stop once the whole body (Content-Length) is in. */
        char *hdr_end = strstr(buf, "\r\n\r\n");
        char *cl = strcasestr(buf, "Content-Length:");
        if (hdr_end && cl && cl < hdr_end && len >= (size_t)(hdr_end + 4 - buf) + (size_t)atol(cl + 15))
            break;
    }
    close(fd);
    buf[len] = 0;
    *status = 0;
    sscanf(buf, "HTTP/1.%*d %d", status);
    char *body = strstr(buf, "\r\n\r\n");
    if (!body) {
        free(buf);
        return NULL;
    }
    memmove(buf, body + 4, strlen(body + 4) + 1);
    return buf;
}

double ts_metric(const char *hostport, const char *name)
{
    int st;
    char *body = ts_http_get(hostport, "/metrics", &st);
    if (!body)
        return -1;
    double v = -1;
    size_t nl = strlen(name);
    for (char *line = body; line && *line;) {
        char *next = strchr(line, '\n');
        if (!strncmp(line, name, nl) && line[nl] == ' ') {
            v = atof(line + nl + 1);
            break;
        }
        line = next ? next + 1 : NULL;
    }
    free(body);
    return v;
}

void ts_norm_from_case(ts_norm *m, const lnorm_test_case *tc, uint64_t id, int inline_params)
{
    const lnorm_segment *s = &tc->seg;
    lnorm__v1__request__init(&m->req);
    lnorm__v1__normalize_request__init(&m->n);
    lnorm__v1__affine__init(&m->aff);
    m->req.request_id = id;
    m->req.body_case = LNORM__V1__REQUEST__BODY_NORMALIZE;
    m->req.normalize = &m->n;
    m->n.op = (Lnorm__V1__Op)s->op;
    m->n.x_dtype = (Lnorm__V1__DType)s->x_dtype;
    m->n.y_dtype = s->y_dtype == s->x_dtype ? LNORM__V1__DTYPE__DTYPE_UNSPECIFIED : (Lnorm__V1__DType)s->y_dtype;
    m->n.rows = (uint64_t)s->rows;
    m->n.hidden = (uint64_t)s->hidden;
    if (s->eps != LNORM_DEFAULT_EPS) {
        m->n.eps_present_case = LNORM__V1__NORMALIZE_REQUEST__EPS_PRESENT_EPS;
        m->n.eps = s->eps;
    }
    m->n.eps_mode = (Lnorm__V1__EpsMode)s->eps_mode;
    size_t xb = (size_t)(s->rows * s->hidden) * lnorm_dtype_size(s->x_dtype);
    m->n.x.data = (uint8_t *)s->x;
    m->n.x.len = xb;
    if (s->residual) {
        m->n.residual.data = (uint8_t *)s->residual;
        m->n.residual.len = xb;
    }
    m->n.want_stats = s->rstd != NULL;
    if (inline_params && (s->gamma || s->beta)) {
        size_t pb = (size_t)s->hidden * lnorm_dtype_size(s->param_dtype);
        m->aff.dtype = (Lnorm__V1__DType)s->param_dtype;
        if (s->gamma) {
            m->aff.gamma.data = (uint8_t *)s->gamma;
            m->aff.gamma.len = pb;
        }
        if (s->beta) {
            m->aff.beta.data = (uint8_t *)s->beta;
            m->aff.beta.len = pb;
        }
        m->n.affine = &m->aff;
    }
}

long ts_check_reply(const lnorm_test_case *tc, const Lnorm__V1__Response *r, const char *label)
{
    if (!r) {
        fprintf(stderr, "%s: no reply\n", label);
        return 1;
    }
    if (ts_code(r) != 0 || r->body_case != LNORM__V1__RESPONSE__BODY_NORMALIZE) {
        fprintf(stderr, "%s: status %d (%s), body %d\n", label, ts_code(r), ts_msg(r), (int)r->body_case);
        return 1;
    }
    const lnorm_segment *s = &tc->seg;
    const Lnorm__V1__NormalizeResponse *n = r->normalize;
    size_t elems = (size_t)(s->rows * s->hidden);
    size_t yb = elems * lnorm_dtype_size(s->y_dtype), xb = elems * lnorm_dtype_size(s->x_dtype);
    size_t sb = (size_t)s->rows * 4;
    long bad = 0;
    if (n->y.len != yb || (s->residual && n->residual_out.len != xb) || (!s->residual && n->residual_out.len) ||
        (s->rstd && n->rstd.len != sb) || (!s->rstd && n->rstd.len) || (s->mean && n->mean.len != sb) ||
        (!s->mean && n->mean.len)) {
        fprintf(stderr, "%s: reply sizes wrong (y %zu want %zu, res_out %zu, rstd %zu, mean %zu)\n", label, n->y.len,
                yb, n->residual_out.len, n->rstd.len, n->mean.len);
        return 1;
    }
    /* Against the float64 reference. */
    lnorm_segment got = *s;
    got.y = n->y.data;
    got.residual_out = s->residual ? n->residual_out.data : NULL;
    got.mean = s->mean ? (float *)n->mean.data : NULL;
    got.rstd = s->rstd ? (float *)n->rstd.data : NULL;
    long mism = lnorm_test_check_segment(&got, NULL, label);
    if (mism != 0) {
        fprintf(stderr, "%s: %ld elements differ from the float64 reference\n", label, mism);
        bad++;
    }
    /* Bit for bit against the CPU backend on the same inputs. */
    lnorm_segment loc = *s;
    const char *why = NULL;
    if (lnorm_cpu_run_segment(NULL, &loc, &why) != LNORM_OK) {
        fprintf(stderr, "%s: local cpu run failed: %s\n", label, why ? why : "?");
        return bad + 1;
    }
    if (memcmp(loc.y, n->y.data, yb) != 0 || (s->residual && memcmp(loc.residual_out, n->residual_out.data, xb)) ||
        (s->rstd && memcmp(loc.rstd, n->rstd.data, sb)) || (s->mean && memcmp(loc.mean, n->mean.data, sb))) {
        fprintf(stderr, "%s: reply differs bitwise from lnorm_cpu_run_segment\n", label);
        bad++;
    }
    return bad;
}
