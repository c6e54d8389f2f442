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
// 4. gdn_prefill_gated_norm: one warp per (token, value head): out <- rmsnorm(out) * w * silu(z), in place.
//
// Precision: fp32 on the CUDA cores throughout (no tensor cores, no bf16 rounding), so results match the fp32 CPU
// chunked prefill and the f64 recurrence to fp32 rounding of a different summation order.
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
static_assert(state_smem_bytes(16) == 96768 && state_smem_bytes(32) == 109056 && state_smem_bytes(64) == 133632, "keep gdn_prefill.rs state_smem_bytes equal");
