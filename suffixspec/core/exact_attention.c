/* Attention of an exact weight format, one query at a time, in a fixed order (suffixspec.core.exact_attention).

   A query's result must not depend on what else a pass holds: the other queries of its tree, other rows, the
   thread count. Every output here is computed by one thread, by the same instructions, over its own keys in
   position order (the cached positions, then its path's new keys: what plain decoding would hold in those slots),
   so a token's attention is the same bit for bit in a plain step and in any verify pass.

   Per query and key head: scores s_p = (q . k_p) * scale for each of the head's `rep` query heads, the softmax
   (max, exp, a sum in position order), then sum_p e_p v_p / sum. Dot products use 8-lane vectors (one accumulator,
   lanes summed in a fixed tree), loaded with memcpy so that a key's address (its alignment) never changes the
   arithmetic. Compiled on the machine that runs it (-march=native), once; float32 only. */
#include <math.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef float v8 __attribute__((vector_size(32)));
typedef int32_t vi8 __attribute__((vector_size(32)));

static inline v8 load8(const float *p) {
    v8 x;
    memcpy(&x, p, sizeof x);
    return x;
}

static inline void store8(float *p, v8 x) { memcpy(p, &x, sizeof x); }

static inline float hsum(v8 x) { return ((x[0] + x[4]) + (x[1] + x[5])) + ((x[2] + x[6]) + (x[3] + x[7])); }

static inline float dot(const float *a, const float *b, int d) {
    v8 acc0 = {0, 0, 0, 0, 0, 0, 0, 0}, acc1 = acc0;
    int i = 0;
    for (; i + 16 <= d; i += 16) {
        acc0 += load8(a + i) * load8(b + i);
        acc1 += load8(a + i + 8) * load8(b + i + 8);
    }
    for (; i + 8 <= d; i += 8) acc0 += load8(a + i) * load8(b + i);
    float s = hsum(acc0 + acc1);
    for (; i < d; i++) s += a[i] * b[i];
    return s;
}

/* exp of 8 lanes, each x <= 0 (a score minus the row's largest): 2^n * p(r), x = n ln2 + r, |r| <= ln2 / 2, p
   Cephes' degree-7 polynomial (about 1 ulp); lanes below -87 give 0. The same instructions for every lane, so a
   score's exp does not depend on its neighbours. */
static inline v8 exp8(v8 x) {
    const v8 lo = {-87.0f, -87.0f, -87.0f, -87.0f, -87.0f, -87.0f, -87.0f, -87.0f};
    vi8 under = x < lo;
    x = (v8)((vi8)x & ~under);  /* those lanes computed at 0, zeroed below */
    vi8 n = __builtin_convertvector(x * 1.44269504088896341f - 0.5f, vi8);  /* x <= 0: truncation rounds */
    v8 nf = __builtin_convertvector(n, v8);
    v8 r = x - nf * 0.693359375f + nf * 2.12194440e-4f;
    v8 y = 1.9875691500e-4f * r + 1.3981999507e-3f;
    y = y * r + 8.3334519073e-3f;
    y = y * r + 4.1665795894e-2f;
    y = y * r + 1.6666665459e-1f;
    y = y * r + 5.0000001201e-1f;
    y = y * (r * r) + r + 1.0f;
    vi8 scale = (n + 127) << 23;
    return (v8)((vi8)(y * (v8)scale) & ~under);
}

/* The scores of n keys (a multiple of 8) against q, times scale, into s. d a multiple of 8: eight keys at once,
   one accumulator each, then one transposed reduction whose lane j sums key j's lanes in hsum's tree. */
