/*
 * The parameter registry: gamma/beta stored once under an id, referenced by
 * requests. Reference counted: DropParams removes the id at once, and the
 * memory is freed when the last batch using it has finished. Registering an
 * id that exists is refused with LNORM_EEXIST (drop it first to replace).
 */
#ifndef LNORM_SERVER_PARAMS_H
#define LNORM_SERVER_PARAMS_H

#include <stddef.h>
#include <stdint.h>

#include "backend.h"
#include "stats.h"

typedef struct lnorm__params lnorm__params;

/* What max-params-bytes charges a registered set beyond its gamma and beta
 * bytes: its struct and the allocators' headers (the gauge
 * lnormd_params_bytes counts the same). */
#define LNORM__PSET_OVERHEAD 256u

/* One registered parameter set (read-only once registered). */
typedef struct lnorm__pset {
    struct lnorm__pset *next;   /* hash chain */
    lnorm__params *reg;
    char id[129];
    int dtype;
    uint64_t hidden;
    void *gamma;                /* NULL when none */
    void *beta;
    size_t bytes;
    long refs;                  /* under the registry lock */
} lnorm__pset;

/* gamma/beta go in be's payload memory when it states
 * LNORM__BACKEND_CAP_PINNED_BUFFERS; be NULL: malloc. */
int lnorm__params_create(lnorm__params **out, uint64_t max_bytes, lnorm__backend *be, lnorm__stats *st);
void lnorm__params_destroy(lnorm__params *p);

/* Copy gamma/beta under id. LNORM_EEXIST, LNORM_ELIMIT, LNORM_ENOMEM. */
int lnorm__params_register(lnorm__params *p, const char *id, int dtype, uint64_t hidden,
                           const void *gamma, size_t glen, const void *beta, size_t blen);
/* Remove id (LNORM_ENOTFOUND when unknown). */
int lnorm__params_drop(lnorm__params *p, const char *id);
/* Take a reference to id's parameters (LNORM_ENOTFOUND when unknown). */
int lnorm__params_get(lnorm__params *p, const char *id, lnorm__pset **out);
/* Release a reference taken by lnorm__params_get (NULL: no-op). */
void lnorm__params_put(lnorm__pset *ps);

#endif
