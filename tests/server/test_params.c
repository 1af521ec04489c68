/*
 * Parameter registry unit tests, no daemon (server/params.c): many sets,
 * so that the table grows several times; every set found with its own
 * bytes after each growth; drops, re-registration, references that outlive
 * a drop; and the charge against max-params-bytes, bookkeeping included,
 * so that many tiny sets cannot hold more memory than the limit says.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "params.h"
#include "stats.h"

enum { N = 5000 }; /* 256 chains to start: the table doubles 4 times */

/* Set i: hidden 1 + i % 7, gamma bytes derived from i (f32, 4 bytes each). */
static size_t set_bytes(int i, uint8_t *g)
{
    size_t n = 4 * (size_t)(1 + i % 7);
    for (size_t k = 0; k < n; k++)
        g[k] = (uint8_t)(i * 31 + (int)k * 7 + 1);
    return n;
}

static int set_ok(lnorm__params *p, int i, const char *why)
{
    char id[32];
    uint8_t g[64];
    snprintf(id, sizeof id, "layer.%d:ln", i);
    size_t n = set_bytes(i, g);
    lnorm__pset *ps = NULL;
    int rc = lnorm__params_get(p, id, &ps);
    int ok = rc == LNORM_OK && ps && !strcmp(ps->id, id) && ps->hidden == (uint64_t)(1 + i % 7) && ps->gamma &&
             !memcmp(ps->gamma, g, n) && !ps->beta;
    CHECK(ok, "%s: set %d (rc %d)", why, i, rc);
    lnorm__params_put(ps);
    return ok;
}

int main(void)
{
    lnorm__stats st;
    memset(&st, 0, sizeof st);
    lnorm__params *p = NULL;
    CHECK(lnorm__params_create(&p, 1ull << 30, NULL, &st) == LNORM_OK && p, "create");
    if (!p)
        return 1;

    /* Many sets: each found, with its own bytes, after every growth. */
    uint64_t want_bytes = 0;
    for (int i = 0; i < N; i++) {
        char id[32];
        uint8_t g[64];
        snprintf(id, sizeof id, "layer.%d:ln", i);
        size_t n = set_bytes(i, g);
        CHECK(lnorm__params_register(p, id, LNORM_DTYPE_F32, (uint64_t)(1 + i % 7), g, n, NULL, 0) == LNORM_OK,
              "register %d", i);
        want_bytes += n + LNORM__PSET_OVERHEAD;
        if ((i & (i + 1)) == 0 || i == N - 1) /* after 1, 2, 4, ... sets and at the end */
            for (int k = 0; k <= i; k += 1 + k / 8)
                if (!set_ok(p, k, "after growth"))
                    break;
    }
    int all = 1;
    for (int i = 0; i < N && all; i++)
        all = set_ok(p, i, "all");
    CHECK((uint64_t)atomic_load(&st.params_count) == N, "count %lld", (long long)atomic_load(&st.params_count));
    CHECK((uint64_t)atomic_load(&st.params_bytes) == want_bytes, "bytes %lld, want %llu",
          (long long)atomic_load(&st.params_bytes), (unsigned long long)want_bytes);
    lnorm__pset *none = (lnorm__pset *)1;
    CHECK(lnorm__params_get(p, "layer.5000:ln", &none) == LNORM_ENOTFOUND && none == NULL, "unknown id");
    uint8_t g1[4] = {1, 2, 3, 4};
    CHECK(lnorm__params_register(p, "layer.17:ln", LNORM_DTYPE_F32, 1, g1, 4, NULL, 0) == LNORM_EEXIST, "twice");

    /* Drop every other set; a reference taken before a drop stays valid. */
    lnorm__pset *held = NULL;
    CHECK(lnorm__params_get(p, "layer.10:ln", &held) == LNORM_OK, "hold");
    for (int i = 0; i < N; i += 2) {
        char id[32];
        snprintf(id, sizeof id, "layer.%d:ln", i);
        CHECK(lnorm__params_drop(p, id) == LNORM_OK, "drop %d", i);
        CHECK(lnorm__params_drop(p, id) == LNORM_ENOTFOUND, "drop %d again", i);
    }
    for (int i = 1; i < N && all; i += 2)
        all = set_ok(p, i, "after the drops");
    for (int i = 0; i < N; i += 2) {
        char id[32];
        snprintf(id, sizeof id, "layer.%d:ln", i);
        lnorm__pset *ps = NULL;
        CHECK(lnorm__params_get(p, id, &ps) == LNORM_ENOTFOUND, "dropped %d still found", i);
    }
    uint8_t g10[64];
    size_t n10 = set_bytes(10, g10);
    CHECK(held && !memcmp(held->gamma, g10, n10), "held set after its drop");
    lnorm__params_put(held);
    CHECK((uint64_t)atomic_load(&st.params_count) == N / 2, "count after drops %lld",
          (long long)atomic_load(&st.params_count));
    lnorm__params_destroy(p);

    /* The limit charges each set's bookkeeping: 4096 bytes hold 16 sets
     * of 1 byte of gamma at most (16 x (1 + 256)), and not one more. */
    memset(&st, 0, sizeof st);
    CHECK(lnorm__params_create(&p, 16 * (1 + LNORM__PSET_OVERHEAD), NULL, &st) == LNORM_OK, "create small");
    int accepted = 0, rc = LNORM_OK;
    for (int i = 0; i < 100 && rc == LNORM_OK; i++) {
        char id[32];
        snprintf(id, sizeof id, "tiny.%d", i);
        rc = lnorm__params_register(p, id, LNORM_DTYPE_F16, 1, g1, 1, NULL, 0);
        if (rc == LNORM_OK)
            accepted++;
    }
    CHECK(rc == LNORM_ELIMIT && accepted == 16, "tiny sets: %d accepted, then %d", accepted, rc);
    CHECK(lnorm__params_drop(p, "tiny.3") == LNORM_OK, "drop a tiny set");
    CHECK(lnorm__params_register(p, "tiny.again", LNORM_DTYPE_F16, 1, g1, 1, NULL, 0) == LNORM_OK,
          "room again after a drop");
    lnorm__params_destroy(p);

    return check_finish("server.params_registry");
}
