/*
 * The bulk-copy kernels (sm_90): the fast path with the rows staged through
 * shared memory by the copy engine (cp.async.bulk, completion on an
 * mbarrier), in a ring of `stages` tiles per CTA: while a CTA reduces and
 * writes one tile, the next stages - 1 tiles are already on their way, so
 * the bytes in flight no longer depend on registers or on where the warps
 * are in their reductions. A tile is the RPC rows one iteration of k_fast
 * covers (one row for the cluster tiers, where each CTA of the cluster
 * copies its own contiguous slice of the row). Rows are read from shared
 * memory into the same registers, in the same column mapping, and fast_row
 * does the same arithmetic: a row gives the same bits as through k_fast /
 * k_reg. Used for fast-path segments whose rows start 16-byte aligned and
 * are a multiple of 16 bytes long (the host checks; see lnorm__bulk_ok).
 */
#ifndef LNORM_CUDA_BULK_CUH
#define LNORM_CUDA_BULK_CUH

#include <cooperative_groups.h>

#include "lnorm_cuda_fast.cuh"

namespace lnorm_cuda {

namespace cg = cooperative_groups;

#define LNORM__BULK_MAXST 8

/* CTA size and register budget of a bulk kernel: the bytes in flight come
 * from the stages, not from registers, so a thread may use more registers
 * than in k_fast (no spills): up to 128 a thread, and at least two
 * 256-thread CTAs per SM in the one-CTA tiers that hold the row in
 * registers (one CTA alone left its reductions and stores unoverlapped:
 * bf16 H = 16384 at 0.33 of copy). Kernels that read the row from its
 * stage in each pass (SMR: the cluster tiers and the one-CTA tier of 1024
 * threads a row, whose registers cannot hold the row): 64 a thread, one
 * 1024-thread CTA an SM. */
template <int TPR, int NCH, int CL = 1> struct BulkShape {
    static constexpr int block = FastBlock<TPR>::value;
    static constexpr bool smr = LNORM__SMR(TPR, CL);
    static constexpr int regs = !smr ? 128 : 64;
    static constexpr int min_blocks = 65536 / (block * regs) > 1 ? 65536 / (block * regs) : 1;
};

/* Copy bytes (a multiple of 16, both addresses 16-byte aligned) from global
 * to this CTA's shared memory; completion is counted on mbarrier b. */
__device__ __forceinline__ void bulk_load(void *dst, const void *src, uint32_t bytes, uint64_t *b)
{
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                     smem_addr(dst)),
                 "l"(src), "r"(bytes), "r"(smem_addr(b))
                 : "memory");
}

/* Copy bytes (a multiple of 16, both addresses 16-byte aligned) from this
 * CTA's shared memory to global memory as one bulk-copy group of the
 * calling thread; bulk_store_wait_read: that thread waits until its groups
 * have read their shared memory (which may then be written again),
 * bulk_store_wait: until their writes are done. */
__device__ __forceinline__ void bulk_store(void *dst, const void *src, uint32_t bytes)
{
    asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" ::"l"(dst), "r"(smem_addr(src)),
                 "r"(bytes)
                 : "memory");
    asm volatile("cp.async.bulk.commit_group;" ::: "memory");
}
__device__ __forceinline__ void bulk_store_wait_read()
{
    asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
}
__device__ __forceinline__ void bulk_store_wait()
{
    asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
}

/* Bytes of a row of rowb bytes in the slice (slice bytes long) that starts
 * at byte off; <= 0 when the row ends before the slice. */
__device__ __forceinline__ int64_t slice_bytes(int64_t rowb, int64_t off, int64_t slice)
{
    const int64_t b = rowb - off;
    return b > slice ? slice : b;
}

/* Shared-memory bytes of one staged row (rs) for a launch: the row itself
 * when every row has the launch's single segment, else the tier's slice
 * capacity (rows of a table launch may differ in length). Kernels that
 * read the row from its stage in every pass (smr) always take the
 * capacity: their passes read every chunk of the slice before the masks
 * drop those past the row's end, and those reads must stay inside the
 * stage. Host and device compute it alike. */
