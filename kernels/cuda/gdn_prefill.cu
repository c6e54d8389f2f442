// Gated DeltaNet chunked prefill (Qwen3.5 / Qwen3-Next linear-attention layers) for a batch of sequences of any
// lengths (cu_seqlens style), everything between the input projections and out_proj: the causal depthwise conv
// (SiLU) continuing from each sequence's conv history, l2-norm of q and k (q scaled by 1/sqrt(dk)), the gates
// g = -exp(A_log) softplus(a + dt_bias) and beta = sigmoid(b), the delta rule S <- e^g S; S <- S + k (x) beta
// (v - S^T k) in chunks of 64 tokens (WY / UT-transform form), o = S^T q, and the gated RMSNorm
// rmsnorm(o) * w * silu(z). Layouts: kernels/src/gdn.rs (fp32 everywhere); dk = dv = 128 (checked in Rust).
//
// Chunk algebra (per value head, chunk of L <= 64 tokens, S0 the state at the chunk start, G_t the inclusive
// in-chunk cumulative sum of g): unrolling the recurrence gives
//   S_t = e^{G_t} S0 + sum_{s<=t} e^{G_t-G_s} k_s d_s^T,   d_t = beta_t (v_t - (e^{g_t} S_{t-1})^T k_t),
// and the d_t solve the unit lower-triangular system (I + A) D = diag(beta) V - diag(beta e^G) K S0 with
// A[t][s] = beta_t e^{G_t-G_s} k_t.k_s (s < t). With T = (I + A)^-1, W = T diag(beta e^G) K, U = T diag(beta) V:
//   D = U - W S0,  o_t = e^{G_t} S0^T q_t + sum_{s<=t} e^{G_t-G_s} (q_t.k_s) d_s,
//   S_L = e^{G_L} S0 + sum_s e^{G_L-G_s} k_s d_s^T.
// Every exponent is a difference G_t - G_s <= 0 (s <= t) or G_t <= 0, so nothing overflows.
//
// Four launches (the Rust side, kernels/src/cuda/gdn_prefill.rs, queues them on one stream; with a device
// cu_seqlens table, Gpu::gdn_prefill_varlen, a one-block gdn_prefill_meta first builds the meta table below):
// 1. gdn_prefill_prep: grid (ceil(max_len / 8), ceil((2Hk+Hv) / 4), seqs), 128 threads, one warp per 128-channel
//    segment (a q head, a k head or a v head) and 8 consecutive tokens, the conv window in registers: conv + SiLU,
//    the l2-norm of q/k segments (warp shuffles), the gates of v segments; writes qn, kn, v, g, beta to the
//    workspace, and the final conv history of each channel to conv_out (warps of the first 8-token tile).
//    conv_in is only read, so the q/k history shared by several warps never races (the same two-buffer convention
//    as gdn_decode_step). It replaced the block-per-token prep (969 -> 305 us at B=4 N=9216, bit-identical).
// 2. gdn_prefill_wy: grid (max_chunks, Hv, seqs), 256 threads: per (chunk, value head) G, A, T (forward
//    substitution, 4 threads per column), W, U and the masked decayed Aqk[t][s] = e^{G_t-G_s} q_t.k_s (s <= t), all
//    independent across chunks, so this is the parallel part. gdn_prefill_wy_tc{1,3} are drop-in builds of the
//    same launch with its three products on mma.sync TF32 (plain or 3xTF32) and T inverted by 16 x 16 blocks (see
//    their comment below), selected by a `wytf32_` / `wytf32x3_` prefix of the variant name.
// 3. gdn_prefill_state_cs<CS>: grid (128/CS, Hv, seqs), 256 threads: the sequential part. Each block owns CS
//    columns of one head's state (fp32 in shared memory) and walks the sequence's chunks: D = U - W S, the
//    unnormalised output e^G (Q S) + Aqk D (written to out), S <- e^{G_L} S + (e^{G_L-G} K)^T D; the state goes
//    back to global memory once, at the end. CS = 16, 32 and 64 are built (8, 4 or 2 blocks per head).
//    gdn_prefill_state_tc{1,3}_cs<CS> are drop-in builds of the same launch with the four per-chunk products on
//    mma.sync TF32 tensor cores (plain or 3xTF32 split; see their comment below); Gpu::gdn_prefill_with selects
//    one by name. Per (chunk, head) the walk costs 7.3 MFLOP (W S, Q S, K^T D: 2 * 64*128*128 each; Aqk D:
//    2 * 64*64*128) against ~150 KB of W, U, Aqk, q, k reads, so on CUDA cores it is FMA-bound (14
//    TFLOP/s for the whole layer) while on tensor cores it becomes load-latency-bound. At 64 columns (the
//    default) the tensor-core walk therefore double-buffers: chunk c + 1's W, Q, Aqk, G stream into a second
//    shared buffer (cp.async) and its K, U into a second register set while chunk c is multiplied (
//    575 -> 503 us at T = 4096, the TF32 conversion change below included). What is left is latency between
//    the phases' dependent shared-memory loads and mma with 8 warps on an SM (profile); 16 warps per
//    block traded that for shared-memory bandwidth (the A fragments read by twice the warps) and was
//    2% slower.
// 4. gdn_prefill_gated_norm: one warp per (token, value head): out <- rmsnorm(out) * w * silu(z), in place.
// The bf16 split (`wy<math>_bf16_cs64`) replaces launches 3 and 4 by 3' (the walk carrying only the
// state) and 4' (the output parallel over chunks with the gated norm fused), on bf16 operands; see its section
// at the end of this file. The f16 split (`wyf16_bf16_cs64`, the fastest build: 412.3 us at T = 4096
// and 902.0 us at B = 4 x 9216 on the H200, 1.003x / 1.016x fla's bare chunk kernel) is the same behind
// launch 1's f16 form (`gdn_prefill_prep_h`) and a WY launch on f16 tensor cores (`gdn_prefill_wy_h_b`, which
// also writes the split's bf16 q / k copies), at the bf16 split's precision. Launch 3' has two builds (session
// 13): the two-block walk `gdn_prefill_walk_bf16` (64 state columns per block) and the one-block walk
// `gdn_prefill_walk1_bf16` (all 128, each warp 16 columns with both products in its registers), the second for
// batches whose two-block walk would not fit the GPU in one wave (the Rust side's `walk_one_block`).
// Launch order: every WY build is the prep's programmatic dependent (PDL: its blocks start as the
// prep's last ones run and wait in pdl_wait for its end), the split's walk the WY's (it loads its state, then
// waits), and the split's output the walk's (it waits per chunk on the walk's ready counters, not for its end), in
// a grid with the heads fastest so that its blocks start in the order the walk finishes their chunks. H200,
// T = 4096: the f16 split step 543.5 -> 520.1 us with the output overlapped, 497.4 with the
// WY and walk as dependents and the output grid reordered, 484.1 with two walk buffers (WALK_NBUF); 451.9 with the
// WY's step 3 and inverse and the prep made cheaper; fla 413.3. Tried earlier: 418.8 with the
// output's epilogue and the prep's stores whole, 413.9 with the bf16 q / k copies in the WY.
// With more walk blocks than SMs (ragged batches), the output starts only once the last walk block has started
// (PDL: every block of the primary must have triggered), so it overlaps less (benchmarks/h200.md):
// hence the one-block walk for such batches (half the blocks: 929.7 -> 902.0 us at B = 4 x 9216).
// Removed: fla's split of launches 3 and 4 on TF32 (`[wytf32_]tf32split_cs<32|64>`: a walk carrying only the
// state and storing each chunk's incoming state and v_new in fp16, then an output launch parallel over chunks with
// the gated norm fused). It lost at T = 16384: walk_cs64 1835.7 us + out 963.0 us against the state walk
// tf32_cs64 2272.2 us + norm 277.8 us; whole step wytf32_tf32split_cs64 6125.8 us against 5856.3 us for
// wytf32_tf32_cs64 (tf32split_cs32/cs64 7149.1/7023.0, wytf32_tf32split_cs32 6264.9). On bf16 operands the same
// division wins (762.6 against 1061.0 us at T = 4096 for the whole step; the split's section below).
//
// Precision: `fp32_cs<CS>` is fp32 on the CUDA cores throughout (no tensor cores, no bf16 rounding), so its
// results match the fp32 CPU chunked prefill and the f64 recurrence to fp32 rounding of a different summation
// order; the TF32 builds round only their mma operands (3xTF32: ~fp32; plain TF32: ~5e-4 per product, 4e-4
// relative on the output at B=4 N=9216 against fp32_cs32 for `wytf32_tf32_cs64`, 2.4e-4 for the default
// `wytf32x3_tf32_cs64`, whose WY is 3xTF32).
//
// Workspace (floats, offsets in gdn_prefill.rs): qn [N, Hk, 128], kn [N, Hk, 128], v [N, Hv, 128], g [N, Hv],
// beta [N, Hv], gcum [N, Hv], W [Hv, NC, 64, 128], U [Hv, NC, 64, 128], Aqk [Hv, NC, 64, 64], with N the total
// tokens and NC the total chunks (sum over sequences of ceil(len/64)). meta (int32): cu_seqlens[seqs+1] followed
// by chunk offsets[seqs+1].
#include "common.cuh"

using namespace edgefit;

namespace {

constexpr int D = 128;      // dk = dv = 128
constexpr int C = 64;       // chunk length
constexpr int KP = D + 4;   // padded row of a [C][D] shared tile (keeps float4 alignment, spreads banks)
constexpr int AP = C + 1;   // padded row of a [C][C] shared tile
constexpr float L2_EPS = 1e-6f;

__device__ __forceinline__ float silu_f(float x) { return x / (1.f + expf(-x)); }

// SiLU with the fast reciprocal (__fdividef: ~2 ulp; x -> -inf gives x * 0 = -0) instead of IEEE division, whose
// subroutine and slow-path branch were most of the bf16 output launch's epilogue (profile: the
// BSYNC / BRA / MOV around each division). Used only there, where the output is bf16-class anyway.
__device__ __forceinline__ float silu_fast(float x) { return __fdividef(x, 1.f + __expf(-x)); }

__device__ __forceinline__ float softplus_f(float x) { return x > 20.f ? x : log1pf(expf(x)); }

__device__ __forceinline__ float4 f4_fma(float a, float4 b, float4 c) {
    c.x = fmaf(a, b.x, c.x);
    c.y = fmaf(a, b.y, c.y);
    c.z = fmaf(a, b.z, c.z);
    c.w = fmaf(a, b.w, c.w);
    return c;
}

}  // namespace

// Shared memory of gdn_prefill_wy (dynamic): K and X tiles [C][KP], A and T [C][AP], G and beta [C].
constexpr int WY_SMEM_BYTES = (2 * C * KP + 2 * C * AP + 2 * C) * 4;

// Shared memory of gdn_prefill_state_cs<CS> (dynamic): two [C][KP] tiles, Aqk [C][AP], D [C][CS], S [D][CS], G [C].
__host__ __device__ constexpr int state_smem_bytes(int cs) { return (2 * C * KP + C * AP + C * cs + D * cs + C) * 4; }

// Launch 0 of the device-table entry point (Gpu::gdn_prefill_varlen): turns the caller's cu_seqlens [seqs + 1]
// (u32, on the device, never checked by the host) into the meta table every other launch reads, clamped so that
// the sequences are ordered, disjoint, inside 0..total and at most max_len long: entry 0 is min(cu[0], total), entry
// b + 1 is cu[b + 1] clamped to [entry b, min(total, entry b + max_len)]; then the chunk offsets follow. The
// workspace's W / U / Aqk regions are sized (Rust side) for the most chunks such sequences can have, the grids for
// max_len, so a wrong table gives wrong or unwritten rows, never an access outside the buffers. One block: the
// table is staged through shared memory 1024 entries at a time and scanned by thread 0 (the clamp is sequential).
extern "C" __global__ void __launch_bounds__(256)
    gdn_prefill_meta(const unsigned* __restrict__ cu, int* __restrict__ meta, int seqs, int total, int max_len) {
    __shared__ unsigned tile[1024];
    const unsigned tot = static_cast<unsigned>(total), ml = static_cast<unsigned>(max_len);
    unsigned prev = 0;  // thread 0's running end of the previous sequence
    int chunks = 0;
    for (int base = 0; base <= seqs; base += 1024) {
        const int n = min(1024, seqs + 1 - base);
        for (int i = threadIdx.x; i < n; i += blockDim.x) tile[i] = cu[base + i];
        __syncthreads();
        if (threadIdx.x == 0) {
            for (int i = 0; i < n; ++i) {
                const int e = base + i;  // entry e of cu_seqlens: the end of sequence e - 1
                if (e == 0) {
                    prev = min(tile[0], tot);
                    meta[0] = static_cast<int>(prev);
                    meta[seqs + 1] = 0;
                    continue;
                }
                const unsigned hi = min(max(tile[i], prev), min(tot, prev + ml));
                chunks += static_cast<int>((hi - prev + C - 1) / C);
                meta[e] = static_cast<int>(hi);
                meta[seqs + 1 + e] = chunks;
                prev = hi;
            }
        }
        __syncthreads();  // tile free for the next 1024 entries
    }
}

// ---------------------------------------------------------------------------------------------------------------
// gdn_prefill_prep: launch 1 (conv + SiLU, q/k l2-norms, gates), one warp per 128-channel segment and PREP_TT = 8
// tokens. H200 (--quick, Qwen3.8-27B's layer; measured as `gdn_prefill_prep_w`, a drop-in next to the
// block-per-token build it then replaced): 304.9 us against 969.2 us at B = 4, N = 9216 (3.18x; 59.4% of a torch
// copy of the same bytes), 135.4 us against 321.3 us at T = 4096 (2.37x); outputs bit-identical to the old
// build's (max abs difference 0 at both shapes, and in the test that compared the two). Why the block-per-token
// build ran at ~1 TB/s (T = 16384: 1277 us for 1355 MB: qkv 671 MB read, qn/kn/v 671 MB written, a, b,
// g, beta 13 MB; 323 us at the 4.2 TB/s copy rate): its grid was one 128-thread block per (token, 128-channel
// segment), 1.31 M blocks, each thread one 4-byte load from DRAM (the other K-1 conv taps are the neighbouring
// tokens' rows, L2 re-reads) before a dependent chain (conv, a block reduction with __syncthreads, the store). At
// most 16 such blocks fit an SM, ~8 KB of new DRAM bytes in flight per SM against the ~22 KB that 4.2 TB/s needs
// at ~700 ns of latency (Little's law), so that launch was bound by latency, not bytes. Here one warp owns one
// segment for PREP_TT consecutive tokens: it loads all TT + K-1 rows of its 4 channels per lane (lane l
// holds channels 4l .. 4l+3, one 16-byte load per row, 11 in flight per lane before any arithmetic; until then
// channels l, 32+l, 64+l, 96+l, four 4-byte loads per row), slides the conv window in registers (each input read
// once, K-1 history rows per 8 tokens, L2 hits), and reduces the q/k sums of squares with one warp butterfly (no
// block barrier); outputs go out 8 (f16, bf16) or 16 (fp32) bytes per lane (by st_global_v2 / st_global_v4: as
// plain assignments NVVM split them into 4-byte stores; whole, with the conv taps read 16 bytes per load, the f16
// prep took 87.3 -> 79.7 us at T = 4096, 192.0 -> 174.2 us at B = 4 x 9216). The conv taps are added
// oldest first; the SiLU uses the fast exponential and reciprocal (`silu_fast`; the IEEE division's subroutine call
// and slow path were most of the instructions, as in the output launch).
// Grid (ceil(max_len / TT), ceil((2Hk+Hv) / 4), seqs), 128 threads (warp w: segment 4 blockIdx.y + w).
constexpr int PREP_TT = 8;

// HALF (`gdn_prefill_prep_h`, the f16 split's launch 1): qn, kn and v written as IEEE half in the first
// half of their fp32 regions (q, k l2-normed, so |x| <= 1; v saturated at +-65504, the only values f16 cannot hold),
// the operands of `gdn_prefill_wy_h_b`, which also writes the split's bf16 copies of q and k (80.0 ->
// 71.8 us for this launch at T = 4096, 127.8 -> 132.2 us for the WY, the step 420.5 -> 414.4 us; the
// k copy moved off the WY's inverse path, WY 132.6 -> 131.6 us, step 414.9 -> 413.9).
template <int KC, bool HALF>
__device__ __forceinline__ void gdn_prefill_prep_body(
    const float* __restrict__ qkv, const float* __restrict__ a_in, const float* __restrict__ b_in,
    const float* __restrict__ conv_w, const float* __restrict__ a_log, const float* __restrict__ dt_bias,
    const float* __restrict__ conv_in, float* __restrict__ conv_out, const int* __restrict__ meta,
    float* __restrict__ qn, float* __restrict__ kn, float* __restrict__ vv, float* __restrict__ gg,
    float* __restrict__ bb, __nv_bfloat16* __restrict__ qb, __nv_bfloat16* __restrict__ kb, int hk, int hv) {
    // The WY launch may become resident now (it is this launch's programmatic dependent, Device::launch_pdl, and
    // waits for this grid's end before it reads anything).
    pdl_launch_dependents();
    constexpr int HIST = KC - 1;
    const int lane = threadIdx.x & 31;
    const int seg = blockIdx.y * 4 + (threadIdx.x >> 5);
    const int s = blockIdx.z;
    const int t0 = blockIdx.x * PREP_TT;
    const int segs = 2 * hk + hv;
    if (seg >= segs) return;  // whole warp; no block barrier below
    const int start = meta[s];
    const int len = meta[s + 1] - start;
    const int conv_dim = segs * D;
    // Input of channel ch at sequence position j (j < 0: the remembered history, oldest first).
    auto x_at = [&](int ch, int j) -> float {
        return j >= 0 ? qkv[static_cast<size_t>(start + j) * conv_dim + ch]
                      : conv_in[(static_cast<size_t>(s) * conv_dim + ch) * HIST + HIST + j];
    };
    // Lane l owns the 4 consecutive channels ch4 .. ch4 + 3 (one 16-byte load per input row, 8- or 16-byte stores).
    const int ch4 = seg * D + 4 * lane;
    if (blockIdx.x == 0) {
        // Final history of the warp's channels (positions len-HIST .. len-1; history when negative).
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const int ch = ch4 + j;
            float* cout = conv_out + (static_cast<size_t>(s) * conv_dim + ch) * HIST;
#pragma unroll
            for (int p = 0; p < HIST; ++p) cout[p] = x_at(ch, len - HIST + p);
        }
    }
    if (t0 >= len) return;  // whole warp: ragged batch
    // Rows t0-HIST .. t0+TT-1 of the 4 channels (rows past the sequence are not read).
    float xs[PREP_TT + HIST][4];
    // The lane's conv taps, 4 KC consecutive floats from conv_w + ch4 KC: KC 16-byte loads where the weights are
    // 16-byte aligned (always, from Rust and torch; 4-byte loads otherwise). (4 KC 4-byte loads 16 KC bytes apart
    // per warp instruction were 4x the L1 sector lookups of the loads of qkv, Nsight Compute on the H200.)
    float wr[4][KC];
    if ((reinterpret_cast<uintptr_t>(conv_w) & 15) == 0) {
#pragma unroll
        for (int i = 0; i < KC; ++i) {
            const float4 w4 = *reinterpret_cast<const float4*>(conv_w + static_cast<size_t>(ch4) * KC + 4 * i);
            const float wv[4] = {w4.x, w4.y, w4.z, w4.w};
#pragma unroll
            for (int e = 0; e < 4; ++e) wr[(4 * i + e) / KC][(4 * i + e) % KC] = wv[e];
        }
    } else {
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
            for (int p = 0; p < KC; ++p) wr[j][p] = conv_w[static_cast<size_t>(ch4 + j) * KC + p];
    }
