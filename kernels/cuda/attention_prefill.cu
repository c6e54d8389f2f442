// Causal prefill attention (flash-attention-2 style) with grouped-query packing and an optional sliding window,
// for a batch of sequences of different lengths (cu_seqlens) on sm_90 with `mma.sync` (no wgmma: this file is the
// portable PTX module; an sm_90a wgmma version is a later step).
//
// Semantics (those of `kernels::attention::prefill`, the CPU oracle): token i of a sequence attends to keys j of the
// same sequence with j <= i and, with a window W > 0, i - j < W (the window counts the token itself);
// out = softmax(scale * q . k) v per query head, query head h reading KV head h / (q_heads / kv_heads).
//
// Layouts (bf16 bits, row-major, tokens of all sequences concatenated): q, out [total, q_heads, D];
// k, v [total, kv_heads, D]; cu_seqlens [batch + 1] token offsets (null: one sequence of `total` tokens). Every
// offset is clamped to [0, total] and a sequence longer than max_seqlen is cut at max_seqlen (its later rows are
// left unwritten), so a bad device-side table can never send the kernel outside the buffers.
//
// Design:
// - GQA packing. One block serves one KV head of one sequence and BM "packed rows", packed row p standing for
//   token p / G and query head kvh * G + p % G (G = q_heads / kv_heads). The G query heads that share a KV head
//   therefore share every K/V tile the block loads (K/V traffic divided by G, and the causal triangle is cut in
//   tiles of BM / G tokens). Each warp owns W m16 tiles (16 W packed rows); the token of each of a thread's 2 W
//   rows is fixed for the block, so the mask costs two compares per score. With W = 2 every K/V fragment a warp
//   loads from shared memory feeds two MMAs instead of one (half the ldmatrix traffic per MMA, at the price of
//   twice the accumulator registers).
// - S = Q K^T and O += P V on `mma.sync.m16n8k16` bf16 with fp32 accumulation; Q fragments and K fragments come
//   from shared memory by `ldmatrix.x4`, V fragments by `ldmatrix.x4.trans` (V stays [key, d] in memory). P goes
//   from the S accumulators to A fragments in registers (the C layout of two n8 tiles is the A layout of one
//   k16 step), rounded to bf16 as flash-attention does.
// - Online softmax in registers, in the log2 domain: scores are multiplied by scale * log2(e) once, and
//   exp2 (`ex2.approx`) replaces exp. The row max and sum are reduced over the 4 lanes of a quad with shuffles.
//   Fully masked rows of a tile keep max = -inf and are guarded (no inf - inf).
// - Shared memory rows are D bf16 = D/8 16-byte chunks, chunk c of row r stored at chunk c ^ (r & 7): the 8 rows
//   one ldmatrix matrix reads land in 8 different bank groups, and the 16-byte cp.async writes too.
// - K/V tiles of BN keys stream through a STAGES-deep cp.async pipeline (one commit group per tile, also when
//   empty, so wait_group counts stay uniform). Tiles are visited from the diagonal down; tiles above the
//   block's last token or wholly below the window of its first token are never loaded (causal/window block
//   skipping), and the mask is evaluated only on tiles that cross the diagonal or the window's lower edge.
//   Keys at or past the sequence end are zero-filled (no read), so no garbage (NaN bits) reaches P V.
// - Blocks are launched heaviest first (the last query tiles of a causal sequence have the most keys).
// - Output: bf16, normalised by the row sum in fp32 before rounding (the engine feeds it to a bf16 GEMM).
//
// Tilings (BM = 16 x W x warps, W, BN, STAGES) are template parameters; the instantiations below are those the
// Rust side (`kernels/src/cuda/attention_prefill.rs`) can pick and the benchmark sweeps.
//
// Prefix mode (`attention_prefill_paged_*`, the engine's chunked prefill): sequence b's new tokens continue after
// P_b = prefix_lens[b] tokens already in a KV cache. The same body runs on absolute positions: new token t is
// position P_b + t, it sees keys j <= P_b + t (and P_b + t - j < W with a window), keys j < P_b come from the cache
// and keys j >= P_b from the new k / v (row start + j - P_b). Two cache layouts, told apart by block_table:
// - paged (block_table non-null): k_cache, v_cache [num_pages, kv_heads, page_size, D], key j of sequence b in
//   page block_table[b * max_pages + j / page_size], slot j % page_size (the decode kernels' layout). P_b is
//   clamped to max_pages * page_size; a page id >= num_pages is not read (its keys load as zeros: wrong scores
//   for a wrong table, never an access outside the pool).
// - ring (block_table null, sliding layers): k_ring, v_ring [seqs, kv_heads, slots = W - 1, D], key j in slot
//   j % slots of sequence b: the last W - 1 prefix tokens, exactly the ones a window of W lets the new tokens see.
// Every key below the block's lowest visible key (the window's edge) or at/after P_b + seqlen is zero-filled
// rather than read, so ring slots already overwritten and cache pages past the prefix are never touched.
// `attention_kv_store` writes the new tokens' K/V into either cache afterwards (a ring keeps only the last
// W - 1 of them, so it must run after the attention that still needs the older prefix tokens).
#include "common.cuh"

