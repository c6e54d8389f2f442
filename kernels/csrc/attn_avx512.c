/* Attention, AVX-512. Decode: the online-softmax segment is hand-written for f32 and bf16 caches (bf16 widened in
 * registers): each 16-column chunk of a key row is loaded once and multiplied into the accumulators of every query
 * head of the group, the tile softmax uses the vector exp, and the value pass keeps the group's accumulators in
 * registers while the tile's value rows stream through, so each K/V row is read from memory once per KV head.
 * The paged walker for the common shapes is the streaming kernel further down (two keys at a time, batched
 * reductions, bf16 widened without shuffles); other shapes and the ring walker use the segments here. Prefill: the
 * blocked kernel at the end of this file. The ring walker, the generic paged walker and RoPE are the generic C of
 * attn_impl.h compiled with AVX-512 flags. */
#define SEQ_SUFFIX _avx512
#define SEQ_TAG 2
#define ATTN_CUSTOM_SEGMENT
#define ATTN_CUSTOM_PAGED
#include "attn_impl.h"

/* Software prefetch: while a tile's keys are scored, its value rows and the next tile's key rows are requested.
 * The score pass does g dot products per key row, so the core issues loads slowly and the hardware prefetcher
 * alone left it waiting on memory (perf: the hottest instructions were the ones right after the K and V loads).
 * Measured together with the one-load-per-chunk scores, in three alternating A/B runs of `cpu_seq` (768 MiB
 * caches, ctx 8192): bf16 147/155/94 ms against 152/244/255 ms before, f32 faster in two runs of three; this
 * shared machine's own read bandwidth swung 5-11 GB/s between those runs, so re-measure on a quiet host. */
static inline void attn_prefetch_row(const void *p, int64_t bytes) {
    for (int64_t b = 0; b < bytes; b += 64) _mm_prefetch((const char *)p + b, _MM_HINT_T0);
}

#define ATTN_LOAD_F32(m, p) _mm512_maskz_loadu_ps((m), (p))
#define ATTN_LOAD_BF16(m, p) \
    _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16((m), (p))), 16))

/* Tile softmax for 16 lanes at a time: new running max, probabilities e^{s - m} in place (zero past nt), the
 * running sum, and the accumulator rescaled by e^{m_old - m_new}. */
static void attn_softmax_tile512(attn_state *st, int64_t nt) {
    const __mmask16 m0 = seq_tail_mask(nt), m1 = nt > 16 ? seq_tail_mask(nt - 16) : (__mmask16)0;
    const __m512 ninf = _mm512_set1_ps(-INFINITY);
    for (int64_t i = 0; i < st->g; i++) {
        float *sc = st->sc + i * ATTN_TILE;
        const __m512 s0 = _mm512_mask_loadu_ps(ninf, m0, sc), s1 = _mm512_mask_loadu_ps(ninf, m1, sc + 16);
        const float tile_max = _mm512_reduce_max_ps(_mm512_max_ps(s0, s1));
        const float mx = tile_max > st->m[i] ? tile_max : st->m[i];
        const __m512 vm = _mm512_set1_ps(mx);
        const __m512 p0 = _mm512_maskz_mov_ps(m0, seq_exp512(_mm512_sub_ps(s0, vm)));
        const __m512 p1 = _mm512_maskz_mov_ps(m1, seq_exp512(_mm512_sub_ps(s1, vm)));
        _mm512_storeu_ps(sc, p0);
        _mm512_storeu_ps(sc + 16, p1);
        const float corr = expf(st->m[i] - mx);
        st->l[i] = st->l[i] * corr + _mm512_reduce_add_ps(_mm512_add_ps(p0, p1));
        st->m[i] = mx;
        if (corr != 1.0f) {
            const __m512 c = _mm512_set1_ps(corr);
            float *a = st->acc + i * st->d;
            for (int64_t x = 0; x < st->d; x += 16) {
                const __mmask16 m = seq_tail_mask(st->d - x);
                _mm512_mask_storeu_ps(a + x, m, _mm512_mul_ps(c, _mm512_maskz_loadu_ps(m, a + x)));
            }
        }
    }
}

/* Value pass of one tile for the 16 columns at x: the accumulators of all G query heads stay in registers while
 * the tile's value rows stream through (G is a constant in each specialised call, so they really are registers). */