#pragma unroll
    for (int r = 0; r < PREP_TT + HIST; ++r) {
        const int pos = t0 - HIST + r;
        if (pos >= 0 && pos < len) {
            const float4 x4 = *reinterpret_cast<const float4*>(qkv + static_cast<size_t>(start + pos) * conv_dim + ch4);
            xs[r][0] = x4.x;
            xs[r][1] = x4.y;
            xs[r][2] = x4.z;
            xs[r][3] = x4.w;
        } else {
#pragma unroll
            for (int j = 0; j < 4; ++j) xs[r][j] = pos < 0 ? x_at(ch4 + j, pos) : 0.f;
        }
    }
    const bool is_qk = seg < 2 * hk;
    const int h = seg - 2 * hk;
    if (!is_qk && lane < PREP_TT && t0 + lane < len) {
        const size_t tok = static_cast<size_t>(start + t0 + lane);
        gg[tok * hv + h] = -expf(a_log[h]) * softplus_f(a_in[tok * hv + h] + dt_bias[h]);
        bb[tok * hv + h] = 1.f / (1.f + expf(-b_in[tok * hv + h]));
    }
#pragma unroll
    for (int i = 0; i < PREP_TT; ++i) {
        if (t0 + i >= len) break;  // warp-uniform
        float y[4];
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            float acc = 0.f;
#pragma unroll
            for (int p = 0; p < KC; ++p) acc = fmaf(wr[j][p], xs[i + p][j], acc);
            y[j] = silu_fast(acc);
        }
        const size_t tok = static_cast<size_t>(start + t0 + i);
        if (is_qk) {
            const float tot = warp_sum(y[0] * y[0] + y[1] * y[1] + y[2] * y[2] + y[3] * y[3]);
            const float scale = (seg < hk ? rsqrtf(static_cast<float>(D)) : 1.f) * rsqrtf(tot + L2_EPS);
            const size_t off = (seg < hk ? (tok * hk + seg) * D : (tok * hk + (seg - hk)) * D) + 4 * lane;
            if (HALF) {
                const __half2 lo = __floats2half2_rn(y[0] * scale, y[1] * scale);
                const __half2 hi = __floats2half2_rn(y[2] * scale, y[3] * scale);
                st_global_v2(reinterpret_cast<__half*>(seg < hk ? qn : kn) + off,
                             *reinterpret_cast<const uint32_t*>(&lo), *reinterpret_cast<const uint32_t*>(&hi));
            } else {
                st_global_v4((seg < hk ? qn : kn) + off,
                             make_float4(y[0] * scale, y[1] * scale, y[2] * scale, y[3] * scale));
            }
            // The bf16 split's copies (its walk and output launches read these); the f16 split's WY launch writes
            // them from its f16 tiles instead (`gdn_prefill_wy_h_b`), so the HALF form never does.
            if (!HALF && qb != nullptr)
                st_global_v2((seg < hk ? qb : kb) + off, pack_bf16x2(y[0] * scale, y[1] * scale),
                             pack_bf16x2(y[2] * scale, y[3] * scale));
        } else if (HALF) {
            float c[4];
#pragma unroll
            for (int j = 0; j < 4; ++j) c[j] = fminf(fmaxf(y[j], -65504.f), 65504.f);
            const __half2 lo = __floats2half2_rn(c[0], c[1]), hi = __floats2half2_rn(c[2], c[3]);
            st_global_v2(reinterpret_cast<__half*>(vv) + (tok * hv + h) * D + 4 * lane,
                         *reinterpret_cast<const uint32_t*>(&lo), *reinterpret_cast<const uint32_t*>(&hi));
        } else {
            st_global_v4(vv + (tok * hv + h) * D + 4 * lane, make_float4(y[0], y[1], y[2], y[3]));
        }
    }
}

// kconv is 2..=4 (checked in Rust); the window lives in registers, so it is a template argument. Six blocks per SM
// (at most 80 registers, no spill; 88 without the bound, five blocks): the launch waits on its loads (the H200's
// Nsight Compute: 29% achieved occupancy, long-scoreboard stalls the first reason).
#define GDN_PREFILL_PREP_KERNEL(NAME, HALF)                                                                        \
    extern "C" __global__ void __launch_bounds__(128, 6)                                                           \
        NAME(const float* __restrict__ qkv, const float* __restrict__ a_in, const float* __restrict__ b_in,        \
             const float* __restrict__ conv_w, const float* __restrict__ a_log, const float* __restrict__ dt_bias,  \
             const float* __restrict__ conv_in, float* __restrict__ conv_out, const int* __restrict__ meta,         \
             float* __restrict__ qn, float* __restrict__ kn, float* __restrict__ vv, float* __restrict__ gg,        \
             float* __restrict__ bb, __nv_bfloat16* __restrict__ qb, __nv_bfloat16* __restrict__ kb, int hk,        \
             int hv, int kconv) {                                                                                  \
        if (kconv == 4)                                                                                            \
            gdn_prefill_prep_body<4, HALF>(qkv, a_in, b_in, conv_w, a_log, dt_bias, conv_in, conv_out, meta, qn,   \
                                           kn, vv, gg, bb, qb, kb, hk, hv);                                        \
        else if (kconv == 3)                                                                                       \
            gdn_prefill_prep_body<3, HALF>(qkv, a_in, b_in, conv_w, a_log, dt_bias, conv_in, conv_out, meta, qn,   \
                                           kn, vv, gg, bb, qb, kb, hk, hv);                                        \
        else                                                                                                       \
            gdn_prefill_prep_body<2, HALF>(qkv, a_in, b_in, conv_w, a_log, dt_bias, conv_in, conv_out, meta, qn,   \
                                           kn, vv, gg, bb, qb, kb, hk, hv);                                        \
    }

GDN_PREFILL_PREP_KERNEL(gdn_prefill_prep, false)
#if EDGEFIT_LAB
GDN_PREFILL_PREP_KERNEL(gdn_prefill_prep_h, true)
#endif

// Step 2 of the WY builds (warp 0; the caller's barrier follows): the in-chunk inclusive cumulative sum of the 64
// gates in gc, two per lane.
__device__ __forceinline__ void wy_cumsum(float* gc, int tid) {
    if (tid < 32) {
        float a0 = gc[2 * tid], a1 = a0 + gc[2 * tid + 1];
        float run = a1;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const float n = __shfl_up_sync(0xffffffffu, run, o);
            if (tid >= o) run += n;
        }
        const float before = run - a1;
        gc[2 * tid] = before + a0;
        gc[2 * tid + 1] = before + a1;
    }
}

// The chunk a WY block owns (every WY build: grid (max_chunks, Hv, seqs)): chunk c of value head h of sequence s,
// its lc tokens from token tok0, key head kh, and its (head, chunk) slot of the W / U / Aqk regions; lc <= 0 for a
// block past its sequence's chunks, which returns. Every WY build is the prep's programmatic dependent
// (Device::launch_pdl), so this first waits for the prep's end (and its writes) and then lets the launch after the
// WY (the split's walk) become resident as this grid's last blocks start.
struct WyChunk {
    int c, h, s, lc, kh;
    size_t tok0, slot;
};
__device__ __forceinline__ WyChunk wy_chunk(const int* __restrict__ meta, int hk, int hv, int seqs, int n_chunks) {
    pdl_wait();
    pdl_launch_dependents();
    const int c = blockIdx.x, h = blockIdx.y, s = blockIdx.z;
    const int start = meta[s];
    const int len = meta[s + 1] - start;
    return {c, h, s, min(C, len - c * C), h / (hv / hk), static_cast<size_t>(start + c * C),
            static_cast<size_t>(h) * n_chunks + meta[seqs + 1 + s] + c};
}

extern "C" __global__ void __launch_bounds__(256)
    gdn_prefill_wy(const float* __restrict__ qn, const float* __restrict__ kn, const float* __restrict__ vv,
                   const float* __restrict__ gg, const float* __restrict__ bb, const int* __restrict__ meta,
                   float* __restrict__ gcum, float* __restrict__ w_out, float* __restrict__ u_out,
                   float* __restrict__ aqk_out, int hk, int hv, int seqs, int n_chunks) {
    extern __shared__ float4 smem_wy[];
    float* sm = reinterpret_cast<float*>(smem_wy);
    float* Ks = sm;                // [C][KP]
    float* Xs = Ks + C * KP;       // [C][KP]: q, then beta * v
    float* As = Xs + C * KP;       // [C][AP]
    float* Ts = As + C * AP;       // [C][AP]
    float* gc = Ts + C * AP;       // [C]
    float* bt = gc + C;            // [C]

    const auto [c, h, s, lc, kh, tok0, slot] = wy_chunk(meta, hk, hv, seqs, n_chunks);
    if (lc <= 0) return;
    const int tid = threadIdx.x;

    // 1. K and Q rows (zero past the chunk), g, beta; identity T.
    for (int i = tid; i < C * (D / 4); i += 256) {
        const int r = i / (D / 4), c4 = i % (D / 4);
        float4 kv = make_float4(0.f, 0.f, 0.f, 0.f), qv = kv;
        if (r < lc) {
            const size_t off = ((tok0 + r) * hk + kh) * D;
            kv = reinterpret_cast<const float4*>(kn + off)[c4];
            qv = reinterpret_cast<const float4*>(qn + off)[c4];
        }
        *reinterpret_cast<float4*>(Ks + r * KP + 4 * c4) = kv;
        *reinterpret_cast<float4*>(Xs + r * KP + 4 * c4) = qv;
    }
    for (int i = tid; i < C * C; i += 256) Ts[(i / C) * AP + i % C] = (i / C == i % C) ? 1.f : 0.f;
    if (tid < C) {
        gc[tid] = tid < lc ? gg[(tok0 + tid) * hv + h] : 0.f;
        bt[tid] = tid < lc ? bb[(tok0 + tid) * hv + h] : 0.f;
    }
    __syncthreads();
    // 2. In-chunk inclusive cumulative sum of g.
    wy_cumsum(gc, tid);
    __syncthreads();
    if (tid < lc) gcum[(tok0 + tid) * hv + h] = gc[tid];

    // 3. A[i][j] = beta_i e^{G_i-G_j} k_i.k_j (j < i) and Aqk[i][j] = e^{G_i-G_j} q_i.k_j (j <= i).
    float* aqk = aqk_out + slot * C * C;
    for (int e = tid; e < C * C; e += 256) {
        const int i = e / C, j = e % C;
        float kk = 0.f, qk = 0.f;
        if (j <= i) {
            const float4* ki = reinterpret_cast<const float4*>(Ks + i * KP);
            const float4* qi = reinterpret_cast<const float4*>(Xs + i * KP);
            const float4* kj = reinterpret_cast<const float4*>(Ks + j * KP);
#pragma unroll 8
            for (int m = 0; m < D / 4; ++m) {
                const float4 b = kj[m], x = ki[m], q = qi[m];
                kk = fmaf(x.x, b.x, fmaf(x.y, b.y, fmaf(x.z, b.z, fmaf(x.w, b.w, kk))));
                qk = fmaf(q.x, b.x, fmaf(q.y, b.y, fmaf(q.z, b.z, fmaf(q.w, b.w, qk))));
            }
        }
        const float dec = j <= i ? expf(gc[i] - gc[j]) : 0.f;
        As[i * AP + j] = j < i ? bt[i] * kk * dec : 0.f;
        aqk[e] = qk * dec;
    }
    __syncthreads();

    // 4. T = (I + A)^-1 by forward substitution, one row at a time: T[i][j] = -(A[i][j] + sum_{j<m<i} A[i][m]
    // T[m][j]); column j by the 4 adjacent lanes 4j..4j+3, each a quarter of the sum.
    {
        const int j = tid >> 2, part = tid & 3;
        for (int i = 1; i < C; ++i) {
            float acc = 0.f;
            if (j < i)
                for (int m = j + 1 + part; m < i; m += 4) acc = fmaf(As[i * AP + m], Ts[m * AP + j], acc);
            acc += __shfl_xor_sync(0xffffffffu, acc, 1);
            acc += __shfl_xor_sync(0xffffffffu, acc, 2);
            if (part == 0 && j < i) Ts[i * AP + j] = -(As[i * AP + j] + acc);
            __syncthreads();
        }
    }

    // 5. W = T diag(beta e^G) K and U = T diag(beta) V: thread = 8 rows (its warp's) x 4 columns.
    const int c4 = tid & 31, r0 = (tid >> 5) * 8;
    for (int i = tid; i < C * (D / 4); i += 256) {
        const int r = i / (D / 4), q4 = i % (D / 4);
        float4* kp = reinterpret_cast<float4*>(Ks + r * KP) + q4;
        const float f = bt[r] * expf(gc[r]);
        float4 kv = *kp;
        kv.x *= f; kv.y *= f; kv.z *= f; kv.w *= f;
        *kp = kv;
        float4 vval = make_float4(0.f, 0.f, 0.f, 0.f);
        if (r < lc) vval = reinterpret_cast<const float4*>(vv + ((tok0 + r) * hv + h) * D)[q4];
        const float bv = bt[r];
        vval.x *= bv; vval.y *= bv; vval.z *= bv; vval.w *= bv;
        *reinterpret_cast<float4*>(Xs + r * KP + 4 * q4) = vval;
    }
    __syncthreads();
    float4 aw[8], au[8];
#pragma unroll
    for (int r = 0; r < 8; ++r) aw[r] = au[r] = make_float4(0.f, 0.f, 0.f, 0.f);
    const int mmax = min(r0 + 8, lc);  // T[r][m] = 0 for m > r; rows past lc see only zero K/V rows
    for (int m = 0; m < mmax; ++m) {
        const float4 kv = reinterpret_cast<const float4*>(Ks + m * KP)[c4];
        const float4 vval = reinterpret_cast<const float4*>(Xs + m * KP)[c4];
#pragma unroll
        for (int r = 0; r < 8; ++r) {
            const float tr = Ts[(r0 + r) * AP + m];
            aw[r] = f4_fma(tr, kv, aw[r]);
            au[r] = f4_fma(tr, vval, au[r]);
        }
    }
    float4* wo = reinterpret_cast<float4*>(w_out + slot * C * D);
    float4* uo = reinterpret_cast<float4*>(u_out + slot * C * D);
#pragma unroll
    for (int r = 0; r < 8; ++r) {
        wo[(r0 + r) * (D / 4) + c4] = aw[r];
        uo[(r0 + r) * (D / 4) + c4] = au[r];
    }
}

template <int CS>
__device__ __forceinline__ void gdn_prefill_state_body(const float* __restrict__ qn, const float* __restrict__ kn,
                                                       const float* __restrict__ gcum,
                                                       const float* __restrict__ w_in, const float* __restrict__ u_in,
                                                       const float* __restrict__ aqk_in, const int* __restrict__ meta,
                                                       float* __restrict__ state, float* __restrict__ out, int hk,
                                                       int hv, int seqs, int n_chunks) {
    constexpr int CG = CS / 4;       // float4 column groups
    constexpr int RG = 256 / CG;     // row groups
    constexpr int RPT = C / RG;      // output rows per thread
    constexpr int SRPT = D / RG;     // state rows per thread
    static_assert(RPT >= 1 && SRPT >= 1 && RG * CG == 256, "column slice must be 16, 32 or 64");
    extern __shared__ float4 smem_st[];
    float* sm = reinterpret_cast<float*>(smem_st);
    float* Xa = sm;              // [C][KP]: W, then e^{G_L-G} K
    float* Xb = Xa + C * KP;     // [C][KP]: Q
    float* Ss = Xb + C * KP;     // [D][CS]
    float* Dn = Ss + D * CS;     // [C][CS]
    float* Aq = Dn + C * CS;     // [C][AP]
    float* gc = Aq + C * AP;     // [C]

    const int c0 = blockIdx.x * CS, h = blockIdx.y, s = blockIdx.z;
    const int tid = threadIdx.x;
    const int cg = tid % CG, rg = tid / CG;
    const int start = meta[s];
    const int len = meta[s + 1] - start;
    const int nch = (len + C - 1) / C;
    const int kh = h / (hv / hk);
    const size_t vw = static_cast<size_t>(hv) * D;
    float* sg = state + (static_cast<size_t>(s) * hv + h) * D * D + c0;
    // Workspace slot of the sequence's first chunk, read once: inside the chunk loop the barriers (and the
    // cp.async asm's memory clobber) keep the compiler from hoisting the load, and every chunk's W / U / Aqk
    // addresses would wait for it.
    const size_t slot0 = static_cast<size_t>(h) * n_chunks + meta[seqs + 1 + s];

    for (int i = tid; i < D * CG; i += 256) {
        const int r = i / CG, q4 = i % CG;
        *reinterpret_cast<float4*>(Ss + r * CS + 4 * q4) = *reinterpret_cast<const float4*>(sg + r * D + 4 * q4);
    }

    for (int c = 0; c < nch; ++c) {
        const int lc = min(C, len - c * C);
        const size_t tok0 = static_cast<size_t>(start + c * C);
        const size_t slot = slot0 + c;
        const float4* wg = reinterpret_cast<const float4*>(w_in + slot * C * D);
        for (int i = tid; i < C * (D / 4); i += 256) {
            const int r = i / (D / 4), q4 = i % (D / 4);
            *reinterpret_cast<float4*>(Xa + r * KP + 4 * q4) = wg[i];
            float4 qv = make_float4(0.f, 0.f, 0.f, 0.f);
            if (r < lc) qv = reinterpret_cast<const float4*>(qn + ((tok0 + r) * hk + kh) * D)[q4];
            *reinterpret_cast<float4*>(Xb + r * KP + 4 * q4) = qv;
        }
        const float* ag = aqk_in + slot * C * C;
        for (int i = tid; i < C * C; i += 256) Aq[(i / C) * AP + i % C] = ag[i];
        if (tid < C) gc[tid] = tid < lc ? gcum[(tok0 + tid) * hv + h] : 0.f;
        __syncthreads();

        // a. W S and Q S for this thread's RPT rows x 4 columns.
        float4 accw[RPT], accq[RPT];
#pragma unroll
        for (int r = 0; r < RPT; ++r) accw[r] = accq[r] = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll 4
        for (int i = 0; i < D; ++i) {
            const float4 sv = *reinterpret_cast<const float4*>(Ss + i * CS + 4 * cg);
#pragma unroll
            for (int r = 0; r < RPT; ++r) {
                const int row = rg * RPT + r;
                accw[r] = f4_fma(Xa[row * KP + i], sv, accw[r]);
                accq[r] = f4_fma(Xb[row * KP + i], sv, accq[r]);
            }
        }
        // D = U - W S (rows past the chunk: U and W rows are zero, so D is zero).
        const float4* ug = reinterpret_cast<const float4*>(u_in + slot * C * D + c0);
#pragma unroll
        for (int r = 0; r < RPT; ++r) {
            const int row = rg * RPT + r;
            const float4 u = ug[row * (D / 4) + cg];
            *reinterpret_cast<float4*>(Dn + row * CS + 4 * cg) =
                make_float4(u.x - accw[r].x, u.y - accw[r].y, u.z - accw[r].z, u.w - accw[r].w);
        }
        __syncthreads();  // Dn complete; Xa (W) free

        // b. K scaled by e^{G_L-G_t} into Xa for the state update.
        const float gl = gc[lc - 1];
        for (int i = tid; i < C * (D / 4); i += 256) {
            const int r = i / (D / 4), q4 = i % (D / 4);
            float4 kv = make_float4(0.f, 0.f, 0.f, 0.f);
            if (r < lc) {
                kv = reinterpret_cast<const float4*>(kn + ((tok0 + r) * hk + kh) * D)[q4];
                const float f = expf(gl - gc[r]);
                kv.x *= f; kv.y *= f; kv.z *= f; kv.w *= f;
            }
            *reinterpret_cast<float4*>(Xa + r * KP + 4 * q4) = kv;
        }
        // c. Output e^{G_t} (Q S)_t + sum_s Aqk[t][s] D_s, unnormalised.
#pragma unroll
        for (int r = 0; r < RPT; ++r) {
            const int row = rg * RPT + r;
            const float e = expf(gc[row]);
            float4 o = make_float4(accq[r].x * e, accq[r].y * e, accq[r].z * e, accq[r].w * e);
            for (int m = 0; m <= row; ++m) o = f4_fma(Aq[row * AP + m], *reinterpret_cast<const float4*>(Dn + m * CS + 4 * cg), o);
            if (row < lc) *reinterpret_cast<float4*>(out + (tok0 + row) * vw + h * D + c0 + 4 * cg) = o;
        }
        __syncthreads();  // scaled K in Xa

        // d. S <- e^{G_L} S + (e^{G_L-G} K)^T D on this thread's SRPT state rows x 4 columns.
        {
            const float el = expf(gl);
            float4 sacc[SRPT];
#pragma unroll
            for (int r = 0; r < SRPT; ++r) {
                const float4 sv = *reinterpret_cast<const float4*>(Ss + (rg * SRPT + r) * CS + 4 * cg);
                sacc[r] = make_float4(sv.x * el, sv.y * el, sv.z * el, sv.w * el);
            }
            for (int t = 0; t < lc; ++t) {
                const float4 dv = *reinterpret_cast<const float4*>(Dn + t * CS + 4 * cg);
#pragma unroll
                for (int r = 0; r < SRPT; ++r) sacc[r] = f4_fma(Xa[t * KP + rg * SRPT + r], dv, sacc[r]);
            }
#pragma unroll
            for (int r = 0; r < SRPT; ++r) *reinterpret_cast<float4*>(Ss + (rg * SRPT + r) * CS + 4 * cg) = sacc[r];
        }
        __syncthreads();  // state complete before the next chunk reads it; tiles free
    }

    for (int i = tid; i < D * CG; i += 256) {
        const int r = i / CG, q4 = i % CG;
        *reinterpret_cast<float4*>(sg + r * D + 4 * q4) = *reinterpret_cast<const float4*>(Ss + r * CS + 4 * q4);
    }
}