using namespace edgefit;

namespace {

__device__ __forceinline__ float fast_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

// Byte offset of 16-byte chunk `c` of row `r` in a swizzled tile of D-element rows.
template <int D>
__device__ __forceinline__ uint32_t swz(int r, int c) {
    return (uint32_t)(r * (D * 2) + ((c ^ (r & 7)) << 4));
}

}  // namespace

// The cached prefix of prefix mode (see the top of the file); unused (all zero / null) otherwise.
struct ApPrefix {
    const uint16_t* kc;           // paged [num_pages, kv_heads, page_size, D] or ring [seqs, kv_heads, slots, D]
    const uint16_t* vc;
    const uint32_t* block_table;  // [seqs, max_pages]; null: ring
    const uint32_t* prefix_lens;  // [seqs] cached tokens before the new ones
    int page_size;                // tokens per page, or ring slots (W - 1)
    int max_pages;
    int num_pages;
};

// Prefix mode's per-key source codes (attention_prefill_body, lookup): no row, and the flag of a new token's index.
constexpr uint32_t AP_ROW_NONE = 0xffffffffu;
constexpr uint32_t AP_ROW_NEW = 0x80000000u;

// Largest prefix the kernel accepts from prefix_lens in ring mode (paged: max_pages * page_size, which the Rust
// side keeps below this too); with max_seqlen < 2^30 (checked there) every position stays below 2^31.
#define AP_MAX_PREFIX (1 << 30)

