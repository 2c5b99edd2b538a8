/* Fused error metrics of two equal-length arrays: one pass computes every sum, count and peak that
 * aligner.compare.metrics reports, instead of the ~15 numpy passes the same metrics cost otherwise.
 *
 * Called through ctypes (aligner/compare/kernel.py), which releases the GIL for the call. Totals carry over
 * between calls, so a tensor can be fed in chunks. Elementwise arithmetic is done in the input type, as
 * torch.isclose does (|a - b| <= atol + rtol * |b| in float32 for float32 tensors); sums are kept in double.
 *
 * Each block of BLOCK elements is first folded by a branch-free loop the compiler vectorizes. If its sums come
 * out non-finite (a NaN or Inf in the block, or a difference that overflows), the block is discarded and
 * re-run element by element, counting NaN/Inf per side and comparing only positions finite on both sides.
 */
#include <Python.h>
#include <float.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>

#define BLOCK 2048

typedef struct {
    double saa, sbb, sab, sdd, sum_abs, max_abs, max_rel;
    int64_t offset, count, mismatched, max_abs_at, nan_a, nan_b, inf_a, inf_b;
} Totals;

/* Compile the vectorized loops for AVX-512 and AVX2 too; the loader picks the best one the CPU has. */
#if defined(__x86_64__) && defined(__linux__) && defined(__GNUC__) && !defined(__clang__)
#define CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define CLONES
#endif

/* Non-negative floats order like their bit patterns as unsigned integers, and integer max reductions
 * vectorize where floating-point ones (with their NaN rules) do not. */
