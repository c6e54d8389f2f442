// Prefill GEMMs on Hopper's warpgroup MMA (wgmma), sm_90a only (kernels/build_cuda.rs builds this file to an
// sm_90a cubin; the module loads only on a compute-capability-9.0 device). Safe entry points:
// kernels/src/cuda/gemm_sm90a.rs; launches: kernels/src/cuda/device/gemm_sm90a.rs.
//
// Why: the mma.sync kernels of gemm.cu reach 210-260 TFLOP/s on the H200, 0.18-0.26x cuBLAS, because mma.sync
// cannot feed Hopper's tensor cores (every operand fragment goes through ldmatrix into registers of 8 warps).
// wgmma reads both operands straight from shared memory through 64-bit matrix descriptors and runs
// asynchronously to the issuing warpgroup, which is what cuBLAS and DeepGEMM use.
//
// Kernels (same semantics and layouts as gemm.cu's, so they are drop-in faster paths):
//
// - fp8_block_gemm_sm90a_v1 / fp8_block_gemm_sm90a_v2:
//     y[M,N] fp32 = sum_kb sa[m,kb] * sw[n/128,kb] * (xq[m, kb*128 .. +128] . wq[n, kb*128 .. +128])
//   xq: e4m3 [M,K] row-major (per token per 128 of K, from fp8_quantize_act), sa: fp32 [M, K/128];
//   wq: e4m3 [N,K] row-major (the checkpoint's weight), sw: fp32 [ceil(N/128), K/128] (weight_scale_inv);
//   y: fp32 [M,N]. Constraint: K % 128 == 0 (every K block is one whole scale block and one whole 128-byte
//   swizzle row); M and N are free (ragged tiles are zero-filled on load and guarded on store).
//   Block tile 128 (M) x 128 (N) x 128 (K per stage). Two consumer warpgroups, each owning 64 rows x 128
//   columns: per K block, 4 x wgmma m64n128k32 e4m3 sum the 128 products of each output into a fresh fp32
//   register tile (the "partial"), which is then promoted into the fp32 accumulator with sa[row,kb] * sw on the
//   CUDA cores (DeepGEMM's scheme: the tensor cores' FP8 accumulation keeps only ~14 bits, so sums never run
//   longer than 128 products there, and the per-block scales can be applied exactly). Operands sit in shared
//   memory K-major with the 128-byte swizzle (row r's 16-byte chunk c at chunk c ^ (r % 8), 1024-byte aligned
//   8-row atoms), which is both what TMA's SWIZZLE_128B writes and what a wgmma descriptor with layout type
//   "128B swizzle" reads; the k32 steps inside a 128-byte row advance the descriptor's start address by 32 bytes.
//   v1: all 256 threads (the two consumer warpgroups) load a 4-stage ring with 16-byte cp.async (zero-fill past
//       M/N), the simplest correct wgmma kernel.
//   v2: warp-specialised: a producer warpgroup (setmaxnreg down to 40; one thread issues TMA
//       cp.async.bulk.tensor copies from two tensor maps, 128x128-byte boxes, SWIZZLE_128B, out-of-bounds rows
//       zero-filled) into a 6-stage ring guarded by full/empty mbarriers, and two consumer warpgroups (setmaxnreg
//       up to 232) that wait on "full", run the wgmmas, and release the stage on "empty" when their wgmmas are done.
//   Output tiles are visited in groups of 8 tile rows, the tile row fastest inside a group (tile_of), so that the
//   ~132 blocks resident at one time (one per SM) share ~8 A row blocks and ~17 B row blocks through L2.
//
// - nvfp4_gemm_sm90a_v1:
//     y[M,N] fp32 = global * sum_k x[m,k] * e2m1(w[n,k]) * e4m3(s[n,k/16])
//   x: bf16 [M,K]; w: [N, K/2] bytes (even element in the low nibble); s: e4m3 [N, K/16]; y: fp32 [M,N].
//   Hopper has no FP4 MMA: the weights are decoded to bf16 in shared memory (e2m1 x e4m3 has at most 5
//   significant bits and lies in [2^-10, 2688], so it is exact in bf16; the global scale is applied to the fp32
//   result) and multiplied by wgmma m64n128k16 bf16. Tile 128 x 128 x 64 (64 bf16 = one 128-byte swizzle row).
//   Constraint: K % 64 == 0. 256 threads: the packed weights and x arrive by cp.async in a 4-stage ring; at each
//   K tile all threads decode the tile's weights into a double-buffered swizzled bf16 B tile, then the two
//   warpgroups issue their wgmmas (fp32 accumulation across all of K, no promotion needed: bf16 products are exact).

