/*
 * liblnorm options for a test's client (header only: for tests that link
 * liblnorm; lnorm_testbase does not).
 */
#ifndef LNORM_TESTCLIENT_H
#define LNORM_TESTCLIENT_H

#include "lnorm/lnorm.h"

/* The defaults, with send and receive timeouts of timeout_ms and NNG's
 * reconnect back-off from reconnect_min_ms to reconnect_max_ms. */
static inline void tc_client_opts(lnorm_client_opts *o, int timeout_ms, int reconnect_min_ms, int reconnect_max_ms)
{
    lnorm_client_opts_init(o);
    o->send_timeout_ms = timeout_ms;
    o->recv_timeout_ms = timeout_ms;
    o->reconnect_min_ms = reconnect_min_ms;
    o->reconnect_max_ms = reconnect_max_ms;
}

#endif /* LNORM_TESTCLIENT_H */
