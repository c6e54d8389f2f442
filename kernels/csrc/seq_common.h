/* Shared declarations of the sequence kernels (gated DeltaNet, attention, RoPE, small ops).
 *
 * Each kernel family has a generic implementation in `<family>_impl.h`, written in plain C11, included by
 * `<family>_scalar.c` (portable flags) and `<family>_avx2.c` (AVX2+FMA flags: the compiler vectorises the same
 * source, there are no AVX2 intrinsics), and a hand-written `<family>_avx512.c`. Every entry point returns the tag
 * of the instruction set its translation unit was compiled for (SEQ_TAG: 0 scalar, 1 AVX2, 2 AVX-512) so the Rust
 * side can prove which path ran. The Rust side checks every size before calling; these functions trust them. */
#ifndef EDGEFIT_SEQ_COMMON_H
#define EDGEFIT_SEQ_COMMON_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#define SEQ_CAT2(a, b) a##b
#define SEQ_CAT(a, b) SEQ_CAT2(a, b)
#define SEQ_FN(name) SEQ_CAT(name, SEQ_SUFFIX)

/* One gated DeltaNet layer call (layouts: kernels/src/gdn.rs). `mixed` is the conv+SiLU output. */
typedef struct {
    int64_t hk, hv, dk, dv;
    float norm_eps;
    float l2_eps;
    const float *mixed;   /* [n, 2*hk*dk + hv*dv] */
    const float *z;       /* [n, hv*dv] */
    const float *a;       /* [n, hv] */
    const float *b;       /* [n, hv] */
    const float *a_log;   /* [hv] */
    const float *dt_bias; /* [hv] */
    const float *norm_w;  /* [dv] */
    float *state;         /* [seqs, hv, dk, dv] */
    float *out;           /* [n, hv*dv] */
} seq_gdn_args;

/* One attention call (layouts: kernels/src/attention.rs). */
typedef struct {
    int64_t hq, hkv, d;
    float scale;
    const float *q; /* decode [B, hq, d]; prefill [T, hq, d] */
    float *out;     /* like q */
    /* decode caches hold f32, or bf16 (raw uint16_t bits) when kv_bf16 is set */
    int64_t kv_bf16;
    /* paged decode */
    const void *k_pages, *v_pages; /* [pages, hkv, page_size, d] */
    const uint32_t *block_table;   /* [B, max_pages] */
    const uint32_t *lens;          /* [B] */
    int64_t page_size, max_pages;
    /* ring decode */
    const void *k_ring, *v_ring; /* [B, hkv, slots, d] */
    const void *k_cur, *v_cur;   /* [B, hkv, d] */
    const uint32_t *pos;         /* [B] */
    int64_t slots;               /* window - 1 */
    /* prefill */
    const float *k, *v; /* [T, hkv, d] */
    int64_t window;     /* 0: no window */
} seq_attn_args;

/* bf16 -> f32 is exact: the bf16 bits are the high half of the f32. */
static inline float seq_bf16_to_f32(uint16_t h) {
    union {
        uint32_t u;
        float f;
    } v;
    v.u = (uint32_t)h << 16;
    return v.f;
}

static inline float seq_silu(float x) { return x / (1.0f + expf(-x)); }
static inline float seq_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }
static inline float seq_softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

/* The polynomials of the vector exp and erfc, written once for every vector width: `fma` and `set1` are that
 * width's _mm*_fmadd_ps and _mm*_set1_ps. Horner form, highest coefficient first. */
/* e^r on |r| <= ln2/2: its degree-6 Taylor polynomial. */
#define SEQ_EXP_POLY(fma, set1, r)                                                                                 \
    fma(fma(fma(fma(fma(fma(set1(1.0f / 720.0f), r, set1(1.0f / 120.0f)), r, set1(1.0f / 24.0f)), r,            \
                    set1(1.0f / 6.0f)),                                                                          \
                r, set1(0.5f)),                                                                                  \
            r, set1(1.0f)),                                                                                      \
        r, set1(1.0f))
/* poly(t) of Numerical Recipes' erfcc, erfc(|u|) = t exp(-u^2 + poly(t)) with t = 1/(1 + |u|/2). */
#define SEQ_ERFC_POLY(fma, set1, t)                                                                                \
    fma(fma(fma(fma(fma(fma(fma(fma(fma(set1(0.17087277f), t, set1(-0.82215223f)), t, set1(1.48851587f)), t,      \
                                set1(-1.13520398f)),                                                             \
                            t, set1(0.27886807f)),                                                               \
                        t, set1(-0.18628806f)),                                                                  \
                    t, set1(0.09678418f)),                                                                       \
                t, set1(0.37409196f)),                                                                           \
            t, set1(1.00002368f)),                                                                               \
        t, set1(-1.26551223f))

#if defined(__AVX512F__)
#include <immintrin.h>