template <int D, int NWARPS, int MW, int BN, int STAGES, bool PREFIX>
__device__ __forceinline__ void attention_prefill_body(const uint16_t* __restrict__ q, const uint16_t* __restrict__ k,
                                                       const uint16_t* __restrict__ v, uint16_t* __restrict__ out,
                                                       const uint32_t* __restrict__ cu_seqlens, int total,
                                                       int max_seqlen, int q_heads, int kv_heads, int window,
                                                       float scale_log2, const ApPrefix pre) {
    constexpr int BM = 16 * MW * NWARPS;  // each warp owns MW m16 tiles
    constexpr int NT = NWARPS * 32;
    constexpr int CPR = D / 8;  // 16-byte chunks per row
    constexpr int SN = BN / 8;  // n8 tiles of S per warp
    constexpr int ON = D / 8;   // n8 tiles of O per warp
    static_assert(D % 64 == 0 && BN % 16 == 0 && STAGES >= 2, "tiling");

    extern __shared__ __align__(128) uint8_t smem_raw[];
    const uint32_t sbase = (uint32_t)__cvta_generic_to_shared(smem_raw);
    const uint32_t sq = sbase;
    // Stage s: K tile at sk(s), V tile at sv(s).
    auto sk = [&](int s) { return sbase + (uint32_t)(BM * D * 2 + s * 2 * BN * D * 2); };
    auto sv = [&](int s) { return sbase + (uint32_t)(BM * D * 2 + s * 2 * BN * D * 2 + BN * D * 2); };

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int kvh = blockIdx.y, seq = blockIdx.z;
    const int G = q_heads / kv_heads;

    int start = 0, seqlen = total;
    if (cu_seqlens != nullptr) {
        const uint32_t a = min(cu_seqlens[seq], (uint32_t)total);
        const uint32_t b = min(max(cu_seqlens[seq + 1], a), (uint32_t)total);
        start = (int)a;
        seqlen = (int)(b - a);
    }
    seqlen = min(seqlen, max_seqlen);
    const int m_block = gridDim.x - 1 - blockIdx.x;  // heaviest (latest) query tiles first
    const long long p0 = (long long)m_block * BM;
    if (p0 >= (long long)seqlen * G) return;
    // Prefix mode: queries and keys are numbered by absolute position (the new tokens start at `prefix`).
    int prefix = 0;
    if constexpr (PREFIX) {
        const uint32_t cap = pre.block_table != nullptr ? (uint32_t)pre.max_pages * (uint32_t)pre.page_size
                                                        : (uint32_t)AP_MAX_PREFIX;
        prefix = (int)min(pre.prefix_lens[seq], min(cap, (uint32_t)AP_MAX_PREFIX));
    }
    const int kv_len = prefix + seqlen;  // keys of this sequence: cache [0, prefix), new [prefix, kv_len)
    const int tok_lo = prefix + (int)(p0 / G);
    const int tok_hi = prefix + (int)min((p0 + BM - 1) / G, (long long)seqlen - 1);

    const size_t q_row_stride = (size_t)q_heads * D;   // elements between tokens of q / out
    const size_t kv_row_stride = (size_t)kv_heads * D;  // and of k / v
    const uint16_t* kb = k + (size_t)start * kv_row_stride + (size_t)kvh * D;
    const uint16_t* vb = v + (size_t)start * kv_row_stride + (size_t)kvh * D;

    // Key tiles: [n_min, n_max), visited from n_max - 1 down.
    const int key_lo = window > 0 ? max(0, tok_lo - window + 1) : 0;
    const int n_min = key_lo / BN;
    const int n_max = tok_hi / BN + 1;
    const int n_tiles = n_max - n_min;

    // Q tile (first commit group, together with the first K/V tile).
    for (int i = tid; i < BM * CPR; i += NT) {
        const int r = i / CPR, c = i % CPR;
        const long long p = p0 + r;
        const int t = (int)(p / G);
        const int h = kvh * G + (int)(p % G);
        const bool ok = t < seqlen;
        const uint16_t* src = ok ? q + (size_t)(start + t) * q_row_stride + (size_t)h * D + c * 8 : q;
        cp_async16(sq + swz<D>(r, c), src, ok);
    }
    // Prefix mode: where key n0 + lane + 32 x of a tile comes from, looked up once per key per tile (not once per
    // 16-byte chunk: D / 8 table loads per key, the H200's 0.61-0.66x SDPA after an 8k prefix) and handed to the
    // copying threads by shuffle: AP_ROW_NONE (not attended, or a page past the pool: zero-filled, nothing read),
    // AP_ROW_NEW | i (new token i: row start + i of k / v) or the row of the cache (paged or ring; the Rust side
    // keeps cache rows below 2^31).
    constexpr int NR = (BN + 31) / 32;
    auto lookup = [&](int it, uint32_t (&rows)[NR]) {
#pragma unroll
        for (int x = 0; x < NR; ++x) rows[x] = AP_ROW_NONE;
        if constexpr (PREFIX) {
            if (it < n_tiles) {
                const int n0 = (n_max - 1 - it) * BN;
#pragma unroll
                for (int x = 0; x < NR; ++x) {
                    const int key = n0 + lane + 32 * x;
                    if (lane + 32 * x < BN && key >= key_lo && key < kv_len) {
                        if (key >= prefix) {
                            rows[x] = AP_ROW_NEW | (uint32_t)(key - prefix);
                        } else if (pre.block_table != nullptr) {
                            const uint32_t page = pre.block_table[(size_t)seq * pre.max_pages + key / pre.page_size];
                            if (page < (uint32_t)pre.num_pages)
                                rows[x] = (page * (uint32_t)kv_heads + kvh) * (uint32_t)pre.page_size +
                                          (uint32_t)(key % pre.page_size);
                        } else {
                            rows[x] = ((uint32_t)seq * kv_heads + kvh) * (uint32_t)pre.page_size +
                                      (uint32_t)(key % pre.page_size);
                        }
                    }
                }
            }
        }
    };
    auto load_kv = [&](int it, const uint32_t (&rows)[NR]) {
        if (it < n_tiles) {
            const int n0 = (n_max - 1 - it) * BN;
            const int s = it % STAGES;
            if constexpr (!PREFIX) {
                for (int i = tid; i < BN * CPR; i += NT) {
                    const int r = i / CPR, c = i % CPR;
                    const int key = n0 + r;
                    const bool ok = key < seqlen;
                    const size_t off = ok ? (size_t)key * kv_row_stride + c * 8 : 0;
                    cp_async16(sk(s) + swz<D>(r, c), kb + off, ok);
                    cp_async16(sv(s) + swz<D>(r, c), vb + off, ok);
                }
            } else {
                // Every thread runs every step (the shuffles need the whole warp); the rows a warp copies in one
                // step are 32 / CPR consecutive ones of one 32-key half, so the register picked is warp-uniform.
                static_assert((BN * CPR) % NT == 0 && 32 % CPR == 0 && NT % CPR == 0, "copy steps");
#pragma unroll
                for (int j = 0; j < BN * CPR / NT; ++j) {
                    const int i = tid + j * NT;
                    const int r = i / CPR, c = i % CPR;
                    uint32_t rv = rows[0];
                    if constexpr (NR > 1) rv = (r >> 5) ? rows[1] : rows[0];
                    rv = __shfl_sync(0xffffffffu, rv, r & 31);
                    const bool ok = rv != AP_ROW_NONE;
                    const uint16_t* ks = kb;
                    const uint16_t* vs = vb;
                    if (!(rv & AP_ROW_NEW)) {  // a cached token
                        const size_t off = (size_t)rv * D + c * 8;
                        ks = pre.kc + off;
                        vs = pre.vc + off;
                    } else if (ok) {  // a new token
                        const size_t off = (size_t)(rv & ~AP_ROW_NEW) * kv_row_stride + c * 8;
                        ks = kb + off;
                        vs = vb + off;
                    }
                    cp_async16(sk(s) + swz<D>(r, c), ks, ok);
                    cp_async16(sv(s) + swz<D>(r, c), vs, ok);
                }
            }
        }
        cp_async_commit();
    };
    // One lookup per key right before its tile's copies: a lookup one tile ahead (as the decode kernels do) kept
    // NR more registers live through the compute and spilled the D256 tilings at 255 registers.
    auto issue = [&](int it) {
        uint32_t rows[NR];
        lookup(it, rows);
        load_kv(it, rows);
    };
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) issue(s);

    // This thread's rows: in m16 tile w of the warp, quad rows g and g + 8 (index 2w + r), and their tokens.
    const int g = lane >> 2, tq = lane & 3;
    int row_tok[2 * MW], row_lo[2 * MW];
