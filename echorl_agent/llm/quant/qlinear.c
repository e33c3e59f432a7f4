/* Quantized linear for a few rows: y[M, N] = x[M, K] W[N, K]^T (+ bias), W in groups of 32 inputs.
 *
 * w = d[n, g] * q + m[n, g] for the 32 inputs of group g of output n, d and m stored as IEEE half (as GGUF's
 * blocks); y is float32.
 *   int4: q in 0..15, 16 bytes per group, low nibble = input j, high nibble = input j + 16 (GGUF Q4_1's layout).
 *         x is rounded to int16 per group of 32 (below) and multiplied with integer dot products.
 *   int8: q in -128..127, 32 bytes per group (m = 0 is GGUF Q8_0); x stays float32, each group is dequantized in
 *         registers once per call and used for all M rows.
 * Each choice was the faster one on the reference machine (AVX2, 1 thread): unpacking nibbles to float made int4
 * compute-bound (slower than int8), the int16 dots are 1.4-1.6x faster for one row; for int8 (and for int4 at 8
 * rows) the float path is 1.1-1.2x faster. A decode step reads each packed weight once (0.625 / 1.125 bytes per
 * weight with the scales, against 4 for float32).
 * Loaded by echorl_agent/llm/quant/qkernel.py (compiled on first use with the machine's C compiler).
 */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#define GROUP 32

typedef uint16_t half; /* IEEE binary16 bits */

#if defined(__F16C__)
#include <immintrin.h>
static inline float h2f(half h) { return _cvtsh_ss(h); }
#else
static inline float h2f(half h) { /* exact half -> float without F16C */
    const uint32_t s = (uint32_t)(h & 0x8000) << 16, e = (h >> 10) & 31, f = h & 1023;
    union { uint32_t u; float f; } v;
    if (e == 31) v.u = s | 0x7F800000u | (f << 13);
    else if (e) v.u = s | ((e + 112) << 23) | (f << 13);
    else { v.f = (float)f * (1.0f / 16777216.0f); v.u |= s; } /* zero / subnormal: f * 2^-24 */
    return v.f;
}
#endif

/* int4's activations are quantized per row and group of 32 inputs, symmetrically to int16: xq = round(x / dx)
 * with dx = max|x| / 32767, and the group's exact float sum sx is kept for the offset term. One (row, output)
 * result is then  sum over groups g of  d[n, g] * dx[g] * (sum_j q_j xq_j)  +  m[n, g] * sx[g],  the integer
 * dots exact; each row's quantization depends on that row only. The rounding is ~1e-5 of a group's largest
 * input (int8 activations, as llama.cpp's Q8 blocks, were measured too: teacher-forced next-token agreement
 * with float32 fell to 0.88, against 1.00 with int16). */
typedef struct {
    int16_t *q; /* [M, K] */
    float *dx; /* [M, G] */
    float *sx; /* [M, G] */
} qx;

static int quantize_rows(const float *x, int M, int K, qx *out) {
    const int G = K / GROUP;
    out->q = (int16_t *)malloc(sizeof(int16_t) * (size_t)M * K);
    out->dx = (float *)malloc(sizeof(float) * (size_t)M * G * 2);
    if (!out->q || !out->dx) {
        free(out->q);
        free(out->dx);
        return -2;
    }
    out->sx = out->dx + (size_t)M * G;
    for (size_t rg = 0; rg < (size_t)M * G; rg++) {
        const float *v = x + rg * GROUP;
        float amax = 0.0f, sum = 0.0f;
        for (int j = 0; j < GROUP; j++) {
            const float a = fabsf(v[j]);
            amax = a > amax ? a : amax;
            sum += v[j];
        }
        const float dx = amax / 32767.0f, id = dx > 0.0f ? 1.0f / dx : 0.0f;
        for (int j = 0; j < GROUP; j++) out->q[rg * GROUP + j] = (int16_t)lrintf(v[j] * id);
        out->dx[rg] = dx;
        out->sx[rg] = sum;
    }
    return 0;
}

static void free_rows(qx *v) {
    free(v->q);
    free(v->dx);
}

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>