#include "common.cuh"

namespace {

constexpr int BM = 128;  // rows of a block tile (two warpgroups of 64)
constexpr int BN = 128;  // columns of a block tile (one weight scale block for FP8)
constexpr int BK8 = 128; // K per stage, FP8 (one scale block, one 128-byte row)
constexpr int GROUP_M = 8;

// FP8 v1: 4 stages of A (16 KiB) + B (16 KiB), plus 1 KiB to align the ring to 1024 bytes.
constexpr int F8V1_STAGES = 4;
constexpr int F8_STAGE_BYTES = (BM + BN) * BK8;
constexpr int F8V1_SMEM_BYTES = F8V1_STAGES * F8_STAGE_BYTES + 1024;
// FP8 v2: 6 stages, plus 1 KiB alignment and 2 x 6 mbarriers.
constexpr int F8V2_STAGES = 6;
constexpr int F8V2_SMEM_BYTES = F8V2_STAGES * F8_STAGE_BYTES + 1024 + 2 * F8V2_STAGES * 8;
static_assert(F8V1_SMEM_BYTES == 132096, "kernels/src/cuda/device/gemm_sm90a.rs FP8_V1_SMEM_BYTES");
static_assert(F8V2_SMEM_BYTES == 197728, "kernels/src/cuda/device/gemm_sm90a.rs FP8_V2_SMEM_BYTES");

// NVFP4 v1: 4 stages of x (128 x 64 bf16 = 16 KiB) + packed w (128 x 32 B = 4 KiB) + scales (128 x 4 B = 512 B),
// plus two decoded bf16 B tiles (2 x 16 KiB) and 1 KiB alignment.
constexpr int BK4 = 64;
constexpr int N4_STAGES = 4;
constexpr int N4_X_BYTES = BM * BK4 * 2;
constexpr int N4_W_BYTES = BN * BK4 / 2;
constexpr int N4_S_BYTES = BN * BK4 / 16;
// Rounded up to 1024 bytes so that every stage's x tile is a 1024-byte-aligned swizzle atom.
constexpr int N4_STAGE_BYTES = (N4_X_BYTES + N4_W_BYTES + N4_S_BYTES + 1023) / 1024 * 1024;
constexpr int N4_SMEM_BYTES = 1024 + 2 * BN * BK4 * 2 + N4_STAGES * N4_STAGE_BYTES;
static_assert(N4_SMEM_BYTES == 119808, "kernels/src/cuda/device/gemm_sm90a.rs NVFP4_V1_SMEM_BYTES");

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Byte offset of 16-byte chunk c of row r in a K-major tile of 128-byte rows with the 128-byte swizzle.
__device__ __forceinline__ uint32_t swz(int r, int c) {
    return static_cast<uint32_t>(r * 128 + ((c ^ (r & 7)) << 4));
}

// wgmma matrix descriptor of a K-major operand with the 128-byte swizzle starting at shared address `addr`
// (the tile base must be 1024-byte aligned; `addr` may be base + 32 j for the j-th 32-byte K step): start
// address >> 4 in bits 0-13, leading byte offset 1 (unused for swizzled K-major layouts) in bits 16-29, stride
// byte offset 1024 >> 4 (one 8-row atom) in bits 32-45, base offset 0, layout type 1 (128B swizzle) in bits 62-63.
__device__ __forceinline__ uint64_t desc_sw128(uint32_t addr) {
    return static_cast<uint64_t>((addr & 0x3FFFF) >> 4) | (static_cast<uint64_t>(1) << 16) |
           (static_cast<uint64_t>(1024 >> 4) << 32) | (static_cast<uint64_t>(1) << 62);
}

__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, bool valid) {
    // src-size 0 zero-fills the 16 bytes without reading (src must still be a valid address).
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0)
                 : "memory");
}
__device__ __forceinline__ void cp_async4(uint32_t dst, const void* src, bool valid) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 4 : 0)
                 : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory"); }

