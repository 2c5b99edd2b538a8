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
#include <math.h>
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

/* An importable module, so that Python's import system finds this shared library wherever it was installed. */
static struct PyModuleDef kernel_module = {PyModuleDef_HEAD_INIT, "_kernel",
                                           "Fused metric kernels, called through ctypes.", -1, NULL};

PyMODINIT_FUNC PyInit__kernel(void) { return PyModule_Create(&kernel_module); }
