/* Float32 activations times weights kept in GGUF block formats (Q4_K, Q6_K, Q8_0, Q4_1, Q5_0), exactly.

   Exactness by construction: row r of a product is bit-identical whatever else is in the call.
   - Each activation row is quantized on its own, per block of 32 values: dx = max|x| / 127, q = rint(x * (127 /
     max|x|)) clamped to [-127, 127], with the block's integer sums (whole, and each half for Q6_K's scales).
   - A block's integer products are summed exactly in int32 (VNNI dpbusd, or AVX2 maddubs+madd: no saturation:
     unsigned weight integers <= 63, or |w| <= 128 with the sign trick; 2 * 128 * 127 = 32512 < 32767); the
     offsets of unsigned storage (q - 32, q - 16, w + 128) are taken out exactly with the integer sums.
   - The float combination is the same per (row, output) whatever M, the row's place in its tile, or the thread:
     per full group g of 8 blocks (lane l = block l), acc[g & 1][l] = fma(float(isum[l]), scale[l] * dx[l],
     acc[g & 1][l]) (Q6_K: once per half-block scale, A then B), then, for types with an offset (Q4_K, Q4_1),
     acc[g & 1][l] = fma(off[l], dx[l] * sum[l], acc[g & 1][l]); tail blocks (K % 256, 32-value types) in a
     scalar accumulator the same way (from 8 rows, 8 outputs' accumulators in one vector: the same ops per lane);
     result = the 8 lanes of acc[0] + acc[1] summed in one fixed tree, plus the tail, plus the bias. The portable
     path (BLOCKQ_SCALAR, or no AVX2/FMA/F16C) does the same float ops.
   - Tiling changes only integer sums (exact in any order) and which registers hold a lane: rows in tiles
     of 1 to 9 sharing each unpacked weight group, Q4_K/Q6_K/Q4_1 outputs in pairs sharing each activation load
     (dot2_rows), one dpbusd chain or two; each (row, output) lane still gets the float operations above, in
     that order.
   - Threads split the outputs: one output is computed wholly by one thread.
   - At planes = 2 (about 15-bit activations, bq_mm's last argument) a row is quantized to n = rint(x / s) in
     [-32512, 32512] per block (s = max|x| / 32512) and stored as two int8 rows, n = 255 h + l: the same products
     run on both, and the row's result is high + low, added once the job is done: still the row's alone.
   - On a CPU with AMX, products of 32 rows or more run Q4_K/Q6_K outputs on tile multiplies (amx_outputs): the
     same integer block sums, then the same float operations per (row, output) as above.
   Compiled with -ffp-contract=off: only the explicit fma()s fuse. */

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#if !defined(BLOCKQ_SCALAR) && defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define BQ_SIMD 1
#include <immintrin.h>
#else
#define BQ_SIMD 0
#endif

enum { T_Q4_K = 0, T_Q6_K = 1, T_Q8_0 = 2, T_Q4_1 = 3, T_Q5_0 = 4 };


