// Gated DeltaNet fused recurrent decode step (Qwen3.5 / Qwen3-Next linear-attention layers), one token for each
// of a batch of sequences, everything between the input projections and out_proj in one launch: the causal
// depthwise conv (SiLU), l2-norm of q and k (q scaled by 1/sqrt(dk)), the gates g = -exp(A_log) softplus(a +
// dt_bias) and beta = sigmoid(b), the delta rule S <- e^g S; S <- S + k (x) beta (v - S^T k), o = S^T q, and the
// gated RMSNorm rmsnorm(o) * w * silu(z). Layouts: kernels/src/gdn.rs (fp32 everywhere).
//
// gdn_decode_step ("block_per_head", the reference arm of the tests and the benchmark): grid (Hv, seqs), one
// 256-thread block per (sequence, value head). The head's 128x128 fp32 state (64 KiB) is the traffic that matters
// (read once, written once); thread t holds rows 16*(t/32) .. +16 of columns 4*(t%32) .. +4 in registers as
// float4s, so a warp reads 512 contiguous bytes per row. The state loads are issued first and the conv and norms
// run while they are in flight.
//
// gdn_decode_step_split<S>_t<T>_1r (below it): S blocks of T threads per head in a cluster, each owning 128/S
// state columns, the gated RMSNorm's sum of squares exchanged through distributed shared memory; the Rust side
// picks among them by batch (`auto_kernel`, kernels/src/cuda/gdn.rs, with the H200 numbers). Removed after the
// H200 measured them (`benchmarks/h200.md`): a 4-block cluster with two full cluster barriers
// (slower than block_per_head at every batch), the split variants that exchanged through a cluster barrier
// instead of an mbarrier, split1 (no cluster), the two-reduction `_mb` form (S^T k, then the update, then S^T q:
// 1-4% slower than `_1r` at every batch) and split8_t64 (never the best at any batch).
//
// The conv history of a key head is shared by the Hv/Hk value heads (different blocks), so it cannot be updated in
// place: it is read from conv_in and the advanced history written to conv_out, each channel by exactly one block
// (v channels by their own head, q/k channels by the first value head of the group). On the engine's slot caches
// (`slots` non-null, gdn_rows below) the two are the halves of a slot's pair, swapped by the position's parity.
#include "common.cuh"

using namespace edgefit;

constexpr int GDN_D = 128;  // dk = dv = 128, checked on the Rust side
#if EDGEFIT_LAB
// The one-block-per-head reference arm (`block_per_head`): no `Auto` batch size runs it, so only the lab
// embeds it.
constexpr int GDN_THREADS = 256;
constexpr int GDN_ROWS = 16;  // state rows per thread: 128 rows over 8 warps
#endif

__device__ __forceinline__ float silu_f(float x) { return x / (1.f + expf(-x)); }

__device__ __forceinline__ float softplus_f(float x) { return x > 20.f ? x : log1pf(expf(x)); }

// Where sequence `seq`'s caches live. Without `slots` (nullptr): row `seq` of `state`, the history read from
// conv_in and written to conv_out, row `seq` of each. With `slots` (the engine's caches, one row per slot, so that a
// recorded graph serves any set of sequences): row `slots[seq]` of `state`, and conv_in == conv_out holds two
// histories per slot, `[slot][2][conv_len]`, read from half `pos[seq] & 1` and written to the other (the next
// position reads it), so no copy back is needed. A slot past `n_slots` is refused: false, and the caller writes NaN
// outputs instead of touching memory.
__device__ __forceinline__ bool gdn_rows(int seq, const unsigned* __restrict__ slots,
                                         const unsigned* __restrict__ pos, unsigned n_slots, size_t conv_len,
                                         const float* conv_in, float* conv_out, const float*& cin, float*& cout,
                                         size_t& row) {
    if (slots == nullptr) {
        row = static_cast<size_t>(seq);
        cin = conv_in + row * conv_len;
        cout = conv_out + row * conv_len;
        return true;
    }
    const unsigned r = slots[seq];
    if (r >= n_slots) return false;
    const unsigned p = pos[seq] & 1u;
    row = r;
    cin = conv_in + (2 * row + p) * conv_len;
    cout = conv_out + (2 * row + (p ^ 1u)) * conv_len;
    return true;
}

