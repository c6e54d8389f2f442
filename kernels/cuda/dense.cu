// Dense f32 / bf16 linear layers on the GPU (sm_90): y[m, n] = x[m, k] . w[n, k]^T with f32 activations, f32
// outputs and f32 accumulation on the CUDA cores (no tensor cores, no TF32: this is the exact path of the engine,
// whose parity tests against transformers need f32 products). The safe entry points, their checks and their
// launches are in kernels/src/cuda/dense.rs.
//
// Two kernels, picked by m:
// - dense_gemv_*: m <= 16 (decode). Bandwidth-bound: each weight row is read from memory once for all m rows of x.
//   A warp owns GEMV_ROWS_PER_WARP output rows; x is staged in shared memory in chunks of K, padded to MAXM rows
//   with zeros, and every lane reads its weights with 16-byte loads (when k allows it) and takes all MAXM rows of x
//   from shared memory, so each x load serves GEMV_ROWS_PER_WARP weight loads.
// - dense_gemv_splitk_*: m <= 16 on matrices of few rows (n < DENSE_SPLITK_MAX_N, cuda/dense.rs): one block of
//   256 threads per output row, K split across its 8 warps and reduced in shared memory. The kernel above gives
//   such a matrix ceil(n / 16) blocks, each walking whole rows: the engine's own profile of a Qwen3.8-27B decode
//   step (H100, ncu) had the DeltaNet's 48-row in_proj_a / in_proj_b take 16 us a call, 96 calls a step, where the
//   bytes take 0.2 us.
// - dense_gemm_*: m > 16 (prefill). A plain shared-memory tiled SGEMM: 64 x 64 output tiles, K in steps of 16,
//   256 threads with 4 x 4 outputs each.
// - dense_gemm_split_*: the same tiles with K split over the GEMM_SPLITS blocks of a thread-block cluster, for
//   matrices whose tiles alone would leave most of the GPU idle (cuda/dense.rs picks it). Each block sums its slice
//   of K, the cluster exchanges the partial tiles through distributed shared memory, and block r adds the
//   GEMM_SPLITS partials of rows [r * 8, r * 8 + 8) of the tile in rank order: one launch, no workspace (so a
//   recorded graph needs no scratch), and the same bits on every run. The engine's GPU timeline of a 512-token
//   prompt of the Qwen3.8-27B FP8 build had the stacked 96 x 5120 bf16 in_proj_b/a at 387 us a call on 16 blocks
//   of dense_gemm_bf16, a quarter of the prompt (benchmarks/engine-h200.md).
//
// Offsets into x, w and y are computed in 64 bits (a 248320 x 5120 matrix has 1.3e9 elements).
#include "common.cuh"

#include <cooperative_groups.h>

using namespace edgefit;