__host__ __device__ __forceinline__ int64_t bulk_row_bytes(const lnorm__kparams &p, int64_t slice_cap, int xsz,
                                                          int CL, bool smr)
{
    if (p.table == nullptr && CL == 1 && !smr)
        return p.one.hidden * xsz;
    return slice_cap;
}

/* Warp 0 starts the copies of tile `tile` (rows row0 .. row0 + RPC - 1 of
 * the launch; this CTA's slice of them) into stage buffer dst, counted on
 * bar. Lanes take rows in turn; lane 0 arrives once every lane has added
 * its bytes. A row (or slice) past the end copies nothing. */
template <typename TX, int TPR, int NCH, int CL, int RPC>
__device__ __forceinline__ void bulk_issue(const lnorm__kparams &p, int64_t tile, int rank, unsigned char *dst,
                                           int64_t rs, uint64_t *bar)
{
    constexpr int64_t SLICE = (int64_t)TPR * NCH * 16;
    const int lane = (int)(threadIdx.x & 31);
    const int64_t row0 = tile * RPC;
    if (p.table == nullptr && CL == 1 && !BulkShape<TPR, NCH, CL>::smr && p.one.x_stride == p.one.hidden) {
        /* Contiguous rows of one segment, staged back to back (rs = row
         * bytes): one copy for the tile. */
        if (lane == 0) {
            const int64_t n = (p.total_rows - row0) < RPC ? (p.total_rows - row0) : RPC;
            const uint32_t bytes = (uint32_t)(n * rs);
            mbar_expect_tx(bar, bytes);
            bulk_load(dst, (const TX *)p.one.x + row0 * p.one.hidden, bytes, bar);
        }
    } else {
        for (int g = lane; g < RPC; g += 32) {
            const int64_t row = row0 + g;
            if (row >= p.total_rows)
                break;
            const lnorm__kseg *s = p.table ? find_seg(p, row) : &p.one;
            const int64_t r = row - s->row_begin;
            const int64_t off = (int64_t)rank * SLICE;
            const int64_t bytes = slice_bytes(s->hidden * (int64_t)sizeof(TX), off, SLICE);
            if (bytes <= 0)
                continue;
            mbar_expect_tx(bar, (uint32_t)bytes);
            bulk_load(dst + g * rs, (const unsigned char *)((const TX *)s->x + r * s->x_stride) + off,
                      (uint32_t)bytes, bar);
        }
        __syncwarp();
    }
    if (lane == 0)
        mbar_arrive(bar);
}

/* Dynamic tiles (kparams.sched; the SMR kernels, launches with a
 * workspace). With a fixed share of the tiles (CTA or cluster c takes
 * tiles c, c + grid, ...) the kernel ends with its slowest SM (8-18% of
 * the kernel's time idle on some SMs at its end, ncu on the H200).
 * Instead, the tile of each stage fill is a ticket from the global counter
 * sched[0]: warp 0's lane 0 takes one (the first fills take one block of
 * `stages`), and a CTA stops at its first ticket past the last tile. The
 * atomic's result is first needed one fill later (`ahead`), so no warp
 * waits for it. In a cluster, rank 0 alone takes tickets and mails each to
 * its peers (st.async into mail[u % LNORM__TMAIL], counted on that slot's
 * mbarrier) one fill before they need it, so peers' warp 0 does not wait
 * either (two tickets ahead: the one mailed at fill u is the one taken at
 * fill u - 1). A peer of a LayerNorm cluster also bulk-copies the first 16
 * bytes of each of its rows (h[0], the shift) into x0[stage]. Every CTA
 * counts itself in sched[1] at its end; the last puts both counters back
 * to 0 for the next launch on the stream. The tiles a CTA takes change,
 * the rows' results do not (same bits). */
