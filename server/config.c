/* The one configuration table and its three readers: flags, file, --help. */
#include <errno.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "log.h"

enum { K_U64, K_STR, K_LIST, K_BOOL, K_LEVEL, K_CHOICE, K_PATH };

typedef struct lnorm__key {
    const char *name;
    int kind;
    size_t off;
    size_t size; /* of a string field */
    uint64_t min, max;
    const char *def;
    const char *help;
} lnorm__key;

/* The values a K_CHOICE key allows, '|'-separated. */
static const struct {
    const char *key, *choices;
} lnorm__choices[] = {
    {"backend", "auto|cpu|cuda"},
    {"cuda-sync", "spin|yield|block"},
    {"cuda-fallback", "none|cpu"},
};

/* val is one of the words allowed for key k. */
static int lnorm__choice_ok(const lnorm__key *k, const char *val)
{
    size_t vl = strlen(val);
    for (size_t i = 0; i < sizeof lnorm__choices / sizeof lnorm__choices[0]; i++) {
        if (strcmp(lnorm__choices[i].key, k->name))
            continue;
        for (const char *c = lnorm__choices[i].choices; *c;) {
            const char *e = strchr(c, '|');
            size_t cl = e ? (size_t)(e - c) : strlen(c);
            if (vl == cl && vl > 0 && strncmp(c, val, cl) == 0)
                return 1;
            c = e ? e + 1 : c + cl;
        }
    }
    return 0;
}

#define O(f) offsetof(lnorm__config, f), sizeof(((lnorm__config *)0)->f)
#define MiB (1024ull * 1024ull)