// Makes this thread's generic-proxy writes to shared memory (cp.async, st.shared) visible to the async proxy
// (wgmma operand reads); each writer runs it before the barrier that precedes the wgmma.
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_wait0() { asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory"); }

// The partial/accumulator registers must not be touched by other instructions while a wgmma is in flight; this
// empty asm with them as in/out operands pins them across the fence/wait (as CUTLASS's warpgroup_fence_operand).
__device__ __forceinline__ void fence_regs(float (&d)[64]) {
#pragma unroll
    for (int i = 0; i < 64; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// mbarrier helpers (shared::cta addresses).
__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
// Waits for the phase of parity `parity` to complete. Bounded: a pipeline bug (a phase that never completes, a
// TMA transaction count that never fills) traps after ~2^26 polls (seconds; a legitimate wait is microseconds),
// so that the launch fails with an error instead of hanging the device for everyone.
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
    uint32_t done = 0, polls = 0;
    do {
        if (++polls == (1u << 26)) __trap();
        asm volatile(
            "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
            : "=r"(done)
            : "r"(bar), "r"(parity)
            : "memory");
    } while (!done);
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
// One 2D TMA copy of the box at (c0 = innermost coordinate, c1) into shared memory, completing on `bar`.
__device__ __forceinline__ void tma_load_2d(uint32_t dst, const void* tmap, uint32_t bar, int c0, int c1) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4}], [%2];\n" ::
            "r"(dst),
        "l"(reinterpret_cast<uint64_t>(tmap)), "r"(bar), "r"(c0), "r"(c1)
        : "memory");
}

// Output tile of linear block `b`: groups of GROUP_M tile rows, the tile row fastest inside a group, so the
// ~132 resident blocks cover ~8 tile rows x ~17 tile columns and share those A and B rows through L2.
__device__ __forceinline__ void tile_of(int b, int tiles_m, int tiles_n, int& tm, int& tn) {
    const int per_group = GROUP_M * tiles_n;
    const int g = b / per_group;
    const int first = g * GROUP_M;
    const int rows = min(GROUP_M, tiles_m - first);
    const int r = b - g * per_group;
    tm = first + r % rows;
    tn = r / rows;
}

// An opaque CUtensorMap (the driver's 128-byte descriptor, encoded on the host by cuTensorMapEncodeTiled), passed
// by value as a __grid_constant__ kernel parameter so that TMA reads it from parameter space.
struct alignas(64) TmaDesc {
    unsigned long long opaque[16];
};

__device__ __forceinline__ void wgmma_m64n128k32_e4m3(float (&d)[64], uint64_t da, uint64_t db, int scale_d) {
    asm volatile(
        "{\n.reg .pred p;\n"
        "setp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 "
        "{"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
        "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
        "}, %64, %65, p, 1, 1;\n"
        "}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
          "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
          "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
          "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
          "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
        : "l"(da), "l"(db), "r"(scale_d));
}

__device__ __forceinline__ void wgmma_m64n128k16_bf16(float (&d)[64], uint64_t da, uint64_t db, int scale_d) {
    asm volatile(
        "{\n.reg .pred p;\n"
        "setp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
        "{"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
        "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
        "}, %64, %65, p, 1, 1, 0, 0;\n"
        "}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
          "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
          "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
          "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
          "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
        : "l"(da), "l"(db), "r"(scale_d));
}

// acc += part * (s0 for the thread's first row, s1 for its second): the m64nNk fragment of thread (warp w, lane
// l) of a warpgroup holds, for n8 tile j, rows 16 w + l/4 (registers 4j, 4j+1) and 16 w + l/4 + 8 (4j+2, 4j+3),
// columns 8 j + 2 (l % 4) + {0, 1}.
__device__ __forceinline__ void promote(float (&acc)[64], const float (&part)[64], float s0, float s1) {
#pragma unroll
    for (int j = 0; j < 16; ++j) {
        acc[4 * j + 0] = fmaf(part[4 * j + 0], s0, acc[4 * j + 0]);
        acc[4 * j + 1] = fmaf(part[4 * j + 1], s0, acc[4 * j + 1]);
        acc[4 * j + 2] = fmaf(part[4 * j + 2], s1, acc[4 * j + 2]);
        acc[4 * j + 3] = fmaf(part[4 * j + 3], s1, acc[4 * j + 3]);
    }
}

