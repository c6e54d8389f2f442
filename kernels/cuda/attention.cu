// Decode attention (one query token per sequence) over a paged bf16 KV cache, grouped-query packed and split over
// the context (flash-decoding). Two kernel families share the split, the partials and the combine kernel: the
// CUDA-core one (attention_decode_split_*, fp32 scores) and the tensor-core one (attention_decode_tc_*, bf16
// operands; 1.11x faster at 32k context on the H200 and the default, see benchmarks/h200.md).
// Layouts: kernels/src/attention.rs, with bf16 K/V pages [num_pages, Hkv, page_size, D], block_table u32
// [seqs, max_pages], lens u32 [seqs] (the current token included).
//
// attention_decode_split_D{64,128,256}_R{r}: grid (splits, Hkv, seqs), 32 * R / HPW threads (HPW = 2 query heads
// per warp when R is even, else 1). One block serves all R query heads of one KV head, so each K/V row is read
// from memory once per KV head, not once per query head. K and V stream through a 3-stage cp.async pipeline in
// shared memory; a lane holds D/32 dims of every row; softmax is online in base 2 (q pre-scaled by
// scale * log2 e), updated once per 16-token stage. With one split the block writes the output, otherwise a
// partial (max, sum, acc[D]) per (sequence, query head, split) that attention_decode_combine_D* reduces.
// Tokens whose page id is >= num_pages are skipped (a bad block table never reads outside the cache).
#include "common.cuh"

using namespace edgefit;

constexpr int ATT_TS = 16;     // tokens per pipeline stage
constexpr float LOG2E = 1.4426950408889634f;

