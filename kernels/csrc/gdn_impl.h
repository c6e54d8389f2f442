/* Gated DeltaNet, generic C (see seq_common.h for how this file is compiled). Math and layouts:
 * kernels/src/gdn.rs. Included by gdn_scalar.c and gdn_avx2.c with SEQ_SUFFIX / SEQ_TAG defined. */
#include "seq_common.h"

#define GDN_CHUNK 64

/* Chunk decays e^{G_t - G_s} reach the subnormal range, where x86 cores take a ~100-cycle microcode assist per
 * operation (measured here: the AVX-512 prefill of 1024 tokens went from 745 ms to 287 ms with them flushed).
 * The prefill sets flush-to-zero / denormals-are-zero for the call and restores the caller's mode on exit; results
 * move by less than 1.2e-38 absolute. Other targets keep their default mode. */
#if defined(__SSE2__)
#include <xmmintrin.h>
#define GDN_FTZ_BEGIN const unsigned int gdn_saved_csr = _mm_getcsr(); _mm_setcsr(gdn_saved_csr | 0x8040u)
#define GDN_FTZ_END _mm_setcsr(gdn_saved_csr)
#else
#define GDN_FTZ_BEGIN (void)0
#define GDN_FTZ_END (void)0
#endif

/* Causal depthwise conv + SiLU of channels [c0, c1) over t tokens of one sequence, advancing its conv state
 * ([cd, kk-1], oldest first). x, y: [t, cd]; w: [cd, kk]. */
static int SEQ_FN(gdn_conv_generic)(int64_t t, int64_t cd, int64_t kk, const float *x, const float *w,
                                    float *conv_state, float *y, int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; c++) {
        float *hist = conv_state + c * (kk - 1);
        const float *wc = w + c * kk;
        for (int64_t i = 0; i < t; i++) {
            float xi = x[i * cd + c];
            float acc = wc[kk - 1] * xi;
            for (int64_t j = 0; j < kk - 1; j++) acc += wc[j] * hist[j];
            y[i * cd + c] = seq_silu(acc);
            for (int64_t j = 0; j + 1 < kk - 1; j++) hist[j] = hist[j + 1];
            if (kk > 1) hist[kk - 2] = xi;
        }
    }
    return SEQ_TAG;
}

#ifndef GDN_NO_GENERIC_CONV
int SEQ_FN(gdn_conv)(int64_t t, int64_t cd, int64_t kk, const float *x, const float *w, float *conv_state, float *y,
                     int64_t c0, int64_t c1) {
    return SEQ_FN(gdn_conv_generic)(t, cd, kk, x, w, conv_state, y, c0, c1);
}
#endif

/* l2-normalises src[0..n) into dst, times `scale`. */
static inline void SEQ_FN(gdn_l2)(const float *src, int64_t n, float scale, float eps, float *dst) {
    float ss = 0.0f;
    for (int64_t i = 0; i < n; i++) ss += src[i] * src[i];
    float r = scale / sqrtf(ss + eps);
    for (int64_t i = 0; i < n; i++) dst[i] = src[i] * r;
}

/* rmsnorm(o) * w * silu(z) over one head's dv values, in place. */
static inline void SEQ_FN(gdn_gated_norm)(float *o, const float *z, const float *w, int64_t dv, float eps) {
    float ss = 0.0f;
    for (int64_t j = 0; j < dv; j++) ss += o[j] * o[j];
    float r = 1.0f / sqrtf(ss / (float)dv + eps);
    for (int64_t j = 0; j < dv; j++) o[j] = o[j] * r * w[j] * seq_silu(z[j]);
}

