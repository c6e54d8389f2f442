// Decode attention (one query token per sequence) over a paged bf16 KV cache, grouped-query packed and split over
// the context (flash-decoding). Two kernel families share the split, the partials and the combine kernel: the
// CUDA-core one (attention_decode_split_*, fp32 scores; KernelPath::CudaCores) and the tiled tensor-core one
// (attention_decode_tiled_* over pages, attention_decode_ring_* over a sliding-window ring; end of this file), the
// default (KernelPath::Auto and TensorCores), 1.8-2.5x faster than the tensor-core kernel it replaced.
// Layouts: kernels/src/attention.rs, with bf16 K/V pages [num_pages, Hkv, page_size, D], block_table u32
// [seqs, max_pages], lens u32 [seqs] (the current token included).
//
// attention_decode_split_D{64,128,256}_R{r}: grid (splits, Hkv, seqs), 32 * R / HPW threads (HPW = 2 query heads
// per warp when R is even, else 1). One block serves all R query heads of one KV head, so each K/V row is read
// from memory once per KV head, not once per query head. K and V stream through a 3-stage cp.async pipeline in
// shared memory; a lane holds D/32 dims of every row; softmax is online in base 2 (q pre-scaled by
// scale * log2 e), updated once per 16-token stage. With one split the block writes the output, otherwise a
// partial (max, sum, acc[D]) per (sequence, query head, split) that attention_decode_combine_D* (one block per
// (sequence, query head)) or attention_decode_combine_sliced_D* (one per 64 columns of it) reduces.
// Tokens whose page id is >= num_pages are skipped (a bad block table never reads outside the cache).
#include "common.cuh"

using namespace edgefit;

constexpr int ATT_TS = 16;     // tokens per pipeline stage
constexpr float LOG2E = 1.4426950408889634f;

// E = D/32 bf16 of one row for this lane, from shared memory, as floats.
template <int E>
__device__ __forceinline__ void lds_row(const uint16_t* p, float* f) {
    if constexpr (E == 8) {
        bf16x8_to_float(*reinterpret_cast<const uint4*>(p), f);
    } else if constexpr (E == 4) {
        const uint2 v = *reinterpret_cast<const uint2*>(p);
        const float2 a = bf16x2_to_float2(v.x), b = bf16x2_to_float2(v.y);
        f[0] = a.x; f[1] = a.y; f[2] = b.x; f[3] = b.y;
    } else {
        const float2 a = bf16x2_to_float2(*reinterpret_cast<const unsigned int*>(p));
        f[0] = a.x; f[1] = a.y;
    }
}

// Sums 16 per-lane partial dot products (one per token of a stage) over the warp in 16 shuffles instead of 80:
// each step halves the values a lane keeps and exchanges the other half with the lane `o` away. Afterwards every
// lane holds the full sum for token lane >> 1.
template <int C>
__device__ __forceinline__ void transpose_step(float (&v)[16], int lane) {
    const bool upper = lane & C;  // the lane offset equals the number of values kept, C = 8, 4, 2, 1
#pragma unroll
    for (int i = 0; i < C; ++i) {
        const float mine = upper ? v[i + C] : v[i];
        const float other = upper ? v[i] : v[i + C];
        v[i] = mine + __shfl_xor_sync(0xffffffffu, other, 2 * C);
    }
}

__device__ __forceinline__ float transpose_reduce16(float (&v)[16], int lane) {
    transpose_step<8>(v, lane >> 1);  // exchange with lane ^ 16
    transpose_step<4>(v, lane >> 1);  // lane ^ 8
    transpose_step<2>(v, lane >> 1);  // lane ^ 4
    transpose_step<1>(v, lane >> 1);  // lane ^ 2
    return v[0] + __shfl_xor_sync(0xffffffffu, v[0], 1);
}

template <int R>
struct AttGeom {
    static constexpr int HPW = R % 2 == 0 ? 2 : 1;  // query heads per warp
    static constexpr int WARPS = R / HPW;
    static constexpr int THREADS = WARPS * 32;
};

