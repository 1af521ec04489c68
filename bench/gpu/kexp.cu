/*
 * kexp: a kernel design experiment for the one-CTA-per-row tiers, run on the
 * device beside lnormd's own kernels (launch_tier from the real header) and
 * a copy kernel, on the same buffers, in one process.
 *
 * Question it answers: how far below the copy ceiling the common case
 * (one segment, contiguous aligned rows, y dtype = x dtype) stays because
 * of the kernel's structure, and which structure closes the gap:
 *   - instructions per element: x converted to fp32 once, the shift K and
 *     the mean subtracted in place (LayerNorm: 1 + 1 + 2 + 2 ops an element
 *     instead of 3 + 4 + 5), parameters through the read-only cache;
 *   - threads per row / chunks per thread at a given H;
 *   - grid: one tile per CTA (the hardware scheduler hides latency by
 *     swapping CTAs) or persistent CTAs.
 * Timing as bench/kernels.py: a 256 MiB memset between launches (L2 cold),
 * events around the launch, median of REPS. GB/s = 2 * N * H * bytes / t.
 * Output: one line per (op, dtype, H, variant) with GB/s, the ratio to
 * the copy kernel of the same H, and the largest difference from lnormd's
 * current kernel (fp32 of the outputs).
 *
 * Build (here): nvcc -O3 -std=c++17 -arch=sm_90 -Ikernels/cuda -Iinclude \
 *   bench/gpu/kexp.cu -o .devpack/kexp   (not part of the build; carry it)
 */
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "lnorm_cuda_kernels.cuh"
#include "harness.cuh"

using namespace lnorm_cuda;

/* Sum over the TPR threads of a group: lnormd's group_sum without a
 * cluster. */
template <int TPR, int BLOCK> __device__ __forceinline__ float gsum(float v, float (*red)[BLOCK / 32], int par)
{
    return group_sum<TPR, BLOCK, 1>(v, red, nullptr, 0, par);
}

/* A 16-byte load with the L2 256-byte prefetch hint. */
__device__ __forceinline__ uint4 ld_l2pf(const void *p)
{
    uint4 u;
    asm volatile("ld.global.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(u.x), "=r"(u.y), "=r"(u.z), "=r"(u.w)
                 : "l"(p));
    return u;
}