#define ATTN_VPASS_BODY(G, T, LOAD)                                                                                \
    do {                                                                                                            \
        __m512 acc[G];                                                                                              \
        for (int i = 0; i < (G); i++) acc[i] = _mm512_maskz_loadu_ps(m, st->acc + i * st->d + x);                  \
        for (int64_t j = 0; j < nt; j++) {                                                                          \
            const __m512 vv = LOAD(m, v + j * row_stride);                                                          \
            for (int i = 0; i < (G); i++)                                                                           \
                acc[i] = _mm512_fmadd_ps(_mm512_set1_ps(st->sc[i * ATTN_TILE + j]), vv, acc[i]);                   \
        }                                                                                                           \
        for (int i = 0; i < (G); i++) _mm512_mask_storeu_ps(st->acc + i * st->d + x, m, acc[i]);                   \
    } while (0)

#define ATTN_SCORES_BODY(G, LOAD)                                                                                  \
    do {                                                                                                            \
        __m512 acc[G];                                                                                              \
        for (int i = 0; i < (G); i++) acc[i] = _mm512_setzero_ps();                                                 \
        for (int64_t x = 0; x < d; x += 16) {                                                                       \
            const __mmask16 m = seq_tail_mask(d - x);                                                               \
            const __m512 kc = LOAD(m, kr + x);                                                                      \
            for (int i = 0; i < (G); i++) acc[i] = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, q + i * d + x), kc, acc[i]); \
        }                                                                                                           \
        for (int i = 0; i < (G); i++) st->sc[i * ATTN_TILE + j] = _mm512_reduce_add_ps(acc[i]) * scale;             \
    } while (0)

#define ATTN_DEFINE_VPASS(SUF, T, LOAD)                                                                            \
    static void attn_vpass##SUF(attn_state *st, const T *v, int64_t row_stride, int64_t nt, __mmask16 m,          \
                                int64_t x) {                                                                        \
        switch (st->g) {                                                                                            \
        case 1: ATTN_VPASS_BODY(1, T, LOAD); return;                                                                \
        case 2: ATTN_VPASS_BODY(2, T, LOAD); return;                                                                \
        case 3: ATTN_VPASS_BODY(3, T, LOAD); return;                                                                \
        case 4: ATTN_VPASS_BODY(4, T, LOAD); return;                                                                \
        case 6: ATTN_VPASS_BODY(6, T, LOAD); return;                                                                \
        case 8: ATTN_VPASS_BODY(8, T, LOAD); return;                                                                \
        default: break;                                                                                             \
        }                                                                                                           \
        for (int64_t j = 0; j < nt; j++) {                                                                          \
            const __m512 vv = LOAD(m, v + j * row_stride);                                                          \
            for (int64_t i = 0; i < st->g; i++) {                                                                   \
                float *a = st->acc + i * st->d + x;                                                                 \
                _mm512_mask_storeu_ps(a, m, _mm512_fmadd_ps(_mm512_set1_ps(st->sc[i * ATTN_TILE + j]), vv,         \
                                                            _mm512_maskz_loadu_ps(m, a)));                         \
            }                                                                                                       \
        }                                                                                                           \
    }

/* Generates the dot product and the segment for one cache element type; bf16 rows are widened in registers
 * (a shift: bf16 is the high half of an f32), so a bf16 cache streams half the bytes for the same arithmetic. */