#define LNORM__TMAIL 16 /* mail slots: a peer has at most stages + 1 tickets unread */
struct DynTiles {
    int64_t tile[LNORM__BULK_MAXST]; /* the tile in each stage, -1: none (the CTA stops there) */
    int64_t mail[LNORM__TMAIL];      /* cluster peers: tickets from rank 0 */
    uint64_t mbar[LNORM__TMAIL];
    int64_t base;                    /* lane 0 of a fetcher: the first of the tickets of fills 0 .. stages - 1 */
    int64_t ta;                      /* rank 0 of a cluster: the ticket of the next fill u (mailed) */
    int fin;                         /* lane 0 of warp 0: a ticket past the end was seen */
    __align__(16) unsigned char x0[LNORM__BULK_MAXST][16]; /* LayerNorm cluster peers: h[0] */
    int64_t pad_; /* (the shared-memory layout the kernels were measured with) */
};

/* Take n tickets from counter *c (the first one's number). ptxas gathers a
 * warp's atomic additions and broadcasts the result with a shuffle right
 * after the atomic, so the warp waits for it there (also for atom.inc with
 * a wrap of 2^32 - 1, which it turns into an addition). A single ticket is
 * taken by atom.inc with a wrap `lim` known only at run time (the caller's
 * ~0u that the compiler cannot see), which it leaves alone: the result is
 * waited for where it is first used, a fill later. */
__device__ __forceinline__ unsigned ticket_take(unsigned *c, unsigned n, unsigned lim = 0xffffffffu)
{
    unsigned v;
    if (n == 1)
        asm volatile("atom.global.inc.u32 %0, [%1], %2;" : "=r"(v) : "l"(c), "r"(lim) : "memory");
    else
        asm volatile("atom.global.add.u32 %0, [%1], %2;" : "=r"(v) : "l"(c), "r"(n) : "memory");
    return v;
}

/* A bulk CTA's ring of stages: its barriers, the first fills, and (dynamic
 * tiles) the tickets that say which tile a fill brings in. Warp 0 issues
 * the copies; every thread of the CTA waits on a stage's barrier before it
 * reads it. (ticket and x0_issue are left to the compiler's inliner, as the
 * kernel's lambdas are: forced inline, the generated code changed.) */