#pragma unroll
    for (int x = 0; x < 2 * MW; ++x) {
        const long long p = p0 + (warp * MW + (x >> 1)) * 16 + g + (x & 1) * 8;
        const int t = (int)(p / G);
        row_tok[x] = prefix + min(t, seqlen - 1);  // padding rows compute a real row's values and are not stored
        row_lo[x] = window > 0 ? row_tok[x] - window + 1 : 0;
    }

    float o[MW][ON][4];
#pragma unroll
    for (int w = 0; w < MW; ++w)
#pragma unroll
        for (int j = 0; j < ON; ++j) o[w][j][0] = o[w][j][1] = o[w][j][2] = o[w][j][3] = 0.f;
    float m_run[2 * MW], l_run[2 * MW];
#pragma unroll
    for (int x = 0; x < 2 * MW; ++x) {
        m_run[x] = -INFINITY;
        l_run[x] = 0.f;
    }

    // ldmatrix lane addressing: matrix mi = lane / 8, row lr = lane % 8 within it.
    const int mi = lane >> 3, lr = lane & 7;
    const int a_row = warp * MW * 16 + (mi & 1) * 8 + lr;  // + 16 w for m16 tile w  // Q: matrices (rows 0-7 | 8-15) x (k 0-7 | 8-15)
    const int a_chk = mi >> 1;
    const int b_row = (mi >> 1) * 8 + lr;  // K: matrices (keys 0-7 | 8-15) x (k 0-7 | 8-15)
    const int b_chk = mi & 1;
    const int v_row = (mi & 1) * 8 + lr;  // V (trans): matrices (keys 0-7 | 8-15) x (d 0-7 | 8-15)
    const int v_chk = mi >> 1;

    for (int it = 0; it < n_tiles; ++it) {
        issue(it + STAGES - 1);
        cp_async_wait<STAGES - 1>();
        __syncthreads();
        const int s = it % STAGES;
        const int n0 = (n_max - 1 - it) * BN;

        // S = Q K^T for the warp's MW x 16 rows x BN keys; each K fragment serves the MW m16 tiles.
        float sc[MW][SN][4];
#pragma unroll
        for (int w = 0; w < MW; ++w)
#pragma unroll
            for (int j = 0; j < SN; ++j) sc[w][j][0] = sc[w][j][1] = sc[w][j][2] = sc[w][j][3] = 0.f;
#pragma unroll
        for (int ks = 0; ks < D / 16; ++ks) {
            uint32_t a[MW][4];
#pragma unroll
            for (int w = 0; w < MW; ++w)
                ldmatrix_x4(a[w], sq + swz<D>(a_row + w * 16, ks * 2 + a_chk));
#pragma unroll
            for (int np = 0; np < BN / 16; ++np) {
                uint32_t b[4];
                ldmatrix_x4(b, sk(s) + swz<D>(np * 16 + b_row, ks * 2 + b_chk));
#pragma unroll
                for (int w = 0; w < MW; ++w) {
                    mma_bf16_16816(sc[w][2 * np], a[w], b[0], b[1]);
                    mma_bf16_16816(sc[w][2 * np + 1], a[w], b[2], b[3]);
                }
            }
        }

        // Scale into the log2 domain and mask (only tiles crossing the diagonal or the window's lower edge).
        const bool need_mask = (n0 + BN - 1 > tok_lo) || (window > 0 && n0 < tok_hi - window + 1);
        float mx[2 * MW];
#pragma unroll
        for (int x = 0; x < 2 * MW; ++x) mx[x] = -INFINITY;
#pragma unroll
        for (int w = 0; w < MW; ++w) {
#pragma unroll
            for (int j = 0; j < SN; ++j) {
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int x = 2 * w + (e >> 1);
                    float val = sc[w][j][e] * scale_log2;
                    if (need_mask) {
                        const int key = n0 + j * 8 + 2 * tq + (e & 1);
                        if (key > row_tok[x] || key < row_lo[x]) val = -INFINITY;
                    }
                    sc[w][j][e] = val;
                    mx[x] = fmaxf(mx[x], val);
                }
            }
        }
        float msub[2 * MW], rsum[2 * MW];