#define ATTN_DEFINE_AVX512(SUF, T, LOAD)                                                                           \
    static inline float attn_dot512##SUF(const float *a, const T *b, int64_t d) {                                 \
        __m512 s0 = _mm512_setzero_ps(), s1 = s0;                                                                   \
        int64_t x = 0;                                                                                              \
        for (; x + 32 <= d; x += 32) {                                                                              \
            s0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + x), LOAD((__mmask16)0xFFFF, b + x), s0);                       \
            s1 = _mm512_fmadd_ps(_mm512_loadu_ps(a + x + 16), LOAD((__mmask16)0xFFFF, b + x + 16), s1);             \
        }                                                                                                           \
        for (; x < d; x += 16) {                                                                                    \
            const __mmask16 m = seq_tail_mask(d - x);                                                               \
            s0 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + x), LOAD(m, b + x), s0);                             \
        }                                                                                                           \
        return seq_hsum512(_mm512_add_ps(s0, s1));                                                                  \
    }                                                                                                               \
    /* Scores of one key row against all g query rows: each 16-column chunk of the row is loaded (and, for bf16,  \
     * widened) once and multiplied into g accumulators; g is a constant in the specialised cases. */              \
    static void attn_scores##SUF(attn_state *st, const float *q, const T *kr, int64_t j, float scale) {           \
        const int64_t d = st->d;                                                                                    \
        switch (st->g) {                                                                                            \
        case 1: ATTN_SCORES_BODY(1, LOAD); return;                                                                  \
        case 2: ATTN_SCORES_BODY(2, LOAD); return;                                                                  \
        case 3: ATTN_SCORES_BODY(3, LOAD); return;                                                                  \
        case 4: ATTN_SCORES_BODY(4, LOAD); return;                                                                  \
        case 6: ATTN_SCORES_BODY(6, LOAD); return;                                                                  \
        case 8: ATTN_SCORES_BODY(8, LOAD); return;                                                                  \
        default: break;                                                                                             \
        }                                                                                                           \
        for (int64_t i = 0; i < st->g; i++) st->sc[i * ATTN_TILE + j] = attn_dot512##SUF(q + i * d, kr, d) * scale; \
    }                                                                                                               \
    static void attn_segment##SUF(attn_state *st, const float *q, float scale, const T *k, const T *v,             \
                                  int64_t row_stride, int64_t n) {                                                  \
        const int64_t d = st->d;                                                                                    \
        for (int64_t t0 = 0; t0 < n; t0 += ATTN_TILE) {                                                             \
            const int64_t nt = n - t0 < ATTN_TILE ? n - t0 : ATTN_TILE;                                             \
            for (int64_t j = 0; j < nt; j++) {                                                                      \
                const T *kr = k + (t0 + j) * row_stride;                                                            \
                attn_prefetch_row(v + (t0 + j) * row_stride, d * (int64_t)sizeof(T));                              \
                if (t0 + ATTN_TILE + j < n)                                                                         \
                    attn_prefetch_row(kr + ATTN_TILE * row_stride, d * (int64_t)sizeof(T));                         \
                attn_scores##SUF(st, q, kr, j, scale);                                                              \
            }                                                                                                       \
            attn_softmax_tile512(st, nt);                                                                           \
            for (int64_t x = 0; x < d; x += 16)                                                                     \
                attn_vpass##SUF(st, v + t0 * row_stride + x, row_stride, nt, seq_tail_mask(d - x), x);              \
        }                                                                                                           \
    }

ATTN_DEFINE_VPASS(_avx512, float, ATTN_LOAD_F32)
ATTN_DEFINE_VPASS(_bf16_avx512, uint16_t, ATTN_LOAD_BF16)
ATTN_DEFINE_AVX512(_avx512, float, ATTN_LOAD_F32)
ATTN_DEFINE_AVX512(_bf16_avx512, uint16_t, ATTN_LOAD_BF16)

/* ---- Paged decode, streaming kernel --------------------------------------------------------------------------
 * For head dims that are a multiple of 32 (up to ATTN_FAST_MAXD) and groups of 2, 3, 4, 6 or 8 query heads, the
 * paged walker below runs a kernel built to keep up with the memory stream (issue 3's target: >= 0.8 of the read
 * bandwidth); other shapes take the generic walker with the segments above.
 * - Scores: two key rows at a time against all G query heads (2G accumulators), so each query chunk loaded from L1
 *   feeds two FMAs; the 16-lane partial sums of 16 keys are then reduced together by a transposing add tree (about
 *   2 shuffles per score instead of the 4 of a horizontal sum each).
 * - bf16 rows are widened without a cross-lane shuffle: 32 bf16 loaded as 16 dwords give the even columns by a
 *   shift left of 16 and the odd ones by masking the high half. The query and the accumulators use the same
 *   even/odd order inside each 32 columns (the query is permuted once per item, the output un-permuted at the end),
 *   so dot products and the value pass need no reordering.
 * - The value pass keeps 32 columns of the G accumulators in registers while the tile's value rows stream through.
 * - Prefetch: while a tile's keys are scored, its value rows and the next tile's key rows (across the page boundary,
 *   through the block table) are requested into L2.
 * Measured against the per-key-row segments above (`cpu_seq`, Qwen3.8 geometry, 768 MiB caches, 4k-32k context,
 * runs alternating on this shared 2-core VM, the two quiet rounds): bf16 98-108 -> 85-86 ms per pass on 1 thread
 * and 51-54 -> 43-44 ms on 2 (0.74-0.82 -> 0.86-0.89 of the read bandwidth); f32 84-86 -> 82-84 ms, within the
 * spread (0.89-0.90 -> 0.88-0.94: f32 already streamed at the bandwidth). From a 4 MiB cache (compute only) bf16
 * 9-10 -> 13-14 GB/s and f32 15 -> 17-19 GB/s on one core, a margin over its 11-16 GB/s of DRAM read. */