/* name, kind, field, min, max, default, help */
static const lnorm__key lnorm__keys[] = {
    {"listen", K_LIST, O(listen), 0, 0, "",
     "NNG URL to serve on (tcp://, ipc://, tls+tcp://); repeatable. None given: "
     "tcp://127.0.0.1:7878 and ipc:///tmp/lnormd.sock. Port 0 picks a free port"},
    {"http", K_STR, O(http), 0, 0, "127.0.0.1:7879",
     "HOST:PORT for /metrics, /healthz, /readyz (port 0: a free port; \"off\": none)"},
    {"ready-file", K_PATH, O(ready_file), 0, 0, "",
     "once serving, write this file (atomically) with one line per bound endpoint"},
    {"backend", K_CHOICE, O(backend), 0, 0, "auto", "compute backend: auto|cpu|cuda (auto: cuda if a GPU is usable)"},
    {"cuda-devices", K_STR, O(cuda_devices), 0, 0, "", "comma-separated GPU indices for the cuda backend (empty: all)"},
    {"cuda-slot-bytes", K_U64, O(cuda_slot_bytes), 1 * MiB, 1ull << 40, "268435456",
     "device memory per in-flight batch slot (cuda; a larger batch gets a temporary buffer)"},
    {"cuda-slots", K_U64, O(cuda_slots), 1, 64, "2", "batch slots (in-flight batches) per GPU (cuda)"},
    {"cuda-staging-bytes", K_U64, O(cuda_staging_bytes), 0, 1ull << 40, "16777216",
     "pinned host input arena and output arena per slot, each (cuda; capped at cuda-slot-bytes/2; 0: no staging)"},
    {"cuda-stage-max-bytes", K_U64, O(cuda_stage_max_bytes), 0, 1ull << 40, "262144",
     "requests with at most this payload (in + out) are gathered into the staging arenas; larger ones are "
     "copied directly (cuda)"},
    {"cuda-sync", K_CHOICE, O(cuda_sync), 0, 0, "spin",
     "how a GPU's completion thread waits for a batch: spin|yield|block (cuda)"},
    {"cuda-fallback", K_CHOICE, O(cuda_fallback), 0, 0, "none",
     "a batch whose CUDA work fails: none (error replies) | cpu (computed on the CPU instead) (cuda)"},
    {"cpu-threads", K_U64, O(cpu_threads), 0, 1024, "0", "CPU backend worker threads (0: number of cores)"},
    {"cpu-jobs", K_U64, O(cpu_jobs), 1, 64, "2", "batches the CPU backend runs at once"},
    {"max-batch-rows", K_U64, O(max_batch_rows), 1, 1ull << 32, "4096",
     "rows a batch takes from the queue (a larger single request runs alone)"},
    {"max-batch-bytes", K_U64, O(max_batch_bytes), 1024, 1ull << 40, "268435456",
     "payload bytes (in + out) a batch takes from the queue"},
    {"max-queue-delay-us", K_U64, O(max_queue_delay_us), 0, 10000000, "0",
     "longest wait for a batch to fill (0: take whatever queued while the backend was busy)"},
    {"max-queue", K_U64, O(max_queue), 1, 1000000, "1024",
     "requests waiting for a batch; more get RESOURCE_EXHAUSTED"},
    {"priority-levels", K_U64, O(priority_levels), 1, 16, "1",
     "batching priority levels: a Normalize request's priority is 1..N (0: default-priority), and a batch "
     "takes the highest level first, FIFO within a level"},
    {"default-priority", K_U64, O(default_priority), 1, 16, "1",
     "level of a request that asks none (priority 0); at most priority-levels"},
    {"priority-max-queue", K_STR, O(priority_max_queue_list), 0, 0, "",
     "comma-separated queue limit of levels 1, 2, ... (0 or left out: max-queue only); a request over its "
     "level's limit gets RESOURCE_EXHAUSTED"},
    {"max-queue-wait-us", K_U64, O(max_queue_wait_us), 0, 3600000000ull, "0",
     "longest a Normalize request may wait in the queue, for one that gives no max_queue_us; then "
     "DEADLINE_EXCEEDED, never computed (0: no limit)"},
    {"reply-threads", K_U64, O(reply_threads), 0, 256, "16",
     "threads that encode and send the replies of a finished batch (0: the thread that finished it, "
     "one reply after another). Each send waits for NNG's socket lock: 4 held lnormd near 31k req/s "
     "on a 16-core host, 16 near the echo server's 51k"},
    {"max-message-bytes", K_U64, O(max_message_bytes), 1024, 1ull << 31, "67108864",
     "largest request accepted (RESOURCE_EXHAUSTED above; the NNG receive limit per connection is this plus "
     "1 MiB: a larger message closes its connection unanswered)"},
    {"max-rows", K_U64, O(max_rows), 1, 1ull << 32, "1048576", "most rows in one request"},
    {"max-hidden", K_U64, O(max_hidden), 1, 1u << 24, "65536", "largest hidden size (at most 2^24)"},
    {"max-params-bytes", K_U64, O(max_params_bytes), 0, 1ull << 40, "268435456",
     "memory for registered parameters (RegisterParams beyond it: RESOURCE_EXHAUSTED)"},
    {"max-inflight-bytes", K_U64, O(max_inflight_bytes), 1 * MiB, 1ull << 40, "4294967296",
     "payload memory (in + out) held by Normalize requests in flight; more get RESOURCE_EXHAUSTED"},
    {"workers", K_U64, O(workers), 1, 64, "1",
     "lnormd processes, each with its own NNG and addresses, sharing the GPUs (worker i: ipc PATH.i, tcp "
     "PORT+i, http PORT+i); clients dial them all. One NNG process serves some 50k messages/s"},
    {"allow-shm", K_BOOL, O(allow_shm), 0, 0, "false",
     "accept shared-memory regions and submission rings from local clients over ipc:// (docs/shm.md); only "
     "from lnormd's own uid and those of shm-uids"},
    {"shm-uids", K_STR, O(shm_uids), 0, 0, "", "comma-separated uids besides lnormd's own that may use shared memory"},
    {"shm-max-regions", K_U64, O(shm_max_regions), 1, 1024, "16", "shared-memory regions per client process"},
    {"shm-max-bytes", K_U64, O(shm_max_bytes), 4096, 1ull << 44, "68719476736",
     "bytes of shared-memory regions per client process (each is mapped into lnormd and pinned for the GPU)"},
    {"contexts", K_U64, O(contexts), 1, 65536, "1024", "NNG contexts: requests received and served at once (beyond them NNG applies back-pressure)"},
    {"max-connections", K_U64, O(max_connections), 1, 1000000, "1024",
     "connections one listener keeps; more are closed as they arrive. Each may hold one frame in progress of "
     "up to max-message-bytes + 1 MiB (docs/security.md)"},
    {"max-connections-per-peer", K_U64, O(max_connections_per_peer), 1, 1000000, "64",
     "connections from one remote address (tcp://, tls+tcp://, all listeners together); more are closed as "
     "they arrive"},
    {"frame-timeout-ms", K_U64, O(frame_timeout_ms), 0, 3600000, "10000",
     "a tcp:// or tls+tcp:// connection whose message has been arriving for longer is closed (0: never)"},
    {"max-receive-bytes", K_U64, O(max_receive_bytes), 1 * MiB, 1ull << 44, "536870912",
     "bytes of messages still arriving over tcp:// and tls+tcp://, every connection together; beyond it the "
     "connections with the most are closed (seen a few times a second: docs/security.md)"},
    {"send-timeout-ms", K_U64, O(send_timeout_ms), 1, 3600000, "10000",
     "a reply not taken by its client within this time is dropped (frees the context)"},
    {"drain-timeout-ms", K_U64, O(drain_timeout_ms), 0, 3600000, "10000",
     "on SIGINT/SIGTERM, longest wait for requests in flight before exiting"},
    {"log-level", K_LEVEL, offsetof(lnorm__config, log_level), sizeof(int), 0, 0, "info",
     "error|warn|info|debug"},
    {"config", K_PATH, O(config_file), 0, 0, "", "read key = value lines from FILE (flags override it)"},
    {"tls-cert", K_PATH, O(tls_cert), 0, 0, "", "PEM certificate chain for tls+tcp:// listeners"},
    {"tls-key", K_PATH, O(tls_key), 0, 0, "", "PEM private key for tls+tcp:// listeners"},
    {"tls-ca", K_PATH, O(tls_ca), 0, 0, "", "PEM CA bundle to verify client certificates"},
    {"tls-verify-peer", K_BOOL, O(tls_verify_peer), 0, 0, "false",
     "require and verify a client certificate (needs tls-ca)"},
};
#define NKEYS (sizeof lnorm__keys / sizeof lnorm__keys[0])

