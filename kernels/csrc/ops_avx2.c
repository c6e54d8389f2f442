/* Small ops, AVX2 + FMA: SiLU and GELU(erf) with 8-lane versions of the vector exp / erfc of seq_common.h (libm's
 * expf / erff do not vectorise, so the generic build left them scalar), RMSNorm from the generic C of ops_impl.h
 * compiled with AVX2 flags. Tails past a multiple of 8 use the scalar formulas. */
#define SEQ_SUFFIX _avx2
#define SEQ_TAG 1
#define OPS_CUSTOM_GLU
#include "ops_impl.h"

#include <immintrin.h>

/* e^x for 8 lanes: same range reduction and degree-6 polynomial as seq_exp512; 2^n is built in the exponent
 * field (n clamped to the normal range, so tiny results flush to 0 instead of going subnormal). */
static inline __m256 ops_exp256(__m256 x) {
    x = _mm256_max_ps(_mm256_min_ps(x, _mm256_set1_ps(88.3f)), _mm256_set1_ps(-87.3f));
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504f)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693145752f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(1.42860677e-6f), r);
    const __m256 y = SEQ_EXP_POLY(_mm256_fmadd_ps, _mm256_set1_ps, r);
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(y, _mm256_castsi256_ps(e));
}

static inline __m256 ops_silu256(__m256 x) {
    return _mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.0f), ops_exp256(_mm256_sub_ps(_mm256_setzero_ps(), x))));
}

/* GELU(erf) with the erfc fit of seq_gelu512. */
static inline __m256 ops_gelu256(__m256 x) {
    const __m256 u = _mm256_mul_ps(x, _mm256_set1_ps(0.70710678f));
    const __m256 au = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), u);
    const __m256 t = _mm256_div_ps(_mm256_set1_ps(1.0f), _mm256_fmadd_ps(au, _mm256_set1_ps(0.5f), _mm256_set1_ps(1.0f)));
    const __m256 y = _mm256_fnmadd_ps(au, au, SEQ_ERFC_POLY(_mm256_fmadd_ps, _mm256_set1_ps, t));
    const __m256 erfc = _mm256_mul_ps(t, ops_exp256(y));
    const __m256 neg = _mm256_cmp_ps(u, _mm256_setzero_ps(), _CMP_LT_OQ);
    const __m256 one_plus_erf = _mm256_blendv_ps(_mm256_sub_ps(_mm256_set1_ps(2.0f), erfc), erfc, neg);
    return _mm256_mul_ps(_mm256_mul_ps(x, _mm256_set1_ps(0.5f)), one_plus_erf);
}

int ops_glu_avx2(const float *gate_up, int64_t inter, int gelu, float *out, int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; r++) {
        const float *g = gate_up + r * 2 * inter, *u = g + inter;
        float *o = out + r * inter;
        int64_t i = 0;
        for (; i + 8 <= inter; i += 8) {
            const __m256 gv = _mm256_loadu_ps(g + i);
            const __m256 a = gelu ? ops_gelu256(gv) : ops_silu256(gv);
            _mm256_storeu_ps(o + i, _mm256_mul_ps(a, _mm256_loadu_ps(u + i)));
        }
        for (; i < inter; i++)
            o[i] = (gelu ? 0.5f * g[i] * (1.0f + erff(g[i] * 0.70710678f)) : seq_silu(g[i])) * u[i];
    }
    return SEQ_TAG;
}