template <typename TX, bool RMS, int TPR, int NCH, int CL> struct BulkRing {
    static constexpr int RPC = BulkShape<TPR, NCH>::block / TPR;
    static constexpr bool SMR = BulkShape<TPR, NCH, CL>::smr;
    /* Dynamic tiles compiled in where LNORM__DYN says. */
    static constexpr bool DYN = LNORM__DYN(RMS, TPR, CL);
    const lnorm__kparams &p;
    unsigned char *stage_mem;
    uint64_t *bar;
    DynTiles &dt;
    int stages, rank, lane;
    int64_t cid, ncl, rs, stage_bytes, ntiles;
    bool dyn;     /* dynamic tiles in this launch (uniform over the grid) */
    bool fetcher; /* takes the tickets: the CTA, or a cluster's rank 0 */
    /* dyn, lane 0 of warp 0 of a fetcher: the ticket taken one fill ahead
     * (CL == 1: of fill u + 1; a cluster's rank 0: of fill u + 2), whose
     * value is first needed at the next fill. */
    unsigned ahead;
    unsigned lim; /* 2^32 - 1 (total_rows >= 0), the wrap of ticket_take's atom.inc */

    /* Thread 0 initializes the stages' barriers (and the mail barriers of a
     * cluster peer); then the CTA (cluster) syncs. */
    template <int NW> __device__ __forceinline__ void init(ClusterRed<CL, NW> *cr)
    {
        if (threadIdx.x == 0) {
            for (int i = 0; i < stages; i++)
                mbar_init(&bar[i], 1);
            if constexpr (DYN) {
                if (dyn && !fetcher)
                    for (int i = 0; i < LNORM__TMAIL; i++)
                        mbar_init(&dt.mbar[i], 1);
                dt.fin = 0;
            }
            asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
        }
        if constexpr (CL > 1) {
            cluster_red_init(cr);
            cg::this_cluster().sync(); /* peers store into cr (and dt.mail) only after its init */
        } else {
            __syncthreads();
        }
    }

    /* dyn, lane 0 of warp 0: the tile of fill u (the u-th row this CTA or
     * cluster takes), -1 if none is left. Fills 0 .. stages - 1 are issued
     * at the start, fill u + stages after fill u's row. */
    __device__ int64_t ticket(int64_t u)
    {
        if (dt.fin)
            return -1;
        int64_t tk;
        if (fetcher) {
            if (u < stages) {
                tk = dt.base + u;
            } else if constexpr (CL == 1) {
                tk = ahead;
                ahead = ticket_take(p.sched, 1u, lim);
            } else {
                tk = dt.ta;
                dt.ta = ahead; /* fill u + 1's, taken at fill u - 1: mail it */
                if (tk < ntiles)
                    for (int k = 1; k < CL; k++)
                        st_async_peer_s64(&dt.mail[(u + 1) % LNORM__TMAIL], dt.ta,
                                          &dt.mbar[(u + 1) % LNORM__TMAIL], (uint32_t)k);
                ahead = ticket_take(p.sched, 1u, lim);
            }
        } else {
            const int m = (int)(u % LNORM__TMAIL);
            mbar_arrive_expect_tx(&dt.mbar[m], 8u);
            mbar_wait(&dt.mbar[m], (uint32_t)((u / LNORM__TMAIL) & 1));
            tk = dt.mail[m];
        }
        if (tk >= ntiles) {
            dt.fin = 1;
            tk = -1;
        }
        return tk;
    }

    /* dyn: a LayerNorm cluster CTA other than rank 0 gets h[0] of the row
     * of tile nt (RPC == 1) into dt.x0[sx] by a bulk copy counted on the
     * stage's barrier (warp 0's lane 0, before bulk_issue's arrive). */
    __device__ void x0_issue(int64_t nt, int sx)
    {
        if constexpr (CL > 1 && !RMS) {
            if (rank != 0 && lane == 0) {
                const lnorm__kseg *s0 = find_seg(p, nt);
                mbar_expect_tx(&bar[sx], 16u);
                bulk_load(dt.x0[sx], (const TX *)s0->x + (nt - s0->row_begin) * s0->x_stride, 16u, &bar[sx]);
            }
        }
    }

    /* Warp 0: stage sx gets fill u's tile (fixed shares: tile cid + u * ncl). */
    __device__ __forceinline__ void issue(int64_t u, int sx)
    {
        unsigned char *dst = stage_mem + sx * stage_bytes;
        int64_t nt;
        if (dyn) {
            nt = -1;
            if (lane == 0) {
                nt = ticket(u);
                dt.tile[sx] = nt;
            }
            nt = __shfl_sync(0xffffffffu, nt, 0);
        } else {
            nt = cid + u * ncl;
            if (nt >= ntiles)
                return;
        }
        if (nt < 0) {
            if (lane == 0)
                mbar_arrive(&bar[sx]); /* the stage's "no tile" */
            return;
        }
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
        if (dyn)
            x0_issue(nt, sx);
        bulk_issue<TX, TPR, NCH, CL, RPC>(p, nt, rank, dst, rs, &bar[sx]);
    }

    /* Stage st holds fill k, whose row is read (SMR: written): refill it
     * with fill k + stages, then step st (and the barriers' phase) on. TS:
     * thread 0 first waits until the bulk copy of y has read the stage. */
    template <bool TS, typename Issue>
    __device__ __forceinline__ void refill(int64_t k, int &st, uint32_t &phase, Issue &issue)
    {
        __syncthreads();
        if (threadIdx.x < 32) {
            if constexpr (DYN) {
                if constexpr (TS)
                    if (threadIdx.x == 0)
                        bulk_store_wait_read();
                issue(k + stages, st);
            } else {
                /* (The wait is repeated here rather than hoisted: hoisted,
                 * ptxas schedules the RMSNorm kernels of clusters of 8 and
                 * 16 differently.) */
                const int64_t nt = cid + (k + stages) * ncl;
                if constexpr (TS)
                    if (threadIdx.x == 0)
                        bulk_store_wait_read();
                if (nt < ntiles) {
                    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
                    bulk_issue<TX, TPR, NCH, CL, RPC>(p, nt, rank, stage_mem + st * stage_bytes, rs, &bar[st]);
                }
            }
        }
        if (++st == stages) {
            st = 0;
            phase ^= 1u;
        }
    }

    /* Warp 0: the first fill of every stage (dyn: the first tickets, and a
     * cluster's rank 0 mails fills 0 .. stages to its peers, the first past
     * the end last). */
    template <typename Issue> __device__ __forceinline__ void start(Issue &issue)
    {
        if constexpr (!DYN) { /* the fixed shares alone */
            if (threadIdx.x < 32)
                for (int i = 0; i < stages; i++)
                    if (cid + i * ncl < ntiles)
                        bulk_issue<TX, TPR, NCH, CL, RPC>(p, cid + i * ncl, rank, stage_mem + i * stage_bytes, rs,
                                                          &bar[i]);
        } else if (threadIdx.x < 32) {
            if (dyn && fetcher && lane == 0) {
                dt.base = ticket_take(p.sched, (unsigned)stages);
                ahead = ticket_take(p.sched, 1u, lim);
                if constexpr (CL > 1) {
                    dt.ta = ahead;
                    ahead = ticket_take(p.sched, 1u, lim);
                    for (int u = 0; u <= stages; u++) {
                        const int64_t tk = u < stages ? dt.base + u : dt.ta;
                        for (int k = 1; k < CL; k++)
                            st_async_peer_s64(&dt.mail[u], tk, &dt.mbar[u], (uint32_t)k);
                        if (tk >= ntiles)
                            break;
                    }
                }
            }
            for (int i = 0; i < stages; i++)
                issue(i, i);
        }
    }
};

