/* Attention and RoPE, generic C (see seq_common.h for how this file is compiled). Layouts:
 * kernels/src/attention.rs. A translation unit may bring its own `attn_segment` (define ATTN_CUSTOM_SEGMENT). */
#include "seq_common.h"

/* Keys scored per online-softmax tile: 32 keys x up to 8 query heads of scores stay in L1 between the score pass
 * and the value pass. */
#define ATTN_TILE 32

/* Online-softmax state of the g query heads that share one KV head: running max m, running sum l, unnormalised
 * accumulator acc[g][d], and the scores of the current tile. All of it lives in the caller's scratch:
 * g * (2 + d + ATTN_TILE) floats. */
typedef struct {
    float *m, *l, *acc, *sc;
    int64_t g, d;
} attn_state;

static attn_state SEQ_FN(attn_begin)(float *scratch, int64_t g, int64_t d) {
    attn_state st = {scratch, scratch + g, scratch + 2 * g, scratch + 2 * g + g * d, g, d};
    for (int64_t i = 0; i < g; i++) {
        st.m[i] = -INFINITY;
        st.l[i] = 0.0f;
    }
    for (int64_t i = 0; i < g * d; i++) st.acc[i] = 0.0f;
    return st;
}

static void SEQ_FN(attn_finish)(const attn_state *st, float *out) {
    for (int64_t i = 0; i < st->g; i++) {
        const float r = 1.0f / st->l[i];
        for (int64_t x = 0; x < st->d; x++) out[i * st->d + x] = st->acc[i * st->d + x] * r;
    }
}

/* Rescales the state to the tile's new maxima and turns the tile's scores into probabilities. */
static inline void SEQ_FN(attn_softmax_tile)(attn_state *st, int64_t nt) {
    for (int64_t i = 0; i < st->g; i++) {
        float *sc = st->sc + i * ATTN_TILE;
        float mx = st->m[i];
        for (int64_t j = 0; j < nt; j++) mx = sc[j] > mx ? sc[j] : mx;
        const float corr = expf(st->m[i] - mx);
        float sum = 0.0f;
        for (int64_t j = 0; j < nt; j++) {
            sc[j] = expf(sc[j] - mx);
            sum += sc[j];
        }
        st->l[i] = st->l[i] * corr + sum;
        st->m[i] = mx;
        if (corr != 1.0f)
            for (int64_t x = 0; x < st->d; x++) st->acc[i * st->d + x] *= corr;
    }
}

#ifndef ATTN_CUSTOM_SEGMENT
/* Folds n keys/values of type T (rows `row_stride` elements apart, CVT converting one element to f32) into the
 * state of the g query rows q ([g, d]). */
#define ATTN_DEFINE_SEGMENT(NAME, T, CVT)                                                                          \
    static void SEQ_FN(NAME)(attn_state * st, const float *q, float scale, const T *k, const T *v,                \
                             int64_t row_stride, int64_t n) {                                                      \
        const int64_t g = st->g, d = st->d;                                                                        \
        for (int64_t t0 = 0; t0 < n; t0 += ATTN_TILE) {                                                            \
            const int64_t nt = n - t0 < ATTN_TILE ? n - t0 : ATTN_TILE;                                            \
            for (int64_t i = 0; i < g; i++)                                                                        \
                for (int64_t j = 0; j < nt; j++) {                                                                 \
                    const T *kr = k + (t0 + j) * row_stride;                                                       \
                    float s = 0.0f;                                                                                \
                    for (int64_t x = 0; x < d; x++) s += q[i * d + x] * CVT(kr[x]);                                \
                    st->sc[i * ATTN_TILE + j] = s * scale;                                                         \
                }                                                                                                  \
            SEQ_FN(attn_softmax_tile)(st, nt);                                                                     \
            for (int64_t j = 0; j < nt; j++) {                                                                     \
                const T *vr = v + (t0 + j) * row_stride;                                                           \
                for (int64_t i = 0; i < g; i++) {                                                                  \
                    const float pj = st->sc[i * ATTN_TILE + j];                                                    \
                    for (int64_t x = 0; x < d; x++) st->acc[i * d + x] += pj * CVT(vr[x]);                         \
                }                                                                                                  \
            }                                                                                                      \
        }                                                                                                          \
    }
#define ATTN_F32(x) (x)
ATTN_DEFINE_SEGMENT(attn_segment, float, ATTN_F32)
ATTN_DEFINE_SEGMENT(attn_segment_bf16, uint16_t, seq_bf16_to_f32)
#else
static void SEQ_FN(attn_segment)(attn_state *st, const float *q, float scale, const float *k, const float *v,
                                 int64_t row_stride, int64_t n);
static void SEQ_FN(attn_segment_bf16)(attn_state *st, const float *q, float scale, const uint16_t *k,
                                      const uint16_t *v, int64_t row_stride, int64_t n);
#endif

/* One decode segment from a cache of either element type, starting `off` elements into k and v. */
static void SEQ_FN(attn_segment_any)(attn_state *st, const float *q, float scale, int64_t bf16, const void *k,
                                     const void *v, int64_t off, int64_t n) {
    if (bf16)
        SEQ_FN(attn_segment_bf16)(st, q, scale, (const uint16_t *)k + off, (const uint16_t *)v + off, st->d, n);
    else
        SEQ_FN(attn_segment)(st, q, scale, (const float *)k + off, (const float *)v + off, st->d, n);
}

