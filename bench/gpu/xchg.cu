/*
 * xchg: how long one row reduction across CL CTAs takes, through a thread
 * block cluster (lnormd's group_sum: st.async into the peers' shared memory,
 * mbarrier) and through global memory between CTAs of an ordinary grid (the
 * "two-phase" scheme that could use every SM: cluster tiers of 4, 8 and 16
 * CTAs fit only 120 / 120 / 112 of the H200's 132 SMs).
 *
 * Question it answers: the cost side of a global-memory exchange. The
 * LayerNorm cluster kernels take about 4.9 us a row slice and two
 * reductions a row; more SMs (132 against 120) pay only if a global
 * exchange costs less than about 0.25 us more than the cluster one.
 *
 * Each kernel runs ITERS reductions back to back (no other work), one CTA
 * of 1024 threads an SM (dynamic shared memory forces it), as many CTAs as
 * the form can keep resident: clusters from cudaOccupancyMaxActiveClusters,
 * global groups floor(SMs / CL). Reported: ns a reduction (kernel time /
 * ITERS), and a check that every CTA got the exact sum.
 *
 * Global forms, CTA level as lnormd's two-level cluster reduction (warp
 * partials in shared memory, one CTA barrier, warp 0 sums them), then:
 *   g-w0:  thread 0 stores {total, tag} (one 8-byte word, tag = reduction
 *          number + 1) into the group's slot (st.relaxed.gpu); warp 0's
 *          lanes k < CL poll slot k (ld.relaxed.gpu) until its tag is this
 *          reduction's, put the totals in shared memory, arrive on an
 *          mbarrier the other warps wait on;
 *   g-all: every warp's lanes k < CL poll the slots themselves (no second
 *          wait in shared memory).
 * Slots: two buffers (reduction n uses n & 1; a CTA writes n + 2 only after
 * it saw every peer's n + 1, which each wrote after it had read n).
 *
 * Build (here): nvcc -O3 -std=c++17 -arch=sm_90 -Ikernels/cuda -Iinclude \
 *   bench/gpu/xchg.cu -o .devpack/xchg ; run: .devpack/xchg [ITERS]
 */
#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <vector>

#include "lnorm_cuda_kernels.cuh"
#include "harness.cuh"

using namespace lnorm_cuda;
namespace cg = cooperative_groups;

/* The end of every reduction here: t (a lane's part) summed over the warp
 * by a shuffle tree; bad counts a wrong total; the next input is 1 again,
 * but only once the total is known. */
__device__ __forceinline__ void finish(float t, float &v, float &bad, int CL)
{
#pragma unroll
    for (int m = 16; m > 0; m >>= 1)
        t += __shfl_xor_sync(0xffffffffu, t, m);
    bad += t != 1024.0f * CL ? 1.0f : 0.0f;
    v = t * (1.0f / (1024.0f * CL));
}

/* Each thread contributes 1 (so a reduction's exact result is
 * 1024 * CL); the next reduction's input depends on the last result. */
template <int CL> __global__ void __launch_bounds__(1024, 1) k_clu(int iters, float *out)
{
    __shared__ float red[2][32];
    __shared__ ClusterRed<CL, 32> cr;
    const int rank = (int)cg::this_cluster().block_rank();
    cluster_red_init(&cr);
    cg::this_cluster().sync();
    float v = 1.0f, bad = 0.0f;
    for (int i = 0; i < iters; i++) {
        const float s = group_sum<1024, 1024, CL>(v, red, &cr, rank, i);
        bad += s != 1024.0f * CL ? 1.0f : 0.0f;
        v = s * (1.0f / (1024.0f * CL)); /* 1 again, after the wait */
    }
    if (threadIdx.x == 0)
        out[blockIdx.x] = bad;
    cg::this_cluster().sync(); /* no CTA leaves while a peer may still store into it */
}

/* Variants of the cluster reduction (same start and loop as k_clu):
 * VAR 0 one-level with NB mbarriers (warp w counted on barrier w % NB;
 * each warp waits on all NB), VAR 1 two-level at any CL (lnormd's form for
 * clusters of 8 and 16), VAR 2 warps in groups of G (a named barrier a
 * group; the group's first warp sums the G partials and sends them: NW / G
 * stores a CTA a reduction instead of NW). */
