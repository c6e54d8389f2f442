// Gated DeltaNet fused recurrent decode step (Qwen3.5 / Qwen3-Next linear-attention layers), one token for each
// of a batch of sequences, everything between the input projections and out_proj in one launch: the causal
// depthwise conv (SiLU), l2-norm of q and k (q scaled by 1/sqrt(dk)), the gates g = -exp(A_log) softplus(a +
// dt_bias) and beta = sigmoid(b), the delta rule S <- e^g S; S <- S + k (x) beta (v - S^T k), o = S^T q, and the
// gated RMSNorm rmsnorm(o) * w * silu(z). Layouts: kernels/src/gdn.rs (fp32 everywhere).
//
// gdn_decode_step (the one the Rust side launches): grid (Hv, seqs), one 256-thread block per (sequence, value
// head). The head's 128x128 fp32 state (64 KiB) is the traffic that matters (read once, written once); thread t
// holds rows 16*(t/32) .. +16 of columns 4*(t%32) .. +4 in registers as float4s, so a warp reads 512 contiguous
// bytes per row. The state loads are issued first and the conv and norms run while they are in flight.
//
// gdn_decode_step_cluster4 (benchmark variant): clusters of 4 blocks of 128 threads, each block owning 32 state
// columns, the gated RMSNorm's sum of squares shared through distributed shared memory. It launches 4x the blocks
// at batch 1, yet measured slower on the H200 (batch 1: 7.7 us vs 7.0; batch 8: 23.8 vs 21.9), so it is kept
// only for the benchmark's comparison. Why, as we read it: five block barriers plus two full cluster barriers,
// the conv's loads issued one channel after the other (each channel's DRAM latency in series), and the second
// cluster barrier's release fence waiting for the block's state stores before the block can leave.
//
// gdn_decode_step_split<S>_t<T>[_mb] (variants, below the two): S blocks of T threads per head, one DSMEM
// exchange of one float per block, three block barriers, all conv loads in flight at once; the Rust side picks
// among all of them by name (kernels/src/cuda/gdn.rs), `auto` being the best measured.
//
// The conv history of a key head is shared by the Hv/Hk value heads (different blocks), so it cannot be updated in
// place: it is read from conv_in and the advanced history written to conv_out, each channel by exactly one block
// (v channels by their own head, q/k channels by the first value head of the group).
#include <cooperative_groups.h>

#include "common.cuh"

using namespace edgefit;
namespace cg = cooperative_groups;

constexpr int GDN_D = 128;  // dk = dv = 128, checked on the Rust side
constexpr int GDN_THREADS = 256;
constexpr int GDN_ROWS = 16;  // state rows per thread: 128 rows over 8 warps

constexpr int GDNC_CL = 4;  // cluster variant: blocks (column slices) per head
constexpr int GDNC_COLS = GDN_D / GDNC_CL;
constexpr int GDNC_THREADS = 128;
constexpr int GDNC_ROWS = 8;

__device__ __forceinline__ float silu_f(float x) { return x / (1.f + expf(-x)); }

__device__ __forceinline__ float softplus_f(float x) { return x > 20.f ? x : log1pf(expf(x)); }

