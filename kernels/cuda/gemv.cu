// Decode GEMVs (M = 1..16 activation rows) over block-quantised weights: FP8 e4m3 with 128x128 block scales and
// NVFP4 (e2m1, e4m3 scale per 16, fp32 global scale) as weight-only. y[m][n] = sum_k x[m][k] * W[n][k] * scales.
// Two families, both launched from kernels/src/cuda/gemv.rs (KernelPath picks; numbers in
// benchmarks/h200.md):
//
// CUDA cores (fp8_block_gemv_m*, nvfp4_gemv_m*, and the _rRW_uU variants): decode is bandwidth-bound, each weight
// byte is read exactly once per call, so the design is about bytes in flight. A warp owns RW output rows; each
// lane streams 16-byte chunks of them (L1 no-allocate), with U chunks per row issued before the first is used.
// Activations (bf16, a few KiB per row) come through L1 and are shared by the warp's RW rows. Accumulation is fp32,
// block scales are applied once per 16 (FP8) or 8 (NVFP4) products, the NVFP4 global scale in the epilogue.
// Launch: GEMV_THREADS threads, grid ceil(n / (GEMV_WARPS * RW)).
//
// Tensor cores (*_mma_n8, *_mma_n16, see blockq_gemv_mma below): 16-row tiles, each shared by the W warps of a
// block and (the _w{W}c{CS} builds) by CS blocks of a thread-block cluster.
//
// The FP8 decode path (Rust: Gpu::fp8_repack_tiles at load, Gpu::fp8_gemv_tiles per call): fp8_repack_mma makes
// the tile layout (each warp load one contiguous 512-byte run); at m = 1 fp8_gemv_tile_m1_* multiplies on the CUDA
// cores (90-99% of copy on the layer shapes), above it gemv_act_frag_fp8 converts the activations and
// fp8_gemv_mma_tile_pre_* (or fp8_gemv_mma_tile_*, converting them itself) multiply: 74-88% at m = 4..16 against
// 50-72% on the checkpoint layout (benchmarks/h200.md).
//
// The NVFP4 decode path (Rust: Gpu::nvfp4_repack_tiles at load, Gpu::nvfp4_gemv_tiles per call): nvfp4_repack_mma
// makes the tile layout, gemv_act_frag_nvfp4[_zero] converts the activations, nvfp4_gemv_tiles_n8_u1 (m <= 8 with
// two K splits), nvfp4_gemv_mma_tile_pre_n8_w4c1 (the lm_head) and nvfp4_gemv_mma_tile_pre_n8/_n16 (one split)
// multiply (end of this file, with the analysis of what bounds them).
//
// Variants (issue 4; Rust: Gpu::*_preconverted, nvfp4_gemv_tiles_variant; timed by kernels/bench/h200/bench_gemv.py
// against the kernels Auto picks, which it keeps until then): gemv_act_frag_* + *_mma_pre_* (activations converted
// once per call to f16 B fragments; FP8 in Gpu::fp8_block_gemv_with_scratch), nvfp4_gemv_mma_tile_n* (tile layout,
// activations converted in the GEMV) and nvfp4_gemv_tiles_n16_u1. The persistent stream-K kernels (one wave of
// blocks, a cp.async ring per warp, partial sums by atomics; FP8 and NVFP4) lost to these at every shape
// and were deleted: numbers in the documentation of Gpu::fp8_block_gemv_with and nvfp4_tiles_auto (src/cuda/gemv.rs).
//
// Outputs are fp32 [m][n]. The Rust side checks k % 16 == 0 (FP8) or k % 32 == 0 (NVFP4), m <= 16 (and <= the
// entry's MT), and every buffer's length; its allocations are 256-byte aligned.
#include <cooperative_groups.h>

#include "common.cuh"

namespace cg = cooperative_groups;

using namespace edgefit;

constexpr int GEMV_WARPS = 8;
constexpr int GEMV_THREADS = GEMV_WARPS * 32;
#if EDGEFIT_LAB
// Loads in flight per row of the m-generic CUDA-core builds (the lab's; `Auto` runs the m = 1 builds' own).
constexpr int GEMV_UNROLL = 4;
#endif

// PDL (common.cuh): the first iteration's weight loads are issued before pdl_wait, activations and outputs after
// it, so a dependent launch streams weights while the kernel before it finishes.
//
// KS > 1 (the _k{KS} kernels): KS warps of the block share one group of RW rows, each a contiguous
// 1/KS of K (cut at multiples of 512, so every 16-byte chunk keeps its place in a 128-wide scale block), and
// their sums meet in shared memory; a block serves GEMV_WARPS / KS row groups, grid ceil(n / (GEMV_WARPS / KS *
// RW)). Why: on the 5120-row shapes the KS = 1 kernel has 320 blocks of 8 warps, 19 warps per SM of the 32 its
// registers allow, and Nsight Compute shows it latency-bound (40% of issue slots, 4.8 warps per scheduler,
// `benchmarks/h200.md`). Splitting K gives KS times the warps with the same activation traffic per weight
// byte (each warp still shares its activations across RW rows).
template <int MT, int RW, int U, int KS = 1>
__device__ __forceinline__ void fp8_block_gemv(const uint16_t* __restrict__ x, const uint8_t* __restrict__ w,
                                               const float* __restrict__ scales, float* __restrict__ y, int m,
                                               int n, int k) {
    pdl_launch_dependents();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int row0 = (blockIdx.x * (GEMV_WARPS / KS) + warp / KS) * RW;
    const int kspan = KS == 1 ? k : ((k + KS - 1) / KS + 511) / 512 * 512;
    const int kbeg = KS == 1 ? 0 : min(k, (warp % KS) * kspan);
    const int kend = KS == 1 ? k : (row0 < n ? min(k, kbeg + kspan) : kbeg);
    if (KS == 1 && row0 >= n) {  // whole warps leave together: rows are per warp
        pdl_wait();
        return;
    }
    const int kb = (k + 127) >> 7;
    const uint8_t* wrow[RW];
    const float* srow[RW];
    bool live[RW];
#pragma unroll
    for (int r = 0; r < RW; ++r) {
        live[r] = row0 + r < n;
        const int row = live[r] ? row0 + r : row0;
        wrow[r] = w + static_cast<size_t>(row) * k;
        srow[r] = scales + static_cast<size_t>(row >> 7) * kb;
    }
    float acc[RW][MT];
#pragma unroll
    for (int r = 0; r < RW; ++r)
#pragma unroll
        for (int i = 0; i < MT; ++i) acc[r][i] = 0.f;

    bool waited = false;
    for (int base = kbeg + lane * 16; base < kend; base += 32 * 16 * U) {
        uint4 wv[RW][U];
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int kk = base + u * 512;
#pragma unroll
            for (int r = 0; r < RW; ++r)
                wv[r][u] = kk < kend ? ld_stream(wrow[r] + kk) : make_uint4(0, 0, 0, 0);
        }
        if (!waited) {
            pdl_wait();
            waited = true;
        }
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int kk = base + u * 512;
            if (kk >= kend) break;
            float wf[RW][16];
            float s[RW];
#pragma unroll
            for (int r = 0; r < RW; ++r) {
                const uint32_t ws[4] = {wv[r][u].x, wv[r][u].y, wv[r][u].z, wv[r][u].w};
#pragma unroll
                for (int j = 0; j < 4; ++j) {
                    const float2 a = e4m3x2_to_float2(ws[j]);
                    const float2 b = e4m3x2_to_float2(ws[j] >> 16);
                    wf[r][4 * j] = a.x;
                    wf[r][4 * j + 1] = a.y;
                    wf[r][4 * j + 2] = b.x;
                    wf[r][4 * j + 3] = b.y;
                }
                // A 16-aligned chunk never straddles a 128-wide scale block.
                s[r] = __ldg(srow[r] + (kk >> 7));
            }
#pragma unroll
            for (int mi = 0; mi < MT; ++mi) {
                if (mi < m) {
                    const uint4* xp = reinterpret_cast<const uint4*>(x + static_cast<size_t>(mi) * k + kk);
                    float xf[16];
                    bf16x8_to_float(__ldg(xp), xf);
                    bf16x8_to_float(__ldg(xp + 1), xf + 8);
#pragma unroll
                    for (int r = 0; r < RW; ++r) {
                        float d = 0.f;
#pragma unroll
                        for (int j = 0; j < 16; ++j) d = fmaf(wf[r][j], xf[j], d);
                        acc[r][mi] = fmaf(d, s[r], acc[r][mi]);
                    }
                }
            }
        }
    }
    if (!waited) pdl_wait();  // lanes with no 16-byte chunk (k < 512) still wait before writing
    if (KS == 1) {
#pragma unroll
        for (int r = 0; r < RW; ++r) {
#pragma unroll
            for (int mi = 0; mi < MT; ++mi) {
                if (mi < m) {
                    const float v = warp_sum(acc[r][mi]);
                    if (lane == 0 && live[r]) y[static_cast<size_t>(mi) * n + row0 + r] = v;
                }
            }
        }
    } else {
        // The KS partial sums of each row meet in shared memory; the group's first warp adds them in K order.
        __shared__ float part[GEMV_WARPS][RW][MT];
#pragma unroll
        for (int r = 0; r < RW; ++r)
#pragma unroll
            for (int mi = 0; mi < MT; ++mi) {
                const float v = warp_sum(acc[r][mi]);
                if (lane == 0) part[warp][r][mi] = v;
            }
        __syncthreads();
        if (warp % KS == 0 && lane == 0) {
#pragma unroll
            for (int r = 0; r < RW; ++r)
#pragma unroll
                for (int mi = 0; mi < MT; ++mi) {
                    if (mi < m && live[r] && row0 < n) {
                        float v = 0.f;
#pragma unroll
                        for (int h = 0; h < KS; ++h) v += part[warp + h][r][mi];
                        y[static_cast<size_t>(mi) * n + row0 + r] = v;
                    }
                }
        }
    }
}

template <int MT, int RW, int U>
__device__ __forceinline__ void nvfp4_gemv(const uint16_t* __restrict__ x, const uint8_t* __restrict__ w,
                                           const uint8_t* __restrict__ scales, float global_scale,
                                           float* __restrict__ y, int m, int n, int k) {
    const int lane = threadIdx.x & 31;
    const int row0 = (blockIdx.x * GEMV_WARPS + (threadIdx.x >> 5)) * RW;
    if (row0 >= n) return;  // whole warps leave together: rows are per warp
    const uint8_t* wrow[RW];
    const uint8_t* srow[RW];
    bool live[RW];
#pragma unroll
    for (int r = 0; r < RW; ++r) {
        live[r] = row0 + r < n;
        const int row = live[r] ? row0 + r : row0;
        wrow[r] = w + static_cast<size_t>(row) * (k >> 1);
        srow[r] = scales + static_cast<size_t>(row) * (k >> 4);
    }
    float acc[RW][MT];
#pragma unroll
    for (int r = 0; r < RW; ++r)
#pragma unroll
        for (int i = 0; i < MT; ++i) acc[r][i] = 0.f;

    // A lane's 16-byte chunk of a row holds 32 values: two scale groups of 16.
    for (int base = lane * 32; base < k; base += 32 * 32 * U) {
        uint4 wv[RW][U];
        uint32_t sv[RW][U];
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int kk = base + u * 1024;
#pragma unroll
            for (int r = 0; r < RW; ++r) {
                wv[r][u] = kk < k ? ld_stream(wrow[r] + (kk >> 1)) : make_uint4(0, 0, 0, 0);
                sv[r][u] = kk < k ? __ldg(reinterpret_cast<const unsigned short*>(srow[r] + (kk >> 4))) : 0u;
            }
        }
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int kk = base + u * 1024;
            if (kk >= k) break;
            float d[RW][MT][2];
#pragma unroll
            for (int r = 0; r < RW; ++r)
#pragma unroll
                for (int i = 0; i < MT; ++i) d[r][i][0] = d[r][i][1] = 0.f;
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                // Word j holds values kk+8j .. kk+8j+7; decode it once per row for every activation row.
                float wf[RW][8];
#pragma unroll
                for (int r = 0; r < RW; ++r) {
                    const uint32_t word = j == 0 ? wv[r][u].x : j == 1 ? wv[r][u].y : j == 2 ? wv[r][u].z : wv[r][u].w;
                    float2 f[4];
                    e2m1x8_to_float_scaled(word, f);
#pragma unroll
                    for (int a = 0; a < 4; ++a) {
                        wf[r][a] = f[a].x;
                        wf[r][a + 4] = f[a].y;
                    }
                }
                // The activations are read once per word for all RW rows: with one row per warp they were 4x
                // the weight bytes through L1, and L1 (88% busy in Nsight Compute), not DRAM, bounded the kernel.
#pragma unroll
                for (int mi = 0; mi < MT; ++mi) {
                    if (mi < m) {
                        float xf[8];
                        bf16x8_to_float(__ldg(reinterpret_cast<const uint4*>(x + static_cast<size_t>(mi) * k + kk) + j), xf);
#pragma unroll
                        for (int r = 0; r < RW; ++r)
#pragma unroll
                            for (int e = 0; e < 8; ++e) d[r][mi][j >> 1] = fmaf(wf[r][e], xf[e], d[r][mi][j >> 1]);
                    }
                }
            }