/* Wait for stage st (with fixed shares; dynamic tiles waited for it to
 * learn its tile) and return h[0] of a LayerNorm cluster CTA's row (else
 * 0). A CTA other than rank 0 has not staged h[0]: with fixed shares it
 * reads it from global memory before waiting, so the load overlaps the
 * wait; with dynamic tiles its 16 bytes were copied into dt.x0 with the
 * slice (stage: the stage's start; so with fixed shares too: within 1%
 * either way). */
template <typename TX, bool RMS, int CL>
__device__ __forceinline__ TX stage_wait(const lnorm__kseg *s, int64_t r, int H, bool dyn, int rank, int st,
                                         uint32_t phase, uint64_t *bar, const unsigned char *stage, DynTiles &dt)
{
    TX x0 = TX(0.0f);
    if constexpr (CL > 1 && !RMS) {
        if (H > 0 && !dyn)
            x0 = ((const TX *)s->x + r * s->x_stride)[0];
    }
    if (!dyn)
        mbar_wait(&bar[st], phase);
    if constexpr (CL > 1 && !RMS) {
        if (H > 0 && dyn)
            x0 = rank == 0 ? *reinterpret_cast<const TX *>(stage) : *reinterpret_cast<const TX *>(dt.x0[st]);
    }
    return x0;
}

/* This thread's chunks of the row staged at src, into registers (the bulk
 * kernels that hold the row there); chunks past the row's end are +0. */
template <typename TX, int TPR, int NCH>
__device__ __forceinline__ void stage_regs(const unsigned char *src, int rank, int t, int H, uint4 (&raw)[NCH])
{
    constexpr int VEC = (int)(16 / sizeof(TX));
#pragma unroll
    for (int j = 0; j < NCH; j++) {
        const int c0 = ((rank * NCH + j) * TPR + t) * VEC;
        raw[j] = c0 < H ? *reinterpret_cast<const uint4 *>(src + (int64_t)(j * TPR + t) * 16)
                        : make_uint4(0u, 0u, 0u, 0u);
    }
}