static void scores_of(const float *q, const float **keys, int64_t n, int d, float scale, float *s) {
    if (d % 8) {
        for (int64_t j = 0; j < n; j++) s[j] = dot(q, keys[j], d) * scale;
        return;
    }
    const vi8 lo = {0, 1, 2, 3, 8, 9, 10, 11}, hi = {4, 5, 6, 7, 12, 13, 14, 15};
    const vi8 even = {0, 2, 8, 10, 4, 6, 12, 14}, odd = {1, 3, 9, 11, 5, 7, 13, 15};
    const vi8 order = {0, 4, 1, 5, 2, 6, 3, 7};
    for (int64_t j = 0; j < n; j += 8) {
        v8 a[8];
        for (int k = 0; k < 8; k++) a[k] = (v8){0, 0, 0, 0, 0, 0, 0, 0};
        for (int c = 0; c < d; c += 8) {
            v8 x = load8(q + c);
            for (int k = 0; k < 8; k++) a[k] += x * load8(keys[j + k] + c);
        }
        v8 s01 = __builtin_shuffle(a[0], a[1], lo) + __builtin_shuffle(a[0], a[1], hi);
        v8 s23 = __builtin_shuffle(a[2], a[3], lo) + __builtin_shuffle(a[2], a[3], hi);
        v8 s45 = __builtin_shuffle(a[4], a[5], lo) + __builtin_shuffle(a[4], a[5], hi);
        v8 s67 = __builtin_shuffle(a[6], a[7], lo) + __builtin_shuffle(a[6], a[7], hi);
        v8 t0 = __builtin_shuffle(s01, s23, even) + __builtin_shuffle(s01, s23, odd);
        v8 t1 = __builtin_shuffle(s45, s67, even) + __builtin_shuffle(s45, s67, odd);
        v8 r = __builtin_shuffle(t0, t1, even) + __builtin_shuffle(t0, t1, odd);  /* keys 0 2 4 6 1 3 5 7 */
        store8(s + j, __builtin_shuffle(r, order) * scale);
    }
}

/* out[0:d] = inv * sum_j w[j] values[j][0:d], the sum in key order; 64 columns at a time in registers. */
static void weigh(const float *w, const float **values, int64_t n, int d, float inv, float *out) {
    int c0 = 0;
    for (; c0 + 64 <= d; c0 += 64) {
        v8 a[8];
        for (int k = 0; k < 8; k++) a[k] = (v8){0, 0, 0, 0, 0, 0, 0, 0};
        for (int64_t j = 0; j < n; j++) {
            v8 x = {w[j], w[j], w[j], w[j], w[j], w[j], w[j], w[j]};
            for (int k = 0; k < 8; k++) a[k] += x * load8(values[j] + c0 + 8 * k);
        }
        for (int k = 0; k < 8; k++) store8(out + c0 + 8 * k, a[k] * inv);
    }
    for (int c = c0; c < d; c++) {
        float a = 0.0f;
        for (int64_t j = 0; j < n; j++) a += w[j] * values[j][c];
        out[c] = a * inv;
    }
}

/* What a call's tasks share: one task is one (query, key head), so each output is computed by one thread. */
typedef struct {
    const int64_t *meta, *path;
    const float *q, *kbuf, *vbuf, *k_new, *v_new;
    float *out;
    int64_t q_tok, q_head, c_row, c_head, c_pos, k_tok, k_head, v_tok, v_head, o_tok, h_kv, rep, d, window;
    float scale;
} att_call;

/* A thread's scratch (scores, then key and value pointers), grown as needed and kept for its next call. */
static __thread float *scratch;
static __thread size_t scratch_len;

static float *scratch_for(size_t floats) {
    if (floats > scratch_len) {
        free(scratch);
        scratch = malloc(sizeof(float) * floats);
        scratch_len = scratch ? floats : 0;
    }
    return scratch;
}