#pragma unroll
            for (int r = 0; r < RW; ++r) {
                // 2^14 undoes the scaling of e2m1x8_to_float_scaled.
                const float2 s = e4m3x2_to_float2(sv[r][u]);
                const float s0 = s.x * 16384.f, s1 = s.y * 16384.f;
#pragma unroll
                for (int mi = 0; mi < MT; ++mi) acc[r][mi] = fmaf(d[r][mi][0], s0, fmaf(d[r][mi][1], s1, acc[r][mi]));
            }
        }
    }
#pragma unroll
    for (int r = 0; r < RW; ++r) {
#pragma unroll
        for (int mi = 0; mi < MT; ++mi) {
            if (mi < m) {
                const float v = warp_sum(acc[r][mi]);
                if (lane == 0 && live[r]) y[static_cast<size_t>(mi) * n + row0 + r] = v * global_scale;
            }
        }
    }
}

#define EDGEFIT_GEMV_ENTRIES(MT)                                                                                  \
    extern "C" __global__ void __launch_bounds__(GEMV_THREADS)                                                    \
        fp8_block_gemv_m##MT(const uint16_t* x, const uint8_t* w, const float* scales, float* y, int m, int n,   \
                             int k) {                                                                             \
        fp8_block_gemv<MT, 1, GEMV_UNROLL>(x, w, scales, y, m, n, k);                                                             \
    }                                                                                                             \
    extern "C" __global__ void __launch_bounds__(GEMV_THREADS, 1)                                                 \
        nvfp4_gemv_m##MT(const uint16_t* x, const uint8_t* w, const uint8_t* scales, float global_scale,        \
                         float* y, int m, int n, int k) {                                                         \
        nvfp4_gemv<MT, 1, GEMV_UNROLL>(x, w, scales, global_scale, y, m, n, k);                                                   \
    }

// KernelPath::CudaCores at every m, which `Auto` never picks (the m = 1 builds below serve it).
#if EDGEFIT_LAB
EDGEFIT_GEMV_ENTRIES(1)
EDGEFIT_GEMV_ENTRIES(2)
EDGEFIT_GEMV_ENTRIES(4)
EDGEFIT_GEMV_ENTRIES(8)
EDGEFIT_GEMV_ENTRIES(16)
#endif

// M = 1 on the CUDA cores: two rows per warp, two 16-byte loads in flight per row, the best 's sweep
// of rows per warp x loads in flight (r1u8, r2u4, r2u2, r4u2: r2u2 best or within noise on all four shapes,
// 25.2 us on 5120x17408; benchmarks/h200.md history). The variants that lost were deleted with the H200 runs'
// sweep's (L2::256B prefetch hints 0.99-1.01x, split-K 1.01x at best, cp.async.bulk rings 0.48-0.80x).
// A tried variant added `prefetch.global.L2` of the lines a warp loads 2, 4 or 8 iterations later (here, and
// 2 or 4 chunks ahead in the tensor-core and NVFP4 tile kernels below): slower at every shape and m, by 5-35%
// (FP8 M=1 5120x17408 32.5 / 33.7 / 37.4 us against 25.4; NVFP4 t1k2 22.6 / 23.6 against 19.2): the extra
// requests cost more than the latency they hide. Deleted.
// Grid ceil(n / (GEMV_WARPS * 2)).
extern "C" __global__ void __launch_bounds__(GEMV_THREADS)
    fp8_block_gemv_m1_r2_u2(const uint16_t* x, const uint8_t* w, const float* scales, float* y, int m, int n,
                            int k) {
    fp8_block_gemv<1, 2, 2>(x, w, scales, y, m, n, k);
}
// The same with K split over KS warps of the block (see fp8_block_gemv). Grid ceil(n / (GEMV_WARPS / KS * 2)).
// At most 51 registers (5 blocks of 256 threads per SM): with the 58 ptxas picks unbounded, 4 blocks per SM would
// leave the 640 blocks of a 5120-row matrix at KS = 2 1.2 waves.
#define EDGEFIT_FP8_M1_KS(KS)                                                                                     \
    extern "C" __global__ void __launch_bounds__(GEMV_THREADS, 5)                                                 \
        fp8_block_gemv_m1_r2_u2_k##KS(const uint16_t* x, const uint8_t* w, const float* scales, float* y, int m,  \
                                      int n, int k) {                                                             \
        fp8_block_gemv<1, 2, 2, KS>(x, w, scales, y, m, n, k);                                                    \
    }
EDGEFIT_FP8_M1_KS(2)
#if EDGEFIT_LAB
EDGEFIT_FP8_M1_KS(4)
#endif
#define EDGEFIT_NVFP4_VARIANT(RW, U)                                                                              \
    extern "C" __global__ void __launch_bounds__(GEMV_THREADS, 1)                                                 \
        nvfp4_gemv_m1_r##RW##_u##U(const uint16_t* x, const uint8_t* w, const uint8_t* scales, float global_scale, \
                                   float* y, int m, int n, int k) {                                               \
        nvfp4_gemv<1, RW, U>(x, w, scales, global_scale, y, m, n, k);                                             \
    }
// Rust: KernelPath::CudaCores' NVFP4 kernel for m = 1 on n >= 16384 (r4u2 and r4u4 lost at every shape and were
// deleted); `Auto` takes the tensor cores.
#if EDGEFIT_LAB
EDGEFIT_NVFP4_VARIANT(2, 4)
#endif

// ---------------------------------------------------------------------------------------------------------------
// Tensor-core GEMV for M = 1..16 (mma.sync m16n8k16, f16 operands, fp32 accumulation). The CUDA-core kernels above
// spend several instructions per weight per activation row, so they fall behind cuBLAS as soon as M > 1 (M=4:
// 0.3x torch._scaled_mm) and, for NVFP4, already at M = 1 (decode + FMA bound at ~1.7 TB/s). Here the weights are
// decoded once into f16 A fragments and the tensor cores do the multiply-adds for up to 16 activation rows at once.
//
// Block: 8 warps on one 16-row tile of W, each warp a strided share of the 128-wide K chunks; the warps' partial
// sums meet in shared memory. In a chunk, lane (g = lane/4, q = lane%4) loads the 32 values k0+32q .. k0+32q+31 of
// rows g and g+8 (16-byte loads) and builds the A fragments from them. The dot product does not care which real k
// sits in which logical k slot of an mma as long as A and B agree, so the lane's 16 half2 of a row go to the 8 mmas
// of the chunk in order (half2 2j in a0/a1, 2j+1 in a2/a3 of mma j), and the B fragments (activations of token
// lane/4, converted from bf16 with saturation to +-65504) are built in the same order. Accumulator c0..c3 of lane
// (g, q) holds rows g, g+8 for tokens 2q, 2q+1 (+8 in the second n-tile).
//
// FP8: e4m3 pairs -> f16x2 (one cvt each, exact); the 128x128 block scale is uniform over a 16-row, 128-k chunk,
// so it is applied to the chunk's fp32 sum. NVFP4: e2m1 -> f16 times 2^-14 (e2m1x8_to_float_scaled's trick, here
// kept in f16), times the e4m3 group scale in f16 (exact products down to 2^-24: a weight smaller than that relative
// to the global scale rounds), 2^14 and the global scale applied in the epilogue.

__device__ __forceinline__ uint32_t hmul2_u32(uint32_t a, uint32_t b) {
    __half2 r = __hmul2(*reinterpret_cast<const __half2*>(&a), *reinterpret_cast<const __half2*>(&b));
    return *reinterpret_cast<uint32_t*>(&r);
}

// The end of a cluster-split tile (CS > 1 in blockq_gemv_mma): red holds W warps' partial sums [W][16][E / 16]
// (row r, token t at r * (E / 16) + t); after a __syncthreads. Each block first adds its warps into its own slot of
// tot, then, after one cluster barrier, block rank R adds entries R, R + CS, ... over the ranks' tot in rank order
// (map_shared_rank: distributed shared memory) and stores them; the second barrier keeps every block's shared memory
// alive until all reads are done. Same additions in the same order on every run.
template <int CS, int E, int W>
__device__ __forceinline__ void cluster_sum_store(const float* red, float* __restrict__ y, int m, int n, int row0,
                                                  float post) {
    __shared__ float tot[E];
    cg::cluster_group cl = cg::this_cluster();
    for (int idx = threadIdx.x; idx < E; idx += W * 32) {
        float v = 0.f;
#pragma unroll
        for (int wi = 0; wi < W; ++wi) v += red[wi * E + idx];
        tot[idx] = v;
    }
    cl.sync();
    const int rank = static_cast<int>(cl.block_rank());
    constexpr int TOKS = E / 16;
    for (int idx = rank + CS * static_cast<int>(threadIdx.x); idx < E; idx += CS * W * 32) {
        const int r = idx / TOKS, tok = idx % TOKS;
        if (tok < m && row0 + r < n) {
            float v = 0.f;
#pragma unroll
            for (int s = 0; s < CS; ++s) v += *cl.map_shared_rank(&tot[idx], s);
            y[static_cast<size_t>(tok) * n + row0 + r] = v * post;
        }
    }
    cl.sync();
}