namespace {

constexpr int GEMV_THREADS = 128;
constexpr int GEMV_WARPS = GEMV_THREADS / 32;
constexpr int GEMV_ROWS_PER_WARP = 4;
constexpr int GEMV_ROWS_PER_BLOCK = GEMV_WARPS * GEMV_ROWS_PER_WARP;
// Floats of x staged per block: MAXM rows of GEMV_X_FLOATS / MAXM values each (32 KB of shared memory).
constexpr int GEMV_X_FLOATS = 8192;
static_assert(GEMV_ROWS_PER_BLOCK == 16, "cuda/dense.rs restates the rows per block");

// Weights of one element type: 16-byte loads of VEC values, and scalar loads, both widened to f32.
struct WF32 {
    using T = float;
    static constexpr int VEC = 4;
    __device__ __forceinline__ static void load_vec(const float* p, float* f) {
        const float4 v = *reinterpret_cast<const float4*>(p);
        f[0] = v.x; f[1] = v.y; f[2] = v.z; f[3] = v.w;
    }
    __device__ __forceinline__ static float load1(const float* p) { return *p; }
};

struct WBf16 {
    using T = uint16_t;
    static constexpr int VEC = 8;
    __device__ __forceinline__ static void load_vec(const uint16_t* p, float* f) {
        bf16x8_to_float(*reinterpret_cast<const uint4*>(p), f);
    }
    __device__ __forceinline__ static float load1(const uint16_t* p) { return __uint_as_float((uint32_t)*p << 16); }
};

// y = x . w^T for m <= MAXM rows of x. Grid: ceil(n / GEMV_ROWS_PER_BLOCK) blocks of GEMV_THREADS. Warp `wp` of block
// b owns rows (b * GEMV_WARPS + wp) * GEMV_ROWS_PER_WARP + 0..GEMV_ROWS_PER_WARP; rows past n are computed on row
// n - 1 (a valid read) and not stored. With `vec` (k % W::VEC == 0, so every weight row and every chunk start is
// 16-byte aligned in a 256-byte-aligned allocation), lane l reads values [i, i + VEC) for i = l * VEC + 32 * VEC * j
// of each chunk; otherwise one value per lane per step.
template <typename W, int MAXM>
__device__ __forceinline__ void dense_gemv(const float* __restrict__ x, const typename W::T* __restrict__ w,
                                           float* __restrict__ y, int m, int n, int k) {
    pdl_start();
    constexpr int KC = GEMV_X_FLOATS / MAXM;
    static_assert(KC % (32 * 8) == 0, "a chunk is a whole number of warp steps for both weight types");
    __shared__ __align__(16) float xs[MAXM * KC];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int row0 = (blockIdx.x * GEMV_WARPS + warp) * GEMV_ROWS_PER_WARP;
    const typename W::T* wr[GEMV_ROWS_PER_WARP];
#pragma unroll
    for (int q = 0; q < GEMV_ROWS_PER_WARP; ++q) wr[q] = w + (size_t)min(row0 + q, n - 1) * k;
    const bool vec = (k % W::VEC) == 0;

    float acc[GEMV_ROWS_PER_WARP][MAXM];
#pragma unroll
    for (int q = 0; q < GEMV_ROWS_PER_WARP; ++q)
#pragma unroll
        for (int r = 0; r < MAXM; ++r) acc[q][r] = 0.0f;

    for (int c0 = 0; c0 < k; c0 += KC) {
        const int len = min(KC, k - c0);
        __syncthreads();  // the previous chunk's reads are done
        for (int e = threadIdx.x; e < MAXM * KC; e += GEMV_THREADS) {
            const int r = e / KC, c = e - r * KC;
            xs[e] = (r < m && c < len) ? x[(size_t)r * k + c0 + c] : 0.0f;
        }
        __syncthreads();
        if (vec) {
            constexpr int V = W::VEC;
            for (int i = lane * V; i < len; i += 32 * V) {
                float wv[GEMV_ROWS_PER_WARP][V];
#pragma unroll
                for (int q = 0; q < GEMV_ROWS_PER_WARP; ++q) W::load_vec(wr[q] + c0 + i, wv[q]);
#pragma unroll
                for (int r = 0; r < MAXM; ++r) {
#pragma unroll
                    for (int h = 0; h < V; h += 4) {
                        const float4 xv = *reinterpret_cast<const float4*>(xs + r * KC + i + h);
#pragma unroll
                        for (int q = 0; q < GEMV_ROWS_PER_WARP; ++q) {
                            acc[q][r] = fmaf(wv[q][h], xv.x, acc[q][r]);
                            acc[q][r] = fmaf(wv[q][h + 1], xv.y, acc[q][r]);
                            acc[q][r] = fmaf(wv[q][h + 2], xv.z, acc[q][r]);
                            acc[q][r] = fmaf(wv[q][h + 3], xv.w, acc[q][r]);
                        }
                    }
                }
            }
        } else {
            for (int i = lane; i < len; i += 32) {
                float wv[GEMV_ROWS_PER_WARP];
#pragma unroll
                for (int q = 0; q < GEMV_ROWS_PER_WARP; ++q) wv[q] = W::load1(wr[q] + c0 + i);
#pragma unroll
                for (int r = 0; r < MAXM; ++r) {
                    const float xv = xs[r * KC + i];
#pragma unroll
                    for (int q = 0; q < GEMV_ROWS_PER_WARP; ++q) acc[q][r] = fmaf(wv[q], xv, acc[q][r]);
                }
            }
        }
    }
#pragma unroll
    for (int q = 0; q < GEMV_ROWS_PER_WARP; ++q) {
#pragma unroll
        for (int r = 0; r < MAXM; ++r) {
            const float s = warp_sum(acc[q][r]);
            if (lane == 0 && r < m && row0 + q < n) y[(size_t)r * n + row0 + q] = s;
        }
    }
}

constexpr int SPLITK_THREADS = 256;
constexpr int SPLITK_WARPS = SPLITK_THREADS / 32;

// y[r, row] for row = blockIdx.x and r < m: the block's threads split the row's k values (16-byte weight loads of
// VEC values when k % VEC == 0, x read from global memory where the rows of this small matrix keep it cached), each
// warp sums its lanes, and warp 0 sums the warps.
template <typename W, int MAXM>
__device__ __forceinline__ void dense_gemv_splitk(const float* __restrict__ x, const typename W::T* __restrict__ w,
                                                  float* __restrict__ y, int m, int n, int k) {
    pdl_start();
    __shared__ float part[SPLITK_WARPS][MAXM];
    const int row = blockIdx.x, tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const typename W::T* wr = w + (size_t)row * k;
    float acc[MAXM];
#pragma unroll
    for (int r = 0; r < MAXM; ++r) acc[r] = 0.0f;
    if ((k % W::VEC) == 0) {
        constexpr int V = W::VEC;
        for (int i = tid * V; i < k; i += SPLITK_THREADS * V) {
            float wv[V];
            W::load_vec(wr + i, wv);
#pragma unroll
            for (int r = 0; r < MAXM; ++r) {
                if (r < m) {
                    const float* xr = x + (size_t)r * k + i;
#pragma unroll
                    for (int h = 0; h < V; h += 4) {
                        const float4 xv = *reinterpret_cast<const float4*>(xr + h);
                        acc[r] = fmaf(wv[h], xv.x, acc[r]);
                        acc[r] = fmaf(wv[h + 1], xv.y, acc[r]);
                        acc[r] = fmaf(wv[h + 2], xv.z, acc[r]);
                        acc[r] = fmaf(wv[h + 3], xv.w, acc[r]);
                    }
                }
            }
        }
    } else {
        for (int i = tid; i < k; i += SPLITK_THREADS) {
            const float wv = W::load1(wr + i);
#pragma unroll
            for (int r = 0; r < MAXM; ++r)
                if (r < m) acc[r] = fmaf(wv, x[(size_t)r * k + i], acc[r]);
        }
    }
#pragma unroll
    for (int r = 0; r < MAXM; ++r) {
        const float s = warp_sum(acc[r]);
        if (lane == 0) part[warp][r] = s;
    }
    __syncthreads();
    if (warp == 0) {
#pragma unroll
        for (int r = 0; r < MAXM; ++r) {
            float s = lane < SPLITK_WARPS ? part[lane][r] : 0.0f;
            s = warp_sum(s);
            if (lane == 0 && r < m) y[(size_t)r * n + row] = s;
        }
    }
}

constexpr int GEMM_BM = 64, GEMM_BN = 64, GEMM_BK = 16, GEMM_THREADS = 256;
static_assert(GEMM_BM == 64 && GEMM_BN == 64, "cuda/dense.rs restates the tile");

// Loads four consecutive values [c, c + 4) of a row of length k (zeros past k) as floats; `vec` (k % 4 == 0, so
// the row and c are 16-byte aligned for f32, 8-byte for bf16) takes one load.
__device__ __forceinline__ float4 load4(const float* row, int c, int k, bool vec) {
    if (vec && c < k) return *reinterpret_cast<const float4*>(row + c);
    float v[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) v[j] = c + j < k ? row[c + j] : 0.0f;
    return make_float4(v[0], v[1], v[2], v[3]);
}
__device__ __forceinline__ float4 load4(const uint16_t* row, int c, int k, bool vec) {
    if (vec && c < k) {
        const uint2 u = *reinterpret_cast<const uint2*>(row + c);
        const float2 a = bf16x2_to_float2(u.x), b = bf16x2_to_float2(u.y);
        return make_float4(a.x, a.y, b.x, b.y);
    }
    float v[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) v[j] = c + j < k ? __uint_as_float((uint32_t)row[c + j] << 16) : 0.0f;
    return make_float4(v[0], v[1], v[2], v[3]);
}

// The 64 x 64 tile of x . w^T at rows m0.., columns n0.. over values [kb, ke) of k into `acc`: thread
// (tx, ty) = (tid % 16, tid / 16) accumulates rows m0 + ty * 4 + 0..4 and columns n0 + tx * 4 + 0..4. Each step
// loads a 64 x 16 tile of x and of w (thread tid: row tid / 4, values 4 * (tid % 4) + 0..4), stored transposed
// ([k][row]) so the inner loop reads four rows of each with one 16-byte shared load. Out-of-range rows and values
// (past m, n or ke) load as zeros. `ke` is k or a multiple of GEMM_BK, so a 4-value load below it stays in the row
// and in the slice.
template <typename T>
__device__ __forceinline__ void dense_gemm_tile(const float* __restrict__ x, const T* __restrict__ w, int m, int n,
                                                int k, int m0, int n0, int kb, int ke, float (&acc)[4][4]) {
    __shared__ __align__(16) float as[GEMM_BK][GEMM_BM];
    __shared__ __align__(16) float bs[GEMM_BK][GEMM_BN];
    const int tid = threadIdx.x, tx = tid & 15, ty = tid >> 4;
    const int lr = tid >> 2, lc = (tid & 3) * 4;
    const bool vec = (k & 3) == 0;
    const int xr = min(m0 + lr, m - 1), wrow = min(n0 + lr, n - 1);
    const float* xrow = x + (size_t)xr * k;
    const T* wrp = w + (size_t)wrow * k;
    const bool xok = m0 + lr < m, wok = n0 + lr < n;
    for (int k0 = kb; k0 < ke; k0 += GEMM_BK) {
        float4 a = xok ? load4(xrow, k0 + lc, ke, vec) : make_float4(0.f, 0.f, 0.f, 0.f);
        float4 b = wok ? load4(wrp, k0 + lc, ke, vec) : make_float4(0.f, 0.f, 0.f, 0.f);
        __syncthreads();  // the previous step's reads are done
        as[lc][lr] = a.x; as[lc + 1][lr] = a.y; as[lc + 2][lr] = a.z; as[lc + 3][lr] = a.w;
        bs[lc][lr] = b.x; bs[lc + 1][lr] = b.y; bs[lc + 2][lr] = b.z; bs[lc + 3][lr] = b.w;
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < GEMM_BK; ++kk) {
            const float4 av = *reinterpret_cast<const float4*>(&as[kk][ty * 4]);
            const float4 bv = *reinterpret_cast<const float4*>(&bs[kk][tx * 4]);
            const float ar[4] = {av.x, av.y, av.z, av.w}, br[4] = {bv.x, bv.y, bv.z, bv.w};
#pragma unroll
            for (int i = 0; i < 4; ++i)
#pragma unroll
                for (int j = 0; j < 4; ++j) acc[i][j] = fmaf(ar[i], br[j], acc[i][j]);
        }
    }
}

