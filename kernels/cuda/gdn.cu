// Gated DeltaNet fused recurrent decode step (Qwen3.5 / Qwen3-Next linear-attention layers), one token for each
// of a batch of sequences, everything between the input projections and out_proj in one launch: the causal
// depthwise conv (SiLU), l2-norm of q and k (q scaled by 1/sqrt(dk)), the gates g = -exp(A_log) softplus(a +
// dt_bias) and beta = sigmoid(b), the delta rule S <- e^g S; S <- S + k (x) beta (v - S^T k), o = S^T q, and the
// gated RMSNorm rmsnorm(o) * w * silu(z). Layouts: kernels/src/gdn.rs (fp32 everywhere).
//
// Grid (Hv * 4, seqs), 128 threads, clusters of 4 blocks: the 4 blocks of a cluster share one (sequence, value
// head) and each owns 32 of its 128 state columns (16 KiB of the 64 KiB fp32 state, read once and written once:
// the traffic that matters). Every column's update is independent (kv_j and o_j are dot products over the rows of
// column j), so only the gated RMSNorm, a mean over all 128 outputs, crosses blocks: each block's sum of squares is
// read by the other three through distributed shared memory. A first version with one 256-thread block per head
// ran 48 blocks at batch 1 (7.0 us on the H200, 0.63x fla's recurrence alone) and 1.45 waves at batch 8.
// Thread t holds rows 8*(t/8) .. +8 of columns 4*(t%8) .. +4 in registers as float4s; the state loads are issued
// first and the conv and norms run while they are in flight.
//
// The conv history of a key head is shared by the Hv/Hk value heads (different blocks), so it cannot be updated in
// place: it is read from conv_in and the advanced history written to conv_out, each channel by exactly one block
// (v channels by the block owning those columns, q/k channels by column block 0 of the group's first value head).
#include <cooperative_groups.h>

#include "common.cuh"

using namespace edgefit;
namespace cg = cooperative_groups;

constexpr int GDN_D = 128;      // dk = dv = 128, checked on the Rust side
constexpr int GDN_CL = 4;       // blocks (column slices) per head
constexpr int GDN_COLS = GDN_D / GDN_CL;
constexpr int GDN_THREADS = 128;
constexpr int GDN_ROWS = 8;     // state rows per thread

__device__ __forceinline__ float silu_f(float x) { return x / (1.f + expf(-x)); }

__device__ __forceinline__ float softplus_f(float x) { return x > 20.f ? x : log1pf(expf(x)); }

extern "C" __global__ void __cluster_dims__(GDN_CL, 1, 1) __launch_bounds__(GDN_THREADS)
    gdn_decode_step(const float* __restrict__ qkv, const float* __restrict__ z, const float* __restrict__ a_in,
                    const float* __restrict__ b_in, const float* __restrict__ conv_w, const float* __restrict__ a_log,
                    const float* __restrict__ dt_bias, const float* __restrict__ norm_w, float norm_eps,
                    const float* __restrict__ conv_in, float* __restrict__ conv_out, float* __restrict__ state,
                    float* __restrict__ out, int hk, int hv, int kconv) {
    cg::cluster_group cluster = cg::this_cluster();
    const int h = blockIdx.x / GDN_CL;
    const int cb = blockIdx.x % GDN_CL;  // column block == rank in the cluster
    const int col0 = cb * GDN_COLS;
    const int seq = blockIdx.y;
    const int t = threadIdx.x;
    const int lane = t & 31, warp = t >> 5;
    const int cg4 = t % (GDN_COLS / 4);  // float4 column group 0..7
    const int rg = t / (GDN_COLS / 4);   // row group 0..15
    const int group = hv / hk;
    const int kh = h / group;
    const int conv_dim = 2 * hk * GDN_D + hv * GDN_D;
    const int hist = kconv - 1;

    __shared__ float q_s[GDN_D], k_s[GDN_D], v_s[GDN_COLS], delta_s[GDN_COLS];
    __shared__ float red[GDN_THREADS / 32][GDN_COLS];
    __shared__ float norms[4];
    __shared__ float ss_part;

    // 1. Issue the state loads.
    float4* sp = reinterpret_cast<float4*>(state + (static_cast<size_t>(seq) * hv + h) * GDN_D * GDN_D +
                                           static_cast<size_t>(rg * GDN_ROWS) * GDN_D + col0) + cg4;
    float4 s[GDN_ROWS];
#pragma unroll
    for (int r = 0; r < GDN_ROWS; ++r) s[r] = sp[r * (GDN_D / 4)];

    // 2. Causal conv + SiLU: q and k of key head kh (all 128, for the norms), v of this block's 32 columns.
    const float* x = qkv + static_cast<size_t>(seq) * conv_dim;
    const float* cin = conv_in + static_cast<size_t>(seq) * conv_dim * hist;
    float* cout = conv_out + static_cast<size_t>(seq) * conv_dim * hist;
    const bool owns_qk = h % group == 0 && cb == 0;
    for (int i = t; i < 2 * GDN_D + GDN_COLS; i += GDN_THREADS) {
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
    float kr[GDN_ROWS];
    float4 part = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
    for (int r = 0; r < GDN_ROWS; ++r) {
        kr[r] = k_s[rg * GDN_ROWS + r] * kn;
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
    if (t < GDN_COLS) {
        const float kv = red[0][t] + red[1][t] + red[2][t] + red[3][t];
        delta_s[t] = beta * (v_s[t] - kv);
    }
    __syncthreads();

    // 5. S += k (x) delta, o = S^T q; store S.
    const float4 dl = reinterpret_cast<const float4*>(delta_s)[cg4];
    part = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
    for (int r = 0; r < GDN_ROWS; ++r) {
        const float qr = q_s[rg * GDN_ROWS + r] * qn;
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
        for (int r = 0; r < GDN_CL; ++r) total += *cluster.map_shared_rank(&ss_part, r);
        const float rinv = rsqrtf(total / static_cast<float>(GDN_D) + norm_eps);
        const size_t idx = (static_cast<size_t>(seq) * hv + h) * GDN_D + col0 + lane;
        out[idx] = o * rinv * norm_w[col0 + lane] * silu_f(z[idx]);
    }
    cluster.sync();  // no block leaves while another may still read its ss_part
}