// e2m1 -> f16 pairs for the tensor-core GEMVs. The f16 bits s << 15 | e << 10 | m << 9 of an e2m1 value (m | e << 1
// | s << 3) are that value times 2^-14 (e2m1x8_to_float_scaled's bit trick, kept in f16; subnormal 0.5 included).
// Both functions turn one 32-bit word of 8 values into four f16 pairs p[i] = (value i, value i + 4), i = 0..3.
//
// Checkpoint order (TILE = false; value t at bits 4t .. 4t + 3): each pair's magnitude and sign need different
// shifts, two shifts and two LOP3 per pair, ~16.5 instructions per word in the SASS.
//
// Tile order (TILE = true; nvfp4_tile_word below writes it at load time): the same 32 bits placed so that pair 0
// already sits at the f16 positions (one AND), pair 1 three bits lower (shift, AND), and pairs 2 and 3 with their
// magnitude and sign bits m and s such that one multiply by 2^a + 2^b moves both (m by a, s by b) and the two
// copies never carry into a kept bit (checked over all 256 patterns of each pair's 8 bits, and the whole decode
// against the checkpoint order on random words, when the layout was chosen): mask, IMAD, mask. 9 instructions
// per word. Destination bits, value t = 0..7: magnitude (m, e0, e1) at MAG[t] .. MAG[t] + 2, sign at SGN[t]:
//   t     0   1   2   3   4   5   6   7
//   MAG   9   6   0   3  25  22  16  19
//   SGN  15  12  13  14  31  28  29  30
constexpr uint32_t E2M1_F16_PAIR_BITS = 0x8E008E00u;  // bits 9-11, 15 of each half
template <bool TILE>
__device__ __forceinline__ void e2m1x8_to_f16_pairs(const uint32_t w, uint32_t (&p)[4]) {
    if (TILE) {
        p[0] = w & E2M1_F16_PAIR_BITS;
        p[1] = (w << 3) & E2M1_F16_PAIR_BITS;
        p[2] = ((w & 0x20072007u) * ((1u << 9) + (1u << 2))) & E2M1_F16_PAIR_BITS;
        p[3] = ((w & 0x40384038u) * ((1u << 6) + (1u << 1))) & E2M1_F16_PAIR_BITS;
    } else {
        p[0] = ((w << 9) & 0x0E000E00u) | ((w << 12) & 0x80008000u);
        p[1] = ((w << 5) & 0x0E000E00u) | ((w << 8) & 0x80008000u);
        p[2] = ((w << 1) & 0x0E000E00u) | ((w << 4) & 0x80008000u);
        p[3] = ((w >> 3) & 0x0E000E00u) | (w & 0x80008000u);
    }
}

// Checkpoint order -> tile order of one word (the table above).
__device__ __forceinline__ uint32_t nvfp4_tile_word(const uint32_t w) {
    constexpr int MAG[8] = {9, 6, 0, 3, 25, 22, 16, 19};
    constexpr int SGN[8] = {15, 12, 13, 14, 31, 28, 29, 30};
    uint32_t r = 0;
#pragma unroll
    for (int t = 0; t < 8; ++t) {
        const uint32_t nib = (w >> (4 * t)) & 15u;
        r |= (nib & 7u) << MAG[t];
        r |= (nib >> 3) << SGN[t];
    }
    return r;
}

// NVFP4 A fragments of one 16-row, 128-value chunk: the lane's 16-byte words of rows g (wa) and g+8 (wb), 32 values
// each (checkpoint or tile order, TILE), to f16 pairs times 2^-14 times the e4m3 group scale in f16 (s4: row g's
// two group scales in bits 0..15, row g+8's in 16..31; both products exact down to 2^-24). ax[4j + i] holds values
// 8j + i and 8j + i + 4 of row g (bxw: row g+8), the order gemv_act_frag_nvfp4 writes the activations in. Per chunk
// and lane: 8 words decoded (~132 instructions in the checkpoint order, 72 in the tile order) and 32 HMUL2.
// The unscaled half of it: the 16 f16 pairs of rows g (ax) and g+8 (bxw), ax[4j + i] = pair i of word j.
template <bool TILE>
__device__ __forceinline__ void nvfp4_a_pairs(const uint4 wa, const uint4 wb, uint32_t (&ax)[16],
                                              uint32_t (&bxw)[16]) {
    const uint32_t wa4[4] = {wa.x, wa.y, wa.z, wa.w};
    const uint32_t wb4[4] = {wb.x, wb.y, wb.z, wb.w};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        uint32_t pa[4], pb[4];
        e2m1x8_to_f16_pairs<TILE>(wa4[j], pa);
        e2m1x8_to_f16_pairs<TILE>(wb4[j], pb);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            ax[4 * j + i] = pa[i];
            bxw[4 * j + i] = pb[i];
        }
    }
}
template <bool TILE>
__device__ __forceinline__ void nvfp4_a_fragments(const uint4 wa, const uint4 wb, uint32_t s4, uint32_t (&ax)[16],
                                                  uint32_t (&bxw)[16]) {
    // e4m3 scale pairs -> f16 (exact), broadcast to both halves.
    __half2_raw s2a = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(s4 & 0xffffu), __NV_E4M3);
    __half2_raw s2b = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(s4 >> 16), __NV_E4M3);
    const uint32_t sav = *reinterpret_cast<uint32_t*>(&s2a), sbv = *reinterpret_cast<uint32_t*>(&s2b);
    const uint32_t sa_lo = (sav & 0xffffu) * 0x10001u, sa_hi = (sav >> 16) * 0x10001u;
    const uint32_t sb_lo = (sbv & 0xffffu) * 0x10001u, sb_hi = (sbv >> 16) * 0x10001u;
    nvfp4_a_pairs<TILE>(wa, wb, ax, bxw);
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            ax[4 * j + i] = hmul2_u32(ax[4 * j + i], j < 2 ? sa_lo : sa_hi);
            bxw[4 * j + i] = hmul2_u32(bxw[4 * j + i], j < 2 ? sb_lo : sb_hi);
        }
}