// y = x . w^T, grid (ceil(n / 64), ceil(m / 64)): one block per output tile, over all of k.
template <typename T>
__device__ __forceinline__ void dense_gemm(const float* __restrict__ x, const T* __restrict__ w,
                                           float* __restrict__ y, int m, int n, int k) {
    pdl_start();
    const int tx = threadIdx.x & 15, ty = threadIdx.x >> 4;
    const int m0 = blockIdx.y * GEMM_BM, n0 = blockIdx.x * GEMM_BN;
    float acc[4][4] = {};
    dense_gemm_tile(x, w, m, n, k, m0, n0, 0, k, acc);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int r = m0 + ty * 4 + i;
        if (r >= m) break;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const int c = n0 + tx * 4 + j;
            if (c < n) y[(size_t)r * n + c] = acc[i][j];
        }
    }
}

constexpr int GEMM_SPLITS = 8;
constexpr int SPLIT_ROWS = GEMM_BM / GEMM_SPLITS;  // tile rows each block of a cluster adds up and stores
static_assert(SPLIT_ROWS * GEMM_SPLITS == GEMM_BM && SPLIT_ROWS * (GEMM_BN / 4) <= GEMM_THREADS,
              "each block reduces whole rows, one float4 per thread");

// y = x . w^T, grid (ceil(n / 64) * GEMM_SPLITS, ceil(m / 64)) in clusters of GEMM_SPLITS blocks along x: the
// cluster at x / GEMM_SPLITS owns one output tile, its block of rank r sums values [r * kc, (r + 1) * kc) of k
// (kc = ceil(k / GEMM_SPLITS) rounded up to GEMM_BK; a slice past k sums nothing), then adds the cluster's partial
// tiles for its SPLIT_ROWS rows in rank order. Every block reaches both cluster barriers: the first publishes the
// partials, the second keeps each block's shared memory alive until the others have read it.
template <typename T>
__device__ __forceinline__ void dense_gemm_split(const float* __restrict__ x, const T* __restrict__ w,
                                                 float* __restrict__ y, int m, int n, int k) {
    pdl_start();
    namespace cg = cooperative_groups;
    __shared__ __align__(16) float part[GEMM_BM][GEMM_BN];
    cg::cluster_group cluster = cg::this_cluster();
    const int rank = (int)cluster.block_rank();
    const int tid = threadIdx.x, tx = tid & 15, ty = tid >> 4;
    const int m0 = blockIdx.y * GEMM_BM, n0 = (blockIdx.x / GEMM_SPLITS) * GEMM_BN;
    const int kc = ((k + GEMM_SPLITS - 1) / GEMM_SPLITS + GEMM_BK - 1) / GEMM_BK * GEMM_BK;
    const int kb = min(k, rank * kc), ke = min(k, kb + kc);
    float acc[4][4] = {};
    dense_gemm_tile(x, w, m, n, k, m0, n0, kb, ke, acc);
#pragma unroll
    for (int i = 0; i < 4; ++i)
        *reinterpret_cast<float4*>(&part[ty * 4 + i][tx * 4]) =
            make_float4(acc[i][0], acc[i][1], acc[i][2], acc[i][3]);
    cluster.sync();
    if (tid < SPLIT_ROWS * (GEMM_BN / 4)) {
        const int row = rank * SPLIT_ROWS + tid / (GEMM_BN / 4), c4 = (tid % (GEMM_BN / 4)) * 4;
        float4 s = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
        for (int q = 0; q < GEMM_SPLITS; ++q) {
            const float* remote = cluster.map_shared_rank(&part[0][0], q);
            const float4 v = *reinterpret_cast<const float4*>(remote + row * GEMM_BN + c4);
            s.x += v.x; s.y += v.y; s.z += v.z; s.w += v.w;
        }
        const int r = m0 + row;
        const float sv[4] = {s.x, s.y, s.z, s.w};
        if (r < m) {
#pragma unroll
            for (int j = 0; j < 4; ++j)
                if (n0 + c4 + j < n) y[(size_t)r * n + n0 + c4 + j] = sv[j];
        }
    }
    cluster.sync();
}

}  // namespace