#define ATTN_FAST_MAXD 512
/* Prefetch distance and level: the key rows of the next tile and the value rows of this one, into L2. Measured
 * (`cpu_seq`, 768 MiB caches, alternating runs, 1 thread): into L2 rather than L1 3-4% faster for f32 and bf16
 * (beyond a 1-2% spread; 32 KiB of f32 keys plus 32 KiB of values per tile overflow the 48 KiB L1); keys two
 * tiles ahead (with or without values one tile ahead) no faster beyond the spread; no software prefetch at all
 * 0.52-0.66 of the read bandwidth against 0.87-0.96. */
#define ATTN_PF_K 1
#define ATTN_PF_V 0
#define ATTN_PF_HINT _MM_HINT_T1

/* Sums of 16 vectors: out lane j = sum of the 16 lanes of a[j]. The add tree leaves lane 4c+s holding input
 * 4s+c, so the inputs are read in that order. */
static inline __m512 attn_reduce16(const __m512 *a) {
    __m512 t[8], u[4], v[2];
    for (int p = 0; p < 8; p++) {
        const int i0 = 2 * p, i1 = 2 * p + 1;
        const __m512 x = a[4 * (i0 % 4) + i0 / 4], y = a[4 * (i1 % 4) + i1 / 4];
        t[p] = _mm512_add_ps(_mm512_shuffle_f32x4(x, y, 0x44), _mm512_shuffle_f32x4(x, y, 0xEE));
    }
    for (int q = 0; q < 4; q++)
        u[q] = _mm512_add_ps(_mm512_shuffle_f32x4(t[2 * q], t[2 * q + 1], 0x88),
                             _mm512_shuffle_f32x4(t[2 * q], t[2 * q + 1], 0xDD));
    for (int r = 0; r < 2; r++)
        v[r] = _mm512_add_ps(_mm512_unpacklo_ps(u[2 * r], u[2 * r + 1]), _mm512_unpackhi_ps(u[2 * r], u[2 * r + 1]));
    return _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(v[0]), _mm512_castps_pd(v[1]))),
                         _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(v[0]), _mm512_castps_pd(v[1]))));
}

/* 32 columns of a row as two f32 vectors (for bf16: even columns, odd columns). */
#define ATTN_ROW32_F32(p, lo, hi)                                                                                  \
    do {                                                                                                            \
        (lo) = _mm512_loadu_ps((const float *)(p));                                                                 \
        (hi) = _mm512_loadu_ps((const float *)(p) + 16);                                                            \
    } while (0)
#define ATTN_ROW32_BF16(p, lo, hi)                                                                                 \
    do {                                                                                                            \
        const __m512i w_ = _mm512_loadu_si512((const void *)(p));                                                   \
        (lo) = _mm512_castsi512_ps(_mm512_slli_epi32(w_, 16));                                                      \
        (hi) = _mm512_castsi512_ps(_mm512_and_si512(w_, _mm512_set1_epi32((int)0xFFFF0000u)));                     \
    } while (0)

static inline void attn_prefetch_rows(const void *p, int64_t bytes) {
    for (int64_t b = 0; b < bytes; b += 64) _mm_prefetch((const char *)p + b, ATTN_PF_HINT);
}

/* One page segment of n rows (row stride d) for G query heads; q in the element type's column order; kn, vn:
 * the next segment's rows (NULL at the end), prefetched once this segment's rows run out. */