// Stores a warpgroup's 64 x 128 fp32 fragment (rows r0 and r0 + 8 of this thread, columns from n0) times `scale`
// into y [M, N], guarded against M and N; 8-byte stores when N is even (then every (row, even column) is aligned).
__device__ __forceinline__ void store_tile(float* __restrict__ y, const float (&acc)[64], float scale, int r0, int n0,
                                           int lane, int M, int N) {
    const bool even = (N & 1) == 0;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int row = r0 + 8 * h;
        if (row >= M) continue;
        float* yr = y + static_cast<size_t>(row) * N;
#pragma unroll
        for (int j = 0; j < 16; ++j) {
            const int col = n0 + 8 * j + 2 * (lane & 3);
            const float v0 = acc[4 * j + 2 * h] * scale, v1 = acc[4 * j + 2 * h + 1] * scale;
            if (even && col + 1 < N) {
                *reinterpret_cast<float2*>(yr + col) = make_float2(v0, v1);
            } else {
                if (col < N) yr[col] = v0;
                if (col + 1 < N) yr[col + 1] = v1;
            }
        }
    }
}

// One K block (128) of a warpgroup's 64 x 128 FP8 tile: 4 wgmma k32 steps into `part` (the first overwrites it),
// waited for before return. sA: this warpgroup's 64 A rows; sB: the 128 B rows; both 1024-byte aligned.
__device__ __forceinline__ void fp8_block_mma(float (&part)[64], uint32_t sA, uint32_t sB) {
    fence_regs(part);
    wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < 4; ++ks) wgmma_m64n128k32_e4m3(part, desc_sw128(sA + 32 * ks), desc_sw128(sB + 32 * ks), ks);
    wgmma_commit();
    fence_regs(part);
}

}  // namespace

// ---------------------------------------------------------------------------------------------------------------
// FP8 v1: cp.async ring, no warp specialisation. Grid: ceil(M/128) * ceil(N/128) blocks (1D, see tile_of), 256
// threads, F8V1_SMEM_BYTES dynamic shared memory. Needs K % 128 == 0, K >= 128.
extern "C" __global__ void __launch_bounds__(256, 1)
    fp8_block_gemm_sm90a_v1(const uint8_t* __restrict__ xq, const float* __restrict__ sa,
                            const uint8_t* __restrict__ wq, const float* __restrict__ sw, float* __restrict__ y,
                            int M, int N, int K) {
    extern __shared__ uint8_t smem_raw[];
    const uint32_t base = (smem_u32(smem_raw) + 1023u) & ~1023u;
    const int KB = K / BK8;
    const int tiles_m = (M + BM - 1) / BM, tiles_n = (N + BN - 1) / BN;
    int tm, tn;
    tile_of(blockIdx.x, tiles_m, tiles_n, tm, tn);
    const int m0 = tm * BM, n0 = tn * BN;
    const int tid = threadIdx.x;

    // Stage `stage` <- K block kb: A rows m0.., B rows n0.., 8 chunks of 16 bytes per row; 2048 chunks, 8 per
    // thread. Rows past M or N are zero-filled from row 0 of the operand (a valid address, not read).
    auto load = [&](int kb, int stage) {
        const uint32_t sA = base + stage * F8_STAGE_BYTES, sB = sA + BM * BK8;
        const size_t kofs = static_cast<size_t>(kb) * BK8;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const int i = tid + 256 * j, r = i >> 3, c = i & 7;
            const bool ok = m0 + r < M;
            cp_async16(sA + swz(r, c), xq + (ok ? static_cast<size_t>(m0 + r) * K : 0) + kofs + 16 * c, ok);
        }
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const int i = tid + 256 * j, r = i >> 3, c = i & 7;
            const bool ok = n0 + r < N;
            cp_async16(sB + swz(r, c), wq + (ok ? static_cast<size_t>(n0 + r) * K : 0) + kofs + 16 * c, ok);
        }
    };