// Stages hold K then V of ATT_TS tokens: [ATT_STAGES][2][ATT_TS][D] bf16 (48 KiB at D = 256 with 3 stages). All
// threads fill a stage with 16-byte cp.async copies (the page of each token looked up by the copying thread),
// ATT_STAGES - 1 stages ahead of the one being consumed, so the loads in flight cost no registers. Warp w owns
// query heads HPW*w .. +HPW and consumes every token of every stage: per stage it forms 16 partial scores per head,
// reduces them with transpose_reduce16, updates its online softmax once, and accumulates P V with the probabilities
// broadcast by shuffle. Each warp writes its own heads, so the warps never merge.
//
// History (H200, B=1, 24q/4kv x 256, 32k context): registers-only loads, one warp per 4 tokens for all 6 heads:
// 0.92 TB/s; the same with a cp.async pipeline: 0.74 TB/s, Nsight Compute showing 4.4 cycles per issued
// instruction at 12% occupancy (168 registers) and 16% DRAM throughput: issue-bound on 80 shuffles and a per-token
// softmax per head. This version cuts the per-token work to about a third and the registers to about 100.
template <int D, int R, int ATT_STAGES>
__device__ __forceinline__ void attention_decode_split(const float* __restrict__ q, const uint16_t* __restrict__ kc,
                                                       const uint16_t* __restrict__ vc,
                                                       const unsigned int* __restrict__ block_table,
                                                       const unsigned int* __restrict__ lens, float scale,
                                                       float* __restrict__ out, float* __restrict__ ws, int hq,
                                                       int hkv, int page_size, int num_pages, int max_pages) {
    constexpr int E = D / 32;  // dims per lane
    constexpr int CPR = D / 8;  // 16-byte chunks per row
    constexpr int CHUNKS = 2 * ATT_TS * CPR;
    constexpr int HPW = AttGeom<R>::HPW;
    constexpr int NT = AttGeom<R>::THREADS;
    __shared__ __align__(16) uint16_t stage[ATT_STAGES][2][ATT_TS][D];

    const int split = blockIdx.x, splits = gridDim.x;
    const int g = blockIdx.y, seq = blockIdx.z;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;

    const long long cap = static_cast<long long>(max_pages) * page_size;
    const int len = static_cast<int>(min(static_cast<long long>(lens[seq]), cap));
    const int per = (len + splits - 1) / splits;
    const int start = split * per;
    const int end = min(len, start + per);
    const int n_stages = end > start ? (end - start + ATT_TS - 1) / ATT_TS : 0;
    const unsigned int* bt = block_table + static_cast<size_t>(seq) * max_pages;

    auto issue = [&](int st) {
        if (st < n_stages) {
            const int t0 = start + st * ATT_TS;
            uint16_t* base = &stage[st % ATT_STAGES][0][0][0];
            for (int c = threadIdx.x; c < CHUNKS; c += NT) {
                const int which = c / (ATT_TS * CPR);  // 0: K, 1: V
                const int tok = (c / CPR) % ATT_TS;
                const int part = c % CPR;
                const int t = t0 + tok;
                const unsigned int page = t < end ? bt[t / page_size] : 0u;
                const bool ok = t < end && page < static_cast<unsigned int>(num_pages);
                const size_t off =
                    ok ? ((static_cast<size_t>(page) * hkv + g) * page_size + t % page_size) * D + part * 8 : 0;
                cp_async16(base + c * 8, (which ? vc : kc) + off, ok);
            }
        }
        cp_async_commit();  // also when empty, so the wait_group counts stay uniform
    };

    const int h0 = g * R + warp * HPW;  // first query head of this warp
    float qr[HPW][E], acc[HPW][E], m[HPW], l[HPW];
#pragma unroll
    for (int i = 0; i < HPW; ++i) {
        const float* qp = q + (static_cast<size_t>(seq) * hq + h0 + i) * D + lane * E;
#pragma unroll
        for (int e = 0; e < E; ++e) {
            qr[i][e] = qp[e] * scale * LOG2E;
            acc[i][e] = 0.f;
        }
        m[i] = -INFINITY;
        l[i] = 0.f;
    }

#pragma unroll
    for (int st = 0; st < ATT_STAGES - 1; ++st) issue(st);
    for (int st = 0; st < n_stages; ++st) {
        cp_async_wait<ATT_STAGES - 2>();
        __syncthreads();
        issue(st + ATT_STAGES - 1);  // refills the buffer every warp finished with before the barrier
        const int buf = st % ATT_STAGES;
        // This lane's token after the reduction, and whether it is real.
        const int tl = start + st * ATT_TS + (lane >> 1);
        const bool ok = tl < end && bt[tl / page_size] < static_cast<unsigned int>(num_pages);

        float part[HPW][ATT_TS];
#pragma unroll
        for (int j = 0; j < ATT_TS; ++j) {
            float kf[E];
            lds_row<E>(&stage[buf][0][j][lane * E], kf);
#pragma unroll
            for (int i = 0; i < HPW; ++i) {
                float d = 0.f;
#pragma unroll
                for (int e = 0; e < E; ++e) d = fmaf(qr[i][e], kf[e], d);
                part[i][j] = d;
            }
        }
        float p[HPW], corr[HPW];
#pragma unroll
        for (int i = 0; i < HPW; ++i) {
            const float full = transpose_reduce16(part[i], lane);  // every lane takes part in the shuffles
            const float sc = ok ? full : -INFINITY;
            const float mn = fmaxf(m[i], warp_max(sc));
            // mn is the same on every lane; -inf only while every token so far was masked.
            corr[i] = mn == -INFINITY ? 1.f : exp2f(m[i] - mn);
            p[i] = mn == -INFINITY ? 0.f : exp2f(sc - mn);
            l[i] = fmaf(l[i], corr[i], warp_sum(lane & 1 ? 0.f : p[i]));  // each token sits on two lanes
            m[i] = mn;
#pragma unroll
            for (int e = 0; e < E; ++e) acc[i][e] *= corr[i];
        }
#pragma unroll
        for (int j = 0; j < ATT_TS; ++j) {
            float vf[E];
            lds_row<E>(&stage[buf][1][j][lane * E], vf);
#pragma unroll
            for (int i = 0; i < HPW; ++i) {
                const float pj = __shfl_sync(0xffffffffu, p[i], 2 * j);
#pragma unroll
                for (int e = 0; e < E; ++e) acc[i][e] = fmaf(pj, vf[e], acc[i][e]);
            }
        }
    }
    cp_async_wait<0>();

#pragma unroll
    for (int i = 0; i < HPW; ++i) {
        const size_t row = static_cast<size_t>(seq) * hq + h0 + i;
        if (splits == 1) {
#pragma unroll
            for (int e = 0; e < E; ++e) out[row * D + lane * E + e] = l[i] > 0.f ? acc[i][e] / l[i] : 0.f;
        } else {
            const size_t slot = (row * splits + split) * (D + 2);
#pragma unroll
            for (int e = 0; e < E; ++e) ws[slot + 2 + lane * E + e] = acc[i][e];
            if (lane == 0) {
                ws[slot] = m[i];
                ws[slot + 1] = l[i];
            }
        }
    }
}