#ifndef GDN_NO_GENERIC_DECODE
/* Decode: items [item0, item1) of (sequence b, value head h) = b*hv + h, one token each. */
int SEQ_FN(gdn_decode)(const seq_gdn_args *p, int64_t item0, int64_t item1) {
    const int64_t hk = p->hk, hv = p->hv, dk = p->dk, dv = p->dv, cd = 2 * hk * dk + hv * dv;
    const float qscale = 1.0f / sqrtf((float)dk);
    for (int64_t it = item0; it < item1; it++) {
        const int64_t b = it / hv, h = it % hv, kh = h / (hv / hk);
        const float *row = p->mixed + b * cd;
        float q[dk], k[dk];
        SEQ_FN(gdn_l2)(row + kh * dk, dk, qscale, p->l2_eps, q);
        SEQ_FN(gdn_l2)(row + hk * dk + kh * dk, dk, 1.0f, p->l2_eps, k);
        const float *v = row + 2 * hk * dk + h * dv;
        const float g = -expf(p->a_log[h]) * seq_softplus(p->a[b * hv + h] + p->dt_bias[h]);
        const float beta = seq_sigmoid(p->b[b * hv + h]);
        const float decay = expf(g);
        float *s = p->state + it * dk * dv;
        float *o = p->out + b * hv * dv + h * dv;
        float kv[dv];
        for (int64_t j = 0; j < dv; j++) kv[j] = 0.0f;
        for (int64_t i = 0; i < dk; i++)
            for (int64_t j = 0; j < dv; j++) kv[j] += s[i * dv + j] * k[i];
        for (int64_t j = 0; j < dv; j++) {
            kv[j] = beta * (v[j] - decay * kv[j]); /* now the delta */
            o[j] = 0.0f;
        }
        for (int64_t i = 0; i < dk; i++)
            for (int64_t j = 0; j < dv; j++) {
                float sij = decay * s[i * dv + j] + k[i] * kv[j];
                s[i * dv + j] = sij;
                o[j] += sij * q[i];
            }
        SEQ_FN(gdn_gated_norm)(o, p->z + b * hv * dv + h * dv, p->norm_w, dv, p->norm_eps);
    }
    return SEQ_TAG;
}
#endif

/* Chunked prefill of t tokens of one sequence for value heads [h0, h1). Per chunk of C <= 64 tokens with start
 * state S0 and cumulative log decay G_t (inclusive), the state after token t is
 *   S_t = e^{G_t} S0 + sum_{s<=t} e^{G_t - G_s} k_s u_s^T,
 * where the pseudo-values u solve (I + A) U = diag(beta) V - diag(beta e^G) K S0 with the strictly lower
 * A[t][s] = beta_t e^{G_t - G_s} k_t.k_s (the UT transform). Forward substitution gives Wk and Wv with
 * (I + A) Wk = diag(beta e^G) K and (I + A) Wv = diag(beta) V, so U = Wv - Wk S0, and
 *   o_t = e^{G_t} S0^T q_t + sum_{s<=t} e^{G_t - G_s} (q_t.k_s) u_s,   S_C = e^{G_C} S0 + K^T diag(e^{G_C - G}) U.
 * Only differences G_t - G_s with s <= t are exponentiated, so nothing overflows however long the chunk decays.
 * scratch: 4*64*dk + 3*64*dv + 2*64*64 + 2*64 floats (the generic code leaves the last 64*dk unused). */