static const lnorm__key *lnorm__key_find(const char *name, size_t len)
{
    for (size_t i = 0; i < NKEYS; i++)
        if (strlen(lnorm__keys[i].name) == len && strncmp(lnorm__keys[i].name, name, len) == 0)
            return &lnorm__keys[i];
    return NULL;
}

static int lnorm__key_set(lnorm__config *cfg, const lnorm__key *k, const char *val, char *err, size_t errlen)
{
    char *field = (char *)cfg + k->off;
    switch (k->kind) {
    case K_U64: {
        char *end;
        if (!*val || *val == '-')
            goto bad;
        errno = 0;
        unsigned long long v = strtoull(val, &end, 10); /* decimal: "010" is ten */
        if (errno || *end)
            goto bad;
        if (v < k->min || v > k->max) {
            snprintf(err, errlen, "%s: %llu is out of range [%llu, %llu]", k->name, v,
                     (unsigned long long)k->min, (unsigned long long)k->max);
            return -1;
        }
        memcpy(field, &(uint64_t){v}, sizeof(uint64_t));
        return 0;
    }
    case K_BOOL: {
        bool b;
        if (!strcmp(val, "true") || !strcmp(val, "1") || !strcmp(val, "yes") || !strcmp(val, "on"))
            b = true;
        else if (!strcmp(val, "false") || !strcmp(val, "0") || !strcmp(val, "no") || !strcmp(val, "off"))
            b = false;
        else
            goto bad;
        memcpy(field, &b, sizeof b);
        return 0;
    }
    case K_LEVEL: {
        int l = lnorm__log_level_parse(val);
        if (l < 0)
            goto bad;
        memcpy(field, &l, sizeof l);
        return 0;
    }
    case K_CHOICE:
        if (!lnorm__choice_ok(k, val))
            goto bad;
        /* fall through */
    case K_STR:
    case K_PATH:
        if (strlen(val) >= k->size) {
            snprintf(err, errlen, "%s: value too long", k->name);
            return -1;
        }
        strcpy(field, val);
        return 0;
    case K_LIST:
        if (!*val)
            return 0;
        if (cfg->nlisten >= LNORM__MAX_LISTEN) {
            snprintf(err, errlen, "%s: more than %d given", k->name, LNORM__MAX_LISTEN);
            return -1;
        }
        if (strlen(val) >= LNORM__STR_MAX) {
            snprintf(err, errlen, "%s: value too long", k->name);
            return -1;
        }
        strcpy(cfg->listen[cfg->nlisten++], val);
        return 0;
    }
bad:
    snprintf(err, errlen, "%s: invalid value '%s'", k->name, val);
    return -1;
}

