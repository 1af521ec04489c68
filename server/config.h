/*
 * lnormd's configuration: ONE table (name, kind, bounds, default, help)
 * drives the command-line flags, the config file (key = value lines, the
 * same names without "--") and --help. Flags override the file.
 */
#ifndef LNORM_SERVER_CONFIG_H
#define LNORM_SERVER_CONFIG_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "stats.h" /* LNORM__MAX_PRIORITY */

#define LNORM__MAX_LISTEN 16
#define LNORM__STR_MAX 1024

typedef struct lnorm__config {
    char listen[LNORM__MAX_LISTEN][LNORM__STR_MAX];
    int nlisten;
    char http[LNORM__STR_MAX];
    char ready_file[LNORM__STR_MAX];
    char backend[16];
    char cuda_devices[LNORM__STR_MAX];
    uint64_t cuda_slot_bytes;
    uint64_t cuda_slots;
    uint64_t cuda_staging_bytes;
    uint64_t cuda_stage_max_bytes;
    char cuda_sync[16];
    char cuda_fallback[16];
    uint64_t cpu_threads;
    uint64_t cpu_jobs;
    uint64_t max_batch_rows;
    uint64_t max_batch_bytes;
    uint64_t max_queue_delay_us;
    uint64_t max_queue;
    uint64_t priority_levels;
    uint64_t default_priority;
    char priority_max_queue_list[LNORM__STR_MAX];
    uint64_t priority_max_queue[LNORM__MAX_PRIORITY]; /* parsed from the list; [0]: level 1 */
    uint64_t max_queue_wait_us;
    uint64_t reply_threads;
    uint64_t max_message_bytes;
    uint64_t max_rows;
    uint64_t max_hidden;
    uint64_t max_params_bytes;
    uint64_t max_inflight_bytes;
    uint64_t contexts;
    uint64_t max_connections;
    uint64_t max_connections_per_peer;
    uint64_t frame_timeout_ms;
    uint64_t max_receive_bytes;
    bool allow_shm;
    char shm_uids[LNORM__STR_MAX];
    uint64_t shm_uid[16];    /* parsed from the list */
    int nshm_uids;
    uint64_t shm_max_regions;
    uint64_t shm_max_bytes;
    uint64_t workers;
    uint64_t drain_timeout_ms;
    uint64_t send_timeout_ms;
    int log_level;
    char config_file[LNORM__STR_MAX];
    char tls_cert[LNORM__STR_MAX];
    char tls_key[LNORM__STR_MAX];
    char tls_ca[LNORM__STR_MAX];
    bool tls_verify_peer;
} lnorm__config;

/* What lnorm__config_from_args asks the caller to do. */
enum { LNORM__CFG_RUN = 0, LNORM__CFG_HELP = 1, LNORM__CFG_VERSION = 2 };

/* Fill cfg from defaults, then the --config file, then the flags. Returns
 * LNORM__CFG_RUN/HELP/VERSION, or -1 after writing a message to errbuf. */
int lnorm__config_from_args(lnorm__config *cfg, int argc, char **argv, char *errbuf, size_t errlen);

/* The configuration again (SIGHUP) into *out, as at start: defaults, the
 * config file read anew, then the same flags, so that a flag still
 * overrides the file; the caller picks the keys that can change at run
 * time. 0 or -1 (errbuf). */
int lnorm__config_reload(int argc, char **argv, lnorm__config *out, char *errbuf, size_t errlen);

/* --help text: every key with its bounds, default and help. */
void lnorm__config_usage(FILE *f, const char *prog);

/* deploy/lnormd.conf-style listing of every key with its default. */
void lnorm__config_print_defaults(FILE *f);

#endif