#define ATTN_DEFINE_FAST(SUF, T, ROW32, G)                                                                         \
    static void attn_fast##SUF##_g##G(attn_state *st, const float *q, float scale, const T *k, const T *v,       \
                                      int64_t n, const T *kn, const T *vn) {                                        \
        const int64_t d = st->d;                                                                                    \
        const int64_t rb = d * (int64_t)sizeof(T);                                                                  \
        __m512 part[(G) * 16];                                                                                      \
        for (int64_t t0 = 0; t0 < n; t0 += ATTN_TILE) {                                                             \
            const int64_t nt = n - t0 < ATTN_TILE ? n - t0 : ATTN_TILE;                                             \
            for (int64_t j0 = 0; j0 < nt; j0 += 16) {                                                               \
                const int64_t nk = nt - j0 < 16 ? nt - j0 : 16;                                                     \
                for (int64_t jj = 0; jj < nk; jj += 2) {                                                            \
                    const int64_t j = t0 + j0 + jj;                                                                 \
                    const T *k0 = k + j * d, *k1 = jj + 1 < nk ? k0 + d : k0;                                       \
                    for (int64_t r = 0; r < 2; r++) {                                                               \
                        const int64_t nk_ = j + r + ATTN_PF_K * ATTN_TILE, nv_ = j + r + ATTN_PF_V * ATTN_TILE;     \
                        if (nk_ < n)                                                                                \
                            attn_prefetch_rows(k + nk_ * d, rb);                                                    \
                        else if (kn)                                                                                \
                            attn_prefetch_rows(kn + (nk_ - n) * d, rb);                                             \
                        if (nv_ < n)                                                                                \
                            attn_prefetch_rows(v + nv_ * d, rb);                                                    \
                        else if (vn)                                                                                \
                            attn_prefetch_rows(vn + (nv_ - n) * d, rb);                                             \
                    }                                                                                               \
                    __m512 a0[G], a1[G];                                                                            \
                    for (int i = 0; i < (G); i++) a0[i] = a1[i] = _mm512_setzero_ps();                              \
                    for (int64_t x = 0; x < d; x += 32) {                                                           \
                        __m512 k0l, k0h, k1l, k1h;                                                                  \
                        ROW32(k0 + x, k0l, k0h);                                                                    \
                        ROW32(k1 + x, k1l, k1h);                                                                    \
                        for (int i = 0; i < (G); i++) {                                                             \
                            const __m512 ql = _mm512_loadu_ps(q + i * d + x);                                       \
                            const __m512 qh = _mm512_loadu_ps(q + i * d + x + 16);                                  \
                            a0[i] = _mm512_fmadd_ps(ql, k0l, a0[i]);                                                \
                            a1[i] = _mm512_fmadd_ps(ql, k1l, a1[i]);                                                \
                            a0[i] = _mm512_fmadd_ps(qh, k0h, a0[i]);                                                \
                            a1[i] = _mm512_fmadd_ps(qh, k1h, a1[i]);                                                \
                        }                                                                                           \
                    }                                                                                               \
                    for (int i = 0; i < (G); i++) {                                                                 \
                        part[i * 16 + jj] = a0[i];                                                                  \
                        part[i * 16 + jj + 1] = a1[i];                                                              \
                    }                                                                                               \
                }                                                                                                   \
                for (int i = 0; i < (G); i++) {                                                                     \
                    for (int64_t jj = (nk + 1) & ~(int64_t)1; jj < 16; jj++) part[i * 16 + jj] = _mm512_setzero_ps(); \
                    _mm512_storeu_ps(st->sc + i * ATTN_TILE + j0,                                                   \
                                     _mm512_mul_ps(attn_reduce16(part + i * 16), _mm512_set1_ps(scale)));           \
                }                                                                                                   \
            }                                                                                                       \
            attn_softmax_tile512(st, nt);                                                                           \
            const T *vt = v + t0 * d;                                                                               \
            for (int64_t x = 0; x < d; x += 32) {                                                                   \
                __m512 lo[G], hi[G];                                                                                \
                for (int i = 0; i < (G); i++) {                                                                     \
                    lo[i] = _mm512_loadu_ps(st->acc + i * d + x);                                                   \
                    hi[i] = _mm512_loadu_ps(st->acc + i * d + x + 16);                                              \
                }                                                                                                   \
                for (int64_t j = 0; j < nt; j++) {                                                                  \
                    __m512 vl, vh;                                                                                  \
                    ROW32(vt + j * d + x, vl, vh);                                                                  \
                    for (int i = 0; i < (G); i++) {                                                                 \
                        const __m512 pj = _mm512_set1_ps(st->sc[i * ATTN_TILE + j]);                                \
                        lo[i] = _mm512_fmadd_ps(pj, vl, lo[i]);                                                     \
                        hi[i] = _mm512_fmadd_ps(pj, vh, hi[i]);                                                     \
                    }                                                                                               \
                }                                                                                                   \
                for (int i = 0; i < (G); i++) {                                                                     \
                    _mm512_storeu_ps(st->acc + i * d + x, lo[i]);                                                   \
                    _mm512_storeu_ps(st->acc + i * d + x + 16, hi[i]);                                              \
                }                                                                                                   \
            }                                                                                                       \
        }                                                                                                           \
    }

#define ATTN_DEFINE_FAST_ALL(SUF, T, ROW32)                                                                        \
    ATTN_DEFINE_FAST(SUF, T, ROW32, 2)                                                                             \
    ATTN_DEFINE_FAST(SUF, T, ROW32, 3)                                                                             \
    ATTN_DEFINE_FAST(SUF, T, ROW32, 4)                                                                             \
    ATTN_DEFINE_FAST(SUF, T, ROW32, 6)                                                                             \
    ATTN_DEFINE_FAST(SUF, T, ROW32, 8)                                                                             \
    typedef void (*attn_fast_fn##SUF)(attn_state *, const float *, float, const T *, const T *, int64_t,           \
                                      const T *, const T *);                                                    \
    static attn_fast_fn##SUF attn_fast_pick##SUF(int64_t g) {                                                       \
        switch (g) {                                                                                                \
        case 2: return attn_fast##SUF##_g2;                                                                         \
        case 3: return attn_fast##SUF##_g3;                                                                         \
        case 4: return attn_fast##SUF##_g4;                                                                         \
        case 6: return attn_fast##SUF##_g6;                                                                         \
        case 8: return attn_fast##SUF##_g8;                                                                         \
        default: return NULL;                                                                                       \
        }                                                                                                           \
    }

