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
// Four launches (the Rust side, kernels/src/cuda/device/gdn_prefill.rs, queues them on one stream):
// 1. gdn_prefill_prep: grid (max_len, 2Hk+Hv, seqs), 128 threads, one per channel of one 128-channel segment (a q
//    head, a k head or a v head) of one token: conv + SiLU, the l2-norm of q/k segments (block reduction), the
//    gates of v segments; writes qn, kn, v, g, beta to the workspace, and the final conv history of each channel to
//    conv_out (blocks of token 0). conv_in is only read, so the q/k history shared by several blocks never races
//    (the same two-buffer convention as gdn_decode_step).
// 2. gdn_prefill_wy: grid (max_chunks, Hv, seqs), 256 threads: per (chunk, value head) G, A, T (forward
//    substitution, 4 threads per column), W, U and the masked decayed Aqk[t][s] = e^{G_t-G_s} q_t.k_s (s <= t), all
//    independent across chunks, so this is the parallel part.
// 3. gdn_prefill_state_cs<CS>: grid (128/CS, Hv, seqs), 256 threads: the sequential part. Each block owns CS
//    columns of one head's state (fp32 in shared memory) and walks the sequence's chunks: D = U - W S, the
//    unnormalised output e^G (Q S) + Aqk D (written to out), S <- e^{G_L} S + (e^{G_L-G} K)^T D; the state goes
//    back to global memory once, at the end. CS = 32 (192 blocks at Hv = 48, two per SM by shared memory) is the
//    default; 16 and 64 are built for the benchmark's sweep.
//    gdn_prefill_state_tc{1,3}_cs<CS> are drop-in builds of the same launch with the four per-chunk products on
//    mma.sync TF32 tensor cores (plain or 3xTF32 split; see their comment below); Gpu::gdn_prefill_with selects
//    one by name. Per (chunk, head) the walk costs 7.3 MFLOP (W S, Q S, K^T D: 2 * 64*128*128 each; Aqk D:
//    2 * 64*64*128) against ~150 KB of W, U, Aqk, q, k reads, so on CUDA cores it is FMA-bound (s2-run2: 14
//    TFLOP/s for the whole layer) while on tensor cores it becomes load-latency-bound.
// 4. gdn_prefill_gated_norm: one warp per (token, value head): out <- rmsnorm(out) * w * silu(z), in place.
//
// Precision: the default build is fp32 on the CUDA cores throughout (no tensor cores, no bf16 rounding), so
// results match the fp32 CPU chunked prefill and the f64 recurrence to fp32 rounding of a different summation
// order; the TF32 state builds round only their mma operands (3xTF32: ~fp32; plain: ~5e-4 per product).
//
// Workspace (floats, offsets in gdn_prefill.rs): qn [N, Hk, 128], kn [N, Hk, 128], v [N, Hv, 128], g [N, Hv],
// beta [N, Hv], gcum [N, Hv], W [Hv, NC, 64, 128], U [Hv, NC, 64, 128], Aqk [Hv, NC, 64, 64] with N the total
// tokens and NC the total chunks (sum over sequences of ceil(len/64)). meta (int32): cu_seqlens[seqs+1] followed by
// chunk offsets[seqs+1].
#include "common.cuh"

using namespace edgefit;