#define DENSE_GEMV(NAME, W, MAXM)                                                                                 \
    extern "C" __global__ void __launch_bounds__(GEMV_THREADS)                                                   \
        NAME(const float* __restrict__ x, const W::T* __restrict__ w, float* __restrict__ y, int m, int n, int k) { \
        dense_gemv<W, MAXM>(x, w, y, m, n, k);                                                                    \
    }

// x f32 [m, k], w [n, k] (f32 or bf16 bits), y f32 [m, n]; m <= the kernel's MAXM (1, 2, 4, 8, 16).
DENSE_GEMV(dense_gemv_f32_m1, WF32, 1)
DENSE_GEMV(dense_gemv_f32_m2, WF32, 2)
DENSE_GEMV(dense_gemv_f32_m4, WF32, 4)
DENSE_GEMV(dense_gemv_f32_m8, WF32, 8)
DENSE_GEMV(dense_gemv_f32_m16, WF32, 16)
DENSE_GEMV(dense_gemv_bf16_m1, WBf16, 1)
DENSE_GEMV(dense_gemv_bf16_m2, WBf16, 2)
DENSE_GEMV(dense_gemv_bf16_m4, WBf16, 4)
DENSE_GEMV(dense_gemv_bf16_m8, WBf16, 8)
DENSE_GEMV(dense_gemv_bf16_m16, WBf16, 16)

