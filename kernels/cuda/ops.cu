// Small per-token ops of the engine on the GPU (sm_90): RMSNorm (plain and fused with the residual add), the gated
// activations, embedding gathers (bf16 and packed int4 tables), argmax, top-k / top-p sampling and neox RoPE. Each
// matches the CPU op of the crate (kernels/src/ops.rs, sampling.rs, attention.rs, linear/int4.rs); the safe entry
// points, their checks and their launches are in kernels/src/cuda/ops.rs.
//
// All of these are memory-bound: one pass over their inputs, 16-byte accesses where the row length allows it (the
// vector path needs only the row length to be a multiple of 4 or 8: cudarc and torch allocations are 256-byte
// aligned), a scalar path otherwise. Row offsets are computed in 64 bits (a 248320 x 5120 table has 1.3e9
// elements). Index math that must match the CPU bit for bit (the int4 decode) avoids FMA contraction explicitly.
//
// Dtypes follow the other GPU kernels: the GEMVs and GEMMs take bf16 activations and write fp32, so the norm and the
// gated activations read fp32 and write bf16 (the next GEMM's input); the embedding gathers write fp32 (the
// residual stream); argmax and sampling read the fp32 logits of the LM head.
#include <cooperative_groups.h>
#include <math_constants.h>

#include "common.cuh"

namespace cg = cooperative_groups;
using namespace edgefit;