namespace {

constexpr int D = 128;      // dk = dv = 128
constexpr int C = 64;       // chunk length
constexpr int KP = D + 4;   // padded row of a [C][D] shared tile (keeps float4 alignment, spreads banks)
constexpr int AP = C + 1;   // padded row of a [C][C] shared tile
constexpr float L2_EPS = 1e-6f;

__device__ __forceinline__ float silu_f(float x) { return x / (1.f + expf(-x)); }

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

extern "C" __global__ void __launch_bounds__(D)
    gdn_prefill_prep(const float* __restrict__ qkv, const float* __restrict__ a_in, const float* __restrict__ b_in,
                     const float* __restrict__ conv_w, const float* __restrict__ a_log,
                     const float* __restrict__ dt_bias, const float* __restrict__ conv_in,
                     float* __restrict__ conv_out, const int* __restrict__ meta, float* __restrict__ qn,
                     float* __restrict__ kn, float* __restrict__ vv, float* __restrict__ gg, float* __restrict__ bb,
                     int hk, int hv, int kconv) {
    const int t = blockIdx.x;  // token within the sequence
    const int seg = blockIdx.y;
    const int s = blockIdx.z;
    const int tid = threadIdx.x;
    const int start = meta[s];
    const int len = meta[s + 1] - start;
    const int conv_dim = (2 * hk + hv) * D;
    const int hist = kconv - 1;
    const int ch = seg * D + tid;  // q heads, k heads, v heads are consecutive 128-channel segments
    const float* cin = conv_in + (static_cast<size_t>(s) * conv_dim + ch) * hist;
    // Input at sequence position j (j < 0: the remembered history, oldest first).
    auto x_at = [&](int j) -> float {
        return j >= 0 ? qkv[static_cast<size_t>(start + j) * conv_dim + ch] : cin[hist + j];
    };
    if (t == 0) {
        // Final history of this channel: positions len-hist .. len-1 of the sequence (history when negative; a
        // sequence of length 0 copies its history).
        float* cout = conv_out + (static_cast<size_t>(s) * conv_dim + ch) * hist;
        for (int p = 0; p < hist; ++p) cout[p] = x_at(len - hist + p);
    }
    if (t >= len) return;  // whole block: ragged batch
    const float* w = conv_w + static_cast<size_t>(ch) * kconv;
    float acc = 0.f;
    for (int p = 0; p < kconv; ++p) acc = fmaf(w[p], x_at(t - hist + p), acc);
    float y = silu_f(acc);
    const size_t tok = static_cast<size_t>(start + t);
    if (seg < 2 * hk) {
        __shared__ float part[D / 32];
        const float ss = warp_sum(y * y);
        if ((tid & 31) == 0) part[tid >> 5] = ss;
        __syncthreads();
        const float tot = part[0] + part[1] + part[2] + part[3];
        const float scale = (seg < hk ? rsqrtf(static_cast<float>(D)) : 1.f) * rsqrtf(tot + L2_EPS);
        y *= scale;
        if (seg < hk)
            qn[(tok * hk + seg) * D + tid] = y;
        else
            kn[(tok * hk + (seg - hk)) * D + tid] = y;
    } else {
        const int h = seg - 2 * hk;
        vv[(tok * hv + h) * D + tid] = y;
        if (tid == 0) {
            gg[tok * hv + h] = -expf(a_log[h]) * softplus_f(a_in[tok * hv + h] + dt_bias[h]);
            bb[tok * hv + h] = 1.f / (1.f + expf(-b_in[tok * hv + h]));
        }
    }
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

    const int c = blockIdx.x, h = blockIdx.y, s = blockIdx.z;
    const int tid = threadIdx.x;
    const int start = meta[s];
    const int len = meta[s + 1] - start;
    if (c * C >= len) return;
    const int lc = min(C, len - c * C);
    const size_t tok0 = static_cast<size_t>(start + c * C);
    const size_t slot = static_cast<size_t>(h) * n_chunks + meta[seqs + 1 + s] + c;
    const int kh = h / (hv / hk);

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
    // 2. In-chunk inclusive cumulative sum of g (64 values; warp 0, two per lane).
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

    for (int i = tid; i < D * CG; i += 256) {
        const int r = i / CG, q4 = i % CG;
        *reinterpret_cast<float4*>(Ss + r * CS + 4 * q4) = *reinterpret_cast<const float4*>(sg + r * D + 4 * q4);
    }

    for (int c = 0; c < nch; ++c) {
        const int lc = min(C, len - c * C);
        const size_t tok0 = static_cast<size_t>(start + c * C);
        const size_t slot = static_cast<size_t>(h) * n_chunks + meta[seqs + 1 + s] + c;
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

GDN_STATE_KERNEL(16)
GDN_STATE_KERNEL(32)
GDN_STATE_KERNEL(64)

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

__device__ __forceinline__ uint32_t to_tf32(float x) {
    uint32_t r;
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
    return r;
}

// One operand fragment: hi (TF32) and, when split, lo = TF32(x - hi).
template <int N, bool SPLIT>
struct TfFrag {
    uint32_t hi[N];
    uint32_t lo[N];
    __device__ __forceinline__ void set(int i, float x) {
        hi[i] = to_tf32(x);
        if (SPLIT) lo[i] = to_tf32(x - __uint_as_float(hi[i]));
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
template <bool SPLIT>
__device__ __forceinline__ void mma_acc(float (&d)[4], const TfFrag<4, SPLIT>& a, const TfFrag<2, SPLIT>& b) {
    if (SPLIT) {
        mma_tf32(d, a.lo, b.hi);
        mma_tf32(d, a.hi, b.lo);
    }
    mma_tf32(d, a.hi, b.hi);
}

// A fragment (16 x 8, row-major) at rows m0.., columns k0.. of a row-major tile with row stride ld:
// a0 (g, t), a1 (g+8, t), a2 (g, t+4), a3 (g+8, t+4), g = lane >> 2, t = lane & 3.
template <bool SPLIT>
__device__ __forceinline__ void load_a(TfFrag<4, SPLIT>& f, const float* tile, int ld, int m0, int k0, int lane) {
    const float* p = tile + (m0 + (lane >> 2)) * ld + k0 + (lane & 3);
    f.set(0, p[0]);
    f.set(1, p[8 * ld]);
    f.set(2, p[4]);
    f.set(3, p[8 * ld + 4]);
}

// A fragment of the transpose of a row-major tile: A[m][k] = tile[k][m].
template <bool SPLIT>
__device__ __forceinline__ void load_at(TfFrag<4, SPLIT>& f, const float* tile, int ld, int m0, int k0, int lane) {
    const float* p = tile + (k0 + (lane & 3)) * ld + m0 + (lane >> 2);
    f.set(0, p[0]);
    f.set(1, p[8]);
    f.set(2, p[4 * ld]);
    f.set(3, p[4 * ld + 8]);
}

// B fragment (8 x 8, B[k][n] = tile[k][n] of a row-major tile): b0 (k = t, n = g), b1 (k = t+4, n = g).
template <bool SPLIT>
__device__ __forceinline__ void load_b(TfFrag<2, SPLIT>& f, const float* tile, int ld, int k0, int n0, int lane) {
    const float* p = tile + (k0 + (lane & 3)) * ld + n0 + (lane >> 2);
    f.set(0, p[0]);
    f.set(1, p[4 * ld]);
}

}  // namespace

// Shared memory of gdn_prefill_state_tc*_cs<CS> (dynamic): two [C][KP] tiles, S [D][CS+8], D [C][CS+8] and
// Aqk [C][QP] with G_t in column C of row t (the padding). 115,712 bytes at CS = 32: two blocks per SM exactly
// fill the 228 KiB (with the 1 KiB the driver reserves per block), and __launch_bounds__(256, 2) keeps the
// registers at <= 128 so that the register file allows two as well (the launch asks for the maximum carveout).
__host__ __device__ constexpr int state_tc_smem_bytes(int cs) {
    return (2 * C * KP + D * (cs + 8) + C * (cs + 8) + C * QP) * 4;
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
    extern __shared__ float4 smem_tc[];
    float* sm = reinterpret_cast<float*>(smem_tc);
    float* Xa = sm;              // [C][KP]: W, then e^{G_L-G} K
    float* Xb = Xa + C * KP;     // [C][KP]: Q
    float* Ss = Xb + C * KP;     // [D][SP]
    float* Dn = Ss + D * SP;     // [C][SP]
    float* Aq = Dn + C * SP;     // [C][QP]
    float* gc = Aq + C;          // G_t at gc[t * QP]: column C of the Aqk tile (padding the mma never reads)

    const int c0 = blockIdx.x * CS, h = blockIdx.y, s = blockIdx.z;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int fg = lane >> 2, ft = lane & 3;  // fragment row group / column pair
    const int start = meta[s];
    const int len = meta[s + 1] - start;
    const int nch = (len + C - 1) / C;
    const int kh = h / (hv / hk);
    const size_t vw = static_cast<size_t>(hv) * D;
    float* sg = state + (static_cast<size_t>(s) * hv + h) * D * D + c0;
    const int am = (warp & 3) * 16;       // phases a and c: this warp's 16 rows of the chunk
    const int an = (warp >> 2) * NH * 8;  // ... and its first column within the slice
    const int dm = warp * 16;             // phase d: this warp's 16 state rows

    for (int i = tid; i < D * (CS / 4); i += 256) {
        const int r = i / (CS / 4), q4 = i % (CS / 4);
        *reinterpret_cast<float4*>(Ss + r * SP + 4 * q4) = *reinterpret_cast<const float4*>(sg + r * D + 4 * q4);
    }

    for (int c = 0; c < nch; ++c) {
        const int lc = min(C, len - c * C);
        const size_t tok0 = static_cast<size_t>(start + c * C);
        const size_t slot = static_cast<size_t>(h) * n_chunks + meta[seqs + 1 + s] + c;
        const float4* wg = reinterpret_cast<const float4*>(w_in + slot * C * D);
        for (int i = tid; i < C * (D / 4); i += 256) {
            const int r = i / (D / 4), q4 = i % (D / 4);
            *reinterpret_cast<float4*>(Xa + r * KP + 4 * q4) = wg[i];
            float4 qv = make_float4(0.f, 0.f, 0.f, 0.f);
            if (r < lc) qv = reinterpret_cast<const float4*>(qn + ((tok0 + r) * hk + kh) * D)[q4];
            *reinterpret_cast<float4*>(Xb + r * KP + 4 * q4) = qv;
        }
        const float4* ag = reinterpret_cast<const float4*>(aqk_in + slot * C * C);
        for (int i = tid; i < C * (C / 4); i += 256) {
            const int r = i / (C / 4), q4 = i % (C / 4);
            *reinterpret_cast<float4*>(Aq + r * QP + 4 * q4) = ag[i];
        }
        if (tid < C) gc[tid * QP] = tid < lc ? gcum[(tok0 + tid) * hv + h] : 0.f;
        // K rows of the chunk (for phase b) and this warp's U fragments (for D), in flight during phase a.
        float4 kreg[KR];
#pragma unroll
        for (int j = 0; j < KR; ++j) {
            const int i = tid + 256 * j, r = i / (D / 4), q4 = i % (D / 4);
            kreg[j] = make_float4(0.f, 0.f, 0.f, 0.f);
            if (r < lc) kreg[j] = reinterpret_cast<const float4*>(kn + ((tok0 + r) * hk + kh) * D)[q4];
        }
        const float* ug = u_in + slot * C * D + c0;
        float2 ulo[NH], uhi[NH];
#pragma unroll
        for (int j = 0; j < NH; ++j) {
            const int col = an + 8 * j + 2 * ft;
            ulo[j] = *reinterpret_cast<const float2*>(ug + (am + fg) * D + col);
            uhi[j] = *reinterpret_cast<const float2*>(ug + (am + fg + 8) * D + col);
        }
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

GDN_STATE_TC_KERNEL(1, 16)
GDN_STATE_TC_KERNEL(1, 32)
GDN_STATE_TC_KERNEL(1, 64)
GDN_STATE_TC_KERNEL(3, 16)
GDN_STATE_TC_KERNEL(3, 32)
GDN_STATE_TC_KERNEL(3, 64)

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

static_assert(WY_SMEM_BYTES == 101376, "keep GDN_WY_SMEM_BYTES in device/gdn_prefill.rs equal");
static_assert(state_tc_smem_bytes(16) == 103424 && state_tc_smem_bytes(32) == 115712 &&
                  state_tc_smem_bytes(64) == 140288,
              "keep gdn_prefill.rs state_tc_smem_bytes equal");
static_assert(state_smem_bytes(16) == 96768 && state_smem_bytes(32) == 109056 && state_smem_bytes(64) == 133632, "keep gdn_prefill.rs state_smem_bytes equal");
