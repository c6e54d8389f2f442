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
constexpr int COMBINE_THREADS = 128;
// The split kernel's fewest positions per block (4 per warp): a short context fills the first blocks only.
constexpr unsigned long long SPLIT_MIN_CHUNK = 32;
constexpr int MAX_SPLITS = 64;
static_assert(ATTN_MAX_HEAD_DIM == 256, "kernels/src/cuda/attention_slots.rs restates the largest head_dim");

// One block per (token i, query head h): warp w takes positions lo + w, lo + w + ATTN_WARPS, ... of [lo, pos[i]],
// each lane holding EPL elements (c = lane + 32 * e) of the query, of its running output and of each key and value
// row (coalesced 128-byte loads); the score is a warp sum, the softmax an online one per warp in f32 (expf), and the
// warps' partial (max, sum, output) are merged through shared memory at the end.
//
// SPLIT (grid (t * q_heads, splits)): block y takes only its share of [lo, pos[i]] (chunks of at least
// SPLIT_MIN_CHUNK positions, so a short context leaves the later blocks empty) and writes the unnormalised partial
// record (max, sum, output[head_dim]) to ws[(token, head, y)] instead of out; attention_slots_combine_f32 merges
// the records. Why: one block per (token, head) is 24 blocks for a 27B decode step, each walking the whole context
// position by position on a mostly idle GPU (latency-bound: ~70 us a layer at 512 positions on an H100).
template <int EPL, bool SPLIT>
__device__ __forceinline__ void attention_slots_body(const float* __restrict__ q, const float* __restrict__ cache_k,
                                                     const float* __restrict__ cache_v,
                                                     const uint32_t* __restrict__ slots,
                                                     const uint32_t* __restrict__ pos, float* __restrict__ out,
                                                     float* __restrict__ ws, unsigned long long num_slots,
                                                     unsigned long long max_len, unsigned long long window,
                                                     int q_heads, int kv_heads, int head_dim, float scale) {
    pdl_start();
    __shared__ float s_m[ATTN_WARPS], s_l[ATTN_WARPS];
    __shared__ float s_acc[ATTN_WARPS][32 * EPL];
    const size_t i = blockIdx.x / q_heads;
    const int h = blockIdx.x - (int)(i * q_heads);
    const int kvh = h / (q_heads / kv_heads);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const size_t row = (i * q_heads + h) * (size_t)head_dim;
    float* o = out + row;
    // SPLIT: this block's record, (max, sum, output[head_dim]).
    float* rec = SPLIT ? ws + ((size_t)blockIdx.x * gridDim.y + blockIdx.y) * (size_t)(head_dim + 2) : nullptr;
    const unsigned long long s = slots[i], p = pos[i];
    if (s >= num_slots || p >= max_len) {
        if (SPLIT) {
            // An empty record: the combine writes the row of zeros.
            if (threadIdx.x == 0) {
                rec[0] = -CUDART_INF_F;
                rec[1] = 0.0f;
            }
            for (int c = threadIdx.x; c < head_dim; c += ATTN_THREADS) rec[2 + c] = 0.0f;
        } else {
            for (int c = threadIdx.x; c < head_dim; c += ATTN_THREADS) o[c] = 0.0f;
        }
        return;
    }
    const unsigned long long lo = (window != 0 && p + 1 > window) ? p + 1 - window : 0;
    unsigned long long beg = lo, end = p + 1;
    if (SPLIT) {
        const unsigned long long n = p + 1 - lo;
        unsigned long long chunk = (n + gridDim.y - 1) / gridDim.y;
        if (chunk < SPLIT_MIN_CHUNK) chunk = SPLIT_MIN_CHUNK;
        beg = lo + blockIdx.y * chunk;
        end = beg < p + 1 ? (beg + chunk < p + 1 ? beg + chunk : p + 1) : beg;
    }
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
    for (unsigned long long j = beg + warp; j < end; j += ATTN_WARPS) {
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
    // the largest m is finite unless a score was not (a NaN one propagates to the output); a SPLIT block may have
    // no position at all and then records (-inf, 0, zeros).
    float mx = -CUDART_INF_F;
#pragma unroll
    for (int w = 0; w < ATTN_WARPS; ++w) mx = fmaxf(mx, s_m[w]);
    float wt[ATTN_WARPS], sum = 0.0f;
#pragma unroll
    for (int w = 0; w < ATTN_WARPS; ++w) {
        wt[w] = s_m[w] == -CUDART_INF_F ? 0.0f : expf(s_m[w] - mx);
        sum += s_l[w] * wt[w];
    }
    if (SPLIT) {
        if (threadIdx.x == 0) {
            rec[0] = mx;
            rec[1] = sum;
        }
        for (int c = threadIdx.x; c < head_dim; c += ATTN_THREADS) {
            float v = 0.0f;
#pragma unroll
            for (int w = 0; w < ATTN_WARPS; ++w) v = fmaf(s_acc[w][c], wt[w], v);
            rec[2 + c] = v;
        }
        return;
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
// The split build: grid (t * q_heads, splits), ws f32 [t * q_heads, splits, head_dim + 2], splits <= MAX_SPLITS;
// out is not written (attention_slots_combine_f32 writes it).
#define ATTENTION_SLOTS(EPL)                                                                                      \
    extern "C" __global__ void __launch_bounds__(ATTN_THREADS) attention_slots_f32_e##EPL(                      \
        const float* __restrict__ q, const float* __restrict__ cache_k, const float* __restrict__ cache_v,        \
        const uint32_t* __restrict__ slots, const uint32_t* __restrict__ pos, float* __restrict__ out,           \
        unsigned long long num_slots, unsigned long long max_len, unsigned long long window, int q_heads,         \
        int kv_heads, int head_dim, float scale) {                                                                \
        attention_slots_body<EPL, false>(q, cache_k, cache_v, slots, pos, out, nullptr, num_slots, max_len,      \
                                         window, q_heads, kv_heads, head_dim, scale);                             \
    }                                                                                                             \
    extern "C" __global__ void __launch_bounds__(ATTN_THREADS) attention_slots_split_f32_e##EPL(                \
        const float* __restrict__ q, const float* __restrict__ cache_k, const float* __restrict__ cache_v,        \
        const uint32_t* __restrict__ slots, const uint32_t* __restrict__ pos, float* __restrict__ ws,            \
        unsigned long long num_slots, unsigned long long max_len, unsigned long long window, int q_heads,         \
        int kv_heads, int head_dim, float scale) {                                                                \
        attention_slots_body<EPL, true>(q, cache_k, cache_v, slots, pos, nullptr, ws, num_slots, max_len,        \
                                        window, q_heads, kv_heads, head_dim, scale);                              \
    }
ATTENTION_SLOTS(1)
ATTENTION_SLOTS(2)
ATTENTION_SLOTS(4)
ATTENTION_SLOTS(8)

// Merges the split kernel's records: out[r, :] = sum_y e^(m_y - M) acc_y / sum_y e^(m_y - M) l_y over the splits y
// of row r = (token, head), M the largest m_y; a row whose records are all empty (its token out of range) gets
// zeros. ws f32 [rows, splits, head_dim + 2], out f32 [rows, head_dim]; grid (rows), splits <= MAX_SPLITS.
extern "C" __global__ void __launch_bounds__(COMBINE_THREADS)
    attention_slots_combine_f32(const float* __restrict__ ws, float* __restrict__ out, int splits, int head_dim) {
    pdl_start();
    __shared__ float s_w[MAX_SPLITS];
    const size_t rl = (size_t)head_dim + 2;
    const float* rec = ws + (size_t)blockIdx.x * splits * rl;
    float mx = -CUDART_INF_F;
    for (int y = 0; y < splits; ++y) mx = fmaxf(mx, rec[y * rl]);
    for (int y = threadIdx.x; y < splits; y += COMBINE_THREADS) {
        const float m = rec[y * rl];
        s_w[y] = m == -CUDART_INF_F ? 0.0f : expf(m - mx);
    }
    __syncthreads();
    float sum = 0.0f;
    for (int y = 0; y < splits; ++y) sum = fmaf(rec[y * rl + 1], s_w[y], sum);
    float* o = out + (size_t)blockIdx.x * head_dim;
    const float inv = sum == 0.0f ? 0.0f : 1.0f / sum;
    for (int c = threadIdx.x; c < head_dim; c += COMBINE_THREADS) {
        float v = 0.0f;
        for (int y = 0; y < splits; ++y) v = fmaf(rec[y * rl + 2 + c], s_w[y], v);
        o[c] = v * inv;
    }
}