static void lnorm__config_defaults(lnorm__config *cfg)
{
    char err[128];
    memset(cfg, 0, sizeof *cfg);
    for (size_t i = 0; i < NKEYS; i++)
        if (lnorm__key_set(cfg, &lnorm__keys[i], lnorm__keys[i].def, err, sizeof err) != 0)
            abort(); /* a bad default is a programming error */
}

static char *lnorm__trim(char *s)
{
    while (*s == ' ' || *s == '\t')
        s++;
    char *e = s + strlen(s);
    while (e > s && (e[-1] == ' ' || e[-1] == '\t' || e[-1] == '\n' || e[-1] == '\r'))
        *--e = 0;
    return s;
}

static int lnorm__config_file(lnorm__config *cfg, const char *path, char *err, size_t errlen)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        snprintf(err, errlen, "config %s: %s", path, strerror(errno));
        return -1;
    }
    char line[4096];
    int lineno = 0, rc = 0;
    while (fgets(line, sizeof line, f)) {
        lineno++;
        size_t ln = strlen(line);
        if (ln == sizeof line - 1 && line[ln - 1] != '\n') {
            /* never split a line: its rest would read as a line of its own */
            snprintf(err, errlen, "config %s:%d: line longer than %zu bytes", path, lineno, sizeof line - 2);
            rc = -1;
            break;
        }
        char *s = lnorm__trim(line);
        if (!*s || *s == '#')
            continue;
        char *eq = strchr(s, '=');
        if (!eq) {
            snprintf(err, errlen, "config %s:%d: expected key = value", path, lineno);
            rc = -1;
            break;
        }
        *eq = 0;
        char *key = lnorm__trim(s), *val = lnorm__trim(eq + 1);
        const lnorm__key *k = lnorm__key_find(key, strlen(key));
        if (!k || !strcmp(key, "config")) {
            snprintf(err, errlen, "config %s:%d: unknown key '%s'", path, lineno, key);
            rc = -1;
            break;
        }
        char kerr[256];
        if (lnorm__key_set(cfg, k, val, kerr, sizeof kerr) != 0) {
            snprintf(err, errlen, "config %s:%d: %s", path, lineno, kerr);
            rc = -1;
            break;
        }
    }
    fclose(f);
    return rc;
}

/* priority-max-queue: "N1,N2,..." into cfg->priority_max_queue, one per
 * level (at most priority-levels of them, each 0..max-queue bound). */