#define GDN_STATE_KERNEL(CS)                                                                                        \
    extern "C" __global__ void __launch_bounds__(256) gdn_prefill_state_cs##CS(                                    \
        const float* __restrict__ qn, const float* __restrict__ kn, const float* __restrict__ gcum,                \
        const float* __restrict__ w_in, const float* __restrict__ u_in, const float* __restrict__ aqk_in,          \
        const int* __restrict__ meta, float* __restrict__ state, float* __restrict__ out, int hk, int hv, int seqs, \
        int n_chunks) {                                                                                             \
        gdn_prefill_state_body<CS>(qn, kn, gcum, w_in, u_in, aqk_in, meta, state, out, hk, hv, seqs, n_chunks);     \
    }

// `Auto` runs the tensor-core state kernel; the fp32 one serves the engine's precise path ("fp32_cs32").
GDN_STATE_KERNEL(32)
#if EDGEFIT_LAB
GDN_STATE_KERNEL(16)
GDN_STATE_KERNEL(64)
#endif

// ---------------------------------------------------------------------------------------------------------------
// Tensor-core build of the sequential state walk: gdn_prefill_state_tc<SPLIT>_cs<CS>. Same grid, inputs, outputs
// and algebra as gdn_prefill_state_cs<CS> (a drop-in for launch 3), but the four per-chunk products run on
// `mma.sync.m16n8k8` TF32 with fp32 accumulation instead of CUDA-core FMAs:
//   a. P = W S and R = Q S ([64 x 128] x [128 x CS]): warp w owns m-tile (w & 3) and n-tiles (w >> 2) * CS/16 ..;
//   c. O = e^G R + Aqk D ([64 x 64] x [64 x CS], causal: k-steps past the m-tile's last row are skipped);
//   d. S = e^{G_L} S + Kd^T D ([128 x 64] x [64 x CS]): warp w owns state rows 16w .. 16w+15, all CS columns.
// The state stays fp32 in shared memory and every accumulation is fp32; only the mma operands are rounded.
// SPLIT = 1 is the 3xTF32 scheme (x = hi + lo, both TF32; hi*hi + hi*lo + lo*hi), which keeps the products at
// about fp32 accuracy (the dropped lo*lo term is ~2^-22 relative) for 3x the mma count, still a small part of
// the chunk's time; SPLIT = 0 is plain TF32 (operands rounded to 10 mantissa bits, ~5e-4 relative per product).
// Bank layout: S and D tiles have rows of CS + 8 floats and Aqk rows of 68, so the B fragments (k = lane & 3,
// n = lane >> 2) and A fragments (m = lane >> 2, k = lane & 3) of a warp hit 32 distinct banks; the Kd^T A
// fragments read the [C][KP] tile column-wise with a 2-way conflict. The K rows of the chunk are loaded to registers
// before phase a, so their latency hides behind the W S / Q S products.
namespace {

constexpr int QP = C + 4;  // padded row of the Aqk tile of the tensor-core state kernel

// The TF32 operand of x, rounded to nearest with ties away from zero (what cvt.rna.tf32.f32 gives for finite x),
// in one integer add: the tensor core reads only the top 19 bits of a .tf32 register (it ignores the low 13), so
// adding half a TF32 ulp (0x1000) to the fp32 bits rounds the magnitude, a carry into the exponent included.
// cvt.rna.tf32.f32 is no single instruction on sm_90: ptxas expands it to a NaN test and the rounding (FSETP,
// IMAD, LOP3, SEL), and 's profile (benchmarks/h200.md) those conversions were the largest
// share of the instructions of the state walk's W S / Q S phase (12.6 M FSETP and 14.5 M IMAD against 6.3 M HMMA
// at T = 4096) and of both WY products. Inputs here are finite (l2-normed keys, gates, state), so the NaN test
// bought nothing.
__device__ __forceinline__ uint32_t tf32_round(float x) { return __float_as_uint(x) + 0x1000u; }

// One operand fragment: hi (TF32) and, when split, lo = TF32(x - hi). The split needs hi exact (its low 13 bits
// cleared), so that x - hi is exact in fp32. RAW (plain TF32 only): x's fp32 bits as they are, so the tensor core
// truncates them to TF32 (no rounding add per fragment register; for the bf16 split's WY:
// kernels/bench/gdn_operand_precision.py puts all three WY products truncated at 1.76e-2 / 1.45e-3 on the
// output / state against 1.72e-2 / 1.15e-3 rounded, both inside the split's class).
template <int N, bool SPLIT, bool RAW = false>
struct TfFrag {
    uint32_t hi[N];
    uint32_t lo[N];
    __device__ __forceinline__ void set(int i, float x) {
        if (SPLIT) {
            hi[i] = tf32_round(x) & 0xffffe000u;
            lo[i] = tf32_round(x - __uint_as_float(hi[i]));
        } else if (RAW) {
            hi[i] = __float_as_uint(x);
        } else {
            hi[i] = tf32_round(x);
        }
    }
};

__device__ __forceinline__ void mma_tf32(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
    asm volatile(
        "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// d += a b (m16n8k8), with the small cross terms first when split.
template <bool SPLIT, bool RAW>
__device__ __forceinline__ void mma_acc(float (&d)[4], const TfFrag<4, SPLIT, RAW>& a,
                                        const TfFrag<2, SPLIT, RAW>& b) {
    if (SPLIT) {
        mma_tf32(d, a.lo, b.hi);
        mma_tf32(d, a.hi, b.lo);
    }
    mma_tf32(d, a.hi, b.hi);
}

// A fragment (16 x 8, row-major) at rows m0.., columns k0.. of a row-major tile with row stride ld:
// a0 (g, t), a1 (g+8, t), a2 (g, t+4), a3 (g+8, t+4), g = lane >> 2, t = lane & 3. One ldmatrix.x4 instead of
// four 4-byte loads: an 8 x 4 block of fp32 is an 8 x 8 b16 matrix, and ldmatrix hands lane l the 32-bit word at
// row l / 4, word l % 4 of each, which is exactly a TF32 fragment register (matrix i: rows m0 + 8 (i & 1) ..,
// columns k0 + 4 (i >> 1) ..; lane l gives row l & 7 of matrix l >> 3). Needs 16-byte aligned rows (ld and k0
// multiples of 4); with ld = 4 mod 32 (KP = 132, QP = 68) the eight rows of a matrix hit eight bank groups. The
// same values as the scalar loads, so the same bits (s9: the KK^T / QK^T phase of the WY issued 5.6 M LDS).
template <bool SPLIT, bool RAW>
__device__ __forceinline__ void load_a(TfFrag<4, SPLIT, RAW>& f, const float* tile, int ld, int m0, int k0,
                                       int lane) {
    uint32_t r[4];
    ldmatrix_x4(r, tile + (m0 + 8 * ((lane >> 3) & 1) + (lane & 7)) * ld + k0 + 4 * (lane >> 4));
#pragma unroll
    for (int i = 0; i < 4; ++i) f.set(i, __uint_as_float(r[i]));
}

// A fragment of the transpose of a row-major tile: A[m][k] = tile[k][m].
template <bool SPLIT, bool RAW>
__device__ __forceinline__ void load_at(TfFrag<4, SPLIT, RAW>& f, const float* tile, int ld, int m0, int k0,
                                        int lane) {
    const float* p = tile + (k0 + (lane & 3)) * ld + m0 + (lane >> 2);
    f.set(0, p[0]);
    f.set(1, p[8]);
    f.set(2, p[4 * ld]);
    f.set(3, p[4 * ld + 8]);
}

// B fragment (8 x 8, B[k][n] = tile[k][n] of a row-major tile): b0 (k = t, n = g), b1 (k = t+4, n = g).
template <bool SPLIT, bool RAW>
__device__ __forceinline__ void load_b(TfFrag<2, SPLIT, RAW>& f, const float* tile, int ld, int k0, int n0,
                                       int lane) {
    const float* p = tile + (k0 + (lane & 3)) * ld + n0 + (lane >> 2);
    f.set(0, p[0]);
    f.set(1, p[4 * ld]);
}

}  // namespace

// Chunk buffers of gdn_prefill_state_tc*_cs<CS>: two at CS = 64, where the next chunk's W, Q, Aqk and G rows
// stream in (cp.async) while this chunk is multiplied; one at CS = 16 and 32, which keep two blocks per SM.
__host__ __device__ constexpr int state_tc_buffers(int cs) { return cs == 64 ? 2 : 1; }

// Shared memory of gdn_prefill_state_tc*_cs<CS> (dynamic): per chunk buffer two [C][KP] tiles and Aqk [C][QP] with
// G_t in column C of row t (the padding); S [D][CS+8] and D [C][CS+8]. 115,712 bytes at CS = 32: two blocks per
// SM exactly fill the 228 KiB (with the 1 KiB the driver reserves per block), and __launch_bounds__(256, 2) keeps
// the registers at <= 128 so that the register file allows two as well (the launch asks for the maximum
// carveout). 225,280 bytes at CS = 64 (two chunk buffers), one block per SM.
__host__ __device__ constexpr int state_tc_smem_bytes(int cs) {
    return ((2 * C * KP + C * QP) * state_tc_buffers(cs) + D * (cs + 8) + C * (cs + 8)) * 4;
}

template <int CS, bool SPLIT>
__device__ __forceinline__ void gdn_prefill_state_tc_body(const float* __restrict__ qn, const float* __restrict__ kn,
                                                          const float* __restrict__ gcum,
                                                          const float* __restrict__ w_in,
                                                          const float* __restrict__ u_in,
                                                          const float* __restrict__ aqk_in,
                                                          const int* __restrict__ meta, float* __restrict__ state,
                                                          float* __restrict__ out, int hk, int hv, int seqs,
                                                          int n_chunks) {
    constexpr int NT = CS / 8;        // n-tiles of the column slice
    constexpr int NH = NT / 2;        // n-tiles per warp in phases a and c
    constexpr int SP = CS + 8;        // padded row of the S and D tiles
    constexpr int KR = C * (D / 4) / 256;  // float4 K loads per thread
    static_assert(CS == 16 || CS == 32 || CS == 64, "column slice must be 16, 32 or 64");
    constexpr int NB = state_tc_buffers(CS);  // 1 or 2 (indices below are & (NB - 1))
    constexpr int BUF = 2 * C * KP + C * QP;  // floats per chunk buffer
    extern __shared__ float4 smem_tc[];
    float* sm = reinterpret_cast<float*>(smem_tc);
    float* Ss = sm + NB * BUF;   // [D][SP]
    float* Dn = Ss + D * SP;     // [C][SP]

    const int c0 = blockIdx.x * CS, h = blockIdx.y, s = blockIdx.z;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int fg = lane >> 2, ft = lane & 3;  // fragment row group / column pair
    const int start = meta[s];
    const int len = meta[s + 1] - start;
    const int nch = (len + C - 1) / C;
    const int kh = h / (hv / hk);
    const size_t vw = static_cast<size_t>(hv) * D;
    float* sg = state + (static_cast<size_t>(s) * hv + h) * D * D + c0;
    // Workspace slot of the sequence's first chunk, read once: inside the chunk loop the barriers (and the
    // cp.async asm's memory clobber) keep the compiler from hoisting the load, and every chunk's W / U / Aqk
    // addresses would wait for it.
    const size_t slot0 = static_cast<size_t>(h) * n_chunks + meta[seqs + 1 + s];
    const int am = (warp & 3) * 16;       // phases a and c: this warp's 16 rows of the chunk
    const int an = (warp >> 2) * NH * 8;  // ... and its first column within the slice
    const int dm = warp * 16;             // phase d: this warp's 16 state rows

    for (int i = tid; i < D * (CS / 4); i += 256) {
        const int r = i / (CS / 4), q4 = i % (CS / 4);
        *reinterpret_cast<float4*>(Ss + r * SP + 4 * q4) = *reinterpret_cast<const float4*>(sg + r * D + 4 * q4);
    }

    // Chunk cc's W, Q (zero rows past the chunk), Aqk and G rows into chunk buffer b, as cp.async copies.
    auto fetch = [&](int cc, int b) {
        const int lc = min(C, len - cc * C);
        const size_t tok0 = static_cast<size_t>(start + cc * C);
        const size_t slot = slot0 + cc;
        float* xa = sm + b * BUF;
        float* xb = xa + C * KP;
        float* aq = xb + C * KP;
        const float* wg = w_in + slot * C * D;
        for (int i = tid; i < C * (D / 4); i += 256) {
            const int r = i >> 5, q4 = i & 31;  // D / 4 = 32 float4 per row
            cp_async16(xa + r * KP + 4 * q4, wg + 4 * i, true);
            const bool ok = r < lc;
            cp_async16(xb + r * KP + 4 * q4, ok ? qn + ((tok0 + r) * hk + kh) * D + 4 * q4 : qn, ok);
        }
        const float* ag = aqk_in + slot * C * C;
        for (int i = tid; i < C * (C / 4); i += 256) {
            const int r = i >> 4, q4 = i & 15;  // C / 4 = 16 float4 per row
            cp_async16(aq + r * QP + 4 * q4, ag + 4 * i, true);
        }
        if (tid < C) cp_async4(aq + tid * QP + C, tid < lc ? gcum + (tok0 + tid) * hv + h : gcum, tid < lc);
    };
    // Chunk cc's K rows (this thread's float4s, for phase b) and this warp's U fragments (for D), to registers.
    struct ChunkRegs {
        float4 k[KR];
        float2 ulo[NH], uhi[NH];
    };
    auto load_regs = [&](int cc, ChunkRegs& rg) {
        const int lc = min(C, len - cc * C);
        const size_t tok0 = static_cast<size_t>(start + cc * C);
#pragma unroll
        for (int j = 0; j < KR; ++j) {
            const int i = tid + 256 * j, r = i / (D / 4), q4 = i % (D / 4);
            rg.k[j] = make_float4(0.f, 0.f, 0.f, 0.f);
            if (r < lc) rg.k[j] = reinterpret_cast<const float4*>(kn + ((tok0 + r) * hk + kh) * D)[q4];
        }
        const float* ug = u_in + (slot0 + cc) * C * D + c0;
#pragma unroll
        for (int j = 0; j < NH; ++j) {
            const int col = an + 8 * j + 2 * ft;
            rg.ulo[j] = *reinterpret_cast<const float2*>(ug + (am + fg) * D + col);
            rg.uhi[j] = *reinterpret_cast<const float2*>(ug + (am + fg + 8) * D + col);
        }
    };

    // One chunk. Two buffers (CS = 64): chunk c + 1's W, Q, Aqk and G stream into the other shared buffer (free:
    // chunk c - 1 ended with a barrier) and its K and U into the other register set `nxt` while chunk c is
    // multiplied from `cur`, so no load of the walk waits a round trip. One buffer: chunk c's loads now, in
    // flight during phase a.
    auto step = [&](int c, ChunkRegs& cur, ChunkRegs& nxt) {
        const int lc = min(C, len - c * C);
        const size_t tok0 = static_cast<size_t>(start + c * C);
        const int ahead = NB == 2 ? c + 1 : c;  // the chunk whose loads are issued now
        if (ahead < nch) fetch(ahead, ahead & (NB - 1));
        cp_async_commit();  // also when empty, so that the wait below always leaves exactly chunk c + 1
        if (ahead < nch) load_regs(ahead, NB == 2 ? nxt : cur);
        cp_async_wait<NB - 1>();  // chunk c's copies (this thread's; the barrier below publishes everyone's)
        const float4* kreg = cur.k;
        const float2* ulo = cur.ulo;
        const float2* uhi = cur.uhi;
        float* Xa = sm + (c & (NB - 1)) * BUF;  // [C][KP]: W, then e^{G_L-G} K
        float* Xb = Xa + C * KP;                // [C][KP]: Q
        float* Aq = Xb + C * KP;                // [C][QP]
        float* gc = Aq + C;  // G_t at gc[t * QP]: column C of the Aqk tile (padding the mma never reads)
        __syncthreads();

        // a. P = W S and R = Q S on this warp's 16 rows x NH n-tiles.
        float pw[NH][4], pq[NH][4];
#pragma unroll
        for (int j = 0; j < NH; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) pw[j][e] = pq[j][e] = 0.f;
#pragma unroll 2
        for (int k0 = 0; k0 < D; k0 += 8) {
            TfFrag<4, SPLIT> fw, fq;
            load_a(fw, Xa, KP, am, k0, lane);
            load_a(fq, Xb, KP, am, k0, lane);
#pragma unroll
            for (int j = 0; j < NH; ++j) {
                TfFrag<2, SPLIT> fb;
                load_b(fb, Ss, SP, k0, an + 8 * j, lane);
                mma_acc<SPLIT>(pw[j], fw, fb);
                mma_acc<SPLIT>(pq[j], fq, fb);
            }
        }
        // D = U - W S (rows past the chunk: U and W rows are zero, so D is zero).
#pragma unroll
        for (int j = 0; j < NH; ++j) {
            const int col = an + 8 * j + 2 * ft;
            *reinterpret_cast<float2*>(Dn + (am + fg) * SP + col) = make_float2(ulo[j].x - pw[j][0], ulo[j].y - pw[j][1]);
            *reinterpret_cast<float2*>(Dn + (am + fg + 8) * SP + col) =
                make_float2(uhi[j].x - pw[j][2], uhi[j].y - pw[j][3]);
        }
        __syncthreads();  // Dn complete; Xa (W) free

        // b. K scaled by e^{G_L-G_t} into Xa for the state update.
        const float gl = gc[(lc - 1) * QP];
#pragma unroll
        for (int j = 0; j < KR; ++j) {
            const int i = tid + 256 * j, r = i / (D / 4), q4 = i % (D / 4);
            const float f = r < lc ? expf(gl - gc[r * QP]) : 0.f;
            float4 kv = kreg[j];
            kv.x *= f; kv.y *= f; kv.z *= f; kv.w *= f;
            *reinterpret_cast<float4*>(Xa + r * KP + 4 * q4) = kv;
        }
        // c. Output e^{G_t} (Q S)_t + sum_{s<=t} Aqk[t][s] D_s, unnormalised; Aqk is zero above the diagonal, so
        // the k-steps stop at this warp's last row.
        {
            const float e0 = expf(gc[(am + fg) * QP]), e1 = expf(gc[(am + fg + 8) * QP]);
            float o[NH][4];
#pragma unroll
            for (int j = 0; j < NH; ++j) {
                o[j][0] = pq[j][0] * e0;
                o[j][1] = pq[j][1] * e0;
                o[j][2] = pq[j][2] * e1;
                o[j][3] = pq[j][3] * e1;
            }
            for (int k0 = 0; k0 < am + 16; k0 += 8) {
                TfFrag<4, SPLIT> fa;
                load_a(fa, Aq, QP, am, k0, lane);
#pragma unroll
                for (int j = 0; j < NH; ++j) {
                    TfFrag<2, SPLIT> fb;
                    load_b(fb, Dn, SP, k0, an + 8 * j, lane);
                    mma_acc<SPLIT>(o[j], fa, fb);
                }
            }
            const int r0 = am + fg, r1 = am + fg + 8;
#pragma unroll
            for (int j = 0; j < NH; ++j) {
                const int col = c0 + an + 8 * j + 2 * ft;
                if (r0 < lc)
                    *reinterpret_cast<float2*>(out + (tok0 + r0) * vw + h * D + col) = make_float2(o[j][0], o[j][1]);
                if (r1 < lc)
                    *reinterpret_cast<float2*>(out + (tok0 + r1) * vw + h * D + col) = make_float2(o[j][2], o[j][3]);
            }
        }
        __syncthreads();  // scaled K in Xa

        // d. S <- e^{G_L} S + (e^{G_L-G} K)^T D on this warp's 16 state rows x CS columns.
        {
            const float el = expf(gl);
            float sacc[NT][4];
#pragma unroll
            for (int n = 0; n < NT; ++n) {
                const float2 a = *reinterpret_cast<const float2*>(Ss + (dm + fg) * SP + 8 * n + 2 * ft);
                const float2 b = *reinterpret_cast<const float2*>(Ss + (dm + fg + 8) * SP + 8 * n + 2 * ft);
                sacc[n][0] = a.x * el;
                sacc[n][1] = a.y * el;
                sacc[n][2] = b.x * el;
                sacc[n][3] = b.y * el;
            }
            const int kend = (lc + 7) & ~7;  // Kd and D rows past the chunk are zero
            for (int k0 = 0; k0 < kend; k0 += 8) {
                TfFrag<4, SPLIT> fa;
                load_at(fa, Xa, KP, dm, k0, lane);
#pragma unroll
                for (int n = 0; n < NT; ++n) {
                    TfFrag<2, SPLIT> fb;
                    load_b(fb, Dn, SP, k0, 8 * n, lane);
                    mma_acc<SPLIT>(sacc[n], fa, fb);
                }
            }
#pragma unroll
            for (int n = 0; n < NT; ++n) {
                *reinterpret_cast<float2*>(Ss + (dm + fg) * SP + 8 * n + 2 * ft) = make_float2(sacc[n][0], sacc[n][1]);
                *reinterpret_cast<float2*>(Ss + (dm + fg + 8) * SP + 8 * n + 2 * ft) =
                    make_float2(sacc[n][2], sacc[n][3]);
            }
        }
        __syncthreads();  // state complete before the next chunk reads it; tiles free
    };
    ChunkRegs ra, rb;
    if (NB == 2 && nch > 0) {  // an empty sequence has no chunk 0: its slot may lie past the workspace regions
        fetch(0, 0);
        cp_async_commit();
        load_regs(0, ra);
    }
    for (int c = 0; c < nch; c += 2) {  // two chunks per trip, so that the register sets swap by name
        step(c, ra, rb);
        if (c + 1 < nch) step(c + 1, rb, ra);
    }

    for (int i = tid; i < D * (CS / 4); i += 256) {
        const int r = i / (CS / 4), q4 = i % (CS / 4);
        *reinterpret_cast<float4*>(sg + r * D + 4 * q4) = *reinterpret_cast<const float4*>(Ss + r * SP + 4 * q4);
    }
}

#define GDN_STATE_TC_KERNEL(SPLITN, CS)                                                                           \
    extern "C" __global__ void __launch_bounds__(256, (CS) <= 32 ? 2 : 1) gdn_prefill_state_tc##SPLITN##_cs##CS( \
        const float* __restrict__ qn, const float* __restrict__ kn, const float* __restrict__ gcum,               \
        const float* __restrict__ w_in, const float* __restrict__ u_in, const float* __restrict__ aqk_in,         \
        const int* __restrict__ meta, float* __restrict__ state, float* __restrict__ out, int hk, int hv,          \
        int seqs, int n_chunks) {                                                                                  \
        gdn_prefill_state_tc_body<CS, SPLITN == 3>(qn, kn, gcum, w_in, u_in, aqk_in, meta, state, out, hk, hv,     \
                                                   seqs, n_chunks);                                                \
    }

// `Auto` (Gpu::GDN_PREFILL_DEFAULT, wytf32x3_tf32_cs64) runs tc1_cs64; the rest are the lab's.
GDN_STATE_TC_KERNEL(1, 64)
#if EDGEFIT_LAB
GDN_STATE_TC_KERNEL(1, 16)
GDN_STATE_TC_KERNEL(1, 32)
GDN_STATE_TC_KERNEL(3, 16)
GDN_STATE_TC_KERNEL(3, 32)
GDN_STATE_TC_KERNEL(3, 64)
#endif

// ---------------------------------------------------------------------------------------------------------------
// Tensor-core build of the chunk-local WY launch: gdn_prefill_wy_tc<1|3>. Same grid, inputs, outputs and algebra
// as gdn_prefill_wy (a drop-in for launch 2, same fp32 workspace), but its three products run on
// `mma.sync.m16n8k8` TF32 with fp32 accumulation (the fragment helpers of the state kernel above):
//   3. K K^T and Q K^T ([64 x 128] x [128 x 64]): warp w owns m-tile (w & 3) and n-tiles 4 (w >> 2) .. +3; the
//      n-tiles wholly above the diagonal are skipped (their outputs are written as zeros);
//   6. W = T (diag(beta e^G) K) and U = T (diag(beta) V) ([64 x 64] x [64 x 128]): warp w owns m-tile (w & 3) and
//      n-tiles 8 (w >> 2) .. +7 of both; T is lower triangular, so the k-steps stop at the m-tile's last row.
// T = (I + A)^-1 is fp32 on the CUDA cores, blocked: the four 16 x 16 diagonal blocks by forward
// substitution in registers (a half-warp each, while the other six warps scale K), then the
// blocks below the diagonal from them, one distance from the diagonal at a time (steps 5a and 5b below);
// gdn_prefill_wy keeps the row-at-a-time substitution over all 64 rows (63 block barriers). Per (chunk, head)
// this moves the 4.2 MFLOP of the three products (2 * 64*64*128 * 2 for K K^T and Q K^T, the same for W and U,
// before the triangular savings) from CUDA-core FMAs (~8 K FMAs per thread) to at most 256 mma per warp (768 for
// 3xTF32).
// SPLIT: 3xTF32 as in the state kernel (~fp32 accuracy), else plain TF32 (~5e-4 relative per operand).
// Bank layout: K / Q / V tiles [C][KP] (A fragments and the K^T B fragments conflict-free, the row-major B
// fragments of step 6 2-way), A and T tiles [C][QP] (T's A fragments conflict-free).
// Loads: K, Q, g, beta by cp.async all at once, then V (into the A / T tiles, unused until step 3's
// epilogue) as a second group in flight during steps 2 and 3; A and K^T fragments by ldmatrix (load_a, load_bt).
// T = 4096 -> later build: 370.8 -> 338.1 us (3xTF32), 294.6 -> 270.2 us (plain TF32); most of it the
// cp.async loads (342.8 / 274.6 with them alone), which took the kernel's first stretch from 24% of the
// stall samples (the plain loads went out two at a time, eight round trips) to 10%. What the profile of this
// build shows next (`_b` form): step 3 41% of the samples (its instructions mostly the TF32 rounding
// adds and the fragment loads) and the barrier after it 23% (warps 0..7 hold 2, 0, 4, 0, 4, 2, 4, 4 of the 20
// n-tiles at or below the diagonal, so most wait for the busiest), the loads 11%, the inverse and W / U 19%.
__host__ __device__ constexpr int wy_tc_smem_bytes() { return (2 * C * KP + 2 * C * QP + 2 * C) * 4; }

namespace {

// B fragment of the transpose of a row-major tile (B[k][n] = tile[n][k]): b0 (k = t, n = g), b1 (k = t+4, n = g).
// One ldmatrix.x2 (load_a's reading of fp32 blocks as b16 matrices: matrix i at rows n0 .., columns k0 + 4 i ..;
// lanes 0..15 give the row addresses, the rest are ignored).
template <bool SPLIT, bool RAW>
__device__ __forceinline__ void load_bt(TfFrag<2, SPLIT, RAW>& f, const float* tile, int ld, int k0, int n0,
                                        int lane) {
    uint32_t r[2];
    ldmatrix_x2(r, tile + (n0 + (lane & 7)) * ld + k0 + 4 * ((lane >> 3) & 1));
    f.set(0, __uint_as_float(r[0]));
    f.set(1, __uint_as_float(r[1]));
}

}  // namespace

namespace {

// Step 1 of the tensor-core WY builds: the chunk's K and Q rows (the key head's; zero past the chunk), g and beta
// into shared memory as one cp.async group, then the V rows as a second (the caller waits for the first with
// cp_async_wait<1>). E: float (the TF32 builds, tiles of row stride KP) or __half (the f16 build, BP); every copy
// is 16 bytes, all of them in flight at once (the plain loads they replaced went out two at a time).
template <typename E, int LD>
__device__ __forceinline__ void wy_load_chunk(E* Ks, E* Qs, E* Vs, float* gc, float* bt, const E* __restrict__ kn,
                                              const E* __restrict__ qn, const E* __restrict__ vv,
                                              const float* __restrict__ gg, const float* __restrict__ bb,
                                              size_t tok0, int lc, int hk, int kh, int hv, int h, int tid) {
    constexpr int PER = 16 / static_cast<int>(sizeof(E)), ROWQ = D / PER;  // elements per copy, copies per row
    constexpr int SH = ROWQ == 32 ? 5 : 4;
    static_assert(ROWQ == 1 << SH, "16 or 32 copies per row");
    constexpr int ld = LD;
#pragma unroll
    for (int j = 0; j < C * ROWQ / 256; ++j) {
        const int i = tid + 256 * j, r = i >> SH, q = i & (ROWQ - 1);
        const bool ok = r < lc;
        const size_t off = ((tok0 + r) * hk + kh) * D + PER * q;
        cp_async16(Ks + r * ld + PER * q, ok ? kn + off : kn, ok);
        cp_async16(Qs + r * ld + PER * q, ok ? qn + off : qn, ok);
    }
    if (tid < C) {
        const bool ok = tid < lc;
        cp_async4(gc + tid, ok ? gg + (tok0 + tid) * hv + h : gg, ok);
        cp_async4(bt + tid, ok ? bb + (tok0 + tid) * hv + h : bb, ok);
    }
    cp_async_commit();
#pragma unroll
    for (int j = 0; j < C * ROWQ / 256; ++j) {
        const int i = tid + 256 * j, r = i >> SH, q = i & (ROWQ - 1);
        const bool ok = r < lc;
        cp_async16(Vs + r * ld + PER * q, ok ? vv + ((tok0 + r) * hv + h) * D + PER * q : vv, ok);
    }
    cp_async_commit();
}

// The bf16 split's ready counters, one int per (head, chunk) slot, in the Aqk region past the bf16 Aqk
// the `_b` WY launches write (its second half, unused by the split): zeroed by the WY launch, raised by each of
// the walk's two column blocks once it has written the chunk's hs slot, and waited for (== 2) by the output
// launch, which runs as the walk's programmatic dependent so that its blocks fill the SMs the walk leaves idle.
// The host passes the same address to the walk and the output launch (cuda/gdn_prefill.rs).
__device__ __forceinline__ int* split_ready(float* aqk, int hv, int n_chunks) {
    return reinterpret_cast<int*>(aqk) + static_cast<size_t>(hv) * n_chunks * C * C / 2;
}

// Step 3's share of warp w of the tensor-core WY builds: the 20 n-tiles (8 columns) at or below the diagonal blocks
// of A and Aqk (m-tile t of 16 rows reaches n-tile 2t + 1), each warp one m-tile and at most 3 of its n-tiles
// (an earlier patch, measured). Byte w of kShare: m-tile (bits 0-1), first n-tile (2-4), n-tiles
// (5-6): 3/0/3, 3/3/3, 2/0/3, 2/3/3, 3/6/2, 1/0/2, 1/2/2, 0/0/2.
struct WyShare {
    int m0, n0, nn;  // first row, first column, n-tiles
    __device__ __forceinline__ explicit WyShare(int warp) {
        constexpr unsigned long long kShare = 0x4049415B6E626F63ull;
        const unsigned code = static_cast<unsigned>(kShare >> (8 * warp)) & 0xffu;
        m0 = 16 * static_cast<int>(code & 3u);
        n0 = 8 * static_cast<int>((code >> 2) & 7u);
        nn = static_cast<int>(code >> 5);
    }
};

// Step 3's epilogue: the warp's K K^T and Q K^T fragments (kk, qk, the m16n8 accumulator layout) decayed and
// masked: kk becomes A (beta_i e^{G_i-G_j}, j < i; stored to shared memory by wy_store_a after the caller's
// barrier), qk goes to the chunk's Aqk slot (bf16 when BOUT); the slot's blocks past the diagonal blocks are zeroed.
template <bool BOUT>
__device__ __forceinline__ void wy_step3_epilogue(float (&kk)[3][4], const float (&qk)[3][4], const WyShare& sh,
                                                  const float* gc, const float* bt, float* aqk_out, size_t slot,
                                                  int fg, int ft, int tid) {
    const int sm = sh.m0, sn = sh.n0, nn = sh.nn;
    float* aqk = aqk_out + slot * C * C;
    __nv_bfloat16* aqk_b = reinterpret_cast<__nv_bfloat16*>(aqk_out) + slot * C * C;
#pragma unroll
    for (int j = 0; j < 3; ++j) {
        if (j >= nn) continue;
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) {
            const int i = sm + fg + 8 * hf;
            const int jc = sn + 8 * j + 2 * ft;
            float q2[2];
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const int col = jc + e;
                // (The bf16-output forms: the fast exponential, ~2 ulp, far below their outputs' rounding.)
                const float dec = col <= i ? (BOUT ? __expf(gc[i] - gc[col]) : expf(gc[i] - gc[col])) : 0.f;
                kk[j][2 * hf + e] = col < i ? bt[i] * kk[j][2 * hf + e] * dec : 0.f;  // A
                q2[e] = qk[j][2 * hf + e] * dec;
            }
            if (BOUT)
                *reinterpret_cast<uint32_t*>(aqk_b + i * C + jc) = pack_bf16x2(q2[0], q2[1]);
            else
                *reinterpret_cast<float2*>(aqk + i * C + jc) = make_float2(q2[0], q2[1]);
        }
    }
    // Aqk past each row's diagonal block: zeros, 16 bytes per store (no consumer reads them; written so
    // that the slot holds no stale values, as before).
    for (int u = tid; u < C * (C / 8); u += 256) {
        const int r = u >> 3, ch = u & 7;
        if (8 * ch >= 16 * ((r >> 4) + 1)) {
            if (BOUT) {
                *reinterpret_cast<uint4*>(aqk_b + r * C + 8 * ch) = make_uint4(0u, 0u, 0u, 0u);
            } else {
                *reinterpret_cast<float4*>(aqk + r * C + 8 * ch) = make_float4(0.f, 0.f, 0.f, 0.f);
                *reinterpret_cast<float4*>(aqk + r * C + 8 * ch + 4) = make_float4(0.f, 0.f, 0.f, 0.f);
            }
        }
    }
}