// FMT 0: FP8 e4m3 with 128x128 fp32 block scales; FMT 1: NVFP4 in the checkpoint layout; FMT 2: NVFP4 in the
// tile layout of nvfp4_repack_mma (below); FMT 3: FP8 in the tile layout of fp8_repack_mma (the same values and
// sums as FMT 0, bit for bit). NT: n-tiles of 8 activation rows (1 or 2). MMA_WARPS: warps sharing
// one 16-row tile's K chunks. PRE: the B fragments come ready-made (f16, fragment order) from xf, written once per
// call by gemv_act_frag_* (below); otherwise every lane converts its 32 activations per token tile per chunk here
// (48 instructions per n-tile per chunk, most of the issue budget at NT = 2: benchmarks/h200.md).
//
// Issue budget at 85% of the copy bandwidth (3.6 TB/s over 132 SMs at 1.98 GHz: 13.7 B per SM-cycle, 4 schedulers):
// ~300 warp instructions per KiB of weights. One NVFP4 chunk (16 rows x 128 values) is exactly 1 KiB and one
// warp's work: e2m1 decode 11 per 8 values x 8 words = 88, group-scale hmul2 32, 8 x NT mma, B fragments 4 x NT
// loads with PRE (~50 x NT without), weight loads 2, scale loads 1-2, address and loop ~15: ~150 (NT = 1) with
// PRE and the tile layout, ~210 before. FP8 moves 2 KiB per chunk with 32 cvt + 8 x NT mma, so it has room.
// SASS of this build (cuobjdump 13.2, instructions in the chunk loop, i.e. per chunk per warp): NVFP4 n8 306
// (checkpoint layout) / 221 (_pre) / 259 (_tile) / 193 (_tile_pre: 66 LOP3, 49 IMAD, 32 HMUL2, 16 SHF, 8 HMMA,
// 7 LDG); n16 413 / 268 / 359 / 209. FP8 (2 KiB per chunk) n8 203 / 114 (_pre), n16 282 / 141.
// Measured earlier (cuobjdump 13.2 on this build): the tile order's decode (e2m1x8_to_f16_pairs<true>) took
// nvfp4_gemv_tiles_n8_u1's chunk loop from 203 to 165 instructions (LOP3 66 -> 51, IMAD 46 -> 32, SHF 20 -> 5;
// 32 HMUL2, 8 HMMA, 7 LDG as before) and made every m <= 8 cut 5-20% faster on the H200 (against the
// previous build in the same rounds: t1k2_pdl 18.60 -> 15.69 us on 5120x17408 at m = 1, 12.51 -> 10.82 on
// 5120x10240; w4c1 192.7 -> 174.6 on the lm_head). At m = 16 the one-split n16 kernel got 5-9% slower (24.57 ->
// 25.93 us on 5120x17408, tilepre_pdl): its B fragments (4 KiB per chunk from L2 at NT = 2, four times the
// weights) are loaded just in time by ptxas, 2 of 8 ahead of the first mma instead of 4 before, with fewer
// instructions to hide them; moving the loads in the source, or making them asm volatile, did not change the
// SASS order. Fewer fragment bytes per weight byte did not pay either (patch in
// `benchmarks/h200.md`, not applied): a kernel with two 16-row tiles per warp and
// chunk sharing the fragments (116 registers, 2 blocks per SM, all fragment loads issued ahead, bit for bit with
// the split kernel) was slower than this one at m = 12 and 16 on every shape but 5120x17408 with three K splits
// (23.3 against 24.8 us at m = 12, 24.5 against 25.9 at m = 16; three splits are not deterministic), e.g. 27.6
// against 24.9 on 17408x5120 and 301 against 267 on the lm_head at m = 16.
//
// PDL (common.cuh): pdl_wait before the chunk loop (loading the first chunk's weights before it, behind a flag in
// the loop, took the registers from 42 to 61 here and made nvfp4_gemv_tiles_* spill).
//
// CS > 1 (the _w{W}c{CS} builds): a thread-block cluster of CS blocks along y shares one 16-row tile, each
// block a contiguous 1/CS of the K chunks; their sums meet in distributed shared memory (each block's sum in its own
// shared memory, one cluster barrier, each block adds an interleaved 1/CS of the outputs over ranks 0..CS-1 in
// order, a second barrier so no block leaves while another still reads it). Deterministic for every CS, no atomics,
// nothing to zero before. Why: on the 5120-row shapes one block of 8 warps per tile gives 320 blocks, 2.4 per SM:
// ~19 warps per SM with one chunk each in flight, half of what the FP8 m = 1 kernel keeps in flight at 90% of copy
// (benchmarks/h200.md). Needs gridDim.y == CS (the kernel is compiled with __cluster_dims__(1, CS, 1)).
//
// CS == 0 (nvfp4_gemv_tiles_n*_u1): gridDim.y blocks per tile, each a contiguous share of the chunks,
// their sums added into y with atomicAdd (y zeroed before, by gemv_act_frag_*_zero): with 2 splits 0 + a + b is the
// same in either order, with more the last bits may differ from run to run (nvfp4_gemv_tiles_n*_u1, below).
//
// Register prefetch again (with the cheap tile-order decode, fitting 48 registers in the
// one-split cuts): 4-17% slower everywhere; its SASS has ptxas issuing the next chunk's loads after the fifth of
// the current chunk's eight mma, not at the top, while Nsight Compute has these kernels stalled on long
// scoreboard 57-67% of the time. Loads ptxas cannot sink did not help either: the m = 1 kernel with
// the next chunk's weights, scale word and activation lanes copied by cp.async into a per-warp two-stage
// shared-memory slot at the top of each iteration (SASS checked; 48 registers, 35 KB shared per block,
// `benchmarks/h200.md`, not applied; tests and sanitizers clean) was 1.3-1.4x
// slower at every cut: 19.75 against 15.27 us on 5120x17408, 14.06 against 10.04 on 5120x10240, 199.4 against
// 179.2 on the lm_head (4 warps). The fifth pipeline to lose on these GEMVs. The sixth (
// `benchmarks/h200.md`, not applied): the copy engine prefetching the tile's weights
// and scale words into L2 (cp.async.bulk.prefetch.L2.global before pdl_wait; the block's whole share at once, or
// each warp 2 or 4 chunks ahead of itself), in this kernel and the nvfp4 m = 1 one: 1.07-1.30x slower at m <= 4 on
// every shape (m1w8k2 15.42 -> 18.4-20.0 us on 5120x17408, w4c1 176.3 -> 188.6-190.6 on the lm_head).
// Register double buffering (the next chunk's weights and scale word loaded before the current chunk is decoded,
// 2 KiB in flight per warp; NVFP4 tile layout, 4 warps per block under 64 registers, built,
// measured, deleted): slower at every cut, m = 4 on 5120x17408 21.7 -> 24.6 us (c3), 22.3 -> 26.9 (c4), lm_head
// 188.4 -> 202.2 (c1): the 64 registers cost more resident warps than the second chunk bought.
//
// An L2 prefetch of each warp's first two chunks before pdl_wait (FP8 tile layout, 8 prefetch.global.L2 per warp,
// so that a dependent launch finds them on chip when the fragment kernel ends, built, measured,
// deleted): 1.0-1.5% faster on 5120x17408 (24.54 vs 24.81 us at m = 4), 3-12% slower on 17408x5120, 5120x10240
// and the lm_head (28.65 vs 25.89 us, w8c1 m = 4 on 17408x5120). Issuing the first chunk's weight loads themselves
// before pdl_wait, into the registers its iteration uses (48 registers under a cap of 5 blocks): no gain
// on the cuts Auto uses (w8c2 25.36 vs 25.06 us at m = 4 on 5120x17408, w8c1 26.59 vs 25.65 on 17408x5120), much
// worse at m = 16 (36.2 vs 25.6). Deleted: the ~2 us between this path and the m = 1 CUDA-core kernel is not the
// fragment kernel's serialisation.
template <int FMT, int NT, int MMA_WARPS, bool PRE = false, int CS = 1>
__device__ __forceinline__ void blockq_gemv_mma(const uint16_t* __restrict__ x, const uint4* __restrict__ xf,
                                                const uint8_t* __restrict__ w, const void* __restrict__ scales,
                                                float global_scale, float* __restrict__ y, int m, int n, int k) {
    pdl_launch_dependents();
    __shared__ float red[MMA_WARPS][16][16];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, q = lane & 3;
    const int row0 = blockIdx.x * 16;
    const int ra = row0 + g, rb = row0 + g + 8;
    const bool va = ra < n, vb = rb < n;
    const int nchunks = (k + 127) >> 7;
    // This block's chunks: all of them, or (CS > 1, or CS == 0 with gridDim.y splits) its contiguous share.
    const int nsplit = CS == 0 ? static_cast<int>(gridDim.y) : CS;
    const int per = nsplit > 1 ? (nchunks + nsplit - 1) / nsplit : nchunks;
    const int cbeg = nsplit > 1 ? min(nchunks, static_cast<int>(blockIdx.y) * per) : 0;
    const int cend = nsplit > 1 ? min(nchunks, cbeg + per) : nchunks;
    constexpr int BYTES_PER_VALUE_X2 = FMT == 0 ? 2 : 1;  // bytes for two values
    const size_t row_bytes = FMT == 0 ? static_cast<size_t>(k) : static_cast<size_t>(k) >> 1;
    const uint8_t* wa = w + static_cast<size_t>(va ? ra : row0) * row_bytes;
    const uint8_t* wb = w + static_cast<size_t>(vb ? rb : row0) * row_bytes;

    float acc[NT][4];
#pragma unroll
    for (int t = 0; t < NT; ++t)
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[t][i] = 0.f;

    // Each warp takes every MMA_WARPS-th chunk. One chunk in flight per warp: issuing two (FP8) or four (NVFP4)
    // ahead raised the registers to 90-104, halved the resident warps and made every case slower on the H200
    // (NVFP4 M=1 lm_head 281 -> 378 us, FP8 M=16 5120x17408 43 -> 66 us; bench run 7 against run 6, 2026-11-30).
    constexpr bool FP8 = FMT == 0 || FMT == 3;
    constexpr int LOADS = FP8 ? 2 : 1;  // 16-byte loads per row per chunk
    // Tile layout: the chunk's 1 KiB, row g's 16 bytes of every lane then row g+8's, and one 32-bit scale word
    // per lane; rows past n and values past k are zeros there, so nothing is guarded.
    const uint8_t* wt = w + static_cast<size_t>(blockIdx.x) * nchunks * 1024 + lane * 16;
    const uint32_t* st = reinterpret_cast<const uint32_t*>(scales) + static_cast<size_t>(blockIdx.x) * nchunks * 32 + lane;
    const uint8_t* wt3 = w + static_cast<size_t>(blockIdx.x) * nchunks * 2048 + lane * 16;  // FMT 3
    pdl_wait();
    for (int c = cbeg + warp; c < cend; c += MMA_WARPS) {
        const int k0 = c * 128 + q * 32;  // this lane's 32 values (FMT 0, 1)
        uint4 la[LOADS], lb[LOADS];
        uint32_t s4 = 0;  // NVFP4: the e4m3 scales of (row g: groups 2 and 2+1 of the lane) | (row g+8) << 16
        if (FMT == 2) {
            la[0] = ld_stream(wt + static_cast<size_t>(c) * 1024);
            lb[0] = ld_stream(wt + static_cast<size_t>(c) * 1024 + 512);
            s4 = __ldg(st + static_cast<size_t>(c) * 32);
        } else if (FMT == 3) {
            // FP8 tile layout (fp8_repack_mma): the chunk's 2 KiB as four 512-byte runs, one per load.
            const uint8_t* p = wt3 + static_cast<size_t>(c) * 2048;
            la[0] = ld_stream(p);
            la[1] = ld_stream(p + 512);
            lb[0] = ld_stream(p + 1024);
            lb[1] = ld_stream(p + 1536);
        } else {
#pragma unroll
            for (int i = 0; i < LOADS; ++i) {
                // FP8 is checked per 16 values, NVFP4 needs k % 32 == 0; chunks past the end load nothing.
                // FP8: the lane's two loads per row are bytes 32q .. 32q + 15 and 32q + 16 .. 32q + 31 of the chunk,
                // so each of the warp's loads touches all four 32-byte sectors of the 8 rows' 128-byte lines and uses
                // half of each. Mapping the quad onto contiguous 64-byte halves instead (lane q: 16q and 64 + 16q,
                // activations in the same order; every load full sectors) was 1.1-1.17x slower at m = 4 and 16 on
                // every shape (against an earlier build: auto m = 4 5120x17408 35.3 vs 31.9 us, preconverted m = 16
                // 41.6 vs 35.6, lm_head m = 4 373.8 vs 327.6): full-line requests beat full-sector ones here.
                const bool kin = k0 + 16 * i < k;
                const size_t off = static_cast<size_t>(k0 + 16 * i) * BYTES_PER_VALUE_X2 / 2;
                la[i] = va && kin ? ld_stream(wa + off) : make_uint4(0, 0, 0, 0);
                lb[i] = vb && kin ? ld_stream(wb + off) : make_uint4(0, 0, 0, 0);
            }
            if (FMT == 1) {
                const uint8_t* sc = reinterpret_cast<const uint8_t*>(scales);
                const size_t srow = static_cast<size_t>(k) >> 4;
                const bool kin = k0 < k;
                const uint32_t sa = va && kin ? __ldg(reinterpret_cast<const unsigned short*>(sc + static_cast<size_t>(ra) * srow + (k0 >> 4))) : 0u;
                const uint32_t sb = vb && kin ? __ldg(reinterpret_cast<const unsigned short*>(sc + static_cast<size_t>(rb) * srow + (k0 >> 4))) : 0u;
                s4 = sa | (sb << 16);
            }
        }
        // Activations of token tile t, row g (token index), as f16 pairs in the A fragments' order.
        uint32_t bx[NT][16];
#pragma unroll
        for (int t = 0; t < NT; ++t) {
            if (PRE) {
#pragma unroll
                for (int v = 0; v < 4; ++v) {
                    // Lanes of tokens past m hold zero fragments: they load nothing (at m = 1 that is 7/8 of
                    // the fragment bytes, which came from L2 at twice the weight bytes per chunk).
                    const uint4 u = t * 8 + g < m ? __ldg(xf + ((static_cast<size_t>(c) * NT + t) * 4 + v) * 32 + lane)
                                                  : make_uint4(0, 0, 0, 0);
                    bx[t][4 * v] = u.x;
                    bx[t][4 * v + 1] = u.y;
                    bx[t][4 * v + 2] = u.z;
                    bx[t][4 * v + 3] = u.w;
                }
            } else {
                const int tok = t * 8 + g;
#pragma unroll
                for (int v = 0; v < 4; ++v) {
                    const bool ok = tok < m && k0 + 8 * v < k;
                    const uint4 u = ok ? __ldg(reinterpret_cast<const uint4*>(x + static_cast<size_t>(tok) * k + k0) + v)
                                       : make_uint4(0, 0, 0, 0);
                    float f[8];
                    bf16x8_to_float(u, f);
                    if (FP8) {  // consecutive pairs
#pragma unroll
                        for (int i = 0; i < 4; ++i) bx[t][4 * v + i] = pack_f16x2_sat(f[2 * i], f[2 * i + 1]);
                    } else {  // pairs (a, a + 4) of each 8, as e2m1x8 decodes them
#pragma unroll
                        for (int i = 0; i < 4; ++i) bx[t][4 * v + i] = pack_f16x2_sat(f[i], f[i + 4]);
                    }
                }
            }
        }
        // Weights as f16 pairs in the same order.
        uint32_t ax[16], bxw[16];  // rows g and g+8
        if (FP8) {
#pragma unroll
            for (int i = 0; i < LOADS; ++i) {
                const uint32_t wa4[4] = {la[i].x, la[i].y, la[i].z, la[i].w};
                const uint32_t wb4[4] = {lb[i].x, lb[i].y, lb[i].z, lb[i].w};
#pragma unroll
                for (int j = 0; j < 4; ++j) {
#pragma unroll
                    for (int hh = 0; hh < 2; ++hh) {
                        __half2_raw ha = __nv_cvt_fp8x2_to_halfraw2(
                            static_cast<__nv_fp8x2_storage_t>((wa4[j] >> (16 * hh)) & 0xffffu), __NV_E4M3);
                        __half2_raw hb = __nv_cvt_fp8x2_to_halfraw2(
                            static_cast<__nv_fp8x2_storage_t>((wb4[j] >> (16 * hh)) & 0xffffu), __NV_E4M3);
                        ax[8 * i + 2 * j + hh] = *reinterpret_cast<uint32_t*>(&ha);
                        bxw[8 * i + 2 * j + hh] = *reinterpret_cast<uint32_t*>(&hb);
                    }
                }
            }
        } else {
            nvfp4_a_fragments<FMT == 2>(la[0], lb[0], s4, ax, bxw);
        }
        float part[NT][4];
#pragma unroll
        for (int t = 0; t < NT; ++t)
#pragma unroll
            for (int i = 0; i < 4; ++i) part[t][i] = 0.f;
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            const uint32_t a[4] = {ax[2 * j], bxw[2 * j], ax[2 * j + 1], bxw[2 * j + 1]};
#pragma unroll
            for (int t = 0; t < NT; ++t) mma_f16_16816(part[t], a, bx[t][2 * j], bx[t][2 * j + 1]);
        }
        float s = 1.f;
        if (FP8) {
            const int kb = (k + 127) >> 7;
            s = __ldg(reinterpret_cast<const float*>(scales) + static_cast<size_t>(row0 >> 7) * kb + c);
        }
#pragma unroll
        for (int t = 0; t < NT; ++t)
#pragma unroll
            for (int i = 0; i < 4; ++i) acc[t][i] = fmaf(part[t][i], s, acc[t][i]);
    }

    // Sum the warps' K shares: red[warp][row][token].
    const float post = FP8 ? 1.f : 16384.f * global_scale;
