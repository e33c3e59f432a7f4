/* Weight-only quantized linear for a few rows: y[M, N] = x[M, K] W[N, K]^T (+ bias), W in groups of 32 inputs.
 *
 * w = d[n, g] * q + m[n, g] for the 32 inputs of group g of output n; x and y stay float32 (weight-only).
 *   int4: q in 0..15, 16 bytes per group, low nibble = input j, high nibble = input j + 16 (GGUF Q4_1's layout).
 *   int8: q in -128..127, 32 bytes per group (m = 0 is GGUF Q8_0).
 * Every weight is dequantized in registers once per call and used for all M rows, so a decode step reads each
 * packed weight once (0.56 / 1.06 bytes per weight with the scales, against 4 for float32).
 * Loaded by echorl_agent/llm/qkernel.py (compiled on first use with the machine's C compiler).
 */
#include <stdint.h>
#include <stddef.h>

#define GROUP 32

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>

static inline float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static inline void unpack4(const uint8_t *p, float d, float m, __m256 w[4]) {
    __m128i b = _mm_loadu_si128((const __m128i *)p);
    __m128i mask = _mm_set1_epi8(0x0F);
    __m128i lo = _mm_and_si128(b, mask), hi = _mm_and_si128(_mm_srli_epi16(b, 4), mask);
    __m256 vd = _mm256_set1_ps(d), vm = _mm256_set1_ps(m);
    w[0] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(lo)), vd, vm);
    w[1] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(lo, 8))), vd, vm);
    w[2] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(hi)), vd, vm);
    w[3] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(hi, 8))), vd, vm);
}

static inline void unpack8(const int8_t *p, float d, float m, __m256 w[4]) {
    __m256 vd = _mm256_set1_ps(d), vm = _mm256_set1_ps(m);
    for (int i = 0; i < 4; i++) {
        __m128i b = _mm_loadl_epi64((const __m128i *)(p + 8 * i));
        w[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b)), vd, vm);
    }
}

/* One output feature for MR (1 or 2) rows; always inlined so MR is a constant and the accumulators live in
 * registers. Each row has 4 accumulators (one per 8 inputs of a group, so its FMAs do not wait on each other)
 * summed in a fixed order: a row's result is bit-identical whatever rows share its batch. The group's weights
 * stay in L1 between the row pairs of one output, so memory traffic is one read of the weights per call. */
#define DEFINE_ROWS(NAME, UNPACK, CODE_T, GROUP_BYTES)                                                         \
    static inline __attribute__((always_inline)) float NAME##_one(                                              \
        const float *x, int mr, int K, const CODE_T *c, const float *dn, const float *mn, float *out) {        \
        const int G = K / GROUP;                                                                               \
        __m256 acc[2][4];                                                                                      \
        for (int r = 0; r < mr; r++)                                                                           \
            for (int i = 0; i < 4; i++) acc[r][i] = _mm256_setzero_ps();                                       \
        for (int g = 0; g < G; g++) {                                                                          \
            __m256 w[4];                                                                                       \
            UNPACK(c + (size_t)g * (GROUP_BYTES), dn[g], mn[g], w);                                            \
            for (int r = 0; r < mr; r++)                                                                       \
                for (int i = 0; i < 4; i++)                                                                    \
                    acc[r][i] = _mm256_fmadd_ps(w[i], _mm256_loadu_ps(x + (size_t)r * K + g * GROUP + 8 * i), \
                                                acc[r][i]);                                                    \
        }                                                                                                      \
        for (int r = 0; r < mr; r++)                                                                           \
            out[r] = hsum(_mm256_add_ps(_mm256_add_ps(acc[r][0], acc[r][1]),                                   \
                                        _mm256_add_ps(acc[r][2], acc[r][3])));                                 \
        return 0.0f;                                                                                           \
    }                                                                                                          \
    static void NAME(const float *x, int M, int K, const CODE_T *codes, const float *d, const float *m,        \
                     const float *bias, float *y, int N, int n0, int n1) {                                     \
        const int G = K / GROUP;                                                                               \
        for (int n = n0; n < n1; n++) {                                                                        \
            const CODE_T *c = codes + (size_t)n * G * (GROUP_BYTES);                                           \
            const float *dn = d + (size_t)n * G, *mn = m + (size_t)n * G;                                      \
            const float b = bias ? bias[n] : 0.0f;                                                             \
            float out[2];                                                                                      \
            int r = 0;                                                                                         \
            for (; r + 2 <= M; r += 2) {                                                                       \
                NAME##_one(x + (size_t)r * K, 2, K, c, dn, mn, out);                                           \
                y[(size_t)r * N + n] = out[0] + b;                                                             \
                y[(size_t)(r + 1) * N + n] = out[1] + b;                                                       \
            }                                                                                                  \
            if (r < M) {                                                                                       \
                NAME##_one(x + (size_t)r * K, 1, K, c, dn, mn, out);                                           \
                y[(size_t)r * N + n] = out[0] + b;                                                             \
            }                                                                                                  \
        }                                                                                                      \
    }