// A (the blocks the inverse reads: at or below the diagonal blocks; above them As is never read) from step 3's
// decayed kk fragments.
__device__ __forceinline__ void wy_store_a(float* As, const float (&kk)[3][4], const WyShare& sh, int fg, int ft) {
#pragma unroll
    for (int j = 0; j < 3; ++j)
        if (j < sh.nn)
#pragma unroll
            for (int hf = 0; hf < 2; ++hf)
                *reinterpret_cast<float2*>(As + (sh.m0 + fg + 8 * hf) * QP + sh.n0 + 8 * j + 2 * ft) =
                    make_float2(kk[j][2 * hf], kk[j][2 * hf + 1]);
}

// Step 5a of the tensor-core WY builds (warps 0 and 1 of the block): the four 16 x 16 diagonal blocks of
// T = (I + A)^-1 from A ([C][QP] fp32, strictly lower) into Ts, one block per half-warp (see the step's comment).
__device__ __forceinline__ void wy_inverse_diagonal(const float* As, float* Ts, int warp, int lane) {
    const int b0 = 16 * (2 * warp + (lane >> 4)), j = lane & 15;
    float x[16];
#pragma unroll
    for (int i = 0; i < 16; ++i) {
        float arow[16];
#pragma unroll
        for (int q = 0; q < 4; ++q) {
            if (4 * q < i) {
                const float4 a4 = *reinterpret_cast<const float4*>(As + (b0 + i) * QP + b0 + 4 * q);
                arow[4 * q] = a4.x;
                arow[4 * q + 1] = a4.y;
                arow[4 * q + 2] = a4.z;
                arow[4 * q + 3] = a4.w;
            }
        }
        float acc = i == j ? 1.f : 0.f;
#pragma unroll
        for (int m = 0; m < i; ++m) acc = fmaf(-arow[m], x[m], acc);
        x[i] = acc;
    }
#pragma unroll
    for (int i = 0; i < 16; ++i) Ts[(b0 + i) * QP + b0 + j] = x[i];
}

// Step 5b (every thread of the block; six block barriers, the last one at the end): the blocks of T below the
// diagonal, one distance from the diagonal at a time (see the step's comment). Thread t works on block t >> 6 of
// the distance (the 4 - d blocks (d + blk, blk); threads past them idle) at row (t >> 2) & 15 and the four
// columns 4 (t & 3) .. + 3: each A (or diagonal T) value it loads serves four products, and the T (or X) operand
// is one 16-byte load that the warp's eight rows share (one element per thread issued two shared
// loads per FMA, ~4,100 warp loads per block, and Nsight Compute on the H200 put a third of the f16 WY's samples
// here). Every element sums in the same order as before, so T is bit-identical.
__device__ __forceinline__ void wy_inverse_below(const float* As, float* Ts, int tid) {
    const int blk = tid >> 6, r = (tid >> 2) & 15, c4 = 4 * (tid & 3);
    for (int d = 1; d < 4; ++d) {
        const int i = d + blk, j = blk;
        if (i < 4) {
            float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
            for (int k = j; k < i; ++k) {
#pragma unroll
                for (int m = 0; m < 16; ++m) {
                    const float a = As[(16 * i + r) * QP + 16 * k + m];
                    acc = f4_fma(a, *reinterpret_cast<const float4*>(Ts + (16 * k + m) * QP + 16 * j + c4), acc);
                }
            }
            *reinterpret_cast<float4*>(Ts + (16 * j + r) * QP + 16 * i + c4) = acc;
        }
        __syncthreads();
        if (i < 4) {
            float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
            for (int m = 0; m < 16; ++m) {
                const float a = Ts[(16 * i + r) * QP + 16 * i + m];
                acc = f4_fma(a, *reinterpret_cast<const float4*>(Ts + (16 * j + m) * QP + 16 * i + c4), acc);
            }
            *reinterpret_cast<float4*>(Ts + (16 * i + r) * QP + 16 * j + c4) =
                make_float4(-acc.x, -acc.y, -acc.z, -acc.w);
        }
        __syncthreads();
    }
}

}  // namespace