extern "C" __global__ void __launch_bounds__(GDN_THREADS)
    gdn_decode_step(const float* __restrict__ qkv, const float* __restrict__ z, const float* __restrict__ a_in,
                    const float* __restrict__ b_in, const float* __restrict__ conv_w, const float* __restrict__ a_log,
                    const float* __restrict__ dt_bias, const float* __restrict__ norm_w, float norm_eps,
                    const float* __restrict__ conv_in, float* __restrict__ conv_out, float* __restrict__ state,
                    float* __restrict__ out, int hk, int hv, int kconv) {
    const int h = blockIdx.x;
    const int seq = blockIdx.y;
    const int t = threadIdx.x;
    const int lane = t & 31, warp = t >> 5;
    const int group = hv / hk;
    const int kh = h / group;
    const int conv_dim = 2 * hk * GDN_D + hv * GDN_D;
    const int hist = kconv - 1;

    __shared__ float q_s[GDN_D], k_s[GDN_D], v_s[GDN_D], delta_s[GDN_D];
    __shared__ float red[GDN_THREADS / 32][GDN_D];
    __shared__ float norms[8];

    // 1. Issue the state loads.
    float4* sp = reinterpret_cast<float4*>(state + (static_cast<size_t>(seq) * hv + h) * GDN_D * GDN_D) +
                 (warp * GDN_ROWS) * (GDN_D / 4) + lane;
    float4 s[GDN_ROWS];
#pragma unroll
    for (int r = 0; r < GDN_ROWS; ++r) s[r] = sp[r * (GDN_D / 4)];

    // 2. Causal conv + SiLU over this head's 384 channels: q (key head kh), k (key head kh), v (value head h).
    const float* x = qkv + static_cast<size_t>(seq) * conv_dim;
    const float* cin = conv_in + static_cast<size_t>(seq) * conv_dim * hist;
    float* cout = conv_out + static_cast<size_t>(seq) * conv_dim * hist;
    for (int i = t; i < 3 * GDN_D; i += GDN_THREADS) {
        const int part = i / GDN_D, j = i % GDN_D;
        const int ch = part == 0 ? kh * GDN_D + j : part == 1 ? hk * GDN_D + kh * GDN_D + j : 2 * hk * GDN_D + h * GDN_D + j;
        const float xc = x[ch];
        const float* w = conv_w + static_cast<size_t>(ch) * kconv;
        const float* hsrc = cin + static_cast<size_t>(ch) * hist;
        float acc = w[kconv - 1] * xc;
        for (int p = 0; p < hist; ++p) acc = fmaf(w[p], hsrc[p], acc);
        const float y = silu_f(acc);
        if (part == 2 || h % group == 0) {
            float* hdst = cout + static_cast<size_t>(ch) * hist;
            for (int p = 0; p + 1 < hist; ++p) hdst[p] = hsrc[p + 1];
            hdst[hist - 1] = xc;
        }
        (part == 0 ? q_s : part == 1 ? k_s : v_s)[j] = y;
    }
    __syncthreads();

    // 3. l2-norms of q (warp 0) and k (warp 1).
    if (warp < 2) {
        float* vec = warp == 0 ? q_s : k_s;
        float ss = 0.f;
#pragma unroll
        for (int j = 0; j < GDN_D / 32; ++j) ss = fmaf(vec[lane + 32 * j], vec[lane + 32 * j], ss);
        ss = warp_sum(ss);
        if (lane == 0) norms[warp] = (warp == 0 ? rsqrtf(static_cast<float>(GDN_D)) : 1.f) * rsqrtf(ss + 1e-6f);
    }
    const float a = a_in[static_cast<size_t>(seq) * hv + h], b = b_in[static_cast<size_t>(seq) * hv + h];
    const float g = -expf(a_log[h]) * softplus_f(a + dt_bias[h]);
    const float decay = expf(g);
    const float beta = 1.f / (1.f + expf(-b));
    __syncthreads();
    const float qn = norms[0], kn = norms[1];

    // 4. kv = (e^g S)^T k, per column: partial over this thread's rows, then over the 8 warps.
    float kr[GDN_ROWS];
    float4 part = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
    for (int r = 0; r < GDN_ROWS; ++r) {
        kr[r] = k_s[warp * GDN_ROWS + r] * kn;
        s[r].x *= decay; s[r].y *= decay; s[r].z *= decay; s[r].w *= decay;
        part.x = fmaf(s[r].x, kr[r], part.x);
        part.y = fmaf(s[r].y, kr[r], part.y);
        part.z = fmaf(s[r].z, kr[r], part.z);
        part.w = fmaf(s[r].w, kr[r], part.w);
    }
    reinterpret_cast<float4*>(red[warp])[lane] = part;
    __syncthreads();
    if (t < GDN_D) {
        float kv = 0.f;
#pragma unroll
        for (int w = 0; w < GDN_THREADS / 32; ++w) kv += red[w][t];
        delta_s[t] = beta * (v_s[t] - kv);
    }
    __syncthreads();

    // 5. S += k (x) delta, o = S^T q; store S.
    const float4 dl = reinterpret_cast<const float4*>(delta_s)[lane];
    part = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
    for (int r = 0; r < GDN_ROWS; ++r) {
        const float qr = q_s[warp * GDN_ROWS + r] * qn;
        s[r].x = fmaf(kr[r], dl.x, s[r].x);
        s[r].y = fmaf(kr[r], dl.y, s[r].y);
        s[r].z = fmaf(kr[r], dl.z, s[r].z);
        s[r].w = fmaf(kr[r], dl.w, s[r].w);
        part.x = fmaf(s[r].x, qr, part.x);
        part.y = fmaf(s[r].y, qr, part.y);
        part.z = fmaf(s[r].z, qr, part.z);
        part.w = fmaf(s[r].w, qr, part.w);
        sp[r * (GDN_D / 4)] = s[r];
    }
    reinterpret_cast<float4*>(red[warp])[lane] = part;
    __syncthreads();

    // 6. Gated RMSNorm over the head's 128 outputs (warps 0..3 hold one output each thread).
    float o = 0.f;
    if (t < GDN_D) {
#pragma unroll
        for (int w = 0; w < GDN_THREADS / 32; ++w) o += red[w][t];
        const float ss = warp_sum(o * o);
        if (lane == 0) norms[2 + warp] = ss;
    }
    __syncthreads();
    if (t < GDN_D) {
        const float ms = (norms[2] + norms[3] + norms[4] + norms[5]) / static_cast<float>(GDN_D);
        const float r = rsqrtf(ms + norm_eps);
        const size_t idx = (static_cast<size_t>(seq) * hv + h) * GDN_D + t;
        out[idx] = o * r * norm_w[t] * silu_f(z[idx]);
    }
}