#ifndef GDN_NO_GENERIC_PREFILL
int SEQ_FN(gdn_prefill)(const seq_gdn_args *p, int64_t t, int64_t h0, int64_t h1, float *scratch) {
    const int64_t hk = p->hk, hv = p->hv, dk = p->dk, dv = p->dv, cd = 2 * hk * dk + hv * dv;
    const float qscale = 1.0f / sqrtf((float)dk);
    float *Q = scratch, *K = Q + GDN_CHUNK * dk, *WK = K + GDN_CHUNK * dk;
    float *U = WK + GDN_CHUNK * dk, *O = U + GDN_CHUNK * dv, *V = O + GDN_CHUNK * dv;
    float *A = V + GDN_CHUNK * dv, *P = A + GDN_CHUNK * GDN_CHUNK, *G = P + GDN_CHUNK * GDN_CHUNK;
    float *BETA = G + GDN_CHUNK;
    GDN_FTZ_BEGIN;
    for (int64_t h = h0; h < h1; h++) {
        const int64_t kh = h / (hv / hk);
        float *s = p->state + h * dk * dv;
        for (int64_t c0 = 0; c0 < t; c0 += GDN_CHUNK) {
            const int64_t C = t - c0 < GDN_CHUNK ? t - c0 : GDN_CHUNK;
            float gsum = 0.0f;
            for (int64_t i = 0; i < C; i++) {
                const float *row = p->mixed + (c0 + i) * cd;
                SEQ_FN(gdn_l2)(row + kh * dk, dk, qscale, p->l2_eps, Q + i * dk);
                SEQ_FN(gdn_l2)(row + hk * dk + kh * dk, dk, 1.0f, p->l2_eps, K + i * dk);
                for (int64_t j = 0; j < dv; j++) V[i * dv + j] = row[2 * hk * dk + h * dv + j];
                gsum += -expf(p->a_log[h]) * seq_softplus(p->a[(c0 + i) * hv + h] + p->dt_bias[h]);
                G[i] = gsum;
                BETA[i] = seq_sigmoid(p->b[(c0 + i) * hv + h]);
            }
            /* A (strictly lower) and P (lower incl. diagonal). */
            for (int64_t i = 0; i < C; i++)
                for (int64_t j = 0; j <= i; j++) {
                    float kk = 0.0f, qk = 0.0f;
                    for (int64_t x = 0; x < dk; x++) {
                        kk += K[i * dk + x] * K[j * dk + x];
                        qk += Q[i * dk + x] * K[j * dk + x];
                    }
                    const float e = expf(G[i] - G[j]);
                    A[i * GDN_CHUNK + j] = j < i ? BETA[i] * e * kk : 0.0f;
                    P[i * GDN_CHUNK + j] = e * qk;
                }
            /* Forward substitution: WK, U (= Wv for now). */
            for (int64_t i = 0; i < C; i++) {
                const float bk = BETA[i] * expf(G[i]);
                for (int64_t x = 0; x < dk; x++) WK[i * dk + x] = bk * K[i * dk + x];
                for (int64_t x = 0; x < dv; x++) U[i * dv + x] = BETA[i] * V[i * dv + x];
                for (int64_t j = 0; j < i; j++) {
                    const float aij = A[i * GDN_CHUNK + j];
                    for (int64_t x = 0; x < dk; x++) WK[i * dk + x] -= aij * WK[j * dk + x];
                    for (int64_t x = 0; x < dv; x++) U[i * dv + x] -= aij * U[j * dv + x];
                }
            }
            /* U -= WK S0 and O = e^G Q S0, one pass over the rows of S0. */
            for (int64_t i = 0; i < C; i++) {
                const float eg = expf(G[i]);
                for (int64_t x = 0; x < dk; x++) Q[i * dk + x] *= eg;
                for (int64_t x = 0; x < dv; x++) O[i * dv + x] = 0.0f;
            }
            for (int64_t r = 0; r < dk; r++) {
                const float *srow = s + r * dv;
                for (int64_t i = 0; i < C; i++) {
                    const float wk = WK[i * dk + r], qe = Q[i * dk + r];
                    for (int64_t x = 0; x < dv; x++) {
                        U[i * dv + x] -= wk * srow[x];
                        O[i * dv + x] += qe * srow[x];
                    }
                }
            }
            /* O += P U. */
            for (int64_t i = 0; i < C; i++)
                for (int64_t j = 0; j <= i; j++) {
                    const float pij = P[i * GDN_CHUNK + j];
                    for (int64_t x = 0; x < dv; x++) O[i * dv + x] += pij * U[j * dv + x];
                }
            /* S = e^{G_C} S0 + K^T diag(e^{G_C - G}) U. */
            const float gl = G[C - 1], el = expf(gl);
            for (int64_t i = 0; i < C; i++) {
                const float e = expf(gl - G[i]);
                for (int64_t x = 0; x < dk; x++) K[i * dk + x] *= e;
            }
            for (int64_t r = 0; r < dk; r++) {
                float *srow = s + r * dv;
                for (int64_t x = 0; x < dv; x++) srow[x] *= el;
                for (int64_t i = 0; i < C; i++) {
                    const float kr = K[i * dk + r];
                    for (int64_t x = 0; x < dv; x++) srow[x] += kr * U[i * dv + x];
                }
            }
            for (int64_t i = 0; i < C; i++) {
                float *o = p->out + (c0 + i) * hv * dv + h * dv;
                for (int64_t x = 0; x < dv; x++) o[x] = O[i * dv + x];
                SEQ_FN(gdn_gated_norm)(o, p->z + (c0 + i) * hv * dv + h * dv, p->norm_w, dv, p->norm_eps);
            }
        }
    }
    GDN_FTZ_END;
    return SEQ_TAG;
}
#endif
