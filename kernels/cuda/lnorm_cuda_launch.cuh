/*
 * Launching the CUDA kernels: grid and stage sizing of each kernel family
 * and the choice, at run time, of the kernel of a tier (the tier table of
 * lnorm_cuda_impl.h) and form (p->fast, chosen by the host for the launch's
 * segments). Each lnorm_cuda_<dtype>.cu instantiates launch_tier for one x
 * dtype. The design (tiers, vectors, clusters) is described in docs/gpu.md.
 */
#ifndef LNORM_CUDA_LAUNCH_CUH
#define LNORM_CUDA_LAUNCH_CUH

#include "lnorm_cuda_bulk.cuh"
#include "lnorm_cuda_fast.cuh"
#include "lnorm_cuda_general.cuh"

namespace lnorm_cuda {

/* A launch configuration for clusters of cl CTAs of `block` threads on
 * stream st (cudaLaunchKernelEx); *at holds its one attribute, so it must
 * outlive the launch. */
static inline cudaLaunchConfig_t cluster_config(int cl, dim3 grid, dim3 block, size_t smem, cudaStream_t st,
                                                cudaLaunchAttribute *at)
{
    cudaLaunchConfig_t cfg = {};
    at->id = cudaLaunchAttributeClusterDimension;
    at->val.clusterDim.x = (unsigned)cl;
    at->val.clusterDim.y = 1;
    at->val.clusterDim.z = 1;
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = st;
    cfg.attrs = at;
    cfg.numAttrs = 1;
    return cfg;
}

/* The current device and its number of SMs. */
static cudaError_t device_sms(int *dev, int *sms)
{
    cudaError_t e = cudaGetDevice(dev);
    if (e != cudaSuccess)
        return e;
    return cudaDeviceGetAttribute(sms, cudaDevAttrMultiProcessorCount, *dev);
}

/* Resident CTAs per SM of kern at block threads without dynamic shared
 * memory (at least 1), cached per device in cache[64] (one per kernel). */
template <typename K> static cudaError_t cached_occupancy(K kern, int block, int dev, int *cache, int *occ)
{
    *occ = dev < 64 ? cache[dev] : 0;
    if (*occ > 0)
        return cudaSuccess;
    cudaError_t e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(occ, kern, block, 0);
    if (e != cudaSuccess)
        return e;
    if (*occ < 1)
        *occ = 1;
    if (dev < 64)
        cache[dev] = *occ;
    return cudaSuccess;
}

/* Launch one register tier; grid capped at a few waves of resident CTAs
 * (clusters: the number of co-resident clusters). Returns the CUDA error. */
template <typename TX, int TPR, int NCH, int CL>
static cudaError_t launch_reg(const lnorm__kparams *p, cudaStream_t st)
{
    constexpr int BLOCK = RegShape<TPR, NCH>::block;
    constexpr int RPC = BLOCK / TPR;
    static int cache[64]; /* per device: occupancy (CTAs/SM or clusters), 0 = unknown */
    int dev = 0, sms = 0;
    cudaError_t e = device_sms(&dev, &sms);
    if (e != cudaSuccess)
        return e;
    auto kern = k_reg<TX, TPR, NCH, CL>;
    if constexpr (CL == 1) {
        int occ = 0;
        e = cached_occupancy(kern, BLOCK, dev, cache, &occ);
        if (e != cudaSuccess)
            return e;
        const int64_t need = (p->total_rows + RPC - 1) / RPC;
        const int64_t cap = (int64_t)sms * occ * 4;
        const unsigned grid = (unsigned)(need < cap ? need : cap);
        kern<<<grid, BLOCK, 0, st>>>(*p);
        return cudaGetLastError();
    } else {
        cudaLaunchAttribute at;
        cudaLaunchConfig_t cfg = cluster_config(CL, dim3(CL * sms, 1, 1), dim3(BLOCK, 1, 1), 0, st, &at);
        int ncl = dev < 64 ? cache[dev] : 0;
        if (ncl <= 0) {
            if (CL > 8) {
                e = cudaFuncSetAttribute(kern, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
                if (e != cudaSuccess)
                    return e;
            }
            e = cudaOccupancyMaxActiveClusters(&ncl, kern, &cfg);
            if (e != cudaSuccess)
                return e;
            if (ncl < 1)
                return cudaErrorInvalidConfiguration;
            if (dev < 64)
                cache[dev] = ncl;
        }
        const int64_t need = p->total_rows;
        const int64_t cl = need < ncl ? need : ncl;
        cfg.gridDim = dim3((unsigned)(cl * CL), 1, 1);
        return cudaLaunchKernelEx(&cfg, kern, *p);
    }
}

/* Launch the drain of a fast or bulk launch (lnorm__rescue) right after it
 * on the same stream: k_reg's list form of the tier, which returns at once
 * while the list is empty, on at most two CTAs an SM (one wave of clusters):
 * few CTAs to start on every launch, enough for a list of 1024 rows (a
 * launch whose rows all need the rescue runs them at that occupancy). On
 * sm_90 and up, as a programmatic dependent of that launch, which may
 * start it as that kernel's CTAs exit; it waits for that kernel's end and
 * writes (grid_dep_wait) before it reads the list. (The fast kernels do
 * not trigger it earlier: a trigger at each CTA's start gained nothing
 * measurable and cost 20% in f32 H = 512, 262144 CTAs of 64 threads,
 * H200.) Returns the CUDA error. */
template <typename TX, int TPR, int NCH, int CL>
static cudaError_t launch_drain(const lnorm__kparams *p, cudaStream_t st)
{
    constexpr int BLOCK = RegShape<TPR, NCH>::block;
    static int cache[64]; /* per device: resident CTAs an SM (CL == 1) or clusters, 0 = unknown */
    static int dep[64];   /* per device: programmatic dependent launches, 1 yes, 2 no, 0 unknown */
    int dev = 0, sms = 0;
    cudaError_t e = device_sms(&dev, &sms);
    if (e != cudaSuccess)
        return e;
    auto kern = k_reg<TX, TPR, NCH, CL, true>;
    int pdl = dev < 64 ? dep[dev] : 0;
    if (pdl == 0) {
        int major = 0;
        e = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
        if (e != cudaSuccess)
            return e;
        pdl = major >= 9 ? 1 : 2;
        if (dev < 64)
            dep[dev] = pdl;
    }
    cudaLaunchAttribute at[2];
    cudaLaunchConfig_t cfg = cluster_config(CL, dim3(CL * sms, 1, 1), dim3(BLOCK, 1, 1), 0, st, &at[0]);
    if (CL == 1)
        cfg.numAttrs = 0;
    int n = dev < 64 ? cache[dev] : 0;
    if (n <= 0) {
        if constexpr (CL == 1) {
            e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kern, BLOCK, 0);
        } else {
            if (CL > 8)
                e = cudaFuncSetAttribute(kern, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
            if (e == cudaSuccess)
                e = cudaOccupancyMaxActiveClusters(&n, kern, &cfg);
        }
        if (e != cudaSuccess)
            return e;
        if (n < 1)
            return cudaErrorInvalidConfiguration;
        if (dev < 64)
            cache[dev] = n;
    }
    cfg.gridDim = dim3((unsigned)(CL == 1 ? (n < 2 ? n : 2) * sms : n * CL), 1, 1);
    if (pdl == 1) {
        at[cfg.numAttrs].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        at[cfg.numAttrs].val.programmaticStreamSerializationAllowed = 1;
        cfg.numAttrs++;
        e = cudaLaunchKernelEx(&cfg, kern, *p);
        if (e == cudaSuccess)
            return e;
        /* refused (nothing launched): this device launches its drains plainly from now on */
        (void)cudaGetLastError();
        if (dev < 64)
            dep[dev] = 2;
        cfg.numAttrs--;
    }
    return cudaLaunchKernelEx(&cfg, kern, *p);
}

/* Launch the streaming tier: one CTA per row, at most 2 waves. */
template <typename TX> static cudaError_t launch_stream(const lnorm__kparams *p, cudaStream_t st)
{
    int dev = 0, sms = 0;
    cudaError_t e = device_sms(&dev, &sms);
    if (e != cudaSuccess)
        return e;
    const int64_t cap = (int64_t)sms * 2;
    const unsigned grid = (unsigned)(p->total_rows < cap ? p->total_rows : cap);
    k_stream<TX><<<grid, 1024, 0, st>>>(*p);
    return cudaGetLastError();
}

/* Largest dynamic shared memory of one bulk CTA (dynamic + static must stay
 * under the 227 KiB opt-in of sm_90). */
#define LNORM__BULK_SMEM_CTA (200 * 1024)
#define LNORM__BULK_SMEM_SM (227 * 1024) /* shared memory of an sm_90 SM that CTAs may use */
/* Shared memory per SM the stages of the bulk kernels that hold the row in
 * registers may take; the rest is left to L1, from which every row reads
 * gamma/beta (more stages at the cost of L1 were slower). */
#define LNORM__BULK_SMEM_KB 64
/* The most stages of an SMR kernel: one row in flight behind the one being
 * normalized (LayerNorm in clusters +3-13%, in tier 10 +1-3%, against
 * three, H200). */
#define LNORM__SMR_STAGES 2

/* A grid of n CTAs (clusters) under the "fwd_grid" cap, when set. */
static inline int64_t fwd_capped(int64_t n)
{
    return lnorm__fwd_grid > 0 && lnorm__fwd_grid < n ? (int64_t)lnorm__fwd_grid : n;
}

/* Launch the bulk kernel of one tier: choose the number of resident CTAs
 * per SM (register occupancy first) and the stages that fit their shared
 * memory (at least 2, at most LNORM__BULK_MAXST; 3 or more preferred),
 * one wave of persistent CTAs (clusters). Returns the CUDA error;
 * cudaErrorInvalidValue when even two stages do not fit. */
template <typename TX, typename TP, bool RMS, int TPR, int NCH, int CL>
static cudaError_t launch_bulk(const lnorm__kparams *p, cudaStream_t st)
{
    constexpr int BLOCK = BulkShape<TPR, NCH>::block;
    constexpr int RPC = BLOCK / TPR;
    static int occ_cache[64];
    static int attr_set[64];
    int dev = 0, sms = 0;
    cudaError_t e = device_sms(&dev, &sms);
    if (e != cudaSuccess)
        return e;
    auto kern = k_bulk<TX, TP, RMS, TPR, NCH, CL>;
    /* A set-up call that fails leaves nothing launched: clear the error it
     * recorded and let the caller run the kernel without bulk copies. */
    if (dev >= 64 || !attr_set[dev]) {
        e = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, LNORM__BULK_SMEM_CTA);
        if (e == cudaSuccess && CL > 8)
            e = cudaFuncSetAttribute(kern, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
        if (e != cudaSuccess) {
            (void)cudaGetLastError();
            return cudaErrorInvalidValue;
        }
        if (dev < 64)
            attr_set[dev] = 1;
    }
    int occ = 0;
    if (cached_occupancy(kern, BLOCK, dev, occ_cache, &occ) != cudaSuccess) {
        (void)cudaGetLastError();
        return cudaErrorInvalidValue;
    }
    if (lnorm__bulk_ctas_override > 0 && lnorm__bulk_ctas_override < occ)
        occ = lnorm__bulk_ctas_override;
    const int64_t rs = bulk_row_bytes(*p, (int64_t)TPR * NCH * 16, (int)sizeof(TX), CL, BulkShape<TPR, NCH, CL>::smr);
    const int64_t stage_bytes = rs * RPC;
    /* Every CTA the registers allow, and as many stages as the per-SM
     * budget gives each (at least 2). SMR kernels: the CTAs the registers
     * allow (one of 1024 threads) share the SM's shared memory, less each
     * CTA's static shared memory and the 1 KiB the SM reserves per CTA, for
     * at most LNORM__SMR_STAGES stages each (SMR holds a stage through the
     * whole row). */
    constexpr int64_t static_cta = (int64_t)sizeof(ClusterRed<CL, BLOCK / 32>) + (int64_t)sizeof(DynTiles) +
                                   8 * LNORM__BULK_MAXST +
                                   2 * 4 * (BLOCK / 32) + 1024;
    constexpr bool SMR = BulkShape<TPR, NCH, CL>::smr;
    constexpr int64_t max_st = SMR ? LNORM__SMR_STAGES : LNORM__BULK_MAXST;
    int n = occ, stages = 0;
    for (; n >= 1; n--) {
        int64_t per = SMR ? ((int64_t)LNORM__BULK_SMEM_SM - n * static_cta) / n
                          : (int64_t)LNORM__BULK_SMEM_KB * 1024 / n;
        if (per > LNORM__BULK_SMEM_CTA)
            per = LNORM__BULK_SMEM_CTA;
        int64_t s = per / stage_bytes;
        if (s > max_st)
            s = max_st;
        if (s >= 2) {
            stages = (int)s;
            break;
        }
    }
    if (stages == 0 && 2 * stage_bytes <= LNORM__BULK_SMEM_CTA) {
        n = 1;
        stages = 2;
    }
    if (stages == 0)
        return cudaErrorInvalidValue;
    if (lnorm__bulk_stages_override >= 2 && lnorm__bulk_stages_override <= LNORM__BULK_MAXST &&
        lnorm__bulk_stages_override * stage_bytes <= LNORM__BULK_SMEM_CTA)
        stages = lnorm__bulk_stages_override;
    const size_t smem = (size_t)(stages * stage_bytes);
    const int64_t tiles = (p->total_rows + RPC - 1) / RPC;
    if constexpr (CL == 1) {
        const int64_t cap = fwd_capped((int64_t)sms * n);
        const unsigned grid = (unsigned)(tiles < cap ? tiles : cap);
        kern<<<grid, BLOCK, smem, st>>>(*p, stages);
        return cudaGetLastError();
    } else {
        cudaLaunchAttribute at;
        cudaLaunchConfig_t cfg = cluster_config(CL, dim3(CL * sms, 1, 1), dim3(BLOCK, 1, 1), smem, st, &at);
        int ncl = 0;
        e = cudaOccupancyMaxActiveClusters(&ncl, kern, &cfg);
        if (e != cudaSuccess || ncl < 1) {
            (void)cudaGetLastError();
            return cudaErrorInvalidValue;
        }
        const int64_t cl = fwd_capped(tiles < ncl ? tiles : ncl);
        cfg.gridDim = dim3((unsigned)(cl * CL), 1, 1);
        return cudaLaunchKernelEx(&cfg, kern, *p, stages);
    }
}

/* Launch the fast kernel of one CL == 1 tier. Grid (lnorm__fast_grid):
 * one tile per CTA (the block scheduler starts a new CTA, with its loads,
 * as soon as one finishes: 3-10% faster than 4 waves of persistent CTAs
 * at most sizes), persistent CTAs for the 1024-thread tier (2-4% faster
 * there; H200). The grid never changes the bits. */
template <typename TX, typename TP, bool RMS, int TPR, int NCH>
static cudaError_t launch_fast(const lnorm__kparams *p, cudaStream_t st)
{
    constexpr int BLOCK = FastShape<TPR, NCH>::block;
    constexpr int RPC = BLOCK / TPR;
    static int cache[6][64]; /* occupancy of each form: table or one segment, general, AL or RR */
    int dev = 0, sms = 0;
    cudaError_t e = device_sms(&dev, &sms);
    if (e != cudaSuccess)
        return e;
    const bool al = (p->fast & LNORM__FAST_AL) != 0; /* set by the host (lnorm__al_ok) */
    /* The re-read form (RR) of the AL form, where compiled and chosen
     * (lnorm__rr_use). */
    constexpr bool RRC = TPR >= LNORM__RR_MIN_TPR;
    const bool rr = RRC && al && lnorm__rr_use(RMS ? 1 : 0, TPR);
    const int form = (p->table ? 0 : 1) + (al ? 2 : 0) + (rr ? 2 : 0);
    static void (*const kerns[4])(const lnorm__kparams) = {
        k_fast<TX, TP, RMS, TPR, NCH, true>, k_fast<TX, TP, RMS, TPR, NCH, false>,
        k_fast<TX, TP, RMS, TPR, NCH, true, true>, k_fast<TX, TP, RMS, TPR, NCH, false, true>};
    void (*kern)(const lnorm__kparams) = nullptr;
    if constexpr (RRC) {
        if (rr)
            kern = p->table ? k_fast<TX, TP, RMS, TPR, NCH, true, true, true> : k_fast<TX, TP, RMS, TPR, NCH, false, true, true>;
    }
    if (!rr)
        kern = kerns[form];
    int occ = 0;
    e = cached_occupancy(kern, BLOCK, dev, cache[form], &occ);
    if (e != cudaSuccess)
        return e;
    const int64_t need = (p->total_rows + RPC - 1) / RPC;
    const bool all = lnorm__fast_grid == 2 || (lnorm__fast_grid == 0 && (BLOCK < 1024 || rr));
    const int64_t cap = fwd_capped(all ? (int64_t)0x7fffffff : (int64_t)sms * occ * 4);
    const unsigned grid = (unsigned)(need < cap ? need : cap);
    kern<<<grid, BLOCK, 0, st>>>(*p);
    e = cudaGetLastError();
    if (e == cudaSuccess && al)
        __atomic_fetch_add(&lnorm__al_launches, 1L, __ATOMIC_RELAXED);
    if (e == cudaSuccess && rr)
        __atomic_fetch_add(&lnorm__rr_launches, 1L, __ATOMIC_RELAXED);
    return e;
}

/* The fast variant p->fast (LNORM__FAST_* plus LNORM__FAST_BULK) of a
 * tier: the bulk-copy kernel when the host marked the launch for it and its
 * stages fit, else k_fast (one CTA per row). *handled = false: the tier has
 * no fast kernel (a cluster tier whose bulk launch does not fit) and the
 * general kernels run it, with the same bits. */
template <typename TX, int TPR, int NCH, int CL>
static cudaError_t launch_fast_kernel(const lnorm__kparams *p, cudaStream_t st, bool *handled)
{
    const int v = p->fast & LNORM__FAST_VMASK;
    const bool rms = v == LNORM__FAST_RMS || v == LNORM__FAST_RMS_PF32;
    const bool pf32 = (v == LNORM__FAST_LN_PF32 || v == LNORM__FAST_RMS_PF32) && !std::is_same<TX, float>::value;
    *handled = true;
    if (p->fast & LNORM__FAST_BULK) { /* set by the host only while bulk is enabled */
        cudaError_t e;
        if (pf32)
            e = rms ? launch_bulk<TX, float, true, TPR, NCH, CL>(p, st) : launch_bulk<TX, float, false, TPR, NCH, CL>(p, st);
        else
            e = rms ? launch_bulk<TX, TX, true, TPR, NCH, CL>(p, st) : launch_bulk<TX, TX, false, TPR, NCH, CL>(p, st);
        if (e != cudaErrorInvalidValue) { /* InvalidValue: the stages do not fit, nothing was launched */
            if (e == cudaSuccess) {
                __atomic_fetch_add(&lnorm__bulk_launches, 1L, __ATOMIC_RELAXED);
                if (p->sched != nullptr && LNORM__DYN(rms, TPR, CL))
                    __atomic_fetch_add(&lnorm__dyn_launches, 1L, __ATOMIC_RELAXED);
            }
            return e;
        }
        __atomic_fetch_add(&lnorm__bulk_fallbacks, 1L, __ATOMIC_RELAXED);
    }
    if constexpr (CL != 1) {
        *handled = false;
        return cudaSuccess;
    } else {
        if (pf32)
            return rms ? launch_fast<TX, float, true, TPR, NCH>(p, st) : launch_fast<TX, float, false, TPR, NCH>(p, st);
        return rms ? launch_fast<TX, TX, true, TPR, NCH>(p, st) : launch_fast<TX, TX, false, TPR, NCH>(p, st);
    }
}

/* The fast kernel of a launch (launch_fast_kernel) and, when it ran, its
 * drain (launch_drain): the rows that need the rescue. */
template <typename TX, int TPR, int NCH, int CL>
static cudaError_t launch_fast_tier(const lnorm__kparams *p, cudaStream_t st, bool *handled)
{
    const cudaError_t e = launch_fast_kernel<TX, TPR, NCH, CL>(p, st, handled);
    if (e != cudaSuccess || !*handled)
        return e;
    return launch_drain<TX, TPR, NCH, CL>(p, st);
}

/* A launch of one register tier: the fast kernels for a launch the host
 * marked fast, where the tier has one (every tier for the bulk form, the
 * one-CTA tiers for k_fast), else the general kernel of the tier. The
 * 16-CTA cluster tier needs a non-portable cluster size; where the device
 * refuses it, the streaming tier runs instead. */
template <typename TX, int TPR, int NCH, int CL>
static cudaError_t launch_shape(int tier, const lnorm__kparams *p, cudaStream_t st)
{
    if (p->fast != LNORM__FAST_NONE) {
        bool handled = true;
        const cudaError_t e = launch_fast_tier<TX, TPR, NCH, CL>(p, st, &handled);
        if (handled)
            return e;
    }
    const cudaError_t e = launch_reg<TX, TPR, NCH, CL>(p, st);
    if (e != cudaSuccess && tier == LNORM__NREG_TIERS - 1) {
        (void)cudaGetLastError();
        return launch_stream<TX>(p, st);
    }
    return e;
}

/* Launch tier `tier` for x of type TX: the kernel of its shape in the tier
 * table (X(tier, TPR, NCH, CL) of lnorm_cuda_impl.h; LNORM__TIERS_F32 for
 * f32 x), or the streaming tier (LNORM__NREG_TIERS). */
template <typename TX> static int launch_tier(int tier, const lnorm__kparams *p, void *stream)
{
    cudaStream_t st = (cudaStream_t)stream;
    if (tier == LNORM__NREG_TIERS)
        return (int)launch_stream<TX>(p, st);
#define LNORM__CASE(i, tpr, nch, cl) \
    case i:                          \
        return (int)launch_shape<TX, tpr, nch, cl>(tier, p, st);
    if constexpr (std::is_same<TX, float>::value) {
        switch (tier) {
            LNORM__TIERS_F32(LNORM__CASE)
        }
    } else {
        switch (tier) {
            LNORM__TIERS(LNORM__CASE)
        }
    }
#undef LNORM__CASE
    return (int)cudaErrorInvalidValue;
}

} // namespace lnorm_cuda

#endif /* LNORM_CUDA_LAUNCH_CUH */