static inline float h2f(uint16_t h) {
#if BQ_SIMD
    return _cvtsh_ss(h);
#else
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
    if (exp == 0) {
        if (man == 0) {
            bits = sign;
        } else { /* subnormal: normalize */
            exp = 127 - 15 + 1;
            while (!(man & 0x400)) { man <<= 1; exp--; }
            man &= 0x3ff;
            bits = sign | (exp << 23) | (man << 13);
        }
    } else if (exp == 31) {
        bits = sign | 0x7f800000u | (man << 13);
    } else {
        bits = sign | ((exp + 127 - 15) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
#endif
}

static inline uint16_t rd16(const uint8_t *p) { uint16_t v; memcpy(&v, p, 2); return v; }

/* ---------------------------------------------------------------- stored layouts

   A row of K values is stored as K / 256 full groups of 8 blocks of 32 values, then (32-value types only) the
   K % 256 / 32 remaining blocks in their own GGUF layout. In a full group the weight integers are interleaved
   for the dot: "step" j (32 bytes) holds, at bytes 4l..4l+3, values 4j..4j+3 of block l, so one dpbusd over
   the 8 steps leaves block l's whole integer sum in int32 lane l. The activations are stored the same way.
   Group layouts (bytes; as many as the GGUF blocks they hold):
     Q4_K 148: fp16 d, fp16 dmin, u8 sc[8], u8 m[8], L[128]       value = d*sc*q - dmin*m, q = 4 bits
     Q6_K 210: fp16 d, i8 scA[8], i8 scB[8], L[128], H[64]        value = d*sc*(q - 32), q = 6 bits (A: values
                                                                  0-15 of a block, B: 16-31)
     Q8_0 272: fp16 d[8], i8 q[256]                               value = d*q
     Q4_1 160: fp16 d[8], fp16 m[8], L[128]                       value = d*q + m
     Q5_0 176: fp16 d[8], L[128], H[32]                           value = d*(q - 16), q = 5 bits
   L: 4 vectors of 32 bytes, vector v holding step 2v in its low nibbles and step 2v+1 in its high ones.
   H (Q6_K): 2 vectors, vector h holding bits 4-5 of steps 4h..4h+3 at bits 0-1, 2-3, 4-5, 6-7.
   H (Q5_0): 1 vector, bit j holding bit 4 of step j. */

static const int GROUP_BYTES[5] = {148, 210, 272, 160, 176};
static const int TAIL_BYTES[5] = {0, 0, 34, 20, 22};

int64_t bq_row_bytes(int type, int64_t K) {
    if (type < 0 || type > T_Q5_0) return -1;
    return K / 256 * GROUP_BYTES[type] + (K % 256) / 32 * TAIL_BYTES[type];
}

static inline int has_off(int type) { return type == T_Q4_K || type == T_Q4_1; }

/* A full group decoded (the portable path and dequantizing): v[l][k] the integer of value k of block l (signed,
   centred: q - 32 for Q6_K, q - 16 for Q5_0), scA/scB the float scale of its values 0-15/16-31, off the offset
   coefficient (Q4_K: -dmin*m, Q4_1: m; else 0). */
static void decode_group(int type, const uint8_t *wp, int v[8][32], float scA[8], float scB[8], float off[8]) {
    uint8_t step[8][32];
    const uint8_t *L = NULL;
    for (int l = 0; l < 8; l++) off[l] = 0.0f;
    if (type == T_Q4_K) {
        float d = h2f(rd16(wp)), ndmin = -h2f(rd16(wp + 2));
        for (int l = 0; l < 8; l++) {
            scA[l] = scB[l] = d * (float)wp[4 + l];
            off[l] = ndmin * (float)wp[12 + l];
        }
        L = wp + 20;
    } else if (type == T_Q6_K) {
        float d = h2f(rd16(wp));
        for (int l = 0; l < 8; l++) {
            scA[l] = d * (float)(int8_t)wp[2 + l];
            scB[l] = d * (float)(int8_t)wp[10 + l];
        }
        L = wp + 18;
    } else if (type == T_Q8_0) {
        for (int l = 0; l < 8; l++) scA[l] = scB[l] = h2f(rd16(wp + 2 * l));
        for (int j = 0; j < 8; j++)
            for (int p = 0; p < 32; p++) step[j][p] = wp[16 + 32 * j + p];
    } else if (type == T_Q4_1) {
        for (int l = 0; l < 8; l++) {
            scA[l] = scB[l] = h2f(rd16(wp + 2 * l));
            off[l] = h2f(rd16(wp + 16 + 2 * l));
        }
        L = wp + 32;
    } else {
        for (int l = 0; l < 8; l++) scA[l] = scB[l] = h2f(rd16(wp + 2 * l));
        L = wp + 16;
    }
    if (L)
        for (int vv = 0; vv < 4; vv++)
            for (int p = 0; p < 32; p++) {
                step[2 * vv][p] = L[32 * vv + p] & 15;
                step[2 * vv + 1][p] = L[32 * vv + p] >> 4;
            }
    if (type == T_Q6_K)
        for (int j = 0; j < 8; j++)
            for (int p = 0; p < 32; p++) step[j][p] |= ((wp[146 + 32 * (j >> 2) + p] >> (2 * (j & 3))) & 3) << 4;
    if (type == T_Q5_0)
        for (int j = 0; j < 8; j++)
            for (int p = 0; p < 32; p++) step[j][p] |= ((wp[144 + p] >> j) & 1) << 4;
    for (int j = 0; j < 8; j++)
        for (int l = 0; l < 8; l++)
            for (int i = 0; i < 4; i++) {
                int q = step[j][4 * l + i];
                v[l][4 * j + i] = type == T_Q6_K ? q - 32 : type == T_Q5_0 ? q - 16 : type == T_Q8_0 ? (int8_t)q : q;
            }
}

/* A tail block (GGUF layout) decoded the same way. */
static void decode_block(int type, const uint8_t *b, int v[32], float *sc, float *off) {
    *off = 0.0f;
    *sc = h2f(rd16(b));
    if (type == T_Q8_0) {
        for (int k = 0; k < 32; k++) v[k] = (int8_t)b[2 + k];
    } else if (type == T_Q4_1) {
        *off = h2f(rd16(b + 2));
        for (int k = 0; k < 16; k++) { v[k] = b[4 + k] & 15; v[16 + k] = b[4 + k] >> 4; }
    } else {
        uint32_t qh;
        memcpy(&qh, b + 2, 4);
        for (int k = 0; k < 16; k++) {
            v[k] = ((b[6 + k] & 15) | (((qh >> k) & 1) << 4)) - 16;
            v[16 + k] = ((b[6 + k] >> 4) | (((qh >> (k + 16)) & 1) << 4)) - 16;
        }
    }
}

/* rows ids[0..T) of a stored matrix, dequantized exactly as gguf.quants.dequantize does */
int bq_dequantize_rows(int type, const uint8_t *w, int64_t row_bytes, int64_t K, const int64_t *ids, int64_t T,
                       float *out) {
    if (type < 0 || type > T_Q5_0) return -1;
    int64_t ng = K / 256, nt = (K % 256) / 32;
    for (int64_t t = 0; t < T; t++) {
        const uint8_t *src = w + ids[t] * row_bytes;
        float *y = out + t * K;
        int v[8][32];
        float scA[8], scB[8], off[8];
        for (int64_t g = 0; g < ng; g++) {
            decode_group(type, src + g * GROUP_BYTES[type], v, scA, scB, off);
            for (int l = 0; l < 8; l++)
                for (int k = 0; k < 32; k++) {
                    float f = (k < 16 ? scA[l] : scB[l]) * (float)v[l][k];
                    y[g * 256 + 32 * l + k] = has_off(type) ? f + off[l] : f;
                }
        }
        for (int64_t b = 0; b < nt; b++) {
            int vb[32];
            float sc, of;
            decode_block(type, src + ng * GROUP_BYTES[type] + b * TAIL_BYTES[type], vb, &sc, &of);
            for (int k = 0; k < 32; k++) {
                float f = sc * (float)vb[k];
                y[ng * 256 + 32 * b + k] = has_off(type) ? f + of : f;
            }
        }
    }
    return 0;
}

/* ---------------------------------------------------------------- repacking the GGUF's blocks */

static const int GGUF_BYTES[5] = {144, 210, 34, 20, 22}; /* a GGUF block: 256 values (Q4_K, Q6_K) or 32 */

/* vals[l][k] (value k of block l) as the layout's steps: step j, byte 4l + i = value 4j + i of block l */
static void interleave(const uint8_t vals[8][32], uint8_t step[8][32]) {
    for (int j = 0; j < 8; j++)
        for (int l = 0; l < 8; l++)
            for (int i = 0; i < 4; i++) step[j][4 * l + i] = vals[l][4 * j + i];
}

/* L: vector v holds step 2v's low 4 bits in its low nibbles, step 2v + 1's in its high ones */
static void put_nibbles(const uint8_t step[8][32], uint8_t *L) {
    for (int v = 0; v < 4; v++)
        for (int p = 0; p < 32; p++) L[32 * v + p] = (uint8_t)((step[2 * v][p] & 15) | ((step[2 * v + 1][p] & 15) << 4));
}

/* One full group: the GGUF bytes of 256 values (one Q4_K/Q6_K block, eight of the others) -> its stored layout. */
static void repack_group(int type, const uint8_t *b, uint8_t *o) {
    uint8_t vals[8][32], step[8][32];
    if (type == T_Q4_K) { /* scales and mins: 6 bits each, the GGUF's 12 bytes unpacked to 8 + 8 */
        const uint8_t *s = b + 4;
        memcpy(o, b, 4);
        for (int l = 0; l < 4; l++) {
            o[4 + l] = s[l] & 63;
            o[8 + l] = (uint8_t)((s[8 + l] & 15) | ((s[l] >> 2) & 0x30));
            o[12 + l] = s[4 + l] & 63;
            o[16 + l] = (uint8_t)((s[8 + l] >> 4) | ((s[4 + l] >> 2) & 0x30));
        }
        for (int c = 0; c < 4; c++) /* 32 bytes hold block 2c in their low nibbles, 2c + 1 in their high ones */
            for (int p = 0; p < 32; p++) {
                vals[2 * c][p] = b[16 + 32 * c + p] & 15;
                vals[2 * c + 1][p] = b[16 + 32 * c + p] >> 4;
            }
        interleave(vals, step);
        put_nibbles(step, o + 20);
        return;
    }
    if (type == T_Q6_K) { /* per half h: ql[64] nibbles (values 64s + p at shift 4s), qh[32] 2-bit pairs (32s + k) */
        for (int l = 0; l < 8; l++) {
            int h = l >> 2;
            for (int k = 0; k < 32; k++) {
                uint8_t lo = (b[64 * h + 32 * (l & 1) + k] >> (4 * ((l >> 1) & 1))) & 15;
                uint8_t hi = (b[128 + 32 * h + k] >> (2 * (l & 3))) & 3;
                vals[l][k] = (uint8_t)(lo | (hi << 4));
            }
        }
        o[0] = b[208];
        o[1] = b[209];
        for (int l = 0; l < 8; l++) { /* 16 scales: block l's values 0-15 (A), then 16-31 (B) */
            o[2 + l] = b[192 + 2 * l];
            o[10 + l] = b[193 + 2 * l];
        }
        interleave(vals, step);
        put_nibbles(step, o + 18);
        for (int h = 0; h < 2; h++)
            for (int p = 0; p < 32; p++) {
                uint8_t x = 0;
                for (int t = 0; t < 4; t++) x |= (uint8_t)(((step[4 * h + t][p] >> 4) & 3) << (2 * t));
                o[146 + 32 * h + p] = x;
            }
        return;
    }
    const int nb = GGUF_BYTES[type];
    for (int l = 0; l < 8; l++) { /* eight blocks of 32: each block's scale (and Q4_1's offset) side by side */
        const uint8_t *bl = b + nb * l;
        o[2 * l] = bl[0];
        o[2 * l + 1] = bl[1];
        if (type == T_Q8_0) {
            memcpy(vals[l], bl + 2, 32);
        } else if (type == T_Q4_1) {
            o[16 + 2 * l] = bl[2];
            o[17 + 2 * l] = bl[3];
            for (int k = 0; k < 16; k++) {
                vals[l][k] = bl[4 + k] & 15;
                vals[l][16 + k] = bl[4 + k] >> 4;
            }
        } else { /* Q5_0: bit k of the little-endian qh is value k's 5th bit */
            uint32_t qh;
            memcpy(&qh, bl + 2, 4);
            for (int k = 0; k < 16; k++) {
                vals[l][k] = (uint8_t)((bl[6 + k] & 15) | (((qh >> k) & 1) << 4));
                vals[l][16 + k] = (uint8_t)((bl[6 + k] >> 4) | (((qh >> (k + 16)) & 1) << 4));
            }
        }
    }
    interleave(vals, step);
    if (type == T_Q8_0) {
        memcpy(o + 16, step, 256);
    } else if (type == T_Q4_1) {
        put_nibbles(step, o + 32);
    } else {
        put_nibbles(step, o + 16);
        for (int p = 0; p < 32; p++) {
            uint8_t x = 0;
            for (int j = 0; j < 8; j++) x |= (uint8_t)(((step[j][p] >> 4) & 1) << j);
            o[144 + p] = x;
        }
    }
}

typedef struct {
    int type;
    int64_t K, N;
    const uint8_t *src;
    uint8_t *dst;
} repack_t;

enum { REPACK_ROWS = 64 };

void bq_parallel(void (*task)(void *, int64_t), void *ctx, int64_t n, int nthreads);

static void repack_rows(void *ctx, int64_t c) {
    const repack_t *r = ctx;
    const int64_t ng = r->K / 256, nt = (r->K % 256) / 32, bs = r->type <= T_Q6_K ? 256 : 32;
    const int64_t in_bytes = r->K / bs * GGUF_BYTES[r->type], out_bytes = bq_row_bytes(r->type, r->K);
    const int64_t in_group = 256 / bs * GGUF_BYTES[r->type];
    const int64_t end = (c + 1) * REPACK_ROWS < r->N ? (c + 1) * REPACK_ROWS : r->N;
    for (int64_t n = c * REPACK_ROWS; n < end; n++) {
        const uint8_t *in = r->src + n * in_bytes;
        uint8_t *out = r->dst + n * out_bytes;
        for (int64_t g = 0; g < ng; g++) repack_group(r->type, in + g * in_group, out + g * GROUP_BYTES[r->type]);
        memcpy(out + ng * GROUP_BYTES[r->type], in + ng * in_group, (size_t)(nt * GGUF_BYTES[r->type]));
    }
}

/* N GGUF rows of K values (src: N x the file's row bytes) -> the stored layout (dst: N x bq_row_bytes), on up to
   nthreads threads. 0, or -1 for a type or K the layout lacks (the K-quants need K % 256 == 0). */
int bq_repack(int type, const uint8_t *src, int64_t N, int64_t K, uint8_t *dst, int nthreads) {
    if (type < 0 || type > T_Q5_0 || K <= 0 || K % 32 || (type <= T_Q6_K && K % 256)) return -1;
    repack_t r = {type, K, N, src, dst};
    bq_parallel(repack_rows, &r, (N + REPACK_ROWS - 1) / REPACK_ROWS, nthreads);
    return 0;
}

/* ---------------------------------------------------------------- activations */

typedef struct {
    int64_t K, ldd;     /* ldd: per-row length of the per-block arrays (whole groups of 8, zero padded) */
    int8_t *xq;         /* [M, K]: full groups interleaved like the weights, tail blocks in order */
    float *dx, *dxsx;   /* [M, ldd]: block scale, scale * sum(q) */
    int32_t *n16, *n128, *nA, *nB; /* [M, ldd]: -16 sum(q), -128 sum(q), -32 sum(q[0:16]), -32 sum(q[16:32]) */
} act_t;

/* Block b of stored row r: its 32 int8 values (full groups interleaved like the weights), scale and sums. */
static void put_block(act_t *a, int64_t r, int64_t b, const int8_t q[32], float d, int sA, int sB) {
    int64_t K = a->K, nfull = K / 256 * 8;
    int8_t *xr8 = a->xq + r * K;
    if (b < nfull) {
        int64_t g = b / 8, l = b % 8;
        for (int j = 0; j < 8; j++) memcpy(xr8 + g * 256 + 32 * j + 4 * l, q + 4 * j, 4);
    } else {
        memcpy(xr8 + b * 32, q, 32);
    }
    int sx = sA + sB;
    int64_t o = r * a->ldd + b;
    a->dx[o] = d;
    a->dxsx[o] = d * (float)sx;
    a->n16[o] = -16 * sx;
    a->n128[o] = -128 * sx;
    a->nA[o] = -32 * sA;
    a->nB[o] = -32 * sB;
}

static void pad_row(act_t *a, int64_t r) {
    for (int64_t b = a->K / 32; b < a->ldd; b++) {
        int64_t o = r * a->ldd + b;
        a->dx[o] = a->dxsx[o] = 0.0f;
        a->n16[o] = a->n128[o] = a->nA[o] = a->nB[o] = 0;
    }
}

/* Row r alone: the same ops on every path and whatever M. */
static void quantize_row(const float *xr, act_t *a, int64_t r) {
    int64_t nb = a->K / 32;
    for (int64_t b = 0; b < nb; b++) {
        const float *v = xr + b * 32;
        int8_t q[32];
        float amax = 0.0f;
        int sA = 0, sB = 0;
#if BQ_SIMD
        const __m256 absm = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
        __m256 m = _mm256_max_ps(_mm256_max_ps(_mm256_and_ps(_mm256_loadu_ps(v), absm),
                                               _mm256_and_ps(_mm256_loadu_ps(v + 8), absm)),
                                 _mm256_max_ps(_mm256_and_ps(_mm256_loadu_ps(v + 16), absm),
                                               _mm256_and_ps(_mm256_loadu_ps(v + 24), absm)));
        __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        m4 = _mm_max_ss(m4, _mm_shuffle_ps(m4, m4, 1));
        amax = _mm_cvtss_f32(m4);
#else
        for (int l = 0; l < 32; l++) {
            float f = fabsf(v[l]);
            amax = f > amax ? f : amax;
        }
#endif
        float d = amax / 127.0f, id = amax > 0.0f ? 127.0f / amax : 0.0f;
#if BQ_SIMD
        const __m256 vid = _mm256_set1_ps(id), hi = _mm256_set1_ps(127.0f), lo = _mm256_set1_ps(-127.0f);
        __m256i qi[4];
        for (int j = 0; j < 4; j++) {
            __m256 t = _mm256_mul_ps(_mm256_loadu_ps(v + 8 * j), vid);
            t = _mm256_round_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
            t = _mm256_min_ps(_mm256_max_ps(t, lo), hi);
            qi[j] = _mm256_cvtps_epi32(t);
        }
        __m256i s2[2] = {_mm256_add_epi32(qi[0], qi[1]), _mm256_add_epi32(qi[2], qi[3])};
        int sums[2];
        for (int h = 0; h < 2; h++) {
            __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(s2[h]), _mm256_extracti128_si256(s2[h], 1));
            s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4e));
            s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xb1));
            sums[h] = _mm_cvtsi128_si32(s4);
        }
        sA = sums[0];
        sB = sums[1];
        __m256i p8 = _mm256_packs_epi16(_mm256_packs_epi32(qi[0], qi[1]), _mm256_packs_epi32(qi[2], qi[3]));
        p8 = _mm256_permutevar8x32_epi32(p8, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        _mm256_storeu_si256((__m256i *)q, p8);
#else
        for (int l = 0; l < 32; l++) {
            float t = nearbyintf(v[l] * id);
            t = t < -127.0f ? -127.0f : (t > 127.0f ? 127.0f : t);
            q[l] = (int8_t)t;
            if (l < 16) sA += q[l];
            else sB += q[l];
        }
#endif
        put_block(a, r, b, q, d, sA, sB);
    }
    pad_row(a, r);
}

/* Row r at about 15 bits (bq_mm's planes = 2): per block of 32, s = max|x| / 32512 and n = rint(x / s) clamped
   to [-32512, 32512], written as n = 255 h + l with h, l in [-127, 127] (h = floor((n + 127) / 255)): stored
   row 2r holds h at scale 255 s, row 2r + 1 holds l at scale s, two ordinary rows of the int8 product whose
   results the caller adds. The same plain C ops on every path (no SIMD: one code, the same bits). */
static void quantize_row_planes(const float *xr, act_t *a, int64_t r) {
    int64_t nb = a->K / 32;
    for (int64_t b = 0; b < nb; b++) {
        const float *v = xr + b * 32;
        float amax = 0.0f;
        for (int l = 0; l < 32; l++) {
            float f = fabsf(v[l]);
            amax = f > amax ? f : amax;
        }
        float s = amax / 32512.0f, id = amax > 0.0f ? 32512.0f / amax : 0.0f;
        int8_t qh[32], ql[32];
        int hA = 0, hB = 0, lA = 0, lB = 0;
        for (int l = 0; l < 32; l++) {
            float t = nearbyintf(v[l] * id);
            t = t < -32512.0f ? -32512.0f : (t > 32512.0f ? 32512.0f : t);
            int n = (int)t, h = (n + 127 + 255 * 128) / 255 - 128, lo = n - 255 * h;
            qh[l] = (int8_t)h;
            ql[l] = (int8_t)lo;
            if (l < 16) { hA += h; lA += lo; } else { hB += h; lB += lo; }
        }
        put_block(a, 2 * r, b, qh, 255.0f * s, hA, hB);
        put_block(a, 2 * r + 1, b, ql, s, lA, lB);
    }
    pad_row(a, 2 * r);
    pad_row(a, 2 * r + 1);
}

/* ---------------------------------------------------------------- dot products: one stored row, R rows */

#define MAX_ROWS_TILE 9

static inline float hsum_fixed(const float v[8]) {
    float s0 = v[0] + v[4], s1 = v[1] + v[5], s2 = v[2] + v[6], s3 = v[3] + v[7];
    return (s0 + s2) + (s1 + s3);
}

#if BQ_SIMD
#if (defined(__AVX512VNNI__) && defined(__AVX512VL__)) || defined(__AVXVNNI__)
#define BQ_VNNI 1
static inline __m256i dp(__m256i acc, __m256i w, __m256i x) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
    return _mm256_dpbusd_epi32(acc, w, x);