/* Query i's attention for key head g (t = i * h_kv + g): returns 0, or -1 where its scratch ran out. */
static int attend_one(const att_call *a, int64_t t) {
    int64_t i = t / a->h_kv, g = t % a->h_kv, rep = a->rep, d = a->d;
    const int64_t *m = a->meta + 5 * i;
    int64_t tok = m[0], row = m[1], past = m[2], end = m[3], path_at = m[4];
    int64_t start = (a->window > 0 && end > a->window) ? end - a->window : 0;
    int64_t n = end - start, n8 = (n + 7) & ~(int64_t)7;  /* score rows padded to whole vectors (exp: 0) */
    /* scores [rep, n8], then 2 * n8 pointers (a pointer takes at most two floats' room) */
    float *scores = scratch_for((size_t)(rep * n8 + 4 * n8));
    if (!scores) return -1;
    const float **keys = (const float **)(scores + rep * n8), **values = keys + n8;
    const float *kc = a->kbuf + row * a->c_row + g * a->c_head, *vc = a->vbuf + row * a->c_row + g * a->c_head;
    const float *qg = a->q + tok * a->q_tok + g * rep * a->q_head;
    for (int64_t p = start; p < end; p++) {
        int64_t j = p - start, at = p < past ? -1 : a->path[path_at + p - past];
        keys[j] = at < 0 ? kc + p * a->c_pos : a->k_new + at * a->k_tok + g * a->k_head;
        values[j] = at < 0 ? vc + p * a->c_pos : a->v_new + at * a->v_tok + g * a->v_head;
    }
    for (int64_t j = n; j < n8; j++) keys[j] = keys[0];  /* padding: scores overwritten below */
    for (int64_t r = 0; r < rep; r++) {
        float *s = scores + r * n8;
        scores_of(qg + r * a->q_head, keys, n8, (int)d, a->scale, s);
        float top = s[0];
        for (int64_t j = 1; j < n; j++) top = s[j] > top ? s[j] : top;
        for (int64_t j = n; j < n8; j++) s[j] = -1e30f;
        v8 tv = {top, top, top, top, top, top, top, top}, sum = {0, 0, 0, 0, 0, 0, 0, 0};
        for (int64_t j = 0; j < n8; j += 8) {
            v8 e = exp8(load8(s + j) - tv);
            store8(s + j, e);
            sum += e;
        }
        weigh(s, values, n, (int)d, 1.0f / hsum(sum), a->out + tok * a->o_tok + (g * rep + r) * d);
    }
    return 0;
}

typedef struct {
    const att_call *call;
    atomic_int failed; /* set by any task whose scratch ran out */
} att_run;

static void attend_task(void *ctx, int64_t t) {
    att_run *run = ctx;
    if (attend_one(run->call, t)) atomic_store(&run->failed, 1);
}

/* meta: per query, 5 int64: packed token (its q row and output row), cache row, past (cached positions
   0 .. past - 1 are read from the cache), end (keys at positions 0 .. end - 1; positions past .. end - 1 are the
   packed tokens path[path_at + p - past]), path_at. window > 0: only the last `window` positions.
   q [T, h_q, d], k_new / v_new [T, h_kv, d] and out [T, h_q * d] by token and head strides (d contiguous);
   kbuf / vbuf [rows, h_kv, capacity, d] by their three strides. parallel: NULL, or a pool's bq_parallel (blockq.c)
   that runs the (query, key head) tasks on up to nthreads threads; each task is one thread's, by the same
   instructions, so the thread count changes no bit. Returns 0, or -1: out of memory. */
int exact_attention(int64_t nq, const int64_t *meta, const int64_t *path, const float *q, int64_t q_tok,
                    int64_t q_head, const float *kbuf, const float *vbuf, int64_t c_row, int64_t c_head,
                    int64_t c_pos, const float *k_new, int64_t k_tok, int64_t k_head, const float *v_new,
                    int64_t v_tok, int64_t v_head, float *out, int64_t o_tok, int64_t h_q, int64_t h_kv,
                    int64_t d, float scale, int64_t window,
                    void (*parallel)(void (*)(void *, int64_t), void *, int64_t, int), int nthreads) {
    int64_t rep = h_q / h_kv;
    att_call call = {meta, path, q, kbuf, vbuf, k_new, v_new, out, q_tok, q_head, c_row, c_head, c_pos, k_tok,
                     k_head, v_tok, v_head, o_tok, h_kv, rep, d, window, scale};
    att_run run = {&call};
    atomic_init(&run.failed, 0);
    int64_t tasks = nq * h_kv;
    if (parallel && nthreads > 1 && tasks > 1)
        parallel(attend_task, &run, tasks, nthreads);
    else
        for (int64_t t = 0; t < tasks; t++) attend_task(&run, t);
    return atomic_load(&run.failed) ? -1 : 0;
}