__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, bool valid) {
    const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
    const int n = valid ? 16 : 0;  // 0: zero-fill, nothing read
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(s), "l"(gmem), "r"(n) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

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
    __shared__ float wgt[1024];
    __shared__ float red[D * COMB_Y / 32];
    __shared__ float part[COMB_Y][D];
    __shared__ float mx_s, den_s;
    const size_t row = static_cast<size_t>(blockIdx.y) * hq + blockIdx.x;
    const float* p = ws + row * splits * (D + 2);
    const int d = threadIdx.x, y = threadIdx.y;
    const int tid = y * D + d, lane = tid & 31, warp = tid >> 5;
    constexpr int NT = D * COMB_Y, NW = NT / 32;
    float mx = -INFINITY;
    for (int s = tid; s < splits; s += NT) mx = fmaxf(mx, p[static_cast<size_t>(s) * (D + 2)]);
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
    for (int s = tid; s < splits; s += NT) {
        const float ms = p[static_cast<size_t>(s) * (D + 2)];
        const float w = (ms == -INFINITY || mx == -INFINITY) ? 0.f : exp2f(ms - mx);
        wgt[s] = w;
        den = fmaf(p[static_cast<size_t>(s) * (D + 2) + 1], w, den);
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
    float num = 0.f;
#pragma unroll 4
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

EDGEFIT_ATT_D(64)
EDGEFIT_ATT_D(128)
EDGEFIT_ATT_D(256)

// Variant for the benchmark's sweep: two pipeline stages (32 KiB), so six blocks fit per SM instead of four.
extern "C" __global__ void __launch_bounds__(AttGeom<6>::THREADS) attention_decode_split_D256_R6_s2(
    const float* q, const uint16_t* kc, const uint16_t* vc, const unsigned int* bt, const unsigned int* lens,
    float scale, float* out, float* ws, int hq, int hkv, int page_size, int num_pages, int max_pages) {
    attention_decode_split<256, 6, 2>(q, kc, vc, bt, lens, scale, out, ws, hq, hkv, page_size, num_pages, max_pages);
}

// ---------------------------------------------------------------------------------------------------------------
// Tensor-core decode (attention_decode_tc_D*): the same split, pages and partials as above, with Q K^T and P V on
// mma.sync m16n8k16 (bf16 operands, fp32 accumulation), as flash-decoding kernels do. The R query heads of the
// block are the 16 rows of A (rows >= R are zero and ignored); a 16-token stage is two n-tiles of scores. Four
// warps each multiply a quarter of the head dim into the score tile (summed through shared memory), then each
// runs the same softmax on the whole tile and owns D/4 columns of the output. Stage rows are padded by 16 bytes (D
// + 8 bf16), which makes the per-lane 4-byte fragment loads from shared memory conflict-free. Q is rounded to bf16
// (scaled by scale * log2 e first) and P to bf16, as in SDPA's flash kernel: the error against an fp32 reference is
// ~1e-3.
constexpr int TC_STAGES = 2;
constexpr int TC_WARPS = 4;

__device__ __forceinline__ void mma_bf16_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// (lo, hi) floats -> bf16x2, round to nearest even.
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
    uint32_t r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

template <int D>
__device__ __forceinline__ void attention_decode_tc(const float* __restrict__ q, const uint16_t* __restrict__ kc,
                                                    const uint16_t* __restrict__ vc,
                                                    const unsigned int* __restrict__ block_table,
                                                    const unsigned int* __restrict__ lens, float scale,
                                                    float* __restrict__ out, float* __restrict__ ws, int hq, int hkv,
                                                    int page_size, int num_pages, int max_pages, int r_heads) {
    constexpr int DP = D + 8;       // padded row, bf16
    constexpr int CPR = D / 8;      // 16-byte chunks per row
    constexpr int CHUNKS = 2 * ATT_TS * CPR;
    constexpr int NT = TC_WARPS * 32;
    constexpr int KS = D / 16;          // k-steps of Q K^T
    constexpr int KSW = KS / TC_WARPS;  // k-steps of Q K^T per warp
    constexpr int DW = D / TC_WARPS;    // output columns per warp
    constexpr int NO = DW / 8;          // output n-tiles per warp
    __shared__ __align__(16) uint16_t stage[TC_STAGES][2][ATT_TS][DP];
    __shared__ float spart[2][TC_WARPS][2][4][32];  // partial scores per warp, double-buffered by stage parity

    const int split = blockIdx.x, splits = gridDim.x;
    const int g_kv = blockIdx.y, seq = blockIdx.z;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, qd = lane & 3;

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
            for (int c = threadIdx.x; c < CHUNKS; c += NT) {
                const int which = c / (ATT_TS * CPR);  // 0: K, 1: V
                const int tok = (c / CPR) % ATT_TS;
                const int part = c % CPR;
                const int t = t0 + tok;
                const unsigned int page = t < end ? bt[t / page_size] : 0u;
                const bool ok = t < end && page < static_cast<unsigned int>(num_pages);
                const size_t off =
                    ok ? ((static_cast<size_t>(page) * hkv + g_kv) * page_size + t % page_size) * D + part * 8 : 0;
                cp_async16(&stage[st % TC_STAGES][which][tok][part * 8], (which ? vc : kc) + off, ok);
            }
        }
        cp_async_commit();
    };

    // Q as A fragments for this warp's k-steps: rows g and g + 8 are query heads g_kv * R + row (zero past R).
    uint32_t qa[KSW][4];
    {
        const float qs = scale * LOG2E;
        const float* q0 = q + (static_cast<size_t>(seq) * hq + g_kv * r_heads) * D;
#pragma unroll
        for (int si = 0; si < KSW; ++si) {
            const int s = warp * KSW + si;
#pragma unroll
            for (int half = 0; half < 2; ++half) {  // rows g, g + 8
                const int row = g + 8 * half;
                float v[4] = {0.f, 0.f, 0.f, 0.f};
                if (row < r_heads) {
                    const float* qr = q0 + static_cast<size_t>(row) * D + s * 16 + 2 * qd;
                    v[0] = qr[0] * qs;
                    v[1] = qr[1] * qs;
                    v[2] = qr[8] * qs;
                    v[3] = qr[9] * qs;
                }
                qa[si][half] = pack_bf16x2(v[0], v[1]);
                qa[si][2 + half] = pack_bf16x2(v[2], v[3]);
            }
        }
    }
    float o[NO][4];
#pragma unroll
    for (int j = 0; j < NO; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.f;
    float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.f, 0.f};  // rows g, g + 8 (same on the quad)

#pragma unroll
    for (int st = 0; st < TC_STAGES - 1; ++st) issue(st);
    for (int st = 0; st < n_stages; ++st) {
        cp_async_wait<TC_STAGES - 2>();
        __syncthreads();
        issue(st + TC_STAGES - 1);
        const int buf = st % TC_STAGES;
        const uint16_t(*ks)[DP] = stage[buf][0];
        const uint16_t(*vs)[DP] = stage[buf][1];

        // Scores: two n-tiles of 8 tokens. Each warp multiplies its quarter of the head dim (two accumulators per
        // tile, even and odd k-steps, so the mma chains are short), the four partial tiles meet in shared memory.
        // (Every warp computing the whole tile took 168 registers: 109 us at 32k context against 90 us, H200.)
#pragma unroll
        for (int t = 0; t < 2; ++t) {
            float acc2[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
            const uint16_t* krow = ks[8 * t + g];
#pragma unroll
            for (int si = 0; si < KSW; ++si) {
                const int s = warp * KSW + si;
                const uint32_t b0 = *reinterpret_cast<const uint32_t*>(krow + s * 16 + 2 * qd);
                const uint32_t b1 = *reinterpret_cast<const uint32_t*>(krow + s * 16 + 8 + 2 * qd);
                mma_bf16_16816(acc2[si & 1], qa[si], b0, b1);
            }
#pragma unroll
            for (int i = 0; i < 4; ++i) spart[st & 1][warp][t][i][lane] = acc2[0][i] + acc2[1][i];
        }
        __syncthreads();  // the parity buffer is rewritten two stages later, after the next top-of-loop barrier
        float sc[2][4];
#pragma unroll
        for (int t = 0; t < 2; ++t)
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                float v = 0.f;
#pragma unroll
                for (int w = 0; w < TC_WARPS; ++w) v += spart[st & 1][w][t][i][lane];
                sc[t][i] = v;
            }
        // Mask tokens past the end or on an invalid page; columns of this lane: 8t + 2qd + {0, 1}.
        const int t0 = start + st * ATT_TS;
#pragma unroll
        for (int t = 0; t < 2; ++t) {
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const int tok = t0 + 8 * t + 2 * qd + e;
                const bool ok = tok < end && bt[tok / page_size] < static_cast<unsigned int>(num_pages);
                if (!ok) sc[t][e] = sc[t][2 + e] = -INFINITY;
            }
        }
        // Online softmax per row (row g: elements 0, 1; row g + 8: elements 2, 3), reduced over the quad.
        float p[2][4];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            float mx = fmaxf(fmaxf(sc[0][2 * h], sc[0][2 * h + 1]), fmaxf(sc[1][2 * h], sc[1][2 * h + 1]));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
            const float mn = fmaxf(m_run[h], mx);
            const float corr = mn == -INFINITY ? 1.f : exp2f(m_run[h] - mn);
            float sum = 0.f;
#pragma unroll
            for (int t = 0; t < 2; ++t)
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    const float pv = mn == -INFINITY ? 0.f : exp2f(sc[t][2 * h + e] - mn);
                    p[t][2 * h + e] = pv;
                    sum += pv;
                }
            sum += __shfl_xor_sync(0xffffffffu, sum, 1);
            sum += __shfl_xor_sync(0xffffffffu, sum, 2);
            l_run[h] = fmaf(l_run[h], corr, sum);
            m_run[h] = mn;