#else
    return _mm256_dpbusd_avx_epi32(acc, w, x);
#endif
}
#else
#define BQ_VNNI 0
static inline __m256i dp(__m256i acc, __m256i w, __m256i x) { /* |w| <= 128, |x| <= 127: no saturation */
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(w, x), _mm256_set1_epi16(1)));
}
#endif

static inline float hsum8(__m256 v) { /* = hsum_fixed */
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    return _mm_cvtss_f32(s);
}

static inline int32_t hsum_i32(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
    return _mm_cvtsi128_si32(s);
}

#define LD(p) _mm256_loadu_si256((const __m256i *)(p))

/* 128 bytes of packed nibbles -> W[0..7]: 32 bytes' low nibbles, then their high nibbles, per 32 bytes */
static inline __attribute__((always_inline)) void nibbles(const uint8_t *p, __m256i W[8]) {
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    for (int v = 0; v < 4; v++) {
        __m256i L = LD(p + 32 * v);
        W[2 * v] = _mm256_and_si256(L, m4);
        W[2 * v + 1] = _mm256_and_si256(_mm256_srli_epi16(L, 4), m4);
    }
}

/* A Q4_K, Q6_K or Q4_1 group's weight integers (W[j]: step j, unsigned) and float scales: sA (sB) of each block's
   values 0-15 (16-31; Q6_K only), off the offset coefficient (Q4_K: -dmin * m, Q4_1: m) */
static inline __attribute__((always_inline)) void unpack_group(int type, const uint8_t *wp, __m256i W[8], __m256 *sA,
                                                                __m256 *sB, __m256 *off) {
    if (type == T_Q4_1) {
        *sA = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)wp));
        *off = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(wp + 16)));
        nibbles(wp + 32, W);
        return;
    }
    if (type == T_Q4_K) {
        *sA = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(wp + 4)))),
                            _mm256_set1_ps(h2f(rd16(wp))));
        *off = _mm256_mul_ps(_mm256_set1_ps(-h2f(rd16(wp + 2))),
                             _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(wp + 12)))));
        nibbles(wp + 20, W);
        return;
    }
    __m256 d = _mm256_set1_ps(h2f(rd16(wp)));
    *sA = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(wp + 2)))));
    *sB = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(wp + 10)))));
    const __m256i m2 = _mm256_set1_epi8(0x30);
    __m256i H0 = LD(wp + 146), H1 = LD(wp + 178);
    nibbles(wp + 18, W);
    W[0] = _mm256_or_si256(W[0], _mm256_and_si256(_mm256_slli_epi16(H0, 4), m2));
    W[1] = _mm256_or_si256(W[1], _mm256_and_si256(_mm256_slli_epi16(H0, 2), m2));
    W[2] = _mm256_or_si256(W[2], _mm256_and_si256(H0, m2));
    W[3] = _mm256_or_si256(W[3], _mm256_and_si256(_mm256_srli_epi16(H0, 2), m2));
    W[4] = _mm256_or_si256(W[4], _mm256_and_si256(_mm256_slli_epi16(H1, 4), m2));
    W[5] = _mm256_or_si256(W[5], _mm256_and_si256(_mm256_slli_epi16(H1, 2), m2));
    W[6] = _mm256_or_si256(W[6], _mm256_and_si256(H1, m2));
    W[7] = _mm256_or_si256(W[7], _mm256_and_si256(_mm256_srli_epi16(H1, 2), m2));
}

/* One tail block (bp: its GGUF bytes): its weight integers Wt (unsigned, as dp takes them), Q8_0's signed ones Qt
   (for the sign trick without VNNI), its scale and Q4_1's offset m (else 0) */
static inline __attribute__((always_inline)) void unpack_tail(int type, const uint8_t *bp, __m256i *Wt, __m256i *Qt,
                                                               float *sc, float *of) {
    *sc = h2f(rd16(bp));
    *of = 0.0f;
    *Qt = _mm256_setzero_si256();
    if (type == T_Q8_0) {
        *Qt = LD(bp + 2);
#if BQ_VNNI
        *Wt = _mm256_xor_si256(*Qt, _mm256_set1_epi8((char)0x80));
#else
        *Wt = _mm256_abs_epi8(*Qt);
#endif
        return;
    }
    __m128i l = _mm_loadu_si128((const __m128i *)(bp + (type == T_Q4_1 ? 4 : 6)));
    *Wt = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(l, 4), l), _mm256_set1_epi8(0x0f));
    if (type == T_Q4_1) {
        *of = h2f(rd16(bp + 2));
        return;
    }
    uint32_t qh;
    memcpy(&qh, bp + 2, 4);
    /* bit k of qh -> bit 4 of byte k */
    __m256i hb = _mm256_shuffle_epi8(_mm256_set1_epi32((int)qh),
                                     _mm256_setr_epi64x(0, 0x0101010101010101LL, 0x0202020202020202LL,
                                                        0x0303030303030303LL));
    hb = _mm256_and_si256(hb, _mm256_set1_epi64x((long long)0x8040201008040201ULL));
    hb = _mm256_and_si256(_mm256_cmpeq_epi8(hb, _mm256_set1_epi64x((long long)0x8040201008040201ULL)),
                          _mm256_set1_epi8(0x10));
    *Wt = _mm256_or_si256(*Wt, hb);
}

/* lane i = the sum of v[i]'s 8 lanes (integer sums: exact in any order) */
static inline __m256i hsum_i32x8(const __m256i v[8]) {
    __m256i u0 = _mm256_hadd_epi32(_mm256_hadd_epi32(v[0], v[1]), _mm256_hadd_epi32(v[2], v[3]));
    __m256i u1 = _mm256_hadd_epi32(_mm256_hadd_epi32(v[4], v[5]), _mm256_hadd_epi32(v[6], v[7]));
    return _mm256_add_epi32(_mm256_permute2x128_si256(u0, u1, 0x20), _mm256_permute2x128_si256(u0, u1, 0x31));
}

/* The K % 256 tail blocks (32-value types, GGUF layout, values in order) of stored rows (outputs) w0, w0 +
   row_bytes, ... (nout of them, 1 to 8) for rows r0..r0+R: tails[r][i] = row r's tail accumulator for output i,
   one float per (row, output), lane i = output i. Each lane gets the scalar path's ops in its order (per block:
   fma(float(isum), scale * dx, t), then for Q4_1 fma(m, dx * sum, t)); eight outputs share each activation load
   and one transposing sum of their integer lanes, where one output at a time had summed each block's lanes
   alone (SmolLM2's 576-wide rows: 2 tail blocks against 16 in groups, and a fifth of a 17-token pass's products). */
static void tail_outputs(int type, const uint8_t *w0, int64_t row_bytes, int nout, const act_t *a, int64_t r0, int R,
                         float tails[][8]) {
    const int64_t K = a->K, ldd = a->ldd, ng = K / 256, nt = (K % 256) / 32;
    const int GB = GROUP_BYTES[type];
    __m256 acc[MAX_ROWS_TILE];
    for (int r = 0; r < R; r++) acc[r] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nt; b++) {
        __m256i Wt[8], Qt[8];
        float scs[8], ofs[8];
        for (int i = 0; i < 8; i++) /* lanes past nout: a copy of the last output, not stored */
            unpack_tail(type, w0 + (i < nout ? i : nout - 1) * row_bytes + ng * GB + b * TAIL_BYTES[type], &Wt[i],
                        &Qt[i], &scs[i], &ofs[i]);
        const __m256 sc = _mm256_loadu_ps(scs), of = _mm256_loadu_ps(ofs);
        const int64_t bi = ng * 8 + b;
        for (int r = 0; r < R; r++) {
            const __m256i xv = LD(a->xq + (r0 + r) * K + bi * 32);
            __m256i v[8];
            for (int i = 0; i < 8; i++) {
#if !BQ_VNNI
                if (type == T_Q8_0) {
                    v[i] = dp(_mm256_setzero_si256(), Wt[i], _mm256_sign_epi8(xv, Qt[i]));
                    continue;
                }
#endif
                v[i] = dp(_mm256_setzero_si256(), Wt[i], xv);
            }
            __m256i isum = hsum_i32x8(v);
            const int64_t o = (r0 + r) * ldd + bi;
            if (type == T_Q5_0) isum = _mm256_add_epi32(isum, _mm256_set1_epi32(a->n16[o]));
#if BQ_VNNI
            if (type == T_Q8_0) isum = _mm256_add_epi32(isum, _mm256_set1_epi32(a->n128[o]));
#endif
            acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(sc, _mm256_set1_ps(a->dx[o])), acc[r]);
            if (type == T_Q4_1) acc[r] = _mm256_fmadd_ps(of, _mm256_set1_ps(a->dxsx[o]), acc[r]);
        }
    }
    for (int r = 0; r < R; r++) _mm256_storeu_ps(tails[r], acc[r]);
}

/* The K % 256 tail blocks (32-value types, GGUF layout, values in order) of one stored row: acct[r] for rows
   r0..r0+R, one scalar accumulator per row. */
static inline __attribute__((always_inline)) void tail_rows(int type, const uint8_t *w, const act_t *a, int64_t r0,
                                                             int R, float *acct) {
    const int64_t K = a->K, ldd = a->ldd, ng = K / 256, nt = (K % 256) / 32;
    const int GB = GROUP_BYTES[type];
    for (int64_t b = 0; b < nt; b++) {
        __m256i Wt, Qt;
        float sc, of;
        unpack_tail(type, w + ng * GB + b * TAIL_BYTES[type], &Wt, &Qt, &sc, &of);
        const int64_t bi = ng * 8 + b;
        for (int r = 0; r < R; r++) {
            __m256i xv = LD(a->xq + (r0 + r) * K + bi * 32);
#if !BQ_VNNI
            if (type == T_Q8_0) xv = _mm256_sign_epi8(xv, Qt);
#endif
            int32_t isum = hsum_i32(dp(_mm256_setzero_si256(), Wt, xv));
            const int64_t o = (r0 + r) * ldd + bi;
            if (type == T_Q5_0) isum += a->n16[o];
#if BQ_VNNI
            if (type == T_Q8_0) isum += a->n128[o];
#endif
            acct[r] = fmaf((float)isum, sc * a->dx[o], acct[r]);
            if (type == T_Q4_1) acct[r] = fmaf(of, a->dxsx[o], acct[r]);
        }
    }
}