static int lnorm__priority_list(lnorm__config *cfg, char *err, size_t errlen)
{
    memset(cfg->priority_max_queue, 0, sizeof cfg->priority_max_queue);
    const char *p = cfg->priority_max_queue_list;
    for (unsigned n = 0; *p; n++) {
        while (*p == ' ')
            p++;
        if (*p < '0' || *p > '9')
            goto bad;
        char *end;
        errno = 0;
        unsigned long long v = strtoull(p, &end, 10);
        if (errno || v > 1000000)
            goto bad;
        if (n >= cfg->priority_levels) {
            snprintf(err, errlen, "priority-max-queue: more values than priority-levels (%llu)",
                     (unsigned long long)cfg->priority_levels);
            return -1;
        }
        cfg->priority_max_queue[n] = v;
        for (p = end; *p == ' '; p++)
            ;
        if (*p == ',' && p[1])
            p++;
        else if (*p)
            goto bad;
    }
    return 0;
bad:
    snprintf(err, errlen, "priority-max-queue: '%s' is not a comma-separated list of numbers 0..1000000",
             cfg->priority_max_queue_list);
    return -1;
}

/* shm-uids: "U1,U2,..." into cfg->shm_uid (at most 16). */
static int lnorm__uid_list(lnorm__config *cfg, char *err, size_t errlen)
{
    cfg->nshm_uids = 0;
    for (const char *p = cfg->shm_uids; *p;) {
        while (*p == ' ')
            p++;
        if (*p < '0' || *p > '9')
            goto bad;
        char *end;
        errno = 0;
        unsigned long long v = strtoull(p, &end, 10);
        if (errno || v > 0xffffffffull || cfg->nshm_uids >= 16)
            goto bad;
        cfg->shm_uid[cfg->nshm_uids++] = v;
        for (p = end; *p == ' '; p++)
            ;
        if (*p == ',' && p[1])
            p++;
        else if (*p)
            goto bad;
    }
    return 0;
bad:
    snprintf(err, errlen, "shm-uids: '%s' is not a comma-separated list of at most 16 uids", cfg->shm_uids);
    return -1;
}

int lnorm__config_reload(int argc, char **argv, lnorm__config *out, char *errbuf, size_t errlen)
{
    int rc = lnorm__config_from_args(out, argc, argv, errbuf, errlen);
    if (rc < 0)
        return -1;
    if (rc != LNORM__CFG_RUN) { /* cannot be: the daemon started with these flags */
        snprintf(errbuf, errlen, "the command line no longer starts the daemon");
        return -1;
    }
    return 0;
}