namespace {

constexpr int NORM_THREADS = 256;
// Float4s per thread held in registers by the norm's vector path: rows up to 256 * 4 * 8 = 8192 floats are read
// from memory once; longer rows (or rows not a multiple of 4) are re-read for the second pass (L1/L2 hits).
constexpr int NORM_VEC_REGS = 8;

__device__ __forceinline__ float block_sum_256(float v, float* red) {
    v = warp_sum(v);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (lane == 0) red[warp] = v;
    __syncthreads();
    float t = lane < (NORM_THREADS / 32) ? red[lane] : 0.0f;
    t = warp_sum(t);
    return t;  // every thread holds the total
}

__device__ __forceinline__ void store_out(float* o, float v) { *o = v; }
__device__ __forceinline__ void store_out(__nv_bfloat16* o, float v) { *o = __float2bfloat16_rn(v); }

__device__ __forceinline__ void store_out4(float* o, float4 v) { *reinterpret_cast<float4*>(o) = v; }
__device__ __forceinline__ void store_out4(__nv_bfloat16* o, float4 v) {
    __nv_bfloat162 a = __floats2bfloat162_rn(v.x, v.y), b = __floats2bfloat162_rn(v.z, v.w);
    uint2 u;
    u.x = *reinterpret_cast<uint32_t*>(&a);
    u.y = *reinterpret_cast<uint32_t*>(&b);
    *reinterpret_cast<uint2*>(o) = u;
}

// RMSNorm of one row per block: out = h * (1 / sqrtf(mean(h^2) + eps)) * (w + add), h = x (or x + residual, written
// back to residual when ADD). The arithmetic is the CPU's (kernels/csrc/ops_impl.h): f32 sum of squares (here a
// tree, there a sequential loop: they differ by rounding only), `1.0f / sqrtf` (IEEE, nvcc's default
// -prec-div/-prec-sqrt), then `h * s * (w + add)` in that order.
//
// Where the outputs go is the Sink's business: RowSink writes row `row` of a [rows, dim] bf16 or fp32 tensor,
// FragSink (below) the decode GEMVs' B fragments. store4(e, v) gets elements e .. e + 3 (e % 4 == 0, only
// on the vector path), store1(e, v) element e.
template <typename OutT>
struct RowSink {
    OutT* orow;
    __device__ __forceinline__ void store4(int e, float4 v) const { store_out4(orow + e, v); }
    __device__ __forceinline__ void store1(int e, float v) const { store_out(orow + e, v); }
};

template <bool ADD, typename Sink>
__device__ __forceinline__ void rmsnorm_row_to(const float* __restrict__ x, float* __restrict__ residual,
                                               const float* __restrict__ w, float add, float eps, const Sink& sink,
                                               int dim) {
    pdl_start();
    __shared__ float red[NORM_THREADS / 32];
    const size_t row = blockIdx.x;
    const float* xr = x + row * dim;
    float* rr = ADD ? residual + row * dim : nullptr;
    const int tid = threadIdx.x;
    if ((dim & 3) == 0 && dim <= NORM_THREADS * 4 * NORM_VEC_REGS) {
        const int nvec = dim >> 2;
        float4 h[NORM_VEC_REGS];
        float ss = 0.0f;
#pragma unroll
        for (int j = 0; j < NORM_VEC_REGS; ++j) {
            const int v = tid + j * NORM_THREADS;
            if (v < nvec) {
                float4 a = reinterpret_cast<const float4*>(xr)[v];
                if (ADD) {
                    const float4 b = reinterpret_cast<const float4*>(rr)[v];
                    a.x += b.x;
                    a.y += b.y;
                    a.z += b.z;
                    a.w += b.w;
                    reinterpret_cast<float4*>(rr)[v] = a;
                }
                h[j] = a;
                ss += a.x * a.x + a.y * a.y + a.z * a.z + a.w * a.w;
            }
        }
        const float s = 1.0f / sqrtf(block_sum_256(ss, red) / (float)dim + eps);
#pragma unroll
        for (int j = 0; j < NORM_VEC_REGS; ++j) {
            const int v = tid + j * NORM_THREADS;
            if (v < nvec) {
                const float4 wv = reinterpret_cast<const float4*>(w)[v];
                float4 o;
                o.x = h[j].x * s * (wv.x + add);
                o.y = h[j].y * s * (wv.y + add);
                o.z = h[j].z * s * (wv.z + add);
                o.w = h[j].w * s * (wv.w + add);
                sink.store4(4 * v, o);
            }
        }
        return;
    }
    // Scalar path: any length. The first loop writes the summed row back (ADD) and the second reads it again, each
    // thread touching only its own elements, so no barrier is needed between the two.
    float ss = 0.0f;
    for (int i = tid; i < dim; i += NORM_THREADS) {
        float a = xr[i];
        if (ADD) {
            a += rr[i];
            rr[i] = a;
        }
        ss += a * a;
    }
    const float s = 1.0f / sqrtf(block_sum_256(ss, red) / (float)dim + eps);
    for (int i = tid; i < dim; i += NORM_THREADS) {
        const float a = ADD ? rr[i] : xr[i];
        sink.store1(i, a * s * (w[i] + add));
    }
}

// Both outputs of add_rmsnorm_dual: row `row` of an fp32 and of a bf16 [rows, dim] tensor.
struct DualSink {
    float* f;
    __nv_bfloat16* b;
    __device__ __forceinline__ void store4(int e, float4 v) const {
        store_out4(f + e, v);
        store_out4(b + e, v);
    }
    __device__ __forceinline__ void store1(int e, float v) const {
        store_out(f + e, v);
        store_out(b + e, v);
    }
};

template <bool ADD, typename OutT>
__device__ __forceinline__ void rmsnorm_row(const float* __restrict__ x, float* __restrict__ residual,
                                            const float* __restrict__ w, float add, float eps,
                                            OutT* __restrict__ out, int dim) {
    rmsnorm_row_to<ADD>(x, residual, w, add, eps, RowSink<OutT>{out + static_cast<size_t>(blockIdx.x) * dim}, dim);
}

// The decode GEMVs' B fragments (gemv.cu: gemv_act_frag_body's layout and rounding; FMT 0: FP8's pair order,
// consecutive values; FMT 1: NVFP4's, (a, a + 4) of each 8) of token row = blockIdx.x, nt = 1 for up to 8 rows,
// else 2: each value rounded to bf16 as rmsnorm_bf16 stores it, then to f16 with saturation as
// gemv_act_frag_{fp8,nvfp4} converts that bf16, so the fragments are bit for bit those of rmsnorm_bf16 followed by
// the GEMV's fragment kernel. FP8: four values land as one 8-byte half of a 16-byte fragment entry. NVFP4: four
// consecutive values are the low (first four of the 8) or high (last four) f16 halves of the entry's four words,
// four 2-byte stores.
template <int FMT>
struct FragSink {
    uint32_t* xf;  // the fragments: [ceil(dim/128)][nt][4][32] entries of 16 bytes
    int tok, nt;
    __device__ __forceinline__ uint32_t pair(float lo, float hi) const {
        return pack_f16x2_sat(__bfloat162float(__float2bfloat16_rn(lo)), __bfloat162float(__float2bfloat16_rn(hi)));
    }
    __device__ __forceinline__ void store4(int e, float4 v) const {
        // Value e of token tok: chunk c = e / 128, lane = 4 (tok % 8) + (e % 128) / 32, v = (e % 32) / 8, and
        // inside the entry (e % 8) / 4: FP8's 8-byte half, NVFP4's half of each word.
        const int c = e >> 7, r = e & 127;
        const int lane = 4 * (tok & 7) + (r >> 5), vv = (r >> 3) & 3, half = (r >> 2) & 1;
        const size_t entry = ((static_cast<size_t>(c) * nt + (tok >> 3)) * 4 + vv) * 32 + lane;
        const uint32_t p01 = pair(v.x, v.y), p23 = pair(v.z, v.w);
        if (FMT == 0) {
            reinterpret_cast<uint2*>(xf)[2 * entry + half] = make_uint2(p01, p23);
        } else {
            uint16_t* h = reinterpret_cast<uint16_t*>(xf) + 8 * entry + half;  // word w's half: h[2 w]
            h[0] = static_cast<uint16_t>(p01);
            h[2] = static_cast<uint16_t>(p01 >> 16);
            h[4] = static_cast<uint16_t>(p23);
            h[6] = static_cast<uint16_t>(p23 >> 16);
        }
    }
    __device__ __forceinline__ void store1(int, float) const {}  // never: the entries need dim % 16 == 0
    // The sink of this block's token row: rows are blocks along x, 8 per fragment tile.
    static __device__ __forceinline__ FragSink of_block(uint32_t* xf) {
        return FragSink{xf, static_cast<int>(blockIdx.x), gridDim.x <= 8 ? 1 : 2};
    }
};

// Gated activations, the CPU's formulas (kernels/csrc/ops_impl.h, seq_common.h) with CUDA's accurate expf / erff.
__device__ __forceinline__ float silu_f(float g) { return g / (1.0f + expf(-g)); }
__device__ __forceinline__ float gelu_f(float g) { return 0.5f * g * (1.0f + erff(g * 0.70710678f)); }

constexpr int GLU_THREADS = 256;

template <bool GELU>
__device__ __forceinline__ float act(float g) {
    return GELU ? gelu_f(g) : silu_f(g);
}

// out[r][j] = act(gate_up[r][j]) * gate_up[r][inter + j]. Grid: (rows, ceil(inter / (256 * 4))): one block per row
// chunk of 1024 outputs; four per thread through float4 loads when inter % 4 == 0 (then both halves and the bf16
// output row are 16- and 8-byte aligned), scalar otherwise.
template <bool GELU, typename Sink>
__device__ __forceinline__ void glu_chunk_to(const float* __restrict__ gate_up, const Sink& sink, int inter) {
    pdl_start();
    const size_t row = blockIdx.x;
    const float* g = gate_up + row * 2 * (size_t)inter;
    const float* u = g + inter;
    const int j = (blockIdx.y * GLU_THREADS + threadIdx.x) * 4;
    if (j >= inter) return;
    if ((inter & 3) == 0) {
        const float4 gv = *reinterpret_cast<const float4*>(g + j);
        const float4 uv = *reinterpret_cast<const float4*>(u + j);
        sink.store4(j, make_float4(act<GELU>(gv.x) * uv.x, act<GELU>(gv.y) * uv.y, act<GELU>(gv.z) * uv.z,
                                   act<GELU>(gv.w) * uv.w));
    } else {
        const int end = min(j + 4, inter);
        for (int i = j; i < end; ++i) sink.store1(i, act<GELU>(g[i]) * u[i]);
    }
}

template <bool GELU>
__device__ __forceinline__ void glu_chunk(const float* __restrict__ gate_up, __nv_bfloat16* __restrict__ out,
                                          int inter) {
    glu_chunk_to<GELU>(gate_up, RowSink<__nv_bfloat16>{out + blockIdx.x * (size_t)inter}, inter);
}

// glu_chunk straight into a decode GEMV's B fragments (FragSink<FMT>, the same bits as *_and_mul_bf16 followed
// by gemv_act_frag_fp8 / _nvfp4) for up to 16 token rows: the down projection's activations without the fragment
// kernel's launch. Needs inter % 16 == 0 (the Rust side checks); grid (rows, ceil(ceil(inter/128)*128 / 1024)):
// threads past inter but inside its last 128-chunk write zeros. A programmatic dependent, as rmsnorm_frag_fp8.
// With y (not null) the grid also zeroes y[0 .. ylen), the output of a GEMV after it that adds K splits into it
// (Gpu::silu_and_mul_nvfp4_gemv), as gemv_act_frag_nvfp4_zero does for the unfused path.
template <bool GELU, int FMT>
__device__ __forceinline__ void glu_frag_chunk(const float* __restrict__ gate_up, uint32_t* __restrict__ xf,
                                               int inter, float* __restrict__ y, unsigned long long ylen) {
    pdl_launch_dependents();
    pdl_wait();
    if (y != nullptr)
        zero_f32(y, ylen, (static_cast<size_t>(blockIdx.x) * gridDim.y + blockIdx.y) * GLU_THREADS + threadIdx.x,
                 static_cast<size_t>(gridDim.x) * gridDim.y * GLU_THREADS);
    const FragSink<FMT> sink = FragSink<FMT>::of_block(xf);
    const int j = (blockIdx.y * GLU_THREADS + threadIdx.x) * 4;
    if (j >= inter) {
        if (j < ((inter + 127) & ~127)) sink.store4(j, make_float4(0.f, 0.f, 0.f, 0.f));
        return;
    }
    glu_chunk_to<GELU>(gate_up, sink, inter);
}

// x (fp32 [rows <= 16, dim]) straight into a decode GEMV's B fragments: cast_f32_to_bf16 followed by the GEMV's
// fragment kernel in one launch (a linear whose input no fused kernel writes, e.g. the GDN out_proj). FragSink
// rounds to nearest even to bf16 as f32_to_bf16_bits does (they differ only in which NaN a NaN becomes), then to
// f16 as the fragment kernel. Grid, padding, PDL and (y, ylen) as glu_frag_chunk; needs dim % 16 == 0.
template <int FMT>
__device__ __forceinline__ void cast_frag_chunk(const float* __restrict__ x, uint32_t* __restrict__ xf, int dim,
                                                float* __restrict__ y, unsigned long long ylen) {
    pdl_launch_dependents();
    pdl_wait();
    if (y != nullptr)
        zero_f32(y, ylen, (static_cast<size_t>(blockIdx.x) * gridDim.y + blockIdx.y) * GLU_THREADS + threadIdx.x,
                 static_cast<size_t>(gridDim.x) * gridDim.y * GLU_THREADS);
    const FragSink<FMT> sink = FragSink<FMT>::of_block(xf);
    const int j = (blockIdx.y * GLU_THREADS + threadIdx.x) * 4;
    if (j >= dim) {
        if (j < ((dim + 127) & ~127)) sink.store4(j, make_float4(0.f, 0.f, 0.f, 0.f));
        return;
    }
    sink.store4(j, *reinterpret_cast<const float4*>(x + static_cast<size_t>(blockIdx.x) * dim + j));
}

constexpr int GATHER_THREADS = 128;

// Monotone map of a float onto u32: a larger float (IEEE total order, -0 below +0, as Rust's total_cmp) gets a
// larger key. NaNs land above +inf (positive) or below -inf (negative); callers flag them separately.
__device__ __forceinline__ uint32_t float_key(float f) {
    const uint32_t u = __float_as_uint(f);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
__device__ __forceinline__ float key_float(uint32_t k) {
    return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}

// ---- argmax -------------------------------------------------------------------------------------------------------
constexpr int ARGMAX_THREADS = 1024;
constexpr int ARGMAX_CLUSTER = 8;

// (value, index) with the CPU's order: the larger value, the lower index on ties.
__device__ __forceinline__ bool better(float v, uint32_t i, float bv, uint32_t bi) {
    return v > bv || (v == bv && i < bi);
}

struct ArgBest {
    float v;
    uint32_t i;
    int nan;
};

// Reduces elements [lo, hi) of `row` over the block; thread 0 gets the result. Unvisited threads hold
// (-inf, UINT32_MAX), which loses to every real element (an all -inf row still answers its first index, as the CPU).
__device__ ArgBest argmax_block_range(const float* __restrict__ row, uint32_t lo, uint32_t hi, bool vec) {
    float bv = -CUDART_INF_F;
    uint32_t bi = 0xffffffffu;
    int nan = 0;
    // A thread visits its elements in increasing index order, so a strict `>` keeps the first of equal values.
    auto take4 = [&](const float4 v, uint32_t i) {
        nan |= isnan(v.x) | isnan(v.y) | isnan(v.z) | isnan(v.w);
        if (v.x > bv) { bv = v.x; bi = i; }
        if (v.y > bv) { bv = v.y; bi = i + 1; }
        if (v.z > bv) { bv = v.z; bi = i + 2; }
        if (v.w > bv) { bv = v.w; bi = i + 3; }
        // An all -inf start: a thread's first element must be taken even though it equals the initial -inf.
        if (bi == 0xffffffffu) { bv = v.x; bi = i; }
    };
    if (vec) {  // lo and hi are multiples of 4 (hi is a chunk end or the row's end, itself a multiple of 4)
        constexpr uint32_t STEP = 4 * ARGMAX_THREADS;
        uint32_t i = lo + 4 * threadIdx.x;
        // Four 16-byte loads in flight per thread (a row of one 248320-wide cluster is only 16 loads per thread:
        // with one at a time, each block waited out eight DRAM round trips).
        for (; i + 3 * STEP < hi; i += 4 * STEP) {
            float4 v[4];
#pragma unroll
            for (int u = 0; u < 4; ++u) v[u] = *reinterpret_cast<const float4*>(row + i + u * STEP);
#pragma unroll
            for (int u = 0; u < 4; ++u) take4(v[u], i + u * STEP);
        }
        for (; i < hi; i += STEP) take4(*reinterpret_cast<const float4*>(row + i), i);
    } else {
        for (uint32_t i = lo + threadIdx.x; i < hi; i += ARGMAX_THREADS) {
            const float v = row[i];
            nan |= isnan(v);
            if (v > bv || bi == 0xffffffffu) { bv = v; bi = i; }
        }
    }
    // A NaN never wins a comparison, so bv/bi describe the non-NaN elements; the flag reports the NaN.
    if (isnan(bv)) { bv = -CUDART_INF_F; }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
        const uint32_t oi = __shfl_xor_sync(0xffffffffu, bi, o);
        if (better(ov, oi, bv, bi)) { bv = ov; bi = oi; }
    }
    nan = __any_sync(0xffffffffu, nan);
    __shared__ float sv[32];
    __shared__ uint32_t si[32];
    __shared__ int sn[32];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (lane == 0) { sv[warp] = bv; si[warp] = bi; sn[warp] = nan; }
    __syncthreads();
    ArgBest r{-CUDART_INF_F, 0xffffffffu, 0};
    if (warp == 0) {
        bv = sv[lane];
        bi = si[lane];
        nan = sn[lane];
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
            const uint32_t oi = __shfl_xor_sync(0xffffffffu, bi, o);
            if (better(ov, oi, bv, bi)) { bv = ov; bi = oi; }
        }
        nan = __any_sync(0xffffffffu, nan);
        r = ArgBest{bv, bi, nan};
    }
    return r;
}

