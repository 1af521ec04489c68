/* Region control requests and tensors by reference (shm.h). */
#include <stdio.h>
#include <string.h>

#include "log.h"
#include "ring.h"
#include "shm.h"

int lnorm__shm_control(lnorm__daemon *d, const lnorm__peer *peer, const Lnorm__V1__Request *m,
                       Lnorm__V1__Response *resp, lnorm__shm_reply *out, char *why, size_t n)
{
    int rc;
    switch (m->body_case) {
    case LNORM__V1__REQUEST__BODY_REGISTER_REGION: {
        const Lnorm__V1__RegisterRegionRequest *q = m->register_region;
        uint64_t id = 0;
        if (q->cuda_ipc_handle.len)
            rc = lnorm__regions_register_device(d->regions, peer, q->cuda_ipc_handle.data, q->cuda_ipc_handle.len,
                                                q->cuda_device, q->bytes, &id, why, n);
        else
            rc = lnorm__regions_register_host(d->regions, peer, q->fd, q->bytes, &id, why, n);
        if (rc != LNORM_OK)
            return rc;
        lnorm__v1__register_region_response__init(&out->reg);
        out->reg.region = id;
        resp->body_case = LNORM__V1__RESPONSE__BODY_REGISTER_REGION;
        resp->register_region = &out->reg;
        return LNORM_OK;
    }
    case LNORM__V1__REQUEST__BODY_UNREGISTER_REGION:
        rc = lnorm__regions_unregister(d->regions, peer, m->unregister_region->region);
        if (rc != LNORM_OK) {
            snprintf(why, n, "unregister_region.region: %llu is not one of this process's regions",
                     (unsigned long long)m->unregister_region->region);
            return rc;
        }
        lnorm__v1__unregister_region_response__init(&out->unreg);
        resp->body_case = LNORM__V1__RESPONSE__BODY_UNREGISTER_REGION;
        resp->unregister_region = &out->unreg;
        return LNORM_OK;
    case LNORM__V1__REQUEST__BODY_REGION_STATUS: {
        if ((rc = lnorm__regions_allowed(d->regions, peer, why, n)) != LNORM_OK)
            return rc;
        lnorm__region_info ri[64];
        int k = lnorm__regions_list(d->regions, peer, ri, 64);
        lnorm__v1__region_status_response__init(&out->status);
        for (int i = 0; i < k; i++) {
            lnorm__v1__region_info__init(&out->info[i]);
            out->info[i].region = ri[i].id;
            out->info[i].bytes = ri[i].bytes;
            out->info[i].device = ri[i].device;
            out->info[i].requests = ri[i].requests;
            out->info[i].ring = ri[i].ring;
            out->infop[i] = &out->info[i];
        }
        out->status.regions = out->infop;
        out->status.n_regions = (size_t)k;
        resp->body_case = LNORM__V1__RESPONSE__BODY_REGION_STATUS;
        resp->region_status = &out->status;
        return LNORM_OK;
    }
    case LNORM__V1__REQUEST__BODY_ATTACH_RING: {
        const Lnorm__V1__AttachRingRequest *q = m->attach_ring;
        lnorm__ring *ring = NULL;
        rc = lnorm__regions_attach_ring(d->regions, peer, q->region, q->offset, q->entries, &ring, why, n);
        if (rc != LNORM_OK)
            return rc;
        LOG_INFO("region %llu: ring of %u entries attached at offset %llu", (unsigned long long)q->region,
                 q->entries, (unsigned long long)q->offset);
        lnorm__v1__attach_ring_response__init(&out->attach);
        resp->body_case = LNORM__V1__RESPONSE__BODY_ATTACH_RING;
        resp->attach_ring = &out->attach;
        return LNORM_OK;
    }
    default:
        snprintf(why, n, "body: not a region request");
        return LNORM_EINVAL;
    }
}

static const char *const lnorm__tnames[LNORM__T_N] = {"x", "residual", "y", "mean", "rstd", "residual_out",
                                                      "gamma", "beta"};