#pragma unroll
        for (int x = 0; x < 2 * MW; ++x) {
            mx[x] = fmaxf(mx[x], __shfl_xor_sync(0xffffffffu, mx[x], 1));
            mx[x] = fmaxf(mx[x], __shfl_xor_sync(0xffffffffu, mx[x], 2));
            const float m_new = fmaxf(m_run[x], mx[x]);
            msub[x] = m_new == -INFINITY ? 0.f : m_new;  // a row with nothing unmasked yet: exp2(-inf) = 0
            const float corr = fast_exp2(m_run[x] - msub[x]);
            m_run[x] = m_new;
            l_run[x] *= corr;
            rsum[x] = 0.f;
#pragma unroll
            for (int j = 0; j < ON; ++j) {
                o[x >> 1][j][2 * (x & 1)] *= corr;
                o[x >> 1][j][2 * (x & 1) + 1] *= corr;
            }
        }
#pragma unroll
        for (int w = 0; w < MW; ++w) {
#pragma unroll
            for (int j = 0; j < SN; ++j) {
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int x = 2 * w + (e >> 1);
                    const float p = fast_exp2(sc[w][j][e] - msub[x]);
                    sc[w][j][e] = p;
                    rsum[x] += p;
                }
            }
        }
#pragma unroll
        for (int x = 0; x < 2 * MW; ++x) l_run[x] += rsum[x];

        // O += P V: P's A fragment for keys 16kk..16kk+15 is S tiles 2kk and 2kk+1 in C layout; each V fragment
        // serves the MW m16 tiles.
#pragma unroll
        for (int kk = 0; kk < BN / 16; ++kk) {
            uint32_t a[MW][4];
#pragma unroll
            for (int w = 0; w < MW; ++w) {
                a[w][0] = pack_bf16x2(sc[w][2 * kk][0], sc[w][2 * kk][1]);
                a[w][1] = pack_bf16x2(sc[w][2 * kk][2], sc[w][2 * kk][3]);
                a[w][2] = pack_bf16x2(sc[w][2 * kk + 1][0], sc[w][2 * kk + 1][1]);
                a[w][3] = pack_bf16x2(sc[w][2 * kk + 1][2], sc[w][2 * kk + 1][3]);
            }
#pragma unroll
            for (int dp = 0; dp < D / 16; ++dp) {
                uint32_t b[4];
                ldmatrix_x4_trans(b, sv(s) + swz<D>(kk * 16 + v_row, dp * 2 + v_chk));
#pragma unroll
                for (int w = 0; w < MW; ++w) {
                    mma_bf16_16816(o[w][2 * dp], a[w], b[0], b[1]);
                    mma_bf16_16816(o[w][2 * dp + 1], a[w], b[2], b[3]);
                }
            }
        }
        __syncthreads();  // stage s is refilled by the next iteration's load
    }
    cp_async_wait<0>();

    // Epilogue: normalise and store the real rows as bf16.