/* Paged decode for items [item0, item1) of (sequence b, KV head) = b*hkv + kvh. A translation unit may bring its
 * own walker (define ATTN_CUSTOM_PAGED): this one is then SEQ_FN(attn_decode_paged_generic), its fallback. */
#ifndef ATTN_CUSTOM_PAGED
#define ATTN_PAGED_NAME attn_decode_paged
#else
#define ATTN_PAGED_NAME attn_decode_paged_generic
static
#endif
int SEQ_FN(ATTN_PAGED_NAME)(const seq_attn_args *p, int64_t item0, int64_t item1, float *scratch) {
    const int64_t hq = p->hq, hkv = p->hkv, d = p->d, g = hq / hkv, ps = p->page_size;
    for (int64_t it = item0; it < item1; it++) {
        const int64_t b = it / hkv, kvh = it % hkv, len = p->lens[b];
        attn_state st = SEQ_FN(attn_begin)(scratch, g, d);
        const float *q = p->q + (b * hq + kvh * g) * d;
        for (int64_t p0 = 0; p0 < len; p0 += ps) {
            const int64_t page = p->block_table[b * p->max_pages + p0 / ps];
            const int64_t off = ((page * hkv + kvh) * ps) * d;
            SEQ_FN(attn_segment_any)(&st, q, p->scale, p->kv_bf16, p->k_pages, p->v_pages, off, len - p0 < ps ? len - p0 : ps);
        }
        SEQ_FN(attn_finish)(&st, p->out + (b * hq + kvh * g) * d);
    }
    return SEQ_TAG;
}

/* Ring (sliding-window) decode for items [item0, item1) of (sequence b, KV head): the valid ring slots, then the
 * current token. */
int SEQ_FN(attn_decode_ring)(const seq_attn_args *p, int64_t item0, int64_t item1, float *scratch) {
    const int64_t hq = p->hq, hkv = p->hkv, d = p->d, g = hq / hkv;
    for (int64_t it = item0; it < item1; it++) {
        const int64_t b = it / hkv, kvh = it % hkv;
        const int64_t valid = (int64_t)p->pos[b] < p->slots ? (int64_t)p->pos[b] : p->slots;
        attn_state st = SEQ_FN(attn_begin)(scratch, g, d);
        const float *q = p->q + (b * hq + kvh * g) * d;
        const int64_t off = it * p->slots * d;
        SEQ_FN(attn_segment_any)(&st, q, p->scale, p->kv_bf16, p->k_ring, p->v_ring, off, valid);
        SEQ_FN(attn_segment_any)(&st, q, p->scale, p->kv_bf16, p->k_cur, p->v_cur, it * d, 1);
        SEQ_FN(attn_finish)(&st, p->out + (b * hq + kvh * g) * d);
    }
    return SEQ_TAG;
}

/* Causal prefill for items [item0, item1) of (query token i, KV head) = i*hkv + kvh over t tokens. */
int SEQ_FN(attn_prefill)(const seq_attn_args *p, int64_t t, int64_t item0, int64_t item1, float *scratch) {
    (void)t;
    const int64_t hq = p->hq, hkv = p->hkv, d = p->d, g = hq / hkv;
    for (int64_t it = item0; it < item1; it++) {
        const int64_t i = it / hkv, kvh = it % hkv;
        const int64_t start = p->window > 0 && i + 1 > p->window ? i + 1 - p->window : 0;
        attn_state st = SEQ_FN(attn_begin)(scratch, g, d);
        const int64_t off = (start * hkv + kvh) * d;
        SEQ_FN(attn_segment)(&st, p->q + (i * hq + kvh * g) * d, p->scale, p->k + off, p->v + off, hkv * d, i - start + 1);
        SEQ_FN(attn_finish)(&st, p->out + (i * hq + kvh * g) * d);
    }
    return SEQ_TAG;
}

/* Neox RoPE in place on rows [t0, t1) of x ([t, heads, d]); the angle of pair i at position p is
 * float(p) * inv_freq[i] in f32 as transformers computes it, its cos/sin in double once per row for every head.
 * scratch: rot floats. */
int SEQ_FN(rope_neox)(float *x, int64_t heads, int64_t d, int64_t rot, const uint32_t *positions,
                      const float *inv_freq, int64_t t0, int64_t t1, float *scratch) {
    const int64_t half = rot / 2;
    float *cs = scratch, *sn = scratch + half;
    for (int64_t t = t0; t < t1; t++) {
        for (int64_t i = 0; i < half; i++) {
            const float ang = (float)positions[t] * inv_freq[i];
            cs[i] = (float)cos((double)ang);
            sn[i] = (float)sin((double)ang);
        }
        for (int64_t h = 0; h < heads; h++) {
            float *v = x + (t * heads + h) * d;
            for (int64_t i = 0; i < half; i++) {
                const float x1 = v[i], x2 = v[i + half];
                v[i] = x1 * cs[i] - x2 * sn[i];
                v[i + half] = x2 * cs[i] + x1 * sn[i];
            }
        }
    }
    return SEQ_TAG;
}