// Grid (Hq, seqs), D x 4 threads: out = sum_s 2^(m_s - M) acc_s / sum_s 2^(m_s - M) l_s over the splits. The
// per-split weights are computed once into shared memory (splits <= 1024, checked on the Rust side); then thread
// (d, y) sums the splits s = y mod 4, so each thread's chain of dependent loads is a quarter as long (the first
// version, one thread per d over all 132 splits, took 13 us of a 102 us decode at 32k context).
constexpr int COMB_Y = 4;
template <int D>
__device__ __forceinline__ void attention_decode_combine(const float* __restrict__ ws, float* __restrict__ out,
                                                         int hq, int splits) {
    pdl_launch_dependents();
    pdl_wait();
    __shared__ float wgt[1024];
    __shared__ float lsum[1024];
    __shared__ float red[D * COMB_Y / 32];
    __shared__ float part[COMB_Y][D];
    __shared__ float mx_s, den_s;
    const size_t row = static_cast<size_t>(blockIdx.y) * hq + blockIdx.x;
    const float* p = ws + row * splits * (D + 2);
    const int d = threadIdx.x, y = threadIdx.y;
    const int tid = y * D + d, lane = tid & 31, warp = tid >> 5;
    constexpr int NT = D * COMB_Y, NW = NT / 32;
    // One pass over the (max, sum) heads of the partials: both loaded together, kept in shared memory, so the
    // weights below need no second round trip to L2.
    float mx = -INFINITY;
    for (int s = tid; s < splits; s += NT) {
        const float ms = p[static_cast<size_t>(s) * (D + 2)];
        lsum[s] = p[static_cast<size_t>(s) * (D + 2) + 1];
        wgt[s] = ms;
        mx = fmaxf(mx, ms);
    }
    mx = warp_max(mx);
    if (lane == 0) red[warp] = mx;
    __syncthreads();
    if (tid == 0) {
        float v = red[0];
        for (int w = 1; w < NW; ++w) v = fmaxf(v, red[w]);
        mx_s = v;
    }
    __syncthreads();
    mx = mx_s;
    float den = 0.f;
    for (int s = tid; s < splits; s += NT) {  // the same thread wrote wgt[s] and lsum[s] above
        const float ms = wgt[s];
        const float w = (ms == -INFINITY || mx == -INFINITY) ? 0.f : exp2f(ms - mx);
        wgt[s] = w;
        den = fmaf(lsum[s], w, den);
    }
    den = warp_sum(den);
    __syncthreads();  // red is reused
    if (lane == 0) red[warp] = den;
    __syncthreads();
    if (tid == 0) {
        float v = 0.f;
        for (int w = 0; w < NW; ++w) v += red[w];
        den_s = v;
    }
    // Unrolled by 16 so a thread has up to 16 partial loads in flight (its chain is splits / 4 long: 25 at
    // 99 splits, which unrolled by 4 was ~7 dependent L2 round trips).
    float num = 0.f;
#pragma unroll 16
    for (int s = y; s < splits; s += COMB_Y) num = fmaf(p[static_cast<size_t>(s) * (D + 2) + 2 + d], wgt[s], num);
    part[y][d] = num;
    __syncthreads();
    if (y == 0) {
        num = part[0][d] + part[1][d] + part[2][d] + part[3][d];
        out[row * D + d] = den_s > 0.f ? num / den_s : 0.f;
    }
}

#define EDGEFIT_ATT_SPLIT(D, R)                                                                                   \
    extern "C" __global__ void __launch_bounds__(AttGeom<R>::THREADS) attention_decode_split_D##D##_R##R(              \
        const float* q, const uint16_t* kc, const uint16_t* vc, const unsigned int* bt, const unsigned int* lens, \
        float scale, float* out, float* ws, int hq, int hkv, int page_size, int num_pages, int max_pages) {       \
        attention_decode_split<D, R, 3>(q, kc, vc, bt, lens, scale, out, ws, hq, hkv, page_size, num_pages,       \
                                        max_pages);                                                                  \
    }
#define EDGEFIT_ATT_D(D)                                                                                          \
    EDGEFIT_ATT_SPLIT(D, 1)                                                                                       \
    EDGEFIT_ATT_SPLIT(D, 2)                                                                                       \
    EDGEFIT_ATT_SPLIT(D, 4)                                                                                       \
    EDGEFIT_ATT_SPLIT(D, 6)                                                                                       \
    EDGEFIT_ATT_SPLIT(D, 8)                                                                                       \
    extern "C" __global__ void __launch_bounds__(D * COMB_Y, 1)                                                   \
        attention_decode_combine_D##D(const float* ws, float* out, int hq, int splits) {                          \
        attention_decode_combine<D>(ws, out, hq, splits);                                                         \
    }

// The CUDA-core arm (KernelPath::CudaCores) and the block combine are the lab's: `Auto` runs the tiled kernels and
// the sliced combine.
#if EDGEFIT_LAB
EDGEFIT_ATT_D(64)
EDGEFIT_ATT_D(128)
EDGEFIT_ATT_D(256)
#endif

