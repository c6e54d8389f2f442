// Mixture-of-experts routing on the GPU (sm_90): the router's softmax and top-k (moe_route), the gather of each
// expert's rows (moe_gather_rows) and the weighted combine back into token order (moe_combine), the GPU forms of
// kernels/src/moe.rs. The safe entry points, their checks and the launches are in kernels/src/cuda/moe.rs.
//
// All three are deterministic: one block owns a token (route, combine) or a row (gather), every reduction has a
// fixed order, and the combine sums each token's k contributions in routing order with no atomics, so a result never
// depends on thread timing. Device-side values the host cannot check are never followed out of range: a non-finite
// router logit gives its token the ids 0xffffffff and NaN weights, a token id or a row past its buffer a NaN row.
#include <math_constants.h>

#include "common.cuh"

using namespace edgefit;

namespace {

constexpr int MOE_THREADS = 256;
constexpr int MOE_WARPS = MOE_THREADS / 32;
constexpr int MOE_MAX_EXPERTS = 4096;
static_assert(MOE_MAX_EXPERTS == 4096, "kernels/src/cuda/moe.rs restates the largest expert count");

// The larger value first, the lower expert id on ties (torch.topk's order on the router, and kernels/src/moe.rs).
__device__ __forceinline__ bool better(float v, int i, float bv, int bi) { return v > bv || (v == bv && i < bi); }

}  // namespace

// One block of MOE_THREADS per token of logits [tokens, experts] -> ids, weights [tokens, top_k]. The softmax is
// exp(l - max) / sum (expf, a fixed-order tree sum); the top-k is chosen on the logits, which order the experts as
// the probabilities do without expf's rounding, one block argmax per pick. With renormalize the k weights are divided
// by their sum, added in pick order as the CPU does.
extern "C" __global__ void __launch_bounds__(MOE_THREADS)
    moe_route(const float* __restrict__ logits, uint32_t* __restrict__ ids, float* __restrict__ weights, int experts,
              int top_k, int renormalize) {
    __shared__ float l[MOE_MAX_EXPERTS];
    __shared__ unsigned char taken[MOE_MAX_EXPERTS];
    __shared__ float part_v[MOE_WARPS];
    __shared__ int part_i[MOE_WARPS];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const float* row = logits + (size_t)blockIdx.x * experts;
    uint32_t* out_ids = ids + (size_t)blockIdx.x * top_k;
    float* out_w = weights + (size_t)blockIdx.x * top_k;
    int bad = 0;
    float mx = -CUDART_INF_F;
    for (int e = threadIdx.x; e < experts; e += MOE_THREADS) {
        const float v = row[e];
        l[e] = v;
        taken[e] = 0;
        bad |= !isfinite(v);
        mx = fmaxf(mx, v);
    }
    if (__syncthreads_or(bad)) {
        for (int j = threadIdx.x; j < top_k; j += MOE_THREADS) {
            out_ids[j] = 0xffffffffu;
            out_w[j] = CUDART_NAN_F;
        }
        return;
    }
    mx = warp_max(mx);
    if (lane == 0) part_v[warp] = mx;
    __syncthreads();
    mx = part_v[0];
#pragma unroll
    for (int w = 1; w < MOE_WARPS; ++w) mx = fmaxf(mx, part_v[w]);
    __syncthreads();
    float sum = 0.0f;
    for (int e = threadIdx.x; e < experts; e += MOE_THREADS) sum += expf(l[e] - mx);
    sum = warp_sum(sum);
    if (lane == 0) part_v[warp] = sum;
    __syncthreads();
    sum = part_v[0];
#pragma unroll
    for (int w = 1; w < MOE_WARPS; ++w) sum += part_v[w];
    __syncthreads();
    for (int j = 0; j < top_k; ++j) {
        float bv = -CUDART_INF_F;
        int bi = experts;
        for (int e = threadIdx.x; e < experts; e += MOE_THREADS) {
            if (!taken[e] && better(l[e], e, bv, bi)) {
                bv = l[e];
                bi = e;
            }
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
            const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
            if (better(ov, oi, bv, bi)) {
                bv = ov;
                bi = oi;
            }
        }
        if (lane == 0) {
            part_v[warp] = bv;
            part_i[warp] = bi;
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            for (int w = 1; w < MOE_WARPS; ++w) {
                if (better(part_v[w], part_i[w], bv, bi)) {
                    bv = part_v[w];
                    bi = part_i[w];
                }
            }
            // Every logit is finite and top_k <= experts, so an untaken expert always wins: bi < experts.
            taken[bi] = 1;
            out_ids[j] = (uint32_t)bi;
            out_w[j] = __fdiv_rn(expf(l[bi] - mx), sum);
        }
        __syncthreads();
    }
    if (renormalize && threadIdx.x == 0) {
        float total = 0.0f;
        for (int j = 0; j < top_k; ++j) total = __fadd_rn(total, out_w[j]);
        for (int j = 0; j < top_k; ++j) out_w[j] = __fdiv_rn(out_w[j], total);
    }
}

// out [rows, hidden]: row r is x [x_rows, hidden] at row tokens[start + r] (a NaN row for a token >= x_rows). One
// block per row.
extern "C" __global__ void __launch_bounds__(MOE_THREADS)
    moe_gather_rows(const float* __restrict__ x, const uint32_t* __restrict__ tokens, float* __restrict__ out,
                    unsigned long long start, unsigned long long x_rows, int hidden) {
    const unsigned long long t = tokens[start + blockIdx.x];
    float* o = out + (size_t)blockIdx.x * hidden;
    if (t >= x_rows) {
        for (int c = threadIdx.x; c < hidden; c += MOE_THREADS) o[c] = CUDART_NAN_F;
        return;
    }
    const float* src = x + (size_t)t * hidden;
    for (int c = threadIdx.x; c < hidden; c += MOE_THREADS) o[c] = src[c];
}

// out [tokens, hidden]: token t's row is sum over j < top_k of weights[t, j] * expert_out[pair_rows[t, j]], added in
// j order from 0 with one rounding per product and per sum (the CPU's `a += w * v`), so it is bit for bit the CPU's
// combine. A pair row >= rows makes the token's row NaN. One block per token.
extern "C" __global__ void __launch_bounds__(MOE_THREADS)
    moe_combine(const float* __restrict__ expert_out, const float* __restrict__ weights,
                const uint32_t* __restrict__ pair_rows, float* __restrict__ out, unsigned long long rows, int top_k,
                int hidden) {
    const size_t t = blockIdx.x;
    const float* w = weights + t * top_k;
    const uint32_t* pr = pair_rows + t * top_k;
    float* o = out + t * hidden;
    for (int c = threadIdx.x; c < hidden; c += MOE_THREADS) {
        float acc = 0.0f;
        for (int j = 0; j < top_k; ++j) {
            const unsigned long long r = pr[j];
            if (r >= rows) {
                acc = CUDART_NAN_F;
                break;
            }
            acc = __fadd_rn(acc, __fmul_rn(w[j], expert_out[(size_t)r * hidden + c]));
        }
        o[c] = acc;
    }
}