/* TStore: once every thread wrote its chunks of y over x in the stage
 * (src), thread 0 copies the CTA's slice (bytes at yoff in yrow) out in one bulk
 * copy; ts is uniform over the CTA (one row a CTA). */
template <typename TX>
__device__ __forceinline__ void store_slice(bool ts, TX *yrow, int64_t yoff, const unsigned char *src, int64_t bytes)
{
    if (ts) {
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
        __syncthreads();
        if (threadIdx.x == 0)
            bulk_store((unsigned char *)yrow + yoff, src, (uint32_t)bytes);
    }
}

/* The end of a bulk CTA: its copies of y done (TStore); with dynamic
 * tiles, every ticket it took performed before it counts itself, and the
 * last CTA puts the counters back for the next launch. */
template <bool TS>
__device__ __forceinline__ void bulk_finish(const lnorm__kparams &p, bool dyn)
{
    if constexpr (TS)
        if (threadIdx.x == 0)
            bulk_store_wait(); /* y's copies done */
    if (dyn && threadIdx.x == 0) {
        __threadfence();
        if (atomicAdd(p.sched + 1, 1u) == gridDim.x - 1) {
            __threadfence();
            atomicExch(p.sched, 0u);
            atomicExch(p.sched + 1, 0u);
        }
    }
}

/* The bulk kernel of a tier: a persistent CTA (cluster) takes tiles (fixed
 * shares or dynamic tiles), each staged by BulkRing, and runs fast_row on
 * each row. SMR (BulkShape::smr): every pass reads the row from its stage
 * in shared memory instead of holding it in registers, and the stage is
 * refilled once the row is written; otherwise the row is taken into
 * registers and the stage refilled at once. */