// attention_decode_combine_sliced_D*: the same sum as attention_decode_combine_D*, spread over more blocks and with
// no dependent round trip before the loads. Grid (Hq * D / 64, seqs): block x serves query head x / (D / 64), columns
// 64 (x mod D / 64) .. + 64. Block (32, SW) with SW = min(16, ceil(splits / 4)) warps (the launch picks it,
// kernels/src/cuda/attention.rs): lane l owns columns 2l, 2l + 1 of the block's slice, warp w the splits w,
// w + SW, w + 2 SW, ... A warp loads a chunk of up to
// COMB_CHUNK of its splits at once, (m, l) and the float2 of acc of each (2 x COMB_CHUNK independent loads per
// lane), weighs them against the chunk's own max and rescales its running (m, l, acc) once per chunk, so no load
// waits for the global max: one L2 round trip for up to 8 SW splits (128 with 16 warps), then the SW warp states
// meet in shared memory. Why: the block combine runs one block of 4 D threads per (sequence, query head), 24
// blocks at B=1 on 132 SMs, each pulling 68 KiB of partials (66 splits) through one SM after a first round trip
// for the split maxima and two block-wide reductions; at B=32 (2 splits) its 768 blocks of 1024 threads spend
// their time in barriers (10.9 us, `benchmarks/h200.md`). Here B=1 runs 96 blocks of 16 warps with 17 KiB
// each, and B=32 3072 blocks of one warp without a barrier that waits on anything.
// The weights differ from the block combine's by rounding only (exp2(m_s - m_chunk) exp2(m_chunk - M) instead of
// exp2(m_s - M)); an empty split (m = -inf, l = 0, acc = 0) weighs 0, and a row with no token writes 0.
constexpr int COMB_SLICE = 64;      // head_dim columns per block (32 lanes x float2)
constexpr int COMB_CHUNK = 8;       // splits in flight per warp
constexpr int COMB_MAX_WARPS = 16;  // warps per block at most (the launch uses min(16, ceil(splits / 4)))
template <int D>
__device__ __forceinline__ void attention_decode_combine_sliced(const float* __restrict__ ws,
                                                                float* __restrict__ out, int hq, int splits) {
    static_assert(D % COMB_SLICE == 0, "head_dim in 64-wide slices");
    // PDL (common.cuh): launched as the split kernel's dependent, the blocks get resident while the split kernel
    // runs and wait here for its partials.
    pdl_launch_dependents();
    pdl_wait();
    __shared__ float sm_m[COMB_MAX_WARPS], sm_l[COMB_MAX_WARPS];
    __shared__ float2 sm_a[COMB_MAX_WARPS][32];
    const int lane = threadIdx.x, warp = threadIdx.y, nw = blockDim.y;
    constexpr int SLICES = D / COMB_SLICE;
    const size_t row = static_cast<size_t>(blockIdx.y) * hq + blockIdx.x / SLICES;
    const int col = static_cast<int>(blockIdx.x % SLICES) * COMB_SLICE + 2 * lane;
    const float* p = ws + row * splits * (D + 2);
    // Running state of this warp's splits: m and l are the same on every lane (per split), acc per column pair.
    float m_run = -INFINITY, l_run = 0.f;
    float2 a_run = make_float2(0.f, 0.f);
    for (int s0 = warp; s0 < splits; s0 += COMB_CHUNK * nw) {
        float2 ml[COMB_CHUNK], x[COMB_CHUNK];
#pragma unroll
        for (int i = 0; i < COMB_CHUNK; ++i) {
            // Past the last split the load repeats it (no branch around a load, all of them in flight at once)
            // and the select below drops it. A slot is D + 2 floats, an even count, so (m, l) and every column
            // pair are 8-byte aligned.
            const int s = s0 + i * nw;
            const float* ps = p + static_cast<size_t>(min(s, splits - 1)) * (D + 2);
            const float2 mli = *reinterpret_cast<const float2*>(ps);
            const float2 xi = *reinterpret_cast<const float2*>(ps + 2 + col);
            ml[i] = s < splits ? mli : make_float2(-INFINITY, 0.f);
            x[i] = s < splits ? xi : make_float2(0.f, 0.f);
        }
        float mc = m_run;
#pragma unroll
        for (int i = 0; i < COMB_CHUNK; ++i) mc = fmaxf(mc, ml[i].x);
        if (mc == -INFINITY) continue;  // only empty splits so far (the same on every lane)
        // mc is finite from here: exp2f(-inf - mc) = 0 weighs empty splits and an empty running state 0.
        const float corr = exp2f(m_run - mc);
        l_run *= corr;
        a_run.x *= corr;
        a_run.y *= corr;
#pragma unroll
        for (int i = 0; i < COMB_CHUNK; ++i) {
            const float w = exp2f(ml[i].x - mc);
            l_run = fmaf(ml[i].y, w, l_run);
            a_run.x = fmaf(x[i].x, w, a_run.x);
            a_run.y = fmaf(x[i].y, w, a_run.y);
        }
        m_run = mc;
    }
    if (lane == 0) {
        sm_m[warp] = m_run;
        sm_l[warp] = l_run;
    }
    sm_a[warp][lane] = a_run;
    __syncthreads();
    if (warp != 0) return;
    float mx = -INFINITY;
    for (int w = 0; w < nw; ++w) mx = fmaxf(mx, sm_m[w]);
    float den = 0.f;
    float2 acc = make_float2(0.f, 0.f);
    if (mx != -INFINITY) {
        for (int w = 0; w < nw; ++w) {
            const float f = exp2f(sm_m[w] - mx);
            const float2 a = sm_a[w][lane];
            den = fmaf(sm_l[w], f, den);
            acc.x = fmaf(a.x, f, acc.x);
            acc.y = fmaf(a.y, f, acc.y);
        }
    }
    *reinterpret_cast<float2*>(out + row * D + col) =
        den > 0.f ? make_float2(acc.x / den, acc.y / den) : make_float2(0.f, 0.f);
}

#define EDGEFIT_ATT_COMB_SLICED(D)                                                                                \
    extern "C" __global__ void __launch_bounds__(32 * COMB_MAX_WARPS)                                             \
        attention_decode_combine_sliced_D##D(const float* ws, float* out, int hq, int splits) {                   \
        attention_decode_combine_sliced<D>(ws, out, hq, splits);                                                  \
    }
EDGEFIT_ATT_COMB_SLICED(64)
EDGEFIT_ATT_COMB_SLICED(128)
EDGEFIT_ATT_COMB_SLICED(256)