#define DEFINE_KERNEL(SUFFIX, T, UINT, FABS)                                                                  \
    static inline UINT bits_##SUFFIX(T x) { UINT u; memcpy(&u, &x, sizeof u); return u; }                   \
    static inline T value_##SUFFIX(UINT u) { T x; memcpy(&x, &u, sizeof x); return x; }                       \
                                                                                                              \
    /* Peak |a - b| of a block that is new to the totals: record it and its first position. */               \
    static void new_peak_##SUFFIX(const T *a, const T *b, int64_t n, T peak, Totals *t)                       \
    {                                                                                                         \
        t->max_abs = peak;                                                                                    \
        for (int64_t i = 0; i < n; i++) {                                                                     \
            T d = a[i] - b[i];                                                                                \
            if (FABS(d) == peak) { t->max_abs_at = t->offset + i; return; }                                   \
        }                                                                                                     \
    }                                                                                                         \
                                                                                                              \
    CLONES static int finite_block_##SUFFIX(const T *a, const T *b, int64_t n, T rtol, T atol, Totals *t)     \
    {                                                                                                         \
        double saa = 0, sbb = 0, sab = 0, sdd = 0, sum_abs = 0;                                               \
        int64_t mismatched = 0;                                                                               \
        UINT peak = 0, rel = 0;                                                                               \
        for (int64_t i = 0; i < n; i++) {                                                                     \
            T x = a[i], y = b[i], d = x - y, ad = FABS(d), ay = FABS(y);                                      \
            double xd = x, yd = y, dd = d;                                                                    \
            saa += xd * xd; sbb += yd * yd; sab += xd * yd; sdd += dd * dd; sum_abs += (double)ad;            \
            mismatched += ad > atol + rtol * ay;                                                              \
            UINT pb = bits_##SUFFIX(ad);                                                                      \
            peak = pb > peak ? pb : peak;                                                                     \
            /* x/0 = inf counts, 0/0 (both zero) does not; a mask, not a branch, keeps the loop vectorized */  \
            UINT qb = bits_##SUFFIX(ad / ay) & -(UINT)(ad > 0);                                               \
            rel = qb > rel ? qb : rel;                                                                        \
        }                                                                                                     \
        if (!isfinite(saa + sbb + sdd + sum_abs)) return 0;                                                   \
        t->saa += saa; t->sbb += sbb; t->sab += sab; t->sdd += sdd; t->sum_abs += sum_abs;                    \
        t->count += n; t->mismatched += mismatched;                                                           \
        if (value_##SUFFIX(peak) > t->max_abs) new_peak_##SUFFIX(a, b, n, value_##SUFFIX(peak), t);           \
        if (value_##SUFFIX(rel) > t->max_rel) t->max_rel = value_##SUFFIX(rel);                               \
        return 1;                                                                                             \
    }                                                                                                         \
                                                                                                              \
    static void exact_block_##SUFFIX(const T *a, const T *b, int64_t n, T rtol, T atol, Totals *t)            \
    {                                                                                                         \
        for (int64_t i = 0; i < n; i++) {                                                                     \
            T x = a[i], y = b[i];                                                                             \
            int nan_x = isnan(x), nan_y = isnan(y), fin_x = isfinite(x), fin_y = isfinite(y);                 \
            t->nan_a += nan_x; t->nan_b += nan_y;                                                             \
            t->inf_a += !fin_x && !nan_x; t->inf_b += !fin_y && !nan_y;                                       \
            if (!(fin_x && fin_y)) {                                                                          \
                t->mismatched += !((nan_x && nan_y) || x == y); /* same NaN or same signed Inf agree */        \
                continue;                                                                                     \
            }                                                                                                 \
            T d = x - y, ad = FABS(d), ay = FABS(y);                                                          \
            double xd = x, yd = y, dd = d;                                                                    \
            t->saa += xd * xd; t->sbb += yd * yd; t->sab += xd * yd; t->sdd += dd * dd;                       \
            t->sum_abs += (double)ad; t->count += 1;                                                          \
            t->mismatched += ad > atol + rtol * ay;                                                           \
            if (ad > t->max_abs) { t->max_abs = ad; t->max_abs_at = t->offset + i; }                          \
            if (ad > 0 && ad / ay > t->max_rel) t->max_rel = ad / ay;                                         \
        }                                                                                                     \
    }                                                                                                         \
                                                                                                              \
    void aligner_accumulate_##SUFFIX(const T *a, const T *b, int64_t n, double rtol, double atol, Totals *t)  \
    {                                                                                                         \
        for (int64_t start = 0; start < n; start += BLOCK) {                                                  \
            int64_t len = n - start < BLOCK ? n - start : BLOCK;                                              \
            if (!finite_block_##SUFFIX(a + start, b + start, len, (T)rtol, (T)atol, t))                       \
                exact_block_##SUFFIX(a + start, b + start, len, (T)rtol, (T)atol, t);                         \
            t->offset += len;                                                                                 \
        }                                                                                                     \
    }

DEFINE_KERNEL(f32, float, uint32_t, fabsf)
DEFINE_KERNEL(f64, double, uint64_t, fabs)

/* Summary statistics of one array (what stats-only dumps record, aligner.metrics.stats.fast_stats): one pass
 * instead of a reduction per statistic. Extrema and sums over the finite elements, counts over all of them:
 * NaN, Inf, exact zeros, |v| <= near_zero, |v| >= near_one, |v| < tiny (thresholds compared in the array's type).
 *
 * Each block is folded by LANES independent accumulators (extrema in the array's type, sums in double, counts in
 * 32 bits), so the loop vectorizes with no reassociation of one running sum. A block whose sums come out
 * non-finite holds a NaN or Inf: it is re-run element by element. Large arrays are cut into one contiguous part
 * per thread (the caller's thread runs the first); parts merge exactly, sums up to their order. */
#define LANES 16

typedef struct {
    double lo, hi, sum, squares;
    int64_t nan, inf, zeros, near_zero, near_one, tiny;
} Stats;

typedef struct {
    const void *x;
    int64_t n;
    double near_zero, near_one, tiny;
    Stats stats;
    int (*fold)(const void *, int64_t, double, double, double, Stats *);
} StatsPart;

#define FOLD_LANE(T, FABS, VALUE, J)                                                                          \
    do {                                                                                                      \
        T v = (VALUE), a = FABS(v);                                                                           \
        double d = v;                                                                                         \
        sum[J] += d; sq[J] += d * d;                                                                          \
        lo[J] = v < lo[J] ? v : lo[J]; hi[J] = v > hi[J] ? v : hi[J];                                         \
        zeros[J] += v == 0; near_zero[J] += a <= nz; near_one[J] += a >= no; below[J] += a < tiny;            \
    } while (0)

#define DEFINE_STATS(SUFFIX, T, FABS, BIG)                                                                    \
    CLONES static int finite_stats_##SUFFIX(const T *x, int64_t n, T nz, T no, T tiny, Stats *s)              \
    {                                                                                                         \
        T lo[LANES], hi[LANES];                                                                               \
        double sum[LANES], sq[LANES];                                                                         \
        int32_t zeros[LANES], near_zero[LANES], near_one[LANES], below[LANES];                               \
        for (int j = 0; j < LANES; j++) {                                                                     \
            lo[j] = BIG; hi[j] = -BIG; sum[j] = sq[j] = 0;                                                    \
            zeros[j] = near_zero[j] = near_one[j] = below[j] = 0;                                             \
        }                                                                                                     \
        int64_t whole = n - n % LANES;                                                                        \
        for (int64_t i = 0; i < whole; i += LANES)                                                            \
            for (int j = 0; j < LANES; j++) FOLD_LANE(T, FABS, x[i + j], j);                                  \
        for (int64_t i = whole; i < n; i++) FOLD_LANE(T, FABS, x[i], 0); /* the tail, into lane 0 */          \
        double total = 0, squares = 0;                                                                        \
        for (int j = 0; j < LANES; j++) { total += sum[j]; squares += sq[j]; }                                \
        if (!isfinite(total + squares)) return 0;                                                             \
        for (int j = 0; j < LANES; j++) {                                                                     \
            if (lo[j] < s->lo) s->lo = lo[j];                                                                 \
            if (hi[j] > s->hi) s->hi = hi[j];                                                                 \
            s->zeros += zeros[j]; s->near_zero += near_zero[j]; s->near_one += near_one[j];                   \
            s->tiny += below[j];                                                                              \
        }                                                                                                     \
        s->sum += total; s->squares += squares;                                                               \
        return 1;                                                                                             \
    }                                                                                                         \
                                                                                                              \
    static void exact_stats_##SUFFIX(const T *x, int64_t n, T nz, T no, T tiny, Stats *s)                     \
    {                                                                                                         \
        for (int64_t i = 0; i < n; i++) {                                                                     \
            T v = x[i], a = FABS(v);                                                                          \
            if (isnan(v)) { s->nan++; continue; } /* every comparison of a NaN is false */                    \
            s->near_zero += a <= nz; s->near_one += a >= no; s->tiny += a < tiny;                             \
            if (isinf(v)) { s->inf++; continue; }                                                             \
            double d = v;                                                                                     \
            s->sum += d; s->squares += d * d; s->zeros += v == 0;                                             \
            if (v < s->lo) s->lo = v;                                                                         \
            if (v > s->hi) s->hi = v;                                                                         \
        }                                                                                                     \
    }                                                                                                         \
                                                                                                              \
    static int fold_##SUFFIX(const void *data, int64_t n, double nz, double no, double tiny, Stats *s)        \
    {                                                                                                         \
        const T *x = data;                                                                                    \
        for (int64_t start = 0; start < n; start += BLOCK) {                                                  \
            int64_t len = n - start < BLOCK ? n - start : BLOCK;                                              \
            if (!finite_stats_##SUFFIX(x + start, len, (T)nz, (T)no, (T)tiny, s))                             \
                exact_stats_##SUFFIX(x + start, len, (T)nz, (T)no, (T)tiny, s);                               \
        }                                                                                                     \
        return 0;                                                                                             \
    }                                                                                                         \
                                                                                                              \
    void aligner_stats_##SUFFIX(const T *x, int64_t n, double nz, double no, double tiny, int threads,        \
                                Stats *s)                                                                     \
    {                                                                                                         \
        fold_parts(x, sizeof(T), n, nz, no, tiny, threads, fold_##SUFFIX, s);                                 \
    }

static void *run_part(void *arg)
{
    StatsPart *p = arg;
    p->fold(p->x, p->n, p->near_zero, p->near_one, p->tiny, &p->stats);
    return NULL;
}

#define MAX_THREADS 16

/* Fold `n` elements in up to `threads` contiguous parts of whole blocks, one thread each, into `s`. */
static void fold_parts(const void *x, size_t size, int64_t n, double nz, double no, double tiny, int threads,
                       int (*fold)(const void *, int64_t, double, double, double, Stats *), Stats *s)
{
    int64_t blocks = (n + BLOCK - 1) / BLOCK;
    if (threads > MAX_THREADS) threads = MAX_THREADS;
    if (threads > blocks) threads = (int)blocks;
    if (threads < 1) threads = 1;
    StatsPart parts[MAX_THREADS];
    pthread_t ids[MAX_THREADS];
    int started[MAX_THREADS] = {0};
    int64_t start = 0;
    for (int k = 0; k < threads; k++) {
        int64_t len = (blocks * (k + 1) / threads) * BLOCK - start;
        if (start + len > n) len = n - start;
        parts[k] = (StatsPart){(const char *)x + start * (int64_t)size, len, nz, no, tiny,
                               {INFINITY, -INFINITY, 0, 0, 0, 0, 0, 0, 0, 0}, fold};
        start += len;
    }
    for (int k = 1; k < threads; k++) started[k] = pthread_create(&ids[k], NULL, run_part, &parts[k]) == 0;
    run_part(&parts[0]);
    for (int k = 1; k < threads; k++) {
        if (started[k]) pthread_join(ids[k], NULL);
        else run_part(&parts[k]); /* no thread to be had: this one folds the part itself */
    }
    for (int k = 0; k < threads; k++) {
        Stats *p = &parts[k].stats;
        if (p->lo < s->lo) s->lo = p->lo;
        if (p->hi > s->hi) s->hi = p->hi;
        s->sum += p->sum; s->squares += p->squares; s->nan += p->nan; s->inf += p->inf; s->zeros += p->zeros;
        s->near_zero += p->near_zero; s->near_one += p->near_one; s->tiny += p->tiny;
    }
}

DEFINE_STATS(f32, float, fabsf, FLT_MAX)
DEFINE_STATS(f64, double, fabs, DBL_MAX)

/* An importable module, so that Python's import system finds this shared library wherever it was installed. */
static struct PyModuleDef kernel_module = {PyModuleDef_HEAD_INIT, "_kernel",
                                           "Fused metric and statistics kernels, called through ctypes.", -1, NULL};

PyMODINIT_FUNC PyInit__kernel(void) { return PyModule_Create(&kernel_module); }
