/* Attention, AVX2 + FMA. The online-softmax segment is hand-written (the generic one's dot products are float
 * reductions, which the compiler may not reorder, so it stayed scalar: about 0.27x the AVX-512 path in `cpu_seq`); the
 * walkers, the tile softmax and RoPE are the generic C of attn_impl.h compiled with AVX2 flags. Head-dim tails
 * that are not a multiple of 8 are finished in scalar code. */
#define SEQ_SUFFIX _avx2
#define SEQ_TAG 1
#define ATTN_CUSTOM_SEGMENT
#include "attn_impl.h"

#include <immintrin.h>

static inline float attn_hsum256(__m256 v) {
    const __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    const __m128 h = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(h, _mm_movehdup_ps(h)));
}

#define ATTN_LOAD8_F32(p) _mm256_loadu_ps(p)
#define ATTN_LOAD8_BF16(p) \
    _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(p))), 16))
#define ATTN_SCALAR_F32(x) (x)

/* Dot product, tile softmax (generic), and a value pass that keeps up to 8 query heads' accumulators for 8
 * columns in registers while the tile's value rows stream through. */
#define ATTN_DEFINE_AVX2(NAME, T, LOAD8, CVT)                                                                      \
    static inline float NAME##_dot(const float *a, const T *b, int64_t d) {                                       \
        __m256 s0 = _mm256_setzero_ps(), s1 = s0;                                                                   \
        int64_t x = 0;                                                                                              \
        for (; x + 16 <= d; x += 16) {                                                                              \
            s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + x), LOAD8(b + x), s0);                                         \
            s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + x + 8), LOAD8(b + x + 8), s1);                                 \
        }                                                                                                           \
        for (; x + 8 <= d; x += 8) s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + x), LOAD8(b + x), s0);                 \
        float s = attn_hsum256(_mm256_add_ps(s0, s1));                                                              \
        for (; x < d; x++) s += a[x] * CVT(b[x]);                                                                   \
        return s;                                                                                                   \
    }                                                                                                               \
    static void NAME(attn_state *st, const float *q, float scale, const T *k, const T *v, int64_t row_stride,      \
                     int64_t n) {                                                                                   \
        const int64_t g = st->g, d = st->d, d8 = d & ~(int64_t)7;                                                   \
        for (int64_t t0 = 0; t0 < n; t0 += ATTN_TILE) {                                                             \
            const int64_t nt = n - t0 < ATTN_TILE ? n - t0 : ATTN_TILE;                                             \
            for (int64_t j = 0; j < nt; j++) {                                                                      \
                const T *kr = k + (t0 + j) * row_stride;                                                            \
                for (int64_t i = 0; i < g; i++) st->sc[i * ATTN_TILE + j] = NAME##_dot(q + i * d, kr, d) * scale;  \
            }                                                                                                       \
            attn_softmax_tile_avx2(st, nt);                                                                         \
            for (int64_t i0 = 0; i0 < g; i0 += 8) {                                                                 \
                const int64_t gi = g - i0 < 8 ? g - i0 : 8;                                                         \
                for (int64_t x = 0; x < d8; x += 8) {                                                               \
                    __m256 acc[8];                                                                                  \
                    for (int64_t i = 0; i < gi; i++) acc[i] = _mm256_loadu_ps(st->acc + (i0 + i) * d + x);          \
                    for (int64_t j = 0; j < nt; j++) {                                                              \
                        const __m256 vv = LOAD8(v + (t0 + j) * row_stride + x);                                     \
                        for (int64_t i = 0; i < gi; i++)                                                            \
                            acc[i] = _mm256_fmadd_ps(_mm256_set1_ps(st->sc[(i0 + i) * ATTN_TILE + j]), vv, acc[i]); \
                    }                                                                                               \
                    for (int64_t i = 0; i < gi; i++) _mm256_storeu_ps(st->acc + (i0 + i) * d + x, acc[i]);          \
                }                                                                                                   \
            }                                                                                                       \
            for (int64_t j = 0; j < nt && d8 < d; j++) {                                                            \
                const T *vr = v + (t0 + j) * row_stride;                                                            \
                for (int64_t i = 0; i < g; i++)                                                                     \
                    for (int64_t x = d8; x < d; x++) st->acc[i * d + x] += st->sc[i * ATTN_TILE + j] * CVT(vr[x]);  \
            }                                                                                                       \
        }                                                                                                           \
    }

ATTN_DEFINE_AVX2(attn_segment_avx2, float, ATTN_LOAD8_F32, ATTN_SCALAR_F32)
ATTN_DEFINE_AVX2(attn_segment_bf16_avx2, uint16_t, ATTN_LOAD8_BF16, seq_bf16_to_f32)