/* group g (wp: its bytes) of one stored row for rows r0..r0+R, into acc[r] (the group's parity slot) */
static inline __attribute__((always_inline)) void dot_group(int type, const uint8_t *wp, const act_t *a, int64_t r0,
                                                             int R, int64_t g, __m256 *acc) {
    const int64_t K = a->K, ldd = a->ldd;
        __m256i W[8];
        __m256i Q[8]; /* Q8_0 without VNNI: the signed integers, for the sign trick */
        __m256 sA, sB = _mm256_setzero_ps(), off = _mm256_setzero_ps();
        (void)Q;
        if (type == T_Q4_K || type == T_Q6_K || type == T_Q4_1) {
            unpack_group(type, wp, W, &sA, &sB, &off);
        } else if (type == T_Q8_0) {
            sA = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)wp));
            for (int j = 0; j < 8; j++) {
#if BQ_VNNI
                W[j] = _mm256_xor_si256(LD(wp + 16 + 32 * j), _mm256_set1_epi8((char)0x80));
#else
                Q[j] = LD(wp + 16 + 32 * j);
                W[j] = _mm256_abs_epi8(Q[j]);
#endif
            }
        } else {
            sA = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)wp));
            const __m256i b4 = _mm256_set1_epi8(0x10);
            __m256i H = LD(wp + 144);
            nibbles(wp + 16, W);
            W[0] = _mm256_or_si256(W[0], _mm256_and_si256(_mm256_slli_epi16(H, 4), b4));
            W[1] = _mm256_or_si256(W[1], _mm256_and_si256(_mm256_slli_epi16(H, 3), b4));
            W[2] = _mm256_or_si256(W[2], _mm256_and_si256(_mm256_slli_epi16(H, 2), b4));
            W[3] = _mm256_or_si256(W[3], _mm256_and_si256(_mm256_slli_epi16(H, 1), b4));
            W[4] = _mm256_or_si256(W[4], _mm256_and_si256(H, b4));
            W[5] = _mm256_or_si256(W[5], _mm256_and_si256(_mm256_srli_epi16(H, 1), b4));
            W[6] = _mm256_or_si256(W[6], _mm256_and_si256(_mm256_srli_epi16(H, 2), b4));
            W[7] = _mm256_or_si256(W[7], _mm256_and_si256(_mm256_srli_epi16(H, 3), b4));
        }
        for (int r = 0; r < R; r++) {
            const int8_t *x = a->xq + (r0 + r) * K + g * 256;
            const int64_t o = (r0 + r) * ldd + g * 8;
            const __m256 dx = _mm256_loadu_ps(a->dx + o);
            __m256 *ac = &acc[r];
            if (type == T_Q6_K) {
                __m256i iA, iB;
                if (R >= 4) { /* rows enough to hide the latency: one chain, no adds (integer sums: any order) */
                    iA = dp(dp(dp(dp(LD(a->nA + o), W[0], LD(x)), W[1], LD(x + 32)), W[2], LD(x + 64)), W[3], LD(x + 96));
                    iB = dp(dp(dp(dp(LD(a->nB + o), W[4], LD(x + 128)), W[5], LD(x + 160)), W[6], LD(x + 192)), W[7],
                            LD(x + 224));
                } else {
                    __m256i i0 = dp(LD(a->nA + o), W[0], LD(x)), i1 = dp(_mm256_setzero_si256(), W[1], LD(x + 32));
                    i0 = dp(i0, W[2], LD(x + 64));
                    i1 = dp(i1, W[3], LD(x + 96));
                    __m256i j0 = dp(LD(a->nB + o), W[4], LD(x + 128)), j1 = dp(_mm256_setzero_si256(), W[5], LD(x + 160));
                    j0 = dp(j0, W[6], LD(x + 192));
                    j1 = dp(j1, W[7], LD(x + 224));
                    iA = _mm256_add_epi32(i0, i1);
                    iB = _mm256_add_epi32(j0, j1);
                }
                *ac = _mm256_fmadd_ps(_mm256_cvtepi32_ps(iA), _mm256_mul_ps(sA, dx), *ac);
                *ac = _mm256_fmadd_ps(_mm256_cvtepi32_ps(iB), _mm256_mul_ps(sB, dx), *ac);
            } else {
                __m256i i0, i1 = _mm256_setzero_si256();
                if (type == T_Q5_0) i0 = LD(a->n16 + o);
#if BQ_VNNI
                else if (type == T_Q8_0) i0 = LD(a->n128 + o);
#endif
                else i0 = _mm256_setzero_si256();
                for (int j = 0; j < 8; j += 2) {
                    __m256i x0 = LD(x + 32 * j), x1 = LD(x + 32 * j + 32);
#if !BQ_VNNI
                    if (type == T_Q8_0) { x0 = _mm256_sign_epi8(x0, Q[j]); x1 = _mm256_sign_epi8(x1, Q[j + 1]); }
#endif
                    i0 = dp(i0, W[j], x0);
                    if (R >= 4) i0 = dp(i0, W[j + 1], x1); /* one chain where rows hide its latency */
                    else i1 = dp(i1, W[j + 1], x1);
                }
                if (R < 4) i0 = _mm256_add_epi32(i0, i1);
                *ac = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i0), _mm256_mul_ps(sA, dx), *ac);
                if (has_off(type)) *ac = _mm256_fmadd_ps(off, _mm256_loadu_ps(a->dxsx + o), *ac);
            }
        }
    }

/* defer: the full groups' sum only (res[r] = the hsum below; the caller adds the tail accumulator that
   tail_outputs computed, in the same one add); else the tail blocks too (tail_rows) */
static inline __attribute__((always_inline)) void dot_rows(int type, const uint8_t *w, const act_t *a,
                                                            int64_t r0, int R, int defer, float *res) {
    const int64_t ng = a->K / 256, row_bytes = bq_row_bytes(type, a->K);
    const int GB = GROUP_BYTES[type];
    __m256 acc0[MAX_ROWS_TILE], acc1[MAX_ROWS_TILE];
    float acct[MAX_ROWS_TILE];
    for (int r = 0; r < R; r++) { acc0[r] = acc1[r] = _mm256_setzero_ps(); acct[r] = 0.0f; }
    /* unrolled by two so that each parity's accumulators can stay in registers */
    int64_t g = 0;
    for (; g + 2 <= ng; g += 2) {
        /* the next output's bytes (several rows), or the one after it (one row), fetched in order as this one's
           are read. Qwen2.5-1.5B's 196 layer matrices streamed from DRAM, two threads: on the EPYC 9 rows 83 -> 78 ms,
           17 rows 143 -> 136; on a Xeon with AMX (its prefetchers left one row's stream at 17-18 GB/s) one row, with
           its head, 55.3-56.6 -> 46.8-47.6 ms, where the next output (51.9-52.9) or 4-16 ahead (50.5-52.0) did less */
        for (int c = 0; c < 2 * GB; c += 64)
            _mm_prefetch((const char *)(w + (R == 1 ? 2 : 1) * row_bytes + g * GB + c), _MM_HINT_T0);
        dot_group(type, w + g * GB, a, r0, R, g, acc0);
        dot_group(type, w + (g + 1) * GB, a, r0, R, g + 1, acc1);
    }
    if (g < ng) dot_group(type, w + g * GB, a, r0, R, g, acc0);
    if (defer) {
        for (int r = 0; r < R; r++) res[r] = hsum8(_mm256_add_ps(acc0[r], acc1[r]));
        return;
    }
    tail_rows(type, w, a, r0, R, acct);
    for (int r = 0; r < R; r++) res[r] = hsum8(_mm256_add_ps(acc0[r], acc1[r])) + acct[r];
}

/* Two outputs (stored rows) at a time, Q4_K and Q6_K, in 256-bit registers: both outputs' weights unpacked, each
   activation vector loaded once and used for both (one load per dpbusd had bound the multi-row kernel: on the
   2-core EPYC, rows of 1536 at 17-99 rows ran 25-27 -> 30-33 multiply-adds a cycle). A tile's accumulators live in
   a small array (L1) rather than registers: 2 outputs x 2 parities x 9 rows would not fit. Each (row, output) lane
   gets exactly dot_rows' float operations in the same order, so an output's bits do not depend on its pairing. */
#define BQ_PAIR 1
static inline __attribute__((always_inline)) void dot2_group(int type, const uint8_t *p0, const uint8_t *p1,
                                                              const act_t *a, int64_t r0, int R, int64_t g,
                                                              __m256 (*acc)[2][2]) {
    const int64_t K = a->K, ldd = a->ldd;
    const int q = (int)(g & 1);
    __m256i W0[8], W1[8];
    __m256 sA0, sB0 = _mm256_setzero_ps(), off0 = _mm256_setzero_ps();
    __m256 sA1, sB1 = _mm256_setzero_ps(), off1 = _mm256_setzero_ps();
    unpack_group(type, p0, W0, &sA0, &sB0, &off0);
    unpack_group(type, p1, W1, &sA1, &sB1, &off1);
    for (int r = 0; r < R; r++) {
        const int8_t *x = a->xq + (r0 + r) * K + g * 256;
        const int64_t o = (r0 + r) * ldd + g * 8;
        const __m256 dx = _mm256_loadu_ps(a->dx + o);
        /* the empty asm keeps each activation vector in a register: the compiler would otherwise fold it into
           both dpbusd as a memory operand, two loads where one does */
        if (type == T_Q6_K) {
            __m256i a0 = LD(a->nA + o), b0 = LD(a->nB + o), a1 = a0, b1 = b0;
            for (int k = 0; k < 4; k++) {
                __m256i xa = LD(x + 32 * k), xb = LD(x + 128 + 32 * k);
                __asm__("" : "+v"(xa), "+v"(xb));
                a0 = dp(a0, W0[k], xa);
                a1 = dp(a1, W1[k], xa);
                b0 = dp(b0, W0[k + 4], xb);
                b1 = dp(b1, W1[k + 4], xb);
            }
            acc[r][0][q] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(a0), _mm256_mul_ps(sA0, dx), acc[r][0][q]);
            acc[r][0][q] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(b0), _mm256_mul_ps(sB0, dx), acc[r][0][q]);
            acc[r][1][q] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(a1), _mm256_mul_ps(sA1, dx), acc[r][1][q]);
            acc[r][1][q] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(b1), _mm256_mul_ps(sB1, dx), acc[r][1][q]);
        } else { /* Q4_K, Q4_1: two chains per output (integer sums: any order) */
            __m256i i0 = _mm256_setzero_si256(), i1 = i0, j0 = i0, j1 = i0;
            for (int k = 0; k < 8; k += 2) {
                __m256i xv = LD(x + 32 * k), xw = LD(x + 32 * k + 32);
                __asm__("" : "+v"(xv), "+v"(xw));
                i0 = dp(i0, W0[k], xv);
                i1 = dp(i1, W1[k], xv);
                j0 = dp(j0, W0[k + 1], xw);
                j1 = dp(j1, W1[k + 1], xw);
            }
            const __m256 dxs = _mm256_loadu_ps(a->dxsx + o);
            acc[r][0][q] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_add_epi32(i0, j0)), _mm256_mul_ps(sA0, dx),
                                           acc[r][0][q]);
            acc[r][0][q] = _mm256_fmadd_ps(off0, dxs, acc[r][0][q]);
            acc[r][1][q] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_add_epi32(i1, j1)), _mm256_mul_ps(sA1, dx),
                                           acc[r][1][q]);
            acc[r][1][q] = _mm256_fmadd_ps(off1, dxs, acc[r][1][q]);
        }
    }
}

/* outputs w0 and w1 = w0 + row_bytes for rows r0..r0+R */
static inline __attribute__((always_inline)) void dot2_rows(int type, const uint8_t *w0, const act_t *a, int64_t r0,
                                                             int R, float *res0, float *res1) {
    const int64_t ng = a->K / 256, row_bytes = bq_row_bytes(type, a->K);
    const int GB = GROUP_BYTES[type];
    const uint8_t *w1 = w0 + row_bytes, *next = w1 + row_bytes;
    __m256 acc[MAX_ROWS_TILE][2][2];
    float acct0[MAX_ROWS_TILE], acct1[MAX_ROWS_TILE];
    for (int r = 0; r < R; r++) {
        acc[r][0][0] = acc[r][0][1] = acc[r][1][0] = acc[r][1][1] = _mm256_setzero_ps();
        acct0[r] = acct1[r] = 0.0f;
    }
    for (int64_t g = 0; g < ng; g++) {
        /* two rows read side by side, which the hardware prefetchers follow poorly: the next pair's bytes (two
           adjacent rows), fetched in order as a single sequential stream would be */
        for (int c = 0; c < 2 * GB; c += 64) _mm_prefetch((const char *)(next + 2 * g * GB + c), _MM_HINT_T0);
        dot2_group(type, w0 + g * GB, w1 + g * GB, a, r0, R, g, acc);
    }
    if (type == T_Q4_1) { /* tail blocks (K % 256): each output's as dot_rows does them */
        tail_rows(type, w0, a, r0, R, acct0);
        tail_rows(type, w1, a, r0, R, acct1);
    }
    for (int r = 0; r < R; r++) {
        res0[r] = hsum8(_mm256_add_ps(acc[r][0][0], acc[r][0][1])) + acct0[r];
        res1[r] = hsum8(_mm256_add_ps(acc[r][1][0], acc[r][1][1])) + acct1[r];
    }
}
#else
#define BQ_PAIR 0
static void dot_rows(int type, const uint8_t *w, const act_t *a, int64_t r0, int R, int defer, float *res) {
    (void)defer; /* never set without SIMD (no tail_outputs): the tail blocks are summed here */
    const int64_t K = a->K, ldd = a->ldd, ng = K / 256, nt = (K % 256) / 32;
    int v[8][32];
    float scA[8], scB[8], off[8];
    float acc[MAX_ROWS_TILE][2][8], acct[MAX_ROWS_TILE];
    memset(acc, 0, sizeof acc);
    for (int r = 0; r < R; r++) acct[r] = 0.0f;
    for (int64_t g = 0; g < ng; g++) {
        decode_group(type, w + g * GROUP_BYTES[type], v, scA, scB, off);
        for (int r = 0; r < R; r++) {
            const int8_t *x = a->xq + (r0 + r) * K + g * 256;
            const int64_t o = (r0 + r) * ldd + g * 8;
            float *ac = acc[r][g & 1];
            for (int l = 0; l < 8; l++) {
                int32_t iA = 0, iB = 0;
                for (int k = 0; k < 32; k++) {
                    int32_t p = v[l][k] * x[(k / 4) * 32 + 4 * l + k % 4];
                    if (k < 16) iA += p;
                    else iB += p;
                }
                if (type == T_Q6_K) {
                    ac[l] = fmaf((float)iA, scA[l] * a->dx[o + l], ac[l]);
                    ac[l] = fmaf((float)iB, scB[l] * a->dx[o + l], ac[l]);
                } else {
                    ac[l] = fmaf((float)(iA + iB), scA[l] * a->dx[o + l], ac[l]);
                    if (has_off(type)) ac[l] = fmaf(off[l], a->dxsx[o + l], ac[l]);
                }
            }
        }
    }
    for (int64_t b = 0; b < nt; b++) {
        int vb[32];
        float sc, of;
        decode_block(type, w + ng * GROUP_BYTES[type] + b * TAIL_BYTES[type], vb, &sc, &of);
        const int64_t bi = ng * 8 + b;
        for (int r = 0; r < R; r++) {
            const int8_t *x = a->xq + (r0 + r) * K + bi * 32;
            int32_t isum = 0;
            for (int k = 0; k < 32; k++) isum += vb[k] * x[k];
            const int64_t o = (r0 + r) * ldd + bi;
            acct[r] = fmaf((float)isum, sc * a->dx[o], acct[r]);
            if (type == T_Q4_1) acct[r] = fmaf(of, a->dxsx[o], acct[r]);
        }
    }
    for (int r = 0; r < R; r++) {
        float s[8];
        for (int l = 0; l < 8; l++) s[l] = acc[r][0][l] + acc[r][1][l];
        res[r] = hsum_fixed(s) + acct[r];
    }
}
#endif