// ---- sampling -----------------------------------------------------------------------------------------------------
constexpr int SAMPLE_THREADS = 1024;
constexpr int SAMPLE_KMAX = 1024;  // the candidates are sorted in shared memory, one per thread

// PCG32 XSH-RR, the CPU's Pcg32::next_u32 (kernels/src/sampling.rs).
__device__ __forceinline__ uint32_t pcg32_next(uint64_t& state, uint64_t inc) {
    const uint64_t old = state;
    state = old * 6364136223846793005ull + inc;
    const uint32_t xorshifted = (uint32_t)(((old >> 18) ^ old) >> 27);
    const uint32_t rot = (uint32_t)(old >> 59);
    return __funnelshift_r(xorshifted, xorshifted, rot);
}

// Pcg32::next_f64: 53 random bits.
__device__ __forceinline__ double pcg32_f64(uint64_t& state, uint64_t inc) {
    const uint64_t hi = (uint64_t)pcg32_next(state, inc) << 21;
    const uint64_t lo = (uint64_t)(pcg32_next(state, inc) >> 11);
    return (double)(hi | lo) * (1.0 / 9007199254740992.0);
}

// Inclusive scan over the block (1024 threads) of one double per thread; `red` holds 32 doubles.
__device__ __forceinline__ double block_scan_f64(double v, double* red) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const double t = __shfl_up_sync(0xffffffffu, v, o);
        if (lane >= o) v += t;
    }
    if (lane == 31) red[warp] = v;
    __syncthreads();
    if (warp == 0) {
        double t = red[lane];
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const double s = __shfl_up_sync(0xffffffffu, t, o);
            if (lane >= o) t += s;
        }
        red[lane] = t;
    }
    __syncthreads();
    if (warp > 0) v += red[warp - 1];
    __syncthreads();  // red is reused by the next call
    return v;
}

constexpr int SAMPLE_CLUSTER = 8;

// Calls f(value, index) for every element of row[lo, hi), each once, in no particular order across threads. With
// `vec` (the row length a multiple of 4, lo a multiple of 4, hi a multiple of 4 or the row's end, itself one) two
// 16-byte loads per thread are in flight per step; the scalar path serves any length.
template <typename F>
__device__ __forceinline__ void visit_range(const float* __restrict__ row, uint32_t lo, uint32_t hi, bool vec, F&& f) {
    if (vec) {
        constexpr uint32_t STEP = 4 * SAMPLE_THREADS;
        uint32_t i = lo + 4 * threadIdx.x;
        // i and hi are multiples of 4, so i + STEP < hi leaves all of [i + STEP, i + STEP + 4) inside the range.
        for (; i + STEP < hi; i += 2 * STEP) {
            const float4 a = *reinterpret_cast<const float4*>(row + i);
            const float4 b = *reinterpret_cast<const float4*>(row + i + STEP);
            f(a.x, i); f(a.y, i + 1); f(a.z, i + 2); f(a.w, i + 3);
            f(b.x, i + STEP); f(b.y, i + STEP + 1); f(b.z, i + STEP + 2); f(b.w, i + STEP + 3);
        }
        if (i < hi) {
            const float4 a = *reinterpret_cast<const float4*>(row + i);
            f(a.x, i); f(a.y, i + 1); f(a.z, i + 2); f(a.w, i + 3);
        }
    } else {
        for (uint32_t i = lo + threadIdx.x; i < hi; i += SAMPLE_THREADS) f(row[i], i);
    }
}

// One radix-select step, run by warp 0 (all 32 lanes): in `hist` (256 counts of the digit at `shift` among the keys
// still matching the selected prefix), finds the digit where the count from the top reaches `remaining`, and
// writes the extended prefix, the count still needed inside that digit, and the digit's count. 8 bins per lane,
// lane 0 owning the highest bins, an inclusive warp scan over the lanes.
__device__ __forceinline__ void radix_pick_digit(const uint32_t* hist, uint32_t remaining, uint32_t prefix, int shift,
                                                 uint32_t* s_prefix, uint32_t* s_remaining, uint32_t* s_count) {
    const int lane = threadIdx.x & 31;
    uint32_t c[8], sum = 0;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
        c[j] = hist[255 - (8 * lane + j)];
        sum += c[j];
    }
    uint32_t incl = sum;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const uint32_t t = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o) incl += t;
    }
    const uint32_t excl = incl - sum;
    if (excl < remaining && remaining <= incl) {
        uint32_t above = excl;
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            if (above < remaining && remaining <= above + c[j]) {
                const uint32_t digit = 255 - (8 * lane + j);
                *s_prefix = prefix | (digit << shift);
                *s_remaining = remaining - above;
                *s_count = c[j];
            }
            above += c[j];
        }
    }
}

// The candidates' sort key: ascending (~key, id) is descending logit (total order), lower id first.
__device__ __forceinline__ unsigned long long cand_key(uint32_t key, uint32_t id) {
    return ((unsigned long long)(~key) << 32) | id;
}

// The ordered tie pass (every thread of the block calls it): writes the ids i in [lo, hi) with float_key(row[i]) ==
// T, lowest first, to cand[n_gt + taken], taken counting from `taken0` (the ties at lower ids, elsewhere), while
// taken < need_eq. One element per thread per round, a block-wide prefix count of the ties in id order. `cand` may
// be another block's shared memory (a cluster's rank 0).
__device__ void gather_ties_in_order(const float* __restrict__ row, uint32_t lo, uint32_t hi, uint32_t T,
                                     uint32_t n_gt, uint32_t need_eq, uint32_t taken0, unsigned long long* cand) {
    __shared__ uint32_t wcount[SAMPLE_THREADS / 32];
    __shared__ uint32_t s_taken;
    if (taken0 >= need_eq) return;  // uniform over the block
    const int tid = threadIdx.x, lane = tid & 31;
    if (tid == 0) s_taken = taken0;
    __syncthreads();
    for (uint32_t base = lo; base < hi; base += SAMPLE_THREADS) {
        const uint32_t i = base + tid;
        const bool tie = i < hi && float_key(row[i]) == T;
        const uint32_t ballot = __ballot_sync(0xffffffffu, tie);
        if (lane == 0) wcount[tid >> 5] = __popc(ballot);
        __syncthreads();
        uint32_t before = __popc(ballot & ((1u << lane) - 1));
        for (int w = 0; w < (tid >> 5); ++w) before += wcount[w];
        const uint32_t taken = s_taken;
        if (tie && taken + before < need_eq) cand[n_gt + taken + before] = cand_key(T, i);
        __syncthreads();
        if (tid == 0) {
            uint32_t total = 0;
            for (int w = 0; w < SAMPLE_THREADS / 32; ++w) total += wcount[w];
            s_taken = taken + total;
        }
        __syncthreads();
        if (s_taken >= need_eq) break;  // uniform
    }
}