// BOUT: W, U and Aqk written in bf16 (each slot's first half of the fp32 region), for the bf16 split's walk and
// output launches (`gdn_prefill_wy_tc<1|3>_b`).
template <bool SPLIT, bool BOUT>
__device__ __forceinline__ void gdn_prefill_wy_tc_body(const float* __restrict__ qn, const float* __restrict__ kn,
                                                       const float* __restrict__ vv, const float* __restrict__ gg,
                                                       const float* __restrict__ bb, const int* __restrict__ meta,
                                                       float* __restrict__ gcum, float* __restrict__ w_out,
                                                       float* __restrict__ u_out, float* __restrict__ aqk_out, int hk,
                                                       int hv, int seqs, int n_chunks) {
    // The bf16 split's plain-TF32 WY passes its operands unrounded (TfFrag's RAW): no rounding add per fragment
    // register in steps 3 and 6.
    constexpr bool RAW = BOUT && !SPLIT;
    extern __shared__ float4 smem_wyt[];
    float* sm = reinterpret_cast<float*>(smem_wyt);
    float* Ks = sm;             // [C][KP]: K, then diag(beta e^G) K
    float* Xs = Ks + C * KP;    // [C][KP]: Q, then diag(beta) V
    float* As = Xs + C * KP;    // [C][QP]
    float* Ts = As + C * QP;    // [C][QP]
    float* gc = Ts + C * QP;    // [C]
    float* bt = gc + C;         // [C]
    float* Vt = As;             // [C][KP] over As and Ts (2 C QP >= C KP floats) until step 3's epilogue

    const auto [c, h, s, lc, kh, tok0, slot] = wy_chunk(meta, hk, hv, seqs, n_chunks);
    if (lc <= 0) return;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int fg = lane >> 2, ft = lane & 3;  // fragment row group / column pair

    // 1. K and Q rows (zero past the chunk), g, beta, all as cp.async copies in flight at once. Plain loads
    // through registers (an older build) went out two 16-byte loads at a time, each pair stored
    // before the next was issued (the guard kept the compiler from hoisting them): eight round trips per block,
    // 24% of this kernel's stall samples (profile, mostly long_sb).
    // The V rows (zero past the chunk) go into Vt, a [C][KP] tile over the A and T tiles (unused until step 3's
    // epilogue), as a second group in flight during steps 2 and 3; moved to Xs, scaled by beta, once the Q tile
    // is free. Previously V was copied into Xs only after step 3 (prefetched to L2 at the start) and waited for
    // at the end of step 5a, where the profile put a quarter of the stall samples (mostly barrier). Moved here
    // (with the ldmatrix fragments: 342.8 -> 338.1 us) that barrier time mostly moved to the barrier
    // after step 3 (23%), so it was the warps' uneven share of step 3 more than V's latency.
    wy_load_chunk<float, KP>(Ks, Xs, Vt, gc, bt, kn, qn, vv, gg, bb, tok0, lc, hk, kh, hv, h, tid);
    cp_async_wait<1>();  // K, Q, g, beta (V may still be in flight)
    __syncthreads();
    // 2. In-chunk inclusive cumulative sum of g.
    wy_cumsum(gc, tid);
    __syncthreads();
    if (tid < lc) gcum[(tok0 + tid) * hv + h] = gc[tid];
    if (BOUT && tid == 0) split_ready(aqk_out, hv, n_chunks)[slot] = 0;

    // 3. A[i][j] = beta_i e^{G_i-G_j} k_i.k_j (j < i) and Aqk[i][j] = e^{G_i-G_j} q_i.k_j (j <= i), on tensor
    // cores, over the 20 n-tiles at or below the diagonal blocks (m-tile t reaches n-tile 2t + 1). Each warp takes
    // one m-tile and at most 3 of its n-tiles (a grid of 4 m-tiles x 2 column halves gave the warps 2, 0, 4, 0, 4,
    // 2, 4, 4: a profile put 23% of the stall samples at the barrier after this step; `WyShare`).
    const int am = (warp & 3) * 16;  // step 6's rows
    {
        const WyShare sh(warp);
        const int sm = sh.m0, sn = sh.n0, nn = sh.nn;
        float kk[3][4], qk[3][4];
#pragma unroll
        for (int j = 0; j < 3; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) kk[j][e] = qk[j][e] = 0.f;
#pragma unroll 2
        for (int k0 = 0; k0 < D; k0 += 8) {
            TfFrag<4, SPLIT, RAW> fk, fq;
            load_a(fk, Ks, KP, sm, k0, lane);
            load_a(fq, Xs, KP, sm, k0, lane);
#pragma unroll
            for (int j = 0; j < 3; ++j) {
                if (j < nn) {  // warp-uniform
                    TfFrag<2, SPLIT, RAW> fb;
                    load_bt(fb, Ks, KP, k0, sn + 8 * j, lane);
                    mma_acc<SPLIT>(kk[j], fk, fb);
                    mma_acc<SPLIT>(qk[j], fq, fb);
                }
            }
        }
        wy_step3_epilogue<BOUT>(kk, qk, sh, gc, bt, aqk_out, slot, fg, ft, tid);
        cp_async_wait<0>();
        __syncthreads();  // V landed in Vt; the Q tile is free
        // V scaled by beta into Xs (rows past the chunk: zero V, beta = 0), then Vt is free for A.
#pragma unroll
        for (int j = 0; j < C * (D / 4) / 256; ++j) {
            const int i = tid + 256 * j, r = i >> 5, q4 = i & 31;
            const float bv = bt[r];
            float4 vval = *reinterpret_cast<const float4*>(Vt + r * KP + 4 * q4);
            vval.x *= bv; vval.y *= bv; vval.z *= bv; vval.w *= bv;
            *reinterpret_cast<float4*>(Xs + r * KP + 4 * q4) = vval;
        }
        __syncthreads();  // Vt read
        wy_store_a(As, kk, sh, fg, ft);
    }
    __syncthreads();  // A complete; the K tile is free

    // 4 and 5a at once, on different warps. 5a (warps 0 and 1): the four 16 x 16 diagonal blocks of
    // T = (I + A)^-1, one per half-warp, by forward substitution in registers: lane j of the half-warp owns column
    // j of its block, x = (I + A_bb)^-1 e_j, row i after row i - 1 (x[i] = [i == j] - sum_{m<i} A[i][m] x[m], so
    // the rows above j come out zero and the block is written whole, zeros included). No barrier inside; the sum
    // of row i waits only for its last term, so the chain is ~16 FMAs long instead of the 63 block barriers of a
    // row-at-a-time substitution over all 64 rows (that loop and its barriers were ~60% of this kernel's
    // stall samples).
    if (warp < 2) {
        wy_inverse_diagonal(As, Ts, warp, lane);
    } else {
        // 4 (warps 2..7): K scaled by beta e^G in place (rows past the chunk: zero K, beta = 0).
        for (int i = tid - 64; i < C * (D / 4); i += 192) {
            const int r = i >> 5, q4 = i & 31;
            float4* kp = reinterpret_cast<float4*>(Ks + r * KP) + q4;
            const float f = bt[r] * expf(gc[r]);
            float4 kv = *kp;
            kv.x *= f; kv.y *= f; kv.z *= f; kv.w *= f;
            *kp = kv;
        }
    }
    __syncthreads();  // diagonal blocks of T, scaled K

    // 5b. The blocks below the diagonal, one distance d = i - j at a time (block indices 0..3):
    // T_ij = -T_ii X with X = sum_{k=j}^{i-1} A_ik T_kj, every term known from the diagonal blocks and the
    // nearer distances. Each thread computes four elements of one block of the distance; X goes to the
    // block (j, i) above the diagonal, which step 6 never reads (T is lower triangular and its k-steps stop at
    // the diagonal block). Six barriers in all.
    wy_inverse_below(As, Ts, tid);

    // 6. W = T Kb and U = T Vb on this warp's rows am .. am+15 and columns wn .. wn+63; T[r][m] = 0 for m > r.
    {
        const int wn = (warp >> 2) * 64;
        float aw[8][4], au[8][4];
#pragma unroll
        for (int n = 0; n < 8; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e) aw[n][e] = au[n][e] = 0.f;
        for (int k0 = 0; k0 < am + 16; k0 += 8) {
            TfFrag<4, SPLIT, RAW> fa;
            load_a(fa, Ts, QP, am, k0, lane);
#pragma unroll
            for (int n = 0; n < 8; ++n) {
                TfFrag<2, SPLIT, RAW> fb;
                load_b(fb, Ks, KP, k0, wn + 8 * n, lane);
                mma_acc<SPLIT>(aw[n], fa, fb);
                load_b(fb, Xs, KP, k0, wn + 8 * n, lane);
                mma_acc<SPLIT>(au[n], fa, fb);
            }
        }
        float* wo = w_out + slot * C * D;
        float* uo = u_out + slot * C * D;
        const int r0 = am + fg, r1 = am + fg + 8;
        if (BOUT) {  // bf16 W and U for the bf16 split, in the first half of each fp32 slot's region
            // Staged in shared memory (the K and V tiles, free once every warp's products are done; rows of
            // D + 8 bf16 so that the fragment stores spread over the banks) and written 16 bytes per store:
            // straight from the fragments each lane wrote 4 bytes, 16 per row and 32-byte sector, as the walk's D
            // did (its 8 KB per chunk staged: walk 170.8 -> 144.4 us at T = 4096).
            constexpr int WP = D + 8;
            __nv_bfloat16* const Ws = reinterpret_cast<__nv_bfloat16*>(Ks);  // [C][WP]
            __nv_bfloat16* const Us = reinterpret_cast<__nv_bfloat16*>(Xs);  // [C][WP]
            __syncthreads();  // every warp's step-6 products read Ks and Xs
#pragma unroll
            for (int n = 0; n < 8; ++n) {
                const int col = wn + 8 * n + 2 * ft;
                *reinterpret_cast<uint32_t*>(Ws + r0 * WP + col) = pack_bf16x2(aw[n][0], aw[n][1]);
                *reinterpret_cast<uint32_t*>(Ws + r1 * WP + col) = pack_bf16x2(aw[n][2], aw[n][3]);
                *reinterpret_cast<uint32_t*>(Us + r0 * WP + col) = pack_bf16x2(au[n][0], au[n][1]);
                *reinterpret_cast<uint32_t*>(Us + r1 * WP + col) = pack_bf16x2(au[n][2], au[n][3]);
            }
            __syncthreads();
            __nv_bfloat16* wb = reinterpret_cast<__nv_bfloat16*>(w_out) + slot * C * D;
            __nv_bfloat16* ub = reinterpret_cast<__nv_bfloat16*>(u_out) + slot * C * D;
#pragma unroll
            for (int j = 0; j < C * (D / 8) / 256; ++j) {
                const int i = tid + 256 * j, r = i >> 4, q = i & 15;  // 16 chunks of 16 bytes per row
                *reinterpret_cast<uint4*>(wb + r * D + 8 * q) = *reinterpret_cast<const uint4*>(Ws + r * WP + 8 * q);
                *reinterpret_cast<uint4*>(ub + r * D + 8 * q) = *reinterpret_cast<const uint4*>(Us + r * WP + 8 * q);
            }
        } else {
#pragma unroll
            for (int n = 0; n < 8; ++n) {
                const int col = wn + 8 * n + 2 * ft;
                *reinterpret_cast<float2*>(wo + r0 * D + col) = make_float2(aw[n][0], aw[n][1]);
                *reinterpret_cast<float2*>(wo + r1 * D + col) = make_float2(aw[n][2], aw[n][3]);
                *reinterpret_cast<float2*>(uo + r0 * D + col) = make_float2(au[n][0], au[n][1]);
                *reinterpret_cast<float2*>(uo + r1 * D + col) = make_float2(au[n][2], au[n][3]);
            }
        }
    }
}

// Two blocks per SM: 102,912 bytes of shared memory each (the launch asks for the maximum carveout) and at most
// 128 registers per thread.
#define GDN_WY_TC_KERNEL(SPLITN, NAME, BOUT)                                                                     \
    extern "C" __global__ void __launch_bounds__(256, 2) NAME(                                                    \
        const float* __restrict__ qn, const float* __restrict__ kn, const float* __restrict__ vv,                  \
        const float* __restrict__ gg, const float* __restrict__ bb, const int* __restrict__ meta,                 \
        float* __restrict__ gcum, float* __restrict__ w_out, float* __restrict__ u_out,                           \
        float* __restrict__ aqk_out, int hk, int hv, int seqs, int n_chunks) {                                    \
        gdn_prefill_wy_tc_body<SPLITN == 3, BOUT>(qn, kn, vv, gg, bb, meta, gcum, w_out, u_out, aqk_out, hk, hv, \
                                                  seqs, n_chunks);                                                \
    }

GDN_WY_TC_KERNEL(3, gdn_prefill_wy_tc3, false)
#if EDGEFIT_LAB
GDN_WY_TC_KERNEL(1, gdn_prefill_wy_tc1, false)
GDN_WY_TC_KERNEL(1, gdn_prefill_wy_tc1_b, true)
GDN_WY_TC_KERNEL(3, gdn_prefill_wy_tc3_b, true)
#endif

extern "C" __global__ void __launch_bounds__(256)
    gdn_prefill_gated_norm(float* __restrict__ out, const float* __restrict__ z, const float* __restrict__ norm_w,
                           float norm_eps, int rows) {
    const int row = blockIdx.x * 8 + (threadIdx.x >> 5);  // one (token, value head) row of 128 per warp
    const int lane = threadIdx.x & 31;
    if (row >= rows) return;
    float4* o = reinterpret_cast<float4*>(out + static_cast<size_t>(row) * D) + lane;
    const float4 zv = reinterpret_cast<const float4*>(z + static_cast<size_t>(row) * D)[lane];
    const float4 wv = reinterpret_cast<const float4*>(norm_w)[lane];
    float4 v = *o;
    const float ss = warp_sum(v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w);
    const float r = rsqrtf(ss / static_cast<float>(D) + norm_eps);
    v.x = v.x * r * wv.x * silu_f(zv.x);
    v.y = v.y * r * wv.y * silu_f(zv.y);
    v.z = v.z * r * wv.z * silu_f(zv.z);
    v.w = v.w * r * wv.w * silu_f(zv.w);
    *o = v;
}

// ---------------------------------------------------------------------------------------------------------------
// bf16 split build of launches 3 and 4 (variant `<wy>bf16_cs64`): fla's division of the work, on bf16
// tensor cores (mma.sync m16n8k16, operands from shared memory by ldmatrix), 's measurement of
// fla's kernels (benchmarks/h200.md point 3):
// 3'. gdn_prefill_walk_bf16: grid (2, Hv, seqs), 256 threads, the serial part reduced to what the next chunk
//     needs. Each block owns 64 columns of one head's state, fp32 in registers (the m16n8 accumulator layout of
//     the update: warp w owns state rows 16w .. 16w+15, all 64 columns), and per chunk
//       a. writes the incoming state S (bf16) to shared memory and to the chunk's slot of `hs` (for 4');
//       b. D = U - W S ([64 x 128] x [128 x 64]: warp w owns rows 16 (w & 3) .., columns 32 (w >> 2) ..), keeps D
//          (bf16, unscaled) in shared memory for the slot (for 4'), and e^{G_L-G_t} D_t (bf16) for c;
//       c. S <- e^{G_L} S + K^T (e^{G_L-G} D) ([128 x 64] x [64 x 64], the k-steps stop at the chunk's end), then
//          D to the slot, 16 bytes per store.
//     The operands stream into two shared buffers by cp.async, chunk c + 1's issued when chunk c starts, so one
//     chunk's loads are in flight behind the products: two barriers per chunk. (T = 4096: fp32
//     operands converted through registers 219.4 us; bf16 operands, next chunk by cp.async 174.2 us; the ring
//     168.7 us; D staged for 16-byte stores 144.4 us; fla's walk 106.0 us. Measured and not
//     kept: the state's copy to the slot moved after phase b's products and the next chunk's fetch after
//     phase c's, so that their instructions fill the mma latency: 170.8 against 168.9 us. On the H200: 32 state
//     columns per block (4 blocks per head, 192 blocks at two per SM, two chunk buffers, W and K read by twice the
//     blocks): 174.9 against 144.3 us at T = 4096, 332.9 against 287.4 at B = 4, N = 9216, so half the products
//     per chunk did not halve the chunk's latency.)
// 4'. gdn_prefill_out_bf16: grid (Hv, seqs, max_chunks), 256 threads, parallel over chunks: per (chunk, head)
//     o = e^G (Q S_c) + Aqk D ([64 x 128] x [128 x 128] and the causal [64 x 64] x [64 x 128]; warp w owns rows
//     16 (w & 3) .., columns 64 (w >> 2) ..), then the gated RMSNorm of launch 4 fused (the row's sum of squares
//     over the two column halves through shared memory), written to `out` once. Three blocks per SM (unpadded,
//     swizzled tiles; the H200's patch with its bug fixed): 164.9 (two blocks) -> 153.0 us at
//     T = 4096; norm_w through shared memory and the SiLU's fast reciprocal: 149.5 us.
// `hs` (the workspace region after Aqk, only in the layout of this build): per (head, chunk) slot of 24,576 bf16,
// the chunk's incoming state [128][128] then D [64][128]. Every operand these two launches read is bf16 in global
// memory (half the bytes; copied straight to shared memory by cp.async): launch 1 also writes bf16 copies of the
// normalised q and k (`qb`, `kb`: the workspace region after hs), and launch 2 is `gdn_prefill_wy_tc<1|3>_b`,
// which writes W, U and Aqk in bf16 (the first half of each fp32 slot of those regions).
// Precision: up to 2.9e-2 scaled error on the normalised output and 2.6e-3 on the final state against the f64
// recurrence in the H200's tests (kernels/bench/gdn_operand_precision.py models this
// rounding: 1.8e-2 / 1.5e-3), fla's class, not the default's. Measured and not kept: v in bf16 from
// launch 1 for the `_b` WY (the U product's operand rounded once more): ~13 us at T = 4096, but the tests' worst
// output error rose to 3.9e-2 (the model, 20 draws: 1.72e-2 -> 3.26e-2 on the output, 1.15e-3 -> 2.24e-3 on the
// state), too close to the 5e-2 bound for 2%. The model also says which WY products could be bf16: K K^T and
// W / U (1.72e-2 / 1.70e-2), not Q K^T (4.1e-2 / 4.9e-2 with k or q rounded, 7.4e-2 with both).
namespace {

constexpr int BP = D + 8;  // padded row (bf16) of a [*][128] tile: 272 bytes, so 8 ldmatrix rows hit 8 bank groups
constexpr int HP = 64 + 8;  // padded row (bf16) of a [*][64] tile: 144 bytes
#if EDGEFIT_LAB
constexpr int HS_SLOT = D * D + C * D;  // bf16 per (head, chunk) slot of hs: the state, then D
#endif

typedef __nv_bfloat16 bf16;

// A fragment of rows m0.., columns k0.. of a row-major bf16 (or f16) tile (row stride ld elements).
template <typename E>
__device__ __forceinline__ void ldsm_a(uint32_t (&a)[4], const E* tile, int ld, int m0, int k0, int lane) {
    ldmatrix_x4(a, tile + (m0 + (lane & 15)) * ld + k0 + ((lane >> 4) << 3));
}
// A fragment of the transpose of a row-major tile (A[m][k] = tile[k][m]) at rows m0, columns k0 of A.
__device__ __forceinline__ void ldsm_at(uint32_t (&a)[4], const bf16* tile, int ld, int m0, int k0, int lane) {
    ldmatrix_x4_trans(a, tile + (k0 + (lane & 7) + ((lane >> 4) << 3)) * ld + m0 + (((lane >> 3) & 1) << 3));
}
// B fragments of two n-tiles (n0, n0 + 8) for k-step k0 of a row-major [k][n] bf16 tile: b[0], b[1] for n0,
// b[2], b[3] for n0 + 8.
template <typename E>
__device__ __forceinline__ void ldsm_b2(uint32_t (&b)[4], const E* tile, int ld, int k0, int n0, int lane) {
    ldmatrix_x4_trans(b, tile + (k0 + (lane & 15)) * ld + n0 + ((lane >> 4) << 3));
}

// Unpadded tiles with the 16-byte chunks of row r XOR-swizzled by r & 7 (chunk q of row r at q ^ (r & 7)), so
// that eight ldmatrix rows at one logical chunk still hit eight bank groups: the address of element (r, col),
// col a multiple of 8, in a tile with ld elements per row (ld a multiple of 64).
__device__ __forceinline__ const bf16* swz(const bf16* tile, int ld, int r, int col) {
    return tile + r * ld + ((((col >> 3) ^ r) & 7) | ((col >> 3) & ~7)) * 8;
}
__device__ __forceinline__ void ldsm_a_swz(uint32_t (&a)[4], const bf16* tile, int ld, int m0, int k0, int lane) {
    ldmatrix_x4(a, swz(tile, ld, m0 + (lane & 15), k0 + ((lane >> 4) << 3)));
}
__device__ __forceinline__ void ldsm_b2_swz(uint32_t (&b)[4], const bf16* tile, int ld, int k0, int n0, int lane) {
    ldmatrix_x4_trans(b, swz(tile, ld, k0 + (lane & 15), n0 + ((lane >> 4) << 3)));
}

// One k-step of 16 over 2 NP n-tiles: acc[j] += a (a 16 x 16 A fragment) times columns n0 + 8 j .. of rows
// k0 .. k0 + 15 of the row-major [k][n] bf16 tile (SWZ: an unpadded tile swizzled as `swz` places it).
template <int NP, bool SWZ = false>
__device__ __forceinline__ void mma_kstep(float (&acc)[2 * NP][4], const uint32_t (&a)[4], const bf16* tile, int ld,
                                          int k0, int n0, int lane) {
#pragma unroll
    for (int np = 0; np < NP; ++np) {
        uint32_t b[4];
        if (SWZ)
            ldsm_b2_swz(b, tile, ld, k0, n0 + 16 * np, lane);
        else
            ldsm_b2(b, tile, ld, k0, n0 + 16 * np, lane);
        mma_bf16_16816(acc[2 * np], a, b[0], b[1]);
        mma_bf16_16816(acc[2 * np + 1], a, b[2], b[3]);
    }
}

}  // namespace