/* ---------------------------------------------------------------- jobs and the thread pool */

typedef struct {
    int32_t type;
    int32_t pad;
    int64_t N;          /* outputs of this part */
    int64_t row_bytes;  /* stored bytes per output */
    const uint8_t *w;   /* [N, row_bytes] */
    const float *bias;  /* [N] or NULL */
    int64_t col0;       /* this part's first column in the output */
} bq_part;

typedef struct {
    const bq_part *parts;
    int nparts;
    int64_t M, ldo, chunk, nchunks;
    int planes;         /* 2: stored rows come in pairs (high, low plane) of one row: the bias goes to the high */
    act_t act;
    float *out;
    int nthreads;
    atomic_int_fast64_t next;
    atomic_int done;    /* workers that joined and finished */
    void (*task)(void *, int64_t); /* a job of bq_parallel: task(ctx, c) for each chunk c (no parts) */
    void *ctx;
    /* AMX (amx_outputs): the activations in tiles of 16 stored rows, NULL where the product does not use it.
       bt [tile][block][8][64]: tile B operands (row k4 of block b: values 4 k4 .. 4 k4 + 3 of each of 16 rows);
       dxT, dxsxT, nAT, nBT [tile][block][16]: act's per-block arrays with the tile's 16 rows side by side */
    uint8_t *bt;
    float *dxT, *dxsxT;
    int32_t *nAT, *nBT;
} job_t;

static inline __attribute__((always_inline)) void dot_any(int type, const uint8_t *w, const act_t *a, int64_t r0,
                                                           int R, int defer, float *res) {
    switch (type) {
    case T_Q4_K: dot_rows(T_Q4_K, w, a, r0, R, defer, res); break;
    case T_Q6_K: dot_rows(T_Q6_K, w, a, r0, R, defer, res); break;
    case T_Q8_0: dot_rows(T_Q8_0, w, a, r0, R, defer, res); break;
    case T_Q4_1: dot_rows(T_Q4_1, w, a, r0, R, defer, res); break;
    default: dot_rows(T_Q5_0, w, a, r0, R, defer, res); break;
    }
}

#define DOT_TILE(NR)                                                                                             \
    static __attribute__((noinline)) void dot_tile##NR(int type, const uint8_t *w, const act_t *a, int64_t r0,   \
                                                       float *res) {                                            \
        dot_any(type, w, a, r0, NR, 0, res);                                                                     \
    }
DOT_TILE(1) DOT_TILE(2) DOT_TILE(3) DOT_TILE(4) DOT_TILE(5) DOT_TILE(6) DOT_TILE(7) DOT_TILE(8) DOT_TILE(9)
typedef void (*dot_tile_fn)(int, const uint8_t *, const act_t *, int64_t, float *);
static const dot_tile_fn DOT_TILES[MAX_ROWS_TILE + 1] = {NULL, dot_tile1, dot_tile2, dot_tile3, dot_tile4,
                                                         dot_tile5, dot_tile6, dot_tile7, dot_tile8, dot_tile9};
#if BQ_SIMD
/* tiles of 8 and 9 rows without the tail blocks: their full groups' sums only (run_outputs
   adds tail_outputs' accumulators) */
#define DOT_TAILLESS_TILE(NR)                                                                                    \
    static __attribute__((noinline)) void dot_tailless_tile##NR(int type, const uint8_t *w, const act_t *a,      \
                                                                int64_t r0, float *res) {                       \
        dot_any(type, w, a, r0, NR, 1, res);                                                                     \
    }
DOT_TAILLESS_TILE(8) DOT_TAILLESS_TILE(9)
#endif

static void store_rows(const job_t *j, float *o, float bias, int64_t r, int R, const float *res) {
    for (int t = 0; t < R; t++) o[(r + t) * j->ldo] = j->planes == 2 && (r + t) % 2 ? res[t] : res[t] + bias;
}

#if BQ_PAIR

#define DOT2_TILE(NR)                                                                                            \
    static __attribute__((noinline)) void dot2_tile##NR(int type, const uint8_t *w0, const act_t *a, int64_t r0, \
                                                        float *res0, float *res1) {                              \
        if (type == T_Q4_K) dot2_rows(T_Q4_K, w0, a, r0, NR, res0, res1);                                        \
        else if (type == T_Q4_1) dot2_rows(T_Q4_1, w0, a, r0, NR, res0, res1);                                   \
        else dot2_rows(T_Q6_K, w0, a, r0, NR, res0, res1);                                                       \
    }
DOT2_TILE(1) DOT2_TILE(2) DOT2_TILE(3) DOT2_TILE(4) DOT2_TILE(5) DOT2_TILE(6) DOT2_TILE(7) DOT2_TILE(8) DOT2_TILE(9)
typedef void (*dot2_tile_fn)(int, const uint8_t *, const act_t *, int64_t, float *, float *);
static const dot2_tile_fn DOT2_TILES[MAX_ROWS_TILE + 1] = {NULL, dot2_tile1, dot2_tile2, dot2_tile3, dot2_tile4,
                                                           dot2_tile5, dot2_tile6, dot2_tile7, dot2_tile8, dot2_tile9};
#endif


/* ---------------------------------------------------------------- AMX tiles (Q4_K, Q6_K; K % 256 == 0)

   Where the CPU has AMX (Intel Sapphire Rapids and later) and the kernel may use it (a Linux permission asked once),
   products of amx_min_rows stored rows or more run their Q4_K and Q6_K outputs 16 at a time on tile
   multiplies: per block of 32 values (Q6_K: per half block of 16), one tdpbusd gives the 16 outputs x 16 rows'
   integer sums, exactly the int32 sums dpbusd gives (integer: any order), plus the same integer block terms; each
   (row, output) then gets the float operations of dot_rows in the same order (the scale products, the fmas into
   its group-parity lane accumulator, the fixed 8-lane tree, + 0, + bias), vectorized over 16 rows instead of 8
   blocks. So a row's result is bit-identical to the other paths, whatever rows share its tile. */
#if BQ_SIMD && defined(__AMX_INT8__) && defined(__AMX_TILE__) && defined(__AVX512F__)
#define BQ_AMX 1
#include <sys/syscall.h>
#include <unistd.h>

typedef struct {
    uint8_t palette, start;
    uint8_t reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} amx_cfg_t;

static atomic_int amx_state; /* 0 not asked yet, 1 usable, -1 refused */

static int amx_usable(void) {
    int s = atomic_load(&amx_state);
    if (s == 0) { /* ARCH_REQ_XCOMP_PERM for XFEATURE_XTILEDATA: the tile data state, once for the process */
        s = syscall(SYS_arch_prctl, 0x1023, 18) == 0 ? 1 : -1;
        atomic_store(&amx_state, s);
    }
    return s == 1;
}

/* the activations' tile layout (job_t.bt ...) for j->M stored rows, K % 256 == 0; 0, or -1 without memory */
static int amx_layout(job_t *j) {
    const act_t *a = &j->act;
    const int64_t K = a->K, nb = K / 32, T = (j->M + 15) / 16;
    size_t nbt = (size_t)T * nb * 512, nf = (size_t)T * nb * 16;
    uint8_t *mem = aligned_alloc(64, nbt + nf * 16);
    if (!mem) return -1;
    memset(mem, 0, nbt + nf * 16);
    j->bt = mem;
    j->dxT = (float *)(mem + nbt);
    j->dxsxT = j->dxT + nf;
    j->nAT = (int32_t *)(j->dxsxT + nf);
    j->nBT = j->nAT + nf;
    for (int64_t r = 0; r < j->M; r++) {
        const int64_t t = r / 16, rr = r % 16;
        for (int64_t b = 0; b < nb; b++) {
            const int8_t *xb = a->xq + r * K + (b / 8) * 256 + 4 * (b % 8);
            uint8_t *bb = j->bt + (t * nb + b) * 512 + rr * 4;
            for (int k4 = 0; k4 < 8; k4++) memcpy(bb + k4 * 64, xb + 32 * k4, 4);
            const int64_t o = (t * nb + b) * 16 + rr, i = r * a->ldd + b;
            j->dxT[o] = a->dx[i];
            j->dxsxT[o] = a->dxsx[i];
            j->nAT[o] = a->nA[i];
            j->nBT[o] = a->nB[i];
        }
    }
    return 0;
}

/* The float operations of dot_group for one (output o, block b) of a 16-row tile, lanes = rows: acc (the output's
   group-parity accumulator of block lane l) += cvt(C) * (scale * dx), then Q4_K's offset term. */
#define AMX_FMA(acc, isum, scale, dxv) \
    acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(_mm512_set1_ps(scale), dxv), acc)

/* tile c = the integer sums of A tile ta (16 outputs' weights at a0 + ao) by B tile tb (16 rows' values at b0 + bo);
   the tile registers are the instructions' immediates, so the four products of a step are spelled out */
#define AMX_DP(c, ta, tb, ao, bo) \
    do { _tile_loadd(ta, a0 + (ao), 32); _tile_loadd(tb, b0 + (bo), 64); _tile_zero(c); _tile_dpbusd(c, ta, tb); } while (0)