#if EDGEFIT_LAB
extern "C" __global__ void __launch_bounds__(GDN_THREADS)
    gdn_decode_step(const float* __restrict__ qkv, const float* __restrict__ z, const float* __restrict__ a_in,
                    const float* __restrict__ b_in, const float* __restrict__ conv_w, const float* __restrict__ a_log,
                    const float* __restrict__ dt_bias, const float* __restrict__ norm_w, float norm_eps,
                    const float* conv_in, float* conv_out, float* __restrict__ state,
                    float* __restrict__ out, int hk, int hv, int kconv, const unsigned* __restrict__ slots,
                    const unsigned* __restrict__ pos, unsigned n_slots, int qkv_ld, int z_ld, int ab_ld) {
    pdl_start();
    const int h = blockIdx.x;
    const int seq = blockIdx.y;
    const int t = threadIdx.x;
    const int lane = t & 31, warp = t >> 5;
    const int group = hv / hk;
    const int kh = h / group;
    const int conv_dim = 2 * hk * GDN_D + hv * GDN_D;
    const int hist = kconv - 1;
    const size_t hs = static_cast<size_t>(seq) * hv + h;
    const float* cin;
    float* cout;
    size_t row;
    if (!gdn_rows(seq, slots, pos, n_slots, static_cast<size_t>(conv_dim) * hist, conv_in, conv_out, cin, cout, row)) {
        if (t < GDN_D) out[hs * GDN_D + t] = __int_as_float(0x7fc00000);
        return;
    }

    __shared__ float q_s[GDN_D], k_s[GDN_D], v_s[GDN_D], delta_s[GDN_D];
    __shared__ float red[GDN_THREADS / 32][GDN_D];
    __shared__ float norms[8];

    // 1. Issue the state loads.
    float4* sp = reinterpret_cast<float4*>(state + (row * hv + h) * GDN_D * GDN_D) +
                 (warp * GDN_ROWS) * (GDN_D / 4) + lane;
    float4 s[GDN_ROWS];
#pragma unroll
    for (int r = 0; r < GDN_ROWS; ++r) s[r] = sp[r * (GDN_D / 4)];

    // 2. Causal conv + SiLU over this head's 384 channels: q (key head kh), k (key head kh), v (value head h).
    const float* x = qkv + static_cast<size_t>(seq) * qkv_ld;
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
    const float a = a_in[static_cast<size_t>(seq) * ab_ld + h], b = b_in[static_cast<size_t>(seq) * ab_ld + h];
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
        out[hs * GDN_D + t] = o * r * norm_w[t] * silu_f(z[static_cast<size_t>(seq) * z_ld + h * GDN_D + t]);
    }
}
#endif