template <typename T, bool RMS, int TPR, int NCH, int BLOCK, bool LDCS, bool STCS, int MINB = 1, bool HINT = false>
__global__ void __launch_bounds__(BLOCK, MINB) k_x(const T *__restrict__ x, T *__restrict__ y, const T *__restrict__ gp,
                                             const T *__restrict__ bp, int64_t N, int H, float eps)
{
    constexpr int VEC = 16 / (int)sizeof(T);
    constexpr int RPC = BLOCK / TPR;
    __shared__ float red[2][BLOCK / 32];
    const int t = (int)(threadIdx.x % TPR);
    const int gi = (int)(threadIdx.x / TPR);
    const int64_t ntiles = (N + RPC - 1) / RPC;
    int par = 0;
    for (int64_t tile = blockIdx.x; tile < ntiles; tile += gridDim.x) {
        const int64_t row = tile * RPC + gi;
        const bool active = row < N;
        const int Hr = active ? H : 0;
        const T *xr = x + (active ? row : 0) * (int64_t)H;
        uint4 raw[NCH];
#pragma unroll
        for (int j = 0; j < NCH; j++) {
            const int c0 = (j * TPR + t) * VEC;
            raw[j] = c0 < Hr ? (HINT ? ld_l2pf(xr + c0)
                                : LDCS ? __ldcs(reinterpret_cast<const uint4 *>(xr + c0))
                                       : *reinterpret_cast<const uint4 *>(xr + c0))
                             : make_uint4(0, 0, 0, 0);
        }
        const float K = (!RMS && Hr > 0) ? shift_of<T>(xr[0]) : 0.0f;
        float f[NCH][VEC];
        float s1 = 0.0f;
#pragma unroll
        for (int j = 0; j < NCH; j++) {
            const int c0 = (j * TPR + t) * VEC;
            unpack<T>(raw[j], f[j]);
            if constexpr (!RMS) {
#pragma unroll
                for (int k = 0; k < VEC; k++) {
                    f[j][k] = c0 + k < Hr ? f[j][k] - K : 0.0f;
                    s1 += f[j][k];
                }
            }
        }
        float d = 0.0f;
        if constexpr (!RMS) {
            s1 = gsum<TPR, BLOCK>(s1, red, par);
            par ^= 1;
            d = Hr > 0 ? s1 / (float)Hr : 0.0f;
        }
        float sq = 0.0f;
#pragma unroll
        for (int j = 0; j < NCH; j++) {
            const int c0 = (j * TPR + t) * VEC;
#pragma unroll
            for (int k = 0; k < VEC; k++) {
                if constexpr (!RMS)
                    f[j][k] = c0 + k < Hr ? f[j][k] - d : 0.0f;
                sq = __fmaf_rn(f[j][k], f[j][k], sq);
            }
        }
        sq = gsum<TPR, BLOCK>(sq, red, par);
        par ^= 1;
        if (!active)
            continue;
        const float rstd = 1.0f / sqrtf(sq / (float)H + eps);
        T *yr = y + row * (int64_t)H;
#pragma unroll
        for (int j = 0; j < NCH; j++) {
            const int c0 = (j * TPR + t) * VEC;
            if (c0 >= H)
                continue;
            float g[VEC], b[VEC];
            unpack<T>(__ldg(reinterpret_cast<const uint4 *>(gp + c0)), g);
            if (!RMS)
                unpack<T>(__ldg(reinterpret_cast<const uint4 *>(bp + c0)), b);
            float o[VEC];
#pragma unroll
            for (int k = 0; k < VEC; k++)
                o[k] = RMS ? __fmul_rn(__fmul_rn(f[j][k], rstd), g[k])
                           : __fmaf_rn(__fmul_rn(f[j][k], rstd), g[k], b[k]);
            const uint4 u = pack<T>(o);
            if (STCS)
                __stcs(reinterpret_cast<uint4 *>(yr + c0), u);
            else
                *reinterpret_cast<uint4 *>(yr + c0) = u;
        }
    }
}

/* The cluster form of k_x: one row per cluster of CL CTAs of TPR threads
 * (the column mapping and reductions of lnormd's cluster tiers: group_sum
 * over the CTA, then over the cluster through distributed shared memory),
 * grid = rows x CL (one row per cluster, no persistence). */