/* Outputs n0, n0 + 16, ... (16 at a time, up to n1) of part p for every row; returns the first output not done. */
static int64_t amx_outputs(job_t *j, const bq_part *p, int64_t n0, int64_t n1) {
    const int type = p->type, q6 = type == T_Q6_K, GB = GROUP_BYTES[type];
    const int64_t K = j->act.K, ng = K / 256, nb = K / 32, T = (j->M + 15) / 16;
    if (n1 - n0 < 16) return n0;
    amx_cfg_t cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int t = 0; t < 4; t++) { cfg.rows[t] = 16; cfg.colsb[t] = 64; }               /* C: 16 outputs x 16 rows */
    for (int t = 4; t < 6; t++) { cfg.rows[t] = 16; cfg.colsb[t] = q6 ? 16 : 32; }     /* A: 16 outputs' weights */
    for (int t = 6; t < 8; t++) { cfg.rows[t] = q6 ? 4 : 8; cfg.colsb[t] = 64; }       /* B: 16 rows' values */
    uint8_t *A = aligned_alloc(64, (size_t)K * 16);                   /* [block][output][32]: weight integers */
    float *S = aligned_alloc(64, sizeof(float) * (size_t)nb * 32);      /* [output][block]: sA, then sB or off */
    float *ACC = aligned_alloc(64, sizeof(float) * 16 * 2 * 8 * 16);    /* [output][parity][lane][row] */
    if (!A || !S || !ACC) {
        free(A); free(S); free(ACC);
        return n0;
    }
    float *S2 = S + nb * 16; /* [output][block] */
    int32_t C[4][16][16] __attribute__((aligned(64)));
    _tile_loadconfig(&cfg);
    int64_t n = n0;
    for (; n + 16 <= n1; n += 16) {
        for (int o = 0; o < 16; o++) {
            const uint8_t *w = p->w + (n + o) * p->row_bytes;
            for (int64_t g = 0; g < ng; g++) {
                __m256i W[8];
                __m256 sA, sB = _mm256_setzero_ps(), off = _mm256_setzero_ps();
                unpack_group(type, w + g * GB, W, &sA, &sB, &off);
                /* the 8 x 8 dwords transposed: block l's 32 integers in order (steps 0..7), an A-tile row */
                __m256i t[8], u[8];
                for (int k = 0; k < 8; k += 2) {
                    t[k] = _mm256_unpacklo_epi32(W[k], W[k + 1]);
                    t[k + 1] = _mm256_unpackhi_epi32(W[k], W[k + 1]);
                }
                for (int k = 0; k < 8; k += 4) {
                    u[k] = _mm256_unpacklo_epi64(t[k], t[k + 2]);
                    u[k + 1] = _mm256_unpackhi_epi64(t[k], t[k + 2]);
                    u[k + 2] = _mm256_unpacklo_epi64(t[k + 1], t[k + 3]);
                    u[k + 3] = _mm256_unpackhi_epi64(t[k + 1], t[k + 3]);
                }
                uint8_t *ag = A + (g * 8 * 16 + o) * 32;
                for (int l = 0; l < 4; l++) {
                    _mm256_store_si256((__m256i *)(ag + l * 512), _mm256_permute2x128_si256(u[l], u[l + 4], 0x20));
                    _mm256_store_si256((__m256i *)(ag + (l + 4) * 512), _mm256_permute2x128_si256(u[l], u[l + 4], 0x31));
                }
                _mm256_storeu_ps(S + o * nb + g * 8, sA);
                _mm256_storeu_ps(S2 + o * nb + g * 8, q6 ? sB : off);
            }
        }
        for (int64_t t = 0; t < T; t++) {
            memset(ACC, 0, sizeof(float) * 16 * 2 * 8 * 16);
            const uint8_t *bt = j->bt + t * nb * 512;
            const float *dxT = j->dxT + t * nb * 16, *dxsxT = j->dxsxT + t * nb * 16;
            const int32_t *nAT = j->nAT + t * nb * 16, *nBT = j->nBT + t * nb * 16;
            for (int64_t g = 0; g < ng; g++) {
                const int par = (int)(g & 1);
                for (int h = 0; h < (q6 ? 4 : 2); h++) {
                    /* four tile products: Q4_K's blocks 4h .. 4h + 3; Q6_K's blocks 2h and 2h + 1, each in its half
                       blocks (values 0-15: steps 0-3, 16-31: steps 4-7) */
                    const uint8_t *a0 = A + (g * 8 + (q6 ? 2 : 4) * h) * 512, *b0 = bt + (g * 8 + (q6 ? 2 : 4) * h) * 512;
                    const int64_t ao1 = q6 ? 16 : 512, ao2 = q6 ? 512 : 1024, ao3 = q6 ? 528 : 1536;
                    const int64_t bo1 = q6 ? 256 : 512, bo2 = q6 ? 512 : 1024, bo3 = q6 ? 768 : 1536;
                    AMX_DP(0, 4, 6, 0, 0);
                    AMX_DP(1, 5, 7, ao1, bo1);
                    AMX_DP(2, 4, 6, ao2, bo2);
                    AMX_DP(3, 5, 7, ao3, bo3);
                    _tile_stored(0, C[0], 64);
                    _tile_stored(1, C[1], 64);
                    _tile_stored(2, C[2], 64);
                    _tile_stored(3, C[3], 64);
                    if (!q6) {
                        for (int i = 0; i < 4; i++) {
                            const int l = 4 * h + i;
                            const int64_t b = g * 8 + l;
                            const __m512 dxv = _mm512_loadu_ps(dxT + b * 16), dsv = _mm512_loadu_ps(dxsxT + b * 16);
                            for (int o = 0; o < 16; o++) {
                                float *ap = ACC + ((o * 2 + par) * 8 + l) * 16;
                                __m512 acc = _mm512_load_ps(ap);
                                AMX_FMA(acc, _mm512_load_si512(C[i][o]), S[o * nb + b], dxv);
                                acc = _mm512_fmadd_ps(_mm512_set1_ps(S2[o * nb + b]), dsv, acc);
                                _mm512_store_ps(ap, acc);
                            }
                        }
                    } else {
                        for (int i = 0; i < 2; i++) {
                            const int l = 2 * h + i;
                            const int64_t b = g * 8 + l;
                            const __m512 dxv = _mm512_loadu_ps(dxT + b * 16);
                            const __m512i na = _mm512_loadu_si512(nAT + b * 16), nbv = _mm512_loadu_si512(nBT + b * 16);
                            for (int o = 0; o < 16; o++) {
                                float *ap = ACC + ((o * 2 + par) * 8 + l) * 16;
                                __m512 acc = _mm512_load_ps(ap);
                                AMX_FMA(acc, _mm512_add_epi32(na, _mm512_load_si512(C[2 * i][o])), S[o * nb + b], dxv);
                                AMX_FMA(acc, _mm512_add_epi32(nbv, _mm512_load_si512(C[2 * i + 1][o])), S2[o * nb + b],
                                        dxv);
                                _mm512_store_ps(ap, acc);
                            }
                        }
                    }
                }
            }
            const int64_t r = t * 16;
            const int R = j->M - r < 16 ? (int)(j->M - r) : 16;
            for (int o = 0; o < 16; o++) {
                const float *ap = ACC + o * 2 * 8 * 16;
                __m512 s[8];
                for (int l = 0; l < 8; l++) s[l] = _mm512_add_ps(_mm512_load_ps(ap + l * 16), _mm512_load_ps(ap + (8 + l) * 16));
                /* hsum8's tree: ((v0 + v4) + (v2 + v6)) + ((v1 + v5) + (v3 + v7)), then + 0 (dot_rows' empty tail) */
                __m512 v = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(s[0], s[4]), _mm512_add_ps(s[2], s[6])),
                                         _mm512_add_ps(_mm512_add_ps(s[1], s[5]), _mm512_add_ps(s[3], s[7])));
                v = _mm512_add_ps(v, _mm512_setzero_ps());
                float res[16];
                _mm512_storeu_ps(res, v);
                store_rows(j, j->out + p->col0 + n + o, p->bias ? p->bias[n + o] : 0.0f, r, R, res);
            }
        }
    }
    _tile_release();
    free(A);
    free(S);
    free(ACC);
    return n;
}
#else
#define BQ_AMX 0
#endif

/* Products of at least this many stored rows run their Q4_K/Q6_K outputs on AMX tiles where there are (0: never).
   Measured on a 2-core Xeon with AMX, Qwen2.5-1.5B's matrices, 2 threads, vector path -> tiles: gate/up (Q4_K) 0.99
   -> 0.83 ms at 16 rows but 1.03 -> 1.27 at 17 (a second tile of one row), 1.95 -> 1.39 at 32, 7.47 -> 4.52 at 128;
   the Q6_K down projection 1.17 -> 1.30 at 16, 2.23 -> 1.98 at 32, 8.93 -> 6.16 at 128. A tile's fixed cost (its 16
   outputs' weights unpacked and transposed into tile rows, 16 rows' float operations whatever rows are real) pays
   from about 32 rows: prompt prefill, not the verify passes of a few draft tokens. */
static atomic_int amx_min_rows = 32;

/* sets the row threshold above; returns the previous one */
int bq_set_amx_min_rows(int rows) { return atomic_exchange(&amx_min_rows, rows); }

/* whether this copy can use AMX tiles here (compiled in and permitted) */
int bq_amx(void) {
#if BQ_AMX
    return amx_usable();
#else
    return 0;
#endif
}

/* rows r..r+R of outputs n (and n + 1 where paired) */
static void run_tile(job_t *j, const bq_part *p, int64_t n, int pair, int64_t r, int R) {
    const uint8_t *w = p->w + n * p->row_bytes;
    float *o = j->out + p->col0 + n;
    float res0[MAX_ROWS_TILE];
#if BQ_PAIR
    if (pair) {
        float res1[MAX_ROWS_TILE];
        DOT2_TILES[R](p->type, w, &j->act, r, res0, res1);
        store_rows(j, o, p->bias ? p->bias[n] : 0.0f, r, R, res0);
        store_rows(j, o + 1, p->bias ? p->bias[n + 1] : 0.0f, r, R, res1);
        return;
    }
#endif
    (void)pair;
    DOT_TILES[R](p->type, w, &j->act, r, res0);
    store_rows(j, o, p->bias ? p->bias[n] : 0.0f, r, R, res0);
}

static void run_outputs(job_t *j, const bq_part *p, int64_t n0, int64_t n1) {
#if BQ_AMX
    if (j->bt && (p->type == T_Q4_K || p->type == T_Q6_K)) {
        n0 = amx_outputs(j, p, n0, n1); /* the outputs left (fewer than 16) take the paths below */
        if (n0 >= n1) return;
    }
#endif
    /* Long rows (K >= 4096: the down projections) at 2 rows, or 3 of Q4_K: one row at a time over the block of
       outputs, unpaired. Two rows' int8 activations and block sums (~25 KB at K = 8960) did not stay in L1 with
       the weights streaming through; a one-row tile sweeps the block's weights from DRAM, and the second row
       reads them from L2 (Qwen2.5-1.5B's 14 Q6_K and 14 Q4_K down projections, 2 threads: 635 -> 514 and
       416 -> 335 us at 2 rows, Q4_K 515 -> 450 at 3; Q6_K at 3 and either at 4 no faster). */
    const int narrow = j->act.K >= 4096 && (j->M == 2 || (j->M == 3 && p->type == T_Q4_K));
    /* Q4_K and Q6_K: two outputs at a time (dot2_rows: each output's bits as if alone) from a few rows up, where it
       measured faster: one activation load serves two outputs, but two rows of weights stream side by side.
       Qwen2.5-1.5B's matrices, 2 threads, unpaired -> paired (ms): gate/up (Q4_K) 16.7 -> 14.7 at 3 rows (14.3 ->
       15.3 at 2), the Q6_K down projections 10.6 -> 9.8 at 4 (9.0 -> 9.3 at 3), the Q6_K head (short rows
       streamed from DRAM) 7.2 -> 8.0 at 4 and 7.9 -> 6.8 at 5; at 9 rows all 10-30% faster. Q4_1 (SmolLM2's four
       layer matrices, 576 and 1536 wide, in L2; 2 threads): 3-5 rows 8-11% faster, 8 rows and more 0-4% slower. */
    const int pair = BQ_PAIR && !narrow && ((p->type == T_Q4_K && j->M >= 3) || (p->type == T_Q4_1 && j->M >= 3 && j->M <= 7)
                                            || (p->type == T_Q6_K && j->M >= (j->act.K >= 4096 ? 4 : 5)));
    /* Rows in tiles of 1 to 9 (each unpacked weight group serves the tile's rows; every row gets the same
       float ops whatever its tile), the tile loop outside a block of outputs whose weights stay in L2 (~256 KB),
       so a tile's activations stay in L1 across the block rather than every output reading all M rows. */
    int64_t nb = (256 << 10) / p->row_bytes;
    nb = nb < 2 ? 2 : nb & ~(int64_t)1;
    for (int64_t b0 = n0; b0 < n1; b0 += nb) {
        int64_t b1 = b0 + nb < n1 ? b0 + nb : n1;
        for (int64_t r = 0; r < j->M;) {
            int64_t left = j->M - r;
            /* 9 where 8s would leave a single row (a verify pass of 1 + 8k tokens): a 1-row tile costs ~3 rows;
               5 rows in one tile, not 4 + 1 (Qwen2.5-1.5B's layer matrices, 2 threads: see the commit) */
            int R = narrow ? 1 : left <= 9 ? (int)left : left % 8 == 1 ? 9 : 8; /* one tile for the last 9 or fewer */
            int64_t n = b0;
#if BQ_SIMD
            /* rows with tail blocks (K % 256), tiles of 8 or 9 rows: outputs 8 at a time, their full groups first,
               then the 8 outputs' tails at once (tail_outputs: their bytes still in L1), then each sum + tail.
               Smaller tiles keep tail_rows (one output at a time): at 2-4 rows the vector over 8 outputs was slower */
            if (j->act.K % 256 && R >= 8)
                while (n < b1) {
                    const int64_t c = n, n8 = n + 8 < b1 ? n + 8 : b1;
                    float part[MAX_ROWS_TILE][8], tl[MAX_ROWS_TILE][8], res[MAX_ROWS_TILE];
                    for (; n < n8; n++) { /* (unpaired: pairs are for types without tails, and Q4_1 at 3-7 rows) */
                        const uint8_t *w = p->w + n * p->row_bytes;
                        (R == 8 ? dot_tailless_tile8 : dot_tailless_tile9)(p->type, w, &j->act, r, res);
                        for (int t = 0; t < R; t++) part[t][n - c] = res[t];
                    }
                    tail_outputs(p->type, p->w + c * p->row_bytes, p->row_bytes, (int)(n8 - c), &j->act, r, R, tl);
                    for (int64_t i = c; i < n8; i++) {
                        for (int t = 0; t < R; t++) res[t] = part[t][i - c] + tl[t][i - c];
                        store_rows(j, j->out + p->col0 + i, p->bias ? p->bias[i] : 0.0f, r, R, res);
                    }
                }
#endif
            if (pair)
                for (; n + 2 <= b1; n += 2) run_tile(j, p, n, 1, r, R);
            for (; n < b1; n++) run_tile(j, p, n, 0, r, R);
            r += R;
        }
    }
}