// Chunk buffers of gdn_prefill_walk_bf16, a ring: chunk c + WALK_NBUF - 1's operands stream in while chunk c is
// multiplied. Two, not three: 125,440 instead of 169,728 bytes of shared memory per block, so an
// output block (75,008) fits beside each walk block and the output launch overlapped with the walk runs on every
// SM, not only on the 36 the walk leaves idle: On the H200, T = 4096, the whole f16 split step 497.4 -> 484.1 us
// (1090.3 -> 1081.3 at B = 4, N = 9216), the walk alone 138.0 -> 139.0 us (one chunk's copies in flight, not two).
constexpr int WALK_NBUF = 2;
constexpr int WALK_BUF = 2 * C * BP + C * HP;  // bf16 per buffer: W [C][BP], K [C][BP], this block's U [C][HP]

// A walk block's release of chunk slot `slot` (split_ready's counter): called by thread 0 after a block barrier that
// every thread's stores to the slot precede, one gpu-scope fence and the count (the barrier-then-release pattern; a
// __threadfence by every thread after its stores cost the walk 145 -> 184 us at T = 4096). `add`: the
// block's share of the 2 the output waits for (1 per 64 state columns).
__device__ __forceinline__ void walk_release(int* ready, size_t slot, int add) {
    __threadfence();
    atomicAdd(ready + slot, add);
}
// A walk block's end: no copy left in flight (only empty groups can remain), then its last chunk released.
__device__ __forceinline__ void walk_release_last(int* ready, size_t slot0, int nch, int add) {
    cp_async_wait<0>();
    __syncthreads();
    if (nch > 0 && threadIdx.x == 0) walk_release(ready, slot0 + nch - 1, add);
}

// Shared memory of gdn_prefill_walk_bf16 (dynamic): the ring of chunk buffers, the state [D][HP], the decayed D
// [C][HP] and D itself [C][HP] (staged so that its slot is written 16 bytes per store: written straight from the
// fragments, 4 bytes per lane, its stores used 24 of each 32-byte sector, Nsight Compute on the H200) in bf16, then G
// [WALK_NBUF][C] fp32.
__host__ __device__ constexpr int walk_bf16_smem_bytes() {
    return (WALK_NBUF * WALK_BUF + D * HP + 2 * C * HP) * 2 + WALK_NBUF * C * 4;
}

// Inputs (all written by launches 1 and 2 of this build): kb the bf16 copy of kn (`gdn_prefill_prep`'s qb / kb),
// w_in / u_in the bf16 W and U of `gdn_prefill_wy_tc<1|3>_b`, gcum.
#if EDGEFIT_LAB
// The bf16 split variants are the lab's (no `Auto` choice or engine path names one).
extern "C" __global__ void __launch_bounds__(256, 1)
    gdn_prefill_walk_bf16(const bf16* __restrict__ kb, const float* __restrict__ gcum,
                          const bf16* __restrict__ w_in, const bf16* __restrict__ u_in,
                          const int* __restrict__ meta, float* __restrict__ state, bf16* __restrict__ hs,
                          int* __restrict__ ready, int hk, int hv, int seqs, int n_chunks) {
    constexpr int NT = 8;  // n-tiles of the 64 columns (phase c)
    extern __shared__ float4 smem_walk[];
    bf16* const ring = reinterpret_cast<bf16*>(smem_walk);     // buffer i at i * WALK_BUF: W, K, U
    bf16* const Sb = ring + WALK_NBUF * WALK_BUF;              // [D][HP]
    bf16* const Db = Sb + D * HP;                              // [C][HP]
    bf16* const Du = Db + C * HP;                              // [C][HP]: D unscaled, for the slot
    float* const Gs = reinterpret_cast<float*>(Du + C * HP);   // [WALK_NBUF][C]

    const int c0 = blockIdx.x * 64, h = blockIdx.y, s = blockIdx.z;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int fg = lane >> 2, ft = lane & 3;
    const int start = meta[s];
    const int len = meta[s + 1] - start;
    const int nch = (len + C - 1) / C;
    const int kh = h / (hv / hk);
    float* sg = state + (static_cast<size_t>(s) * hv + h) * D * D + c0;
    const size_t slot0 = static_cast<size_t>(h) * n_chunks + meta[seqs + 1 + s];
    const int am = (warp & 3) * 16, an = (warp >> 2) * 32;  // phase b: rows and first column of this warp
    const int dm = warp * 16;                               // phase c: state rows of this warp

    float st[NT][4];
#pragma unroll
    for (int n = 0; n < NT; ++n) {
        const float2 a = *reinterpret_cast<const float2*>(sg + (dm + fg) * D + 8 * n + 2 * ft);
        const float2 b = *reinterpret_cast<const float2*>(sg + (dm + fg + 8) * D + 8 * n + 2 * ft);
        st[n][0] = a.x;
        st[n][1] = a.y;
        st[n][2] = b.x;
        st[n][3] = b.y;
    }
    // A programmatic dependent of the WY launch (Device::launch_pdl): the state above is the caller's, so only
    // from here on does this block need the WY's end. The output launch may start after that (PDL): its blocks
    // take the SMs this grid leaves idle and wait for each chunk's `ready` counter (split_ready), not for this
    // grid's end; triggering only now keeps them from reading the counters before the WY has zeroed them.
    pdl_wait();
    pdl_launch_dependents();

    // Chunk cc's W, K (rows past the chunk zero-filled), this block's 64 columns of U and G into ring buffer
    // cc % WALK_NBUF, as one cp.async group (committed also when there is no such chunk, so that the waits below
    // count groups, not chunks).
    // The copies' addresses, per thread, computed once (recomputed per chunk with a guard per copy they
    // were ~218 of the ~740 SASS instructions of a chunk's iteration, all between the barrier and phase b): the
    // shared destinations as offsets from buffer 0, the W / U sources from the chunk's slot, the K rows from the
    // chunk's first token (row stride hk * D), 16 rows apart per copy.
    const int wr = tid >> 4, wq = tid & 15;  // W / K: row, 16-byte column of copy 0 (16 x 16 bytes per row)
    const int ur = tid >> 3, uq = tid & 7;   // U: the same (8 x 16 bytes per row of 64)
    const uint32_t ring_s = smem_u32(ring);
    const uint32_t w_dst = ring_s + 2 * (wr * BP + 8 * wq), u_dst = ring_s + 2 * (2 * C * BP + ur * HP + 8 * uq);
    const size_t k_row = static_cast<size_t>(hk) * D;  // bf16 between consecutive tokens' k rows
    const bf16* const k_src0 = kb + static_cast<size_t>(kh) * D + wr * k_row + 8 * wq;
    auto fetch = [&](int cc) {
        if (cc < nch) {
            const int lc = min(C, len - cc * C), bi = cc % WALK_NBUF;
            const size_t tok0 = static_cast<size_t>(start + cc * C);
            const uint32_t buf = 2 * bi * WALK_BUF;
            const bf16* wg = w_in + (slot0 + cc) * C * D + wr * D + 8 * wq;
            const bf16* ug = u_in + (slot0 + cc) * C * D + c0 + ur * D + 8 * uq;
            const bf16* kg = k_src0 + tok0 * k_row;
            if (lc == C) {  // a whole chunk (all but a sequence's last): no guards
#pragma unroll
                for (int j = 0; j < C * D / 8 / 256; ++j) {
                    cp_async16(buf + w_dst + 2 * 16 * j * BP, wg + 16 * j * D, true);
                    cp_async16(buf + w_dst + 2 * (C * BP + 16 * j * BP), kg + 16 * j * k_row, true);
                }
            } else {  // K rows past the chunk zero-filled
#pragma unroll
                for (int j = 0; j < C * D / 8 / 256; ++j) {
                    const bool ok = wr + 16 * j < lc;
                    cp_async16(buf + w_dst + 2 * 16 * j * BP, wg + 16 * j * D, true);
                    cp_async16(buf + w_dst + 2 * (C * BP + 16 * j * BP), ok ? kg + 16 * j * k_row : kb, ok);
                }
            }
#pragma unroll
            for (int j = 0; j < C * 64 / 8 / 256; ++j) cp_async16(buf + u_dst + 2 * 32 * j * HP, ug + 32 * j * D, true);
            if (tid < C) cp_async4(Gs + bi * C + tid, tid < lc ? gcum + (tok0 + tid) * hv + h : gcum, tid < lc);
        }
        cp_async_commit();
    };

    for (int i = 0; i < WALK_NBUF - 1; ++i) fetch(i);
    for (int c = 0; c < nch; ++c) {
        const int lc = min(C, len - c * C);
        const bf16* Wb = ring + (c % WALK_NBUF) * WALK_BUF;
        const bf16* Kb = Wb + C * BP;
        const bf16* Ub = Kb + C * BP;
        const float* G = Gs + (c % WALK_NBUF) * C;
        bf16* slot = hs + (slot0 + c) * HS_SLOT;
        // a. the incoming state, bf16, to shared memory (then, after the barrier, to the slot).
#pragma unroll
        for (int n = 0; n < NT; ++n) {
            *reinterpret_cast<uint32_t*>(Sb + (dm + fg) * HP + 8 * n + 2 * ft) = pack_bf16x2(st[n][0], st[n][1]);
            *reinterpret_cast<uint32_t*>(Sb + (dm + fg + 8) * HP + 8 * n + 2 * ft) = pack_bf16x2(st[n][2], st[n][3]);
        }
        cp_async_wait<WALK_NBUF - 2>();  // this thread's copies of chunk c (later chunks' may be in flight)
        __syncthreads();     // Sb and chunk c's buffer complete; chunk c - 1's readers done
        // Chunk c - 1's slot is written (every thread's stores precede the barrier): count this block, one
        // gpu-scope fence by the counting thread (the barrier-then-release pattern; a __threadfence by every
        // thread after its stores cost the walk 145 -> 184 us at T = 4096).
        if (c > 0 && tid == 0) walk_release(ready, slot0 + c - 1, 1);
        fetch(c + WALK_NBUF - 1);  // into the buffer chunk c - 1 used
#pragma unroll
        for (int j = 0; j < D * 64 / 8 / 256; ++j) {
            const int i = tid + 256 * j, r = i >> 3, q = i & 7;
            *reinterpret_cast<uint4*>(slot + r * D + c0 + 8 * q) = *reinterpret_cast<const uint4*>(Sb + r * HP + 8 * q);
        }
        // b. D = U - W S on this warp's 16 rows x 32 columns.
        float acc[4][4];
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[j][e] = 0.f;
#pragma unroll
        for (int k0 = 0; k0 < D; k0 += 16) {
            uint32_t a[4], b0[4], b1[4];
            ldsm_a(a, Wb, BP, am, k0, lane);
            ldsm_b2(b0, Sb, HP, k0, an, lane);
            ldsm_b2(b1, Sb, HP, k0, an + 16, lane);
            mma_bf16_16816(acc[0], a, b0[0], b0[1]);
            mma_bf16_16816(acc[1], a, b0[2], b0[3]);
            mma_bf16_16816(acc[2], a, b1[0], b1[1]);
            mma_bf16_16816(acc[3], a, b1[2], b1[3]);
        }
        const float gl = G[lc - 1];
        const int r0 = am + fg, r1 = am + fg + 8;
        // (bf16 operands: the fast exponential, ~2 ulp, like every exponential of the split's walk and output.)
        const float f0 = r0 < lc ? __expf(gl - G[r0]) : 0.f, f1 = r1 < lc ? __expf(gl - G[r1]) : 0.f;
        bf16* dg = slot + D * D;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const int col = an + 8 * j + 2 * ft;
            const float2 ulo = bf16x2_to_float2(*reinterpret_cast<const uint32_t*>(Ub + r0 * HP + col));
            const float2 uhi = bf16x2_to_float2(*reinterpret_cast<const uint32_t*>(Ub + r1 * HP + col));
            const float d0 = ulo.x - acc[j][0], d1 = ulo.y - acc[j][1];
            const float d2 = uhi.x - acc[j][2], d3 = uhi.y - acc[j][3];
            *reinterpret_cast<uint32_t*>(Du + r0 * HP + col) = pack_bf16x2(d0, d1);
            *reinterpret_cast<uint32_t*>(Du + r1 * HP + col) = pack_bf16x2(d2, d3);
            *reinterpret_cast<uint32_t*>(Db + r0 * HP + col) = pack_bf16x2(d0 * f0, d1 * f0);
            *reinterpret_cast<uint32_t*>(Db + r1 * HP + col) = pack_bf16x2(d2 * f1, d3 * f1);
        }
        __syncthreads();  // Db complete; Sb free
        // c. S <- e^{G_L} S + K^T (e^{G_L-G} D) on this warp's 16 state rows (K and D rows past the chunk are 0).
        const float el = __expf(gl);
#pragma unroll
        for (int n = 0; n < NT; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e) st[n][e] *= el;
        const int kend = (lc + 15) & ~15;
        for (int t0 = 0; t0 < kend; t0 += 16) {
            uint32_t a[4];
            ldsm_at(a, Kb, BP, dm, t0, lane);
            mma_kstep<NT / 2>(st, a, Db, HP, t0, 0, lane);
        }
        // D to the slot, 16 bytes per store from Du (rewritten only after the next chunk's first barrier).
#pragma unroll
        for (int j = 0; j < C * 64 / 8 / 256; ++j) {
            const int i = tid + 256 * j, r = i >> 3, q = i & 7;
            *reinterpret_cast<uint4*>(dg + r * D + c0 + 8 * q) = *reinterpret_cast<const uint4*>(Du + r * HP + 8 * q);
        }
    }
    walk_release_last(ready, slot0, nch, 1);

#pragma unroll
    for (int n = 0; n < NT; ++n) {
        *reinterpret_cast<float2*>(sg + (dm + fg) * D + 8 * n + 2 * ft) = make_float2(st[n][0], st[n][1]);
        *reinterpret_cast<float2*>(sg + (dm + fg + 8) * D + 8 * n + 2 * ft) = make_float2(st[n][2], st[n][3]);
    }
}
#endif

// 3''. gdn_prefill_walk1_bf16, the one-block walk: grid (1, Hv, seqs), 256 threads, one block per
// (sequence, head) state, the same parameters, slots and counters as gdn_prefill_walk_bf16. Warp w owns the state's
// columns 16 w .. 16 w + 15 (all 128 rows) and keeps S^T of them in registers as m16n8 accumulator tiles. Both products of a chunk then stay
// inside the warp: phase b computes D^T = U^T - S^T W^T with S^T's own accumulators, packed to bf16, as the A
// operand (the accumulator layout of an m16n8 tile pair is the A layout of an m16k16 fragment), and phase c
// S^T <- e^{G_L} S^T + (e^{G_L-G} D)^T K with D^T's accumulators as A; W and K (read-only, shared by the warps)
// are the B operands, by ldmatrix from the chunk's ring buffer. No warp waits for another's results: the block
// meets once per chunk, at the ring buffer's barrier. The slot's state and D (bf16, row-major as the output
// launch reads them) are staged per warp by stmatrix .trans and written 32 bytes per row. Per block and chunk this
// is twice the two-block walk's products on one SM, in ~1.6x its time (H200, the walk alone: 218.3 us
// at T = 4096 on 48 SMs against 135.0 for the two-block walk on 96; at B = 4 x 9216, 192 blocks against 384,
// 291.6 against 274.3), so it pays only where the two-block walk's blocks exceed one wave and the output launch,
// which can start only once every walk block has, would start late (Rust `walk_one_block`). Nsight Compute
// (its first form): 0.28 warps issued per scheduler per cycle (two warps each), stalls short
// scoreboard 23%, fixed-latency waits 22%, the chunk barrier 15%; ~950 instructions per warp and chunk, of which
// 128 mma, 68 ldmatrix, ~110 for the 12 cp.async of the chunk fetch and their addresses.
constexpr int WALK1_BUF = 3 * C * BP;  // bf16 per buffer: W, K, U [C][BP]
constexpr int WALK1_WARPS = 8;         // 16 state columns each
constexpr int WALK1_SP = 16;           // bf16 row pitch of a warp's staging tile [D][16] (32 bytes, see stg_at)
static_assert(WALK1_WARPS * 16 == D, "the walk's warps cover the state's columns");

// Shared memory of gdn_prefill_walk1_bf16 (dynamic): the ring of chunk buffers, one staging tile per warp, then G
// [WALK_NBUF][C] fp32.
__host__ __device__ constexpr int walk1_bf16_smem_bytes() {
    return (WALK_NBUF * WALK1_BUF + WALK1_WARPS * D * WALK1_SP) * 2 + WALK_NBUF * C * 4;
}