extern "C" __global__ void __cluster_dims__(GDNC_CL, 1, 1) __launch_bounds__(GDNC_THREADS)
    gdn_decode_step_cluster4(const float* __restrict__ qkv, const float* __restrict__ z, const float* __restrict__ a_in,
                    const float* __restrict__ b_in, const float* __restrict__ conv_w, const float* __restrict__ a_log,
                    const float* __restrict__ dt_bias, const float* __restrict__ norm_w, float norm_eps,
                    const float* __restrict__ conv_in, float* __restrict__ conv_out, float* __restrict__ state,
                    float* __restrict__ out, int hk, int hv, int kconv) {
    cg::cluster_group cluster = cg::this_cluster();
    const int h = blockIdx.x / GDNC_CL;
    const int cb = blockIdx.x % GDNC_CL;  // column block == rank in the cluster
    const int col0 = cb * GDNC_COLS;
    const int seq = blockIdx.y;
    const int t = threadIdx.x;
    const int lane = t & 31, warp = t >> 5;
    const int cg4 = t % (GDNC_COLS / 4);  // float4 column group 0..7
    const int rg = t / (GDNC_COLS / 4);   // row group 0..15
    const int group = hv / hk;
    const int kh = h / group;
    const int conv_dim = 2 * hk * GDN_D + hv * GDN_D;
    const int hist = kconv - 1;

    __shared__ float q_s[GDN_D], k_s[GDN_D], v_s[GDNC_COLS], delta_s[GDNC_COLS];
    __shared__ float red[GDNC_THREADS / 32][GDNC_COLS];
    __shared__ float norms[4];
    __shared__ float ss_part;

    // 1. Issue the state loads.
    float4* sp = reinterpret_cast<float4*>(state + (static_cast<size_t>(seq) * hv + h) * GDN_D * GDN_D +
                                           static_cast<size_t>(rg * GDNC_ROWS) * GDN_D + col0) + cg4;
    float4 s[GDNC_ROWS];
#pragma unroll
    for (int r = 0; r < GDNC_ROWS; ++r) s[r] = sp[r * (GDN_D / 4)];

    // 2. Causal conv + SiLU: q and k of key head kh (all 128, for the norms), v of this block's 32 columns.
    const float* x = qkv + static_cast<size_t>(seq) * conv_dim;
    const float* cin = conv_in + static_cast<size_t>(seq) * conv_dim * hist;
    float* cout = conv_out + static_cast<size_t>(seq) * conv_dim * hist;
    const bool owns_qk = h % group == 0 && cb == 0;
    for (int i = t; i < 2 * GDN_D + GDNC_COLS; i += GDNC_THREADS) {
        const int part = i < GDN_D ? 0 : i < 2 * GDN_D ? 1 : 2;
        const int j = part == 2 ? i - 2 * GDN_D : i % GDN_D;
        const int ch = part == 0   ? kh * GDN_D + j
                       : part == 1 ? hk * GDN_D + kh * GDN_D + j
                                   : 2 * hk * GDN_D + h * GDN_D + col0 + j;
        const float xc = x[ch];
        const float* w = conv_w + static_cast<size_t>(ch) * kconv;
        const float* hsrc = cin + static_cast<size_t>(ch) * hist;
        float acc = w[kconv - 1] * xc;
        for (int p = 0; p < hist; ++p) acc = fmaf(w[p], hsrc[p], acc);
        const float y = silu_f(acc);
        if (part == 2 || owns_qk) {
            float* hdst = cout + static_cast<size_t>(ch) * hist;
            for (int p = 0; p + 1 < hist; ++p) hdst[p] = hsrc[p + 1];
            hdst[hist - 1] = xc;
        }
        (part == 0 ? q_s : part == 1 ? k_s : v_s)[j] = y;
    }
    __syncthreads();

    // 3. l2-norms of q (warp 0) and k (warp 1); gates.
    if (warp < 2) {
        const float* vec = warp == 0 ? q_s : k_s;
        float ss = 0.f;
#pragma unroll
        for (int j = 0; j < GDN_D / 32; ++j) ss = fmaf(vec[lane + 32 * j], vec[lane + 32 * j], ss);
        ss = warp_sum(ss);
        if (lane == 0) norms[warp] = (warp == 0 ? rsqrtf(static_cast<float>(GDN_D)) : 1.f) * rsqrtf(ss + 1e-6f);
    }
    const float a = a_in[static_cast<size_t>(seq) * hv + h], b = b_in[static_cast<size_t>(seq) * hv + h];
    const float g = -expf(a_log[h]) * softplus_f(a + dt_bias[h]);
    const float decay = expf(g);
    const float beta = 1.f / (1.f + expf(-b));
    __syncthreads();
    const float qn = norms[0], kn = norms[1];

    // 4. kv = (e^g S)^T k for this block's columns: partial over 8 rows, then over the 4 row groups of the warp
    // (lanes 8 apart), then over the 4 warps.
    float kr[GDNC_ROWS];
    float4 part = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
    for (int r = 0; r < GDNC_ROWS; ++r) {
        kr[r] = k_s[rg * GDNC_ROWS + r] * kn;
        s[r].x *= decay; s[r].y *= decay; s[r].z *= decay; s[r].w *= decay;
        part.x = fmaf(s[r].x, kr[r], part.x);
        part.y = fmaf(s[r].y, kr[r], part.y);
        part.z = fmaf(s[r].z, kr[r], part.z);
        part.w = fmaf(s[r].w, kr[r], part.w);
    }
#pragma unroll
    for (int o = 8; o < 32; o <<= 1) {
        part.x += __shfl_xor_sync(0xffffffffu, part.x, o);
        part.y += __shfl_xor_sync(0xffffffffu, part.y, o);
        part.z += __shfl_xor_sync(0xffffffffu, part.z, o);
        part.w += __shfl_xor_sync(0xffffffffu, part.w, o);
    }
    if (lane < 8) reinterpret_cast<float4*>(red[warp])[lane] = part;
    __syncthreads();
    if (t < GDNC_COLS) {
        const float kv = red[0][t] + red[1][t] + red[2][t] + red[3][t];
        delta_s[t] = beta * (v_s[t] - kv);
    }
    __syncthreads();

    // 5. S += k (x) delta, o = S^T q; store S.
    const float4 dl = reinterpret_cast<const float4*>(delta_s)[cg4];
    part = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
    for (int r = 0; r < GDNC_ROWS; ++r) {
        const float qr = q_s[rg * GDNC_ROWS + r] * qn;
        s[r].x = fmaf(kr[r], dl.x, s[r].x);
        s[r].y = fmaf(kr[r], dl.y, s[r].y);
        s[r].z = fmaf(kr[r], dl.z, s[r].z);
        s[r].w = fmaf(kr[r], dl.w, s[r].w);
        part.x = fmaf(s[r].x, qr, part.x);
        part.y = fmaf(s[r].y, qr, part.y);
        part.z = fmaf(s[r].z, qr, part.z);
        part.w = fmaf(s[r].w, qr, part.w);
        sp[r * (GDN_D / 4)] = s[r];
    }
#pragma unroll
    for (int o = 8; o < 32; o <<= 1) {
        part.x += __shfl_xor_sync(0xffffffffu, part.x, o);
        part.y += __shfl_xor_sync(0xffffffffu, part.y, o);
        part.z += __shfl_xor_sync(0xffffffffu, part.z, o);
        part.w += __shfl_xor_sync(0xffffffffu, part.w, o);
    }
    if (lane < 8) reinterpret_cast<float4*>(red[warp])[lane] = part;
    __syncthreads();

    // 6. Gated RMSNorm over the head's 128 outputs: this block's 32 in warp 0, the sum of squares shared across
    // the cluster.
    float o = 0.f;
    if (warp == 0) {
        o = red[0][lane] + red[1][lane] + red[2][lane] + red[3][lane];
        const float ss = warp_sum(o * o);
        if (lane == 0) ss_part = ss;
    }
    cluster.sync();  // every block's ss_part written and visible cluster-wide
    if (warp == 0) {
        float total = 0.f;
#pragma unroll
        for (int r = 0; r < GDNC_CL; ++r) total += *cluster.map_shared_rank(&ss_part, r);
        const float rinv = rsqrtf(total / static_cast<float>(GDN_D) + norm_eps);
        const size_t idx = (static_cast<size_t>(seq) * hv + h) * GDN_D + col0 + lane;
        out[idx] = o * rinv * norm_w[col0 + lane] * silu_f(z[idx]);
    }
    cluster.sync();  // no block leaves while another may still read its ss_part
}