static inline float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* The 32 codes of a group in input order as int16: q[0] inputs 0..15, q[1] inputs 16..31. */
static inline void load4(const uint8_t *p, __m256i q[2]) {
    const __m128i b = _mm_loadu_si128((const __m128i *)p), mask = _mm_set1_epi8(0x0F);
    q[0] = _mm256_cvtepu8_epi16(_mm_and_si128(b, mask));
    q[1] = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(b, 4), mask));
}
/* sum over groups of m[g] * sx[g] (the offsets' term), in a fixed order. */
static inline float offset(const half *m, const float *sx, int G) {
    __m256 a = _mm256_setzero_ps();
    int g = 0;
    for (; g + 8 <= G; g += 8)
        a = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(m + g))), _mm256_loadu_ps(sx + g), a);
    float s = hsum(a);
    for (; g < G; g++) s += h2f(m[g]) * sx[g];
    return s;
}
/* 8 int32 partial sums of q . xq (|q| <= 128, |xq| <= 32767: each lane's 4 products fit in int32). */
static inline __m256i dot16(const __m256i q[2], const int16_t *xq) {
    return _mm256_add_epi32(_mm256_madd_epi16(q[0], _mm256_loadu_si256((const __m256i *)xq)),
                            _mm256_madd_epi16(q[1], _mm256_loadu_si256((const __m256i *)(xq + 16))));
}

/* The (row, output) tiles of a call: rows in blocks of 8 / 4 / 2 / 1, outputs in blocks of 8 / MR and one at a
 * time at the end of [n0, n1). TILE computes NO outputs x MR rows; the blocking never changes a result. */
#define FOR_TILES(TILE, X, M, K, codes, d, m, bias, y, N, n0, n1, GROUP_BYTES)                                     \
    do {                                                                                                           \
        const int G_ = (K) / GROUP;                                                                                \
        for (int r = 0; r < (M);) {                                                                                \
            const int rem = (M) - r, MR = rem >= 8 ? 8 : rem >= 4 ? 4 : rem >= 2 ? 2 : 1, NO = 8 / MR;             \
            for (int n = (n0); n < (n1);) {                                                                        \
                const int full = n + NO <= (n1);                                                                   \
                const size_t at = (size_t)n * G_;                                                                  \
                switch (MR) {                                                                                      \
                case 8: TILE(X, r, K, (codes) + at * (GROUP_BYTES), (d) + at, (m) + at, bias, y, N, n, 1, 8); break;\
                case 4: full ? TILE(X, r, K, (codes) + at * (GROUP_BYTES), (d) + at, (m) + at, bias, y, N, n, 2, 4)\
                             : TILE(X, r, K, (codes) + at * (GROUP_BYTES), (d) + at, (m) + at, bias, y, N, n, 1, 4);\
                        break;                                                                                     \
                case 2: full ? TILE(X, r, K, (codes) + at * (GROUP_BYTES), (d) + at, (m) + at, bias, y, N, n, 4, 2)\
                             : TILE(X, r, K, (codes) + at * (GROUP_BYTES), (d) + at, (m) + at, bias, y, N, n, 1, 2);\
                        break;                                                                                     \
                default: full ? TILE(X, r, K, (codes) + at * (GROUP_BYTES), (d) + at, (m) + at, bias, y, N, n, 8, 1)\
                              : TILE(X, r, K, (codes) + at * (GROUP_BYTES), (d) + at, (m) + at, bias, y, N, n, 1, 1);\
                }                                                                                                  \
                n += full ? NO : 1;                                                                                \
            }                                                                                                      \
            r += MR;                                                                                               \
        }                                                                                                          \
    } while (0)

/* A tile of NO output features x MR rows (NO * MR = 8 accumulators, one per (output, row)); always inlined so NO
 * and MR are constants and the accumulators live in registers. Each group's codes are loaded once for all MR
 * rows. Every (row, output) result is summed in the same order whatever tile computes it (groups in order; per
 * group an exact integer dot, then one FMA per lane; one horizontal sum and the offset sum at the end), so a
 * row's result is bit-identical whatever rows share its batch and however the outputs are split over threads.
 * The next tile's codes are prefetched: decode streams the weights from memory once per step. */