// ---------------------------------------------------------------------------------------------------------------
// Warps per block of the tiled tensor-core kernels below (their mma.sync / ldmatrix helpers are in common.cuh).
// (A first tensor-core kernel, attention_decode_tc_D*, 16 tokens per stage with per-lane 32-bit fragment
// loads, was the default until the tiled kernels measured 1.8-2.5x faster on the H200 at every context and batch:
// `benchmarks/h200.md`; it was removed.)
constexpr int TC_WARPS = 4;

// ---------------------------------------------------------------------------------------------------------------
// Tiled tensor-core decode (attention_decode_tiled_D*_T*S* over the paged cache, attention_decode_ring_D*_T*S*
// over a sliding-window ring): the split, the partials and the combine of the kernels above, rebuilt around what
// Nsight Compute showed the 16-token kernel spends its time on (benchmarks/h200.md: 33% memory throughput at 32k,
// per-lane 32-bit fragment loads, per-token page lookups and masks, two barriers per 16 tokens):
// - TILE (16 or 32) tokens per pipeline stage, STAGES (2-4) stages of cp.async in dynamic shared memory, so each
//   block keeps (STAGES - 1) * TILE * D * 4 bytes of K and V in flight while it computes on one stage.
//   Bytes in flight per SM at D = 256 (K and V of a tile: TILE * 1 KiB): T32S3, 2 blocks/SM (106.5 KiB each):
//   2 * 2 * 32 KiB = 128 KiB; T16S4, 3 blocks/SM (68 KiB): 3 * 3 * 16 KiB = 144 KiB; T32S2, 3 blocks/SM (72 KiB):
//   3 * 1 * 32 KiB = 96 KiB. The H200 needs ~32-40 KiB per SM to reach its bandwidth, so every variant has 2-4x
//   that; the 16-token kernel had 5 * 16 KiB but spent its issue slots elsewhere.
// - The page lookup of a tile is done once, lane i of each warp looking up token i (one load per lane per tile),
//   and each copying thread takes its token's row index by shuffle. The same ballot gives the tile's 32-bit
//   validity mask, kept in shared memory per (stage, warp), so the softmax masks without touching the table.
// - Rows in shared memory are swizzled in 16-byte chunks (chunk c of row r at c ^ (r & 7)), so ldmatrix of eight
//   rows at one logical chunk hits eight distinct bank groups: ldmatrix.x4 loads the K fragments (B of Q K^T,
//   tokens are the rows) and ldmatrix.x4.trans the V fragments (B of P V, tokens are k), four 8x8 matrices per
//   instruction instead of eight 32-bit loads.
// - The R <= 8 query heads are rows 0..7 of the m16 A operand; rows 8..15 are always zero, so only the first two
//   accumulator elements of each score fragment matter: the cross-warp score sum moves half the data the 16-token
//   kernel moved (float2 per n-tile, 16-byte shared loads).
// - Splits are tile aligned: a split takes ceil(len / splits) tokens rounded up to TILE, so each sequence uses as
//   many of the grid's splits as its own length needs (a short sequence of a ragged batch leaves the rest empty,
//   and they write an empty partial that the combine weighs 0).
// Four warps per block as before: warp w multiplies head-dim quarter w into the score tile (summed through shared
// memory), all warps run the same softmax, and warp w owns output columns [w D/4, (w+1) D/4).
// Invalid tokens (past the end, page id >= num_pages) are zero-filled by cp.async (nothing read) and masked to
// -inf, so their V rows are 0 and P is 0: no NaN from stale shared memory can reach the output.
constexpr unsigned TD_INVALID = 0xffffffffu;  // row index: token not in the cache (masked, zero-filled)
constexpr unsigned TD_CURRENT = 0xfffffffeu;  // row index: the ring's current token (k_cur / v_cur)


template <int D, int TILE, int STAGES>
struct TiledGeom {
    static constexpr int NTT = TILE / 8;                                    // score n-tiles per stage
    static constexpr int KV_BYTES = STAGES * 2 * TILE * D * 2;              // K and V stages, bf16
    static constexpr int SPART_BYTES = 2 * TC_WARPS * 32 * NTT * 2 * 4;     // float2 per (parity, warp, lane, n-tile)
    static constexpr int MASK_BYTES = STAGES * TC_WARPS * 4;
    static constexpr int SMEM = KV_BYTES + SPART_BYTES + MASK_BYTES;
};

// Where the K/V rows of one (sequence, KV head) come from. row(t) is the row index of token t (t < len) in
// k / v (elements row * D), TD_CURRENT for the separate current row, or TD_INVALID.
struct PagedSrc {
    const unsigned int* bt;  // this sequence's block-table row
    int page_size, num_pages, hkv, g;
    __device__ __forceinline__ unsigned row(int t) const {
        const unsigned page = bt[t / page_size];
        if (page >= static_cast<unsigned>(num_pages)) return TD_INVALID;
        return (page * static_cast<unsigned>(hkv) + g) * static_cast<unsigned>(page_size) + t % page_size;
    }
};
struct RingSrc {
    unsigned base;  // (seq * hkv + g) * slots
    int valid;      // ring slots in use: min(pos, slots); token `valid` is the current one
    __device__ __forceinline__ unsigned row(int t) const {
        return t < valid ? base + static_cast<unsigned>(t) : TD_CURRENT;
    }
};

