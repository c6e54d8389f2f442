// Attention over f32 KV caches of one contiguous block per slot (sm_90): the exact path of the engine's CUDA forward
// pass, f32 throughout so that its parity tests against transformers hold at ~1e-3 on the logits. The safe entry
// points, their checks and the launches are in kernels/src/cuda/attention_slots.rs.
//
// Layouts: cache_k / cache_v f32 [slots, max_len, kv_heads * head_dim]; new keys / values, queries and outputs are
// rows of tokens, [t, heads * head_dim]; slots[t] and pos[t] (u32, on the device) say where each token lives.
// Device-side indices out of range (slot >= slots, pos >= max_len) are never followed: the store skips the token,
// the attention writes zeros for it.
#include <math_constants.h>

#include "common.cuh"

using namespace edgefit;

namespace {

constexpr int STORE_THREADS = 256;
constexpr int ATTN_THREADS = 256;
constexpr int ATTN_WARPS = ATTN_THREADS / 32;
constexpr int ATTN_MAX_HEAD_DIM = 256;
static_assert(ATTN_MAX_HEAD_DIM == 256, "kernels/src/cuda/attention_slots.rs restates the largest head_dim");

// One block per (token i, query head h): warp w takes positions lo + w, lo + w + ATTN_WARPS, ... of [lo, pos[i]],
// each lane holding EPL elements (c = lane + 32 * e) of the query, of its running output and of each key and value
// row (coalesced 128-byte loads); the score is a warp sum, the softmax an online one per warp in f32 (expf), and the
// warps' partial (max, sum, output) are merged through shared memory at the end.
template <int EPL>
__device__ __forceinline__ void attention_slots_body(const float* __restrict__ q, const float* __restrict__ cache_k,
                                                     const float* __restrict__ cache_v,
                                                     const uint32_t* __restrict__ slots,
                                                     const uint32_t* __restrict__ pos, float* __restrict__ out,
                                                     unsigned long long num_slots, unsigned long long max_len,
                                                     unsigned long long window, int q_heads, int kv_heads,
                                                     int head_dim, float scale) {
    pdl_start();
    __shared__ float s_m[ATTN_WARPS], s_l[ATTN_WARPS];
    __shared__ float s_acc[ATTN_WARPS][32 * EPL];
    const size_t i = blockIdx.x / q_heads;
    const int h = blockIdx.x - (int)(i * q_heads);
    const int kvh = h / (q_heads / kv_heads);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const size_t row = (i * q_heads + h) * (size_t)head_dim;
    float* o = out + row;
    const unsigned long long s = slots[i], p = pos[i];
    if (s >= num_slots || p >= max_len) {
        for (int c = threadIdx.x; c < head_dim; c += ATTN_THREADS) o[c] = 0.0f;
        return;
    }
    const unsigned long long lo = (window != 0 && p + 1 > window) ? p + 1 - window : 0;
    const size_t width = (size_t)kv_heads * head_dim;
    const size_t base = (size_t)s * max_len * width + (size_t)kvh * head_dim;

    float qv[EPL], acc[EPL];
#pragma unroll
    for (int e = 0; e < EPL; ++e) {
        const int c = lane + 32 * e;
        qv[e] = c < head_dim ? q[row + c] : 0.0f;
        acc[e] = 0.0f;
    }
    float m = -CUDART_INF_F, l = 0.0f;
    for (unsigned long long j = lo + warp; j <= p; j += ATTN_WARPS) {
        const float* kr = cache_k + base + j * width;
        const float* vr = cache_v + base + j * width;
        float dot = 0.0f;
#pragma unroll
        for (int e = 0; e < EPL; ++e) {
            const int c = lane + 32 * e;
            if (c < head_dim) dot = fmaf(qv[e], kr[c], dot);
        }
        const float sc = warp_sum(dot) * scale;
        const float mn = fmaxf(m, sc);
        const float corr = expf(m - mn), pr = expf(sc - mn);
        l = l * corr + pr;
#pragma unroll
        for (int e = 0; e < EPL; ++e) {
            const int c = lane + 32 * e;
            const float v = c < head_dim ? vr[c] : 0.0f;
            acc[e] = fmaf(pr, v, acc[e] * corr);
        }
        m = mn;
    }
    if (lane == 0) {
        s_m[warp] = m;
        s_l[warp] = l;
    }
#pragma unroll
    for (int e = 0; e < EPL; ++e) s_acc[warp][lane + 32 * e] = acc[e];
    __syncthreads();
    // A warp that had no position keeps m = -inf and l = 0 and weighs 0. Position p itself is always in range, so
    // the largest m is finite unless a score was not (a NaN one propagates to the output).
    float mx = -CUDART_INF_F;
#pragma unroll
    for (int w = 0; w < ATTN_WARPS; ++w) mx = fmaxf(mx, s_m[w]);
    float wt[ATTN_WARPS], sum = 0.0f;
#pragma unroll
    for (int w = 0; w < ATTN_WARPS; ++w) {
        wt[w] = s_m[w] == -CUDART_INF_F ? 0.0f : expf(s_m[w] - mx);
        sum += s_l[w] * wt[w];
    }
    const float inv = 1.0f / sum;
    for (int c = threadIdx.x; c < head_dim; c += ATTN_THREADS) {
        float v = 0.0f;
#pragma unroll
        for (int w = 0; w < ATTN_WARPS; ++w) v = fmaf(s_acc[w][c], wt[w], v);
        o[c] = v * inv;
    }
}

}  // namespace

// k_new, v_new f32 [t, width]; slots, pos u32 [t]; cache_k, cache_v f32 [num_slots, max_len, width]. Grid (t):
// block i copies token i's rows to (slots[i], pos[i]), or nothing when either is out of range.
extern "C" __global__ void __launch_bounds__(STORE_THREADS)
    kv_store_slots_f32(const float* __restrict__ k_new, const float* __restrict__ v_new,
                       const uint32_t* __restrict__ slots, const uint32_t* __restrict__ pos,
                       float* __restrict__ cache_k, float* __restrict__ cache_v, unsigned long long num_slots,
                       unsigned long long max_len, int width) {
    pdl_start();
    const size_t i = blockIdx.x;
    const unsigned long long s = slots[i], p = pos[i];
    if (s >= num_slots || p >= max_len) return;
    const size_t dst = ((size_t)s * max_len + p) * width, src = i * width;
    for (int c = threadIdx.x; c < width; c += STORE_THREADS) {
        cache_k[dst + c] = k_new[src + c];
        cache_v[dst + c] = v_new[src + c];
    }
}

// q, out f32 [t, q_heads * head_dim]; caches as above; window 0 for a full layer. Grid (t * q_heads); head_dim
// <= 32 * EPL.
#define ATTENTION_SLOTS(EPL)                                                                                      \
    extern "C" __global__ void __launch_bounds__(ATTN_THREADS) attention_slots_f32_e##EPL(                      \
        const float* __restrict__ q, const float* __restrict__ cache_k, const float* __restrict__ cache_v,        \
        const uint32_t* __restrict__ slots, const uint32_t* __restrict__ pos, float* __restrict__ out,           \
        unsigned long long num_slots, unsigned long long max_len, unsigned long long window, int q_heads,         \
        int kv_heads, int head_dim, float scale) {                                                                \
        attention_slots_body<EPL>(q, cache_k, cache_v, slots, pos, out, num_slots, max_len, window, q_heads,     \
                                  kv_heads, head_dim, scale);                                                     \
    }
ATTENTION_SLOTS(1)
ATTENTION_SLOTS(2)
ATTENTION_SLOTS(4)
ATTENTION_SLOTS(8)