static void run_job(job_t *j) {
    for (;;) {
        int64_t c = atomic_fetch_add(&j->next, 1);
        if (c >= j->nchunks) break;
        if (j->task) {
            j->task(j->ctx, c);
            continue;
        }
        /* chunks are numbered over the parts in order, each part cut into pieces of j->chunk outputs */
        int64_t base = 0;
        for (int p = 0; p < j->nparts; p++) {
            int64_t pc = (j->parts[p].N + j->chunk - 1) / j->chunk;
            if (c < base + pc) {
                int64_t n0 = (c - base) * j->chunk, n1 = n0 + j->chunk;
                if (n1 > j->parts[p].N) n1 = j->parts[p].N;
                run_outputs(j, &j->parts[p], n0, n1);
                break;
            }
            base += pc;
        }
    }
}

#define MAX_WORKERS 63
static pthread_mutex_t pool_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t pool_cv = PTHREAD_COND_INITIALIZER;
static pthread_mutex_t call_mu = PTHREAD_MUTEX_INITIALIZER;
static atomic_long pool_gen;
static job_t *pool_job;
static int pool_nthreads; /* the published job's thread count: read under pool_mu (a job a worker sits out may
                             be over, its struct gone, by the time that worker looks) */
static int pool_workers, pool_sleepers;
/* Joining a job: (generation << 9) | closed (256) | workers joined (0-255). A worker takes part only if it joins
   while the job is open; the caller closes it once every chunk is taken and waits for the joined workers alone,
   so a worker that wakes late (a sleeping one: tens of microseconds, more with other work on the machine) no
   longer holds up every call: it finds the job closed and never touches it (the struct may be gone). */
static atomic_int_fast64_t pool_state;
/* How long an idle worker spins (beyond its first 256 pauses, a few microseconds) before it sleeps on the condvar.
   Measured on the 2-core EPYC with other work on the machine, Qwen2.5-1.5B's 196 layer matrices at M = 1, two
   threads: 0 us -> 79-84 ms, 30 us -> 93 ms, 100 us -> 112 ms, 1000 us -> 360 ms: a spinning worker takes the core
   the rest of the step needs, so by default it only spins those few microseconds (bq_set_spin_us to change).
   blockq.pass_threads sets a longer spin for the length of a pass whose torch ops run on one thread (the other
   core is then the worker's alone, and it stays awake between the pass's products). */
static atomic_long spin_ns = 0;

void bq_set_spin_us(long us) { atomic_store(&spin_ns, us * 1000); }

static inline int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

typedef struct { int id; long gen; } worker_arg;

static void *worker(void *arg) {
    /* the generation current when it was created: the job published after that is its first */
    int id = ((worker_arg *)arg)->id;
    long seen = ((worker_arg *)arg)->gen;
    free(arg);
    for (;;) {
        int64_t t0 = now_ns(), limit = atomic_load(&spin_ns);
        for (int i = 0; atomic_load_explicit(&pool_gen, memory_order_acquire) == seen; i++) {
            cpu_relax();
            if ((i & 255) == 255 && now_ns() - t0 > limit) break;
        }
        pthread_mutex_lock(&pool_mu);
        while (atomic_load(&pool_gen) == seen) {
            pool_sleepers++;
            pthread_cond_wait(&pool_cv, &pool_mu);
            pool_sleepers--;
        }
        seen = atomic_load(&pool_gen);
        job_t *j = pool_job;
        int take_part = id < pool_nthreads;
        pthread_mutex_unlock(&pool_mu);
        if (take_part) {
            int64_t st = atomic_load(&pool_state);
            int joined = 0;
            while ((st >> 9) == (seen & (INT64_MAX >> 9)) && !(st & 256) && !joined)
                joined = atomic_compare_exchange_weak(&pool_state, &st, st + 1);
            if (joined) {
                run_job(j);
                atomic_fetch_add_explicit(&j->done, 1, memory_order_release); /* its last touch of j */
            }
        }
    }
    return NULL;
}

static void run_threads(job_t *j, int nthreads) {
    if (nthreads > MAX_WORKERS + 1) nthreads = MAX_WORKERS + 1;
    pthread_mutex_lock(&call_mu); /* one product at a time through the pool */
    while (pool_workers < nthreads - 1) {
        pthread_t t;
        worker_arg *a = malloc(sizeof *a);
        if (!a) break;
        a->id = pool_workers + 1;
        a->gen = atomic_load(&pool_gen);
        if (pthread_create(&t, NULL, worker, a) != 0) { free(a); break; }
        pthread_detach(t);
        pool_workers++;
    }
    if (nthreads > pool_workers + 1) nthreads = pool_workers + 1;
    j->nthreads = nthreads;
    atomic_store(&j->done, 0);
    if (nthreads > 1) {
        pthread_mutex_lock(&pool_mu);
        pool_job = j;
        pool_nthreads = nthreads;
        atomic_store(&pool_state, ((atomic_load(&pool_gen) + 1) & (INT64_MAX >> 9)) << 9);
        atomic_fetch_add_explicit(&pool_gen, 1, memory_order_release);
        if (pool_sleepers) pthread_cond_broadcast(&pool_cv);
        pthread_mutex_unlock(&pool_mu);
    }
    run_job(j);
    if (nthreads > 1) {
        int joined = (int)(atomic_fetch_or(&pool_state, 256) & 255);
        while (atomic_load_explicit(&j->done, memory_order_acquire) < joined) cpu_relax();
    }
    pthread_mutex_unlock(&call_mu);
}

/* ---------------------------------------------------------------- a lean forward's glue, as torch rounds it */

/* The sum of squares of x[0 .. K), in the order of torch's float sum of a contiguous row (x.pow(2).sum(-1):
   ATen's cascade sum on 8-lane vectors, as its reduction kernels run on AVX2 and AVX512 builds): vectors of 8
   squares go to 4 accumulators in turn (vector i to accumulator i % 4), each accumulator a cascade of 4 levels of
   16 steps; then the vectors left over (fewer than 4) into the first, the other three added to it, and the
   result is 0 + the squares past the last whole vector, in order, + the 8 lanes, in order. A row shorter than a
   vector is summed as torch's scalar path does: 4 accumulators (value i to i % 4), the rest into the first, then
   the other three added to it. Plain C, one code: the same bits on every build, and torch's (tested) where
   torch's sum takes this order. */
static float sumsq_row(const float *x, int64_t K) {
    enum { V = 8, ILP = 4, LEVELS = 4 };
    if (K < V) {
        float a[ILP] = {0.0f, 0.0f, 0.0f, 0.0f};
        int64_t t = 0;
        for (; t + ILP <= K; t += ILP)
            for (int k = 0; k < ILP; k++) a[k] += x[t + k] * x[t + k];
        for (; t < K; t++) a[0] += x[t] * x[t];
        for (int k = 1; k < ILP; k++) a[0] += a[k];
        return a[0];
    }
    int64_t nvec = K / V, size = nvec / ILP;
    int lp = (size <= 2 ? 1 : 64 - __builtin_clzll((uint64_t)(size - 1))) / LEVELS;
    if (lp < 4) lp = 4;
    int64_t step = (int64_t)1 << lp, mask = step - 1, i = 0;
    float acc[LEVELS][ILP][V];
    memset(acc, 0, sizeof acc);
    for (; i + step <= size;) {
        for (int64_t j = 0; j < step; j++, i++)
            for (int k = 0; k < ILP; k++)
                for (int l = 0; l < V; l++) {
                    float v = x[(i * ILP + k) * V + l];
                    acc[0][k][l] += v * v;
                }
        for (int j = 1; j < LEVELS; j++) {
            for (int k = 0; k < ILP; k++)
                for (int l = 0; l < V; l++) {
                    acc[j][k][l] += acc[j - 1][k][l];
                    acc[j - 1][k][l] = 0.0f;
                }
            if ((i & (mask << (j * lp))) != 0) break;
        }
    }
    for (; i < size; i++)
        for (int k = 0; k < ILP; k++)
            for (int l = 0; l < V; l++) {
                float v = x[(i * ILP + k) * V + l];
                acc[0][k][l] += v * v;
            }
    for (int j = 1; j < LEVELS; j++)
        for (int k = 0; k < ILP; k++)
            for (int l = 0; l < V; l++) acc[0][k][l] += acc[j][k][l];
    for (int64_t v = size * ILP; v < nvec; v++)
        for (int l = 0; l < V; l++) {
            float w = x[v * V + l];
            acc[0][0][l] += w * w;
        }
    for (int k = 1; k < ILP; k++)
        for (int l = 0; l < V; l++) acc[0][0][l] += acc[0][k][l];
    float f = 0.0f;
    for (int64_t t = nvec * V; t < K; t++) f += x[t] * x[t];
    for (int l = 0; l < V; l++) f += acc[0][0][l];
    return f;
}

/* sumsq_row of each of the M rows of x (row stride ldx) into out[M]. */
void bq_sumsq(const float *x, int64_t M, int64_t K, int64_t ldx, float *out) {
    for (int64_t r = 0; r < M; r++) out[r] = sumsq_row(x + r * ldx, K);
}

static inline float pow2i(int32_t q) {
    int32_t b = (q + 0x7f) << 23;
    float f;
    memcpy(&f, &b, sizeof f);
    return f;
}

/* exp(d) in SLEEF's expf_u10 steps (torch's vectorized exp): q = rint(d / ln2); s = d - q ln2 in two fmas;
   a degree-5 polynomial by fma; 1 + fma(s * s, u, s); times 2^(q >> 1) then 2^(q - (q >> 1)); 0 below -104,
   infinity above 100. Every op rounds once (fmaf fuses, nothing else does), so one code gives the same bits on
   every build. */
static inline float exp_u10(float d) {
    float qf = rintf(d * 1.442695040888963407359924681001892137426645954152985934135449406931f);
    int32_t q = (int32_t)qf;
    float s = fmaf(qf, -0.693145751953125f, d);
    s = fmaf(qf, -1.428606765330187045e-06f, s);
    float u = 0.000198527617612853646278381f;
    u = fmaf(u, s, 0.00139304355252534151077271f);
    u = fmaf(u, s, 0.00833336077630519866943359f);
    u = fmaf(u, s, 0.0416664853692054748535156f);
    u = fmaf(u, s, 0.166666671633720397949219f);
    u = fmaf(u, s, 0.5f);
    u = 1.0f + fmaf(s * s, u, s);
    u = (u * pow2i(q >> 1)) * pow2i(q - (q >> 1));
    u = d < -104.0f ? 0.0f : u;
    return 100.0f < d ? INFINITY : u;
}

/* out[t, i] = silu(g) * u for g = gu[t, i], u = gu[t, I + i] (a gated MLP's gate and up side by side, rows of
   2 I): silu(g) = g / (1 + exp(-g)) rounded as torch's silu rounds it, then the product rounded: torch's
   silu(gate) * up, bit for bit (tested), the same on every build. */
void bq_silu_mul(const float *gu, int64_t T, int64_t I, float *out) {
    for (int64_t t = 0; t < T; t++) {
        const float *g = gu + t * 2 * I, *u = g + I;
        float *o = out + t * I;
        for (int64_t i = 0; i < I; i++) o[i] = g[i] / (1.0f + exp_u10(-g[i])) * u[i];
    }
}

/* out[r, parts[p].col0 + n] = x[r] . W_p[n] + bias_p[n], for the M rows of x [M, K] (row stride ldx) and every
   part; out has row stride ldo. Returns 0, or -1 where memory ran out, -2 for a bad K or type.
   norm_w not NULL: the product of the RMS-normed rows norm_w * (x * r), r = 1 / sqrt(sumsq / K + eps), sumsq
   the row's sum of squares (sumsq_row: torch's sum) (a lean forward's norm before its products): each op rounded
   as torch's mean (sum / K), add, rsqrt (1 / sqrt) and two muls round it (-ffp-contract=off), so the same bits
   as norming in torch first, without its five calls and the normed copy. */