#pragma unroll
    for (int t = 0; t < NT; ++t) {
        red[warp][g][t * 8 + 2 * q] = acc[t][0];
        red[warp][g][t * 8 + 2 * q + 1] = acc[t][1];
        red[warp][g + 8][t * 8 + 2 * q] = acc[t][2];
        red[warp][g + 8][t * 8 + 2 * q + 1] = acc[t][3];
    }
    __syncthreads();
    if (CS <= 1) {
        for (int idx = threadIdx.x; idx < 16 * 8 * NT; idx += MMA_WARPS * 32) {
            const int r = idx % 16, tok = idx / 16;
            if (tok < m && row0 + r < n) {
                float v = 0.f;
#pragma unroll
                for (int wi = 0; wi < MMA_WARPS; ++wi) v += red[wi][r][tok];
                float* dst = y + static_cast<size_t>(tok) * n + row0 + r;
                if (CS == 0 && nsplit > 1)
                    atomicAdd(dst, v * post);
                else
                    *dst = v * post;
            }
        }
    } else {
        cluster_sum_store<CS, 16 * 16, MMA_WARPS>(&red[0][0][0], y, m, n, row0, post);
    }
}

#define EDGEFIT_MMA_ENTRIES(W, SUFFIX)                                                                            \
    extern "C" __global__ void __launch_bounds__(W * 32) fp8_block_gemv_mma_n8##SUFFIX(                           \
        const uint16_t* x, const uint8_t* w, const float* scales, float* y, int m, int n, int k) {               \
        blockq_gemv_mma<0, 1, W>(x, nullptr, w, scales, 1.f, y, m, n, k);                                                  \
    }                                                                                                             \
    extern "C" __global__ void __launch_bounds__(W * 32) fp8_block_gemv_mma_n16##SUFFIX(                          \
        const uint16_t* x, const uint8_t* w, const float* scales, float* y, int m, int n, int k) {               \
        blockq_gemv_mma<0, 2, W>(x, nullptr, w, scales, 1.f, y, m, n, k);                                                  \
    }                                                                                                             \
    extern "C" __global__ void __launch_bounds__(W * 32) nvfp4_gemv_mma_n8##SUFFIX(                               \
        const uint16_t* x, const uint8_t* w, const uint8_t* scales, float global_scale, float* y, int m, int n,   \
        int k) {                                                                                                  \
        blockq_gemv_mma<1, 1, W>(x, nullptr, w, scales, global_scale, y, m, n, k);                                         \
    }                                                                                                             \
    extern "C" __global__ void __launch_bounds__(W * 32) nvfp4_gemv_mma_n16##SUFFIX(                              \
        const uint16_t* x, const uint8_t* w, const uint8_t* scales, float global_scale, float* y, int m, int n,   \
        int k) {                                                                                                  \
        blockq_gemv_mma<1, 2, W>(x, nullptr, w, scales, global_scale, y, m, n, k);                                         \
    }

// 8 warps per 16-row tile. (16, the `_w16` sweep builds, ran 1.03-1.06x at best and had no caller; removed.)
EDGEFIT_MMA_ENTRIES(8, )

// ---------------------------------------------------------------------------------------------------------------
// Activations converted once per call (the PRE kernels' B fragments). xf is uint4 [ceil(k/128)][nt][4][32]: for
// chunk c, token tile t, v and lane (g = lane/4, q = lane%4), the 8 activations k = 128c + 32q + 8v .. +7 of token
// 8t + g as four f16x2, in the pair order of the format (FP8: consecutive pairs; NVFP4: (a, a+4) of each 8, as
// e2m1x8 decodes them), rounded with saturation at +-65504; tokens >= m and k past the end are zeros. nt is 1 for
// the _n8 kernels (m <= 8) and 2 for the _n16 ones. A warp's four loads per token tile are then 512 contiguous
// bytes each. One thread per uint4; grid ceil(ceil(k/128) * nt * 128 / 256), 256 threads. Needs k % 16 == 0.
// PDL (common.cuh): gemv_act_frag and gemv_act_frag_zero trigger their dependents at once and wait before anything
// else; gemv_act_frag_body does the conversion.
template <int FMT>
__device__ __forceinline__ void gemv_act_frag_body(const uint16_t* __restrict__ x, uint4* __restrict__ xf, int m,
                                                   int k, int nt) {
    const size_t nchunks = static_cast<size_t>((k + 127) >> 7);
    const size_t idx = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (idx >= nchunks * nt * 128) return;
    const int lane = static_cast<int>(idx & 31), v = static_cast<int>((idx >> 5) & 3);
    const size_t ct = idx >> 7;
    const int t = static_cast<int>(ct % nt), c = static_cast<int>(ct / nt);
    const int tok = t * 8 + (lane >> 2);
    const int kk = c * 128 + (lane & 3) * 32 + 8 * v;
    uint4 out = make_uint4(0, 0, 0, 0);
    if (tok < m && kk < k) {  // k % 16 == 0: a group of 8 that starts inside the row ends inside it
        float f[8];
        bf16x8_to_float(__ldg(reinterpret_cast<const uint4*>(x + static_cast<size_t>(tok) * k + kk)), f);
        if (FMT == 0) {
            out = make_uint4(pack_f16x2_sat(f[0], f[1]), pack_f16x2_sat(f[2], f[3]), pack_f16x2_sat(f[4], f[5]),
                             pack_f16x2_sat(f[6], f[7]));
        } else {
            out = make_uint4(pack_f16x2_sat(f[0], f[4]), pack_f16x2_sat(f[1], f[5]), pack_f16x2_sat(f[2], f[6]),
                             pack_f16x2_sat(f[3], f[7]));
        }
    }
    xf[idx] = out;
}

template <int FMT>
__device__ __forceinline__ void gemv_act_frag(const uint16_t* __restrict__ x, uint4* __restrict__ xf, int m, int k,
                                              int nt) {
    pdl_launch_dependents();
    pdl_wait();
    gemv_act_frag_body<FMT>(x, xf, m, k, nt);
}

extern "C" __global__ void __launch_bounds__(256) gemv_act_frag_fp8(const uint16_t* x, uint4* xf, int m, int k,
                                                                     int nt) {
    gemv_act_frag<0>(x, xf, m, k, nt);
}
extern "C" __global__ void __launch_bounds__(256) gemv_act_frag_nvfp4(const uint16_t* x, uint4* xf, int m, int k,
                                                                       int nt) {
    gemv_act_frag<1>(x, xf, m, k, nt);
}

// ---------------------------------------------------------------------------------------------------------------
// NVFP4 tile layout for the tensor-core GEMV, made once at load time. For 16-row tile T and 128-value chunk c
// (tc = T * ceil(k/128) + c): bytes wr[tc * 1024 ..] hold, for lane = 0..31 (g = lane/4, q = lane%4), the 16
// bytes of row 16T + g, values 128c + 32q .. +31 (each 32-bit word's 8 values in the tile order of
// e2m1x8_to_f16_pairs, nvfp4_tile_word), then at +512 the same for row 16T + g + 8; sr[tc * 32
// + lane] holds the row's two e4m3 group scales of those values (row g in bits 0..15, row g + 8 in 16..31). Rows
// past n and values past k are zeros. So a warp's chunk is two fully coalesced 512-byte loads and one 128-byte
// scale load, with no bounds checks and one address per chunk. Sizes: wr ceil(n/16) * ceil(k/128) * 1024 bytes,
// sr ceil(n/16) * ceil(k/128) * 32 words. One thread per 16 output bytes, 256 threads. Needs k % 32 == 0.
extern "C" __global__ void __launch_bounds__(256) nvfp4_repack_mma(const uint8_t* __restrict__ w,
                                                                    const uint8_t* __restrict__ scales,
                                                                    uint8_t* __restrict__ wr,
                                                                    uint32_t* __restrict__ sr, int n, int k) {
    const size_t nchunks = static_cast<size_t>((k + 127) >> 7);
    const size_t total = static_cast<size_t>((n + 15) >> 4) * nchunks * 64;
    const size_t p = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (p >= total) return;
    const int lane = static_cast<int>(p & 31), half = static_cast<int>((p >> 5) & 1);
    const size_t tc = p >> 6;
    const int tile = static_cast<int>(tc / nchunks), c = static_cast<int>(tc % nchunks);
    const int g = lane >> 2, q = lane & 3;
    const int row = tile * 16 + g + 8 * half;
    const int k0 = c * 128 + 32 * q;
    uint4 v = make_uint4(0, 0, 0, 0);
    if (row < n && k0 < k) {
        v = __ldg(reinterpret_cast<const uint4*>(w + static_cast<size_t>(row) * (k >> 1) + (k0 >> 1)));
        v = make_uint4(nvfp4_tile_word(v.x), nvfp4_tile_word(v.y), nvfp4_tile_word(v.z), nvfp4_tile_word(v.w));
    }
    *reinterpret_cast<uint4*>(wr + tc * 1024 + half * 512 + lane * 16) = v;
    if (half == 0) {
        uint32_t s = 0;
        const int rb = row + 8;
        if (k0 < k) {
            const size_t srow = static_cast<size_t>(k) >> 4;
            if (row < n) s = __ldg(reinterpret_cast<const unsigned short*>(scales + row * srow + (k0 >> 4)));
            if (rb < n)
                s |= static_cast<uint32_t>(__ldg(reinterpret_cast<const unsigned short*>(scales + rb * srow + (k0 >> 4))))
                     << 16;
        }
        sr[tc * 32 + lane] = s;
    }
}

// FP8 tile layout for the tensor-core GEMV (FMT 3 of blockq_gemv_mma), made once at load time. For 16-row tile T and
// 128-value chunk c (tc = T * ceil(k/128) + c): bytes wr[tc * 2048 ..] hold four 512-byte runs, run i (0..3) for
// lane = 0..31 (g = lane/4, q = lane%4) the 16 bytes of row 16T + g + 8 * (i >> 1), values 128c + 32q + 16 * (i & 1)
// .. +15: the four 16-byte loads a lane of the checkpoint-layout kernel makes (la[0], la[1], lb[0], lb[1]), each
// now one contiguous 512-byte run for the warp. Rows past n and values past k are zeros. The block scales stay as
// they are. Size ceil(n/16) * ceil(k/128) * 2048 bytes. One thread per 16 output bytes, 256 threads; k % 16 == 0.
extern "C" __global__ void __launch_bounds__(256) fp8_repack_mma(const uint8_t* __restrict__ w,
                                                                  uint8_t* __restrict__ wr, int n, int k) {
    const size_t nchunks = static_cast<size_t>((k + 127) >> 7);
    const size_t total = static_cast<size_t>((n + 15) >> 4) * nchunks * 128;
    const size_t p = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (p >= total) return;
    const int lane = static_cast<int>(p & 31), i = static_cast<int>((p >> 5) & 3);
    const size_t tc = p >> 7;
    const int tile = static_cast<int>(tc / nchunks), c = static_cast<int>(tc % nchunks);
    const int row = tile * 16 + (lane >> 2) + 8 * (i >> 1);
    const int kk = c * 128 + (lane & 3) * 32 + 16 * (i & 1);
    uint4 v = make_uint4(0, 0, 0, 0);
    if (row < n && kk < k) v = __ldg(reinterpret_cast<const uint4*>(w + static_cast<size_t>(row) * k + kk));
    *reinterpret_cast<uint4*>(wr + tc * 2048 + i * 512 + lane * 16) = v;
}