#pragma unroll
    for (int s = 0; s < F8V1_STAGES - 1; ++s) {
        if (s < KB) load(s, s);
        cp_async_commit();
    }

    const int wg = tid >> 7, warp = (tid >> 5) & 3, lane = tid & 31;
    const int r0 = m0 + 64 * wg + 16 * warp + (lane >> 2);
    const float* sa0 = sa + static_cast<size_t>(min(r0, M - 1)) * KB;
    const float* sa1 = sa + static_cast<size_t>(min(r0 + 8, M - 1)) * KB;
    const float* swp = sw + static_cast<size_t>(tn) * KB;
    float acc[64], part[64];
#pragma unroll
    for (int i = 0; i < 64; ++i) acc[i] = part[i] = 0.f;

#pragma unroll 1
    for (int kb = 0; kb < KB; ++kb) {
        // Stage kb has landed (groups are committed one per K block, empty ones past the end included), and
        // every warpgroup has finished its wgmmas of kb - 1 (they wait before promoting), so its stage is free.
        cp_async_wait<F8V1_STAGES - 2>();
        fence_proxy_async();
        __syncthreads();
        const int nk = kb + F8V1_STAGES - 1;
        if (nk < KB) load(nk, nk % F8V1_STAGES);
        cp_async_commit();

        const uint32_t st = base + (kb % F8V1_STAGES) * F8_STAGE_BYTES;
        fp8_block_mma(part, st + wg * 64 * BK8, st + BM * BK8);
        const float sb = __ldg(swp + kb), s0 = __ldg(sa0 + kb) * sb, s1 = __ldg(sa1 + kb) * sb;
        wgmma_wait0();
        fence_regs(part);
        promote(acc, part, s0, s1);
    }
    store_tile(y, acc, 1.f, r0, n0, lane, M, N);
}