#define DEFINE_ROWS_Q(NAME, LOAD, CODE_T, GROUP_BYTES)                                                         \
    static inline __attribute__((always_inline)) void NAME##_tile(                                              \
        const qx *xv, int r0, int K, const CODE_T *c, const half *dn, const half *mn, const float *bias,        \
        float *y, int N, int n, const int NO, const int MR) {                                                  \
        const int G = K / GROUP;                                                                               \
        __m256 acc[8];                                                                                         \
        for (int i = 0; i < NO * MR; i++) acc[i] = _mm256_setzero_ps();                                        \
        for (int g = 0; g < G; g++) {                                                                          \
            for (int j = 0; j < NO; j++) {                                                                     \
                const size_t jg = (size_t)j * G + g;                                                           \
                _mm_prefetch((const char *)(c + (jg + (size_t)NO * G) * (GROUP_BYTES)), _MM_HINT_T0);          \
                __m256i q[2];                                                                                  \
                LOAD(c + jg * (GROUP_BYTES), q);                                                               \
                const float dw = h2f(dn[jg]);                                                                  \
                for (int r = 0; r < MR; r++) {                                                                 \
                    const size_t rg = (size_t)(r0 + r) * G + g;                                                \
                    acc[j * MR + r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot16(q, xv->q + rg * GROUP)),        \
                                                      _mm256_set1_ps(dw * xv->dx[rg]), acc[j * MR + r]);       \
                }                                                                                              \
            }                                                                                                  \
        }                                                                                                      \
        for (int j = 0; j < NO; j++)                                                                           \
            for (int r = 0; r < MR; r++)                                                                       \
                y[(size_t)(r0 + r) * N + n + j] =                                                              \
                    hsum(acc[j * MR + r]) + offset(mn + (size_t)j * G, xv->sx + (size_t)(r0 + r) * G, G) +     \
                    (bias ? bias[n + j] : 0.0f);                                                               \
    }                                                                                                          \
    static void NAME(const qx *xv, int M, int K, const CODE_T *codes, const half *d, const half *m,                \
                     const float *bias, float *y, int N, int n0, int n1) {                                         \
        FOR_TILES(NAME##_tile, xv, M, K, codes, d, m, bias, y, N, n0, n1, GROUP_BYTES);                            \
    }
DEFINE_ROWS_Q(rows4, load4, uint8_t, GROUP / 2)

static inline void unpack8(const int8_t *p, float d, float m, __m256 w[4]) {
    __m256 vd = _mm256_set1_ps(d), vm = _mm256_set1_ps(m);
    for (int i = 0; i < 4; i++) {
        __m128i b = _mm_loadl_epi64((const __m128i *)(p + 8 * i));
        w[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b)), vd, vm);
    }
}

/* A tile of NO output features x MR rows (NO * MR = 8 accumulators, one per (output, row)); always inlined so NO
 * and MR are constants and the accumulators live in registers. Each group of an output is dequantized once for
 * all MR rows. Every (row, output) dot product is summed in the same order whatever tile computes it (one
 * accumulator, groups in order, 4 FMAs of 8 inputs each per group, then one horizontal sum), so a row's result
 * is bit-identical whatever rows share its batch and however the outputs are split over threads. */