template <typename T, bool RMS, int TPR, int NCH, int CL>
__global__ void __launch_bounds__(TPR) k_xc(const T *__restrict__ x, T *__restrict__ y, const T *__restrict__ gp,
                                           const T *__restrict__ bp, int64_t N, int H, float eps)
{
    constexpr int VEC = 16 / (int)sizeof(T);
    __shared__ float red[2][TPR / 32];
    __shared__ ClusterRed<CL, TPR / 32> cred;
    const int t = (int)threadIdx.x;
    const int rank = (int)cg::this_cluster().block_rank();
    cluster_red_init(&cred);
    cg::this_cluster().sync(); /* peers store into cred only after its init */
    int par = 0;
    for (int64_t row = blockIdx.x / CL; row < N; row += gridDim.x / CL) {
        const T *xr = x + row * (int64_t)H;
        uint4 raw[NCH];
#pragma unroll
        for (int j = 0; j < NCH; j++) {
            const int c0 = ((rank * NCH + j) * TPR + t) * VEC;
            raw[j] = c0 < H ? __ldcs(reinterpret_cast<const uint4 *>(xr + c0)) : make_uint4(0, 0, 0, 0);
        }
        const float K = RMS ? 0.0f : shift_of<T>(xr[0]);
        float f[NCH][VEC];
        float s1 = 0.0f;
#pragma unroll
        for (int j = 0; j < NCH; j++) {
            const int c0 = ((rank * NCH + j) * TPR + t) * VEC;
            unpack<T>(raw[j], f[j]);
            if constexpr (!RMS) {
#pragma unroll
                for (int k = 0; k < VEC; k++) {
                    f[j][k] = c0 + k < H ? f[j][k] - K : 0.0f;
                    s1 += f[j][k];
                }
            }
        }
        float d = 0.0f;
        if constexpr (!RMS) {
            s1 = group_sum<TPR, TPR, CL>(s1, red, &cred, rank, par);
            par++;
            d = s1 / (float)H;
        }
        float sq = 0.0f;
#pragma unroll
        for (int j = 0; j < NCH; j++) {
            const int c0 = ((rank * NCH + j) * TPR + t) * VEC;
#pragma unroll
            for (int k = 0; k < VEC; k++) {
                if constexpr (!RMS)
                    f[j][k] = c0 + k < H ? f[j][k] - d : 0.0f;
                sq = __fmaf_rn(f[j][k], f[j][k], sq);
            }
        }
        sq = group_sum<TPR, TPR, CL>(sq, red, &cred, rank, par);
        par++;
        const float rstd = 1.0f / sqrtf(sq / (float)H + eps);
        T *yr = y + row * (int64_t)H;
#pragma unroll
        for (int j = 0; j < NCH; j++) {
            const int c0 = ((rank * NCH + j) * TPR + t) * VEC;
            if (c0 >= H)
                continue;
            float g[VEC], b[VEC];
            unpack<T>(__ldg(reinterpret_cast<const uint4 *>(gp + c0)), g);
            if (!RMS)
                unpack<T>(__ldg(reinterpret_cast<const uint4 *>(bp + c0)), b);
            float o[VEC];
#pragma unroll
            for (int k = 0; k < VEC; k++)
                o[k] = RMS ? __fmul_rn(__fmul_rn(f[j][k], rstd), g[k])
                           : __fmaf_rn(__fmul_rn(f[j][k], rstd), g[k], b[k]);
            *reinterpret_cast<uint4 *>(yr + c0) = pack<T>(o);
        }
    }
    cg::this_cluster().sync();
}

/* A plain copy (uint4, grid stride), the ceiling of the same run. */
__global__ void k_copy(const uint4 *__restrict__ s, uint4 *__restrict__ d, int64_t n)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        d[i] = __ldcs(s + i);
}

/* Copy with four 16-byte loads in flight per thread. */
__global__ void k_copy4(const uint4 *__restrict__ s, uint4 *__restrict__ d, int64_t n)
{
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    for (; i + 3 * stride < n; i += 4 * stride) {
        uint4 a = __ldcs(s + i), b = __ldcs(s + i + stride), c = __ldcs(s + i + 2 * stride),
              e = __ldcs(s + i + 3 * stride);
        d[i] = a;
        d[i + stride] = b;
        d[i + 2 * stride] = c;
        d[i + 3 * stride] = e;
    }
    for (; i < n; i += stride)
        d[i] = __ldcs(s + i);
}

static int REPS = 30;
static void *g_flush;
static const size_t FLUSH = 256u << 20;

template <typename F> static double time_med(F launch)
{
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    std::vector<float> ms;
    for (int i = 0; i < REPS + 3; i++) {
        CK(cudaMemsetAsync(g_flush, i & 0xff, FLUSH, 0));
        CK(cudaEventRecord(a, 0));
        launch();
        CK(cudaEventRecord(b, 0));
        CK(cudaEventSynchronize(b));
        float t = 0;
        CK(cudaEventElapsedTime(&t, a, b));
        if (i >= 3)
            ms.push_back(t);
    }
    CK(cudaGetLastError());
    std::sort(ms.begin(), ms.end());
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    return ms[ms.size() / 2] * 1e-3;
}