template <typename TX, typename TP, bool RMS, int TPR, int NCH, int CL>
__global__ void __launch_bounds__(BulkShape<TPR, NCH, CL>::block, BulkShape<TPR, NCH, CL>::min_blocks)
    k_bulk(const __grid_constant__ lnorm__kparams p, int stages)
{
    constexpr int BLOCK = BulkShape<TPR, NCH>::block;
    constexpr int VEC = (int)(16 / sizeof(TX));
    constexpr int RPC = BLOCK / TPR;
    static_assert(CL == 1 || RPC == 1, "a cluster tier holds one row per CTA");
    constexpr bool SMR = BulkShape<TPR, NCH, CL>::smr;
    constexpr bool GC = BulkGC<TX, TP, NCH>::value;
    constexpr int NGC = GC ? NCH : 1;
    /* TS: this CTA's slice of y (its bytes, 16-byte aligned) is written into
     * the stage and copied out by one bulk copy, whose group belongs to
     * thread 0, which waits on it in refill before it issues the stage's
     * reload (bulk_issue: lane 0 copies the row when RPC == 1). */
    constexpr bool TS = SMR && TStore<RMS, CL>::value;
    static_assert(!TStore<RMS, CL>::value || RPC == 1, "bulk y stores: one row a CTA");
    using F = RowForm<RowKind<TX, TP, RMS, TPR, NCH, CL, BLOCK>, RowPath<GC, !SMR && NCH * VEC <= 32, false, SMR, true, false>>;
    extern __shared__ __align__(128) unsigned char stage_mem[];
    __shared__ uint64_t bar[LNORM__BULK_MAXST];
    __shared__ float red[2][BLOCK / 32];
    __shared__ ClusterRed<CL, BLOCK / 32> cr;
    __shared__ DynTiles dt;
    void *cred = &cr;
    const int t = (int)(threadIdx.x % TPR);
    const int g = (int)(threadIdx.x / TPR);
    const int lane = (int)(threadIdx.x & 31);
    int rank = 0;
    if constexpr (CL > 1)
        rank = (int)cg::this_cluster().block_rank();
    const int64_t cid = blockIdx.x / CL, ncl = gridDim.x / CL;
    const int64_t rs = bulk_row_bytes(p, (int64_t)TPR * NCH * 16, (int)sizeof(TX), CL, SMR);
    const int64_t stage_bytes = rs * RPC;
    const int64_t ntiles = (p.total_rows + RPC - 1) / RPC;
    const bool multi = p.table != nullptr;
    const bool dyn = BulkRing<TX, RMS, TPR, NCH, CL>::DYN && p.sched != nullptr;
    BulkRing<TX, RMS, TPR, NCH, CL> ring{p, stage_mem, bar, dt, stages, rank, lane, cid, ncl, rs, stage_bytes,
                                         ntiles, dyn, CL == 1 || rank == 0};
    ring.init(&cr);
    /* (issue and refill are lambdas around BulkRing's functions: called
     * directly, the generated code changed.) */
    auto issue = [&](int64_t u, int sx) { ring.issue(u, sx); };
    ring.ahead = 0; /* (set after the barriers' init: before it, the generated code changed) */
    ring.lim = ~(unsigned)(p.total_rows >> 63);
    ring.start(issue);
    int par = 0;
    uint4 gcache[NGC], bcache[NGC];
    const lnorm__kseg *cs = nullptr;
    int st = 0;
    uint32_t phase = 0;
    for (int64_t k = 0;; k++) {
        int64_t tile;
        if (dyn) {
            mbar_wait(&bar[st], phase);
            tile = dt.tile[st];
            if (tile < 0)
                break;
        } else {
            tile = cid + k * ncl;
            if (tile >= ntiles)
                break;
        }
        const int64_t row = tile * RPC + g;
        const bool active = row < p.total_rows;
        const int64_t rr = active ? row : p.total_rows - 1;
        const lnorm__kseg *s = multi ? find_seg(p, rr) : &p.one;
        const int64_t r = rr - s->row_begin;
        const int H = active ? (int)s->hidden : 0;
        const TX x0 = stage_wait<TX, RMS, CL>(s, r, H, dyn, rank, st, phase, bar, stage_mem + st * stage_bytes, dt);
        const unsigned char *src = stage_mem + st * stage_bytes + g * rs;
        uint4 raw[NCH];
        if constexpr (!SMR)
            stage_regs<TX, TPR, NCH>(src, rank, t, H, raw);
        float K = 0.0f;
        if (!RMS && H > 0) {
            if constexpr (CL == 1)
                K = shift_of<TX>(*reinterpret_cast<const TX *>(src));
            else
                K = shift_of<TX>(x0);
        }
        auto refill = [&]() { ring.template refill<TS>(k, st, phase, issue); };
        if constexpr (!SMR)
            refill();
        constexpr int64_t SLICE = (int64_t)TPR * NCH * 16;
        const int64_t yoff = (int64_t)rank * SLICE;
        TX *yrow = nullptr;
        int64_t ybytes = 0;
        if constexpr (TS) {
            yrow = (TX *)s->y + r * s->y_stride;
            ybytes = slice_bytes(H * (int64_t)sizeof(TX), yoff, SLICE);
        }
        const bool ts = TS && active && ybytes > 0 && (((uintptr_t)yrow + (uintptr_t)yoff) & 15) == 0;
        auto defer = [&](const lnorm__kseg *ds, int64_t dr) { rescue_push(p.rescue, ds->row_begin + dr); };
        const bool dfr =
            fast_row<F>(raw, s, r, H, active, K, rank, t, red, cred, par, gcache, bcache, cs, src, ts, defer);
        if constexpr (TS)
            store_slice(ts && !dfr, yrow, yoff, src, ybytes); /* a row left to the rescue: its stage holds x */
        if constexpr (SMR)
            refill();
    }
    bulk_finish<TS>(p, ring.dyn);
    if constexpr (CL > 1)
        cg::this_cluster().sync(); /* no CTA leaves while its shared memory may be read */
}

} // namespace lnorm_cuda

#endif /* LNORM_CUDA_BULK_CUH */
