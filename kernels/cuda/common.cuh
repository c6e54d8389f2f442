// Helpers shared by the edgefit CUDA kernels (sm_90). Header only; every kernel file includes it.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <stdint.h>

// Without EDGEFIT_LAB (the `lab` cargo feature) the variant entry points are not compiled, which leaves helpers only
// they use unreferenced; the lab build, which CI compiles with every warning an error, still reports code that no
// entry point uses.
#ifndef EDGEFIT_LAB
#define EDGEFIT_LAB 0
#endif
#if !EDGEFIT_LAB
#pragma nv_diag_suppress 177
#endif

namespace edgefit {

// Two bf16 packed in one 32-bit word -> two floats. bf16 is the top half of an f32, so this is a shift and a mask.
__device__ __forceinline__ float2 bf16x2_to_float2(uint32_t u) {
    return make_float2(__uint_as_float(u << 16), __uint_as_float(u & 0xffff0000u));
}

// Eight bf16 (one 16-byte load) -> eight floats.
__device__ __forceinline__ void bf16x8_to_float(const uint4 v, float* f) {
    float2 a = bf16x2_to_float2(v.x), b = bf16x2_to_float2(v.y), c = bf16x2_to_float2(v.z), d = bf16x2_to_float2(v.w);
    f[0] = a.x; f[1] = a.y; f[2] = b.x; f[3] = b.y; f[4] = c.x; f[5] = c.y; f[6] = d.x; f[7] = d.y;
}

// Two e4m3 bytes (low byte first) -> two floats through the hardware f16x2 conversion (one instruction on sm_89+).
__device__ __forceinline__ float2 e4m3x2_to_float2(uint32_t two_bytes) {
    __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(two_bytes & 0xffffu), __NV_E4M3);
    return __half22float2(*reinterpret_cast<__half2*>(&h));
}

__device__ __forceinline__ float e4m3_to_float(uint32_t byte) {
    __half_raw h = __nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(byte & 0xffu), __NV_E4M3);
    return __half2float(*reinterpret_cast<__half*>(&h));
}

// Eight NVFP4 values (one 32-bit word, value i in nibble i) -> four float2, scaled by 2^-14: f[a] holds values a
// and a+4. The three magnitude bits of a nibble land in the low exponent bits and the top mantissa bit of an f16
// and the sign bit in its sign: for exponent e >= 1 that f16 is 2^(e-15) (1 + m/2) and for e = 0 the subnormal
// m 2^-15, i.e. exactly the e2m1 value times 2^-14 in both cases (callers fold 2^14 into the block scale). Nibbles
// a and a+4 are 16 bits apart, as the two halves of an f16x2 are, so one shift-and-mask pair decodes both: about
// two integer instructions per value where decoding byte by byte took five (SASS of the first version: 324 LOP3,
// 191 IMAD, 128 SHF per 128 values; it reached 1.6 TB/s at M=1 on the H200).
__device__ __forceinline__ void e2m1x8_to_float_scaled(uint32_t w, float2* f) {
    const uint32_t h[4] = {
        ((w << 9) & 0x0E000E00u) | ((w << 12) & 0x80008000u),
        ((w << 5) & 0x0E000E00u) | ((w << 8) & 0x80008000u),
        ((w << 1) & 0x0E000E00u) | ((w << 4) & 0x80008000u),
        ((w >> 3) & 0x0E000E00u) | (w & 0x80008000u),
    };
#pragma unroll
    for (int a = 0; a < 4; ++a) f[a] = __half22float2(*reinterpret_cast<const __half2*>(&h[a]));
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Programmatic dependent launch (sm_90). A kernel launched with the programmatic-stream-serialization attribute may
// start while the kernel before it in the stream is still running, once every block of that kernel has called
// pdl_launch_dependents (or exited). pdl_wait then blocks until that kernel has finished and its writes are
// visible. So: anything that reads what an earlier kernel wrote, and every global write, goes after pdl_wait; only
// reads of data no kernel writes (weights) may go before it. Without the attribute both are no-ops.
__device__ __forceinline__ void pdl_launch_dependents() { asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); }
__device__ __forceinline__ void pdl_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
// The start of a small kernel of the decode step (Device::launch_small on the Rust side): wait for the kernel before
// it. No explicit trigger: its own dependent launches as its blocks exit, so no chain of kernels gets resident
// beside one that may still read (into its SM's caches) a buffer a later kernel rewrites, and launched plainly (the
// default) the kernel behaves exactly as without this call. Called before any early return, so that every block
// waits (a block that skipped the wait could let the grid end before its predecessor).
__device__ __forceinline__ void pdl_start() { pdl_wait(); }