__global__ void k_fill(__nv_bfloat16 *p, int64_t n, uint32_t seed, float off)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        uint32_t h = (uint32_t)i * 2654435761u ^ seed;
        h ^= h >> 15;
        h *= 2246822519u;
        h ^= h >> 13;
        p[i] = __float2bfloat16((float)(h & 0xffffff) / 16777216.0f * 4.0f - 2.0f + off);
    }
}
__global__ void k_fillf(float *p, int64_t n, uint32_t seed, float off)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        uint32_t h = (uint32_t)i * 2654435761u ^ seed;
        h ^= h >> 15;
        h *= 2246822519u;
        h ^= h >> 13;
        p[i] = (float)(h & 0xffffff) / 16777216.0f * 4.0f - 2.0f + off;
    }
}
template <typename T> static void fill(T *p, int64_t n, uint32_t seed, float off)
{
    if constexpr (sizeof(T) == 2)
        k_fill<<<1024, 256>>>((__nv_bfloat16 *)p, n, seed, off);
    else
        k_fillf<<<1024, 256>>>((float *)p, n, seed, off);
    CK(cudaGetLastError());
}

struct Ctx {
    const char *op, *dt;
    int H;
    int64_t N;
    double bytes, copy;
    void *x, *y, *yref, *g, *b;
    int sms;
};

template <typename T>
__global__ void k_cmp(const T *a, const T *r, int64_t n, unsigned *maxbits, unsigned long long *ndiff)
{
    float m = 0.0f;
    unsigned long long nd = 0;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const float d = fabsf(to_f<T>(a[i]) - to_f<T>(r[i]));
        m = (d != d) ? INFINITY : fmaxf(m, d);
        if constexpr (sizeof(T) == 2)
            nd += *(const unsigned short *)&a[i] != *(const unsigned short *)&r[i];
        else
            nd += *(const unsigned *)&a[i] != *(const unsigned *)&r[i];
    }
    atomicMax(maxbits, __float_as_uint(m));
    atomicAdd(ndiff, nd);
}

/* Largest |y - yref| and the count of elements whose bits differ. */
template <typename T> static double maxdiff(const Ctx &c, int64_t *ndiff)
{
    static unsigned *mb;
    static unsigned long long *nd;
    if (!mb) {
        CK(cudaMalloc(&mb, 4));
        CK(cudaMalloc(&nd, 8));
    }
    CK(cudaMemset(mb, 0, 4));
    CK(cudaMemset(nd, 0, 8));
    k_cmp<T><<<c.sms * 4, 512>>>((const T *)c.y, (const T *)c.yref, c.N * (int64_t)c.H, mb, nd);
    unsigned hb = 0;
    unsigned long long hn = 0;
    CK(cudaMemcpy(&hb, mb, 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(&hn, nd, 8, cudaMemcpyDeviceToHost));
    float m;
    memcpy(&m, &hb, 4);
    *ndiff = (int64_t)hn;
    return m;
}

static void report(const Ctx &c, const char *name, double t, double md, int64_t nd)
{
    const double gbs = c.bytes / t / 1e9;
    printf("%-4s %-5s %6d %-28s %8.1f GB/s  %.3f of copy  maxdiff %.3g (%lld differ)\n", c.op, c.dt, c.H, name,
           gbs, gbs / c.copy, md, (double)nd < 0 ? 0LL : (long long)nd);
    fflush(stdout);
}

template <typename T, bool RMS, int TPR, int NCH, int BLOCK, bool LDCS, bool STCS, int MINB = 1, bool HINT = false>
static void run_x(Ctx &c, const char *tag)
{
    constexpr int RPC = BLOCK / TPR;
    auto kern = k_x<T, RMS, TPR, NCH, BLOCK, LDCS, STCS, MINB, HINT>;
    int occ = 0;
    CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, kern, BLOCK, 0));
    cudaFuncAttributes fa;
    CK(cudaFuncGetAttributes(&fa, kern));
    const int64_t tiles = (c.N + RPC - 1) / RPC;
    const int64_t grids[3] = {tiles, (int64_t)c.sms * occ, (int64_t)c.sms * occ * 4};
    const char *gname[3] = {"all", "1w", "4w"};
    for (int gi = 0; gi < 3; gi++) {
        const unsigned grid = (unsigned)std::min(grids[gi], tiles);
        CK(cudaMemset(c.y, 0xff, c.N * (int64_t)c.H * sizeof(T)));
        auto L = [&] {
            kern<<<grid, BLOCK>>>((const T *)c.x, (T *)c.y, (const T *)c.g, (const T *)c.b, c.N, c.H, 1e-5f);
        };
        L();
        CK(cudaDeviceSynchronize());
        int64_t nd = 0;
        const double md = maxdiff<T>(c, &nd);
        const double t = time_med(L);
        char name[96];
        snprintf(name, sizeof name, "x%dx%d/b%d%s%s%s%s/%s r%d o%d%s", TPR, NCH, BLOCK, LDCS ? "" : "/ld",
                 STCS ? "/stcs" : "", HINT ? "/pf256" : "", MINB > 1 ? "/minb" : "", gname[gi], fa.numRegs, occ,
                 fa.localSizeBytes ? " SPILL" : "");
        (void)tag;
        report(c, name, t, md, nd);
    }
}

