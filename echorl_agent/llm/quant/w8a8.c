/* int8 x int8 -> int32 products for the engine's W8A8 prefill (echorl_agent/llm/quant/w8a8.py).
 *
 * y[m][n] = sum_k a[m][k] * w[n][k] for int8 activations a [M, K] and weights w [N, K] in -127..127, K even. The
 * integer sums are exact, so every result equals torch._int_mm(a, w.T) bit for bit, whatever the blocking or the
 * thread count. On the AVX2 EPYC hosts torch 2.13's CPU _int_mm does not reach oneDNN and is ~50x slower than a
 * float32 GEMM, hence this file.
 *
 * Layout: the weight is packed once (w8a8.py's pack_weight) in panels of NR = 16 outputs, each panel [K/2][16][2]
 * bytes: for the pair of inputs (2j, 2j+1), the 16 outputs' two weights side by side. The activations are widened to
 * int16 (rows padded with zeros to a multiple of MR = 6).
 *
 * AVX2 micro-kernel (6 rows x 16 outputs, 12 int32 accumulators): per pair of inputs, the panel's 32 bytes are
 * widened to int16 (2 x vpmovsxbw), each row's pair (a[2j], a[2j+1]) is broadcast as one 32-bit word, and vpmaddwd
 * multiplies it with 8 outputs' pairs and sums each pair into an int32 lane (|a w| <= 127^2: no saturation). No
 * horizontal sums: each lane is one output. 12 vpmaddwd per 192 products, against 24 FMAs for the same float32
 * work; measured ~1.6-2x float32 (F.linear) on an AVX2 EPYC, where the earlier row-by-row form was ~1.3x.
 *
 * w8a8_linear fuses the rest of W8A8Linear.forward around the product, reproducing torch's float32 operations in
 * the same order (so the fused and the torch paths give identical floats): t = x * inv_s; per row amax = max|t|,
 * scale = amax / 127, codes = clamp(round_half_even(t * (127 / amax)), -127, 127) (amax = 0: codes and scale 0);
 * y = ((float)acc * scale_m) * w_scale_n (+ bias_n). Compile with -ffp-contract=off.
 */
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#ifdef __AVX2__
#include <immintrin.h>
#endif

#define MR 6
#define NR 16
#define MB 96 /* rows per block: 96 x K int16 activations stay in L2 while the panels pass by */

/* c[MR][NR] = a [MR rows, stride K] . panel */
static void micro(const int16_t *a, int K, const int8_t *wp, int32_t *c) {
#ifdef __AVX2__
    __m256i c00 = _mm256_setzero_si256(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00;
    __m256i c30 = c00, c31 = c00, c40 = c00, c41 = c00, c50 = c00, c51 = c00;
    const int32_t *a0 = (const int32_t *)a, *a1 = (const int32_t *)(a + K), *a2 = (const int32_t *)(a + 2 * K);
    const int32_t *a3 = (const int32_t *)(a + 3 * K), *a4 = (const int32_t *)(a + 4 * K);
    const int32_t *a5 = (const int32_t *)(a + 5 * K);
#define MAC2(r, row)                                                                                                  \
    x = _mm256_set1_epi32(row[j]);                                                                                    \
    c##r##0 = _mm256_add_epi32(c##r##0, _mm256_madd_epi16(x, w0));                                                   \
    c##r##1 = _mm256_add_epi32(c##r##1, _mm256_madd_epi16(x, w1));
    for (int j = 0; j < K / 2; j++) {
        __m256i w0 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(wp + 32 * j)));
        __m256i w1 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(wp + 32 * j + 16)));
        __m256i x;
        MAC2(0, a0) MAC2(1, a1) MAC2(2, a2) MAC2(3, a3) MAC2(4, a4) MAC2(5, a5)
    }
#undef MAC2
    __m256i *o = (__m256i *)c;
    _mm256_storeu_si256(o + 0, c00); _mm256_storeu_si256(o + 1, c01);
    _mm256_storeu_si256(o + 2, c10); _mm256_storeu_si256(o + 3, c11);
    _mm256_storeu_si256(o + 4, c20); _mm256_storeu_si256(o + 5, c21);
    _mm256_storeu_si256(o + 6, c30); _mm256_storeu_si256(o + 7, c31);
    _mm256_storeu_si256(o + 8, c40); _mm256_storeu_si256(o + 9, c41);
    _mm256_storeu_si256(o + 10, c50); _mm256_storeu_si256(o + 11, c51);