ATTN_DEFINE_FAST_ALL(_f32, float, ATTN_ROW32_F32)
ATTN_DEFINE_FAST_ALL(_bf16, uint16_t, ATTN_ROW32_BF16)

/* Paged decode for items [item0, item1) of (sequence b, KV head): the streaming kernel where the shape allows it
 * (both element types share the group list, so one pick decides), else the generic walker of attn_impl.h. */
int attn_decode_paged_avx512(const seq_attn_args *p, int64_t item0, int64_t item1, float *scratch) {
    const int64_t hq = p->hq, hkv = p->hkv, d = p->d, g = hq / hkv, ps = p->page_size;
    const attn_fast_fn_f32 f32_fn = attn_fast_pick_f32(g);
    const attn_fast_fn_bf16 bf16_fn = attn_fast_pick_bf16(g);
    if (d % 32 != 0 || d > ATTN_FAST_MAXD || !f32_fn) return attn_decode_paged_generic_avx512(p, item0, item1, scratch);
    /* The query in the bf16 column order (even columns, then odd, in each 32), and the un-permuting index. */
    float qp[8 * ATTN_FAST_MAXD];
    const __m512i lo_idx = _mm512_set_epi32(23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    const __m512i hi_idx = _mm512_set_epi32(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8);
    for (int64_t it = item0; it < item1; it++) {
        const int64_t b = it / hkv, kvh = it % hkv, len = p->lens[b];
        attn_state st = attn_begin_avx512(scratch, g, d);
        const float *q = p->q + (b * hq + kvh * g) * d;
        float *out = p->out + (b * hq + kvh * g) * d;
        if (p->kv_bf16)
            for (int64_t i = 0; i < g * d; i += 32)
                for (int64_t l = 0; l < 16; l++) {
                    qp[i + l] = q[i + 2 * l];
                    qp[i + 16 + l] = q[i + 2 * l + 1];
                }
        for (int64_t p0 = 0; p0 < len; p0 += ps) {
            const int64_t n = len - p0 < ps ? len - p0 : ps;
            const int64_t off = ((p->block_table[b * p->max_pages + p0 / ps] * hkv + kvh) * ps) * d;
            /* The next page of this sequence, for the prefetch across the boundary; -1 on the last page. */
            const int64_t noff =
                p0 + ps < len ? ((p->block_table[b * p->max_pages + p0 / ps + 1] * hkv + kvh) * ps) * d : -1;
            if (p->kv_bf16) {
                const uint16_t *k = (const uint16_t *)p->k_pages, *v = (const uint16_t *)p->v_pages;
                bf16_fn(&st, qp, p->scale, k + off, v + off, n, noff >= 0 ? k + noff : NULL,
                        noff >= 0 ? v + noff : NULL);
            } else {
                const float *k = (const float *)p->k_pages, *v = (const float *)p->v_pages;
                f32_fn(&st, q, p->scale, k + off, v + off, n, noff >= 0 ? k + noff : NULL,
                       noff >= 0 ? v + noff : NULL);
            }
        }
        if (p->kv_bf16) {
            for (int64_t i = 0; i < g; i++) {
                const __m512 r = _mm512_set1_ps(1.0f / st.l[i]);
                for (int64_t x = 0; x < d; x += 32) {
                    const __m512 e = _mm512_loadu_ps(st.acc + i * d + x), o = _mm512_loadu_ps(st.acc + i * d + x + 16);
                    _mm512_storeu_ps(out + i * d + x, _mm512_mul_ps(r, _mm512_permutex2var_ps(e, lo_idx, o)));
                    _mm512_storeu_ps(out + i * d + x + 16, _mm512_mul_ps(r, _mm512_permutex2var_ps(e, hi_idx, o)));
                }
            }
        } else {
            attn_finish_avx512(&st, out);
        }
    }
    return SEQ_TAG;
}

/* ---- Blocked causal prefill ----------------------------------------------------------------------------------
 * The per-query prefill above spends its time in horizontal sums (one per query row and key). Here a block of
 * ATTN_BQ query tokens times the g heads of one KV head (R = ATTN_BQ * g rows) is scored against a tile of 32 keys
 * as a small GEMM against K transposed once per call (KT: [hkv][d][tpad], zero past t): 4 rows x 32 keys of scores
 * in registers, no horizontal sums. The value pass is a 4-row x 64-column register tile over the tile's 32 value
 * rows. Masks (causal, window) are applied per row on the scores. */
#define ATTN_BQ 16
#define ATTN_MAX_ROWS 256

int attn_k_transpose_avx512(const seq_attn_args *p, int64_t t, int64_t tpad, float *kt) {
    const int64_t hkv = p->hkv, d = p->d;
    for (int64_t h = 0; h < hkv; h++) {
        float *dst = kt + h * d * tpad;
        for (int64_t j = 0; j < t; j++) {
            const float *src = p->k + (j * hkv + h) * d;
            for (int64_t x = 0; x < d; x++) dst[x * tpad + j] = src[x];
        }
        for (int64_t x = 0; x < d; x++)
            for (int64_t j = t; j < tpad; j++) dst[x * tpad + j] = 0.0f;
    }
    return SEQ_TAG;
}

int attn_prefill_blocked_avx512(const seq_attn_args *p, int64_t t, int64_t tpad, const float *kt, int64_t item0,
                                int64_t item1, float *scratch) {
    const int64_t hq = p->hq, hkv = p->hkv, d = p->d, g = hq / hkv, W = p->window;
    const int64_t nb = (t + ATTN_BQ - 1) / ATTN_BQ;
    const int64_t R4 = (ATTN_BQ * g + 3) & ~(int64_t)3;
    float *S = scratch, *O = S + R4 * ATTN_TILE, *M = O + R4 * d, *L = M + R4, *zero = L + R4;
    const float *qrow[ATTN_MAX_ROWS];
    int64_t tok[ATTN_MAX_ROWS];
    const __m512i lane = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
    const __m512 ninf = _mm512_set1_ps(-INFINITY), vscale = _mm512_set1_ps(p->scale);
    for (int64_t x = 0; x < d; x++) zero[x] = 0.0f;
    for (int64_t it = item0; it < item1; it++) {
        /* Zig-zag block order (0, nb-1, 1, nb-2, ...): causal blocks grow with their index, so contiguous item
         * ranges handed to threads then carry equal work. */
        const int64_t kvh = it % hkv, idx = it / hkv;
        const int64_t blk = (idx % 2 == 0) ? idx / 2 : nb - 1 - idx / 2;
        const int64_t i0 = blk * ATTN_BQ, i1 = i0 + ATTN_BQ < t ? i0 + ATTN_BQ : t;
        for (int64_t r = 0; r < R4; r++) {
            const int64_t i = i0 + r / g;
            const int valid = r < ATTN_BQ * g && i < i1;
            qrow[r] = valid ? p->q + (i * hq + kvh * g + r % g) * d : zero;
            tok[r] = valid ? i : -1;
            M[r] = -INFINITY;
            L[r] = 0.0f;
        }
        for (int64_t x = 0; x < R4 * d; x++) O[x] = 0.0f;
        const int64_t lo = W > 0 && i0 + 1 > W ? i0 + 1 - W : 0;
        const float *ktb = kt + kvh * d * tpad;
        for (int64_t j0 = lo & ~(int64_t)(ATTN_TILE - 1); j0 < i1; j0 += ATTN_TILE) {
            const int64_t nt = i1 - j0 < ATTN_TILE ? i1 - j0 : ATTN_TILE;
            /* Scores, 4 rows x 32 keys per register tile, then the causal / window mask and the row softmax. */
            for (int64_t r0 = 0; r0 < R4; r0 += 4) {
                __m512 a[4][2];
                for (int r = 0; r < 4; r++) a[r][0] = a[r][1] = _mm512_setzero_ps();
                for (int64_t x = 0; x < d; x++) {
                    const __m512 k0 = _mm512_loadu_ps(ktb + x * tpad + j0), k1 = _mm512_loadu_ps(ktb + x * tpad + j0 + 16);
                    for (int r = 0; r < 4; r++) {
                        const __m512 qb = _mm512_set1_ps(qrow[r0 + r][x]);
                        a[r][0] = _mm512_fmadd_ps(qb, k0, a[r][0]);
                        a[r][1] = _mm512_fmadd_ps(qb, k1, a[r][1]);
                    }
                }
                for (int r = 0; r < 4; r++) {
                    const int64_t row = r0 + r, i = tok[row];
                    float *sc = S + row * ATTN_TILE;
                    /* key j = j0 + lane is visible iff j <= i and (no window or j > i - W). */
                    const __m512i j_0 = _mm512_add_epi32(lane, _mm512_set1_epi32((int)j0));
                    const __m512i j_1 = _mm512_add_epi32(j_0, _mm512_set1_epi32(16));
                    const __m512i vi = _mm512_set1_epi32((int)i);
                    const __m512i vlo = _mm512_set1_epi32(W > 0 ? (int)(i - W) : -1);
                    __mmask16 m0 = _mm512_cmple_epi32_mask(j_0, vi) & _mm512_cmpgt_epi32_mask(j_0, vlo);
                    __mmask16 m1 = _mm512_cmple_epi32_mask(j_1, vi) & _mm512_cmpgt_epi32_mask(j_1, vlo);
                    if (i < 0) m0 = m1 = 0;
                    const __m512 s0 = _mm512_mask_mul_ps(ninf, m0, a[r][0], vscale);
                    const __m512 s1 = _mm512_mask_mul_ps(ninf, m1, a[r][1], vscale);
                    const float tmax = _mm512_reduce_max_ps(_mm512_max_ps(s0, s1));
                    const float mx = tmax > M[row] ? tmax : M[row];
                    if (mx == -INFINITY) { /* nothing visible yet for this row */
                        _mm512_storeu_ps(sc, _mm512_setzero_ps());
                        _mm512_storeu_ps(sc + 16, _mm512_setzero_ps());
                        continue;
                    }
                    const __m512 vm = _mm512_set1_ps(mx);
                    const __m512 p0 = _mm512_maskz_mov_ps(m0, seq_exp512(_mm512_sub_ps(s0, vm)));
                    const __m512 p1 = _mm512_maskz_mov_ps(m1, seq_exp512(_mm512_sub_ps(s1, vm)));
                    _mm512_storeu_ps(sc, p0);
                    _mm512_storeu_ps(sc + 16, p1);
                    const float corr = expf(M[row] - mx);
                    L[row] = L[row] * corr + _mm512_reduce_add_ps(_mm512_add_ps(p0, p1));
                    M[row] = mx;
                    if (corr != 1.0f) {
                        const __m512 c = _mm512_set1_ps(corr);
                        for (int64_t x = 0; x < d; x += 16) {
                            const __mmask16 m = seq_tail_mask(d - x);
                            _mm512_mask_storeu_ps(O + row * d + x, m, _mm512_mul_ps(c, _mm512_maskz_loadu_ps(m, O + row * d + x)));
                        }
                    }
                }
            }
            /* O += P V over the tile's nt value rows: 4 rows x 64 columns per register tile. */
            for (int64_t r0 = 0; r0 < R4; r0 += 4)
                for (int64_t x0 = 0; x0 < d; x0 += 64) {
                    __mmask16 mk[4];
                    __m512 a[4][4];
                    for (int c = 0; c < 4; c++) mk[c] = x0 + 16 * c < d ? seq_tail_mask(d - x0 - 16 * c) : (__mmask16)0;
                    for (int r = 0; r < 4; r++)
                        for (int c = 0; c < 4; c++) a[r][c] = _mm512_maskz_loadu_ps(mk[c], O + (r0 + r) * d + x0 + 16 * c);
                    for (int64_t j = 0; j < nt; j++) {
                        const float *vr = p->v + ((j0 + j) * hkv + kvh) * d + x0;
                        __m512 vv[4];
                        for (int c = 0; c < 4; c++) vv[c] = _mm512_maskz_loadu_ps(mk[c], vr + 16 * c);
                        for (int r = 0; r < 4; r++) {
                            const __m512 pb = _mm512_set1_ps(S[(r0 + r) * ATTN_TILE + j]);
                            for (int c = 0; c < 4; c++) a[r][c] = _mm512_fmadd_ps(pb, vv[c], a[r][c]);
                        }
                    }
                    for (int r = 0; r < 4; r++)
                        for (int c = 0; c < 4; c++) _mm512_mask_storeu_ps(O + (r0 + r) * d + x0 + 16 * c, mk[c], a[r][c]);
                }
        }
        for (int64_t r = 0; r < ATTN_BQ * g; r++) {
            if (tok[r] < 0) continue;
            float *out = p->out + (tok[r] * hq + kvh * g + r % g) * d;
            const __m512 inv = _mm512_set1_ps(1.0f / L[r]);
            for (int64_t x = 0; x < d; x += 16) {
                const __mmask16 m = seq_tail_mask(d - x);
                _mm512_mask_storeu_ps(out + x, m, _mm512_mul_ps(inv, _mm512_maskz_loadu_ps(m, O + r * d + x)));
            }
        }
    }
    return SEQ_TAG;
}