// Steps 3-4 of the sampler on the k candidates in cand[0, k) (any order; every thread of the block calls it after a
// barrier that made them visible): sorts them (bitonic, over the next power of two >= k only), then the f64
// probabilities, the top-p prefix, the draw with the row's generator (advanced only when more than one candidate
// is left) and the token into *out_row.
__device__ void sample_finish(unsigned long long* cand, uint32_t k, float temperature, float top_p,
                              uint32_t* __restrict__ rng_row, uint32_t* __restrict__ out_row) {
    __shared__ double red[32];
    __shared__ uint32_t s_keep, s_pick;
    __shared__ double s_total, s_kept, s_u;
    const int tid = threadIdx.x;
    uint32_t kp = 1;
    while (kp < k) kp <<= 1;
    for (uint32_t j = k + tid; j < kp; j += SAMPLE_THREADS) cand[j] = ~0ull;
    if (tid == 0) {
        s_keep = 0xffffffffu;
        s_pick = 0xffffffffu;
    }
    __syncthreads();
    for (uint32_t size = 2; size <= kp; size <<= 1) {
        for (uint32_t stride = size >> 1; stride > 0; stride >>= 1) {
            const uint32_t j = tid, p = j ^ stride;
            if (j < kp && p > j) {  // p < kp too: kp is a power of two above both j and stride
                const unsigned long long a = cand[j], b = cand[p];
                const bool up = (j & size) == 0;
                if ((a > b) == up) {
                    cand[j] = b;
                    cand[p] = a;
                }
            }
            __syncthreads();
        }
    }
    if (k == 1) {  // greedy or top_k = 1: one candidate, no draw
        if (tid == 0) *out_row = (uint32_t)cand[0];
        return;
    }
    const double inv_t = 1.0 / (double)temperature;
    const double top = (double)key_float(~(uint32_t)(cand[0] >> 32)) * inv_t;
    const bool live = (uint32_t)tid < k;
    // Explicit roundings: a contracted fma would round differently from the CPU's `l * inv_t - top`.
    const double p =
        live ? exp(__dsub_rn(__dmul_rn((double)key_float(~(uint32_t)(cand[tid] >> 32)), inv_t), top)) : 0.0;
    const double total = block_scan_f64(p, red);
    // The block's total is the last thread's inclusive sum.
    if (tid == SAMPLE_THREADS - 1) s_total = total;
    __syncthreads();
    const double q = p / s_total;
    const double mass = block_scan_f64(q, red);
    if (live && mass >= (double)top_p) atomicMin(&s_keep, (uint32_t)tid + 1);
    __syncthreads();
    const uint32_t keep = s_keep == 0xffffffffu ? k : s_keep;
    if (keep == 1) {
        if (tid == 0) *out_row = (uint32_t)cand[0];
        return;
    }
    if ((uint32_t)tid == keep - 1) s_kept = mass;
    if (tid == 0) {
        uint64_t state = (uint64_t)rng_row[0] | ((uint64_t)rng_row[1] << 32);
        const uint64_t inc = (uint64_t)rng_row[2] | ((uint64_t)rng_row[3] << 32);
        s_u = pcg32_f64(state, inc);
        rng_row[0] = (uint32_t)state;
        rng_row[1] = (uint32_t)(state >> 32);
    }
    __syncthreads();
    const bool kept = (uint32_t)tid < keep;
    const double acc = block_scan_f64(kept ? q / s_kept : 0.0, red);
    if (kept && s_u < acc) atomicMin(&s_pick, (uint32_t)tid);
    __syncthreads();
    if (tid == 0) {
        const uint32_t pick = s_pick == 0xffffffffu ? keep - 1 : s_pick;
        *out_row = (uint32_t)cand[pick];
    }
}

}  // namespace

// ---- entry points ---------------------------------------------------------------------------------------------

// RMSNorm, one block of 256 threads per row: x fp32 [rows, dim], w fp32 [dim], out bf16 or fp32 [rows, dim].
// `add` is 0 (weight form w) or 1 (form 1 + w).
extern "C" __global__ void __launch_bounds__(NORM_THREADS)
    rmsnorm_bf16(const float* __restrict__ x, const float* __restrict__ w, float add, float eps,
                 __nv_bfloat16* __restrict__ out, int dim) {
    rmsnorm_row<false>(x, nullptr, w, add, eps, out, dim);
}
extern "C" __global__ void __launch_bounds__(NORM_THREADS)
    rmsnorm_f32(const float* __restrict__ x, const float* __restrict__ w, float add, float eps,
                float* __restrict__ out, int dim) {
    rmsnorm_row<false>(x, nullptr, w, add, eps, out, dim);
}
// add_rmsnorm_f32 that also writes its output rounded to bf16 (rmsnorm_bf16's rounding) into out_b: a layer's input
// for both a dense GEMV (f32) and the tile GEMVs (bf16), without a cast kernel between.
extern "C" __global__ void __launch_bounds__(NORM_THREADS)
    add_rmsnorm_dual(const float* __restrict__ x, float* __restrict__ residual, const float* __restrict__ w, float add,
                     float eps, float* __restrict__ out, __nv_bfloat16* __restrict__ out_b, int dim) {
    const size_t row = blockIdx.x;
    rmsnorm_row_to<true>(x, residual, w, add, eps, DualSink{out + row * dim, out_b + row * dim}, dim);
}
// Fused residual add + RMSNorm: residual += x (written back, fp32), out = rmsnorm(residual).
extern "C" __global__ void __launch_bounds__(NORM_THREADS)
    add_rmsnorm_bf16(const float* __restrict__ x, float* __restrict__ residual, const float* __restrict__ w, float add,
                     float eps, __nv_bfloat16* __restrict__ out, int dim) {
    rmsnorm_row<true>(x, residual, w, add, eps, out, dim);
}
extern "C" __global__ void __launch_bounds__(NORM_THREADS)
    add_rmsnorm_f32(const float* __restrict__ x, float* __restrict__ residual, const float* __restrict__ w, float add,
                    float eps, float* __restrict__ out, int dim) {
    rmsnorm_row<true>(x, residual, w, add, eps, out, dim);
}

// RMSNorm (ADD: after residual += x) of up to 16 token rows straight into a decode GEMV's B fragments
// (Gpu::rmsnorm_fp8_fragments / rmsnorm_nvfp4_fragments; FragSink<FMT> above): the fragment kernel's launch saved. Needs dim % 16 == 0 and
// dim <= 8192 (the vector path; the Rust side checks). The values of the last 128-chunk past dim are zeroed here.
// With y (not null) the blocks also zero y[0 .. ylen), the output of a GEMV after it that adds K splits into it
// (Gpu::rmsnorm_nvfp4_gemv), as gemv_act_frag_nvfp4_zero does for the unfused path.
template <bool ADD, int FMT>
__device__ __forceinline__ void rmsnorm_frag_body(const float* __restrict__ x, float* __restrict__ residual,
                                                  const float* __restrict__ w, float add, float eps,
                                                  uint32_t* __restrict__ xf, int dim, float* __restrict__ y,
                                                  unsigned long long ylen) {
    // Launched as a programmatic dependent (common.cuh): the GEMV after it gets resident early, and this kernel's
    // own launch overlaps the kernel before it, which may still read the fragments (the last GEMV) or write x
    // (or read y).
    pdl_launch_dependents();
    pdl_wait();
    if (y != nullptr)
        zero_f32(y, ylen, static_cast<size_t>(blockIdx.x) * NORM_THREADS + threadIdx.x,
                 static_cast<size_t>(gridDim.x) * NORM_THREADS);
    const FragSink<FMT> sink = FragSink<FMT>::of_block(xf);
    rmsnorm_row_to<ADD>(x, residual, w, add, eps, sink, dim);
    const int padded = (dim + 127) & ~127;
    for (int e = dim + 4 * static_cast<int>(threadIdx.x); e < padded; e += 4 * NORM_THREADS)
        sink.store4(e, make_float4(0.f, 0.f, 0.f, 0.f));
}
// The producers' last two arguments (y, ylen): the output to zero for the GEMV after them, or (nullptr, 0). Only
// the NVFP4 GEMV adds K splits into its output (nvfp4_tiles_auto); FP8's fragment GEMV writes it whole, so its
// producers are always given (nullptr, 0) and take the pair only to keep one signature.
extern "C" __global__ void __launch_bounds__(NORM_THREADS)
    rmsnorm_frag_fp8(const float* __restrict__ x, const float* __restrict__ w, float add, float eps,
                     uint32_t* __restrict__ xf, int dim, float* __restrict__ y, unsigned long long ylen) {
    rmsnorm_frag_body<false, 0>(x, nullptr, w, add, eps, xf, dim, y, ylen);
}
extern "C" __global__ void __launch_bounds__(NORM_THREADS)
    add_rmsnorm_frag_fp8(const float* __restrict__ x, float* __restrict__ residual, const float* __restrict__ w,
                         float add, float eps, uint32_t* __restrict__ xf, int dim, float* __restrict__ y,
                         unsigned long long ylen) {
    rmsnorm_frag_body<true, 0>(x, residual, w, add, eps, xf, dim, y, ylen);
}
// The same into the NVFP4 decode GEMV's fragments (Gpu::rmsnorm_nvfp4_fragments; pair order (a, a + 4)).
extern "C" __global__ void __launch_bounds__(NORM_THREADS)
    rmsnorm_frag_nvfp4(const float* __restrict__ x, const float* __restrict__ w, float add, float eps,
                       uint32_t* __restrict__ xf, int dim, float* __restrict__ y, unsigned long long ylen) {
    rmsnorm_frag_body<false, 1>(x, nullptr, w, add, eps, xf, dim, y, ylen);
}
extern "C" __global__ void __launch_bounds__(NORM_THREADS)
    add_rmsnorm_frag_nvfp4(const float* __restrict__ x, float* __restrict__ residual, const float* __restrict__ w,
                           float add, float eps, uint32_t* __restrict__ xf, int dim, float* __restrict__ y,
                           unsigned long long ylen) {
    rmsnorm_frag_body<true, 1>(x, residual, w, add, eps, xf, dim, y, ylen);
}