#pragma unroll
    for (int x = 0; x < 2 * MW; ++x) {
        float l = l_run[x];
        l += __shfl_xor_sync(0xffffffffu, l, 1);
        l += __shfl_xor_sync(0xffffffffu, l, 2);
        const float inv = l > 0.f ? 1.f / l : 0.f;
        const long long p = p0 + (warp * MW + (x >> 1)) * 16 + g + (x & 1) * 8;
        const int t = (int)(p / G);
        if (t >= seqlen) continue;  // padding row
        const int h = kvh * G + (int)(p % G);
        uint16_t* dst = out + (size_t)(start + t) * q_row_stride + (size_t)h * D + 2 * tq;
#pragma unroll
        for (int j = 0; j < ON; ++j) {
            *reinterpret_cast<uint32_t*>(dst + j * 8) =
                pack_bf16x2(o[x >> 1][j][2 * (x & 1)] * inv, o[x >> 1][j][2 * (x & 1) + 1] * inv);
        }
    }
}

// Shared memory bytes of a tiling: the Q tile plus STAGES x (K tile + V tile). Mirrored in the Rust launch table.
#define AP_SMEM(D, BM, BN, STAGES) (((BM) + 2 * (STAGES) * (BN)) * (D) * 2)

#define AP_INSTANTIATE(D, BM, MW, BN, STAGES)                                                                      \
    static_assert(AP_SMEM(D, BM, BN, STAGES) <= 227 * 1024, "shared memory");                                     \
    extern "C" __global__ void __launch_bounds__((BM) * 2 / (MW))                                                  \
        attention_prefill_D##D##_M##BM##_W##MW##_N##BN##_S##STAGES(                                                \
            const uint16_t* __restrict__ q, const uint16_t* __restrict__ k, const uint16_t* __restrict__ v,        \
            uint16_t* __restrict__ out, const uint32_t* __restrict__ cu_seqlens, int total, int max_seqlen,        \
            int q_heads, int kv_heads, int window, float scale_log2) {                                             \
        attention_prefill_body<D, (BM) / (16 * (MW)), MW, BN, STAGES, false>(                                      \
            q, k, v, out, cu_seqlens, total, max_seqlen, q_heads, kv_heads, window, scale_log2,                    \
            ApPrefix{nullptr, nullptr, nullptr, nullptr, 0, 0, 0});                                                \
    }                                                                                                              \
    extern "C" __global__ void __launch_bounds__((BM) * 2 / (MW))                                                  \
        attention_prefill_paged_D##D##_M##BM##_W##MW##_N##BN##_S##STAGES(                                          \
            const uint16_t* __restrict__ q, const uint16_t* __restrict__ k, const uint16_t* __restrict__ v,        \
            uint16_t* __restrict__ out, const uint32_t* __restrict__ cu_seqlens, int total, int max_seqlen,        \
            int q_heads, int kv_heads, int window, float scale_log2, const uint16_t* __restrict__ k_cache,         \
            const uint16_t* __restrict__ v_cache, const uint32_t* __restrict__ block_table,                        \
            const uint32_t* __restrict__ prefix_lens, int page_size, int max_pages, int num_pages) {               \
        attention_prefill_body<D, (BM) / (16 * (MW)), MW, BN, STAGES, true>(                                       \
            q, k, v, out, cu_seqlens, total, max_seqlen, q_heads, kv_heads, window, scale_log2,                    \
            ApPrefix{k_cache, v_cache, block_table, prefix_lens, page_size, max_pages, num_pages});                \
    }