// (lo, hi) floats -> f16x2, saturating to +-65504 instead of overflowing to infinity.
__device__ __forceinline__ uint32_t pack_f16x2_sat(float lo, float hi) {
    uint32_t r;
    asm("cvt.rn.satfinite.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

// 8- and 16-byte global stores kept whole. NVVM lowers a uint2 or float4 assigned through a cast pointer to 4-byte
// stores in some kernels (the GDN prep's outputs, all of them 4-byte st.global: each warp store
// then fills half of each 32-byte sector it touches, twice the L2 requests per byte); these cannot be split.
__device__ __forceinline__ void st_global_v2(void* p, uint32_t a, uint32_t b) {
    asm volatile("st.global.v2.b32 [%0], {%1, %2};" ::"l"(p), "r"(a), "r"(b) : "memory");
}
__device__ __forceinline__ void st_global_v4(void* p, float4 v) {
    asm volatile("st.global.v4.f32 [%0], {%1, %2, %3, %4};" ::"l"(p), "f"(v.x), "f"(v.y), "f"(v.z), "f"(v.w)
                 : "memory");
}

// y[0 .. len) = 0, shared by the nthreads threads of a grid (this one thread t): 16-byte stores, then the tail.
// y must be 16-byte aligned (the crate's buffers are whole allocations, 256-byte aligned). The NVFP4 fragment
// producers (ops.cu) zero the GEMV's output with it when the GEMV after them adds K splits into it.
__device__ __forceinline__ void zero_f32(float* __restrict__ y, size_t len, size_t t, size_t nthreads) {
    const size_t n4 = len >> 2;
    for (size_t i = t; i < n4; i += nthreads) st_global_v4(y + 4 * i, make_float4(0.f, 0.f, 0.f, 0.f));
    for (size_t i = 4 * n4 + t; i < len; i += nthreads) y[i] = 0.f;
}

// A 16-byte load that bypasses L1 allocation: weights are read exactly once per call.
__device__ __forceinline__ uint4 ld_stream(const void* p) {
    uint4 r;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
                 : "l"(p));
    return r;
}

// Asynchronous copies global -> shared (sm_80+), grouped: cp_async_commit closes a group, cp_async_wait<N> waits
// until at most N of this thread's groups are still in flight (then a barrier makes every thread's copies
// visible). With valid = false nothing is read and the destination is zero-filled (src must still be a valid
// address). The destination is a shared-window address (__cvta_generic_to_shared) or a pointer into shared
// memory. 16 bytes bypass L1 (.cg); 4 bytes cannot (.ca is the only form below 16).
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, bool valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0)
                 : "memory");
}
__device__ __forceinline__ void cp_async4(uint32_t dst, const void* src, bool valid) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(dst), "l"(src), "r"(valid ? 4 : 0)
                 : "memory");
}
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) {
    cp_async16(static_cast<uint32_t>(__cvta_generic_to_shared(dst)), src, valid);
}
__device__ __forceinline__ void cp_async4(void* dst, const void* src, bool valid) {
    cp_async4(static_cast<uint32_t>(__cvta_generic_to_shared(dst)), src, valid);
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

// Tensor-core helpers (mma.sync, ldmatrix) shared by the attention, GEMM, GEMV and GDN kernels.
// d += a b with fp32 accumulators (a: the four A registers, b0/b1 the two B registers): m16n8k16 on bf16 or f16
// operands, m16n8k32 on e4m3.
#define EDGEFIT_MMA_SYNC(NAME, SHAPE_TYPES)                                                                   \
    __device__ __forceinline__ void NAME(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {      \
        asm volatile("mma.sync.aligned." SHAPE_TYPES " {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"  \
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])                                             \
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));                             \
    }
EDGEFIT_MMA_SYNC(mma_bf16_16816, "m16n8k16.row.col.f32.bf16.bf16.f32")
EDGEFIT_MMA_SYNC(mma_f16_16816, "m16n8k16.row.col.f32.f16.f16.f32")
EDGEFIT_MMA_SYNC(mma_e4m3_16832, "m16n8k32.row.col.f32.e4m3.e4m3.f32")
#undef EDGEFIT_MMA_SYNC

// (lo, hi) floats -> bf16x2, each rounded to nearest even, `lo` in the low half.
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
    uint32_t r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

// The shared-window address of a pointer into shared memory.
__device__ __forceinline__ uint32_t smem_u32(const void* p) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Four 8x8 b16 matrices from shared memory (lanes 8i..8i+7 give the row addresses of matrix i; register i of a
// lane holds row lane/4, columns 2(lane%4), +1 of matrix i, or with .trans column lane/4, rows 2(lane%4), +1).
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* smem) { ldmatrix_x4(r, smem_u32(smem)); }
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* smem) {
    ldmatrix_x4_trans(r, smem_u32(smem));
}
// Two 8x8 b16 matrices (lanes 0..15 give the row addresses; the other lanes' are ignored).
__device__ __forceinline__ void ldmatrix_x2(uint32_t (&r)[2], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];" : "=r"(r[0]), "=r"(r[1]) : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x2(uint32_t (&r)[2], const void* smem) { ldmatrix_x2(r, smem_u32(smem)); }

}  // namespace edgefit