// Gated activations: gate_up fp32 [rows, 2 * inter] (gate first), out bf16 [rows, inter].
extern "C" __global__ void __launch_bounds__(GLU_THREADS)
    silu_and_mul_bf16(const float* __restrict__ gate_up, __nv_bfloat16* __restrict__ out, int inter) {
    glu_chunk<false>(gate_up, out, inter);
}
extern "C" __global__ void __launch_bounds__(GLU_THREADS)
    gelu_and_mul_bf16(const float* __restrict__ gate_up, __nv_bfloat16* __restrict__ out, int inter) {
    glu_chunk<true>(gate_up, out, inter);
}

// *_and_mul into the decode GEMVs' fragments (glu_frag_chunk; FP8's and NVFP4's pair order): gate_up fp32
// [rows <= 16, 2 * inter]; (y, ylen) as the norm producers'.
extern "C" __global__ void __launch_bounds__(GLU_THREADS)
    silu_and_mul_frag_fp8(const float* __restrict__ gate_up, uint32_t* __restrict__ xf, int inter,
                          float* __restrict__ y, unsigned long long ylen) {
    glu_frag_chunk<false, 0>(gate_up, xf, inter, y, ylen);
}
extern "C" __global__ void __launch_bounds__(GLU_THREADS)
    gelu_and_mul_frag_fp8(const float* __restrict__ gate_up, uint32_t* __restrict__ xf, int inter,
                          float* __restrict__ y, unsigned long long ylen) {
    glu_frag_chunk<true, 0>(gate_up, xf, inter, y, ylen);
}
extern "C" __global__ void __launch_bounds__(GLU_THREADS)
    silu_and_mul_frag_nvfp4(const float* __restrict__ gate_up, uint32_t* __restrict__ xf, int inter,
                            float* __restrict__ y, unsigned long long ylen) {
    glu_frag_chunk<false, 1>(gate_up, xf, inter, y, ylen);
}
extern "C" __global__ void __launch_bounds__(GLU_THREADS)
    gelu_and_mul_frag_nvfp4(const float* __restrict__ gate_up, uint32_t* __restrict__ xf, int inter,
                            float* __restrict__ y, unsigned long long ylen) {
    glu_frag_chunk<true, 1>(gate_up, xf, inter, y, ylen);
}

// The cast into the decode GEMVs' fragments (cast_frag_chunk; FP8's and NVFP4's pair order): x fp32
// [rows <= 16, dim]; (y, ylen) as the norm producers'.
extern "C" __global__ void __launch_bounds__(GLU_THREADS)
    cast_frag_fp8(const float* __restrict__ x, uint32_t* __restrict__ xf, int dim, float* __restrict__ y,
                  unsigned long long ylen) {
    cast_frag_chunk<0>(x, xf, dim, y, ylen);
}
extern "C" __global__ void __launch_bounds__(GLU_THREADS)
    cast_frag_nvfp4(const float* __restrict__ x, uint32_t* __restrict__ xf, int dim, float* __restrict__ y,
                    unsigned long long ylen) {
    cast_frag_chunk<1>(x, xf, dim, y, ylen);
}

// Embedding gather from a bf16 table [vocab, dim] into fp32 out [n, dim], one block of 128 threads per id. An id >=
// vocab (the ids live on the device, so the host cannot check them) reads nothing and fills its row with NaN, which
// every later op carries to the logits, where argmax and sampling flag it.
//
// DEPTH is the number of 16-byte loads a thread issues before its first store. The rows are random in a table far
// larger than L2 (248320 x 5120 bf16 = 2.5 GB), so every load pays a full DRAM (and often TLB) miss: with DEPTH 2 a
// 5120-wide row (640 loads, 5 per thread) waited out three round trips and reached 57% of copy bandwidth on the
// H200; DEPTH 8 issues a whole row of up to 8192 values at once (8 x 16 B = 32 registers per thread).
// `embedding_gather_bf16` is DEPTH 8, `embedding_gather_bf16_d2` the former kernel, kept for the benchmark.
template <int DEPTH>
__device__ __forceinline__ void gather_bf16_row(const uint16_t* __restrict__ table, const uint32_t* __restrict__ ids,
                                                float* __restrict__ out, uint32_t vocab, int dim) {
    const uint32_t id = ids[blockIdx.x];
    float* o = out + (size_t)blockIdx.x * dim;
    if (id >= vocab) {
        for (int i = threadIdx.x; i < dim; i += GATHER_THREADS) o[i] = CUDART_NAN_F;
        return;
    }
    const uint16_t* t = table + (size_t)id * dim;
    if ((dim & 7) == 0) {  // 16-byte loads of 8 bf16, two float4 stores each
        const int nv = dim >> 3;
        for (int base = 0; base < nv; base += DEPTH * GATHER_THREADS) {
            uint4 raw[DEPTH];
#pragma unroll
            for (int u = 0; u < DEPTH; ++u) {
                const int v = base + u * GATHER_THREADS + threadIdx.x;
                if (v < nv) raw[u] = ld_stream(t + 8 * (size_t)v);
            }
#pragma unroll
            for (int u = 0; u < DEPTH; ++u) {
                const int v = base + u * GATHER_THREADS + threadIdx.x;
                if (v < nv) {
                    float f[8];
                    bf16x8_to_float(raw[u], f);
                    reinterpret_cast<float4*>(o)[2 * v] = make_float4(f[0], f[1], f[2], f[3]);
                    reinterpret_cast<float4*>(o)[2 * v + 1] = make_float4(f[4], f[5], f[6], f[7]);
                }
            }
        }
    } else {
        for (int i = threadIdx.x; i < dim; i += GATHER_THREADS) o[i] = __uint_as_float((uint32_t)t[i] << 16);
    }
}

extern "C" __global__ void __launch_bounds__(GATHER_THREADS)
    embedding_gather_bf16(const uint16_t* __restrict__ table, const uint32_t* __restrict__ ids, float* __restrict__ out,
                          uint32_t vocab, int dim) {
    gather_bf16_row<8>(table, ids, out, vocab, dim);
}
extern "C" __global__ void __launch_bounds__(GATHER_THREADS)
    embedding_gather_bf16_d2(const uint16_t* __restrict__ table, const uint32_t* __restrict__ ids,
                             float* __restrict__ out, uint32_t vocab, int dim) {
    gather_bf16_row<2>(table, ids, out, vocab, dim);
}

// Embedding gather from a packed int4 table (kernels/src/linear/int4.rs: codes uint8 [npad/64][k][32], row `id` in
// byte `id % 32` of each 32-byte group, low nibble for id % 64 < 32; scales/zeros bf16 [ceil(k/group)][npad][2])
// into fp32 out [n, k]: out = (code - 8) * scale + zero, rounded as the CPU (no FMA). One block per id; each element
// is one byte of a different 32-byte sector, so this reads 32x the bytes it uses: the layout is the GEMM's, not a
// gather's. Bad ids give NaN rows as above.
extern "C" __global__ void __launch_bounds__(GATHER_THREADS)
    embedding_gather_int4(const uint8_t* __restrict__ packed, const uint16_t* __restrict__ scales_zeros,
                          const uint32_t* __restrict__ ids, float* __restrict__ out, uint32_t n, int k, int group,
                          uint32_t npad) {
    const uint32_t id = ids[blockIdx.x];
    float* o = out + (size_t)blockIdx.x * k;
    if (id >= n) {
        for (int i = threadIdx.x; i < k; i += GATHER_THREADS) o[i] = CUDART_NAN_F;
        return;
    }
    const uint8_t* base = packed + (size_t)(id >> 6) * k * 32 + (id & 31);
    const int shift = (id & 32) ? 4 : 0;
    for (int c = threadIdx.x; c < k; c += GATHER_THREADS) {
        const uint32_t code = (base[(size_t)c * 32] >> shift) & 15u;
        const size_t sz = ((size_t)(c / group) * npad + id) * 2;
        const float s = __uint_as_float((uint32_t)scales_zeros[sz] << 16);
        const float z = __uint_as_float((uint32_t)scales_zeros[sz + 1] << 16);
        o[c] = __fadd_rn(__fmul_rn((float)code - 8.0f, s), z);
    }
}