// The shared body. k / v: the cache (paged pool or ring); kcur / vcur: the current token's row (ring only, else
// unused); len: tokens of this (sequence, KV head), all of which are attended.
template <int D, int TILE, int STAGES, class Src>
__device__ __forceinline__ void attention_decode_tiled(const float* __restrict__ q, const uint16_t* __restrict__ k,
                                                       const uint16_t* __restrict__ v,
                                                       const uint16_t* __restrict__ kcur,
                                                       const uint16_t* __restrict__ vcur, const Src& src, int len,
                                                       float scale, float* __restrict__ out, float* __restrict__ ws,
                                                       int hq, int r_heads) {
    using G = TiledGeom<D, TILE, STAGES>;
    constexpr int NTT = G::NTT;
    constexpr int CPR = D / 8;                  // 16-byte chunks per row
    constexpr int CHUNKS = 2 * TILE * CPR;      // per stage, K then V
    constexpr int NT = TC_WARPS * 32;
    static_assert(CHUNKS % (2 * NT) == 0, "every thread issues the same number of copies (shuffles inside)");
    constexpr int KS = D / 16;                  // k-steps of Q K^T
    constexpr int KSW = KS / TC_WARPS;          // per warp: 1 (D 64), 2 (128), 4 (256)
    constexpr int DW = D / TC_WARPS;            // output columns per warp
    constexpr int NO = DW / 8;                  // output n-tiles per warp (even)
    static_assert(CPR >= 8 && NO % 2 == 0 && (KSW == 1 || KSW % 2 == 0) && NTT % 2 == 0, "shape");
    extern __shared__ __align__(16) unsigned char td_smem[];
    uint16_t* kv = reinterpret_cast<uint16_t*>(td_smem);
    float2* spart = reinterpret_cast<float2*>(td_smem + G::KV_BYTES);  // [2][TC_WARPS][32][NTT]
    unsigned* tmask = reinterpret_cast<unsigned*>(td_smem + G::KV_BYTES + G::SPART_BYTES);  // [STAGES][TC_WARPS]

    const int split = blockIdx.x, splits = gridDim.x;
    const int g_kv = blockIdx.y, seq = blockIdx.z;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, qd = lane & 3;

    // Tile-aligned split of [0, len).
    const int per = ((len + splits - 1) / splits + TILE - 1) / TILE * TILE;
    const int start = min(len, split * per);
    const int end = min(len, start + per);
    const int n_tiles = (end - start + TILE - 1) / TILE;
    const size_t cur_off = (static_cast<size_t>(seq) * gridDim.y + g_kv) * D;

    // Row index of this lane's token (lane mod TILE) of tile st, TD_INVALID past the split. For the paged cache
    // this is a block-table load, which the main loop issues one tile ahead of its use (below).
    auto lookup = [&](int st) -> unsigned {
        const int t = start + st * TILE + (lane & (TILE - 1));
        return st < n_tiles && t < end ? src.row(t) : TD_INVALID;
    };
    auto issue = [&](int st, unsigned myrow) {
        if (st < n_tiles) {
            const int buf = st % STAGES;
            const unsigned ok_bits = __ballot_sync(0xffffffffu, myrow != TD_INVALID);
            if (lane == 0) tmask[buf * TC_WARPS + warp] = TILE == 32 ? ok_bits : (ok_bits & 0xffffu);
            uint16_t* base = kv + buf * (2 * TILE * D);
            // Each thread copies the same chunk of K and of V (one row index, one swizzled offset for both).
#pragma unroll
            for (int i = 0; i < CHUNKS / (2 * NT); ++i) {
                const int c = threadIdx.x + i * NT;
                const int tok = c / CPR;
                const int part = c % CPR;
                const unsigned r = __shfl_sync(0xffffffffu, myrow, tok);
                const bool ok = r != TD_INVALID;
                const size_t goff = r == TD_CURRENT ? cur_off + part * 8 : (ok ? static_cast<size_t>(r) * D + part * 8 : 0);
                const uint16_t* ksrc = r == TD_CURRENT ? kcur : k;
                const uint16_t* vsrc = r == TD_CURRENT ? vcur : v;
                uint16_t* dst = base + tok * D + ((part ^ (tok & 7)) * 8);
                cp_async16(dst, ksrc + goff, ok);
                cp_async16(dst + TILE * D, vsrc + goff, ok);
            }
        }
        cp_async_commit();  // also when empty, so the wait_group counts stay uniform
    };

    // Q rows (query heads g_kv * R + g, zero past R) as A fragments of this warp's k-steps; rows 8..15 are zero.
    uint32_t qa[KSW][2];
    {
        const float qs = scale * LOG2E;
        const float* q0 = q + (static_cast<size_t>(seq) * hq + g_kv * r_heads) * D;
#pragma unroll
        for (int si = 0; si < KSW; ++si) {
            const int s = warp * KSW + si;
            float v4[4] = {0.f, 0.f, 0.f, 0.f};
            if (g < r_heads) {
                const float* qr = q0 + static_cast<size_t>(g) * D + s * 16 + 2 * qd;
                v4[0] = qr[0] * qs;
                v4[1] = qr[1] * qs;
                v4[2] = qr[8] * qs;
                v4[3] = qr[9] * qs;
            }
            qa[si][0] = pack_bf16x2(v4[0], v4[1]);
            qa[si][1] = pack_bf16x2(v4[2], v4[3]);
        }
    }
    float o[NO][4];
#pragma unroll
    for (int j = 0; j < NO; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.f;
    float m_run = -INFINITY, l_run = 0.f;  // row g (the same on the quad)

#pragma unroll
    for (int st = 0; st < STAGES - 1; ++st) issue(st, lookup(st));
    // The table load for the tile issued at the top of the next iteration goes out now and lands during this
    // tile's wait and compute: looked up at issue time, it stood between one tile's arrival and the next tile's
    // request, an L2 round trip during which a 2-stage block had no bytes in flight.
    unsigned next_row = lookup(STAGES - 1);
    for (int st = 0; st < n_tiles; ++st) {
        cp_async_wait<STAGES - 2>();
        __syncthreads();
        issue(st + STAGES - 1, next_row);  // refills the buffer every warp finished with before the barrier
        next_row = lookup(st + STAGES);
        const int buf = st % STAGES;
        const uint16_t* ks = kv + buf * (2 * TILE * D);
        const uint16_t* vs = ks + TILE * D;

        // Partial scores of this warp's head-dim quarter: NTT n-tiles of 8 tokens.
        float sacc[NTT][4];
#pragma unroll
        for (int nt = 0; nt < NTT; ++nt) sacc[nt][0] = sacc[nt][1] = sacc[nt][2] = sacc[nt][3] = 0.f;
        if constexpr (KSW == 1) {
            // One k-step: an x4 covers chunks 2s, 2s+1 of two n-tiles.
#pragma unroll
            for (int nt = 0; nt < NTT; nt += 2) {
                const int row = (nt + (lane >> 4)) * 8 + (lane & 7);
                const int chunk = 2 * warp + ((lane >> 3) & 1);
                uint32_t b[4];
                ldmatrix_x4(b, ks + row * D + ((chunk ^ (row & 7)) * 8));
                const uint32_t a[4] = {qa[0][0], 0u, qa[0][1], 0u};
                mma_bf16_16816(sacc[nt], a, b[0], b[1]);
                mma_bf16_16816(sacc[nt + 1], a, b[2], b[3]);
            }
        } else {
            // An x4 covers chunks 2s .. 2s+3 (k-steps s, s+1) of one n-tile.
#pragma unroll
            for (int nt = 0; nt < NTT; ++nt) {
                const int row = nt * 8 + (lane & 7);
#pragma unroll
                for (int si = 0; si < KSW; si += 2) {
                    const int chunk = 2 * (warp * KSW + si) + (lane >> 3);
                    uint32_t b[4];
                    ldmatrix_x4(b, ks + row * D + ((chunk ^ (row & 7)) * 8));
                    const uint32_t a0[4] = {qa[si][0], 0u, qa[si][1], 0u};
                    const uint32_t a1[4] = {qa[si + 1][0], 0u, qa[si + 1][1], 0u};
                    mma_bf16_16816(sacc[nt], a0, b[0], b[1]);
                    mma_bf16_16816(sacc[nt], a1, b[2], b[3]);
                }
            }
        }
        float2* sp = spart + (st & 1) * (TC_WARPS * 32 * NTT);
#pragma unroll
        for (int nt = 0; nt < NTT; nt += 2)
            *reinterpret_cast<float4*>(&sp[(warp * 32 + lane) * NTT + nt]) =
                make_float4(sacc[nt][0], sacc[nt][1], sacc[nt + 1][0], sacc[nt + 1][1]);
        __syncthreads();  // this parity is rewritten two tiles later, after the next top-of-loop barrier
        float sc[NTT][2];
#pragma unroll
        for (int nt = 0; nt < NTT; ++nt) sc[nt][0] = sc[nt][1] = 0.f;
#pragma unroll
        for (int w = 0; w < TC_WARPS; ++w)
#pragma unroll
            for (int nt = 0; nt < NTT; nt += 2) {
                const float4 x = *reinterpret_cast<const float4*>(&sp[(w * 32 + lane) * NTT + nt]);
                sc[nt][0] += x.x;
                sc[nt][1] += x.y;
                sc[nt + 1][0] += x.z;
                sc[nt + 1][1] += x.w;
            }
        // Mask, then the online softmax of row g over the quad; this lane's columns are 8 nt + 2 qd + {0, 1}.
        const unsigned okm = tmask[buf * TC_WARPS + warp];
        float mx = -INFINITY;
#pragma unroll
        for (int nt = 0; nt < NTT; ++nt)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                if (!((okm >> (8 * nt + 2 * qd + e)) & 1u)) sc[nt][e] = -INFINITY;
                mx = fmaxf(mx, sc[nt][e]);
            }
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        const float mn = fmaxf(m_run, mx);
        const float corr = mn == -INFINITY ? 1.f : exp2f(m_run - mn);
        float sum = 0.f;
        uint32_t pa[TILE / 16][4];
#pragma unroll
        for (int nt = 0; nt < NTT; ++nt) {
            const float p0 = mn == -INFINITY ? 0.f : exp2f(sc[nt][0] - mn);
            const float p1 = mn == -INFINITY ? 0.f : exp2f(sc[nt][1] - mn);
            sum += p0 + p1;
            // A fragment of k-step nt / 2: a0 = (row g, tokens 2qd..+1), a2 = (row g, tokens 8 + 2qd..+1).
            pa[nt / 2][(nt & 1) ? 2 : 0] = pack_bf16x2(p0, p1);
            pa[nt / 2][(nt & 1) ? 3 : 1] = 0u;  // rows 8..15
        }
        sum += __shfl_xor_sync(0xffffffffu, sum, 1);
        sum += __shfl_xor_sync(0xffffffffu, sum, 2);
        l_run = fmaf(l_run, corr, sum);
        m_run = mn;
#pragma unroll
        for (int j = 0; j < NO; ++j) {
            o[j][0] *= corr;
            o[j][1] *= corr;
        }
        // O += P V over this warp's columns: an x4.trans gives the B fragments of two n-tiles of one k-step.
#pragma unroll
        for (int kk = 0; kk < TILE / 16; ++kk) {
            const int row = 16 * kk + (lane & 7) + ((lane >> 3) & 1) * 8;
#pragma unroll
            for (int j = 0; j < NO; j += 2) {
                const int chunk = warp * (DW / 8) + j + (lane >> 4);
                uint32_t b[4];
                ldmatrix_x4_trans(b, vs + row * D + ((chunk ^ (row & 7)) * 8));
                mma_bf16_16816(o[j], pa[kk], b[0], b[1]);
                mma_bf16_16816(o[j + 1], pa[kk], b[2], b[3]);
            }
        }
    }
    cp_async_wait<0>();

    // Row g of this warp's columns 8j + 2qd + {0, 1}.
    if (g < r_heads) {
        const size_t orow = static_cast<size_t>(seq) * hq + g_kv * r_heads + g;
        if (splits == 1) {
            const float inv = l_run > 0.f ? 1.f / l_run : 0.f;
#pragma unroll
            for (int j = 0; j < NO; ++j) {
                const int col = warp * DW + 8 * j + 2 * qd;
                *reinterpret_cast<float2*>(&out[orow * D + col]) = make_float2(o[j][0] * inv, o[j][1] * inv);
            }
        } else {
            const size_t slot = (orow * splits + split) * (D + 2);
#pragma unroll
            for (int j = 0; j < NO; ++j) {
                const int col = warp * DW + 8 * j + 2 * qd;
                *reinterpret_cast<float2*>(&ws[slot + 2 + col]) = make_float2(o[j][0], o[j][1]);
            }
            if (warp == 0 && qd == 0) {
                ws[slot] = m_run;
                ws[slot + 1] = l_run;
            }
        }
    }
}

