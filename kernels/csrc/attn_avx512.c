/* Attention, AVX-512. Decode: the online-softmax segment is hand-written for f32 and bf16 caches (bf16 widened in
 * registers): each 16-column chunk of a key row is loaded once and multiplied into the accumulators of every query
 * head of the group, the tile softmax uses the vector exp, and the value pass keeps the group's accumulators in
 * registers while the tile's value rows stream through, so each K/V row is read from memory once per KV head.
 * Prefill: the blocked kernel at the end of this file. The paged / ring walkers and RoPE are the generic C of
 * attn_impl.h compiled with AVX-512 flags. */
#define SEQ_SUFFIX _avx512
#define SEQ_TAG 2
#define ATTN_CUSTOM_SEGMENT
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