// Argmax over rows of fp32 logits [rows, vocab] -> u32 [rows]: the largest value, the first index on ties; a row
// with a NaN answers 0xffffffff (the CPU refuses it). A cluster of 8 blocks (1024 threads each, one SM each) shares
// a row: each reduces an eighth, and block 0 of the cluster combines the eight results through distributed shared
// memory, so one launch reads a 248320-wide row at the bandwidth of eight SMs, without a workspace or a second
// kernel. Grid: (8, rows).
extern "C" __global__ void __cluster_dims__(ARGMAX_CLUSTER, 1, 1) __launch_bounds__(ARGMAX_THREADS)
    argmax_cluster8(const float* __restrict__ logits, uint32_t* __restrict__ out, uint32_t vocab) {
    cg::cluster_group cluster = cg::this_cluster();
    const uint32_t rank = cluster.block_rank();
    const float* row = logits + (size_t)blockIdx.y * vocab;
    const bool vec = (vocab & 3) == 0;
    // Chunks of a multiple of 4 elements, so the vector path's loads stay aligned.
    const uint32_t chunk = ((vocab + ARGMAX_CLUSTER - 1) / ARGMAX_CLUSTER + 3) & ~3u;
    const uint32_t lo = min(vocab, rank * chunk), hi = min(vocab, lo + chunk);
    __shared__ ArgBest part;
    const ArgBest r = argmax_block_range(row, lo, hi, vec);
    if (threadIdx.x == 0) part = r;
    cluster.sync();
    if (rank == 0 && threadIdx.x == 0) {
        ArgBest best = part;
        for (uint32_t b = 1; b < ARGMAX_CLUSTER; ++b) {
            const ArgBest* o = cluster.map_shared_rank(&part, b);
            const ArgBest p = *o;
            best.nan |= p.nan;
            if (better(p.v, p.i, best.v, best.i)) best = ArgBest{p.v, p.i, best.nan};
        }
        out[blockIdx.y] = best.nan ? 0xffffffffu : best.i;
    }
    // Keep every block's shared memory alive until block 0 has read it.
    cluster.sync();
}

// The same with one block per row (grid (1, rows)): the fallback, and the benchmark's comparison.
extern "C" __global__ void __launch_bounds__(ARGMAX_THREADS)
    argmax_block(const float* __restrict__ logits, uint32_t* __restrict__ out, uint32_t vocab) {
    const float* row = logits + (size_t)blockIdx.y * vocab;
    const ArgBest r = argmax_block_range(row, 0, vocab, (vocab & 3) == 0);
    if (threadIdx.x == 0) out[blockIdx.y] = r.nan ? 0xffffffffu : r.i;
}

// Top-k / top-p sampling with temperature, with the CPU's semantics (kernels/src/sampling.rs) step for step, so
// that the same seed draws the same token:
//  1. radix select (four passes of 8 bits over monotone u32 keys, shared-memory histograms) finds the key T of the
//     k-th largest logit, k = min(top_k, vocab) (1 when temperature is 0: greedy);
//  2. the candidates (every key > T, then the lowest ids among the keys == T, exactly the CPU's order: descending
//     logit by total_cmp, lower id first) are gathered into shared memory and bitonic-sorted;
//  3. in f64: p = exp(l / t - l0 / t), q = p / sum p, the smallest prefix whose mass reaches top_p, renormalised,
//  4. the draw: u from the row's Pcg32 (advanced only when more than one candidate is left, as the CPU), the first
//     candidate whose running sum exceeds u.
// Sums are block scans instead of the CPU's sequential loop, so a draw can differ only when u falls within ~1e-16
// of a boundary. logits fp32 [rows, vocab]; rng u32 [rows, 4] (state lo, hi, inc lo, hi), advanced in place;
// out u32 [rows]: the token, or 0xffffffff for a row holding a NaN or +inf (the CPU refuses those), which does not
// advance the generator.
//
// Two kernels share these steps. `sample_topk_topp`: one block of 1024 threads per row (grid (rows)), for many
// rows. `sample_topk_topp_cluster8`: a cluster of 8 blocks per row (grid (8, rows)), for few rows: one block alone
// reads a 248320-wide row five times at the pace of one SM (~145 us on the H200, slower than torch), so here each
// block counts its eighth of the row and every block sums the eight histograms through distributed shared memory
// (each makes the same digit choice); the candidates go straight into rank 0's shared memory (remote atomics for
// the slots), the ordered tie pass of rank r starts after the ties of ranks below it (their last-pass bin of T),
// and rank 0 alone sorts and draws. The histograms are double-buffered by pass parity, so one cluster barrier per
// pass suffices: a block re-zeroes a buffer only after the barrier that every reader of it passed first.
// (A warp-aggregated first pass through __match_any_sync was measured slower than plain shared atomics on the
// H200, 167 vs 143 us at 1 x 248320, and dropped.)
extern "C" __global__ void __launch_bounds__(SAMPLE_THREADS)
    sample_topk_topp(const float* __restrict__ logits, uint32_t* __restrict__ rng, uint32_t* __restrict__ out,
                     uint32_t vocab, uint32_t k, float temperature, float top_p) {
    __shared__ uint32_t hist[256];
    __shared__ unsigned long long cand[SAMPLE_KMAX];
    __shared__ uint32_t s_prefix, s_remaining, s_ties, s_ngt, s_neq;
    const float* row = logits + (size_t)blockIdx.x * vocab;
    const int tid = threadIdx.x;
    const bool vec = (vocab & 3) == 0;
    if (tid == 0) {
        s_ngt = 0;
        s_neq = 0;
    }
    uint32_t prefix = 0, mask = 0, remaining = k;
    for (int pass = 0; pass < 4; ++pass) {
        const int shift = 24 - 8 * pass;
        for (int b = tid; b < 256; b += SAMPLE_THREADS) hist[b] = 0;
        __syncthreads();
        int bad = 0;
        visit_range(row, 0, vocab, vec, [&](float v, uint32_t) {
            if (pass == 0) bad |= isnan(v) | (v == CUDART_INF_F);
            const uint32_t key = float_key(v);
            if ((key & mask) == prefix) atomicAdd(&hist[(key >> shift) & 255u], 1u);
        });
        if (pass == 0) {
            if (__syncthreads_or(bad)) {
                if (tid == 0) out[blockIdx.x] = 0xffffffffu;
                return;  // uniform
            }
        } else {
            __syncthreads();
        }
        if (tid < 32) radix_pick_digit(hist, remaining, prefix, shift, &s_prefix, &s_remaining, &s_ties);
        __syncthreads();
        prefix = s_prefix;
        remaining = s_remaining;
        mask |= 255u << shift;
    }
    const uint32_t T = prefix, need_eq = remaining, n_gt = k - need_eq;
    const bool all_ties = s_ties == need_eq;
    // Gather: keys above T in any order (they are sorted next), keys equal to T too when all of them are taken.
    visit_range(row, 0, vocab, vec, [&](float v, uint32_t i) {
        const uint32_t key = float_key(v);
        if (key > T) {
            cand[atomicAdd(&s_ngt, 1u)] = cand_key(key, i);
        } else if (key == T && all_ties) {
            cand[n_gt + atomicAdd(&s_neq, 1u)] = cand_key(key, i);
        }
    });
    if (!all_ties) gather_ties_in_order(row, 0, vocab, T, n_gt, need_eq, 0, cand);
    __syncthreads();
    sample_finish(cand, k, temperature, top_p, rng + 4 * (size_t)blockIdx.x, out + blockIdx.x);
}