#else
/* Portable fallback (no AVX2/FMA): same arithmetic, one weight at a time. */
static inline void unpack4(const uint8_t *p, float d, float m, float w[GROUP]) {
    for (int j = 0; j < 16; j++) {
        w[j] = d * (float)(p[j] & 15) + m;
        w[j + 16] = d * (float)(p[j] >> 4) + m;
    }
}
static inline void unpack8(const int8_t *p, float d, float m, float w[GROUP]) {
    for (int j = 0; j < GROUP; j++) w[j] = d * (float)p[j] + m;
}
#define DEFINE_ROWS(NAME, UNPACK, CODE_T, GROUP_BYTES)                                                         \
    static void NAME(const float *x, int M, int K, const CODE_T *codes, const float *d, const float *m,        \
                     const float *bias, float *y, int N, int n0, int n1) {                                     \
        const int G = K / GROUP;                                                                               \
        for (int n = n0; n < n1; n++)                                                                          \
            for (int r = 0; r < M; r++) {                                                                      \
                float acc = 0.0f;                                                                              \
                const CODE_T *c = codes + (size_t)n * G * (GROUP_BYTES);                                       \
                for (int g = 0; g < G; g++) {                                                                  \
                    float w[GROUP];                                                                            \
                    UNPACK(c + (size_t)g * (GROUP_BYTES), d[(size_t)n * G + g], m[(size_t)n * G + g], w);      \
                    for (int j = 0; j < GROUP; j++) acc += w[j] * x[(size_t)r * K + g * GROUP + j];            \
                }                                                                                              \
                y[(size_t)r * N + n] = acc + (bias ? bias[n] : 0.0f);                                          \
            }                                                                                                  \
    }
#endif

DEFINE_ROWS(rows4, unpack4, uint8_t, GROUP / 2)
DEFINE_ROWS(rows8, unpack8, int8_t, GROUP)

#define DEFINE_LINEAR(NAME, ROWS, CODE_T)                                                                      \
    int NAME(const float *x, int M, int K, const CODE_T *codes, const float *d, const float *m,                \
             const float *bias, float *y, int N, int n0, int n1) {                                             \
        if (K % GROUP) return -1;                                                                              \
        ROWS(x, M, K, codes, d, m, bias, y, N, n0, n1);                                                        \
        return 0;                                                                                              \
    }

DEFINE_LINEAR(q4_linear, rows4, uint8_t)
DEFINE_LINEAR(q8_linear, rows8, int8_t)

int qlinear_simd(void) {
#if defined(__AVX2__) && defined(__FMA__)
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
    const float *x, *d, *m, *bias;
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

int q_linear_mt(int bits, const float *x, int M, int K, const void *codes, const float *d, const float *m,
                const float *bias, float *y, int N, int threads) {
    if (K % GROUP) return -1;
    if (threads > 16) threads = 16;
    if (threads < 1) threads = 1;
    qjob jobs[16];
    pthread_t tid[16];
    int started[16] = {0};
    for (int t = 0; t < threads; t++) {
        jobs[t] = (qjob){bits, M, K, N, (int)((long)N * t / threads), (int)((long)N * (t + 1) / threads),
                         x, d, m, bias, codes, y};
        if (t > 0) started[t] = pthread_create(&tid[t], NULL, qjob_run, &jobs[t]) == 0;
    }
    for (int t = 1; t < threads; t++)
        if (!started[t]) qjob_run(&jobs[t]); /* could not start a thread: do its share here */
    qjob_run(&jobs[0]);
    for (int t = 1; t < threads; t++)
        if (started[t]) pthread_join(tid[t], NULL);
    return 0;
}