int lnorm__shm_resolve(lnorm__daemon *d, lnorm__req *r, const lnorm__peer *peer, lnorm__region *own, char *why,
                       size_t n)
{
    lnorm__decoded *dec = &r->dec;
    void *p[LNORM__T_N] = {0};
    for (int t = 0; t < LNORM__T_N; t++) {
        const lnorm__tref *f = &dec->ref[t];
        if (!f->set)
            continue;
        lnorm__region *rg = NULL;
        for (int k = 0; k < r->nrg && !rg; k++)
            if (r->rg[k]->id == f->region)
                rg = r->rg[k];
        if (!rg) {
            int rc = LNORM_ENOTFOUND;
            if (own) {
                if (own->id == f->region) {
                    lnorm__region_ref(own);
                    rg = own;
                    rc = LNORM_OK;
                }
            } else if (peer) {
                rc = lnorm__regions_get(d->regions, peer, f->region, &rg);
            }
            if (rc != LNORM_OK) {
                snprintf(why, n, "%s: region %llu is not one of this process's regions", lnorm__tnames[t],
                         (unsigned long long)f->region);
                return LNORM_ENOTFOUND;
            }
            r->rg[r->nrg++] = rg;
            atomic_fetch_add(&rg->requests, 1);
        }
        /* GPU memory (CUDA IPC): all or nothing, one GPU. */
        if (rg->device != r->rg[0]->device || (rg->device && rg->gpu != r->rg[0]->gpu)) {
            snprintf(why, n, "%s: region %llu: a request's tensors must all be in host regions or all in "
                     "regions of one GPU", lnorm__tnames[t], (unsigned long long)f->region);
            return LNORM_EINVAL;
        }
        p[t] = lnorm__region_at(rg, f->offset, f->bytes, f->align, lnorm__tnames[t], why, n);
        if (!p[t])
            return LNORM_EINVAL;
    }
    if (r->nrg && r->rg[0]->device) {
        if (!(d->be->ops->caps & LNORM__BACKEND_CAP_DEVICE_SEGMENTS)) {
            snprintf(why, n, "GPU regions: the %s backend cannot compute on GPU memory", d->be->ops->name);
            return LNORM_ENOTSUP;
        }
        if (dec->in_bytes || dec->params_id || !dec->ref[LNORM__T_Y].set ||
            (dec->want_mean && !dec->ref[LNORM__T_MEAN].set) || (dec->want_rstd && !dec->ref[LNORM__T_RSTD].set) ||
            (dec->res_out_bytes && !dec->ref[LNORM__T_RES_OUT].set)) {
            snprintf(why, n, "GPU regions: every input and output of the request must be in them (no inline "
                     "bytes, no params_id)");
            return LNORM_EINVAL;
        }
        r->on_device = 1;
        r->gpu = (int)r->rg[0]->gpu;
    }
    lnorm_segment *s = &dec->seg;
    if (p[LNORM__T_X])
        s->x = p[LNORM__T_X];
    if (p[LNORM__T_RESIDUAL])
        s->residual = p[LNORM__T_RESIDUAL];
    if (p[LNORM__T_GAMMA])
        s->gamma = p[LNORM__T_GAMMA];
    if (p[LNORM__T_BETA])
        s->beta = p[LNORM__T_BETA];
    if (p[LNORM__T_Y])
        s->y = p[LNORM__T_Y];
    if (p[LNORM__T_MEAN])
        s->mean = p[LNORM__T_MEAN];
    if (p[LNORM__T_RSTD])
        s->rstd = p[LNORM__T_RSTD];
    if (p[LNORM__T_RES_OUT])
        s->residual_out = p[LNORM__T_RES_OUT];
    return LNORM_OK;
}

void lnorm__shm_release(lnorm__req *r)
{
    for (int k = 0; k < r->nrg; k++) {
        atomic_fetch_sub(&r->rg[k]->requests, 1);
        lnorm__region_put(r->rg[k]);
    }
    r->nrg = 0;
}