extern "C" __global__ void __cluster_dims__(SAMPLE_CLUSTER, 1, 1) __launch_bounds__(SAMPLE_THREADS)
    sample_topk_topp_cluster8(const float* __restrict__ logits, uint32_t* __restrict__ rng,
                              uint32_t* __restrict__ out, uint32_t vocab, uint32_t k, float temperature,
                              float top_p) {
    cg::cluster_group cluster = cg::this_cluster();
    const uint32_t rank = cluster.block_rank();
    __shared__ uint32_t hist[2][256];  // this block's counts, by pass parity
    __shared__ uint32_t total[256];    // the cluster's counts of the current pass
    __shared__ unsigned long long cand[SAMPLE_KMAX];  // used in rank 0
    __shared__ uint32_t s_prefix, s_remaining, s_ties, s_ngt, s_neq;
    __shared__ int s_bad, s_any_bad;
    const float* row = logits + (size_t)blockIdx.y * vocab;
    const int tid = threadIdx.x;
    const bool vec = (vocab & 3) == 0;
    // This block's share: chunks of a multiple of 4 elements (aligned float4s), in rank order along the row.
    const uint32_t chunk = ((vocab + SAMPLE_CLUSTER - 1) / SAMPLE_CLUSTER + 3) & ~3u;
    const uint32_t lo = min(vocab, rank * chunk), hi = min(vocab, lo + chunk);
    if (tid == 0) {  // rank 0's counters are used by every block only after the first cluster barrier
        s_ngt = 0;
        s_neq = 0;
    }
    uint32_t prefix = 0, mask = 0, remaining = k;
    for (int pass = 0; pass < 4; ++pass) {
        const int shift = 24 - 8 * pass;
        uint32_t* h = hist[pass & 1];
        for (int b = tid; b < 256; b += SAMPLE_THREADS) h[b] = 0;
        __syncthreads();
        int bad = 0;
        visit_range(row, lo, hi, vec, [&](float v, uint32_t) {
            if (pass == 0) bad |= isnan(v) | (v == CUDART_INF_F);
            const uint32_t key = float_key(v);
            if ((key & mask) == prefix) atomicAdd(&h[(key >> shift) & 255u], 1u);
        });
        if (pass == 0) {
            bad = __syncthreads_or(bad);
            if (tid == 0) s_bad = bad;
        }
        cluster.sync();  // every block's counts (and flag) are final and visible to the cluster
        if (tid < 256) {
            uint32_t t = 0;
            for (uint32_t r = 0; r < SAMPLE_CLUSTER; ++r) t += cluster.map_shared_rank(h, r)[tid];
            total[tid] = t;
        }
        if (pass == 0 && tid == 0) {
            int any = 0;
            for (uint32_t r = 0; r < SAMPLE_CLUSTER; ++r) any |= *cluster.map_shared_rank(&s_bad, r);
            s_any_bad = any;
        }
        __syncthreads();
        if (pass == 0 && s_any_bad) {  // uniform over the cluster
            if (rank == 0 && tid == 0) out[blockIdx.y] = 0xffffffffu;
            cluster.sync();  // no block exits while another may still read its shared memory
            return;
        }
        // Every block sums the same counts in the same order, so every block picks the same digit.
        if (tid < 32) radix_pick_digit(total, remaining, prefix, shift, &s_prefix, &s_remaining, &s_ties);
        __syncthreads();
        prefix = s_prefix;
        remaining = s_remaining;
        mask |= 255u << shift;
    }
    const uint32_t T = prefix, need_eq = remaining, n_gt = k - need_eq;
    const bool all_ties = s_ties == need_eq;
    unsigned long long* cand0 = cluster.map_shared_rank(cand, 0);
    uint32_t* ngt0 = cluster.map_shared_rank(&s_ngt, 0);
    uint32_t* neq0 = cluster.map_shared_rank(&s_neq, 0);
    visit_range(row, lo, hi, vec, [&](float v, uint32_t i) {
        const uint32_t key = float_key(v);
        if (key > T) {
            cand0[atomicAdd(ngt0, 1u)] = cand_key(key, i);
        } else if (key == T && all_ties) {
            cand0[n_gt + atomicAdd(neq0, 1u)] = cand_key(key, i);
        }
    });
    if (!all_ties) {
        // The ties below this block's share: the last pass's bin of T (= exactly the keys equal to T) in the
        // blocks of lower rank, whose histograms nobody rewrites after pass 3.
        uint32_t before = 0;
        for (uint32_t r = 0; r < rank; ++r) before += cluster.map_shared_rank(hist[1], r)[T & 255u];
        gather_ties_in_order(row, lo, hi, T, n_gt, need_eq, before, cand0);
    }
    cluster.sync();  // all candidates are in rank 0; no remote access follows
    if (rank != 0) return;
    sample_finish(cand, k, temperature, top_p, rng + 4 * (size_t)blockIdx.y, out + blockIdx.y);
}

// Neox RoPE in place on x fp32 [t, heads, head_dim], token r at positions[r]: pairs (i, i + rot/2) of the first
// `rot` dims rotate by angle f32(pos) * inv_freq[i] with inv_freq[i] = f32(1 / theta^(2i / rot)) (f64), cos and
// sin in f64 rounded to f32: the CPU's numbers (kernels/src/attention.rs Rope::inv_freq, csrc/attn_impl.h). One
// block of 256 threads per token; the angles go to shared memory once per token (rot <= 1024).
constexpr int ROPE_THREADS = 256;
constexpr int ROPE_PAIRS = 4;  // pairs per thread per round, loaded together

extern "C" __global__ void __launch_bounds__(ROPE_THREADS)
    rope_neox(float* __restrict__ x, const uint32_t* __restrict__ positions, double theta, int heads, int head_dim,
              int rot) {
    pdl_start();
    __shared__ float cs[512], sn[512];
    const int half = rot >> 1;
    const int pairs = heads * half;
    float* t = x + (size_t)blockIdx.x * heads * head_dim;
    // Element e of a round is pair i = e % half of head e / half: a warp covers 32 consecutive dims of one head.
    float a[ROPE_PAIRS], b[ROPE_PAIRS];
    auto load = [&](int base) {
#pragma unroll
        for (int u = 0; u < ROPE_PAIRS; ++u) {
            const int e = base + u * ROPE_THREADS + threadIdx.x;
            if (e < pairs) {
                const int h = e / half, i = e - h * half;
                const float* v = t + (size_t)h * head_dim;
                a[u] = v[i];
                b[u] = v[i + half];
            }
        }
    };
    // The first round's loads are issued before the angles are computed, so their DRAM latency overlaps the f64
    // pow and sincos (a 32 x 256 token with rot 64 is exactly one round).
    load(0);
    const float pos = (float)positions[blockIdx.x];
    for (int i = threadIdx.x; i < half; i += ROPE_THREADS) {
        const float inv = (float)(1.0 / pow(theta, (double)(2 * i) / (double)rot));
        const float ang = pos * inv;
        double s, c;
        sincos((double)ang, &s, &c);
        cs[i] = (float)c;
        sn[i] = (float)s;
    }
    __syncthreads();
    for (int base = 0; base < pairs; base += ROPE_PAIRS * ROPE_THREADS) {
        if (base > 0) load(base);
#pragma unroll
        for (int u = 0; u < ROPE_PAIRS; ++u) {
            const int e = base + u * ROPE_THREADS + threadIdx.x;
            if (e < pairs) {
                const int h = e / half, i = e - h * half;
                float* v = t + (size_t)h * head_dim;
                v[i] = __fsub_rn(__fmul_rn(a[u], cs[i]), __fmul_rn(b[u], sn[i]));
                v[i + half] = __fadd_rn(__fmul_rn(b[u], cs[i]), __fmul_rn(a[u], sn[i]));
            }
        }
    }
}

// ---- f32 elementwise ops of the engine's exact path ----------------------------------------------------------------
// Casts, the gated activations with f32 output, the sigmoid output gates, the logit softcap, in-place adds and
// scales, bias rows and strided column copies, all over f32 activations (kernels/src/cuda/ops.rs has the checks).
// The flat ones take their length in 64 bits and walk it with a grid stride: 16-byte accesses over the first
// floor(n / 4) * 4 elements (aligned: the buffers are whole 256-byte-aligned allocations), then the tail one by
// one. The row-wise ones put the columns on grid.x and stride the rows over grid.y.
namespace {

constexpr int EW_THREADS = 256;

__device__ __forceinline__ float sigmoid_f(float g) { return 1.0f / (1.0f + expf(-g)); }

// Gemma's gelu_pytorch_tanh, the CPU's formula (kernels/src/backend.rs, gelu_tanh_and_mul).
__device__ __forceinline__ float gelu_tanh_f(float g) {
    const float t = tanhf(0.7978846f * (g + 0.044715f * g * g * g));
    return 0.5f * g * (1.0f + t);
}

// ACT: 0 SiLU, 1 GELU (erf), 2 GELU (tanh); the order of kernels::ops::GatedAct.
template <int ACT>
__device__ __forceinline__ float gated_act(float g) {
    return ACT == 0 ? silu_f(g) : ACT == 1 ? gelu_f(g) : gelu_tanh_f(g);
}

// out[r][j] = act(gate_up[r][j]) * gate_up[r][inter + j], fp32 out. Grid (rows, ceil(inter / 1024)), four outputs
// per thread as glu_chunk_to (float4 when inter % 4 == 0).
template <int ACT>
__device__ __forceinline__ void act_and_mul_row(const float* __restrict__ gate_up, float* __restrict__ out,
                                                int inter) {
    pdl_start();
    const size_t row = blockIdx.x;
    const float* g = gate_up + row * 2 * (size_t)inter;
    const float* u = g + inter;
    float* o = out + row * (size_t)inter;
    const int j = (blockIdx.y * GLU_THREADS + threadIdx.x) * 4;
    if (j >= inter) return;
    if ((inter & 3) == 0) {
        const float4 gv = *reinterpret_cast<const float4*>(g + j);
        const float4 uv = *reinterpret_cast<const float4*>(u + j);
        *reinterpret_cast<float4*>(o + j) =
            make_float4(gated_act<ACT>(gv.x) * uv.x, gated_act<ACT>(gv.y) * uv.y, gated_act<ACT>(gv.z) * uv.z,
                        gated_act<ACT>(gv.w) * uv.w);
    } else {
        const int end = min(j + 4, inter);
        for (int i = j; i < end; ++i) o[i] = gated_act<ACT>(g[i]) * u[i];
    }
}

// Calls f(i) for every i in [0, n / 4) (the vector part) and t(i) for every i in [4 * (n / 4), n) (the tail),
// grid-stride over the whole grid.
template <typename F, typename T>
__device__ __forceinline__ void ew_walk(unsigned long long n, F&& f, T&& t) {
    pdl_start();
    const unsigned long long stride = (unsigned long long)gridDim.x * EW_THREADS;
    const unsigned long long tid = (unsigned long long)blockIdx.x * EW_THREADS + threadIdx.x;
    const unsigned long long n4 = n / 4;
    for (unsigned long long i = tid; i < n4; i += stride) f(i);
    for (unsigned long long i = 4 * n4 + tid; i < n; i += stride) t(i);
}

// The CPU's f32_to_bf16 (kernels/src/formats.rs) bit for bit: round to nearest even, NaN kept quiet with its sign
// and top payload bits (cvt.rn.bf16.f32 would give the canonical NaN instead).
__device__ __forceinline__ uint32_t f32_to_bf16_bits(float x) {
    const uint32_t b = __float_as_uint(x);
    if (x != x) return (b >> 16) | 0x0040u;
    return (b + 0x7fffu + ((b >> 16) & 1u)) >> 16;
}

}  // namespace