#pragma unroll
            for (int j = 0; j < NO; ++j) {
                o[j][2 * h] *= corr;
                o[j][2 * h + 1] *= corr;
            }
        }
        // P as the A fragment of one k16 step (tokens 0..15), the score accumulators' layout reused.
        const uint32_t pa[4] = {pack_bf16x2(p[0][0], p[0][1]), pack_bf16x2(p[0][2], p[0][3]),
                                pack_bf16x2(p[1][0], p[1][1]), pack_bf16x2(p[1][2], p[1][3])};
        // O += P V over this warp's columns; B = V[token][col]: (k = 2qd, 2qd + 1, n = g) and k + 8.
#pragma unroll
        for (int j = 0; j < NO; ++j) {
            const int col = warp * DW + 8 * j + g;
            const uint32_t v00 = vs[2 * qd][col], v01 = vs[2 * qd + 1][col];
            const uint32_t v10 = vs[2 * qd + 8][col], v11 = vs[2 * qd + 9][col];
            mma_bf16_16816(o[j], pa, v00 | (v01 << 16), v10 | (v11 << 16));
        }
    }
    cp_async_wait<0>();

    // Rows g and g + 8 of this warp's columns 8j + 2qd + {0, 1}.
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int row = g + 8 * h;
        if (row >= r_heads) continue;
        const size_t orow = static_cast<size_t>(seq) * hq + g_kv * r_heads + row;
        if (splits == 1) {
            const float inv = l_run[h] > 0.f ? 1.f / l_run[h] : 0.f;
#pragma unroll
            for (int j = 0; j < NO; ++j) {
                const int col = warp * DW + 8 * j + 2 * qd;
                out[orow * D + col] = o[j][2 * h] * inv;
                out[orow * D + col + 1] = o[j][2 * h + 1] * inv;
            }
        } else {
            const size_t slot = (orow * splits + split) * (D + 2);
#pragma unroll
            for (int j = 0; j < NO; ++j) {
                const int col = warp * DW + 8 * j + 2 * qd;
                ws[slot + 2 + col] = o[j][2 * h];
                ws[slot + 2 + col + 1] = o[j][2 * h + 1];
            }
            if (warp == 0 && qd == 0) {
                ws[slot] = m_run[h];
                ws[slot + 1] = l_run[h];
            }
        }
    }
}

#define EDGEFIT_ATT_TC(D)                                                                                         \
    extern "C" __global__ void __launch_bounds__(TC_WARPS * 32) attention_decode_tc_D##D(                         \
        const float* q, const uint16_t* kc, const uint16_t* vc, const unsigned int* bt, const unsigned int* lens, \
        float scale, float* out, float* ws, int hq, int hkv, int page_size, int num_pages, int max_pages) {       \
        attention_decode_tc<D>(q, kc, vc, bt, lens, scale, out, ws, hq, hkv, page_size, num_pages, max_pages,     \
                               hq / hkv);                                                                         \
    }
EDGEFIT_ATT_TC(64)
EDGEFIT_ATT_TC(128)
EDGEFIT_ATT_TC(256)