namespace {
__device__ __forceinline__ void stmatrix_x4_trans(uint32_t addr, uint32_t r0, uint32_t r1, uint32_t r2, uint32_t r3) {
    asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};" ::"r"(addr), "r"(r0),
                 "r"(r1), "r"(r2), "r"(r3)
                 : "memory");
}
// Offset (elements) of row r, 8-column half hf, in a warp's staging tile of the one-block walk: 32-byte rows with
// the half flipped by bit 2 of the row, so that stmatrix (8 rows of one half) and the copy to the slot (each 8 lanes
// 4 rows, both halves, as whole 32-byte sectors) both meet 8 distinct bank groups. (copying 8 rows of one
// half per 8 lanes instead, conflict-free with a 48-byte pitch, made the walk 318 -> 358 us at B = 4 x 9216: each
// 8 lanes' 16-byte stores then half-fill 8 sectors.)
__device__ __forceinline__ int stg_at(int r, int hf) { return r * WALK1_SP + 8 * (hf ^ ((r >> 2) & 1)); }
// Lane's row address offset (elements) for an x4 ldmatrix / stmatrix over a 16 x 16 block at (r0, c0) of a tile
// with row pitch ld, matrices in the order (r0, c0), (r0, c0 + 8), (r0 + 8, c0), (r0 + 8, c0 + 8).
__device__ __forceinline__ int x4_rc(int r0, int c0, int ld, int lane) {
    return (r0 + (lane & 7) + ((lane >> 4) << 3)) * ld + c0 + (((lane >> 3) & 1) << 3);
}
}  // namespace

// Inputs (all written by launches 1 and 2 of this build): kb the bf16 copy of kn, w_in / u_in the bf16 W and U,
// gcum. Grid (1, Hv, seqs).
#if EDGEFIT_LAB
extern "C" __global__ void __launch_bounds__(256, 1)
    gdn_prefill_walk1_bf16(const bf16* __restrict__ kb, const float* __restrict__ gcum,
                          const bf16* __restrict__ w_in, const bf16* __restrict__ u_in,
                          const int* __restrict__ meta, float* __restrict__ state, bf16* __restrict__ hs,
                          int* __restrict__ ready, int hk, int hv, int seqs, int n_chunks) {
    constexpr int NJ = C / 8;  // token tiles of D^T (phase b)
    constexpr int NS = D / 8;  // state-row tiles of S^T (phase c)
    constexpr uint32_t NEG = 0x80008000u;  // the sign bits of a bf16 pair
    extern __shared__ float4 smem_walk1[];
    bf16* const ring = reinterpret_cast<bf16*>(smem_walk1);                      // buffer i: W, K, U
    bf16* const stg_all = ring + WALK_NBUF * WALK1_BUF;                          // [WALK1_WARPS][D][WALK1_SP]
    float* const Gs = reinterpret_cast<float*>(stg_all + WALK1_WARPS * D * WALK1_SP);  // [WALK_NBUF][C]

    const int h = blockIdx.y, s = blockIdx.z;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int fg = lane >> 2, ft = lane & 3;
    const int cw = 16 * warp;  // this warp's state columns
    const int start = meta[s];
    const int len = meta[s + 1] - start;
    const int nch = (len + C - 1) / C;
    const int kh = h / (hv / hk);
    float* sg = state + (static_cast<size_t>(s) * hv + h) * D * D;
    const size_t slot0 = static_cast<size_t>(h) * n_chunks + meta[seqs + 1 + s];
    bf16* const stg = stg_all + warp * D * WALK1_SP;
    const uint32_t stg_s = smem_u32(stg);

    // st[j]: S^T's tile of state rows 8 j .. 8 j + 7: [0], [1] = S[8 j + 2 ft (+1)][cw + fg], [2], [3] the same at
    // column cw + fg + 8.
    float st[NS][4];
#pragma unroll
    for (int j = 0; j < NS; ++j) {
        const int r = 8 * j + 2 * ft;
        st[j][0] = sg[r * D + cw + fg];
        st[j][1] = sg[(r + 1) * D + cw + fg];
        st[j][2] = sg[r * D + cw + fg + 8];
        st[j][3] = sg[(r + 1) * D + cw + fg + 8];
    }
    // A programmatic dependent of the WY launch: the state above is the caller's; the output launch may start
    // after this (it waits for each chunk's `ready` counter, which the WY has zeroed).
    pdl_wait();
    pdl_launch_dependents();

    // Chunk cc's W, K (rows past the chunk zero-filled), U and G into ring buffer cc % WALK_NBUF, one cp.async group
    // (committed also when there is no such chunk). Each thread copies rows wr + 16 j, 16-byte column wq.
    const int wr = tid >> 4, wq = tid & 15;
    const uint32_t dst0 = smem_u32(ring) + 2 * (wr * BP + 8 * wq);
    const size_t k_row = static_cast<size_t>(hk) * D;  // bf16 between consecutive tokens' k rows
    const bf16* const k_src0 = kb + static_cast<size_t>(kh) * D + wr * k_row + 8 * wq;
    auto fetch = [&](int cc) {
        if (cc < nch) {
            const int lc = min(C, len - cc * C), bi = cc % WALK_NBUF;
            const size_t tok0 = static_cast<size_t>(start + cc * C);
            const uint32_t buf = dst0 + 2 * bi * WALK1_BUF;
            const bf16* wg = w_in + (slot0 + cc) * C * D + wr * D + 8 * wq;
            const bf16* ug = u_in + (slot0 + cc) * C * D + wr * D + 8 * wq;
            const bf16* kg = k_src0 + tok0 * k_row;
#pragma unroll
            for (int j = 0; j < C / 16; ++j) {
                const bool ok = wr + 16 * j < lc;
                cp_async16(buf + 2 * 16 * j * BP, wg + 16 * j * D, true);
                cp_async16(buf + 2 * (C * BP + 16 * j * BP), ok ? kg + 16 * j * k_row : kb, ok);
                cp_async16(buf + 2 * (2 * C * BP + 16 * j * BP), ug + 16 * j * D, true);
            }
            if (tid < C) cp_async4(Gs + bi * C + tid, tid < lc ? gcum + (tok0 + tid) * hv + h : gcum, tid < lc);
        }
        cp_async_commit();
    };

    fetch(0);
    for (int c = 0; c < nch; ++c) {
        const int lc = min(C, len - c * C);
        const bf16* Wb = ring + (c % WALK_NBUF) * WALK1_BUF;
        const bf16* Kb = Wb + C * BP;
        const bf16* Ub = Kb + C * BP;
        const float* G = Gs + (c % WALK_NBUF) * C;
        bf16* slot = hs + (slot0 + c) * HS_SLOT;
        // a. S_c in bf16: sp[kk] the A fragment of state rows 16 kk .. 16 kk + 15; staged transposed (rows = state
        //    rows) and written to the slot, 32 bytes per row.
        uint32_t sp[NS / 2][4];
#pragma unroll
        for (int kk = 0; kk < NS / 2; ++kk) {
            sp[kk][0] = pack_bf16x2(st[2 * kk][0], st[2 * kk][1]);
            sp[kk][1] = pack_bf16x2(st[2 * kk][2], st[2 * kk][3]);
            sp[kk][2] = pack_bf16x2(st[2 * kk + 1][0], st[2 * kk + 1][1]);
            sp[kk][3] = pack_bf16x2(st[2 * kk + 1][2], st[2 * kk + 1][3]);
        }
        __syncwarp();  // the previous chunk's reads of the staging tile are done
#pragma unroll
        for (int kk = 0; kk < NS / 2; ++kk)
            stmatrix_x4_trans(stg_s + 2 * stg_at(16 * kk + (lane & 7) + ((lane >> 4) << 3), (lane >> 3) & 1),
                              sp[kk][0], sp[kk][1], sp[kk][2], sp[kk][3]);
        __syncwarp();
#pragma unroll
        for (int i = 0; i < D * 2 / 32; ++i) {
            const int q = lane + 32 * i, r = q >> 1, hf = q & 1;
            *reinterpret_cast<uint4*>(slot + r * D + cw + 8 * hf) =
                *reinterpret_cast<const uint4*>(stg + stg_at(r, hf));
        }
        cp_async_wait<0>();  // this thread's copies of chunk c
        __syncthreads();     // chunk c's buffer complete; every warp is past chunk c - 1 (its slot written)
        if (c > 0 && tid == 0) walk_release(ready, slot0 + c - 1, 2);
        fetch(c + 1);  // into the buffer chunk c - 1 used
        // b. D^T = U^T - S^T W^T: acc[j] the tile of tokens 8 j .. 8 j + 7 (U^T by ldmatrix .trans).
        float acc[NJ][4];
#pragma unroll
        for (int p = 0; p < NJ / 2; ++p) {
            uint32_t u[4];
            ldmatrix_x4_trans(u, Ub + x4_rc(16 * p, cw, BP, lane));
            const float2 u0 = bf16x2_to_float2(u[0]), u1 = bf16x2_to_float2(u[1]);
            const float2 u2 = bf16x2_to_float2(u[2]), u3 = bf16x2_to_float2(u[3]);
            acc[2 * p][0] = u0.x;
            acc[2 * p][1] = u0.y;
            acc[2 * p][2] = u1.x;
            acc[2 * p][3] = u1.y;
            acc[2 * p + 1][0] = u2.x;
            acc[2 * p + 1][1] = u2.y;
            acc[2 * p + 1][2] = u3.x;
            acc[2 * p + 1][3] = u3.y;
        }
#pragma unroll
        for (int kk = 0; kk < NS / 2; ++kk) {
            const uint32_t a[4] = {sp[kk][0] ^ NEG, sp[kk][1] ^ NEG, sp[kk][2] ^ NEG, sp[kk][3] ^ NEG};
#pragma unroll
            for (int p = 0; p < NJ / 2; ++p) {
                uint32_t b[4];
                ldmatrix_x4(b, Wb + x4_rc(16 * p, 16 * kk, BP, lane));
                mma_bf16_16816(acc[2 * p], a, b[0], b[1]);
                mma_bf16_16816(acc[2 * p + 1], a, b[2], b[3]);
            }
        }
        // D (unscaled, bf16) to the slot through the staging tile (rows = tokens).
        bf16* dg = slot + D * D;
        uint32_t dp[NJ][2];
#pragma unroll
        for (int j = 0; j < NJ; ++j) {
            dp[j][0] = pack_bf16x2(acc[j][0], acc[j][1]);
            dp[j][1] = pack_bf16x2(acc[j][2], acc[j][3]);
        }
        __syncwarp();  // the state's reads of the staging tile are done
#pragma unroll
        for (int p = 0; p < NJ / 2; ++p)
            stmatrix_x4_trans(stg_s + 2 * stg_at(16 * p + (lane & 7) + ((lane >> 4) << 3), (lane >> 3) & 1),
                              dp[2 * p][0], dp[2 * p][1], dp[2 * p + 1][0], dp[2 * p + 1][1]);
        __syncwarp();
#pragma unroll
        for (int i = 0; i < C * 2 / 32; ++i) {
            const int q = lane + 32 * i, r = q >> 1, hf = q & 1;
            *reinterpret_cast<uint4*>(dg + r * D + cw + 8 * hf) =
                *reinterpret_cast<const uint4*>(stg + stg_at(r, hf));
        }
        // c. S^T <- e^{G_L} S^T + (e^{G_L-G} D)^T K over the chunk's tokens (K rows past the chunk are 0).
        // (bf16 operands: the fast exponential, ~2 ulp, like every exponential of the split's walk and output.)
        const float gl = G[lc - 1], el = __expf(gl);
#pragma unroll
        for (int j = 0; j < NS; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) st[j][e] *= el;
        // (A whole chunk without the guards, so that the k-steps' loads and products interleave.)
        auto kstep = [&](int kk, bool guard) {
            const int t0 = 16 * kk + 2 * ft, t1 = t0 + 8;
            const float2 g0 = *reinterpret_cast<const float2*>(G + t0);
            const float2 g1 = *reinterpret_cast<const float2*>(G + t1);
            const float f00 = !guard || t0 < lc ? __expf(gl - g0.x) : 0.f;
            const float f01 = !guard || t0 + 1 < lc ? __expf(gl - g0.y) : 0.f;
            const float f10 = !guard || t1 < lc ? __expf(gl - g1.x) : 0.f;
            const float f11 = !guard || t1 + 1 < lc ? __expf(gl - g1.y) : 0.f;
            const uint32_t a[4] = {pack_bf16x2(acc[2 * kk][0] * f00, acc[2 * kk][1] * f01),
                                   pack_bf16x2(acc[2 * kk][2] * f00, acc[2 * kk][3] * f01),
                                   pack_bf16x2(acc[2 * kk + 1][0] * f10, acc[2 * kk + 1][1] * f11),
                                   pack_bf16x2(acc[2 * kk + 1][2] * f10, acc[2 * kk + 1][3] * f11)};
#pragma unroll
            for (int q = 0; q < NS / 2; ++q) {
                uint32_t b[4];
                ldsm_b2(b, Kb, BP, 16 * kk, 16 * q, lane);
                mma_bf16_16816(st[2 * q], a, b[0], b[1]);
                mma_bf16_16816(st[2 * q + 1], a, b[2], b[3]);
            }
        };
        if (lc == C) {
#pragma unroll
            for (int kk = 0; kk < C / 16; ++kk) kstep(kk, false);
        } else {
#pragma unroll
            for (int kk = 0; kk < C / 16; ++kk)
                if (16 * kk < lc) kstep(kk, true);
        }
    }
    walk_release_last(ready, slot0, nch, 2);
#pragma unroll
    for (int j = 0; j < NS; ++j) {
        const int r = 8 * j + 2 * ft;
        sg[r * D + cw + fg] = st[j][0];
        sg[(r + 1) * D + cw + fg] = st[j][1];
        sg[r * D + cw + fg + 8] = st[j][2];
        sg[(r + 1) * D + cw + fg + 8] = st[j][3];
    }
}
#endif

// Shared memory of gdn_prefill_out_bf16 (dynamic): Q [C][D], the chunk's state [D][D] and D [C][D], Aqk [C][C]
// (bf16, unpadded and swizzled by `swz`), then G [C], the row sums of squares [2][C] and norm_w [D] (fp32): 75,008
// bytes, so three blocks fit an SM (with the 1 KiB per block the driver reserves: 228,096 of 233,472 bytes), and
// __launch_bounds__(256, 3) caps the registers at 80 (28 bytes of spill). Padded tiles (79,616 bytes, two blocks
// per SM): 164.9 us at T = 4096; unpadded and swizzled, three blocks: 153.0 us. The epilogue
// staged through Qb / Hb and written 16 bytes per store, z read 16 bytes per load: 135.4 -> 114.9 us
// at T = 4096, 297.2 -> 249.4 us at B = 4 x 9216 (the launch alone, same rounds).
__host__ __device__ constexpr int out_bf16_smem_bytes() {
    return (C * D + D * D + C * D + C * C) * 2 + (3 * C + D) * 4;
}

// Inputs: qb the bf16 copy of qn (`gdn_prefill_prep`), aqk_in the bf16 Aqk of `gdn_prefill_wy_tc<1|3>_b`, hs
// the walk's slots, gcum; z, norm_w and norm_eps as in gdn_prefill_gated_norm.
#if EDGEFIT_LAB
extern "C" __global__ void __launch_bounds__(256, 3)
    gdn_prefill_out_bf16(const bf16* __restrict__ qb, const float* __restrict__ gcum,
                         const bf16* __restrict__ aqk_in, const bf16* __restrict__ hs,
                         const int* __restrict__ meta, const float* __restrict__ z,
                         const float* __restrict__ norm_w, float norm_eps, float* __restrict__ out,
                         const int* __restrict__ ready, int hk, int hv, int seqs, int n_chunks) {
    extern __shared__ float4 smem_out[];
    bf16* const Qb = reinterpret_cast<bf16*>(smem_out);  // [C][D], swizzled (swz)
    bf16* const Hb = Qb + C * D;                          // [D][D], swizzled
    bf16* const Vb = Hb + D * D;                          // [C][D], swizzled
    bf16* const Ab = Vb + C * D;                          // [C][C], swizzled
    float* const G = reinterpret_cast<float*>(Ab + C * C);  // [C]
    float* const red = G + C;                                // [2][C]
    float* const Wn = red + 2 * C;                           // [D]: norm_w

    // Grid (Hv, seqs, max_chunks), heads fastest: blocks start in the order the walk finishes their slots (chunk c of
    // every head at about the same time), so the blocks resident during the walk rarely wait on a counter. (Grid
    // (max_chunks, Hv, seqs) started all chunks of head 0 first, whose last slots come at the walk's end.)
    const int h = blockIdx.x, s = blockIdx.y, c = blockIdx.z;
    const int start = meta[s];
    const int len = meta[s + 1] - start;
    if (c * C >= len) return;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int fg = lane >> 2, ft = lane & 3;
    const int lc = min(C, len - c * C);
    const int kh = h / (hv / hk);
    const size_t tok0 = static_cast<size_t>(start + c * C);
    const size_t slot = static_cast<size_t>(h) * n_chunks + meta[seqs + 1 + s] + c;
    const bf16* hg = hs + slot * HS_SLOT;

    // Every operand by cp.async: Q (rows past the chunk zero-filled), Aqk, G, norm_w; then, once the walk has
    // written this chunk's slot, the state and D (rows D.. land in Vb = Hb + D * D).
#pragma unroll
    for (int j = 0; j < C * D / 8 / 256; ++j) {
        const int i = tid + 256 * j, r = i >> 4, q = i & 15;
        const bool ok = r < lc;
        cp_async16(const_cast<bf16*>(swz(Qb, D, r, 8 * q)), ok ? qb + ((tok0 + r) * hk + kh) * D + 8 * q : qb, ok);
    }
    const bf16* ag = aqk_in + slot * C * C;
#pragma unroll
    for (int j = 0; j < C * C / 8 / 256; ++j) {
        const int i = tid + 256 * j, r = i >> 3, q = i & 7;  // 8 x 16 bytes per row of 64
        cp_async16(const_cast<bf16*>(swz(Ab, C, r, 8 * q)), ag + r * C + 8 * q, true);
    }
    if (tid < C) cp_async4(G + tid, tid < lc ? gcum + (tok0 + tid) * hv + h : gcum, tid < lc);
    if (tid < D / 4) cp_async16(Wn + 4 * tid, norm_w + 4 * tid, true);
    // The gate z of this thread's output elements in the epilogue's store order (row warp + 8 j, columns
    // 4 lane .. 4 lane + 3: one 512-byte row per warp load), loaded now so that their latency hides behind the wait
    // for the walk, the copies and the products (the norm needs them last; issued after the state's copies,
    // Nsight Compute on the H200 still found the epilogue waiting on them).
    const int am = (warp & 3) * 16, an = (warp >> 2) * 64;
    const int r0 = am + fg, r1 = am + fg + 8;
    const size_t vw = static_cast<size_t>(hv) * D;
    float4 zr[C / 8];
#pragma unroll
    for (int j = 0; j < C / 8; ++j) {
        const int r = warp + 8 * j;
        zr[j] = r < lc ? *reinterpret_cast<const float4*>(z + (tok0 + r) * vw + h * D + 4 * lane)
                       : make_float4(0.f, 0.f, 0.f, 0.f);
    }
    // ready (the walk's counters; null when the walk is known to be done, e.g. launched alone): wait until both
    // column blocks of the walk have written the slot. The walk's blocks are all resident before this grid starts
    // (PDL launches it once each has run launch_dependents), so the wait ends; a bounded spin turns a broken
    // pipeline into a trap, not a hang.
    if (ready != nullptr) {
        if (tid == 0) {
            const volatile int* rc = ready + slot;
            unsigned polls = 0;
            while (*rc < 2) {
                __nanosleep(256);
                if (++polls == (1u << 26)) __trap();
            }
            __threadfence();
        }
        __syncthreads();
    }
    for (int i = tid; i < (D + C) * (D / 8); i += 256) {
        const int r = i >> 4, q = i & 15;  // 16 x 16 bytes per row of 128
        cp_async16(const_cast<bf16*>(swz(Hb, D, r, 8 * q)), hg + r * D + 8 * q, true);
    }
    cp_async_commit();
    cp_async_wait<0>();
    __syncthreads();

    float o[8][4];
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) o[j][e] = 0.f;
#pragma unroll 2
    for (int k0 = 0; k0 < D; k0 += 16) {
        uint32_t a[4];
        ldsm_a_swz(a, Qb, D, am, k0, lane);
        mma_kstep<4, true>(o, a, Hb, D, k0, an, lane);
    }
    const float e0 = __expf(G[r0]), e1 = __expf(G[r1]);
