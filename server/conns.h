/*
 * Connections under hostile peers: the connection limits (per listener, per
 * peer address) applied when NNG offers a new pipe, and the frame watchdog,
 * a thread that closes a tcp:// or tls+tcp:// connection whose frame has
 * been in progress longer than frame-timeout-ms, and the connections with
 * the largest frames in progress while those hold more than
 * max-receive-bytes (NNG reserves a frame's whole declared size when its
 * header arrives, and has neither limit).
 *
 * How a frame in progress is seen (NNG says nothing about one): over tcp://
 * the kernel's count of bytes received on the connection (TCP_INFO), less
 * what is still unread in its queue, is what NNG has read; NNG's pipe
 * statistics give the messages it completed (rx_msgs, rx_bytes); SP over
 * TCP puts 8 bytes of handshake before them and 8 of length in front of
 * each, so any excess is a frame begun and not finished. Over tls+tcp://
 * the bytes are TLS records: there, bytes read since the pipe was taken or
 * since its last completed message mark a frame in progress (docs/security.md
 * says what that misses). ipc:// connections (local peers, 0660 socket) are
 * limited per listener only and not watched.
 */
#ifndef LNORM_SERVER_CONNS_H
#define LNORM_SERVER_CONNS_H

#include <stdint.h>

#include <nng/nng.h>

#include "config.h"
#include "stats.h"

typedef struct lnorm__conns lnorm__conns;

/* Limits and timeout from cfg; counters go to st (may be NULL). The
 * watchdog starts with lnorm__conns_watch. NULL when out of memory. */
lnorm__conns *lnorm__conns_create(const lnorm__config *cfg, lnorm__stats *st);

/* Watch the pipes of socket sock: the watchdog thread starts, applying
 * frame-timeout-ms (unless 0) and max-receive-bytes. 0, or an errno. */
int lnorm__conns_watch(lnorm__conns *c, nng_socket sock);

/* NNG offers pipe p (NNG_PIPE_EV_ADD_PRE): 1 to take it (now counted),
 * 0 when a limit refuses it (counted in /metrics; the caller closes it). */
int lnorm__conns_admit(lnorm__conns *c, nng_pipe p);

/* Close the connection of pipe id. A tcp:// or tls+tcp:// connection is
 * shut down at its socket (shutdown(2)), and NNG closes the pipe from its
 * own receive, which then fails: libnng 1.5.2's nng_pipe_close of a
 * connection while a message is arriving can drop the read of the rest
 * unstarted, and its reaper then waits for good (no closed connection of
 * the process is torn down again, and exit blocks). Others, and a
 * connection whose socket is not found: nng_pipe_close. */
void lnorm__conns_close(lnorm__conns *c, uint32_t id);

/* Pipe p is gone (NNG_PIPE_EV_REM_POST); unknown pipes are ignored. */
void lnorm__conns_removed(lnorm__conns *c, nng_pipe p);

/* Stop the watchdog and free (after the socket is closed). */
void lnorm__conns_destroy(lnorm__conns *c);

#endif