// ---------------------------------------------------------------------------------------------------------------
// gdn_decode_step_split<S>_t<T> (variants, the benchmark picks): grid (Hv*S, seqs), blocks of T threads, each
// block owning C = 128/S of the head's 128 state columns (value dims); the S blocks of one head form a cluster
// (S > 1). Columns are independent in the delta rule (kv, delta, the update and o are per column; only the rows,
// the key dims, are summed), so a column split needs no exchange until the gated RMSNorm, which needs the sum of
// squares of the head's whole 128-wide output row. What differs from gdn_decode_step and from the cluster4
// variant that measured slower:
//  * S x the blocks at batch 1 (96-384 instead of 48 on 132 SMs), each moving 64/S KiB of state, so the state
//    traffic is spread over more SMs' load paths instead of queueing on 48 of them;
//  * three block barriers instead of five: every warp computes the two l2-norms itself from shared memory (8
//    loads and two shuffle trees, instead of a barrier), and every thread forms delta for its own 4 columns from
//    the per-warp kv partials (4 float4 broadcasts, instead of a barrier);
//  * the RMSNorm exchange is one cluster barrier, not two: each block pushes its partial sum of squares (one
//    float) into a slot of every block of the cluster (st to distributed shared memory) and then arrives with
//    release semantics and waits with acquire semantics; each block then reads only its own slots, so no block
//    can leave while another still reads its shared memory. The "all blocks have started" condition that remote
//    stores need is a relaxed arrive at the kernel's start whose wait comes at the end (it has completed by then);
//  * the state loads are issued first, before the per-head scalars, the conv and its loads; z and the norm
//    weight are loaded before the recurrence, so the epilogue waits on nothing.
// Thread t holds rows R*(t/CG) .. +R of float4 column group t%CG (CG = C/4 groups, R = 128*CG/T rows): a warp
// reads 32/CG row segments of C*4 contiguous bytes per load. Each block recomputes the conv and l2-norms of the
// 128 q and 128 k channels it needs (1 KiB of qkv and 3 KiB of conv history, mostly L2 hits); q/k conv history is
// written by rank 0 of the first value head of the key-head group, v history by the block owning the columns.
// S = 1 is the same code without the cluster: the barrier savings alone, at the original block count.
namespace {

__device__ __forceinline__ void cluster_arrive_relaxed() {
    asm volatile("barrier.cluster.arrive.relaxed.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void cluster_arrive_release() {
    asm volatile("barrier.cluster.arrive.release.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void cluster_wait_acquire() {
    asm volatile("barrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}

// The mbarrier exchange: a one-phase mbarrier per block expecting S*4 bytes; every block writes its float into
// slot `rank` of every block's ss_slot with st.async, which signals the receiving block's mbarrier.
__device__ __forceinline__ unsigned smem_addr(const void* p) {
    return static_cast<unsigned>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void mbar_init(unsigned long long* bar, unsigned count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_arrive_expect_tx(unsigned long long* bar, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(bytes)
                 : "memory");
}
__device__ __forceinline__ void mbar_wait_phase0(unsigned long long* bar) {
    unsigned done = 0;
    while (!done) {
        asm volatile(
            "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], 0;\n selp.u32 %0, 1, 0, p;\n}\n"
            : "=r"(done)
            : "r"(smem_addr(bar))
            : "memory");
    }
}
// Stores v into `slot` of block `rank` of the cluster and signals 4 bytes on that block's `bar`.
__device__ __forceinline__ void st_async_cluster(float* slot, unsigned long long* bar, unsigned rank, float v) {
    unsigned rslot, rbar;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(rslot) : "r"(smem_addr(slot)), "r"(rank));
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(rbar) : "r"(smem_addr(bar)), "r"(rank));
    asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [%0], %1, [%2];\n" ::"r"(rslot),
                 "r"(__float_as_uint(v)), "r"(rbar)
                 : "memory");
}

__device__ __forceinline__ float4 f4_add(float4 a, float4 b) {
    return make_float4(a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w);
}

// Sum over the lanes of a warp that hold the same column group (lanes CG, 2CG, ... apart).
template <int CG>
__device__ __forceinline__ float4 rowgroup_sum(float4 p) {
#pragma unroll
    for (int o = CG; o < 32; o <<= 1) {
        p.x += __shfl_xor_sync(0xffffffffu, p.x, o);
        p.y += __shfl_xor_sync(0xffffffffu, p.y, o);
        p.z += __shfl_xor_sync(0xffffffffu, p.z, o);
        p.w += __shfl_xor_sync(0xffffffffu, p.w, o);
    }
    return p;
}

template <int S, int T, bool MB>
__device__ __forceinline__ void gdn_split_body(const float* __restrict__ qkv, const float* __restrict__ z,
                                               const float* __restrict__ a_in, const float* __restrict__ b_in,
                                               const float* __restrict__ conv_w, const float* __restrict__ a_log,
                                               const float* __restrict__ dt_bias, const float* __restrict__ norm_w,
                                               float norm_eps, const float* __restrict__ conv_in,
                                               float* __restrict__ conv_out, float* __restrict__ state,
                                               float* __restrict__ out, int hk, int hv, int kconv) {
    constexpr int C = GDN_D / S;   // state columns of this block
    constexpr int CG = C / 4;      // float4 column groups
    constexpr int RG = T / CG;     // row groups
    constexpr int R = GDN_D / RG;  // rows per thread
    constexpr int NW = T / 32;
    constexpr int J = (C + 31) / 32;  // output columns per lane of warp 0
    static_assert(S >= 1 && S <= 8 && GDN_D % S == 0, "cluster of 1..8 blocks");
    static_assert(T % 32 == 0 && 32 % CG == 0 && T % CG == 0, "a warp holds whole column groups");
    static_assert(RG * R == GDN_D && R >= 1, "row groups tile the 128 rows");
    static_assert(C <= T, "the conv loop covers C value channels");

    const int h = blockIdx.x / S;
    const int rank = blockIdx.x % S;  // == %cluster_ctarank for __cluster_dims__(S, 1, 1)
    const int col0 = rank * C;
    const int seq = blockIdx.y;
    const int t = threadIdx.x;
    const int lane = t & 31, warp = t >> 5;
    const int cg = t % CG, rg = t / CG;
    const int group = hv / hk;
    const int kh = h / group;
    const int conv_dim = 2 * hk * GDN_D + hv * GDN_D;
    const int hist = kconv - 1;

    __shared__ __align__(16) float q_s[GDN_D];
    __shared__ __align__(16) float k_s[GDN_D];
    __shared__ __align__(16) float v_s[C];
    __shared__ __align__(16) float red_kv[NW][C];
    __shared__ __align__(16) float red_o[NW][C];
    __shared__ float ss_slot[S];
    __shared__ __align__(8) unsigned long long ss_bar;  // MB only

    // The cluster's "every block has started" phase (and, MB, "every block's mbarrier is initialised"): a
    // relaxed arrive now, the wait at the end, before any remote store.
    if constexpr (S > 1) {
        if constexpr (MB) {
            if (t == 0) {
                mbar_init(&ss_bar, 1);
                asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
            }
        }
        cluster_arrive_relaxed();
    }

    // 1. The state loads, first.
    float4* sp = reinterpret_cast<float4*>(state + (static_cast<size_t>(seq) * hv + h) * GDN_D * GDN_D +
                                           static_cast<size_t>(rg * R) * GDN_D + col0) +
                 cg;
    float4 s[R];
#pragma unroll
    for (int r = 0; r < R; ++r) s[r] = sp[r * (GDN_D / 4)];

    // Per-head scalars and the epilogue's operands, loaded now so nothing later waits on them.
    const size_t hs = static_cast<size_t>(seq) * hv + h;
    const float a = a_in[hs], b = b_in[hs], alog = a_log[h], dtb = dt_bias[h];
    float zr[J], nw[J];
    if (warp == 0) {
#pragma unroll
        for (int j = 0; j < J; ++j) {
            const int c = lane + 32 * j;
            zr[j] = c < C ? z[hs * GDN_D + col0 + c] : 0.f;
            nw[j] = c < C ? norm_w[col0 + c] : 0.f;
        }
    }

    // 2. Causal conv + SiLU: the 128 q and 128 k channels of key head kh, the C v channels of these columns.
    const float* x = qkv + static_cast<size_t>(seq) * conv_dim;
    const float* cin = conv_in + static_cast<size_t>(seq) * conv_dim * hist;
    float* cout = conv_out + static_cast<size_t>(seq) * conv_dim * hist;
    const bool owns_qk = h % group == 0 && rank == 0;
    // All loads of the thread's NI channels first, then the arithmetic and the stores, so the (DRAM) latencies
    // of its channels overlap instead of queueing one channel after the other.
    constexpr int NCH = 2 * GDN_D + C;
    constexpr int NI = (NCH + T - 1) / T;
    float xr[NI], h0[NI], h1[NI], h2[NI], w0[NI], w1[NI], w2[NI], wl[NI];
    int chs[NI];
#pragma unroll
    for (int it = 0; it < NI; ++it) {
        const int i = t + it * T;
        chs[it] = -1;
        xr[it] = h0[it] = h1[it] = h2[it] = w0[it] = w1[it] = w2[it] = wl[it] = 0.f;
        if (i < NCH) {
            const int ch = i < GDN_D       ? kh * GDN_D + i
                           : i < 2 * GDN_D ? hk * GDN_D + kh * GDN_D + (i - GDN_D)
                                           : 2 * hk * GDN_D + h * GDN_D + col0 + (i - 2 * GDN_D);
            chs[it] = ch;
            xr[it] = x[ch];
            const float* hsrc = cin + static_cast<size_t>(ch) * hist;
            h0[it] = hsrc[0];  // hist >= 1 (kconv >= 2, checked on the Rust side)
            if (hist > 1) h1[it] = hsrc[1];
            if (hist > 2) h2[it] = hsrc[2];
            if (kconv == 4) {  // [conv_dim, 4] rows are 16-byte aligned
                const float4 w4 = *reinterpret_cast<const float4*>(conv_w + static_cast<size_t>(ch) * 4);
                w0[it] = w4.x; w1[it] = w4.y; w2[it] = w4.z; wl[it] = w4.w;
            } else {
                const float* w = conv_w + static_cast<size_t>(ch) * kconv;
                wl[it] = w[kconv - 1];
                w0[it] = w[0];  // kconv = 2: taps (w0 . h0) + wl x; kconv = 3: (w0 . h0) + (w1 . h1) + wl x
                if (kconv > 2) w1[it] = w[1];
            }
        }
    }
#pragma unroll
    for (int it = 0; it < NI; ++it) {
        const int i = t + it * T;
        if (i < NCH) {
            // Unused taps are zero in both operands (w1, h1 for kconv 2; w2, h2 for kconv 2 and 3).
            const float acc = fmaf(w0[it], h0[it], fmaf(w1[it], h1[it], fmaf(w2[it], h2[it], wl[it] * xr[it])));
            const float y = silu_f(acc);
            if (i < GDN_D) q_s[i] = y;
            else if (i < 2 * GDN_D) k_s[i - GDN_D] = y;
            else v_s[i - 2 * GDN_D] = y;
            if (i >= 2 * GDN_D || owns_qk) {
                float* hdst = cout + static_cast<size_t>(chs[it]) * hist;
                // The history shifts by one: [h0, h1, h2] -> [h1, h2, x] (shorter for kconv < 4).
                if (hist == 1) {
                    hdst[0] = xr[it];
                } else if (hist == 2) {
                    hdst[0] = h1[it];
                    hdst[1] = xr[it];
                } else {
                    hdst[0] = h1[it];
                    hdst[1] = h2[it];
                    hdst[2] = xr[it];
                }
            }
        }
    }
    const float g = -expf(alog) * softplus_f(a + dtb);
    const float decay = expf(g);
    const float beta = 1.f / (1.f + expf(-b));
    __syncthreads();  // barrier 1: q_s, k_s, v_s

    // 3. l2-norms of q and k, in every warp (no barrier).
    float sq = 0.f, sk = 0.f;
#pragma unroll
    for (int j = 0; j < GDN_D / 32; ++j) {
        const float qv = q_s[lane + 32 * j], kv = k_s[lane + 32 * j];
        sq = fmaf(qv, qv, sq);
        sk = fmaf(kv, kv, sk);
    }
    sq = warp_sum(sq);
    sk = warp_sum(sk);
    const float qn = rsqrtf(static_cast<float>(GDN_D)) * rsqrtf(sq + 1e-6f);
    const float kn = rsqrtf(sk + 1e-6f);

    // 4. kv = (e^g S)^T k for these columns: over the thread's rows, the warp's row groups, then the warps.
    float kr[R];
    float4 part = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
    for (int r = 0; r < R; ++r) {
        kr[r] = k_s[rg * R + r] * kn;
        s[r].x *= decay; s[r].y *= decay; s[r].z *= decay; s[r].w *= decay;
        part.x = fmaf(s[r].x, kr[r], part.x);
        part.y = fmaf(s[r].y, kr[r], part.y);
        part.z = fmaf(s[r].z, kr[r], part.z);
        part.w = fmaf(s[r].w, kr[r], part.w);
    }
    part = rowgroup_sum<CG>(part);
    if (lane < CG) reinterpret_cast<float4*>(red_kv[warp])[lane] = part;  // lane < CG: cg == lane
    __syncthreads();  // barrier 2: red_kv

    // 5. delta = beta (v - kv) for this thread's 4 columns; S += k (x) delta, o = S^T q; store S.
    float4 kv = reinterpret_cast<const float4*>(red_kv[0])[cg];
#pragma unroll
    for (int w = 1; w < NW; ++w) kv = f4_add(kv, reinterpret_cast<const float4*>(red_kv[w])[cg]);
    const float4 vv = reinterpret_cast<const float4*>(v_s)[cg];
    const float4 dl = make_float4(beta * (vv.x - kv.x), beta * (vv.y - kv.y), beta * (vv.z - kv.z),
                                  beta * (vv.w - kv.w));
    part = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
    for (int r = 0; r < R; ++r) {
        const float qr = q_s[rg * R + r] * qn;
        s[r].x = fmaf(kr[r], dl.x, s[r].x);
        s[r].y = fmaf(kr[r], dl.y, s[r].y);
        s[r].z = fmaf(kr[r], dl.z, s[r].z);
        s[r].w = fmaf(kr[r], dl.w, s[r].w);
        part.x = fmaf(s[r].x, qr, part.x);
        part.y = fmaf(s[r].y, qr, part.y);
        part.z = fmaf(s[r].z, qr, part.z);
        part.w = fmaf(s[r].w, qr, part.w);
        sp[r * (GDN_D / 4)] = s[r];
    }
    part = rowgroup_sum<CG>(part);
    if (lane < CG) reinterpret_cast<float4*>(red_o[warp])[lane] = part;
    __syncthreads();  // barrier 3: red_o

    // 6. Gated RMSNorm: warp 0 holds the C outputs (J per lane) and their sum of squares; with S > 1 the S
    // partial sums meet in every block's ss_slot through distributed shared memory. Every thread of the cluster
    // takes part in the cluster barrier (arrive release, wait acquire), as the PTX rules for barrier.cluster ask.
    float o[J];
    float ss = 0.f;
    if (warp == 0) {
#pragma unroll
        for (int j = 0; j < J; ++j) {
            const int c = lane + 32 * j;
            o[j] = 0.f;
            if (c < C) {
#pragma unroll
                for (int w = 0; w < NW; ++w) o[j] += red_o[w][c];
            }
            ss = fmaf(o[j], o[j], ss);
        }
        ss = warp_sum(ss);
    }
    float total = ss;
    if constexpr (S > 1 && MB) {
        cluster_wait_acquire();  // the start's phase: every block of the cluster runs, its mbarrier initialised
        if (warp == 0) {
            if (lane < S) st_async_cluster(&ss_slot[rank], &ss_bar, lane, ss);
            if (lane == 0) mbar_arrive_expect_tx(&ss_bar, S * sizeof(float));
            mbar_wait_phase0(&ss_bar);  // all S floats have landed in this block's ss_slot
            total = 0.f;
#pragma unroll
            for (int r = 0; r < S; ++r) total += ss_slot[r];
        }
    } else if constexpr (S > 1) {
        cluster_wait_acquire();  // the start's phase: every block of the cluster is running
        if (warp == 0 && lane < S) {
            float* dst = cg::this_cluster().map_shared_rank(&ss_slot[rank], lane);
            *dst = ss;
        }
        cluster_arrive_release();
        cluster_wait_acquire();
        total = 0.f;
#pragma unroll
        for (int r = 0; r < S; ++r) total += ss_slot[r];
    }
    if (warp == 0) {
        const float rinv = rsqrtf(total / static_cast<float>(GDN_D) + norm_eps);
#pragma unroll
        for (int j = 0; j < J; ++j) {
            const int c = lane + 32 * j;
            if (c < C) out[hs * GDN_D + col0 + c] = o[j] * rinv * nw[j] * silu_f(zr[j]);
        }
    }
}

}  // namespace

#define GDN_SPLIT_KERNEL(S, T, MB, NAME, CLUSTER_ATTR)                                                          \
    extern "C" __global__ void CLUSTER_ATTR __launch_bounds__(T) NAME(                                          \
        const float* __restrict__ qkv, const float* __restrict__ z, const float* __restrict__ a_in,             \
        const float* __restrict__ b_in, const float* __restrict__ conv_w, const float* __restrict__ a_log,      \
        const float* __restrict__ dt_bias, const float* __restrict__ norm_w, float norm_eps,                    \
        const float* __restrict__ conv_in, float* __restrict__ conv_out, float* __restrict__ state,             \
        float* __restrict__ out, int hk, int hv, int kconv) {                                                   \
        gdn_split_body<S, T, MB>(qkv, z, a_in, b_in, conv_w, a_log, dt_bias, norm_w, norm_eps, conv_in, conv_out,   \
                             state, out, hk, hv, kconv);                                                        \
    }

// Names: split<S>_t<T> with the cluster-barrier exchange, split<S>_t<T>_mb with the mbarrier one.
#define GDN_NO_CLUSTER
GDN_SPLIT_KERNEL(1, 256, false, gdn_decode_step_split1_t256, GDN_NO_CLUSTER)
GDN_SPLIT_KERNEL(2, 128, false, gdn_decode_step_split2_t128, __cluster_dims__(2, 1, 1))
GDN_SPLIT_KERNEL(2, 256, false, gdn_decode_step_split2_t256, __cluster_dims__(2, 1, 1))
GDN_SPLIT_KERNEL(4, 128, false, gdn_decode_step_split4_t128, __cluster_dims__(4, 1, 1))
GDN_SPLIT_KERNEL(4, 256, false, gdn_decode_step_split4_t256, __cluster_dims__(4, 1, 1))
GDN_SPLIT_KERNEL(8, 64, false, gdn_decode_step_split8_t64, __cluster_dims__(8, 1, 1))
GDN_SPLIT_KERNEL(8, 128, false, gdn_decode_step_split8_t128, __cluster_dims__(8, 1, 1))
GDN_SPLIT_KERNEL(2, 128, true, gdn_decode_step_split2_t128_mb, __cluster_dims__(2, 1, 1))
GDN_SPLIT_KERNEL(2, 256, true, gdn_decode_step_split2_t256_mb, __cluster_dims__(2, 1, 1))
GDN_SPLIT_KERNEL(4, 128, true, gdn_decode_step_split4_t128_mb, __cluster_dims__(4, 1, 1))
GDN_SPLIT_KERNEL(4, 256, true, gdn_decode_step_split4_t256_mb, __cluster_dims__(4, 1, 1))
GDN_SPLIT_KERNEL(8, 64, true, gdn_decode_step_split8_t64_mb, __cluster_dims__(8, 1, 1))
GDN_SPLIT_KERNEL(8, 128, true, gdn_decode_step_split8_t128_mb, __cluster_dims__(8, 1, 1))