// Not built: D256 with two m16 tiles per warp (O alone is 256 registers: 1.5 KB of spills per thread).
// Names: D<head dim>_M<BM packed rows>_W<m16 tiles per warp>_N<BN keys>_S<stages>; BM / (16 W) warps. Each tiling
// has its plain kernel and its prefix-mode kernel (`attention_prefill_paged_...`).
// The tilings PREFILL_DEFAULTS (Rust) picks, then the lab's (PREFILL_LAB_KERNELS; named by the `_with` calls).
AP_INSTANTIATE(64, 128, 2, 64, 3)
AP_INSTANTIATE(128, 128, 2, 64, 2)
AP_INSTANTIATE(128, 64, 1, 64, 2)
AP_INSTANTIATE(256, 64, 1, 64, 2)
AP_INSTANTIATE(256, 128, 1, 64, 2)
#if EDGEFIT_LAB
AP_INSTANTIATE(64, 128, 1, 64, 3)
AP_INSTANTIATE(64, 64, 1, 64, 3)
AP_INSTANTIATE(128, 128, 1, 64, 2)
AP_INSTANTIATE(128, 128, 2, 32, 3)
AP_INSTANTIATE(256, 64, 1, 32, 2)
#endif

// Writes the new tokens' K and V (bf16 bits [total, kv_heads, D], sequences as cu_seqlens, D = 8 x chunks) into a
// KV cache after prefix_lens[b] cached tokens: token t of sequence b is position P_b + t. Paged (block_table
// non-null): page block_table[b * max_pages + pos / page_size], slot pos % page_size of [num_pages, kv_heads,
// page_size, D]; a position past the table or a page id >= num_pages is skipped (never written out of bounds).
// Ring (block_table null, page_size = slots = W - 1): only the last `slots` tokens of each sequence are written,
// to slot pos % slots of [seqs, kv_heads, slots, D] (so no two threads write one slot); slots = 0 writes nothing.
// One thread copies 16 bytes of K and 16 of V; grid (ceil(max_seqlen * kv_heads * chunks / 256), seqs).
// Offsets and prefix lengths are clamped as in the attention kernels.
extern "C" __global__ void __launch_bounds__(256)
    attention_kv_store(const uint16_t* __restrict__ k, const uint16_t* __restrict__ v, uint16_t* __restrict__ k_cache,
                       uint16_t* __restrict__ v_cache, const uint32_t* __restrict__ cu_seqlens,
                       const uint32_t* __restrict__ prefix_lens, const uint32_t* __restrict__ block_table, int total,
                       int max_seqlen, int kv_heads, int chunks, int page_size, int max_pages, int num_pages) {
    const int seq = blockIdx.y;
    int start = 0, seqlen = total;
    if (cu_seqlens != nullptr) {
        const uint32_t a = min(cu_seqlens[seq], (uint32_t)total);
        const uint32_t b = min(max(cu_seqlens[seq + 1], a), (uint32_t)total);
        start = (int)a;
        seqlen = (int)(b - a);
    }
    seqlen = min(seqlen, max_seqlen);
    const long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const long long per_token = (long long)kv_heads * chunks;
    const int t = (int)(idx / per_token);
    if (t >= seqlen) return;
    const int h = (int)(idx / chunks % kv_heads), c = (int)(idx % chunks);
    const uint32_t cap =
        block_table != nullptr ? (uint32_t)max_pages * (uint32_t)page_size : (uint32_t)AP_MAX_PREFIX;
    const int pos = (int)min(prefix_lens[seq], min(cap, (uint32_t)AP_MAX_PREFIX)) + t;
    size_t row;
    if (block_table != nullptr) {
        const int pi = pos / page_size;
        if (pi >= max_pages) return;
        const uint32_t page = block_table[(size_t)seq * max_pages + pi];
        if (page >= (uint32_t)num_pages) return;
        row = ((size_t)page * kv_heads + h) * page_size + pos % page_size;
    } else {
        if (page_size <= 0 || t < seqlen - page_size) return;  // overwritten later in the same chunk
        row = ((size_t)seq * kv_heads + h) * page_size + pos % page_size;
    }
    const size_t d = (size_t)chunks * 8;
    const size_t src = ((size_t)(start + t) * kv_heads + h) * d + (size_t)c * 8;
    const size_t dst = row * d + (size_t)c * 8;
    *reinterpret_cast<uint4*>(k_cache + dst) = *reinterpret_cast<const uint4*>(k + src);
    *reinterpret_cast<uint4*>(v_cache + dst) = *reinterpret_cast<const uint4*>(v + src);
}
