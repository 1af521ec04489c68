/*
 * The fast path: the common case with the run-time generality taken out of
 * the inner loops: y dtype = x dtype, parameters of x's dtype or f32 (TP),
 * the op (RMS) a template parameter, no residual. Gamma/beta presence,
 * stats and eps mode are uniform per segment and tested once per chunk or
 * row, never per element. A launch with a single segment reads it inline
 * (no segment-table search); a launch with several segments of the same
 * fast variant searches the table as the general kernel does, with the
 * same arithmetic, so a row gives the same bits alone or in any batch. The
 * host (lnorm_cuda_run.c) chooses the variant from the row's segment only
 * (x/y/param dtype, op, residual, tier). Same numerics as k_reg: fp32
 * statistics, the LayerNorm shift K, centred second pass, division by H,
 * masked tails.
 *
 * fast_row is the arithmetic of one row, shared by k_fast (one CTA a row,
 * rows loaded from global memory, this file) and k_bulk (rows staged in
 * shared memory, lnorm_cuda_bulk.cuh).
 */
#ifndef LNORM_CUDA_FAST_CUH
#define LNORM_CUDA_FAST_CUH

#include "lnorm_cuda_io.cuh"
#include "lnorm_cuda_reduce.cuh"

namespace lnorm_cuda {

/* Whether the bulk kernels keep a thread's gamma/beta chunks in registers
 * (raw bits) across the rows it processes, reloaded only when its segment
 * changes: where they are as narrow as x (their 128-register budget holds
 * them; bf16 LayerNorm H = 4096 +27%, RMSNorm in clusters +11-14%, H200).
 * k_fast does not (the cache cost it registers and speed). */
template <typename TX, typename TP, int NCH> struct BulkGC {
    static constexpr bool value = sizeof(TP) == sizeof(TX) && NCH <= 4;
};

/* RMSNorm rows in clusters of 8 CTAs and more: each thread writes its y
 * chunks over x in the stage and one bulk copy writes the CTA's slice of y
 * out (k_bulk; +3% there; in smaller clusters up to 2.5% slower, for
 * LayerNorm 6-11% slower, H200). */
template <bool RMS, int CL> struct TStore {
    static constexpr bool value = RMS && CL >= 8;
};

/* The compile-time form of one row's arithmetic (fast_row): what the
 * kernel computes (x and parameter dtypes, op, tier shape TPR x NCH x CL,
 * CTA size) and how it holds and stores the row:
 *   GC      gamma/beta chunks cached in registers (BulkGC);
 *   F32REG  the row converted to fp32 once and kept in registers for the
 *           three passes (the conversions were a measurable part of the
 *           instructions of 16-bit LayerNorm); same values, same bits;
 *   AL      k_fast's straight-line form (every chunk whole or past the end);
 *   SMR     every pass reads the row from its shared-memory stage (k_bulk);
 *   XW      k_bulk: every row of the launch is a whole number of 16-byte
 *           units, so a chunk is either inside the row or past its end: the
 *           statistics passes need no element masks and a chunk's store no
 *           test of its end; same operations, same bits;
 *   RR      k_fast's re-read form (AL rows, one CTA a row): nothing of the
 *           row is held between passes; each pass reads its chunks again
 *           from global memory, where the first pass left them in L1
 *           (load_rr16); chunks past the row's end are not read (+0, as
 *           AL's loads leave them); same values, same bits. */
template <typename TX_, typename TP_, bool RMS_, int TPR_, int NCH_, int CL_, int BLOCK_> struct RowKind {
    using TX = TX_;
    using TP = TP_;
    static constexpr bool RMS = RMS_;
    static constexpr int TPR = TPR_, NCH = NCH_, CL = CL_, BLOCK = BLOCK_;
    static constexpr int VEC = (int)(16 / sizeof(TX));
    static_assert(NCH <= 4, "4-chunk tiers at most: parameters through read-only loads, no ordering barrier");
};
template <bool GC_, bool F32REG_, bool AL_, bool SMR_, bool XW_, bool RR_> struct RowPath {
    static constexpr bool GC = GC_, F32REG = F32REG_, AL = AL_, SMR = SMR_, XW = XW_, RR = RR_;
};
template <typename Kind, typename Path> struct RowForm : Kind, Path {
    /* bf16 unpacked by bit operations (bf16x8_to_f) from 256 threads a row
     * up: bf16 LayerNorm 3-7% faster there, 1-3% slower in smaller tiers
     * (H200). */
    static constexpr bool BB = Kind::TPR >= 256;
    static constexpr bool WH = Path::AL || Path::XW; /* chunks are whole or past the end */
    /* SEL: the cluster kernels (SMR, CL > 1) compute every chunk of the
     * slice (its stage holds the whole slice, so every read is inside it)
     * and drop a chunk past the row's end by a select of the running sum
     * (the sum before the chunk) and a predicated store, instead of a
     * branch around each chunk: straight-line passes. A chunk inside the
     * row adds the same values in the same order: same bits. (f32
     * LayerNorm H = 262144 +1.7%; the one-CTA tier 10 1.5% slower that way,
     * so it keeps the branches; H200.) */
    static constexpr bool SEL = Path::SMR && Path::XW && Kind::CL > 1;
    /* SHIFTED (LayerNorm rows held as fp32): the first pass stores x - K in
     * place of x, so the later passes subtract the mean only, from the
     * same rounded x - K (same bits, one addition less an element). */
    static constexpr bool SHIFTED = Path::F32REG && !Kind::RMS;
    /* RR: a pass's loads all issued before its arithmetic, in CTAs of fewer
     * than 1024 threads (at the 32-register budget of the 1024-thread CTAs
     * that spills, and each chunk is loaded where it is used). */
    static constexpr bool RRB = Path::RR && Kind::BLOCK < 1024;
    /* YH: the bulk kernels (XW), whose y rows may or may not be 16-byte
     * aligned, test that once a row and run an output pass for each case,
     * instead of a test and a branch around the element-by-element store
     * in every chunk. Same stores, same bits. */
    static constexpr bool YH = Path::XW && !Path::AL;
    static_assert(!Path::RR || (Path::AL && !Path::F32REG && !Path::SMR && Kind::CL == 1), "RR: the AL form of k_fast");
};

/* RRB: this thread's chunks of the row at srow, read again from global
 * memory for one pass, all before the pass's arithmetic (last: the output
 * pass); chunks past the row's end are +0. */
template <typename F>
__device__ __forceinline__ void reread_all(uint4 (&rb)[F::NCH], const unsigned char *srow, int t, int H, bool last)
{
#pragma unroll
    for (int j = 0; j < F::NCH; j++) {
        rb[j] = make_uint4(0u, 0u, 0u, 0u);
        if ((j * F::TPR + t) * F::VEC < H)
            rb[j] = last ? load_rr16<true>(srow + (j * F::TPR + t) * 16) : load_rr16<false>(srow + (j * F::TPR + t) * 16);
    }
}

/* Chunk j of this thread's part of the row as fp32, from where form F keeps
 * it: registers (raw bits, or fp32 with F32REG), the shared-memory stage
 * (SMR), or global memory read again in each pass (RR; srow: the row
 * there; RRB: already read into rb). last: the output pass. */
template <typename F>
__device__ __forceinline__ void row_chunk(int j, float (&f)[F::VEC], bool last, const uint4 (&raw)[F::NCH],
                                          const float (&fv)[F::F32REG ? F::NCH : 1][F::F32REG ? F::VEC : 1],
                                          const uint4 (&rb)[F::RRB ? F::NCH : 1], const unsigned char *srow, int t,
                                          int H)
{
    using TX = typename F::TX;
    if constexpr (F::RRB) {
        unpack<TX, F::BB>(rb[F::RRB ? j : 0], f);
    } else if constexpr (F::RR) {
        /* (The same load as reread_all's, here where the chunk is used:
         * written out, as a shared helper changed ptxas's schedule.) */
        uint4 u = make_uint4(0u, 0u, 0u, 0u);
        if ((j * F::TPR + t) * F::VEC < H)
            u = last ? load_rr16<true>(srow + (j * F::TPR + t) * 16) : load_rr16<false>(srow + (j * F::TPR + t) * 16);
        unpack<TX, F::BB>(u, f);
    } else if constexpr (F::F32REG) {
#pragma unroll
        for (int k = 0; k < F::VEC; k++)
            f[k] = fv[j][k];
    } else if constexpr (F::SMR) {
        /* Every stage of an SMR kernel holds the whole slice capacity
         * (bulk_row_bytes), so a chunk past the row's end reads stale (or
         * never written) bytes inside the stage, which the c0 < H tests of
         * the passes then leave out. */
        unpack<TX, F::BB>(*reinterpret_cast<const uint4 *>(srow + (j * F::TPR + t) * 16), f);
    } else {
        unpack<TX, F::BB>(raw[j], f);
    }
}

/* The centred value of element k of chunk f (x - K - mean; x for RMSNorm). */
template <typename F> __device__ __forceinline__ float centred(const float (&f)[F::VEC], int k, float K, float d)
{
    if constexpr (F::RMS)
        return f[k];
    else if constexpr (F::SHIFTED)
        return f[k] - d;
    else
        return (f[k] - K) - d;
}

/* LayerNorm's first pass: this thread's part of sum(h - K) (SHIFTED: h - K
 * kept in fv for the later passes). Masked columns contribute 0. */
template <typename F, typename Chunk, typename Fill>
__device__ __forceinline__ float part_sum(Chunk &chunk, Fill &rr_fill,
                                          float (&fv)[F::F32REG ? F::NCH : 1][F::F32REG ? F::VEC : 1], float K,
                                          int rank, int t, int H)
{
    constexpr int VEC = F::VEC;
    float sum = 0.0f;
    rr_fill(false);
#pragma unroll
    for (int j = 0; j < F::NCH; j++) {
        const int c0 = ((rank * F::NCH + j) * F::TPR + t) * VEC;
        float f[VEC];
        chunk(j, f);
        if constexpr (F::SHIFTED) {
#pragma unroll
            for (int k = 0; k < VEC; k++)
                fv[j][k] = f[k] = f[k] - K;
        } else {
#pragma unroll
            for (int k = 0; k < VEC; k++)
                f[k] = f[k] - K;
        }
        if (F::SEL || (F::WH ? c0 < H : c0 + VEC <= H)) {
            float s2 = sum;
#pragma unroll
            for (int k = 0; k < VEC; k++)
                s2 += f[k];
            sum = (!F::SEL || c0 < H) ? s2 : sum; /* SEL: a chunk past the end adds nothing */
        } else if (!F::WH) {
#pragma unroll
            for (int k = 0; k < VEC; k++)
                sum += (c0 + k < H) ? f[k] : 0.0f;
        }
    }
    return sum;
}

/* Store chunk j of y (f, c0 its first column) where form F puts it: over
 * x in the stage (ts, TStore), one 16-byte store (AL; XW rows whose y is
 * aligned, YA == 1), or the element-by-element fallback of store_raw.
 * Returns with nothing stored for a chunk past the row's end. */
template <typename F, int YA>
__device__ __forceinline__ void store_y(typename F::TX *yr, bool yal, int j, int c0, int t, int H,
                                        const unsigned char *srow, bool ts, const float (&f)[F::VEC])
{
    using TX = typename F::TX;
    constexpr int VEC = F::VEC;
    if constexpr (F::SMR && TStore<F::RMS, F::CL>::value) {
        if (ts) { /* y goes over x in the stage; k_bulk copies it out */
            *reinterpret_cast<uint4 *>(const_cast<unsigned char *>(srow) + (j * F::TPR + t) * 16) = pack<TX>(f);
            return;
        }
    }
    if constexpr (F::AL)
        *reinterpret_cast<uint4 *>(yr + c0) = pack<TX>(f);
    else if constexpr (F::XW) {
        if constexpr (YA == 1 && F::SEL) {
            store16_if(yr + c0, pack<TX>(f), c0 < H); /* SEL: computed past the row's end, not stored */
        } else if (!F::SEL || c0 < H) { /* the chunk is whole */
            if constexpr (YA == 1)
                *reinterpret_cast<uint4 *>(yr + c0) = pack<TX>(f);
            else
                store_raw<TX>(yr, c0, c0 + VEC, YA == 0 && yal, pack<TX>(f));
        }
    } else
        store_raw<TX>(yr, c0, H, yal, pack<TX>(f));
}

/* The fast path's arithmetic for one row, shared by k_fast (rows loaded
 * from global memory) and k_bulk (rows staged in shared memory), so a row
 * gives the same bits through either: raw holds the row's chunks of this
 * thread (column mapping of lnorm_cuda_io.cuh), K is the LayerNorm shift
 * (h[0], 0 if not finite; 0 for RMSNorm), H = 0 for a group without a row.
 * Reduces over the group (and the cluster), writes mean/rstd and y and
 * returns false; or, for a row that needs the rescue, writes nothing, has
 * defer(s, r) called once for it (by its first thread) and returns true.
 * gcache/bcache/cs: the thread's cached parameter chunks and the segment
 * they belong to (used when F::GC). srow: the row in the stage (SMR) or in
 * global memory (RR); ts: y goes over the stage (TStore). Every thread of
 * the CTA calls it (the reductions synchronize). (The small steps stay
 * lambdas, which the compiler optimizes before it inlines them: as
 * functions they changed the generated code.) */
template <typename F, typename D>
__device__ __forceinline__ bool fast_row(const uint4 (&raw)[F::NCH], const lnorm__kseg *s, int64_t r, int H,
                                         bool active, float K, int rank, int t, float (*red)[F::BLOCK / 32],
                                         void *cred, int &par, uint4 (&gcache)[F::GC ? F::NCH : 1],
                                         uint4 (&bcache)[F::GC ? F::NCH : 1], const lnorm__kseg *&cs,
                                         const unsigned char *srow, bool ts, const D &defer)
{
    using TX = typename F::TX;
    using TP = typename F::TP;
    constexpr int TPR = F::TPR, NCH = F::NCH, CL = F::CL, BLOCK = F::BLOCK, VEC = F::VEC;
    constexpr bool BB = F::BB;
    float fv[F::F32REG ? NCH : 1][F::F32REG ? VEC : 1];
    if constexpr (F::F32REG) {
#pragma unroll
        for (int j = 0; j < NCH; j++)
            unpack<TX, BB>(raw[j], fv[j]);
    }
    auto cen = [&](const float (&f)[VEC], int k, float d) -> float { return centred<F>(f, k, K, d); };
    uint4 rb[F::RRB ? NCH : 1];
    auto rr_fill = [&](bool last) {
        if constexpr (F::RRB)
            reread_all<F>(rb, srow, t, H, last);
    };
    auto chunk = [&](int j, float (&f)[VEC], bool last = false) { row_chunk<F>(j, f, last, raw, fv, rb, srow, t, H); };
    float d = 0.0f;
    if constexpr (!F::RMS) {
        float sum = part_sum<F>(chunk, rr_fill, fv, K, rank, t, H);
        sum = group_sum<TPR, BLOCK, CL>(sum, red, cred, rank, par);
        par++;
        d = H > 0 ? sum / (float)H : 0.0f;
    }
    /* The second pass: sum(((h - K) - d)^2) (RMSNorm: sum(h^2)). (Written
     * here: as a function, like part_sum, it changed the code of RMSNorm.) */
    float sq = 0.0f;
    rr_fill(false);
#pragma unroll
    for (int j = 0; j < NCH; j++) {
        const int c0 = ((rank * NCH + j) * TPR + t) * VEC;
        float f[VEC];
        chunk(j, f);
        if (F::SEL || (F::WH ? c0 < H : c0 + VEC <= H)) {
            float q2 = sq;
#pragma unroll
            for (int k = 0; k < VEC; k++) {
                const float e = cen(f, k, d);
                q2 = __fmaf_rn(e, e, q2);
            }
            sq = (!F::SEL || c0 < H) ? q2 : sq;
        } else if (!F::WH) {
#pragma unroll
            for (int k = 0; k < VEC; k++) {
                const float e = (c0 + k < H) ? cen(f, k, d) : 0.0f;
                sq = __fmaf_rn(e, e, sq);
            }
        }
    }
    sq = group_sum<TPR, BLOCK, CL>(sq, red, cred, rank, par);
    par++;
    float rstd = make_rstd(sq / (float)H, s->eps, s->eps_mode);
    /* A row whose sums overflowed or fell into the subnormals (rescale.h)
     * is left to the general kernel, which rescues it with the same bits:
     * the kernel writes nothing of it here and `defer` puts its number on
     * the launch's rescue list (rescue_push), drained by k_reg in its list
     * form after this kernel (launch_drain). The rows that reduce together
     * take one path (group_any), so every active row of the scope goes on
     * the list. Computed here, in line or after the kernel's last row, the
     * rescue's code cost the kernels registers and speed on every row
     * (0.87-0.98 of the kernels without it; f32 LayerNorm H = 1024 0.91,
     * H200). */
    const bool need = active && lnorm__rescale_needed(sq / (float)H, s->eps);
    if (group_any<TPR, BLOCK>(need)) {
        if ((TPR >= BLOCK || active) && t == 0 && rank == 0) /* one row a CTA: that row needs it */
            defer(s, r);
        return true;
    }
    if (!active)
        return false; /* nothing below synchronizes */
    if (t == 0 && rank == 0) {
        if (s->mean)
            s->mean[r] = K + d;
        if (s->rstd)
            s->rstd[r] = rstd;
    }
    const TP *gp = (const TP *)s->gamma;
    const TP *bp = (const TP *)s->beta;
    const bool gal = ((uintptr_t)gp & 15) == 0;
    const bool bal = ((uintptr_t)bp & 15) == 0;
    if constexpr (F::GC) {
        if (s != cs) {
            cs = s;
#pragma unroll
            for (int j = 0; j < NCH; j++) {
                const int c0 = ((rank * NCH + j) * TPR + t) * VEC;
                gcache[j] = load_param_raw<TP>(gp, c0, H, gal, 1.0f);
                bcache[j] = load_param_raw<TP>(bp, c0, H, bal, -0.0f);
            }
        }
    }
    TX *yr = (TX *)s->y + r * s->y_stride;
    const bool yal = ((uintptr_t)yr & 15) == 0;
    /* The output pass: y = ((h - K) - d) * rstd * gamma + beta with
     * explicit roundings, as emit_row. g_ / b_: gamma / beta, or a null
     * constant where the caller knows the parameter is absent (so its fills
     * fold away). ya: whether y's row is 16-byte aligned, 0 tested chunk by
     * chunk, 1 known aligned, 2 known unaligned (YH). */
    auto emit = [&](const TP *g_, const TP *b_, auto ya) {
        constexpr int YA = decltype(ya)::value;
        rr_fill(true);
#pragma unroll
        for (int j = 0; j < NCH; j++) {
            const int c0 = ((rank * NCH + j) * TPR + t) * VEC;
            if (!F::SEL && c0 >= H)
                continue;
            float f[VEC], g[VEC], b[VEC];
            chunk(j, f, true);
            if constexpr (F::GC) {
                unpack<TP, BB>(gcache[j], g);
                unpack<TP, BB>(bcache[j], b);
            } else if constexpr (F::AL) {
                load_param_full<TP, VEC, BB>(g_, c0, 1.0f, g);
                load_param_full<TP, VEC, BB>(b_, c0, -0.0f, b);
            } else {
                load_param<TP, VEC, BB>(g_, c0, H, gal, 1.0f, g);
                load_param<TP, VEC, BB>(b_, c0, H, bal, -0.0f, b);
            }
#pragma unroll
            for (int k = 0; k < VEC; k++) {
                const float n = __fmul_rn(cen(f, k, d), rstd);
                f[k] = __fmaf_rn(n, g[k], b[k]);
            }
            store_y<F, YA>(yr, yal, j, c0, t, H, srow, ts, f);
        }
    };
    auto emit_y = [&](const TP *g_, const TP *b_) {
        if constexpr (F::YH) {
            if (yal)
                emit(g_, b_, std::integral_constant<int, 1>{});
            else
                emit(g_, b_, std::integral_constant<int, 2>{});
        } else {
            emit(g_, b_, std::integral_constant<int, 0>{});
        }
    };
    /* The output pass specialized on which of gamma and beta the segment
     * has (one branch a row), so that absent parameters cost no fill values
     * and the identities fold (n * 1 + b, n * g + -0: same bits). */
    if constexpr (!F::GC) {
        if (gp != nullptr && bp != nullptr)
            emit_y(gp, bp);
        else if (gp != nullptr)
            emit_y(gp, nullptr);
        else
            emit_y(nullptr, bp);
    } else {
        emit_y(gp, bp);
    }
    return false;
}

/* Put row `row` (the launch's numbering) on the launch's rescue list
 * (lnorm__rescue): the first LNORM__RESCUE_CAP rows are listed; past them
 * the count alone tells the drain to take every row. */
__device__ __forceinline__ void rescue_push(lnorm__rescue *q, int64_t row)
{
    const unsigned i = atomicAdd(&q->count, 1u);
    if (i < LNORM__RESCUE_CAP)
        q->rows[i] = row;
}

/* CTA size of the fast and bulk kernels of a tier of TPR threads a row. */
template <int TPR> struct FastBlock {
    static constexpr int value = TPR > LNORM__MIN_BLOCK ? TPR : LNORM__MIN_BLOCK;
};
/* k_fast's register budget: 72 a thread in CTAs of up to 128 threads, 64
 * in larger ones (8 CTAs an SM: bf16 LayerNorm H = 1024-4096 3781-3860
 * GB/s against 3000-3650 at 80-90 registers, H200). The re-read form (RR),
 * which holds no row between passes: 40 (1536 resident threads an SM, no
 * spills with a pass's loads batched), 32 in 1024-thread CTAs (two an SM). */
template <int TPR, int NCH, bool RR = false> struct FastShape {
    static constexpr int block = FastBlock<TPR>::value;
    static constexpr int regs = RR ? (block >= 1024 ? 32 : 40) : block <= 128 ? 72 : 64;
    static constexpr int min_blocks = 65536 / (block * regs) > 0 ? 65536 / (block * regs) : 1;
};

/* One CTA a row (or several rows a CTA): the row's chunks loaded into
 * registers and converted to fp32 once, gamma/beta through read-only
 * loads. MULTI: the launch has a segment table (else the one inline
 * segment, whose fields the compiler then reads from the parameter bank
 * when it needs them instead of holding them in registers). AL
 * (LNORM__FAST_AL, set by the host per segment, lnorm__al_ok): x, y, gamma
 * and beta 16-byte aligned, strides and H whole 16-byte units, so every
 * chunk is either inside the row (one vector access) or outside it
 * (skipped): straight-line vector code without the element-by-element
 * fallbacks. RR: the re-read form of AL (fast_row). Same operations, same
 * bits. */
template <typename TX, typename TP, bool RMS, int TPR, int NCH, bool MULTI, bool AL = false, bool RR = false>
__global__ void __launch_bounds__(FastShape<TPR, NCH, RR>::block, FastShape<TPR, NCH, RR>::min_blocks)
    k_fast(const __grid_constant__ lnorm__kparams p)
{
    constexpr int BLOCK = FastShape<TPR, NCH>::block;
    constexpr int VEC = (int)(16 / sizeof(TX));
    constexpr int RPC = BLOCK / TPR;
    __shared__ float red[2][BLOCK / 32];
    const int t = (int)(threadIdx.x % TPR);
    int par = 0;
    uint4 gcache[1], bcache[1]; /* (no parameter cache in k_fast) */
    const lnorm__kseg *cs = nullptr;
    using F = RowForm<RowKind<TX, TP, RMS, TPR, NCH, 1, BLOCK>, RowPath<false, !RR, AL, false, false, RR>>;
    for (int64_t base = (int64_t)blockIdx.x * RPC; base < p.total_rows; base += (int64_t)gridDim.x * RPC) {
        const int64_t row = base + threadIdx.x / TPR;
        const bool active = row < p.total_rows;
        const int64_t rr = active ? row : p.total_rows - 1;
        const lnorm__kseg *s = MULTI ? find_seg(p, rr) : &p.one;
        const int64_t r = rr - s->row_begin;
        const int H = active ? (int)s->hidden : 0;
        const TX *xr = (const TX *)s->x + r * s->x_stride;
        const bool xal = ((uintptr_t)xr & 15) == 0;
        uint4 raw[NCH];
        if constexpr (!RR) {
#pragma unroll
            for (int j = 0; j < NCH; j++) {
                const int c0 = (j * TPR + t) * VEC;
                if constexpr (AL)
                    raw[j] = c0 < H ? *reinterpret_cast<const uint4 *>(xr + c0) : make_uint4(0u, 0u, 0u, 0u);
                else
                    raw[j] = load_raw<TX>(xr, c0, H, xal);
            }
        }
        const float K = (!RMS && H > 0) ? shift_of<TX>(xr[0]) : 0.0f;
        auto defer = [&](const lnorm__kseg *ds, int64_t dr) { rescue_push(p.rescue, ds->row_begin + dr); };
        fast_row<F>(raw, s, r, H, active, K, 0, t, red, nullptr, par, gcache, bcache, cs,
                    reinterpret_cast<const unsigned char *>(xr), false, defer);
    }
}

} // namespace lnorm_cuda

#endif /* LNORM_CUDA_FAST_CUH */