#pragma unroll
    for (int j = 0; j < 8; ++j) {
        o[j][0] *= e0;
        o[j][1] *= e0;
        o[j][2] *= e1;
        o[j][3] *= e1;
    }
    // Aqk is zero above the diagonal: the k-steps stop at this warp's last row.
    for (int k0 = 0; k0 < am + 16; k0 += 16) {
        uint32_t a[4];
        ldsm_a_swz(a, Ab, C, am, k0, lane);
        mma_kstep<4, true>(o, a, Vb, D, k0, an, lane);
    }
    // The gated RMSNorm of launch 4: a row's 128 columns lie in the quads of two warps (column halves).
    float ss0 = 0.f, ss1 = 0.f;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
        ss0 += o[j][0] * o[j][0] + o[j][1] * o[j][1];
        ss1 += o[j][2] * o[j][2] + o[j][3] * o[j][3];
    }
    ss0 += __shfl_xor_sync(0xffffffffu, ss0, 1);
    ss0 += __shfl_xor_sync(0xffffffffu, ss0, 2);
    ss1 += __shfl_xor_sync(0xffffffffu, ss1, 1);
    ss1 += __shfl_xor_sync(0xffffffffu, ss1, 2);
    if (ft == 0) {
        red[(warp >> 2) * C + r0] = ss0;
        red[(warp >> 2) * C + r1] = ss1;
    }
    __syncthreads();  // red complete; every warp is past its products, so Qb and Hb are free
    const float n0 = rsqrtf((red[r0] + red[C + r0]) / static_cast<float>(D) + norm_eps);
    const float n1 = rsqrtf((red[r1] + red[C + r1]) / static_cast<float>(D) + norm_eps);
    // The normed rows (o n w, fp32) staged in Os over Qb and Hb, then written 16 bytes per store, one 512-byte row
    // per warp store, times silu(z). (Stored from the accumulators, 8 bytes per thread, ptxas split each store into
    // two 4-byte ones: Nsight Compute on the H200 found 16 of every 32 bytes of a store sector used.) Row stride
    // OSP = D + 8 floats: the half-warps' 8-byte stores fall on distinct banks. Same products in the same order
    // as storing from the accumulators, so the output is bit-identical.
    constexpr int OSP = D + 8;
    static_assert(C * OSP * 4 <= (C * D + D * D) * 2, "Os fits over Qb and Hb");
    float* const Os = reinterpret_cast<float*>(smem_out);
#pragma unroll
    for (int j = 0; j < 8; ++j) {
        const int col = an + 8 * j + 2 * ft;
        const float2 wv = *reinterpret_cast<const float2*>(Wn + col);
        *reinterpret_cast<float2*>(Os + r0 * OSP + col) = make_float2(o[j][0] * n0 * wv.x, o[j][1] * n0 * wv.y);
        *reinterpret_cast<float2*>(Os + r1 * OSP + col) = make_float2(o[j][2] * n1 * wv.x, o[j][3] * n1 * wv.y);
    }
    __syncthreads();
#pragma unroll
    for (int j = 0; j < C / 8; ++j) {
        const int r = warp + 8 * j;
        if (r < lc) {
            const float4 v = *reinterpret_cast<const float4*>(Os + r * OSP + 4 * lane);
            *reinterpret_cast<float4*>(out + (tok0 + r) * vw + h * D + 4 * lane) =
                make_float4(v.x * silu_fast(zr[j].x), v.y * silu_fast(zr[j].y), v.z * silu_fast(zr[j].z),
                            v.w * silu_fast(zr[j].w));
        }
    }
}
#endif

// Eight f16 values to bf16 (through fp32: after fp32 -> f16 at most 1/16 of a bf16 ulp more than rounding the
// fp32 value directly; for the l2-normed q and k, f16's subnormals below 6.1e-5 add at most 3e-8 absolute).
__device__ __forceinline__ uint4 f16x8_to_bf16x8(uint4 x) {
    const uint32_t* x4 = reinterpret_cast<const uint32_t*>(&x);
    uint4 y;
    uint32_t* y4 = reinterpret_cast<uint32_t*>(&y);
#pragma unroll
    for (int q = 0; q < 4; ++q) {
        const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&x4[q]));
        y4[q] = pack_bf16x2(f.x, f.y);
    }
    return y;
}

// ---------------------------------------------------------------------------------------------------------------
// The f16 split (`wyf16_bf16_cs64`): the bf16 split's walk and output launches behind a WY launch on
// f16 tensor cores. kernels/bench/gdn_operand_precision.py (40 draws): all three WY products on f16 operands
// (q, k, v stored in f16 by `gdn_prefill_prep_h`, T, diag(beta e^G) K and diag(beta) V rounded to f16) 1.65e-2 /
// 1.46e-3 on the output / state, the same as the plain-TF32 WY (1.65e-2 / 1.46e-3), where bf16 W / U products
// gave 2.57e-2 / 1.84e-3: f16 keeps TF32's 10 mantissa bits, and the WY's operands fit its range (q and k are
// l2-normed, beta and e^G are at most 1; v is saturated at +-65504 by the prep, T at +-65504 here). Against the
// TF32 `_b` form: half the operand bytes (launch 1 writes 16 bits per q / k / v value instead of 32, and this launch
// reads them), half the mma and fragment loads (m16n8k16 instead of m16n8k8, no rounding adds), and 70,144 bytes of
// shared memory per block instead of 102,912, so three blocks fit an SM (with step 6 in two passes: 76 registers
// under __launch_bounds__(256, 3), no spill). H200, T = 4096 (the launch alone): 214.4 us for
// the TF32 `_b` form, 175.0 for this one at two blocks per SM, 152.2 at three (one pass, 48 bytes of spill: 154.9);
// the whole split step 663.4 -> 602.1 us (1392.4 -> 1258.1 at B = 4, N = 9216). Launch 1's f16 outputs saved no
// time (139.4 -> 140.6 us for the prep): that launch is not bound by its write bytes. Measured earlier (two H200 runs):
// step 3's addresses out of the loop 151.6 -> 141.5 us, the inverse below the diagonal four columns per thread
// (wy_inverse_below) -> 128.3 us, below fla's three WY kernels (137 us).
//
// gdn_prefill_wy_h_b: grid (max_chunks, Hv, seqs), 256 threads, the algebra and outputs of gdn_prefill_wy_tc1_b
// (gcum fp32; W, U, Aqk bf16 in the first half of each fp32 slot):
//   1. K, Q (f16, the key head's), g, beta by cp.async, then V (f16) as a second group; one value head per key
//      head writes the split's bf16 copies of the chunk's q rows from the f16 tile (its k rows in 5a);
//   2. cumsum of g; 3. K K^T and Q K^T (m16n8k16 f16, `WyShare` n-tiles per warp, K^T fragments by ldmatrix
//      without .trans from the K rows), the epilogue of the TF32 builds (`wy_step3_epilogue`), A (fp32) over the Q
//      tile once every warp is past step 3;
//   4 / 5a. warps 2..7 scale K by beta e^G and V by beta in place (f16) while warps 0, 1 invert the diagonal blocks
//      (fp32, `wy_inverse_diagonal`); 5b. the blocks below (`wy_inverse_below`); T to f16 over A;
//   6. W = T Kb and U = T Vb: warp w owns columns 16 w .. 16 w + 15 of both and all four m-tiles (k-steps up to the
//      diagonal block, 10 of 16 per warp, so every warp does the same work), then W and U staged in bf16 over the
//      K and V tiles and written 16 bytes per store.
__host__ __device__ constexpr int wy_h_smem_bytes() { return 3 * C * BP * 2 + C * QP * 4 + 2 * C * 4; }

#if EDGEFIT_LAB
extern "C" __global__ void __launch_bounds__(256, 3)
    gdn_prefill_wy_h_b(const float* __restrict__ qn, const float* __restrict__ kn, const float* __restrict__ vv,
                       const float* __restrict__ gg, const float* __restrict__ bb, const int* __restrict__ meta,
                       float* __restrict__ gcum, float* __restrict__ w_out, float* __restrict__ u_out,
                       float* __restrict__ aqk_out, int hk, int hv, int seqs, int n_chunks, bf16* __restrict__ qb,
                       bf16* __restrict__ kb) {
    static_assert(C * BP * 2 == C * QP * 4, "A (fp32 [C][QP]) lives in the Q tile (f16 [C][BP])");
    extern __shared__ float4 smem_wyh[];
    __half* const Kh = reinterpret_cast<__half*>(smem_wyh);  // [C][BP]: K, then diag(beta e^G) K, then W (bf16)
    __half* const Qh = Kh + C * BP;                          // [C][BP]: Q, then A, then T (f16 [C][HP])
    __half* const Vh = Qh + C * BP;                          // [C][BP]: V, then diag(beta) V, then U (bf16)
    float* const Ts = reinterpret_cast<float*>(Vh + C * BP);  // [C][QP]
    float* const gc = Ts + C * QP;                           // [C]
    float* const bt = gc + C;                                // [C]
    float* const As = reinterpret_cast<float*>(Qh);
    __half* const Th = Qh;
    const __half* const qh = reinterpret_cast<const __half*>(qn);
    const __half* const kh16 = reinterpret_cast<const __half*>(kn);
    const __half* const vh = reinterpret_cast<const __half*>(vv);

    const auto [c, h, s, lc, kh, tok0, slot] = wy_chunk(meta, hk, hv, seqs, n_chunks);
    if (lc <= 0) return;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int fg = lane >> 2, ft = lane & 3;

    // 1. K and Q rows (zero past the chunk), g, beta; then V.
    wy_load_chunk<__half, BP>(Kh, Qh, Vh, gc, bt, kh16, qh, vh, gg, bb, tok0, lc, hk, kh, hv, h, tid);
    cp_async_wait<1>();  // K, Q, g, beta (V may still be in flight)
    __syncthreads();
    // The split's bf16 copies of the chunk's q and k rows (the walk reads k, the output q), from the f16 tiles, by
    // one value head per key head (launch 1 wrote them, 33.5 MB more of its ~290 MB at T = 4096 on
    // the 27B layer): q here (A replaces the Q tile after step 3), k in step 5a, off the inverse's path.
    const bool qk_copies = h % (hv / hk) == 0;
    if (qk_copies) {
#pragma unroll
        for (int j = 0; j < C * (D / 8) / 256; ++j) {
            const int i = tid + 256 * j, r = i >> 4, c8 = i & 15;
            if (r < lc)
                *reinterpret_cast<uint4*>(qb + ((tok0 + r) * hk + kh) * D + 8 * c8) =
                    f16x8_to_bf16x8(*reinterpret_cast<const uint4*>(Qh + r * BP + 8 * c8));
        }
    }
    // 2. In-chunk inclusive cumulative sum of g.
    wy_cumsum(gc, tid);
    __syncthreads();
    if (tid < lc) gcum[(tok0 + tid) * hv + h] = gc[tid];
    if (tid == 0) split_ready(aqk_out, hv, n_chunks)[slot] = 0;

    // 3. K K^T and Q K^T over this warp's share of the n-tiles at or below the diagonal blocks.
    {
        const WyShare sh(warp);
        float kk[3][4], qk[3][4];
#pragma unroll
        for (int j = 0; j < 3; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) kk[j][e] = qk[j][e] = 0.f;
        // Fragment addresses once (derived from the warp's share inside the loop, the compiler
        // re-read SR_TID.X and rebuilt them per k-step and n-tile, ~10 integer instructions and a stall per
        // ldmatrix; Nsight Compute on the H200 put a third of this launch's samples in step 3).
        const uint32_t ka = smem_u32(Kh + (sh.m0 + (lane & 15)) * BP + ((lane >> 4) << 3));
        const uint32_t qa = smem_u32(Qh + (sh.m0 + (lane & 15)) * BP + ((lane >> 4) << 3));
        // B = K^T: b0 = K[n][k0 + 2t ..], b1 = K[n][k0 + 8 + 2t ..] for n = n-tile row g: the K rows as stored,
        // so ldmatrix without .trans (lanes 0..7 the rows at k0, 8..15 at k0 + 8); n-tile j at 8 j rows further.
        // Every warp multiplies three n-tiles, also those whose share has two (their third, past their share, is
        // never used: the epilogue and wy_store_a stop at sh.nn; for the share at n-tiles 6, 7 it reads rows
        // 64 .. 71, the start of the Q tile, which nothing writes in step 3). The slowest warp does three anyway,
        // and without the branch the compiler keeps the addresses in registers.
        const uint32_t kt = smem_u32(Kh + (sh.n0 + (lane & 7)) * BP + 8 * ((lane >> 3) & 1));
#pragma unroll
        for (int k0 = 0; k0 < D; k0 += 16) {
            uint32_t fk[4], fq[4];
            ldmatrix_x4(fk, ka + 2 * k0);
            ldmatrix_x4(fq, qa + 2 * k0);
#pragma unroll
            for (int j = 0; j < 3; ++j) {
                uint32_t b[2];
                ldmatrix_x2(b, kt + 2 * (8 * j * BP + k0));
                mma_f16_16816(kk[j], fk, b[0], b[1]);
                mma_f16_16816(qk[j], fq, b[0], b[1]);
            }
        }
        wy_step3_epilogue<true>(kk, qk, sh, gc, bt, aqk_out, slot, fg, ft, tid);
        cp_async_wait<0>();
        __syncthreads();  // V landed; every warp's step 3 is done with the Q tile, which A replaces
        wy_store_a(As, kk, sh, fg, ft);
    }
    __syncthreads();  // A complete

    // 4 / 5a. Warps 0 and 1: the diagonal blocks of T. Warps 2..7: K scaled by beta e^G and V by beta, in place
    // (rows past the chunk: zero K and V, beta = 0).
    if (warp < 2) {
        wy_inverse_diagonal(As, Ts, warp, lane);
    } else {
        for (int i = tid - 64; i < 2 * C * (D / 8); i += 192) {
            const bool isv = i >= C * (D / 8);
            const int e = isv ? i - C * (D / 8) : i, r = e >> 4, c8 = e & 15;
            uint4* p = reinterpret_cast<uint4*>((isv ? Vh : Kh) + r * BP + 8 * c8);
            const float f = isv ? bt[r] : bt[r] * __expf(gc[r]);  // (f16 operands: the fast exponential)
            uint4 x = *p;
            if (!isv && qk_copies && r < lc)  // the bf16 copy of k, before the scaling
                *reinterpret_cast<uint4*>(kb + ((tok0 + r) * hk + kh) * D + 8 * c8) = f16x8_to_bf16x8(x);
            uint32_t* w4 = reinterpret_cast<uint32_t*>(&x);
#pragma unroll
            for (int q = 0; q < 4; ++q) {
                float2 v2 = __half22float2(*reinterpret_cast<__half2*>(&w4[q]));
                const __half2 r2 = __floats2half2_rn(v2.x * f, v2.y * f);
                w4[q] = *reinterpret_cast<const uint32_t*>(&r2);
            }
            *p = x;
        }
    }
    __syncthreads();  // diagonal blocks of T, scaled K and V
    // 5b. The blocks below the diagonal (ends with a barrier).
    wy_inverse_below(As, Ts, tid);
    // T to f16 over A (the inverse is done with A), saturated at +-65504.
    for (int i = tid; i < C * C / 2; i += 256) {
        const int r = i >> 5, c2 = i & 31;
        const float2 t2 = *reinterpret_cast<const float2*>(Ts + r * QP + 2 * c2);
        *reinterpret_cast<__half2*>(Th + r * HP + 2 * c2) =
            __floats2half2_rn(fminf(fmaxf(t2.x, -65504.f), 65504.f), fminf(fmaxf(t2.y, -65504.f), 65504.f));
    }
    __syncthreads();  // Th complete

    // 6. W = T Kb, then U = T Vb, on columns cw .. cw + 15, all rows (two passes of 32 accumulators, so that three
    // blocks fit an SM's registers); T[r][m] = 0 for m > r, so m-tile t stops at k-step t.
    {
        const int cw = 16 * warp;
        bf16* const Ws = reinterpret_cast<bf16*>(Kh);  // W and U in bf16, staged over the K and V tiles
        bf16* const Us = reinterpret_cast<bf16*>(Vh);
#pragma unroll 1
        for (int pass = 0; pass < 2; ++pass) {
            const __half* const Bt = pass == 0 ? Kh : Vh;
            bf16* const Os = pass == 0 ? Ws : Us;
            float acc[4][2][4];
#pragma unroll
            for (int t = 0; t < 4; ++t)
#pragma unroll
                for (int n = 0; n < 2; ++n)
#pragma unroll
                    for (int e = 0; e < 4; ++e) acc[t][n][e] = 0.f;
#pragma unroll
            for (int ks = 0; ks < 4; ++ks) {
                uint32_t bfr[4];
                ldsm_b2(bfr, Bt, BP, 16 * ks, cw, lane);
#pragma unroll
                for (int t = ks; t < 4; ++t) {
                    uint32_t a[4];
                    ldsm_a(a, Th, HP, 16 * t, 16 * ks, lane);
                    mma_f16_16816(acc[t][0], a, bfr[0], bfr[1]);
                    mma_f16_16816(acc[t][1], a, bfr[2], bfr[3]);
                }
            }
            __syncthreads();  // every warp's products of this pass read its tile, which the bf16 result replaces
#pragma unroll
            for (int t = 0; t < 4; ++t) {
#pragma unroll
                for (int n = 0; n < 2; ++n) {
                    const int r0 = 16 * t + fg, col = cw + 8 * n + 2 * ft;
                    *reinterpret_cast<uint32_t*>(Os + r0 * BP + col) = pack_bf16x2(acc[t][n][0], acc[t][n][1]);
                    *reinterpret_cast<uint32_t*>(Os + (r0 + 8) * BP + col) = pack_bf16x2(acc[t][n][2], acc[t][n][3]);
                }
            }
        }
        __syncthreads();
        bf16* wb = reinterpret_cast<bf16*>(w_out) + slot * C * D;
        bf16* ub = reinterpret_cast<bf16*>(u_out) + slot * C * D;
#pragma unroll
        for (int j = 0; j < C * (D / 8) / 256; ++j) {
            const int i = tid + 256 * j, r = i >> 4, q = i & 15;
            *reinterpret_cast<uint4*>(wb + r * D + 8 * q) = *reinterpret_cast<const uint4*>(Ws + r * BP + 8 * q);
            *reinterpret_cast<uint4*>(ub + r * D + 8 * q) = *reinterpret_cast<const uint4*>(Us + r * BP + 8 * q);
        }
    }
}
#endif

static_assert(PREP_TT == 8, "keep PREP_TOKENS in cuda/gdn_prefill.rs equal");
static_assert(WY_SMEM_BYTES == 101376, "keep GDN_WY_SMEM_BYTES in cuda/gdn_prefill.rs equal");
static_assert(wy_tc_smem_bytes() == 102912, "keep WY_TC_SMEM_BYTES in cuda/gdn_prefill.rs equal");
static_assert(state_tc_smem_bytes(16) == 103424 && state_tc_smem_bytes(32) == 115712 &&
                  state_tc_smem_bytes(64) == 225280,
              "keep gdn_prefill.rs state_tc_smem_bytes equal");
static_assert(state_smem_bytes(16) == 96768 && state_smem_bytes(32) == 109056 && state_smem_bytes(64) == 133632, "keep gdn_prefill.rs state_smem_bytes equal");
static_assert(walk_bf16_smem_bytes() == 125440 && walk1_bf16_smem_bytes() == 137728 &&
                  out_bf16_smem_bytes() == 75008,
              "keep gdn_prefill.rs WALK_BF16_SMEM_BYTES / WALK1_BF16_SMEM_BYTES / OUT_BF16_SMEM_BYTES equal");
static_assert(wy_h_smem_bytes() == 70144, "keep gdn_prefill.rs WY_H_SMEM_BYTES equal");