/* e^x for 16 lanes: x = n ln2 + r with |r| <= ln2/2, e^r from its degree-6 Taylor polynomial (relative error
 * about 1.2e-7 on that interval, ~1 ulp), then scaled by 2^n with vscalefps, which saturates to 0 / inf cleanly. */
static inline __m512 seq_exp512(__m512 x) {
    x = _mm512_max_ps(_mm512_min_ps(x, _mm512_set1_ps(88.7f)), _mm512_set1_ps(-104.0f));
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145752f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.42860677e-6f), r);
    const __m512 y = SEQ_EXP_POLY(_mm512_fmadd_ps, _mm512_set1_ps, r);
    return _mm512_scalef_ps(y, n);
}

static inline __m512 seq_silu512(__m512 x) {
    const __m512 e = seq_exp512(_mm512_sub_ps(_mm512_setzero_ps(), x));
    return _mm512_div_ps(x, _mm512_add_ps(_mm512_set1_ps(1.0f), e));
}

/* GELU with the exact erf: erfc(|u|) = t exp(-u^2 + poly(t)), t = 1/(1 + |u|/2), the Chebyshev fit of Numerical
 * Recipes' erfcc (fractional error below 1.2e-7 everywhere), u = x/sqrt(2). */
static inline __m512 seq_gelu512(__m512 x) {
    const __m512 u = _mm512_mul_ps(x, _mm512_set1_ps(0.70710678f));
    const __m512 au = _mm512_abs_ps(u);
    const __m512 t = _mm512_div_ps(_mm512_set1_ps(1.0f), _mm512_fmadd_ps(au, _mm512_set1_ps(0.5f), _mm512_set1_ps(1.0f)));
    const __m512 y = _mm512_fnmadd_ps(au, au, SEQ_ERFC_POLY(_mm512_fmadd_ps, _mm512_set1_ps, t));
    const __m512 erfc = _mm512_mul_ps(t, seq_exp512(y));
    /* erf(u) = 1 - erfc(|u|) for u >= 0, erfc(|u|) - 1 for u < 0; gelu = x/2 (1 + erf(u)). */
    const __mmask16 neg = _mm512_cmp_ps_mask(u, _mm512_setzero_ps(), _CMP_LT_OQ);
    const __m512 one_plus_erf = _mm512_mask_blend_ps(neg, _mm512_sub_ps(_mm512_set1_ps(2.0f), erfc), erfc);
    return _mm512_mul_ps(_mm512_mul_ps(x, _mm512_set1_ps(0.5f)), one_plus_erf);
}

static inline __mmask16 seq_tail_mask(int64_t left) { return left >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << left) - 1u); }

static inline float seq_hsum512(__m512 v) { return _mm512_reduce_add_ps(v); }
#endif

#define SEQ_DECLARE(suffix)                                                                                          \
    int gdn_conv##suffix(int64_t t, int64_t cd, int64_t kk, const float *x, const float *w, float *conv_state,       \
                         float *y, int64_t c0, int64_t c1);                                                          \
    int gdn_decode##suffix(const seq_gdn_args *p, int64_t item0, int64_t item1);                                     \
    int gdn_prefill##suffix(const seq_gdn_args *p, int64_t t, int64_t h0, int64_t h1, float *scratch);              \
    int attn_decode_paged##suffix(const seq_attn_args *p, int64_t item0, int64_t item1, float *scratch);            \
    int attn_decode_ring##suffix(const seq_attn_args *p, int64_t item0, int64_t item1, float *scratch);             \
    int attn_prefill##suffix(const seq_attn_args *p, int64_t t, int64_t item0, int64_t item1, float *scratch);      \
    int rope_neox##suffix(float *x, int64_t heads, int64_t d, int64_t rot, const uint32_t *positions,               \
                          const float *inv_freq, int64_t t0, int64_t t1, float *scratch);                           \
    int ops_rmsnorm##suffix(const float *x, const float *w, int64_t dim, int one_plus, float eps, float *out,       \
                            int64_t r0, int64_t r1);                                                                 \
    int ops_glu##suffix(const float *gate_up, int64_t inter, int gelu, float *out, int64_t r0, int64_t r1);        \
    int ops_fma_probe##suffix(int64_t iters, float *sink, int64_t *flops);

/* AVX-512 only: the blocked prefill (see attn_avx512.c) and the K transpose it reads. */
int attn_k_transpose_avx512(const seq_attn_args *p, int64_t t, int64_t tpad, float *kt);
int attn_prefill_blocked_avx512(const seq_attn_args *p, int64_t t, int64_t tpad, const float *kt, int64_t item0,
                                int64_t item1, float *scratch);

SEQ_DECLARE(_scalar)
SEQ_DECLARE(_avx2)
SEQ_DECLARE(_avx512)

#endif
