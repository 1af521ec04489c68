/*
 * Talking to lnormd in its tests with raw NNG req0 + protobuf-c (no client
 * library): dial, call, build a Normalize request from a test case and
 * check its reply. The daemon itself runs through
 * tests/common/testdaemon.h.
 */
#ifndef LNORM_TEST_SERVER_HARNESS_H
#define LNORM_TEST_SERVER_HARNESS_H

#include <stddef.h>
#include <stdint.h>

#include <nng/nng.h>

#include "lnorm.pb-c.h"
#include "check.h"
#include "testdaemon.h"
#include "lnorm_core.h"
#include "testcase.h"
#include "testutil.h"

/* A req0 socket dialed to url (recv timeout 20 s). */
int ts_dial(nng_socket *s, const char *url);
/* A req0 socket dialed over TLS: trust ca, present cert/key when given
 * (NULL: none), recv timeout ms. 0, or -1 when the dial fails. */
int ts_dial_tls(nng_socket *s, const char *url, const char *ca, const char *cert, const char *key, int timeout_ms);
/* Send raw bytes, receive and unpack the reply (NULL on error). */
Lnorm__V1__Response *ts_call_raw(nng_socket s, const void *buf, size_t len);
/* Pack req, then as ts_call_raw. */
Lnorm__V1__Response *ts_call(nng_socket s, const Lnorm__V1__Request *req);
/* The reply's status code (0 when status absent). */
int ts_code(const Lnorm__V1__Response *r);
const char *ts_msg(const Lnorm__V1__Response *r);

/* A Normalize request for a test case (the request points into tc). */
typedef struct ts_norm {
    Lnorm__V1__Request req;
    Lnorm__V1__NormalizeRequest n;
    Lnorm__V1__Affine aff;
} ts_norm;
void ts_norm_from_case(ts_norm *m, const lnorm_test_case *tc, uint64_t id, int inline_params);

/* Check a Normalize reply against the float64 reference (lnorm_test_check)
 * and bit-for-bit against lnorm_cpu_run_segment on the same inputs.
 * Returns the number of problems (0: good). */
long ts_check_reply(const lnorm_test_case *tc, const Lnorm__V1__Response *r, const char *label);

#endif