// FP8 m = 1 over the tile layout on the CUDA cores (fp8_gemv_tile_m1_w{W}c{CS}; Rust: Gpu::fp8_gemv_tiles at m = 1,
// w8c2 up to 8192 rows and w8c1 above: 21.45 / 23.13 / 13.31 / 277.7 us, 91.7-98.9% of copy): the cuts of
// blockq_gemv_mma (W warps per 16-row tile, CS blocks of a cluster), but each lane multiplies its 64 weights (rows
// g and g+8, values 128c + 32q .. +31) with the bf16 activations itself (from L1, shared by the two rows): no
// fragment kernel, no tensor cores. The 4 lanes of a row add their sums by shuffles, the warps in shared memory,
// the blocks of a cluster as in cluster_sum_store. PDL: the first chunk's weights are loaded before pdl_wait.
// The m = 1 kernels' warp reduction: the 4 lanes (q) of rows g and g + 8 add their partial sums a and b, and lane
// q == 0 writes them to red_warp[g] and red_warp[g + 8] (this warp's row of the block's shared sums).
__device__ __forceinline__ void quad_rows_to_shared(float a, float b, float* red_warp, int g, int q) {
    a += __shfl_xor_sync(0xffffffffu, a, 1);
    a += __shfl_xor_sync(0xffffffffu, a, 2);
    b += __shfl_xor_sync(0xffffffffu, b, 1);
    b += __shfl_xor_sync(0xffffffffu, b, 2);
    if (q == 0) {
        red_warp[g] = a;
        red_warp[g + 8] = b;
    }
}

template <int W, int CS>
__device__ __forceinline__ void fp8_gemv_tile_m1(const uint16_t* __restrict__ x, const uint8_t* __restrict__ wr,
                                                 const float* __restrict__ scales, float* __restrict__ y, int n,
                                                 int k) {
    pdl_launch_dependents();
    __shared__ float red[W][16];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, q = lane & 3;
    const int row0 = blockIdx.x * 16;
    const int nchunks = (k + 127) >> 7;
    const int per = CS > 1 ? (nchunks + CS - 1) / CS : nchunks;
    const int cbeg = CS > 1 ? min(nchunks, static_cast<int>(blockIdx.y) * per) : 0;
    const int cend = CS > 1 ? min(nchunks, cbeg + per) : nchunks;
    const uint8_t* wt = wr + static_cast<size_t>(blockIdx.x) * nchunks * 2048 + lane * 16;
    const float* srow = scales + static_cast<size_t>(row0 >> 7) * nchunks;
    float acc_a = 0.f, acc_b = 0.f;
    bool waited = false;
    for (int c = cbeg + warp; c < cend; c += W) {
        const uint8_t* p = wt + static_cast<size_t>(c) * 2048;
        const uint4 w4[4] = {ld_stream(p), ld_stream(p + 512), ld_stream(p + 1024), ld_stream(p + 1536)};
        if (!waited) {
            pdl_wait();
            waited = true;
        }
        const int k0 = c * 128 + q * 32;
        float da = 0.f, db = 0.f;
#pragma unroll
        for (int h = 0; h < 2; ++h) {  // values k0 + 16h .. +15: w4[h] (row g), w4[2 + h] (row g + 8)
            float xf[16];
            const bool ok = k0 + 16 * h < k;  // k % 16 == 0: a 16-value piece is wholly inside or outside
            const uint4* xp = reinterpret_cast<const uint4*>(x + k0 + 16 * h);
            bf16x8_to_float(ok ? __ldg(xp) : make_uint4(0, 0, 0, 0), xf);
            bf16x8_to_float(ok ? __ldg(xp + 1) : make_uint4(0, 0, 0, 0), xf + 8);
            const uint32_t wa[4] = {w4[h].x, w4[h].y, w4[h].z, w4[h].w};
            const uint32_t wb[4] = {w4[2 + h].x, w4[2 + h].y, w4[2 + h].z, w4[2 + h].w};
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                const float2 a0 = e4m3x2_to_float2(wa[j]), a1 = e4m3x2_to_float2(wa[j] >> 16);
                const float2 b0 = e4m3x2_to_float2(wb[j]), b1 = e4m3x2_to_float2(wb[j] >> 16);
                da = fmaf(a0.x, xf[4 * j], da);
                da = fmaf(a0.y, xf[4 * j + 1], da);
                da = fmaf(a1.x, xf[4 * j + 2], da);
                da = fmaf(a1.y, xf[4 * j + 3], da);
                db = fmaf(b0.x, xf[4 * j], db);
                db = fmaf(b0.y, xf[4 * j + 1], db);
                db = fmaf(b1.x, xf[4 * j + 2], db);
                db = fmaf(b1.y, xf[4 * j + 3], db);
            }
        }
        const float sc = __ldg(srow + c);
        acc_a = fmaf(da, sc, acc_a);
        acc_b = fmaf(db, sc, acc_b);
    }
    if (!waited) pdl_wait();  // warps with no chunk still wait before writing
    quad_rows_to_shared(acc_a, acc_b, red[warp], g, q);
    __syncthreads();
    if (CS == 1) {
        if (threadIdx.x < 16 && row0 + static_cast<int>(threadIdx.x) < n) {
            float v = 0.f;
#pragma unroll
            for (int wi = 0; wi < W; ++wi) v += red[wi][threadIdx.x];
            y[row0 + threadIdx.x] = v;
        }
    } else {
        cluster_sum_store<CS, 16, W>(&red[0][0], y, 1, n, row0, 1.f);
    }
}

#define EDGEFIT_FP8_TILE_M1(W, CS, CLUSTER)                                                                       \
    extern "C" __global__ void CLUSTER __launch_bounds__(W * 32) fp8_gemv_tile_m1_w##W##c##CS(                     \
        const uint16_t* x, const uint8_t* wr, const float* scales, float* y, int n, int k) {                      \
        fp8_gemv_tile_m1<W, CS>(x, wr, scales, y, n, k);                                                          \
    }
EDGEFIT_FP8_TILE_M1(8, 1, )
EDGEFIT_FP8_TILE_M1(8, 2, __cluster_dims__(1, 2, 1))
#if EDGEFIT_LAB
EDGEFIT_FP8_TILE_M1(4, 1, )
EDGEFIT_FP8_TILE_M1(4, 2, __cluster_dims__(1, 2, 1))
EDGEFIT_FP8_TILE_M1(4, 3, __cluster_dims__(1, 3, 1))
#endif

// The variants: _pre (activations from gemv_act_frag_*, NVFP4 checkpoint layout; FP8's is the _w8c1 build below),
// _tile (NVFP4 tile layout, activations converted here) and _tile_pre (both). One 16-row tile per block, 8 warps,
// as the base kernels.
#define EDGEFIT_MMA_VARIANTS(NTILES, SUFFIX)                                                                      \
    extern "C" __global__ void __launch_bounds__(256) nvfp4_gemv_mma_pre_##SUFFIX(                                \
        const uint4* xf, const uint8_t* w, const uint8_t* scales, float global_scale, float* y, int m, int n,     \
        int k) {                                                                                                  \
        blockq_gemv_mma<1, NTILES, 8, true>(nullptr, xf, w, scales, global_scale, y, m, n, k);                    \
    }                                                                                                             \
    extern "C" __global__ void __launch_bounds__(256) nvfp4_gemv_mma_tile_##SUFFIX(                               \
        const uint16_t* x, const uint8_t* wr, const uint32_t* sr, float global_scale, float* y, int m, int n,     \
        int k) {                                                                                                  \
        blockq_gemv_mma<2, NTILES, 8, false>(x, nullptr, wr, sr, global_scale, y, m, n, k);                       \
    }
#define EDGEFIT_MMA_TILE_PRE(NTILES, SUFFIX)                                                                      \
    extern "C" __global__ void __launch_bounds__(256) nvfp4_gemv_mma_tile_pre_##SUFFIX(                           \
        const uint4* xf, const uint8_t* wr, const uint32_t* sr, float global_scale, float* y, int m, int n,       \
        int k) {                                                                                                  \
        blockq_gemv_mma<2, NTILES, 8, true>(nullptr, xf, wr, sr, global_scale, y, m, n, k);                       \
    }
#if EDGEFIT_LAB
EDGEFIT_MMA_VARIANTS(1, n8)
EDGEFIT_MMA_VARIANTS(2, n16)
#endif
// `Auto` runs one split of the tile layout at m >= 9 only (nvfp4_tiles_auto's `Mma`).
EDGEFIT_MMA_TILE_PRE(2, n16)
#if EDGEFIT_LAB
EDGEFIT_MMA_TILE_PRE(1, n8)
#endif

// Cluster-split builds (CS >= 1 in blockq_gemv_mma; Rust: MmaSplit, Gpu::fp8_block_gemv_split,
// Gpu::nvfp4_gemv_tiles_split): W warps per block, CS blocks per 16-row tile, grid (ceil(n/16), CS), W * 32
// threads; preconverted activations (FP8 checkpoint layout, NVFP4 tile layout). NVFP4's registers capped for 40
// (n8) or 32 (n16) resident warps per SM (no spills); FP8's left to ptxas (40-52 registers), since the same caps
// made it spill 4-12 bytes inside the chunk loop. CLUSTER is __cluster_dims__(1, CS, 1), or nothing for CS = 1.
// Built: the cuts that won a case or came within noise in the sweep; 8 warps x 3 or 4 and
// 4 warps x 4 lost everywhere (e.g. FP8 m = 4 5120x17408: w8c3 39.2, w8c4 35.0, w4c4 40.3 us against w8c2 29.8)
// and were deleted.
#define EDGEFIT_MMA_SPLIT(NTILES, NS, W, CS, CLUSTER)                                                              \
    extern "C" __global__ void CLUSTER __launch_bounds__(W * 32)                                                   \
        fp8_block_gemv_mma_pre_##NS##_w##W##c##CS(const uint4* xf, const uint8_t* w, const float* scales, float* y, \
                                                  int m, int n, int k) {                                         \
        blockq_gemv_mma<0, NTILES, W, true, CS>(nullptr, xf, w, scales, 1.f, y, m, n, k);                         \
    }
#define EDGEFIT_MMA_SPLIT_NVFP4(NTILES, NS, W, CS, CLUSTER)                                                        \
    extern "C" __global__ void CLUSTER __launch_bounds__(W * 32, (NTILES == 1 ? 40 : 32) / W)                       \
        nvfp4_gemv_mma_tile_pre_##NS##_w##W##c##CS(const uint4* xf, const uint8_t* wr, const uint32_t* sr,         \
                                                   float global_scale, float* y, int m, int n, int k) {           \
        blockq_gemv_mma<2, NTILES, W, true, CS>(nullptr, xf, wr, sr, global_scale, y, m, n, k);                   \
    }
#define EDGEFIT_MMA_SPLIT_FP8_TILE(NTILES, NS, W, CS, CLUSTER)                                                     \
    extern "C" __global__ void CLUSTER __launch_bounds__(W * 32)                                                   \
        fp8_gemv_mma_tile_pre_##NS##_w##W##c##CS(const uint4* xf, const uint8_t* wr, const float* scales, float* y, \
                                                 int m, int n, int k) {                                          \
        blockq_gemv_mma<3, NTILES, W, true, CS>(nullptr, xf, wr, scales, 1.f, y, m, n, k);                        \
    }
// The same over the tile layout with the activations converted inside the GEMV from bf16 x (no fragment kernel,
// no scratch sweep).
#define EDGEFIT_MMA_SPLIT_FP8_TILE_CONV(NTILES, NS, W, CS, CLUSTER)                                                \
    extern "C" __global__ void CLUSTER __launch_bounds__(W * 32)                                                   \
        fp8_gemv_mma_tile_##NS##_w##W##c##CS(const uint16_t* x, const uint8_t* wr, const float* scales, float* y,  \
                                             int m, int n, int k) {                                              \
        blockq_gemv_mma<3, NTILES, W, false, CS>(x, nullptr, wr, scales, 1.f, y, m, n, k);                        \
    }