// ---------------------------------------------------------------------------------------------------------------
// gdn_decode_step_split<S>_t<T>_1r (what `auto` runs): grid (Hv*S, seqs), blocks of T threads, each block
// owning C = 128/S of the head's 128 state columns (value dims); the S blocks of one head form a cluster. Columns
// are independent in the delta rule (kv, delta, the update and o are per column; only the rows, the key dims, are
// summed), so a column split needs no exchange until the gated RMSNorm, which needs the sum of squares of the
// head's whole 128-wide output row. What makes them faster than gdn_decode_step (1.2-1.45x on the H200):
//  * S x the blocks at batch 1 (96-384 instead of 48 on 132 SMs), each moving 64/S KiB of state, so the state
//    traffic is spread over more SMs' load paths instead of queueing on 48 of them;
//  * fewer block barriers: every warp computes the l2-norms itself from shared memory (two shuffle trees instead
//    of a barrier) and every thread forms delta for its own 4 columns from the per-warp kv partials;
//  * all of a thread's conv loads are issued before any is used (the channels' DRAM latencies overlap);
//  * the state loads are issued first, before the per-head scalars and the conv; z and the norm weight are loaded
//    before the recurrence, so the epilogue waits on nothing;
//  * the RMSNorm exchange through an mbarrier: each block's mbarrier expects S*4 bytes; every block writes its
//    partial sum of squares into slot `rank` of every block's ss_slot with st.async, which signals the receiving
//    block's mbarrier; a block waits only for its own slots, so there is no cluster barrier after the start, and
//    no block can leave while its shared memory still has something to receive. Remote stores need every block
//    of the cluster running with its mbarrier initialised: a relaxed cluster arrive after the init at the start,
//    its (long completed) wait just before the first st.async.
// "_1r" (one reduction; it first aimed at batch 1-2, where the step is a chain of latencies, and won at every batch):
// o = S'^T q with S' = e^g S + k delta^T is e^g (S^T q) + (k . q) delta, so the partials of S^T k and S^T q are
// formed in one pass over the registers and reduced together (one shuffle tree of 8 floats, one barrier), k . q
// comes from the same shuffle tree as the two l2-norms, and the output needs no second pass over the state: one
// block barrier and one shuffle tree fewer on the critical path than the two-reduction form it replaced. The
// state update and its stores then overlap the DSMEM exchange (warp 0 sends its partial sum of squares first, updates its rows, then waits).
// Thread t holds rows R*(t/CG) .. +R of float4 column group t%CG (CG = C/4 groups, R = 128*CG/T rows): a warp
// reads 32/CG row segments of C*4 contiguous bytes per load. Each block recomputes the conv and l2-norms of the
// 128 q and 128 k channels it needs (1 KiB of qkv and 3 KiB of conv history, mostly L2 hits); q/k conv history is
// written by rank 0 of the first value head of the key-head group, v history by the block owning the columns.
namespace {

__device__ __forceinline__ void cluster_arrive_relaxed() {
    asm volatile("barrier.cluster.arrive.relaxed.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void cluster_wait_acquire() {
    asm volatile("barrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}

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

// Two float4 row-group sums interleaved (independent shuffles in flight together).
template <int CG>
__device__ __forceinline__ void rowgroup_sum2(float4& p, float4& q) {
#pragma unroll
    for (int o = CG; o < 32; o <<= 1) {
        p.x += __shfl_xor_sync(0xffffffffu, p.x, o);
        p.y += __shfl_xor_sync(0xffffffffu, p.y, o);
        p.z += __shfl_xor_sync(0xffffffffu, p.z, o);
        p.w += __shfl_xor_sync(0xffffffffu, p.w, o);
        q.x += __shfl_xor_sync(0xffffffffu, q.x, o);
        q.y += __shfl_xor_sync(0xffffffffu, q.y, o);
        q.z += __shfl_xor_sync(0xffffffffu, q.z, o);
        q.w += __shfl_xor_sync(0xffffffffu, q.w, o);
    }
}

template <int S, int T>
__device__ __forceinline__ void gdn_split_body(const float* __restrict__ qkv, const float* __restrict__ z,
                                               const float* __restrict__ a_in, const float* __restrict__ b_in,
                                               const float* __restrict__ conv_w, const float* __restrict__ a_log,
                                               const float* __restrict__ dt_bias, const float* __restrict__ norm_w,
                                               float norm_eps, const float* conv_in, float* conv_out,
                                               float* __restrict__ state, float* __restrict__ out, int hk, int hv,
                                               int kconv, const unsigned* __restrict__ slots,
                                               const unsigned* __restrict__ pos, unsigned n_slots, int qkv_ld,
                                               int z_ld, int ab_ld) {
    pdl_start();
    constexpr int C = GDN_D / S;   // state columns of this block
    constexpr int CG = C / 4;      // float4 column groups
    constexpr int RG = T / CG;     // row groups
    constexpr int R = GDN_D / RG;  // rows per thread
    constexpr int NW = T / 32;
    constexpr int J = (C + 31) / 32;  // output columns per lane of warp 0
    static_assert(S >= 2 && S <= 8 && GDN_D % S == 0, "a portable cluster of 2..8 blocks");
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
    __shared__ __align__(16) float red_o[NW][C];  // partials of S^T q
    __shared__ float ss_slot[S];
    __shared__ __align__(8) unsigned long long ss_bar;

    // The sequence's cache rows. Every block of a cluster has the same sequence, so a refused slot returns the
    // whole cluster before any cluster barrier.
    const size_t hs = static_cast<size_t>(seq) * hv + h;
    const float* cin;
    float* cout;
    size_t row;
    if (!gdn_rows(seq, slots, pos, n_slots, static_cast<size_t>(conv_dim) * hist, conv_in, conv_out, cin, cout, row)) {
        if (t < C) out[hs * GDN_D + col0 + t] = __int_as_float(0x7fc00000);
        return;
    }

    // The cluster's "every block has started and initialised its mbarrier" phase: a relaxed arrive now, the wait
    // before the first remote store.
    if (t == 0) {
        mbar_init(&ss_bar, 1);
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    cluster_arrive_relaxed();

    // 1. The state loads, first.
    float4* sp = reinterpret_cast<float4*>(state + (row * hv + h) * GDN_D * GDN_D +
                                           static_cast<size_t>(rg * R) * GDN_D + col0) +
                 cg;
    float4 s[R];
#pragma unroll
    for (int r = 0; r < R; ++r) s[r] = sp[r * (GDN_D / 4)];

    // Per-head scalars and the epilogue's operands, loaded now so nothing later waits on them.
    const float a = a_in[static_cast<size_t>(seq) * ab_ld + h], b = b_in[static_cast<size_t>(seq) * ab_ld + h];
    const float alog = a_log[h], dtb = dt_bias[h];
    float zr[J], nw[J];
    if (warp == 0) {
#pragma unroll
        for (int j = 0; j < J; ++j) {
            const int c = lane + 32 * j;
            zr[j] = c < C ? z[static_cast<size_t>(seq) * z_ld + h * GDN_D + col0 + c] : 0.f;
            nw[j] = c < C ? norm_w[col0 + c] : 0.f;
        }
    }

    // 2. Causal conv + SiLU: the 128 q and 128 k channels of key head kh, the C v channels of these columns.
    const float* x = qkv + static_cast<size_t>(seq) * qkv_ld;
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

    // 3. l2-norms of q and k (and, _1r, their dot product), in every warp (no barrier).
    float sqq = 0.f, skk = 0.f, sqk = 0.f;
#pragma unroll
    for (int j = 0; j < GDN_D / 32; ++j) {
        const float qv = q_s[lane + 32 * j], kv = k_s[lane + 32 * j];
        sqq = fmaf(qv, qv, sqq);
        skk = fmaf(kv, kv, skk);
        sqk = fmaf(qv, kv, sqk);
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        sqq += __shfl_xor_sync(0xffffffffu, sqq, o);
        skk += __shfl_xor_sync(0xffffffffu, skk, o);
        sqk += __shfl_xor_sync(0xffffffffu, sqk, o);
    }
    const float qn = rsqrtf(static_cast<float>(GDN_D)) * rsqrtf(sqq + 1e-6f);
    const float kn = rsqrtf(skk + 1e-6f);

    float o[J];
    float ss = 0.f;
    float kr[R];
    {
        // 4. One pass: the partials of S^T k and S^T q (undecayed) over the thread's rows, the warp's row groups,
        // then the warps.
        float4 pk = make_float4(0.f, 0.f, 0.f, 0.f), pq = pk;
#pragma unroll
        for (int r = 0; r < R; ++r) {
            kr[r] = k_s[rg * R + r] * kn;
            const float qr = q_s[rg * R + r] * qn;
            pk.x = fmaf(s[r].x, kr[r], pk.x);
            pk.y = fmaf(s[r].y, kr[r], pk.y);
            pk.z = fmaf(s[r].z, kr[r], pk.z);
            pk.w = fmaf(s[r].w, kr[r], pk.w);
            pq.x = fmaf(s[r].x, qr, pq.x);
            pq.y = fmaf(s[r].y, qr, pq.y);
            pq.z = fmaf(s[r].z, qr, pq.z);
            pq.w = fmaf(s[r].w, qr, pq.w);
        }
        rowgroup_sum2<CG>(pk, pq);
        if (lane < CG) {  // lane < CG: cg == lane
            reinterpret_cast<float4*>(red_kv[warp])[lane] = pk;
            reinterpret_cast<float4*>(red_o[warp])[lane] = pq;
        }
        __syncthreads();  // barrier 2: red_kv, red_o
        cluster_wait_acquire();  // the start's phase (complete long ago): remote stores are allowed from here

        // 5. Warp 0: the outputs of these C columns, o = e^g (S^T q) + (k . q) delta, delta = beta (v - e^g S^T k),
        // their sum of squares, sent to every block of the cluster before the state update.
        if (warp == 0) {
            const float kq = sqk * qn * kn;
#pragma unroll
            for (int j = 0; j < J; ++j) {
                const int c = lane + 32 * j;
                o[j] = 0.f;
                if (c < C) {
                    float kv = 0.f, sq = 0.f;
#pragma unroll
                    for (int w = 0; w < NW; ++w) {
                        kv += red_kv[w][c];
                        sq += red_o[w][c];
                    }
                    const float dlt = beta * (v_s[c] - decay * kv);
                    o[j] = fmaf(kq, dlt, decay * sq);
                }
                ss = fmaf(o[j], o[j], ss);
            }
            ss = warp_sum(ss);
            if (lane < S) st_async_cluster(&ss_slot[rank], &ss_bar, lane, ss);
            if (lane == 0) mbar_arrive_expect_tx(&ss_bar, S * sizeof(float));
        }

        // 6. Every thread: delta for its 4 columns; S <- e^g S + k (x) delta; store S.
        float4 kv = reinterpret_cast<const float4*>(red_kv[0])[cg];
#pragma unroll
        for (int w = 1; w < NW; ++w) kv = f4_add(kv, reinterpret_cast<const float4*>(red_kv[w])[cg]);
        const float4 vv = reinterpret_cast<const float4*>(v_s)[cg];
        const float4 dl = make_float4(beta * (vv.x - decay * kv.x), beta * (vv.y - decay * kv.y),
                                      beta * (vv.z - decay * kv.z), beta * (vv.w - decay * kv.w));
#pragma unroll
        for (int r = 0; r < R; ++r) {
            s[r].x = fmaf(kr[r], dl.x, decay * s[r].x);
            s[r].y = fmaf(kr[r], dl.y, decay * s[r].y);
            s[r].z = fmaf(kr[r], dl.z, decay * s[r].z);
            s[r].w = fmaf(kr[r], dl.w, decay * s[r].w);
            sp[r * (GDN_D / 4)] = s[r];
        }
    }

    // 7. Gated RMSNorm: the S partial sums of squares have landed in this block's ss_slot when its mbarrier's
    // phase 0 completes.
    if (warp == 0) {
        mbar_wait_phase0(&ss_bar);
        float total = 0.f;
#pragma unroll
        for (int r = 0; r < S; ++r) total += ss_slot[r];
        const float rinv = rsqrtf(total / static_cast<float>(GDN_D) + norm_eps);
#pragma unroll
        for (int j = 0; j < J; ++j) {
            const int c = lane + 32 * j;
            if (c < C) out[hs * GDN_D + col0 + c] = o[j] * rinv * nw[j] * silu_f(zr[j]);
        }
    }
}

}  // namespace

#define GDN_SPLIT_KERNEL(S, T, NAME)                                                                   \
    extern "C" __global__ void __cluster_dims__(S, 1, 1) __launch_bounds__(T) NAME(                             \
        const float* __restrict__ qkv, const float* __restrict__ z, const float* __restrict__ a_in,             \
        const float* __restrict__ b_in, const float* __restrict__ conv_w, const float* __restrict__ a_log,      \
        const float* __restrict__ dt_bias, const float* __restrict__ norm_w, float norm_eps,                    \
        const float* conv_in, float* conv_out, float* __restrict__ state, float* __restrict__ out, int hk,     \
        int hv, int kconv, const unsigned* __restrict__ slots, const unsigned* __restrict__ pos,               \
        unsigned n_slots, int qkv_ld, int z_ld, int ab_ld) {                                                    \
        gdn_split_body<S, T>(qkv, z, a_in, b_in, conv_w, a_log, dt_bias, norm_w, norm_eps, conv_in, conv_out,  \
                             state, out, hk, hv, kconv, slots, pos, n_slots, qkv_ld, z_ld, ab_ld);              \
    }

// The _1r variants beat the earlier two-reduction (_mb) form at every batch (2-4%) and the _mb form was
// removed; split8_t64_1r lost to split8_t128_1r at every batch (5.09 vs 4.98 us at batch 1). The table with the
// numbers `auto` follows is AUTO_TABLE in kernels/src/cuda/gdn.rs.
GDN_SPLIT_KERNEL(2, 128, gdn_decode_step_split2_t128_1r)
GDN_SPLIT_KERNEL(2, 256, gdn_decode_step_split2_t256_1r)
GDN_SPLIT_KERNEL(4, 128, gdn_decode_step_split4_t128_1r)
GDN_SPLIT_KERNEL(8, 128, gdn_decode_step_split8_t128_1r)