int lnorm__config_from_args(lnorm__config *cfg, int argc, char **argv, char *err, size_t errlen)
{
    lnorm__config_defaults(cfg);
    /* Pass 1: --help, --version, --config. Pass 2: every other flag. */
    for (int pass = 1; pass <= 2; pass++) {
        bool flag_listen_seen = false;
        for (int i = 1; i < argc; i++) {
            const char *a = argv[i];
            if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
                if (pass == 1)
                    return LNORM__CFG_HELP;
                continue;
            }
            if (!strcmp(a, "--version")) {
                if (pass == 1)
                    return LNORM__CFG_VERSION;
                continue;
            }
            if (strncmp(a, "--", 2) != 0) {
                snprintf(err, errlen, "unexpected argument '%s'", a);
                return -1;
            }
            const char *name = a + 2, *eq = strchr(name, '=');
            size_t nlen = eq ? (size_t)(eq - name) : strlen(name);
            const lnorm__key *k = lnorm__key_find(name, nlen);
            if (!k) {
                snprintf(err, errlen, "unknown option '%s' (see --help)", a);
                return -1;
            }
            const char *val;
            if (eq)
                val = eq + 1;
            else if (k->kind == K_BOOL)
                val = "true";
            else if (i + 1 < argc)
                val = argv[++i];
            else {
                snprintf(err, errlen, "option --%s needs a value", k->name);
                return -1;
            }
            bool is_config = !strcmp(k->name, "config");
            if (pass == 1) {
                if (is_config) {
                    if (lnorm__key_set(cfg, k, val, err, errlen) != 0 ||
                        lnorm__config_file(cfg, val, err, errlen) != 0)
                        return -1;
                }
                continue;
            }
            if (is_config)
                continue;
            if (k->kind == K_LIST && !flag_listen_seen) {
                cfg->nlisten = 0; /* flags replace the file's list */
                flag_listen_seen = true;
            }
            if (lnorm__key_set(cfg, k, val, err, errlen) != 0)
                return -1;
        }
    }
    if (cfg->nlisten == 0) {
        strcpy(cfg->listen[0], "tcp://127.0.0.1:7878");
        strcpy(cfg->listen[1], "ipc:///tmp/lnormd.sock");
        cfg->nlisten = 2;
    }
    if (cfg->default_priority > cfg->priority_levels) {
        snprintf(err, errlen, "default-priority: %llu is above priority-levels %llu",
                 (unsigned long long)cfg->default_priority, (unsigned long long)cfg->priority_levels);
        return -1;
    }
    if (lnorm__priority_list(cfg, err, errlen) != 0 || lnorm__uid_list(cfg, err, errlen) != 0)
        return -1;
    if ((cfg->tls_cert[0] != 0) != (cfg->tls_key[0] != 0)) {
        snprintf(err, errlen, "tls-cert and tls-key go together");
        return -1;
    }
    if (cfg->tls_verify_peer && !cfg->tls_ca[0]) {
        snprintf(err, errlen, "tls-verify-peer needs tls-ca");
        return -1;
    }
    for (int i = 0; i < cfg->nlisten; i++) {
        if (!strncmp(cfg->listen[i], "tls+tcp://", 10) && !cfg->tls_cert[0]) {
            snprintf(err, errlen, "listen %s: tls+tcp:// needs tls-cert and tls-key", cfg->listen[i]);
            return -1;
        }
        if (strncmp(cfg->listen[i], "tcp://", 6) && strncmp(cfg->listen[i], "ipc://", 6) &&
            strncmp(cfg->listen[i], "tls+tcp://", 10)) {
            snprintf(err, errlen, "listen %s: only tcp://, ipc:// and tls+tcp:// are served", cfg->listen[i]);
            return -1;
        }
    }
    return LNORM__CFG_RUN;
}

static const char *lnorm__kind_arg(int kind)
{
    switch (kind) {
    case K_U64: return "N";
    case K_BOOL: return "";
    case K_PATH: return "FILE";
    case K_LIST: return "URL";
    case K_LEVEL: return "LEVEL";
    case K_CHOICE: return "NAME";
    default: return "VALUE";
    }
}

void lnorm__config_usage(FILE *f, const char *prog)
{
    fprintf(f, "usage: %s [options]\n\nServes LayerNorm and RMSNorm over NNG (lnorm.v1 protobuf messages).\n\n"
               "Every option is also a config-file key (key = value, without \"--\").\n\n", prog);
    for (size_t i = 0; i < NKEYS; i++) {
        const lnorm__key *k = &lnorm__keys[i];
        char head[96];
        snprintf(head, sizeof head, "--%s %s", k->name, lnorm__kind_arg(k->kind));
        fprintf(f, "  %-28s %s", head, k->help);
        if (k->kind == K_U64)
            fprintf(f, " [%llu..%llu, default %s]", (unsigned long long)k->min, (unsigned long long)k->max, k->def);
        else if (k->def[0])
            fprintf(f, " [default %s]", k->def);
        fputc('\n', f);
    }
    fprintf(f, "  %-28s %s\n  %-28s %s\n", "--help", "this text", "--version", "print the version");
    fprintf(f, "\nSignals: SIGINT/SIGTERM drain and exit 0; SIGHUP reloads log-level, max-queue-delay-us,\n"
               "max-batch-rows, max-batch-bytes, max-queue, priority-levels, default-priority,\n"
               "priority-max-queue and max-queue-wait-us from the config file (flags still override it).\n"
               "A bad option or config file exits with status 2.\n");
}

void lnorm__config_print_defaults(FILE *f)
{
    for (size_t i = 0; i < NKEYS; i++)
        fprintf(f, "# %s\n# %s = %s\n\n", lnorm__keys[i].help, lnorm__keys[i].name, lnorm__keys[i].def);
}
