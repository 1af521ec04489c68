/*
 * The transport: one NNG rep0 socket, its listeners, and a pool of contexts
 * (nng_ctx + nng_aio), each receiving one request and sending its reply, so
 * that many requests are in flight and none blocks another.
 */
#ifndef LNORM_SERVER_TRANSPORT_H
#define LNORM_SERVER_TRANSPORT_H

#include <stddef.h>
#include <stdint.h>

#include <nng/nng.h>

#include "config.h"
#include "peer.h"
#include "stats.h"

typedef struct lnorm__transport lnorm__transport;

/* A request arrived on slot: the callee owns msg and must call
 * lnorm__transport_reply(slot, ...) exactly once, from any thread. */
typedef void (*lnorm__on_msg_fn)(void *arg, void *slot, nng_msg *msg);

/* Open the socket and start the listeners of cfg (bound at return; the real
 * URLs are in lnorm__transport_url), with cfg's connection limits and frame
 * timeout (conns.h), counted in st. LNORM_EINVAL for a bad URL or TLS
 * file, LNORM_ETRANSPORT when binding fails; errbuf says which. */
int lnorm__transport_create(lnorm__transport **out, const lnorm__config *cfg, lnorm__stats *st, lnorm__on_msg_fn fn,
                            void *arg, char *errbuf, size_t errlen);
/* Post the receives: requests start flowing. */
int lnorm__transport_start(lnorm__transport *tp);
int lnorm__transport_nlisteners(const lnorm__transport *tp);
/* The URL listener i is bound to (tcp port 0 replaced by the real port). */
const char *lnorm__transport_url(const lnorm__transport *tp, int i);
/* Who sent the request in hand on slot. */
void lnorm__transport_peer(void *slot, lnorm__peer *out);
/* fn(arg, pipe id) runs on an NNG thread each time a connection closes
 * (set before lnorm__transport_start). */
void lnorm__transport_on_close(lnorm__transport *tp, void (*fn)(void *arg, uint32_t pipe), void *arg);
/* Send msg as the reply of slot's request (NULL: no reply, e.g. out of memory). */
void lnorm__transport_reply(void *slot, nng_msg *msg);
/* Drain: refuse new connections; each context stops receiving once it has
 * sent its current reply (requests in hand are finished). */
void lnorm__transport_drain(lnorm__transport *tp);
/* Requests received and not yet replied to. */
int lnorm__transport_busy(lnorm__transport *tp);
/* Connections with a reply handed to NNG but not yet written out (from
 * NNG's pipe statistics; 0 where the NNG build has none). */
int lnorm__transport_in_transit(lnorm__transport *tp);
/* When the last request arrived (monotonic ns). */
uint64_t lnorm__transport_last_recv_ns(lnorm__transport *tp);
/* Close the socket: pending receives end; replies after this are dropped. */
void lnorm__transport_close(lnorm__transport *tp);
/* Free (after close, once no reply can come any more). */
void lnorm__transport_destroy(lnorm__transport *tp);

#endif