#define DENSE_GEMV_SPLITK(NAME, W, MAXM)                                                                          \
    extern "C" __global__ void __launch_bounds__(SPLITK_THREADS)                                                 \
        NAME(const float* __restrict__ x, const W::T* __restrict__ w, float* __restrict__ y, int m, int n, int k) { \
        dense_gemv_splitk<W, MAXM>(x, w, y, m, n, k);                                                             \
    }

// As DENSE_GEMV, grid n blocks of SPLITK_THREADS: one block per output row.
DENSE_GEMV_SPLITK(dense_gemv_splitk_f32_m1, WF32, 1)
DENSE_GEMV_SPLITK(dense_gemv_splitk_f32_m2, WF32, 2)
DENSE_GEMV_SPLITK(dense_gemv_splitk_f32_m4, WF32, 4)
DENSE_GEMV_SPLITK(dense_gemv_splitk_f32_m8, WF32, 8)
DENSE_GEMV_SPLITK(dense_gemv_splitk_f32_m16, WF32, 16)
DENSE_GEMV_SPLITK(dense_gemv_splitk_bf16_m1, WBf16, 1)
DENSE_GEMV_SPLITK(dense_gemv_splitk_bf16_m2, WBf16, 2)
DENSE_GEMV_SPLITK(dense_gemv_splitk_bf16_m4, WBf16, 4)
DENSE_GEMV_SPLITK(dense_gemv_splitk_bf16_m8, WBf16, 8)
DENSE_GEMV_SPLITK(dense_gemv_splitk_bf16_m16, WBf16, 16)