// Paged: same arguments as attention_decode_split_D*_R*; the length is clamped to the table as there.
template <int D, int TILE, int STAGES>
__device__ __forceinline__ void attention_decode_tiled_paged(const float* q, const uint16_t* kc, const uint16_t* vc,
                                                             const unsigned int* bt, const unsigned int* lens,
                                                             float scale, float* out, float* ws, int hq, int hkv,
                                                             int page_size, int num_pages, int max_pages) {
    pdl_launch_dependents();  // PDL (common.cuh): everything here reads what earlier kernels wrote
    pdl_wait();
    const int seq = blockIdx.z;
    const long long cap = static_cast<long long>(max_pages) * page_size;
    const int len = static_cast<int>(min(static_cast<long long>(lens[seq]), cap));
    const PagedSrc src{bt + static_cast<size_t>(seq) * max_pages, page_size, num_pages, hkv,
                       static_cast<int>(blockIdx.y)};
    attention_decode_tiled<D, TILE, STAGES>(q, kc, vc, nullptr, nullptr, src, len, scale, out, ws, hq, hq / hkv);
}

// Ring (sliding window W, slots = W - 1): k_ring / v_ring [seqs, hkv, slots, D], k_cur / v_cur [seqs, hkv, D] bf16,
// pos [seqs] the current token's position. Attends min(pos, slots) ring slots (order does not matter) plus the
// current token, as kernels::attention::decode_ring.
template <int D, int TILE, int STAGES>
__device__ __forceinline__ void attention_decode_tiled_ring(const float* q, const uint16_t* kr, const uint16_t* vr,
                                                            const uint16_t* kcur, const uint16_t* vcur,
                                                            const unsigned int* pos, float scale, float* out,
                                                            float* ws, int hq, int hkv, int slots) {
    pdl_launch_dependents();
    pdl_wait();
    const int seq = blockIdx.z;
    const int valid = static_cast<int>(min(pos[seq], static_cast<unsigned>(slots)));
    const RingSrc src{(static_cast<unsigned>(seq) * hkv + blockIdx.y) * static_cast<unsigned>(slots), valid};
    attention_decode_tiled<D, TILE, STAGES>(q, kr, vr, kcur, vcur, src, valid + 1, scale, out, ws, hq, hq / hkv);
}