// gate_up fp32 [rows, 2 * inter] (gate first), out fp32 [rows, inter].
extern "C" __global__ void __launch_bounds__(GLU_THREADS)
    silu_and_mul_f32(const float* __restrict__ gate_up, float* __restrict__ out, int inter) {
    act_and_mul_row<0>(gate_up, out, inter);
}
extern "C" __global__ void __launch_bounds__(GLU_THREADS)
    gelu_and_mul_f32(const float* __restrict__ gate_up, float* __restrict__ out, int inter) {
    act_and_mul_row<1>(gate_up, out, inter);
}
extern "C" __global__ void __launch_bounds__(GLU_THREADS)
    gelu_tanh_and_mul_f32(const float* __restrict__ gate_up, float* __restrict__ out, int inter) {
    act_and_mul_row<2>(gate_up, out, inter);
}

// x fp32 [n] -> out bf16 bits [n].
extern "C" __global__ void __launch_bounds__(EW_THREADS)
    cast_f32_to_bf16(const float* __restrict__ x, uint16_t* __restrict__ out, unsigned long long n) {
    ew_walk(
        n,
        [&](unsigned long long i) {
            const float4 v = reinterpret_cast<const float4*>(x)[i];
            uint2 u;
            u.x = f32_to_bf16_bits(v.x) | (f32_to_bf16_bits(v.y) << 16);
            u.y = f32_to_bf16_bits(v.z) | (f32_to_bf16_bits(v.w) << 16);
            reinterpret_cast<uint2*>(out)[i] = u;
        },
        [&](unsigned long long i) { out[i] = (uint16_t)f32_to_bf16_bits(x[i]); });
}

// x bf16 bits [n] -> out fp32 [n] (exact).
extern "C" __global__ void __launch_bounds__(EW_THREADS)
    cast_bf16_to_f32(const uint16_t* __restrict__ x, float* __restrict__ out, unsigned long long n) {
    ew_walk(
        n,
        [&](unsigned long long i) {
            const uint2 u = reinterpret_cast<const uint2*>(x)[i];
            const float2 a = bf16x2_to_float2(u.x), b = bf16x2_to_float2(u.y);
            reinterpret_cast<float4*>(out)[i] = make_float4(a.x, a.y, b.x, b.y);
        },
        [&](unsigned long long i) { out[i] = __uint_as_float((uint32_t)x[i] << 16); });
}

// out[i] = bf16(x[i] * sigmoid(gate[i])): sigmoid_gate_f32 and cast_f32_to_bf16 in one pass (the same f32 product,
// then round to nearest even), for a gated attention output read by a tile GEMV.
extern "C" __global__ void __launch_bounds__(EW_THREADS)
    sigmoid_gate_bf16(const float* __restrict__ x, const float* __restrict__ gate, uint16_t* __restrict__ out,
                      unsigned long long n) {
    ew_walk(
        n,
        [&](unsigned long long i) {
            const float4 v = reinterpret_cast<const float4*>(x)[i];
            const float4 g = reinterpret_cast<const float4*>(gate)[i];
            const uint32_t lo = f32_to_bf16_bits(v.x * sigmoid_f(g.x)) | (f32_to_bf16_bits(v.y * sigmoid_f(g.y)) << 16);
            const uint32_t hi = f32_to_bf16_bits(v.z * sigmoid_f(g.z)) | (f32_to_bf16_bits(v.w * sigmoid_f(g.w)) << 16);
            reinterpret_cast<uint2*>(out)[i] = make_uint2(lo, hi);
        },
        [&](unsigned long long i) { out[i] = (uint16_t)f32_to_bf16_bits(x[i] * sigmoid_f(gate[i])); });
}

// x[i] *= sigmoid(gate[i]).
extern "C" __global__ void __launch_bounds__(EW_THREADS)
    sigmoid_gate_f32(float* __restrict__ x, const float* __restrict__ gate, unsigned long long n) {
    ew_walk(
        n,
        [&](unsigned long long i) {
            float4 v = reinterpret_cast<float4*>(x)[i];
            const float4 g = reinterpret_cast<const float4*>(gate)[i];
            v.x *= sigmoid_f(g.x); v.y *= sigmoid_f(g.y); v.z *= sigmoid_f(g.z); v.w *= sigmoid_f(g.w);
            reinterpret_cast<float4*>(x)[i] = v;
        },
        [&](unsigned long long i) { x[i] *= sigmoid_f(gate[i]); });
}

// x[i] = cap * tanh(x[i] / cap).
extern "C" __global__ void __launch_bounds__(EW_THREADS)
    softcap_f32(float* __restrict__ x, float cap, unsigned long long n) {
    const auto sc = [cap](float v) { return cap * tanhf(v / cap); };
    ew_walk(
        n,
        [&](unsigned long long i) {
            float4 v = reinterpret_cast<float4*>(x)[i];
            v.x = sc(v.x); v.y = sc(v.y); v.z = sc(v.z); v.w = sc(v.w);
            reinterpret_cast<float4*>(x)[i] = v;
        },
        [&](unsigned long long i) { x[i] = sc(x[i]); });
}

// x[i] += y[i].
extern "C" __global__ void __launch_bounds__(EW_THREADS)
    add_assign_f32(float* __restrict__ x, const float* __restrict__ y, unsigned long long n) {
    ew_walk(
        n,
        [&](unsigned long long i) {
            float4 v = reinterpret_cast<float4*>(x)[i];
            const float4 w = reinterpret_cast<const float4*>(y)[i];
            v.x += w.x; v.y += w.y; v.z += w.z; v.w += w.w;
            reinterpret_cast<float4*>(x)[i] = v;
        },
        [&](unsigned long long i) { x[i] += y[i]; });
}

// x[i] *= s.
extern "C" __global__ void __launch_bounds__(EW_THREADS)
    scale_assign_f32(float* __restrict__ x, float s, unsigned long long n) {
    ew_walk(
        n,
        [&](unsigned long long i) {
            float4 v = reinterpret_cast<float4*>(x)[i];
            v.x *= s; v.y *= s; v.z *= s; v.w *= s;
            reinterpret_cast<float4*>(x)[i] = v;
        },
        [&](unsigned long long i) { x[i] *= s; });
}

// x [groups, d] *= sigmoid(gate [groups]) per group (a group is one head of one token). Grid
// (ceil(d / 256), min(groups, 65535)), the groups strided over grid.y.
extern "C" __global__ void __launch_bounds__(EW_THREADS)
    sigmoid_head_gate_f32(float* __restrict__ x, const float* __restrict__ gate, unsigned long long groups, int d) {
    pdl_start();
    const int j = blockIdx.x * EW_THREADS + threadIdx.x;
    if (j >= d) return;
    for (unsigned long long g = blockIdx.y; g < groups; g += gridDim.y) x[g * d + j] *= sigmoid_f(gate[g]);
}

// x [rows, n] += bias [n]. Grid (ceil(n / 256), min(rows, 65535)), the rows strided over grid.y.
extern "C" __global__ void __launch_bounds__(EW_THREADS)
    add_bias_rows_f32(float* __restrict__ x, const float* __restrict__ bias, unsigned long long rows, int n) {
    pdl_start();
    const int j = blockIdx.x * EW_THREADS + threadIdx.x;
    if (j >= n) return;
    const float b = bias[j];
    for (unsigned long long r = blockIdx.y; r < rows; r += gridDim.y) x[r * n + j] += b;
}

// dst[r * dst_cols + dst_off + c] = src[r * src_cols + src_off + c] for r < rows, c < width. Grid
// (min(ceil(width / 256), 4096), min(rows, 65535)), both strided.
extern "C" __global__ void __launch_bounds__(EW_THREADS)
    copy_cols_f32(const float* __restrict__ src, unsigned long long src_cols, unsigned long long src_off,
                  float* __restrict__ dst, unsigned long long dst_cols, unsigned long long dst_off,
                  unsigned long long rows, unsigned long long width) {
    pdl_start();
    for (unsigned long long r = blockIdx.y; r < rows; r += gridDim.y) {
        const float* s = src + r * src_cols + src_off;
        float* d = dst + r * dst_cols + dst_off;
        for (unsigned long long c = (unsigned long long)blockIdx.x * EW_THREADS + threadIdx.x; c < width;
             c += (unsigned long long)gridDim.x * EW_THREADS)
            d[c] = s[c];
    }
}