// x f32 [m, k], w [n, k], y f32 [m, n]; any m >= 1.
extern "C" __global__ void __launch_bounds__(GEMM_THREADS)
    dense_gemm_f32(const float* __restrict__ x, const float* __restrict__ w, float* __restrict__ y, int m, int n,
                   int k) {
    dense_gemm<float>(x, w, y, m, n, k);
}
extern "C" __global__ void __launch_bounds__(GEMM_THREADS)
    dense_gemm_bf16(const float* __restrict__ x, const uint16_t* __restrict__ w, float* __restrict__ y, int m, int n,
                    int k) {
    dense_gemm<uint16_t>(x, w, y, m, n, k);
}

// As dense_gemm_*, K split over a cluster of GEMM_SPLITS blocks: grid (ceil(n / 64) * GEMM_SPLITS, ceil(m / 64)).
extern "C" __global__ void __cluster_dims__(GEMM_SPLITS, 1, 1) __launch_bounds__(GEMM_THREADS)
    dense_gemm_split_f32(const float* __restrict__ x, const float* __restrict__ w, float* __restrict__ y, int m,
                         int n, int k) {
    dense_gemm_split<float>(x, w, y, m, n, k);
}
extern "C" __global__ void __cluster_dims__(GEMM_SPLITS, 1, 1) __launch_bounds__(GEMM_THREADS)
    dense_gemm_split_bf16(const float* __restrict__ x, const uint16_t* __restrict__ w, float* __restrict__ y, int m,
                          int n, int k) {
    dense_gemm_split<uint16_t>(x, w, y, m, n, k);
}