#else
    for (int r = 0; r < MR; r++)
        for (int n = 0; n < NR; n++) {
            int32_t s = 0;
            for (int j = 0; j < K / 2; j++)
                s += (int32_t)a[(long)r * K + 2 * j] * wp[32 * j + 2 * n] +
                     (int32_t)a[(long)r * K + 2 * j + 1] * wp[32 * j + 2 * n + 1];
            c[r * NR + n] = s;
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

/* y[n] = ((float)c[n] * s) * ws[n] (+ bias[n]) for n < nn, in this order (torch's float32 operations) */
static void epilogue(const int32_t *c, int nn, float s, const float *ws, const float *bias, float *y) {
    int n = 0;
#ifdef __AVX2__
    __m256 vs = _mm256_set1_ps(s);
    for (; n + 8 <= nn; n += 8) {
        __m256 v = _mm256_mul_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_loadu_si256((const __m256i *)(c + n))), vs),
                                 _mm256_loadu_ps(ws + n));
        if (bias) v = _mm256_add_ps(v, _mm256_loadu_ps(bias + n));
        _mm256_storeu_ps(y + n, v);
    }
#endif
    for (; n < nn; n++) {
        float v = ((float)c[n] * s) * ws[n];
        y[n] = bias ? v + bias[n] : v;
    }
}

