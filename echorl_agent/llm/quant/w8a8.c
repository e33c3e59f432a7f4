/* int8 x int8 -> int32 matrix product for the engine's W8A8 prefill (echorl_agent/llm/quant/w8a8.py).
 *
 * y[m][n] = sum_k a[m][k] * w[n][k] for a [M, K] (activations) and w [N, K] (weights, one row per output), both
 * int8 in -127..127 and row-major, K a multiple of 32. The integer sums are exact, so the result equals
 * torch._int_mm(a, w.T) bit for bit. On the AVX2 EPYC host of 2026-11-25 torch 2.13's CPU _int_mm did not reach
 * oneDNN (ONEDNN_VERBOSE silent) and took ~700 ms for a [512, 576] x [576, 1536] product, ~50x a float32 GEMM
 * (the probe had measured 2.2 ms on an earlier host, presumably one with VNNI), hence this file.
 *
 * AVX2 inner step: the activations are widened to int16 once per call and each weight row 16 bytes at a time
 * (vpmovsxbw); vpmaddwd multiplies 16 int16 pairs and sums neighbours into 8 int32 lanes (|a w| <= 127^2, no
 * saturation). llama.cpp's vpsignb + vpmaddubsw form on raw bytes needs two multiply-port ops per 32 products as
 * well plus a sign op, and measured slower here (1.23x vs 1.4x float32). Tiles of 4 rows x 2 outputs
 * (8 accumulators) run over blocks of NB weight rows that stay in L1 while every row of a passes by.
 * Threads split the outputs (each thread its own columns), so a result never depends on the thread count.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#ifdef __AVX2__
#include <immintrin.h>
#endif

#define NB 32

#ifdef __AVX2__
static inline int32_t hsum(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
    return _mm_cvtsi128_si32(s);
}

/* 16 weights widened to int16 */
#define LDW(p) _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(p)))
#define LDA(p) _mm256_loadu_si256((const __m256i *)(p))
/* acc += 16 int16 products summed pairwise into 8 int32 lanes */
#define MAC(acc, x, v) acc = _mm256_add_epi32(acc, _mm256_madd_epi16(x, v))
#endif

/* a16: activations widened to int16 [M, K] */
static void gemm_cols(const int16_t *a16, int M, int K, const int8_t *w, int N, int32_t *y, int n0, int n1) {
#ifdef __AVX2__
    for (int nb = n0; nb < n1; nb += NB) {
        int ne = nb + NB < n1 ? nb + NB : n1;
        int m = 0;
        for (; m + 4 <= M; m += 4) {
            const int16_t *a0 = a16 + (long)m * K, *a1 = a0 + K, *a2 = a1 + K, *a3 = a2 + K;
            int n = nb;
            for (; n + 2 <= ne; n += 2) {
                const int8_t *w0 = w + (long)n * K, *w1 = w0 + K;
                __m256i c00 = _mm256_setzero_si256(), c01 = c00, c10 = c00, c11 = c00;
                __m256i c20 = c00, c21 = c00, c30 = c00, c31 = c00;
                for (int k = 0; k < K; k += 16) {
                    __m256i v0 = LDW(w0 + k), v1 = LDW(w1 + k), x;
                    x = LDA(a0 + k); MAC(c00, x, v0); MAC(c01, x, v1);
                    x = LDA(a1 + k); MAC(c10, x, v0); MAC(c11, x, v1);
                    x = LDA(a2 + k); MAC(c20, x, v0); MAC(c21, x, v1);
                    x = LDA(a3 + k); MAC(c30, x, v0); MAC(c31, x, v1);
                }
                int32_t *r = y + (long)m * N + n;
                r[0] = hsum(c00); r[1] = hsum(c01); r += N;
                r[0] = hsum(c10); r[1] = hsum(c11); r += N;
                r[0] = hsum(c20); r[1] = hsum(c21); r += N;
                r[0] = hsum(c30); r[1] = hsum(c31);
            }
            for (; n < ne; n++) {
                const int8_t *w0 = w + (long)n * K;
                __m256i c0 = _mm256_setzero_si256(), c1 = c0, c2 = c0, c3 = c0;
                for (int k = 0; k < K; k += 16) {
                    __m256i v0 = LDW(w0 + k);
                    MAC(c0, LDA(a0 + k), v0); MAC(c1, LDA(a1 + k), v0);
                    MAC(c2, LDA(a2 + k), v0); MAC(c3, LDA(a3 + k), v0);
                }
                y[(long)m * N + n] = hsum(c0); y[(long)(m + 1) * N + n] = hsum(c1);
                y[(long)(m + 2) * N + n] = hsum(c2); y[(long)(m + 3) * N + n] = hsum(c3);
            }
        }
        for (; m < M; m++) {
            const int16_t *a0 = a16 + (long)m * K;
            for (int n = nb; n < ne; n++) {
                const int8_t *w0 = w + (long)n * K;
                __m256i c0 = _mm256_setzero_si256();
                for (int k = 0; k < K; k += 16) MAC(c0, LDA(a0 + k), LDW(w0 + k));
                y[(long)m * N + n] = hsum(c0);
            }
        }
    }
#else
    for (int m = 0; m < M; m++)
        for (int n = n0; n < n1; n++) {
            const int16_t *ar = a16 + (long)m * K;
            const int8_t *wr = w + (long)n * K;
            int32_t s = 0;
            for (int k = 0; k < K; k++) s += (int32_t)ar[k] * (int32_t)wr[k];
            y[(long)m * N + n] = s;
        }
#endif
}

int w8a8_simd(void) {
#ifdef __AVX2__
    return 1;
#else
    return 0;
#endif
}

typedef struct {
    const int16_t *a;
    const int8_t *w;
    int32_t *y;
    int M, K, N, n0, n1;
} job;

static void *job_run(void *p) {
    job *j = (job *)p;
    gemm_cols(j->a, j->M, j->K, j->w, j->N, j->y, j->n0, j->n1);
    return NULL;
}

/* y [M, N] int32 = a [M, K] int8 . w [N, K]^T int8 over `threads` threads; -1 when K is not a multiple of 32. */
int w8a8_gemm(const int8_t *a8, int M, int K, const int8_t *w, int N, int32_t *y, int threads) {
    if (K % 32) return -1;
    int16_t *a = (int16_t *)malloc((size_t)M * K * sizeof(int16_t));
    if (!a) return -2;
    for (long i = 0; i < (long)M * K; i++) a[i] = a8[i];
    if (threads > 16) threads = 16;
    if (threads < 1) threads = 1;
    job jobs[16];
    pthread_t tid[16];
    int started[16] = {0};
    for (int t = 0; t < threads; t++) {
        /* column ranges on NB boundaries, so the blocks (and every result) are the same for any thread count */
        int blocks = (N + NB - 1) / NB;
        int b0 = (int)((long)blocks * t / threads), b1 = (int)((long)blocks * (t + 1) / threads);
        int n0 = b0 * NB, n1 = b1 * NB < N ? b1 * NB : N;
        jobs[t] = (job){a, w, y, M, K, N, n0, n1};
        if (t > 0) started[t] = pthread_create(&tid[t], NULL, job_run, &jobs[t]) == 0;
    }
    for (int t = 1; t < threads; t++)
        if (!started[t]) job_run(&jobs[t]);
    job_run(&jobs[0]);
    for (int t = 1; t < threads; t++)
        if (started[t]) pthread_join(tid[t], NULL);
    free(a);
    return 0;
}