// `Auto` converts in the GEMV at m <= 8 with 8 warps x 1 block only (fp8_tiles_auto); the rest are the lab's.
EDGEFIT_MMA_SPLIT_FP8_TILE_CONV(1, n8, 8, 1, )
#if EDGEFIT_LAB
EDGEFIT_MMA_SPLIT_FP8_TILE_CONV(2, n16, 8, 1, )
EDGEFIT_MMA_SPLIT_FP8_TILE_CONV(1, n8, 8, 2, __cluster_dims__(1, 2, 1))
EDGEFIT_MMA_SPLIT_FP8_TILE_CONV(2, n16, 8, 2, __cluster_dims__(1, 2, 1))
EDGEFIT_MMA_SPLIT_FP8_TILE_CONV(1, n8, 4, 1, )
EDGEFIT_MMA_SPLIT_FP8_TILE_CONV(2, n16, 4, 1, )
#endif
// The cuts `Auto` runs (fp8_split_auto, fp8_tiles_auto, MmaSplit::fp8_fragments, nvfp4_tiles_auto and
// nvfp4_fragments_cut in the Rust; the test every_auto_gemv_kernel_is_embedded checks the list), then the lab's.
EDGEFIT_MMA_SPLIT_FP8_TILE(1, n8, 8, 1, )
EDGEFIT_MMA_SPLIT_FP8_TILE(1, n8, 8, 2, __cluster_dims__(1, 2, 1))
EDGEFIT_MMA_SPLIT_FP8_TILE(2, n16, 8, 2, __cluster_dims__(1, 2, 1))
EDGEFIT_MMA_SPLIT_FP8_TILE(2, n16, 4, 1, )
EDGEFIT_MMA_SPLIT(1, n8, 8, 2, __cluster_dims__(1, 2, 1))
EDGEFIT_MMA_SPLIT(1, n8, 4, 1, )
EDGEFIT_MMA_SPLIT(2, n16, 4, 1, )
EDGEFIT_MMA_SPLIT(2, n16, 4, 3, __cluster_dims__(1, 3, 1))
EDGEFIT_MMA_SPLIT_NVFP4(1, n8, 8, 1, )
EDGEFIT_MMA_SPLIT_NVFP4(2, n16, 8, 1, )
EDGEFIT_MMA_SPLIT_NVFP4(1, n8, 8, 2, __cluster_dims__(1, 2, 1))
EDGEFIT_MMA_SPLIT_NVFP4(1, n8, 4, 1, )
#if EDGEFIT_LAB
EDGEFIT_MMA_SPLIT_FP8_TILE(1, n8, 4, 1, )
EDGEFIT_MMA_SPLIT_FP8_TILE(1, n8, 4, 2, __cluster_dims__(1, 2, 1))
EDGEFIT_MMA_SPLIT_FP8_TILE(1, n8, 4, 3, __cluster_dims__(1, 3, 1))
EDGEFIT_MMA_SPLIT_FP8_TILE(2, n16, 8, 1, )
EDGEFIT_MMA_SPLIT_FP8_TILE(2, n16, 4, 2, __cluster_dims__(1, 2, 1))
EDGEFIT_MMA_SPLIT_FP8_TILE(2, n16, 4, 3, __cluster_dims__(1, 3, 1))
EDGEFIT_MMA_SPLIT(1, n8, 8, 1, )
EDGEFIT_MMA_SPLIT(1, n8, 4, 2, __cluster_dims__(1, 2, 1))
EDGEFIT_MMA_SPLIT(1, n8, 4, 3, __cluster_dims__(1, 3, 1))
EDGEFIT_MMA_SPLIT(2, n16, 8, 1, )
EDGEFIT_MMA_SPLIT(2, n16, 8, 2, __cluster_dims__(1, 2, 1))
EDGEFIT_MMA_SPLIT(2, n16, 4, 2, __cluster_dims__(1, 2, 1))
EDGEFIT_MMA_SPLIT_NVFP4(1, n8, 4, 2, __cluster_dims__(1, 2, 1))
EDGEFIT_MMA_SPLIT_NVFP4(1, n8, 4, 3, __cluster_dims__(1, 3, 1))
EDGEFIT_MMA_SPLIT_NVFP4(2, n16, 8, 2, __cluster_dims__(1, 2, 1))
EDGEFIT_MMA_SPLIT_NVFP4(2, n16, 4, 1, )
EDGEFIT_MMA_SPLIT_NVFP4(2, n16, 4, 2, __cluster_dims__(1, 2, 1))
EDGEFIT_MMA_SPLIT_NVFP4(2, n16, 4, 3, __cluster_dims__(1, 3, 1))
#endif

// ---------------------------------------------------------------------------------------------------------------
// The NVFP4 decode GEMV over the tile layout (Gpu::nvfp4_gemv_tiles, the decode path an engine uses after
// Gpu::nvfp4_repack_tiles at load time), activations preconverted by gemv_act_frag_nvfp4[_zero].
//
// Why the first tile kernel (nvfp4_gemv_mma_tile_pre_*) reached only 48-64% of copy on the layer shapes while the
// same code reached 86% on lm_head (an H200 run): it issues ~193 instructions per KiB against a budget of ~300,
// so issue is not the limit; bytes in flight are. Each warp has one chunk (1 KiB of weights) in flight, 42
// registers allow 5 blocks (40 warps) per SM, and lm_head's 15520 tiles fill them: 40 KiB in flight per SM. A
// 5120-row matrix has only 320 tiles, 2.4 blocks per SM: ~19 KiB per SM, half the bytes in flight, and the measured
// fraction follows. 17408-row matrices have 1088 tiles of only 40 chunks at k = 5120, 5 per warp: 1.65 waves of
// short blocks whose start, reduction and tail are a large share. Besides, each chunk also loaded 2 KiB of B
// fragments per token tile from L2 (twice the weight bytes), of which 7/8 are zeros at m = 1.
//
// So this kernel, otherwise the same arithmetic: blockIdx.y splits the K chunks into gridDim.y ranges (more
// blocks, hence warps, on short matrices; the partial sums go into y with atomicAdd, y zeroed by
// gemv_act_frag_nvfp4_zero; with two splits the sum 0 + a + b is the same in either order, so results stay
// deterministic); and lanes of tokens past m load no fragments. Each warp adds the same chunks in the same order as
// nvfp4_gemv_mma_pre_n*, so with one split the outputs are bitwise those of the checkpoint-layout preconverted
// kernel (the tests check it). Two chunks in flight per warp, both loaded before either is decoded (U = 2), lost
// at every shape (e.g. lm_head m = 1 283 vs 224 us) and was deleted. With one split Rust
// runs nvfp4_gemv_mma_tile_pre_n* instead (1-4% faster at m <= 8, 4-25% at m > 8, same bits; the
// _n16 build here is capped at 64 registers by __launch_bounds__(256, 4)).
//
// Register double buffering (the next chunk's two 16-byte loads and scale word issued before the current chunk is
// decoded; tried in s3, not built): under this kernel's bound of 48 registers (__launch_bounds__(256, 5)) ptxas -v
// spills 100 bytes with the three loads before the decode, 24-84 bytes with the second 16-byte load moved down into
// the mma loop, still 4 bytes (one LDL per chunk) when the mmas also accumulate straight into acc (other bits). It
// is spill-free only with the loads after the 5th of the 8 mmas, where the SASS issues them ~16 instructions before
// the end of the loop: no double buffering left. The 9 registers need the 64 of 4 blocks per SM, which would leave
// the 5120-row shapes' 640 blocks (two splits) 1.2 waves of 528.
//
// A cp.async ring per warp (built, measured, deleted): each warp streamed its chunks (weights,
// scale words, the fragments of tokens 0-1) through 2-4 stages of shared memory, chunk c + (S-1) W requested
// before chunk c was decoded, same sums bit for bit. The idea: the one-wave layer shapes run every warp in
// lockstep (all wait for DRAM, then all decode), which lm_head's ~24 waves avoid (85.9% of copy there). It lost
// at every shape and stage count, 12-20% (m = 1, two splits, both launched as programmatic dependents: 21.5-21.8
// against 18.6 us on 5120x17408, 20.9-21.4 against 19.1 on 17408x5120, 14.3-14.8 against 12.1 on 5120x10240;
// lm_head 253-274 against 234): the commit/wait, the shared-memory round trip and the __syncwarps cost more than
// the overlap bought, so whatever holds these shapes at ~65% is not the warps' lockstep alone.
//
// A block-level ring filled by the copy engine (built, measured, deleted): one extra
// producer warp per block streamed the tile's chunks (weights and scale words, W chunks per stage, P stages of
// shared memory, one cp.async.bulk each per stage, full/empty mbarriers) while W consumer warps each took one chunk
// per stage, the same decode and mma as here (bit for bit at W = 8); so up to W * P KiB per block stayed in flight
// whatever the consumers did, started before pdl_wait. It lost at every shape, cut (W x P = 8 x 4, 4 x 4, 4 x 8) and
// split (1-3): m = 1, best cut against Auto's kernel in the same run, 20.7 vs 18.7 us on 5120x17408, 20.9 vs 17.7
// on 17408x5120, 14.9 vs 12.7 on 5120x10240, 236 vs 185 on the lm_head; m = 16 27.4 vs 24.6 and 28.5 vs 23.4.
// Prefetching the next chunk's B fragments to L1 (their L2 latency is exposed per chunk once the weights come from
// shared memory) made it slower still (22.5 on 5120x17408). With one split (320 blocks, 19 consumer warps per SM,
// the ring never empty) it took 29.3 us: the consumers, not the bytes in flight, set the pace. That agrees with
// an earlier Nsight Compute reading of nvfp4_gemv_tiles_n8_u1 (64% of issue slots used while active, 19% of the
// kernel with SMs idle in the ramp and tail): 85% of copy needs fewer instructions per KiB (the e2m1 decode and
// group scale are ~160 of ~193) and a shorter ramp and tail, not a deeper pipeline. (cut the decode to
// 9 instructions per 8 values by reordering the tile layout's bits, e2m1x8_to_f16_pairs: 63.7 -> 75.5% of copy
// at m = 1 on 5120x17408, see blockq_gemv_mma's notes.) (Under compute-sanitizer
// racecheck that test binary stopped inside the bulk kernel's test in both runs; memcheck was clean and every
// test passed without the tool. Not pursued once the kernel lost.)
//
// Programmatic dependent launch: this kernel and the fragment kernel before it are launched as
// programmatic dependents by the crate (Device::launch_pdl), so the GEMV's blocks get resident while the
// fragment kernel runs: 1.03-1.08x at every m on the layer shapes.
//
// Now this is blockq_gemv_mma with CS = 0 (the same loads, fragments and sums: the H200 runs' arms
// w8a2 and t1k2 of bench_gemv.py, this build against the separate kernel it replaced, 18.5 vs 18.3 us at m = 1 on
// 5120x17408, 12.7 vs 11.9 on 5120x10240, within each other's spread elsewhere). Thread-block clusters in place of
// the atomics (CS > 1, deterministic for any split) were slower for NVFP4 (w8c2 21.6-21.8 us against 18.3-18.6 on
// 5120x17408) and within 1% or faster for FP8, which uses them (see the cluster builds above).
//
// Grid (ceil(n/16), splits), 256 threads; xf from gemv_act_frag_nvfp4 (splits = 1) or gemv_act_frag_nvfp4_zero
// (splits > 1: y must be zero; or from a producer in ops.cu given y to zero, as Gpu::rmsnorm_nvfp4_gemv runs it). n8: m <= 8 (nt = 1), n16: m <= 16 (nt = 2); registers capped at 48 / 64.
extern "C" __global__ void __launch_bounds__(256, 5) nvfp4_gemv_tiles_n8_u1(const uint4* xf, const uint8_t* wr,
                                                                           const uint32_t* sr, float global_scale,
                                                                           float* y, int m, int n, int k) {
    blockq_gemv_mma<2, 1, 8, true, 0>(nullptr, xf, wr, sr, global_scale, y, m, n, k);
}
// `Auto` splits K at m <= 8 only (nvfp4_tiles_auto), so the n16 build is the lab's.
#if EDGEFIT_LAB
extern "C" __global__ void __launch_bounds__(256, 4) nvfp4_gemv_tiles_n16_u1(const uint4* xf, const uint8_t* wr,
                                                                            const uint32_t* sr, float global_scale,
                                                                            float* y, int m, int n, int k) {
    blockq_gemv_mma<2, 2, 8, true, 0>(nullptr, xf, wr, sr, global_scale, y, m, n, k);
}
#endif