#define DEFINE_ROWS_F(NAME, UNPACK, CODE_T, GROUP_BYTES)                                                       \
    static inline __attribute__((always_inline)) void NAME##_tile(                                              \
        const float *x, int r0, int K, const CODE_T *c, const half *dn, const half *mn, const float *bias,         \
        float *y, int N, int n, const int NO, const int MR) {                                                      \
        const int G = K / GROUP;                                                                               \
        __m256 acc[8];                                                                                         \
        for (int i = 0; i < NO * MR; i++) acc[i] = _mm256_setzero_ps();                                        \
        for (int g = 0; g < G; g++) {                                                                          \
            for (int j = 0; j < NO; j++) {                                                                     \
                __m256 w[4];                                                                                   \
                const size_t jg = (size_t)j * G + g;                                                           \
                _mm_prefetch((const char *)(c + (jg + (size_t)NO * G) * (GROUP_BYTES)), _MM_HINT_T0);          \
                UNPACK(c + jg * (GROUP_BYTES), h2f(dn[jg]), h2f(mn[jg]), w);                                   \
                for (int r = 0; r < MR; r++) {                                                                 \
                    const float *xr = x + (size_t)(r0 + r) * K + g * GROUP;                                        \
                    __m256 a = acc[j * MR + r];                                                                \
                    a = _mm256_fmadd_ps(w[0], _mm256_loadu_ps(xr), a);                                         \
                    a = _mm256_fmadd_ps(w[1], _mm256_loadu_ps(xr + 8), a);                                     \
                    a = _mm256_fmadd_ps(w[2], _mm256_loadu_ps(xr + 16), a);                                    \
                    a = _mm256_fmadd_ps(w[3], _mm256_loadu_ps(xr + 24), a);                                    \
                    acc[j * MR + r] = a;                                                                       \
                }                                                                                              \
            }                                                                                                  \
        }                                                                                                      \
        for (int j = 0; j < NO; j++)                                                                           \
            for (int r = 0; r < MR; r++)                                                                       \
                y[(size_t)(r0 + r) * N + n + j] = hsum(acc[j * MR + r]) + (bias ? bias[n + j] : 0.0f);             \
    }                                                                                                          \
    static void NAME(const float *x, int M, int K, const CODE_T *codes, const half *d, const half *m,              \
                     const float *bias, float *y, int N, int n0, int n1) {                                         \
        FOR_TILES(NAME##_tile, x, M, K, codes, d, m, bias, y, N, n0, n1, GROUP_BYTES);                             \
    }
DEFINE_ROWS_F(rows8, unpack8, int8_t, GROUP)
#else
/* Portable fallback (no AVX2/FMA): the same integer dots and scaling, one weight at a time. */
static inline int code4(const uint8_t *p, int j) { return j < 16 ? (p[j] & 15) : (p[j - 16] >> 4); }
#define DEFINE_ROWS_Q(NAME, CODE, CODE_T, GROUP_BYTES)                                                         \
    static void NAME(const qx *xv, int M, int K, const CODE_T *codes, const half *d, const half *m,            \
                     const float *bias, float *y, int N, int n0, int n1) {                                     \
        const int G = K / GROUP;                                                                               \
        for (int n = n0; n < n1; n++)                                                                          \
            for (int r = 0; r < M; r++) {                                                                      \
                float acc = 0.0f, off = 0.0f;                                                                  \
                for (int g = 0; g < G; g++) {                                                                  \
                    const CODE_T *c = codes + ((size_t)n * G + g) * (GROUP_BYTES);                             \
                    const size_t rg = (size_t)r * G + g, ng = (size_t)n * G + g;                               \
                    int s = 0;                                                                                 \
                    for (int j = 0; j < GROUP; j++) s += CODE(c, j) * xv->q[rg * GROUP + j];                   \
                    acc += (float)s * (h2f(d[ng]) * xv->dx[rg]);                                             \
                    off += h2f(m[ng]) * xv->sx[rg];                                                            \
                }                                                                                              \
                y[(size_t)r * N + n] = acc + off + (bias ? bias[n] : 0.0f);                                    \
            }                                                                                                  \
    }
DEFINE_ROWS_Q(rows4, code4, uint8_t, GROUP / 2)
static inline void unpack8(const int8_t *p, float d, float m, float w[GROUP]) {
    for (int j = 0; j < GROUP; j++) w[j] = d * (float)p[j] + m;
}
#define DEFINE_ROWS_F(NAME, UNPACK, CODE_T, GROUP_BYTES)                                                       \
    static void NAME(const float *x, int M, int K, const CODE_T *codes, const half *d, const half *m,          \
                     const float *bias, float *y, int N, int n0, int n1) {                                     \
        const int G = K / GROUP;                                                                               \
        for (int n = n0; n < n1; n++)                                                                          \
            for (int r = 0; r < M; r++) {                                                                      \
                float acc = 0.0f;                                                                              \
                const CODE_T *c = codes + (size_t)n * G * (GROUP_BYTES);                                       \
                for (int g = 0; g < G; g++) {                                                                  \
                    float w[GROUP];                                                                            \
                    const size_t ng = (size_t)n * G + g;                                                       \
                    UNPACK(c + (size_t)g * (GROUP_BYTES), h2f(d[ng]), h2f(m[ng]), w);                          \
                    for (int j = 0; j < GROUP; j++) acc += w[j] * x[(size_t)r * K + g * GROUP + j];            \
                }                                                                                              \
                y[(size_t)r * N + n] = acc + (bias ? bias[n] : 0.0f);                                          \
            }                                                                                                  \
    }
DEFINE_ROWS_F(rows8, unpack8, int8_t, GROUP)
#endif

/* Exported: outputs [n0, n1) of x W^T (+ bias). */
int q4_linear(const float *x, int M, int K, const uint8_t *codes, const half *d, const half *m, const float *bias,
              float *y, int N, int n0, int n1) {
    if (K % GROUP) return -1;
    qx xv;
    if (quantize_rows(x, M, K, &xv)) return -2;
    rows4(&xv, M, K, codes, d, m, bias, y, N, n0, n1);
    free_rows(&xv);
    return 0;
}

int q8_linear(const float *x, int M, int K, const int8_t *codes, const half *d, const half *m, const float *bias,
              float *y, int N, int n0, int n1) {
    if (K % GROUP) return -1;
    rows8(x, M, K, codes, d, m, bias, y, N, n0, n1);
    return 0;
}

int qlinear_simd(void) {
#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
    return 1;
#else
    return 0;
#endif
}

/* Several threads: the output features are split into contiguous ranges, one per thread (each thread reads only
 * its own weights). Threads are created per call, which costs tens of microseconds: callers use this only for
 * matrices large enough to amortize that (the MLP and the LM head of a small model). */
#include <pthread.h>

typedef struct {
    int bits, M, K, N, n0, n1;
    const float *x, *bias;
    const half *d, *m;
    const void *codes;
    float *y;
} qjob;

static void *qjob_run(void *p) {
    qjob *j = (qjob *)p;
    if (j->bits == 4)
        q4_linear(j->x, j->M, j->K, (const uint8_t *)j->codes, j->d, j->m, j->bias, j->y, j->N, j->n0, j->n1);
    else
        q8_linear(j->x, j->M, j->K, (const int8_t *)j->codes, j->d, j->m, j->bias, j->y, j->N, j->n0, j->n1);
    return NULL;
}

int q_linear_mt(int bits, const float *x, int M, int K, const void *codes, const half *d, const half *m,
                const float *bias, float *y, int N, int threads) {
    if (K % GROUP) return -1;
    if (threads > 16) threads = 16;
    if (threads < 1) threads = 1;
    qjob jobs[16];
    pthread_t tid[16];
    int started[16] = {0};
    for (int t = 0; t < threads; t++) {
        jobs[t] = (qjob){bits, M, K, N, (int)((long)N * t / threads), (int)((long)N * (t + 1) / threads),
                         x, bias, d, m, codes, y};
        if (t > 0) started[t] = pthread_create(&tid[t], NULL, qjob_run, &jobs[t]) == 0;
    }
    for (int t = 1; t < threads; t++)
        if (!started[t]) qjob_run(&jobs[t]); /* could not start a thread: do its share here */
    qjob_run(&jobs[0]);
    for (int t = 1; t < threads; t++)
        if (started[t]) pthread_join(tid[t], NULL);
    return 0;
}

/* ---------------------------------------------------------------------------------------------------------------
 * Fused decode: every decoder layer of a Llama-family model for M decode tokens in one call.
 *
 * One decode step in Python runs ~20 torch ops per layer (norms, projections, RoPE, KV write, attention, MLP);
 * at one token per sequence their dispatch costs as much as the matmuls. This function runs the whole layer
 * stack for M rows: RMSNorm -> q/k/v (+bias) -> RoPE (HF's rotate_half form, cos/sin given per row) -> K/V into
 * the paged pool -> attention over the row's blocks -> o_proj -> residual -> RMSNorm -> SiLU(gate) * up -> down
 * -> residual. Rows are independent (each row's arithmetic is the same whatever else is in the batch).
 *
 * Layer table (int64 per layer, FUSED_TAB entries): ln1, ln2, then (codes, d, m, bias) for q, k, v, o, gate, up,
 * down; bias 0 = none. The caller owns every buffer; x [M, hidden] is updated in place.
 * --------------------------------------------------------------------------------------------------------------- */
#include <math.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>

#define FUSED_TAB 30

static void rmsnorm(const float *x, const float *w, float *out, int H, float eps) {
    float ss = 0.0f;
    for (int i = 0; i < H; i++) ss += x[i] * x[i];
    const float inv = 1.0f / sqrtf(ss / (float)H + eps);
    for (int i = 0; i < H; i++) out[i] = w[i] * (x[i] * inv);
}

/* Output features [N * tid / T, N * (tid + 1) / T) of one linear (t: codes, d, m, bias pointers). */
static void qlin_part(int bits, const int64_t *t, const float *x, int M, int K, float *y, int N, int tid, int T) {
    const float *bias = (const float *)(intptr_t)t[3];
    const int n0 = (int)((long)N * tid / T), n1 = (int)((long)N * (tid + 1) / T);
    if (bits == 4)
        q4_linear(x, M, K, (const uint8_t *)(intptr_t)t[0], (const half *)(intptr_t)t[1],
                  (const half *)(intptr_t)t[2], bias, y, N, n0, n1);
    else
        q8_linear(x, M, K, (const int8_t *)(intptr_t)t[0], (const half *)(intptr_t)t[1],
                  (const half *)(intptr_t)t[2], bias, y, N, n0, n1);
}

static void rope(float *v, const float *cos, const float *sin, int D) {
    const int h = D / 2;
    for (int i = 0; i < h; i++) {
        const float a = v[i], b = v[i + h];
        v[i] = a * cos[i] - b * sin[i];
        v[i + h] = b * cos[i + h] + a * sin[i + h];
    }
}

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
static inline float dot(const float *a, const float *b, int n) { /* n % 8 == 0 (head_dim) */
    __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
        s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
    }
    for (; i < n; i += 8) s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
    return hsum(_mm256_add_ps(s0, s1));
}
static inline void axpy(float w, const float *x, float *y, int n) { /* y += w x, n % 8 == 0 */
    const __m256 vw = _mm256_set1_ps(w);
    for (int i = 0; i < n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_fmadd_ps(vw, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
}
#else
static inline float dot(const float *a, const float *b, int n) {
    float s = 0.0f;
    for (int i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}
static inline void axpy(float w, const float *x, float *y, int n) {
    for (int i = 0; i < n; i++) y[i] += w * x[i];
}
#endif

/* A spinning barrier for the fused decode's threads (a decode step of a small model has ~240 phases of tens of
 * microseconds: a futex round trip per phase would cost more than the work). Waiters yield the CPU after a while,
 * so an oversubscribed machine does not starve the thread everyone waits for. */
typedef struct {
    int count, gen, n;
} sbar;

static void sbar_wait(sbar *b) {
    if (b->n == 1) return;
    const int gen = __atomic_load_n(&b->gen, __ATOMIC_ACQUIRE);
    if (__atomic_add_fetch(&b->count, 1, __ATOMIC_ACQ_REL) == b->n) {
        __atomic_store_n(&b->count, 0, __ATOMIC_RELAXED);
        __atomic_store_n(&b->gen, gen + 1, __ATOMIC_RELEASE);
        return;
    }
    for (int spins = 0; __atomic_load_n(&b->gen, __ATOMIC_ACQUIRE) == gen; spins++)
        if (spins > 4000) sched_yield();
}

typedef struct {
    int L, bits, M, H, n_heads, n_kv, D, inter, max_blocks, block_size, capture_layer, threads;
    const int64_t *tab, *slots, *tables, *ctx_lens;
    float eps, scale;
    float *x, *k_pool, *v_pool, *h_pool;
    const float *cos, *sin;
    int64_t layer_stride, max_ctx;
    float *h, *q, *k, *v, *o, *g, *u, *p; /* scratch; p: max_ctx attention scores per thread */
    sbar bar;
    int go; /* workers start when set: the thread count is final by then */
} dctx;

typedef struct {
    dctx *c;
    int tid;
} dworker;

static void attend(const dctx *c, float *kl, float *vl, int r, int hh, float *p) {
    const int QD = c->n_heads * c->D, KD = c->n_kv * c->D, D = c->D, bs = c->block_size;
    const int kvh = hh / (c->n_heads / c->n_kv);
    const int64_t n = c->ctx_lens[r], *tb = c->tables + (size_t)r * c->max_blocks;
    const float *qh = c->q + (size_t)r * QD + hh * D;
    float mx = -INFINITY, sum = 0.0f;
    for (int64_t s = 0; s < n; s++) {
        p[s] = c->scale * dot(qh, kl + (size_t)(tb[s / bs] * bs + s % bs) * KD + kvh * D, D);
        mx = p[s] > mx ? p[s] : mx;
    }
    for (int64_t s = 0; s < n; s++) {
        p[s] = expf(p[s] - mx);
        sum += p[s];
    }
    float *oh = c->o + (size_t)r * QD + hh * D;
    for (int i = 0; i < D; i++) oh[i] = 0.0f;
    for (int64_t s = 0; s < n; s++) axpy(p[s] / sum, vl + (size_t)(tb[s / bs] * bs + s % bs) * KD + kvh * D, oh, D);
}

/* One thread's part of every layer: linears and attention split over threads (each output feature / head is
 * computed whole by one thread, so the result does not depend on the thread count), norms, RoPE and residuals on
 * thread 0, a barrier between phases. */
static void *decode_worker(void *arg) {
    dworker *w = (dworker *)arg;
    dctx *c = w->c;
    for (int spins = 0; !__atomic_load_n(&c->go, __ATOMIC_ACQUIRE); spins++)
        if (spins > 4000) sched_yield();
    const int tid = w->tid, T = c->threads, M = c->M, H = c->H, D = c->D, inter = c->inter;
    const int QD = c->n_heads * D, KD = c->n_kv * D;
    float *p = c->p + (size_t)tid * c->max_ctx;
    for (int li = 0; li < c->L; li++) {
        const int64_t *t = c->tab + (size_t)li * FUSED_TAB;
        float *kl = c->k_pool + (size_t)li * c->layer_stride, *vl = c->v_pool + (size_t)li * c->layer_stride;
        if (tid == 0) {
            if (li == c->capture_layer && c->h_pool)
                for (int r = 0; r < M; r++)
                    memcpy(c->h_pool + (size_t)c->slots[r] * H, c->x + (size_t)r * H, sizeof(float) * H);
            for (int r = 0; r < M; r++)
                rmsnorm(c->x + (size_t)r * H, (const float *)(intptr_t)t[0], c->h + (size_t)r * H, H, c->eps);
        }
        sbar_wait(&c->bar);
        qlin_part(c->bits, t + 2, c->h, M, H, c->q, QD, tid, T);
        qlin_part(c->bits, t + 6, c->h, M, H, c->k, KD, tid, T);
        qlin_part(c->bits, t + 10, c->h, M, H, c->v, KD, tid, T);
        sbar_wait(&c->bar);
        if (tid == 0)
            for (int r = 0; r < M; r++) {
                const float *cs = c->cos + (size_t)r * D, *sn = c->sin + (size_t)r * D;
                for (int hh = 0; hh < c->n_heads; hh++) rope(c->q + (size_t)r * QD + hh * D, cs, sn, D);
                for (int hh = 0; hh < c->n_kv; hh++) rope(c->k + (size_t)r * KD + hh * D, cs, sn, D);
                memcpy(kl + (size_t)c->slots[r] * KD, c->k + (size_t)r * KD, sizeof(float) * KD);
                memcpy(vl + (size_t)c->slots[r] * KD, c->v + (size_t)r * KD, sizeof(float) * KD);
            }
        sbar_wait(&c->bar);
        const int items = M * c->n_heads;
        for (int it = items * tid / T; it < items * (tid + 1) / T; it++)
            attend(c, kl, vl, it / c->n_heads, it % c->n_heads, p);
        sbar_wait(&c->bar);
        qlin_part(c->bits, t + 14, c->o, M, QD, c->h, H, tid, T);
        sbar_wait(&c->bar);
        if (tid == 0) {
            for (size_t i = 0; i < (size_t)M * H; i++) c->x[i] += c->h[i];
            for (int r = 0; r < M; r++)
                rmsnorm(c->x + (size_t)r * H, (const float *)(intptr_t)t[1], c->h + (size_t)r * H, H, c->eps);
        }
        sbar_wait(&c->bar);
        qlin_part(c->bits, t + 18, c->h, M, H, c->g, inter, tid, T);
        qlin_part(c->bits, t + 22, c->h, M, H, c->u, inter, tid, T);
        const int n0 = (int)((long)inter * tid / T), n1 = (int)((long)inter * (tid + 1) / T);
        for (int r = 0; r < M; r++)
            for (int n = n0; n < n1; n++) {
                float *gv = c->g + (size_t)r * inter + n;
                *gv = *gv / (1.0f + expf(-*gv)) * c->u[(size_t)r * inter + n];
            }
        sbar_wait(&c->bar);
        qlin_part(c->bits, t + 26, c->g, M, inter, c->h, H, tid, T);
        sbar_wait(&c->bar);
        if (tid == 0)
            for (size_t i = 0; i < (size_t)M * H; i++) c->x[i] += c->h[i];
    }
    return NULL;
}

int q_decode_layers(int L, const int64_t *tab, int bits, int M, int H, int n_heads, int n_kv, int D, int inter,
                    float eps, float scale, float *x, const float *cos, const float *sin, float *k_pool,
                    float *v_pool, int64_t layer_stride, const int64_t *slots, const int64_t *tables,
                    int max_blocks, const int64_t *ctx_lens, int block_size, float *h_pool, int capture_layer,
                    int threads) {
    if (H % GROUP || (n_heads * D) % GROUP || inter % GROUP || n_heads % n_kv || D % 8) return -1;
    if (threads > 16) threads = 16;
    if (threads < 1) threads = 1;
    const int QD = n_heads * D, KD = n_kv * D;
    int64_t max_ctx = 1;
    for (int r = 0; r < M; r++) max_ctx = ctx_lens[r] > max_ctx ? ctx_lens[r] : max_ctx;
    float *buf = (float *)malloc(sizeof(float) * ((size_t)M * (H + 2 * QD + 2 * KD + 2 * inter) + threads * max_ctx));
    if (!buf) return -2;
    dctx c = {L, bits, M, H, n_heads, n_kv, D, inter, max_blocks, block_size, capture_layer, threads,
              tab, slots, tables, ctx_lens, eps, scale, x, k_pool, v_pool, h_pool, cos, sin, layer_stride, max_ctx};
    c.h = buf;
    c.q = c.h + (size_t)M * H;
    c.k = c.q + (size_t)M * QD;
    c.v = c.k + (size_t)M * KD;
    c.o = c.v + (size_t)M * KD;
    c.g = c.o + (size_t)M * QD;
    c.u = c.g + (size_t)M * inter;
    c.p = c.u + (size_t)M * inter;
    dworker ws[16];
    pthread_t tid[16];
    int started = 1;
    for (int t = 1; t < threads; t++) {
        ws[t] = (dworker){&c, t};
        if (pthread_create(&tid[t], NULL, decode_worker, &ws[t]) != 0) break;
        started++;
    }
    c.threads = started; /* fewer threads than asked if some could not start: the split adapts */
    c.bar = (sbar){0, 0, started};
    __atomic_store_n(&c.go, 1, __ATOMIC_RELEASE);
    ws[0] = (dworker){&c, 0};
    decode_worker(&ws[0]);
    for (int t = 1; t < started; t++) pthread_join(tid[t], NULL);
    free(buf);
    return 0;
}