template <typename T, bool RMS, int TPR, int NCH, int CL> static void run_xc(Ctx &c)
{
    auto kern = k_xc<T, RMS, TPR, NCH, CL>;
    if (CL > 8)
        CK(cudaFuncSetAttribute(kern, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
    cudaFuncAttributes fa;
    CK(cudaFuncGetAttributes(&fa, kern));
    cudaLaunchAttribute at[1];
    cudaLaunchConfig_t cfg = cluster_config(CL, dim3(CL * c.sms, 1, 1), dim3(TPR, 1, 1), 0, 0, at);
    int ncl = 0;
    CK(cudaOccupancyMaxActiveClusters(&ncl, kern, &cfg));
    const int64_t grids[2] = {c.N, ncl};
    const char *gname[2] = {"all", "1w"};
    for (int gi = 0; gi < 2; gi++) {
        cfg.gridDim = dim3((unsigned)(std::min(grids[gi], c.N) * CL), 1, 1);
        CK(cudaMemset(c.y, 0xff, c.N * (int64_t)c.H * sizeof(T)));
        auto L = [&] {
            CK(cudaLaunchKernelEx(&cfg, kern, (const T *)c.x, (T *)c.y, (const T *)c.g, (const T *)c.b, c.N, c.H,
                                  1e-5f));
        };
        L();
        CK(cudaDeviceSynchronize());
        int64_t nd = 0;
        const double md = maxdiff<T>(c, &nd);
        const double t = time_med(L);
        char name[96];
        snprintf(name, sizeof name, "xc%dx%dcl%d/%s r%d ncl%d%s", TPR, NCH, CL, gname[gi], fa.numRegs, ncl,
                 fa.localSizeBytes ? " SPILL" : "");
        report(c, name, t, md, nd);
    }
}

template <typename T> static int tier_of(int H)
{
    const int64_t chunks = (H + 16 / (int)sizeof(T) - 1) / (16 / (int)sizeof(T));
    static const int64_t cap[] = {
#define C_(i, tpr, nch, cl) (int64_t)(tpr) * (nch) * (cl),
        LNORM__TIERS(C_)
#undef C_
    };
    for (int i = 0; i < LNORM__NREG_TIERS; i++)
        if (chunks <= cap[i])
            return i;
    return LNORM__NREG_TIERS;
}

/* lnormd's current kernel (launch_tier with the fast variant, bulk off and
 * on), writing yref (the first) or y. */
template <typename T> static void run_base(Ctx &c, bool rms, int bulk, bool ref)
{
    lnorm__kparams p;
    memset(&p, 0, sizeof p);
    p.total_rows = c.N;
    p.nsegs = 1;
    p.fast = (rms ? LNORM__FAST_RMS : LNORM__FAST_LN) | (bulk ? LNORM__FAST_BULK : 0);
    p.one.x = c.x;
    p.one.y = ref ? c.yref : c.y;
    p.one.gamma = c.g;
    p.one.beta = rms ? nullptr : c.b;
    p.one.x_stride = c.H;
    p.one.y_stride = c.H;
    p.one.hidden = c.H;
    p.one.eps = 1e-5f;
    p.one.op = rms ? LNORM_OP_RMSNORM : LNORM_OP_LAYERNORM;
    p.one.y_dtype = sizeof(T) == 2 ? LNORM_DTYPE_BF16 : LNORM_DTYPE_F32;
    p.one.param_dtype = p.one.y_dtype;
    const int tier = tier_of<T>(c.H);
    CK(cudaMemset(p.one.y, 0xff, c.N * (int64_t)c.H * sizeof(T)));
    auto L = [&] { CK((cudaError_t)launch_tier<T>(tier, &p, 0)); };
    L();
    CK(cudaDeviceSynchronize());
    int64_t nd = 0;
    double md = 0;
    if (!ref)
        md = maxdiff<T>(c, &nd);
    const double t = time_med(L);
    char name[64];
    snprintf(name, sizeof name, "lnormd tier%d%s", tier, bulk ? " bulk" : "");
    report(c, name, t, md, nd);
}

template <typename T> static void setup(Ctx &c, const char *op, int H)
{
    c.op = op;
    c.dt = sizeof(T) == 2 ? "bf16" : "f32";
    c.H = H;
    c.N = (1ll << 27) / H;
    const int64_t n = c.N * (int64_t)H;
    c.bytes = 2.0 * (double)n * sizeof(T);
    fill<T>((T *)c.x, n, 0x9e3779b9u ^ (uint32_t)H, 0.5f);
    fill<T>((T *)c.g, H, 0x1234u, 1.0f);
    fill<T>((T *)c.b, H, 0x4321u, 0.0f);
    const int64_t n16 = n * (int64_t)sizeof(T) / 16;
    auto L = [&] { k_copy<<<c.sms * 8, 512>>>((const uint4 *)c.x, (uint4 *)c.y, n16); };
    c.copy = 1.0;
    c.copy = c.bytes / time_med(L) / 1e9;
    auto M = [&] { CK(cudaMemcpyAsync(c.y, c.x, n * sizeof(T), cudaMemcpyDeviceToDevice, 0)); };
    const double mc = c.bytes / time_med(M) / 1e9;
    auto L4 = [&] { k_copy4<<<c.sms * 4, 512>>>((const uint4 *)c.x, (uint4 *)c.y, n16); };
    const double c4 = c.bytes / time_med(L4) / 1e9;
    printf("%-4s %-5s %6d %-28s %8.1f GB/s  (cudaMemcpy %.1f GB/s, copy x4 %.1f GB/s)\n", op, c.dt, H, "copy kernel",
           c.copy, mc, c4);
}

#define XS(T, RMS, TPR, NCH, BLOCK) run_x<T, RMS, TPR, NCH, BLOCK, true, false>(c, "")

/* Round 2 (after round 1 on 2026-11-30): bf16 LayerNorm, the hardest
 * case, with more resident CTAs (fewer registers), the L2 256-byte
 * prefetch hint, 2048 and 32768; f32 at 2048/4096. */
#define XV(T, RMS, TPR, NCH, BLOCK, MINB, HINT) run_x<T, RMS, TPR, NCH, BLOCK, true, false, MINB, HINT>(c, "")
static int round2(Ctx &c)
{
    using bf = __nv_bfloat16;
    setup<bf>(c, "ln", 256);
    run_base<bf>(c, false, 0, true);
    XV(bf, false, 8, 4, 128, 1, true);
    XV(bf, false, 16, 2, 256, 1, true);
    XV(bf, false, 16, 2, 256, 6, false);
    XV(bf, false, 16, 4, 256, 1, false);
    setup<bf>(c, "ln", 1024);
    run_base<bf>(c, false, 0, true);
    XV(bf, false, 32, 4, 128, 1, true);
    XV(bf, false, 32, 4, 128, 8, false);
    XV(bf, false, 32, 4, 256, 1, false);
    XV(bf, false, 32, 4, 256, 4, false);
    setup<bf>(c, "ln", 2048);
    run_base<bf>(c, false, 0, true);
    run_base<bf>(c, false, 1, false);
    XV(bf, false, 64, 4, 128, 1, false);
    XV(bf, false, 64, 4, 128, 1, true);
    XV(bf, false, 64, 4, 128, 8, false);
    XV(bf, false, 128, 2, 128, 1, false);
    setup<bf>(c, "ln", 4096);
    run_base<bf>(c, false, 0, true);
    run_base<bf>(c, false, 1, false);
    XV(bf, false, 128, 4, 128, 1, true);
    XV(bf, false, 128, 4, 128, 8, false);
    XV(bf, false, 128, 4, 256, 1, false);
    setup<bf>(c, "ln", 8192);
    run_base<bf>(c, false, 0, true);
    run_base<bf>(c, false, 1, false);
    XV(bf, false, 256, 4, 256, 1, true);
    XV(bf, false, 256, 4, 256, 4, false);
    setup<bf>(c, "ln", 16384);
    run_base<bf>(c, false, 0, true);
    XV(bf, false, 512, 4, 512, 1, true);
    XV(bf, false, 512, 4, 512, 2, false);
    setup<bf>(c, "ln", 32768);
    run_base<bf>(c, false, 1, true);
    XV(bf, false, 512, 8, 512, 1, false);
    XV(bf, false, 1024, 4, 1024, 1, false);
    run_xc<bf, false, 256, 8, 2>(c);
    run_xc<bf, false, 256, 4, 4>(c);
    run_xc<bf, false, 512, 4, 2>(c);
    run_xc<bf, false, 128, 8, 4>(c);
    setup<bf>(c, "rms", 32768);
    run_base<bf>(c, true, 1, true);
    XV(bf, true, 512, 8, 512, 1, false);
    XV(bf, true, 1024, 4, 1024, 1, false);
    run_xc<bf, true, 256, 4, 4>(c);
    run_xc<bf, true, 512, 4, 2>(c);
    setup<bf>(c, "ln", 65536);
    run_base<bf>(c, false, 1, true);
    run_xc<bf, false, 256, 8, 4>(c);
    run_xc<bf, false, 256, 4, 8>(c);
    run_xc<bf, false, 512, 4, 4>(c);
    setup<bf>(c, "ln", 262144);
    run_base<bf>(c, false, 1, true);
    run_xc<bf, false, 256, 8, 16>(c);
    run_xc<bf, false, 512, 4, 16>(c);
    run_xc<bf, false, 1024, 4, 8>(c);
    setup<float>(c, "ln", 16384);
    run_base<float>(c, false, 1, true);
    run_xc<float, false, 256, 8, 2>(c);
    run_xc<float, false, 256, 4, 4>(c);
    run_xc<float, false, 512, 4, 2>(c);
    setup<float>(c, "ln", 65536);
    run_base<float>(c, false, 1, true);
    run_xc<float, false, 256, 8, 8>(c);
    run_xc<float, false, 512, 4, 8>(c);
    run_xc<float, false, 256, 4, 16>(c);
    setup<float>(c, "ln", 2048);
    run_base<float>(c, false, 0, true);
    run_base<float>(c, false, 1, false);
    XV(float, false, 128, 4, 128, 1, false);
    XV(float, false, 256, 2, 256, 1, false);
    setup<float>(c, "ln", 4096);
    run_base<float>(c, false, 0, true);
    run_base<float>(c, false, 1, false);
    XV(float, false, 256, 4, 256, 1, false);
    XV(float, false, 512, 2, 512, 1, false);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc > 1)
        REPS = atoi(argv[1]);
    cudaDeviceProp pr;
    CK(cudaGetDeviceProperties(&pr, 0));
    printf("# kexp on %s, %d SMs; median of %d launches, L2 flushed (256 MiB memset) before each\n", pr.name,
           pr.multiProcessorCount, REPS);
    Ctx c;
    memset(&c, 0, sizeof c);
    c.sms = pr.multiProcessorCount;
    const size_t bytes = (size_t)(1ll << 27) * 4;
    CK(cudaMalloc(&c.x, bytes));
    CK(cudaMalloc(&c.y, bytes));
    CK(cudaMalloc(&c.yref, bytes));
    CK(cudaMalloc(&c.g, 262144 * 4));
    CK(cudaMalloc(&c.b, 262144 * 4));
    CK(cudaMalloc(&g_flush, FLUSH));
    if (argc > 2 && !strcmp(argv[2], "2"))
        return round2(c);
    using bf = __nv_bfloat16;

    /* bf16 LayerNorm */
    setup<bf>(c, "ln", 256);
    run_base<bf>(c, false, 0, true);
    run_base<bf>(c, false, 1, false);
    XS(bf, false, 8, 4, 128);
    XS(bf, false, 8, 4, 256);
    XS(bf, false, 16, 2, 256);
    XS(bf, false, 32, 1, 256);
    run_x<bf, false, 16, 2, 256, false, false>(c, "");
    run_x<bf, false, 16, 2, 256, true, true>(c, "");

    setup<bf>(c, "ln", 1024);
    run_base<bf>(c, false, 0, true);
    run_base<bf>(c, false, 1, false);
    XS(bf, false, 32, 4, 128);
    XS(bf, false, 64, 2, 128);
    XS(bf, false, 64, 2, 256);
    XS(bf, false, 128, 1, 128);
    XS(bf, false, 128, 1, 256);

    setup<bf>(c, "ln", 4096);
    run_base<bf>(c, false, 0, true);
    run_base<bf>(c, false, 1, false);
    XS(bf, false, 128, 4, 128);
    XS(bf, false, 256, 2, 256);
    XS(bf, false, 512, 1, 512);
    XS(bf, false, 64, 8, 128);
    run_x<bf, false, 256, 2, 256, true, true>(c, "");

    setup<bf>(c, "ln", 8192);
    run_base<bf>(c, false, 0, true);
    run_base<bf>(c, false, 1, false);
    XS(bf, false, 256, 4, 256);
    XS(bf, false, 512, 2, 512);
    XS(bf, false, 1024, 1, 1024);
    XS(bf, false, 128, 8, 128);

    setup<bf>(c, "ln", 16384);
    run_base<bf>(c, false, 0, true);
    run_base<bf>(c, false, 1, false);
    XS(bf, false, 256, 8, 256);
    XS(bf, false, 512, 4, 512);
    XS(bf, false, 1024, 2, 1024);

    /* bf16 RMSNorm */
    setup<bf>(c, "rms", 1024);
    run_base<bf>(c, true, 0, true);
    XS(bf, true, 32, 4, 128);
    XS(bf, true, 64, 2, 256);
    XS(bf, true, 128, 1, 256);
    setup<bf>(c, "rms", 8192);
    run_base<bf>(c, true, 0, true);
    XS(bf, true, 256, 4, 256);
    XS(bf, true, 512, 2, 512);
    XS(bf, true, 1024, 1, 1024);
    setup<bf>(c, "rms", 16384);
    run_base<bf>(c, true, 0, true);
    XS(bf, true, 256, 8, 256);
    XS(bf, true, 512, 4, 512);
    XS(bf, true, 1024, 2, 1024);

    /* f32 LayerNorm */
    setup<float>(c, "ln", 1024);
    run_base<float>(c, false, 0, true);
    run_base<float>(c, false, 1, false);
    XS(float, false, 64, 4, 128);
    XS(float, false, 128, 2, 256);
    XS(float, false, 256, 1, 256);
    setup<float>(c, "ln", 8192);
    run_base<float>(c, false, 0, true);
    XS(float, false, 256, 8, 256);
    XS(float, false, 512, 4, 512);
    XS(float, false, 1024, 2, 1024);
    setup<float>(c, "ln", 16384);
    run_base<float>(c, false, 0, true);
    run_base<float>(c, false, 1, false);
    XS(float, false, 512, 8, 512);
    XS(float, false, 1024, 4, 1024);
    return 0;
}