#define EDGEFIT_ATT_TILED(D, TT, SS, MINB)                                                                          \
    extern "C" __global__ void __launch_bounds__(TC_WARPS * 32, MINB) attention_decode_tiled_D##D##_T##TT##_S##SS(   \
        const float* q, const uint16_t* kc, const uint16_t* vc, const unsigned int* bt, const unsigned int* lens, \
        float scale, float* out, float* ws, int hq, int hkv, int page_size, int num_pages, int max_pages) {       \
        attention_decode_tiled_paged<D, TT, SS>(q, kc, vc, bt, lens, scale, out, ws, hq, hkv, page_size, num_pages, \
                                              max_pages);                                                         \
    }
#define EDGEFIT_ATT_RING(D, TT, SS, MINB)                                                                           \
    extern "C" __global__ void __launch_bounds__(TC_WARPS * 32, MINB) attention_decode_ring_D##D##_T##TT##_S##SS(    \
        const float* q, const uint16_t* kr, const uint16_t* vr, const uint16_t* kcur, const uint16_t* vcur,       \
        const unsigned int* pos, float scale, float* out, float* ws, int hq, int hkv, int slots) {                \
        attention_decode_tiled_ring<D, TT, SS>(q, kr, vr, kcur, vcur, pos, scale, out, ws, hq, hkv, slots);         \
    }
// `Auto` runs the paged cache on (16, 4) (Gpu::DECODE_AUTO_TILING) and the ring on (32, 2)
// (Gpu::DECODE_RING_TILING); the other tilings are the lab's (DecodeKernels).
#define EDGEFIT_ATT_AUTO_D(D)       \
    EDGEFIT_ATT_TILED(D, 16, 4, 3)  \
    EDGEFIT_ATT_RING(D, 32, 2, 3)
EDGEFIT_ATT_AUTO_D(64)
EDGEFIT_ATT_AUTO_D(128)
EDGEFIT_ATT_AUTO_D(256)
#if EDGEFIT_LAB
#define EDGEFIT_ATT_LAB_D(D)        \
    EDGEFIT_ATT_TILED(D, 32, 3, 2)  \
    EDGEFIT_ATT_TILED(D, 32, 2, 3)  \
    EDGEFIT_ATT_RING(D, 32, 3, 2)   \
    EDGEFIT_ATT_RING(D, 16, 4, 3)
EDGEFIT_ATT_LAB_D(64)
EDGEFIT_ATT_LAB_D(128)
EDGEFIT_ATT_LAB_D(256)
#endif
