/*
 * The daemon's side of shared memory (docs/shm.md): the region control
 * requests (RegisterRegion, UnregisterRegion, RegionStatus, AttachRing) and
 * the resolution of a request's tensors given by reference into addresses
 * inside the caller's regions. The regions themselves: regions.h; rings:
 * ring.h.
 */
#ifndef LNORM_SERVER_SHM_H
#define LNORM_SERVER_SHM_H

#include "daemon.h"
#include "regions.h"
#include "request.h"

/* Storage for a control reply's body (lives until the reply is packed). */
typedef struct lnorm__shm_reply {
    Lnorm__V1__RegisterRegionResponse reg;
    Lnorm__V1__UnregisterRegionResponse unreg;
    Lnorm__V1__AttachRingResponse attach;
    Lnorm__V1__RegionStatusResponse status;
    Lnorm__V1__RegionInfo info[64];
    Lnorm__V1__RegionInfo *infop[64];
} lnorm__shm_reply;

/* Answer a region control request m from peer: LNORM_OK with resp's body
 * set (pointing into out), or an error with why. */
int lnorm__shm_control(lnorm__daemon *d, const lnorm__peer *peer, const Lnorm__V1__Request *m,
                       Lnorm__V1__Response *resp, lnorm__shm_reply *out, char *why, size_t n);

/* Point r's segment at its tensors given by reference: in own (a ring's
 * region) when own is set, else in peer's regions by id. Takes a reference
 * on each region used (r->rg, put by the request's release). LNORM_OK, or
 * an error with why. */
int lnorm__shm_resolve(lnorm__daemon *d, lnorm__req *r, const lnorm__peer *peer, lnorm__region *own, char *why,
                       size_t n);

/* Drop r's region references (and their request counts). */
void lnorm__shm_release(lnorm__req *r);

#endif