static int mm(const bq_part *parts, int nparts, int64_t K, const float *x, int64_t M, int64_t ldx, float *out,
              int64_t ldo, int nthreads, const float *norm_w, float eps, int planes) {
    if (K <= 0 || K % 32 || (planes != 1 && planes != 2)) return -2;
    for (int p = 0; p < nparts; p++) {
        int t = parts[p].type;
        if (t < 0 || t > T_Q5_0 || ((t == T_Q4_K || t == T_Q6_K) && K % 256)) return -2;
        if (parts[p].row_bytes != bq_row_bytes(t, K)) return -2;
    }
    if (M == 0) return 0;
    const int64_t M1 = M; /* the caller's rows; M: the stored rows (two per row at planes = 2) */
    M *= planes;
    int64_t nb = K / 32, ldd = (nb + 7) / 8 * 8;
    size_t xbytes = ((size_t)M * K + 63) / 64 * 64;
    size_t hbytes = norm_w ? sizeof(float) * (size_t)K : 0; /* a normed row, before it is quantized */
    size_t obytes = planes == 2 ? sizeof(float) * (size_t)M * ldo : 0; /* both planes' results, then added */
    uint8_t *mem = aligned_alloc(64, xbytes + (size_t)M * ldd * 24 + hbytes + obytes + 64);
    if (!mem) return -1;
    job_t j;
    memset(&j, 0, sizeof j);
    act_t *a = &j.act;
    a->K = K;
    a->ldd = ldd;
    a->xq = (int8_t *)mem;
    a->dx = (float *)(mem + xbytes);
    a->dxsx = a->dx + M * ldd;
    a->n16 = (int32_t *)(a->dxsx + M * ldd);
    a->n128 = a->n16 + M * ldd;
    a->nA = a->n128 + M * ldd;
    a->nB = a->nA + M * ldd;
    if (norm_w) {
        float *h = (float *)(a->nB + M * ldd);
        for (int64_t r = 0; r < M1; r++) {
            const float *xr = x + r * ldx;
            float rs = 1.0f / sqrtf(sumsq_row(xr, K) / (float)K + eps);
            for (int64_t i = 0; i < K; i++) h[i] = norm_w[i] * (xr[i] * rs);
            if (planes == 2) quantize_row_planes(h, a, r);
            else quantize_row(h, a, r);
        }
    } else {
        for (int64_t r = 0; r < M1; r++) {
            if (planes == 2) quantize_row_planes(x + r * ldx, a, r);
            else quantize_row(x + r * ldx, a, r);
        }
    }
    float *res = planes == 2 ? (float *)(mem + xbytes + (size_t)M * ldd * 24 + hbytes) : out;
    j.parts = parts;
    j.nparts = nparts;
    j.M = M;
    j.ldo = ldo;
    j.out = res;
    j.planes = planes;
    int64_t total = 0;
    for (int p = 0; p < nparts; p++) total += parts[p].N;
    if (nthreads < 1) nthreads = 1;
    int64_t chunk = total / ((int64_t)nthreads * 16);
    j.chunk = chunk < 4 ? 4 : chunk;
#if BQ_AMX
    int amx = 0;
    for (int p = 0; p < nparts; p++) amx |= parts[p].type == T_Q4_K || parts[p].type == T_Q6_K;
    int min_rows = atomic_load(&amx_min_rows);
    if (amx && min_rows > 0 && M >= min_rows && K % 256 == 0 && amx_usable()) {
        if (amx_layout(&j) != 0) {
            free(mem);
            return -1;
        }
        j.chunk = (j.chunk + 15) / 16 * 16; /* whole tiles of 16 outputs per chunk */
    }
#endif
    for (int p = 0; p < nparts; p++) j.nchunks += (parts[p].N + j.chunk - 1) / j.chunk;
    atomic_store(&j.next, 0);
    if (nthreads == 1) {
        j.nthreads = 1;
        run_job(&j);
    } else {
        run_threads(&j, nthreads);
    }
    if (planes == 2) /* row r = its high plane (bias included) + its low plane, over the parts' columns */
        for (int64_t r = 0; r < M1; r++)
            for (int p = 0; p < nparts; p++) {
                const float *hi = res + 2 * r * ldo + parts[p].col0, *lo = hi + ldo;
                float *o = out + r * ldo + parts[p].col0;
                for (int64_t n = 0; n < parts[p].N; n++) o[n] = hi[n] + lo[n];
            }
    free(j.bt);
    free(mem);
    return 0;
}

int bq_mm(const bq_part *parts, int nparts, int64_t K, const float *x, int64_t M, int64_t ldx, float *out,
          int64_t ldo, int nthreads, int planes) {
    return mm(parts, nparts, K, x, M, ldx, out, ldo, nthreads, NULL, 0.0f, planes);
}

int bq_mm_norm(const bq_part *parts, int nparts, int64_t K, const float *x, int64_t M, int64_t ldx, float *out,
               int64_t ldo, int nthreads, const float *norm_w, float eps, int planes) {
    return mm(parts, nparts, K, x, M, ldx, out, ldo, nthreads, norm_w, eps, planes);
}

/* task(ctx, c) for c = 0 .. n - 1 on up to nthreads threads of the pool (the caller's among them), each c on one
   thread, the order among them unspecified; returns when all are done. For another native kernel, given this
   function's address, so that one pool (and one spinning worker) serves a pass (exact_attention.c). */
void bq_parallel(void (*task)(void *, int64_t), void *ctx, int64_t n, int nthreads) {
    if (n <= 0) return;
    job_t j;
    memset(&j, 0, sizeof j);
    j.task = task;
    j.ctx = ctx;
    j.nchunks = n;
    atomic_store(&j.next, 0);
    if (nthreads <= 1 || n == 1) {
        j.nthreads = 1;
        run_job(&j);
    } else {
        run_threads(&j, nthreads < n ? nthreads : (int)n);
    }
}

/* A gguf pass's rotary embedding and cache writes in one call (LeanForward._pass): for the h_q + h_kv heads of each
   token t, out[t, h] = x * cos[t] + rot(x) * sin[t] with x = qk[t, h] and rot(x) = (-x[d/2:], x[:d/2]); each
   product and the sum rounded once, as torch's mul, mul and add round them (this file is compiled with
   -ffp-contract=off, and -a * s is -(a * s) exactly), so the bits are torch's. Then key head g of token t
   (out[t, h_q + g]) and its value v[t, g] are copied into the cache at [rows[t], g, slots[t]]. out is
   [T, h_q + h_kv, d], contiguous; qk and v by token and head strides, d contiguous; cos and sin [T, d] by a token
   stride; kbuf and vbuf by their row, head and position strides. */
void bq_rope_store(int64_t T, const float *qk, int64_t qk_tok, int64_t qk_head, int64_t h_q, int64_t h_kv, int64_t d,
                   const float *cos, const float *sin, int64_t cs_tok, float *out, const float *v, int64_t v_tok,
                   int64_t v_head, float *kbuf, float *vbuf, int64_t c_row, int64_t c_head, int64_t c_pos,
                   const int64_t *rows, const int64_t *slots) {
    int64_t half = d / 2, nh = h_q + h_kv;
    for (int64_t t = 0; t < T; t++) {
        const float *c = cos + t * cs_tok, *s = sin + t * cs_tok;
        for (int64_t h = 0; h < nh; h++) {
            const float *x = qk + t * qk_tok + h * qk_head;
            float *o = out + (t * nh + h) * d;
            for (int64_t i = 0; i < half; i++) o[i] = x[i] * c[i] - x[i + half] * s[i];
            for (int64_t i = half; i < d; i++) o[i] = x[i] * c[i] + x[i - half] * s[i];
        }
        for (int64_t g = 0; g < h_kv; g++) {
            int64_t at = rows[t] * c_row + g * c_head + slots[t] * c_pos;
            memcpy(kbuf + at, out + (t * nh + h_q + g) * d, sizeof(float) * (size_t)d);
            memcpy(vbuf + at, v + t * v_tok + g * v_head, sizeof(float) * (size_t)d);
        }
    }
}

/* ---------------------------------------------------------------- every layer of a pass in one call */

/* exact_attention.c's entry point (its library passes its address: the two files compile apart) */
typedef int (*attend_fn)(int64_t nq, const int64_t *meta, const int64_t *path, const float *q, int64_t q_tok,
                         int64_t q_head, const float *kbuf, const float *vbuf, int64_t c_row, int64_t c_head,
                         int64_t c_pos, const float *k_new, int64_t k_tok, int64_t k_head, const float *v_new,
                         int64_t v_tok, int64_t v_head, float *out, int64_t o_tok, int64_t h_q, int64_t h_kv,
                         int64_t d, float scale, int64_t window,
                         void (*parallel)(void (*)(void *, int64_t), void *, int64_t, int), int nthreads);

/* One decoder layer of a Llama-family model (RMSNorm, q/k/v with optional biases, rotary, SiLU-gated MLP) whose
   products are all block products: part records and norm weights as bq_mm takes them, its cache, its window. */
typedef struct {
    const bq_part *qkv, *o, *gu, *down;
    int32_t n_qkv, n_o, n_gu, n_down;
    const float *norm_in, *norm_mlp;
    int64_t window;      /* 0: full attention */
} bq_layer;

/* What every layer of a pass shares: T packed tokens; the model's shape; the rotary cos/sin [T, d]; each token's
   cache row and slot; the exact-attention plan (exact_attention.plan's meta and path) and its kernel. */
typedef struct {
    int64_t T, hidden, h_q, h_kv, d, inter;
    int64_t c_row, c_head, c_pos;
    const float *cos, *sin;
    const int64_t *rows, *slots;
    int64_t nq;
    const int64_t *meta, *path;
    attend_fn attend;
    float eps, scale;
    int32_t planes, nthreads;
} bq_pass;

/* x [T, hidden] (the embedded tokens; contiguous) through the n layers, in place: per layer exactly the calls the
   lean forward makes one by one (LeanForward._pass with blockq's glue), so the same bits:
   qkv = bq_mm_norm(x, norm_in); rotary and cache writes (bq_rope_store); exact attention over every query;
   x = x + o-product (torch's add: one rounding); gu = bq_mm_norm(x, norm_mlp); a = bq_silu_mul(gu);
   x = x + down-product. One call instead of a dozen Python calls and torch ops a layer (a small model's decode
   step spent a third of its time there). kbufs[i] / vbufs[i]: layer i's cache [rows, h_kv, capacity, d] by the
   pass's cache strides. Returns 0, -1 (out of memory) or the failing product's code. */
int bq_layers(const bq_pass *p, const bq_layer *layers, int n, float *x, float *const *kbufs, float *const *vbufs) {
    int64_t T = p->T, H = p->hidden, d = p->d, hq = p->h_q, hkv = p->h_kv, I = p->inter;
    int64_t nqkv = (hq + 2 * hkv) * d, nqk = (hq + hkv) * d, na = hq * d;
    size_t floats = (size_t)T * (nqkv + nqk + na + H + 2 * I + I);
    float *mem = malloc(sizeof(float) * (floats ? floats : 1));
    if (!mem) return -1;
    float *qkv = mem, *qk = qkv + T * nqkv, *att = qk + T * nqk, *tmp = att + T * na, *gu = tmp + T * H,
          *act = gu + T * 2 * I;
    void (*par)(void (*)(void *, int64_t), void *, int64_t, int) = p->nthreads > 1 ? bq_parallel : NULL;
    int rc = 0;
    for (int i = 0; i < n; i++) {
        const bq_layer *L = layers + i;
        rc = mm(L->qkv, L->n_qkv, H, x, T, H, qkv, nqkv, p->nthreads, L->norm_in, p->eps, p->planes);
        if (rc) break;
        bq_rope_store(T, qkv, nqkv, d, hq, hkv, d, p->cos, p->sin, d, qk, qkv + nqk, nqkv, d, kbufs[i], vbufs[i],
                      p->c_row, p->c_head, p->c_pos, p->rows, p->slots);
        rc = p->attend(p->nq, p->meta, p->path, qk, nqk, d, kbufs[i], vbufs[i], p->c_row, p->c_head, p->c_pos,
                       qk + hq * d, nqk, d, qkv + nqk, nqkv, d, att, na, hq, hkv, d, p->scale, L->window, par,
                       p->nthreads);
        if (rc) break;
        rc = mm(L->o, L->n_o, na, att, T, na, tmp, H, p->nthreads, NULL, 0.0f, p->planes);
        if (rc) break;
        for (int64_t k = 0; k < T * H; k++) x[k] = x[k] + tmp[k];
        rc = mm(L->gu, L->n_gu, H, x, T, H, gu, 2 * I, p->nthreads, L->norm_mlp, p->eps, p->planes);
        if (rc) break;
        bq_silu_mul(gu, T, I, act);
        rc = mm(L->down, L->n_down, I, act, T, I, tmp, H, p->nthreads, NULL, 0.0f, p->planes);
        if (rc) break;
        for (int64_t k = 0; k < T * H; k++) x[k] = x[k] + tmp[k];
    }
    free(mem);
    return rc;
}

/* which path this copy was compiled with: 2 VNNI, 1 AVX2, 0 scalar */
int bq_path(void) {
#if BQ_SIMD && ((defined(__AVX512VNNI__) && defined(__AVX512VL__)) || defined(__AVXVNNI__))
    return 2;
#elif BQ_SIMD
    return 1;
#else
    return 0;
#endif
}