// ---------------------------------------------------------------------------------------------------------------
// FP8 v2: TMA + mbarrier ring + warp specialisation. Grid as v1, 384 threads (warpgroup 0 produces, 1 and 2
// consume), F8V2_SMEM_BYTES dynamic shared memory. `ta`: tensor map of xq as 2D uint8 {K, M} (row stride K),
// box {128, 128}, SWIZZLE_128B, zero OOB fill; `tb`: the same for wq {K, N}. Needs K % 128 == 0, K >= 128.
extern "C" __global__ void __launch_bounds__(384, 1)
    fp8_block_gemm_sm90a_v2(const __grid_constant__ TmaDesc ta, const __grid_constant__ TmaDesc tb,
                            const float* __restrict__ sa, const float* __restrict__ sw, float* __restrict__ y, int M,
                            int N, int K) {
    extern __shared__ uint8_t smem_raw[];
    const uint32_t base = (smem_u32(smem_raw) + 1023u) & ~1023u;
    const uint32_t full = base + F8V2_STAGES * F8_STAGE_BYTES;  // F8V2_STAGES x 8-byte mbarriers
    const uint32_t empty = full + 8 * F8V2_STAGES;
    const int KB = K / BK8;
    const int tiles_m = (M + BM - 1) / BM, tiles_n = (N + BN - 1) / BN;
    int tm, tn;
    tile_of(blockIdx.x, tiles_m, tiles_n, tm, tn);
    const int m0 = tm * BM, n0 = tn * BN;
    const int tid = threadIdx.x;
    if (tid == 0) {
#pragma unroll
        for (int s = 0; s < F8V2_STAGES; ++s) {
            mbar_init(full + 8 * s, 1);   // the producer's arrive.expect_tx; TMA completes the bytes
            mbar_init(empty + 8 * s, 8);  // one arrive per consumer warp
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();
    const int wg = tid >> 7;
    if (wg == 0) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n" ::: "memory");
        if (tid == 0) {
#pragma unroll 1
            for (int kb = 0; kb < KB; ++kb) {
                const int s = kb % F8V2_STAGES;
                const uint32_t phase = (kb / F8V2_STAGES) & 1;
                mbar_wait(empty + 8 * s, phase ^ 1);  // the first pass through the ring does not wait
                mbar_arrive_expect_tx(full + 8 * s, F8_STAGE_BYTES);
                const uint32_t st = base + s * F8_STAGE_BYTES;
                tma_load_2d(st, &ta, full + 8 * s, kb * BK8, m0);
                tma_load_2d(st + BM * BK8, &tb, full + 8 * s, kb * BK8, n0);
            }
        }
        return;
    }
    asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n" ::: "memory");
    const int c = wg - 1, warp = (tid >> 5) & 3, lane = tid & 31;
    const int r0 = m0 + 64 * c + 16 * warp + (lane >> 2);
    const float* sa0 = sa + static_cast<size_t>(min(r0, M - 1)) * KB;
    const float* sa1 = sa + static_cast<size_t>(min(r0 + 8, M - 1)) * KB;
    const float* swp = sw + static_cast<size_t>(tn) * KB;
    float acc[64], part[64];
#pragma unroll
    for (int i = 0; i < 64; ++i) acc[i] = part[i] = 0.f;
#pragma unroll 1
    for (int kb = 0; kb < KB; ++kb) {
        const int s = kb % F8V2_STAGES;
        const float sb = __ldg(swp + kb), s0 = __ldg(sa0 + kb) * sb, s1 = __ldg(sa1 + kb) * sb;
        mbar_wait(full + 8 * s, (kb / F8V2_STAGES) & 1);
        const uint32_t st = base + s * F8_STAGE_BYTES;
        fp8_block_mma(part, st + c * 64 * BK8, st + BM * BK8);
        wgmma_wait0();
        fence_regs(part);
        __syncwarp();
        if (lane == 0) mbar_arrive(empty + 8 * s);
        promote(acc, part, s0, s1);
    }
    store_tile(y, acc, 1.f, r0, n0, lane, M, N);
}

// ---------------------------------------------------------------------------------------------------------------
// NVFP4 v1: bf16 x [M,K], w e2m1 [N, K/2], s e4m3 [N, K/16], global scale; y fp32 [M,N]. Grid: ceil(M/128) *
// ceil(N/128) blocks (1D, tile_of), 256 threads, N4_SMEM_BYTES dynamic shared memory. Needs K % 64 == 0.
extern "C" __global__ void __launch_bounds__(256, 1)
    nvfp4_gemm_sm90a_v1(const __nv_bfloat16* __restrict__ x, const uint8_t* __restrict__ w,
                        const uint8_t* __restrict__ sc, float global_scale, float* __restrict__ y, int M, int N,
                        int K) {
    extern __shared__ uint8_t smem_raw[];
    const uint32_t base = (smem_u32(smem_raw) + 1023u) & ~1023u;
    uint8_t* const gbase = smem_raw + (base - smem_u32(smem_raw));  // the same address, generic
    // Layout: two decoded B tiles (16 KiB each, 1024-aligned), then the ring of stages [x tile | w | scales].
    const uint32_t sBdec = base;
    const uint32_t ring = base + 2 * BN * BK4 * 2;
    const int KT = K / BK4;
    const int tiles_m = (M + BM - 1) / BM, tiles_n = (N + BN - 1) / BN;
    int tm, tn;
    tile_of(blockIdx.x, tiles_m, tiles_n, tm, tn);
    const int m0 = tm * BM, n0 = tn * BN;
    const int tid = threadIdx.x;
    const size_t xrow = static_cast<size_t>(K) * 2, wrow = static_cast<size_t>(K) / 2, srow = K / 16;

    auto load = [&](int kt, int stage) {
        const uint32_t sX = ring + stage * N4_STAGE_BYTES, sW = sX + N4_X_BYTES, sS = sW + N4_W_BYTES;
        const uint8_t* xb = reinterpret_cast<const uint8_t*>(x);
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const int i = tid + 256 * j, r = i >> 3, cc = i & 7;
            const bool ok = m0 + r < M;
            cp_async16(sX + swz(r, cc), xb + (ok ? (m0 + r) * xrow : 0) + kt * (BK4 * 2) + 16 * cc, ok);
        }
        {
            const int r = tid >> 1, cc = tid & 1;  // 128 rows x 32 bytes
            const bool ok = n0 + r < N;
            cp_async16(sW + 32 * r + 16 * cc, w + (ok ? (n0 + r) * wrow : 0) + kt * (BK4 / 2) + 16 * cc, ok);
        }
        if (tid < BN) {  // 128 rows x 4 scale bytes
            const bool ok = n0 + tid < N;
            cp_async4(sS + 4 * tid, sc + (ok ? (n0 + tid) * srow : 0) + kt * (BK4 / 16), ok);
        }
    };

#pragma unroll
    for (int s = 0; s < N4_STAGES - 1; ++s) {
        if (s < KT) load(s, s);
        cp_async_commit();
    }
    const int wg = tid >> 7, warp = (tid >> 5) & 3, lane = tid & 31;
    const int r0 = m0 + 64 * wg + 16 * warp + (lane >> 2);
    float acc[64];
#pragma unroll
    for (int i = 0; i < 64; ++i) acc[i] = 0.f;

#pragma unroll 1
    for (int kt = 0; kt < KT; ++kt) {
        cp_async_wait<N4_STAGES - 2>();
        __syncthreads();  // (A) stage kt is visible to every thread
        // Decode: thread t takes row t/2, half t%2 of the tile's 64 values (16 packed bytes, two scale groups),
        // and writes 32 bf16 = four swizzled 16-byte chunks of the decoded B tile kt % 2, which the wgmmas of
        // kt - 2 read and have finished (waited for at kt - 1 before barrier (B)).
        {
            const int st = kt % N4_STAGES;
            const uint8_t* g = gbase + (ring - base) + st * N4_STAGE_BYTES;
            const int r = tid >> 1, hf = tid & 1;
            const uint4 q = *reinterpret_cast<const uint4*>(g + N4_X_BYTES + 32 * r + 16 * hf);
            const uint8_t* sp = g + N4_X_BYTES + N4_W_BYTES + 4 * r + 2 * hf;
            // e2m1x8_to_float_scaled returns values times 2^-14; fold 2^14 into the group scale.
            const float gs0 = edgefit::e4m3_to_float(sp[0]) * 16384.f, gs1 = edgefit::e4m3_to_float(sp[1]) * 16384.f;
            const uint32_t words[4] = {q.x, q.y, q.z, q.w};
            const uint32_t dst = sBdec + (kt & 1) * (BN * BK4 * 2);
#pragma unroll
            for (int jw = 0; jw < 4; ++jw) {
                float2 f[4];
                edgefit::e2m1x8_to_float_scaled(words[jw], f);
                const float gsc = jw < 2 ? gs0 : gs1;
                // f[a] = (value a, value a + 4): pack values (0,1) (2,3) (4,5) (6,7) as bf16x2 (exact).
                const __nv_bfloat162 p0 = __floats2bfloat162_rn(f[0].x * gsc, f[1].x * gsc);
                const __nv_bfloat162 p1 = __floats2bfloat162_rn(f[2].x * gsc, f[3].x * gsc);
                const __nv_bfloat162 p2 = __floats2bfloat162_rn(f[0].y * gsc, f[1].y * gsc);
                const __nv_bfloat162 p3 = __floats2bfloat162_rn(f[2].y * gsc, f[3].y * gsc);
                asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"r"(dst + swz(r, 4 * hf + jw)),
                             "r"(*reinterpret_cast<const uint32_t*>(&p0)), "r"(*reinterpret_cast<const uint32_t*>(&p1)),
                             "r"(*reinterpret_cast<const uint32_t*>(&p2)), "r"(*reinterpret_cast<const uint32_t*>(&p3))
                             : "memory");
            }
        }
        fence_proxy_async();
        fence_regs(acc);
        wgmma_wait0();  // this warpgroup's wgmmas of kt - 1
        fence_regs(acc);
        __syncthreads();  // (B) decoded tile visible; every warpgroup is past kt - 1, so its stage is free
        const int nk = kt + N4_STAGES - 1;
        if (nk < KT) load(nk, nk % N4_STAGES);
        cp_async_commit();

        const uint32_t sX = ring + (kt % N4_STAGES) * N4_STAGE_BYTES + wg * 64 * 128;
        const uint32_t sB = sBdec + (kt & 1) * (BN * BK4 * 2);
        wgmma_fence();
#pragma unroll
        for (int ks = 0; ks < 4; ++ks) wgmma_m64n128k16_bf16(acc, desc_sw128(sX + 32 * ks), desc_sw128(sB + 32 * ks), 1);
        wgmma_commit();
        fence_regs(acc);
    }
    wgmma_wait0();
    fence_regs(acc);
    store_tile(y, acc, global_scale, r0, n0, lane, M, N);
}