// The NVFP4 m = 1 decode GEMV over the tile layout (Gpu::nvfp4_gemv_tiles at m = 1): the group scales
// applied after the mma instead of to every weight pair before it. At m = 1, seven of the n8 mma's eight columns
// (tokens) are empty; here column n carries group n of the chunk instead. In mma j of a chunk, k-slots 2q', 2q'+1,
// 2q'+8, 2q'+9 hold lane q''s values of its group 2q' + (j >= 4) (the tile layout's order, as in
// nvfp4_a_fragments), so B[kk][n] = x[kk] where kk's group is n, else 0, makes C[r][n] the chunk's partial sum of
// row r over group n. In B fragment terms: lane (g, q) holds token 0's fragment words of lane q (what
// gemv_act_frag_nvfp4 writes for m = 1) where g == 2q (mmas 0-3, words v = 0, 1) or g == 2q + 1 (mmas 4-7,
// v = 2, 3), zeros elsewhere: 8 lanes load 32 bytes each per chunk, the same 256 bytes as the token-0 lanes of
// blockq_gemv_mma. Each lane's accumulators are then rows g, g+8 x groups 2q, 2q+1: exactly the four e4m3 scales of
// its own scale word, applied by 4 FFMA per chunk instead of 32 HMUL2 on the weight pairs. The rows' sums over the
// 8 groups: two shuffles at the end. Not bit for bit with blockq_gemv_mma (the scale multiplies a sum, not each
// product); the same precision class (exact products, fp32 sums). 125 instructions per chunk in the SASS against
// nvfp4_gemv_tiles_n8_u1's 165, 46 registers. Measured (m = 1, against the best other kernel in the same
// rounds): 15.24-15.46 against 15.67-15.89 us on 5120x17408 (8 warps, 2 splits), 10.06-10.24 against 10.72-10.94 on
// 5120x10240; a tie on 17408x5120 and 4% slower on the lm_head (4 warps, one split): so Auto runs it on up to 8192
// rows only (nvfp4_tiles_auto). A quarter fewer instructions buying 3-6% says these shapes are no longer
// issue-bound.
// A flat walk, measured and not kept (`benchmarks/h200.md`): one wave of
// SMs x 5 blocks, warp w of T taking flat chunks [F w / T, F (w + 1) / T) of the tile layout (F = tiles x chunks,
// tile b's chunks contiguous) and adding into the zeroed y at each tile boundary, so every warp has the same work
// whatever the tiles-to-SMs fit (17408 rows: 1088 tiles for 660 resident blocks). Alone on fragments it beat the
// tile kernels on 17408x5120 (14.86 against 15.5-16.2 us), but as the call runs, after the fragment kernel that
// zeroes y, it lost everywhere: 16.29 against 15.32 us (5120x17408), 16.24 against 15.45 (17408x5120, w8c1), 11.08
// against 10.37 (5120x10240), 187.1 against 170.9 (lm_head, w4c1); with SMs x 4 blocks 13-24% slower still.
//
// Grid (ceil(n/16), splits), W warps per block taking every W-th chunk of the block's contiguous share. CS == 0:
// with splits > 1 the partial sums are added into y with atomicAdd (y zeroed by gemv_act_frag_nvfp4_zero, or by
// the fragment producer of Gpu::rmsnorm_nvfp4_gemv / silu_and_mul_nvfp4_gemv; deterministic for 2 splits). CS > 1 (the _w{W}c{CS} builds): the CS blocks of a tile are one
// thread-block cluster (gridDim.y == CS) whose sums meet in distributed shared memory (cluster_sum_store), so y
// needs no zeroing and the bits do not depend on the order: what a producer writing the fragments itself
// (rmsnorm_frag_nvfp4, ops.cu) can run without a zeroing pass. xf from gemv_act_frag_nvfp4[_zero] (or such a
// producer) with m = 1, nt = 1.
template <int W, int CS = 0>
__device__ __forceinline__ void nvfp4_gemv_tiles_m1(const uint4* __restrict__ xf, const uint8_t* __restrict__ wr,
                                                    const uint32_t* __restrict__ sr, float global_scale,
                                                    float* __restrict__ y, int n, int k) {
    pdl_launch_dependents();
    __shared__ float red[W][16];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, q = lane & 3;
    const int row0 = blockIdx.x * 16;
    const int nchunks = (k + 127) >> 7;
    const int nsplit = static_cast<int>(gridDim.y);
    const int per = (nchunks + nsplit - 1) / nsplit;
    const int cbeg = min(nchunks, static_cast<int>(blockIdx.y) * per);
    const int cend = min(nchunks, cbeg + per);
    const uint8_t* wt = wr + static_cast<size_t>(blockIdx.x) * nchunks * 1024 + lane * 16;
    const uint32_t* st = sr + static_cast<size_t>(blockIdx.x) * nchunks * 32 + lane;
    const bool lo = g == 2 * q, hi = g == 2 * q + 1;  // the lanes that hold activations (see above)
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
    pdl_wait();
    for (int c = cbeg + warp; c < cend; c += W) {
        const uint4 wa = ld_stream(wt + static_cast<size_t>(c) * 1024);
        const uint4 wb = ld_stream(wt + static_cast<size_t>(c) * 1024 + 512);
        const uint32_t s4 = __ldg(st + static_cast<size_t>(c) * 32);
        const uint4* xc = xf + static_cast<size_t>(c) * 128 + q;  // token 0's word v of lane q: xc[32 v]
        const uint4 z = make_uint4(0, 0, 0, 0);
        const uint4 b0 = lo ? __ldg(xc) : z, b1 = lo ? __ldg(xc + 32) : z;
        const uint4 b2 = hi ? __ldg(xc + 64) : z, b3 = hi ? __ldg(xc + 96) : z;
        const uint32_t bx[16] = {b0.x, b0.y, b0.z, b0.w, b1.x, b1.y, b1.z, b1.w,
                                 b2.x, b2.y, b2.z, b2.w, b3.x, b3.y, b3.z, b3.w};
        // Weights as f16 pairs times 2^-14, unscaled, in nvfp4_a_fragments' order.
        uint32_t ax[16], bxw[16];
        nvfp4_a_pairs<true>(wa, wb, ax, bxw);
        float part[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            const uint32_t a[4] = {ax[2 * j], bxw[2 * j], ax[2 * j + 1], bxw[2 * j + 1]};
            mma_f16_16816(part, a, bx[2 * j], bx[2 * j + 1]);
        }
        // part: rows g (0, 1) and g+8 (2, 3) x groups 2q, 2q+1 = the bytes 0..3 of s4 (e4m3, exact in f16).
        const __half2_raw sa = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(s4 & 0xffffu), __NV_E4M3);
        const __half2_raw sb = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(s4 >> 16), __NV_E4M3);
        const float2 fa = __half22float2(*reinterpret_cast<const __half2*>(&sa));
        const float2 fb = __half22float2(*reinterpret_cast<const __half2*>(&sb));
        acc[0] = fmaf(part[0], fa.x, acc[0]);
        acc[1] = fmaf(part[1], fa.y, acc[1]);
        acc[2] = fmaf(part[2], fb.x, acc[2]);
        acc[3] = fmaf(part[3], fb.y, acc[3]);
    }
    // Row sums over the 8 groups (the 4 lanes of a row hold 2 each), then over the warps.
    quad_rows_to_shared(acc[0] + acc[1], acc[2] + acc[3], red[warp], g, q);
    __syncthreads();
    if (CS > 1) {
        cluster_sum_store<CS, 16, W>(&red[0][0], y, 1, n, row0, 16384.f * global_scale);
        return;
    }
    if (threadIdx.x < 16 && row0 + static_cast<int>(threadIdx.x) < n) {
        float v = 0.f;
#pragma unroll
        for (int wi = 0; wi < W; ++wi) v += red[wi][threadIdx.x];
        v *= 16384.f * global_scale;
        float* dst = y + row0 + threadIdx.x;
        if (nsplit > 1)
            atomicAdd(dst, v);
        else
            *dst = v;
    }
}
extern "C" __global__ void __launch_bounds__(256, 5) nvfp4_gemv_tiles_m1_w8(const uint4* xf, const uint8_t* wr,
                                                                           const uint32_t* sr, float global_scale,
                                                                           float* y, int n, int k) {
    nvfp4_gemv_tiles_m1<8>(xf, wr, sr, global_scale, y, n, k);
}
#if EDGEFIT_LAB
extern "C" __global__ void __launch_bounds__(128, 10) nvfp4_gemv_tiles_m1_w4(const uint4* xf, const uint8_t* wr,
                                                                            const uint32_t* sr, float global_scale,
                                                                            float* y, int n, int k) {
    nvfp4_gemv_tiles_m1<4>(xf, wr, sr, global_scale, y, n, k);
}
#endif
extern "C" __global__ void __cluster_dims__(1, 2, 1) __launch_bounds__(256, 5)
    nvfp4_gemv_tiles_m1_w8c2(const uint4* xf, const uint8_t* wr, const uint32_t* sr, float global_scale, float* y,
                             int n, int k) {
    nvfp4_gemv_tiles_m1<8, 2>(xf, wr, sr, global_scale, y, n, k);
}

// gemv_act_frag_{nvfp4,fp8} that also zero y[0 .. ylen) (grid-stride), for the split-K launches that add into y.
// Same grid.
template <int FMT>
__device__ __forceinline__ void gemv_act_frag_zero(const uint16_t* x, uint4* xf, int m, int k, int nt, float* y,
                                                   unsigned long long ylen) {
    pdl_launch_dependents();
    pdl_wait();  // y may still be read by the kernel before
    for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < ylen;
         i += static_cast<size_t>(gridDim.x) * blockDim.x)
        y[i] = 0.f;
    gemv_act_frag_body<FMT>(x, xf, m, k, nt);
}
extern "C" __global__ void __launch_bounds__(256) gemv_act_frag_nvfp4_zero(const uint16_t* x, uint4* xf, int m,
                                                                            int k, int nt, float* y,
                                                                            unsigned long long ylen) {
    gemv_act_frag_zero<1>(x, xf, m, k, nt, y, ylen);
}
// No Rust path launches it yet; kept for the lab's FP8 split-K experiments.
#if EDGEFIT_LAB
extern "C" __global__ void __launch_bounds__(256) gemv_act_frag_fp8_zero(const uint16_t* x, uint4* xf, int m,
                                                                          int k, int nt, float* y,
                                                                          unsigned long long ylen) {
    gemv_act_frag_zero<0>(x, xf, m, k, nt, y, ylen);
}
#endif
