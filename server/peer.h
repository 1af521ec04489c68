/* Who sent a message, as the transport knows it (pid and uid come from the
 * kernel, SO_PEERCRED, over ipc:// only; never from the message). */
#ifndef LNORM_SERVER_PEER_H
#define LNORM_SERVER_PEER_H

#include <stdint.h>

typedef struct lnorm__peer {
    uint32_t pipe;      /* NNG pipe id (0: none) */
    int local;          /* 1: ipc, pid and uid below are the kernel's */
    int64_t pid;
    uint64_t uid;
} lnorm__peer;

#endif