template <int CL, int VAR, int P> __global__ void __launch_bounds__(1024, 1) k_cluv(int iters, float *out)
{
    constexpr int NW = 32;
    constexpr int NB = VAR == 0 ? P : 1;
    constexpr int G = VAR == 2 ? P : 1;
    __shared__ float red[2][NW];
    __shared__ uint64_t bar[3][NB];
    __shared__ float slot[3][CL][NW];
    const int rank = (int)cg::this_cluster().block_rank();
    const int lane = (int)(threadIdx.x & 31), w = (int)(threadIdx.x / 32);
    if (threadIdx.x == 0) {
        for (int i = 0; i < 3; i++)
            for (int j = 0; j < NB; j++)
                mbar_init(&bar[i][j], 1);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    cg::this_cluster().sync();
    float v = 1.0f, bad = 0.0f;
    for (int i = 0; i < iters; i++) {
        const int b = i % 3;
        const uint32_t ph = (uint32_t)((i / 3) & 1);
        float x = v;
#pragma unroll
        for (int m = 16; m > 0; m >>= 1)
            x += __shfl_xor_sync(0xffffffffu, x, m);
        float t = 0.0f;
        if constexpr (VAR == 0) {
            if (threadIdx.x == 0)
                for (int j = 0; j < NB; j++)
                    mbar_arrive_expect_tx(&bar[b][j], (uint32_t)(CL * (NW / NB) * sizeof(float)));
            if (lane < CL)
                st_async_peer(&slot[b][rank][w], x, &bar[b][w % NB], (uint32_t)lane);
            for (int j = 0; j < NB; j++)
                mbar_wait(&bar[b][j], ph);
#pragma unroll
            for (int k = 0; k < (CL * NW + 31) / 32; k++)
                if (k * 32 + lane < CL * NW)
                    t += (&slot[b][0][0])[k * 32 + lane];
        } else if constexpr (VAR == 1) {
            if (lane == 0)
                red[i & 1][w] = x;
            if (threadIdx.x == 0)
                mbar_arrive_expect_tx(&bar[b][0], (uint32_t)(CL * sizeof(float)));
            __syncthreads();
            float *tot = &slot[b][0][0];
            if (w < CL) {
                float c = red[i & 1][lane];
#pragma unroll
                for (int m = 16; m > 0; m >>= 1)
                    c += __shfl_xor_sync(0xffffffffu, c, m);
                if (lane == 0)
                    st_async_peer(tot + rank, c, &bar[b][0], (uint32_t)w);
            }
            mbar_wait(&bar[b][0], ph);
            t = lane < CL ? tot[lane] : 0.0f;
        } else {
            constexpr int NG = NW / G;
            if (lane == 0)
                red[i & 1][w] = x;
            if (threadIdx.x == 0)
                mbar_arrive_expect_tx(&bar[b][0], (uint32_t)(CL * NG * sizeof(float)));
            asm volatile("bar.sync %0, %1;" ::"r"(1 + w / G), "r"(G * 32) : "memory");
            if (w % G == 0) {
                float c = lane < G ? red[i & 1][w + lane] : 0.0f;
#pragma unroll
                for (int m = G / 2; m > 0; m >>= 1)
                    c += __shfl_xor_sync(0xffffffffu, c, m);
                /* Lanes 0 .. G - 1 hold the sum; lanes up to CL send it.
                 * (Without this broadcast, cf6578e sent 0 from lanes
                 * G .. CL - 1: its grp rows with CL > G report WRONG SUMS.) */
                c = __shfl_sync(0xffffffffu, c, 0);
                if (lane < CL)
                    st_async_peer(&slot[b][rank][w / G], c, &bar[b][0], (uint32_t)lane);
            }
            mbar_wait(&bar[b][0], ph);
#pragma unroll
            for (int k = 0; k < (CL * NG + 31) / 32; k++)
                if (k * 32 + lane < CL * NG)
                    t += (&slot[b][0][0])[(k * 32 + lane) / NG * NW + (k * 32 + lane) % NG];
        }
        finish(t, v, bad, CL);
    }
    if (threadIdx.x == 0)
        out[blockIdx.x] = bad;
    cg::this_cluster().sync();
}

__device__ __forceinline__ void st_relaxed_u64(unsigned long long *p, unsigned long long v)
{
    asm volatile("st.relaxed.gpu.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
__device__ __forceinline__ unsigned long long ld_relaxed_u64(const unsigned long long *p)
{
    unsigned long long v;
    asm volatile("ld.relaxed.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}

/* MODE 0: g-w0, MODE 1: g-all (header). slots: [groups][2][CL], zero. */
template <int CL, int MODE>
__global__ void __launch_bounds__(1024, 1) k_glob(int iters, unsigned long long *slots, float *out)
{
    __shared__ float red[2][32];
    __shared__ float tot[2][32];
    __shared__ uint64_t bar;
    const int rank = (int)(blockIdx.x % CL);
    const int64_t grp = blockIdx.x / CL;
    const int lane = (int)(threadIdx.x & 31), w = (int)(threadIdx.x / 32);
    if (threadIdx.x == 0) {
        mbar_init(&bar, 1);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    float v = 1.0f, bad = 0.0f;
    for (int i = 0; i < iters; i++) {
        float x = v;
#pragma unroll
        for (int m = 16; m > 0; m >>= 1)
            x += __shfl_xor_sync(0xffffffffu, x, m);
        if (lane == 0)
            red[i & 1][w] = x;
        __syncthreads();
        unsigned long long *sl = slots + (grp * 2 + (i & 1)) * CL;
        const unsigned tag = (unsigned)i + 1u;
        if (w == 0) {
            float c = red[i & 1][lane];
#pragma unroll
            for (int m = 16; m > 0; m >>= 1)
                c += __shfl_xor_sync(0xffffffffu, c, m);
            if (lane == 0)
                st_relaxed_u64(sl + rank, ((unsigned long long)__float_as_uint(c) << 32) | tag);
        }
        float t = 0.0f;
        if constexpr (MODE == 0) {
            if (w == 0) {
                if (lane < CL) {
                    unsigned long long u;
                    do {
                        u = ld_relaxed_u64(sl + lane);
                    } while ((unsigned)u != tag);
                    tot[i & 1][lane] = __uint_as_float((unsigned)(u >> 32));
                }
                __syncwarp();
                if (lane == 0)
                    asm volatile("mbarrier.arrive.release.cta.shared::cta.b64 _, [%0];" ::"r"(smem_addr(&bar))
                                 : "memory");
            }
            mbar_wait(&bar, (uint32_t)(i & 1));
            t = lane < CL ? tot[i & 1][lane] : 0.0f;
        } else {
            if (lane < CL) {
                unsigned long long u;
                do {
                    u = ld_relaxed_u64(sl + lane);
                } while ((unsigned)u != tag);
                t = __uint_as_float((unsigned)(u >> 32));
            }
        }
        finish(t, v, bad, CL);
    }
    if (threadIdx.x == 0)
        out[blockIdx.x] = bad;
}

static const int SMEM = 150 * 1024; /* one CTA an SM */

template <typename F> static float time_it(F launch)
{
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    launch(); /* warm */
    CK(cudaDeviceSynchronize());
    float best = 1e30f;
    for (int r = 0; r < 5; r++) {
        CK(cudaEventRecord(a));
        launch();
        CK(cudaEventRecord(b));
        CK(cudaEventSynchronize(b));
        float ms;
        CK(cudaEventElapsedTime(&ms, a, b));
        best = ms < best ? ms : best;
    }
    CK(cudaEventDestroy(a));
    CK(cudaEventDestroy(b));
    return best;
}

static int check(const float *d_out, int n)
{
    std::vector<float> h(n);
    CK(cudaMemcpy(h.data(), d_out, n * sizeof(float), cudaMemcpyDeviceToHost));
    int bad = 0;
    for (float f : h)
        bad += f != 0.0f;
    return bad;
}

template <int CL> static void run_k(void (*kern)(int, float *), const char *form, int iters, float *d_out)
{
    if (CL > 8)
        CK(cudaFuncSetAttribute(kern, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
    CK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM));
    cudaLaunchAttribute at[1];
    cudaLaunchConfig_t cfg = cluster_config(CL, dim3(CL), dim3(1024), SMEM, 0, at);
    int ncl = 0;
    CK(cudaOccupancyMaxActiveClusters(&ncl, kern, &cfg));
    cfg.gridDim = dim3(ncl * CL);
    const float ms = time_it([&] { CK(cudaLaunchKernelEx(&cfg, kern, iters, d_out)); });
    const int bad = check(d_out, ncl * CL);
    printf("cluster  CL=%-2d form=%-9s ctas=%3d  %7.1f ns a reduction  %s\n", CL, form, ncl * CL,
           ms * 1e6 / iters, bad ? "WRONG SUMS" : "sums exact");
}

template <int CL> static void run_clu(int iters, float *d_out)
{
    run_k<CL>(k_clu<CL>, CL >= LNORM_CUDA_CLU_HIER ? "lnormd-2l" : "lnormd-1l", iters, d_out);
}

template <int CL, int MODE> static void run_glob(int iters, int sms, unsigned long long *d_slots, float *d_out)
{
    auto kern = k_glob<CL, MODE>;
    CK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM));
    const int groups = sms / CL;
    const size_t sb = (size_t)groups * 2 * CL * sizeof(unsigned long long);
    const float ms = time_it([&] {
        CK(cudaMemsetAsync(d_slots, 0, sb));
        kern<<<groups * CL, 1024, SMEM>>>(iters, d_slots, d_out);
        CK(cudaGetLastError());
    });
    const int bad = check(d_out, groups * CL);
    printf("global   CL=%-2d form=%-9s ctas=%3d  %7.1f ns a reduction  %s (incl. a slot memset)\n", CL,
           MODE == 0 ? "g-w0" : "g-all", groups * CL, ms * 1e6 / iters, bad ? "WRONG SUMS" : "sums exact");
}

int main(int argc, char **argv)
{
    const int iters = argc > 1 ? atoi(argv[1]) : 20000;
    cudaDeviceProp pr;
    CK(cudaGetDeviceProperties(&pr, 0));
    printf("device: %s, %d SMs; %d reductions a kernel\n", pr.name, pr.multiProcessorCount, iters);
    float *d_out;
    unsigned long long *d_slots;
    CK(cudaMalloc(&d_out, 4096 * sizeof(float)));
    CK(cudaMalloc(&d_slots, 4096 * sizeof(unsigned long long)));
    run_clu<1>(iters, d_out);
    run_clu<2>(iters, d_out);
    run_clu<4>(iters, d_out);
    run_clu<8>(iters, d_out);
    run_clu<16>(iters, d_out);
    const int sms = pr.multiProcessorCount;
    run_glob<2, 0>(iters, sms, d_slots, d_out);
    run_glob<4, 0>(iters, sms, d_slots, d_out);
    run_glob<8, 0>(iters, sms, d_slots, d_out);
    run_glob<16, 0>(iters, sms, d_slots, d_out);
    run_glob<2, 1>(iters, sms, d_slots, d_out);
    run_glob<4, 1>(iters, sms, d_slots, d_out);
    run_glob<8, 1>(iters, sms, d_slots, d_out);
    run_glob<16, 1>(iters, sms, d_slots, d_out);
    /* The same forms on one group only (no contention for L2). */
    run_glob<4, 0>(iters, 4, d_slots, d_out);
    run_glob<4, 1>(iters, 4, d_slots, d_out);
    /* Cluster reduction variants (k_cluv). */
    run_k<2>(k_cluv<2, 0, 2>, "1l-nb2", iters, d_out);
    run_k<4>(k_cluv<4, 0, 2>, "1l-nb2", iters, d_out);
    run_k<4>(k_cluv<4, 0, 4>, "1l-nb4", iters, d_out);
    run_k<4>(k_cluv<4, 0, 8>, "1l-nb8", iters, d_out);
    run_k<2>(k_cluv<2, 1, 1>, "2l", iters, d_out);
    run_k<4>(k_cluv<4, 1, 1>, "2l", iters, d_out);
    run_k<8>(k_cluv<8, 1, 1>, "2l", iters, d_out);
    run_k<2>(k_cluv<2, 2, 4>, "grp4", iters, d_out);
    run_k<4>(k_cluv<4, 2, 4>, "grp4", iters, d_out);
    run_k<4>(k_cluv<4, 2, 8>, "grp8", iters, d_out);
    run_k<8>(k_cluv<8, 2, 4>, "grp4", iters, d_out);
    run_k<8>(k_cluv<8, 2, 8>, "grp8", iters, d_out);
    run_k<16>(k_cluv<16, 2, 8>, "grp8", iters, d_out);
    CK(cudaFree(d_out));
    CK(cudaFree(d_slots));
    return 0;
}