/* one row: t = x * inv_s, its scale amax / 127 (returned) and codes round(t * 127 / amax) clamped to -127..127 */
static float quantize_row(const float *x, const float *inv_s, int K, float *t, int16_t *codes) {
    float amax = 0.0f;
    int k = 0;
#ifdef __AVX2__
    __m256 vmax = _mm256_setzero_ps(), sign = _mm256_set1_ps(-0.0f);
    for (; k + 8 <= K; k += 8) {
        __m256 v = _mm256_mul_ps(_mm256_loadu_ps(x + k), _mm256_loadu_ps(inv_s + k));
        _mm256_storeu_ps(t + k, v);
        vmax = _mm256_max_ps(vmax, _mm256_andnot_ps(sign, v));
    }
    float lanes[8];
    _mm256_storeu_ps(lanes, vmax);
    for (int i = 0; i < 8; i++) amax = lanes[i] > amax ? lanes[i] : amax;
#endif
    for (; k < K; k++) {
        t[k] = x[k] * inv_s[k];
        float v = fabsf(t[k]);
        amax = v > amax ? v : amax;
    }
    float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
    k = 0;
#ifdef __AVX2__
    __m256 vinv = _mm256_set1_ps(inv), hi = _mm256_set1_ps(127.0f), lo = _mm256_set1_ps(-127.0f);
    for (; k + 16 <= K; k += 16) {
        __m256 q0 = _mm256_round_ps(_mm256_mul_ps(_mm256_loadu_ps(t + k), vinv), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        __m256 q1 = _mm256_round_ps(_mm256_mul_ps(_mm256_loadu_ps(t + k + 8), vinv), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        __m256i i0 = _mm256_cvtps_epi32(_mm256_min_ps(_mm256_max_ps(q0, lo), hi));
        __m256i i1 = _mm256_cvtps_epi32(_mm256_min_ps(_mm256_max_ps(q1, lo), hi));
        /* packs interleaves 128-bit lanes: restore the order */
        __m256i p = _mm256_permute4x64_epi64(_mm256_packs_epi32(i0, i1), 0xd8);
        _mm256_storeu_si256((__m256i *)(codes + k), p);
    }
#endif
    for (; k < K; k++) {
        float q = nearbyintf(t[k] * inv); /* round half to even, as torch.round */
        codes[k] = (int16_t)(q > 127.0f ? 127.0f : (q < -127.0f ? -127.0f : q));
    }
    return amax / 127.0f;
}

typedef struct {
    const int16_t *a; /* [Mp, K] int16, Mp a multiple of MR */
    const int8_t *wp;
    int M, K, N, p0, p1; /* panels p0..p1-1 */
    int32_t *yi;         /* int32 output [M, N], or NULL */
    float *yf;           /* float output [M, N] (w8a8_linear), or NULL */
    const float *xs, *ws, *bias;
} job;

static void *job_run(void *arg) {
    const job *j = (const job *)arg;
    int32_t c[MR * NR];
    int Mp = (j->M + MR - 1) / MR * MR;
    for (int mb = 0; mb < Mp; mb += MB) {
        int me = mb + MB < Mp ? mb + MB : Mp;
        for (int p = j->p0; p < j->p1; p++) {
            const int8_t *w = j->wp + (long)p * j->K * NR;
            int n0 = p * NR, nn = j->N - n0 < NR ? j->N - n0 : NR;
            for (int m = mb; m < me; m += MR) {
                micro(j->a + (long)m * j->K, j->K, w, c);
                for (int r = 0; r < MR && m + r < j->M; r++) {
                    long off = (long)(m + r) * j->N + n0;
                    if (j->yi) {
                        memcpy(j->yi + off, c + r * NR, (size_t)nn * sizeof(int32_t));
                    } else {
                        epilogue(c + r * NR, nn, j->xs[m + r], j->ws + n0, j->bias ? j->bias + n0 : NULL, j->yf + off);
                    }
                }
            }
        }
    }
    return NULL;
}

/* run the panels over `threads` threads (each thread its own outputs) */
static void run(job base, int threads) {
    int panels = (base.N + NR - 1) / NR;
    if (threads > 16) threads = 16;
    if (threads > panels) threads = panels;
    if (threads < 1) threads = 1;
    job jobs[16];
    pthread_t tid[16];
    int started[16] = {0};
    for (int t = 0; t < threads; t++) {
        jobs[t] = base;
        jobs[t].p0 = (int)((long)panels * t / threads);
        jobs[t].p1 = (int)((long)panels * (t + 1) / threads);
        if (t > 0) started[t] = pthread_create(&tid[t], NULL, job_run, &jobs[t]) == 0;
    }
    for (int t = 1; t < threads; t++)
        if (!started[t]) job_run(&jobs[t]);
    job_run(&jobs[0]);
    for (int t = 1; t < threads; t++)
        if (started[t]) pthread_join(tid[t], NULL);
}

static int16_t *padded_rows(int M, int K) {
    int Mp = (M + MR - 1) / MR * MR;
    int16_t *a = (int16_t *)malloc((size_t)(Mp > 0 ? Mp : 1) * (K > 0 ? K : 1) * sizeof(int16_t)); /* M = 0: no rows */
    if (a && Mp > M) memset(a + (long)M * K, 0, (size_t)(Mp - M) * K * sizeof(int16_t));
    return a;
}

/* y [M, N] int32 = a [M, K] int8 . w^T with w packed (pack_weight); -1 when K is odd, -2 out of memory. */
int w8a8_gemm_packed(const int8_t *a8, int M, int K, const int8_t *wp, int N, int32_t *y, int threads) {
    if (K % 2) return -1;
    int16_t *a = padded_rows(M, K);
    if (!a) return -2;
    for (long i = 0; i < (long)M * K; i++) a[i] = a8[i];
    job base = {a, wp, M, K, N, 0, 0, y, NULL, NULL, NULL, NULL};
    run(base, threads);
    free(a);
    return 0;
}

/* y [M, N] float = W8A8Linear.forward of float x [M, K] (see the header): inv_s [K], w_scale [N], bias [N] or NULL.
 * -1 when K is odd, -2 out of memory. */
int w8a8_linear(const float *x, int M, int K, const float *inv_s, const int8_t *wp, int N, const float *w_scale,
                const float *bias, float *y, int threads) {
    if (K % 2) return -1;
    int16_t *a = padded_rows(M, K);
    float *t = (float *)malloc((size_t)(K > 0 ? K : 1) * sizeof(float));
    float *xs = (float *)malloc((size_t)(M > 0 ? M : 1) * sizeof(float));
    if (!a || !t || !xs) {
        free(a); free(t); free(xs);
        return -2;
    }
    for (int m = 0; m < M; m++) xs[m] = quantize_row(x + (long)m * K, inv_s, K, t, a + (long)m * K);
    job base = {a, wp, M, K, N, 0, 0, NULL, y, xs, w_scale, bias};
    run(base, threads);
    free(a); free(t); free(xs);
    return 0;
}
