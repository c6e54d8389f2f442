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
// only for the benchmark's comparison.
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
