/* Fused error metrics of two equal-length arrays: one pass computes every sum, count and peak that
 * aligner.compare.metrics reports, instead of the ~15 numpy passes the same metrics cost otherwise.
 *
 * Called through ctypes (aligner/metrics/kernel.py), which releases the GIL for the call. Totals carry over
 * between calls, so a tensor can be fed in chunks. One array's statistics and content digest (`summary`, `digest`,
 * at the end) are module functions instead, called once per dumped tensor. Elementwise arithmetic is done in the
 * input type, as torch.isclose does (|a - b| <= atol + rtol * |b| in float32 for float32 tensors); sums are kept in
 * double.
 *
 * Each block of BLOCK elements is first folded by a branch-free loop over independent lanes, which the compiler
 * vectorizes. If its sums come out non-finite (a NaN or Inf in the block, or a difference that overflows), the
 * block is discarded and re-run element by element, counting NaN/Inf per side and comparing only positions finite
 * on both sides. Large files are folded straight from their mapped pages (aligner_accumulate_mapped).
 */
#include <Python.h>
#include <float.h>
#include <math.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define BLOCK 2048

typedef struct {
    double saa, sbb, sab, sdd, sum_abs, max_abs, max_rel;
    int64_t offset, count, mismatched, max_abs_at, nan_a, nan_b, inf_a, inf_b;
} Totals;

/* Compile the vectorized loops for AVX-512 and AVX2 too; the loader picks the best one the CPU has. */
#if defined(__x86_64__) && defined(__linux__) && defined(__GNUC__) && !defined(__clang__)
#define CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#define MULTIVERSION 1
#else
#define CLONES
#define MULTIVERSION 0
#endif

#define MUL_ADD(x, y, acc) ((acc) + (x) * (y))
#define FUSED(x, y, acc) __builtin_fma((x), (y), (acc))

/* One element into lane J of the block's accumulators: sums in double, counts in 32 bits, peaks as bit patterns
 * (non-negative floats order like their bit patterns as unsigned integers, and integer max reductions vectorize
 * where floating-point ones, with their NaN rules, do not). */
#define PAIR_LANE(SUFFIX, T, UINT, FABS, MULADD, J, X, Y)                                                     \
    do {                                                                                                      \
        T x = (X), y = (Y), d = x - y, ad = FABS(d), ay = FABS(y);                                            \
        double xd = x, yd = y, dd = d;                                                                        \
        saa[J] = MULADD(xd, xd, saa[J]); sbb[J] = MULADD(yd, yd, sbb[J]); sab[J] = MULADD(xd, yd, sab[J]);   \
        sdd[J] = MULADD(dd, dd, sdd[J]); sum_abs[J] += fabs(dd);                                              \
        mismatched[J] += ad > atol + rtol * ay;                                                               \
        UINT pb = bits_##SUFFIX(ad);                                                                          \
        peak[J] = pb > peak[J] ? pb : peak[J];                                                                \
        /* x/0 = inf counts, 0/0 (both zero) does not; a mask, not a branch, keeps the loop vectorized */      \
        UINT qb = bits_##SUFFIX(ad / ay) & -(UINT)(ad > 0);                                                   \
        rel[J] = qb > rel[J] ? qb : rel[J];                                                                   \
    } while (0)

/* A block folded by L independent lanes (the tail into lane 0), so that the loop vectorizes with no reduction of
 * one running sum; 0, totals untouched, when its sums come out non-finite. Built once per instruction set
 * (ATTR), with L lanes filling its registers. */
#define DEFINE_FINITE(NAME, ATTR, L, SUFFIX, T, UINT, FABS, MULADD)                                           \
    ATTR static int NAME(const T *a, const T *b, int64_t n, T rtol, T atol, Totals *t)                        \
    {                                                                                                         \
        double saa[L] = {0}, sbb[L] = {0}, sab[L] = {0}, sdd[L] = {0}, sum_abs[L] = {0};                      \
        int32_t mismatched[L] = {0};                                                                          \
        UINT peak[L] = {0}, rel[L] = {0};                                                                     \
        int64_t whole = n - n % L;                                                                            \
        for (int64_t i = 0; i < whole; i += L)                                                                \
            for (int j = 0; j < L; j++) PAIR_LANE(SUFFIX, T, UINT, FABS, MULADD, j, a[i + j], b[i + j]);      \
        for (int64_t i = whole; i < n; i++) PAIR_LANE(SUFFIX, T, UINT, FABS, MULADD, 0, a[i], b[i]);          \
        double s_aa = 0, s_bb = 0, s_ab = 0, s_dd = 0, s_abs = 0;                                             \
        int64_t count = 0;                                                                                    \
        UINT top = 0, top_rel = 0;                                                                            \
        for (int j = 0; j < L; j++) {                                                                         \
            s_aa += saa[j]; s_bb += sbb[j]; s_ab += sab[j]; s_dd += sdd[j]; s_abs += sum_abs[j];              \
            count += mismatched[j];                                                                           \
            top = peak[j] > top ? peak[j] : top;                                                              \
            top_rel = rel[j] > top_rel ? rel[j] : top_rel;                                                    \
        }                                                                                                     \
        if (!isfinite(s_aa + s_bb + s_dd + s_abs)) return 0;                                                  \
        t->saa += s_aa; t->sbb += s_bb; t->sab += s_ab; t->sdd += s_dd; t->sum_abs += s_abs;                  \
        t->count += n; t->mismatched += count;                                                                \
        if (value_##SUFFIX(top) > t->max_abs) new_peak_##SUFFIX(a, b, n, value_##SUFFIX(top), t);             \
        if (value_##SUFFIX(top_rel) > t->max_rel) t->max_rel = value_##SUFFIX(top_rel);                       \
        return 1;                                                                                             \
    }

#if MULTIVERSION
#define TARGET_AVX512 __attribute__((target("avx512f,avx512vl,avx512bw,avx512dq,fma")))
#define TARGET_AVX2 __attribute__((target("avx2,fma")))
/* The fold for this CPU, chosen once: AVX-512 (16 lanes), AVX2 (8), else the baseline (8). FAST: how the AVX
 * builds add a product to a sum (FUSED for float32, whose products are exact in double, so one rounding either
 * way: the same sums, in fewer instructions; float64 keeps the separate multiply and add). */
#define DEFINE_FOLDS(SUFFIX, T, UINT, FABS, FAST)                                                             \
    DEFINE_FINITE(finite_avx512_##SUFFIX, TARGET_AVX512, 16, SUFFIX, T, UINT, FABS, FAST)                     \
    DEFINE_FINITE(finite_avx2_##SUFFIX, TARGET_AVX2, 8, SUFFIX, T, UINT, FABS, FAST)                          \
    DEFINE_FINITE(finite_base_##SUFFIX, , 8, SUFFIX, T, UINT, FABS, MUL_ADD)                                  \
    static int finite_block_##SUFFIX(const T *a, const T *b, int64_t n, T rtol, T atol, Totals *t)            \
    {                                                                                                         \
        static int (*const folds[])(const T *, const T *, int64_t, T, T, Totals *) = {                        \
            finite_base_##SUFFIX, finite_avx2_##SUFFIX, finite_avx512_##SUFFIX};                              \
        return folds[instruction_set()](a, b, n, rtol, atol, t);                                              \
    }

static pthread_once_t isa_once = PTHREAD_ONCE_INIT;
static int isa_found; /* 0: baseline, 1: AVX2 with FMA, 2: AVX-512 (F, VL, BW, DQ) with FMA */

static void find_instruction_set(void)
{
    __builtin_cpu_init();
    int avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    int avx512 = avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl")
                 && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq");
    isa_found = avx512 ? 2 : avx2;
}

static int instruction_set(void)
{
    pthread_once(&isa_once, find_instruction_set);
    return isa_found;
}
#else
#define DEFINE_FOLDS(SUFFIX, T, UINT, FABS, FAST)                                                             \
    DEFINE_FINITE(finite_block_##SUFFIX, , 8, SUFFIX, T, UINT, FABS, MUL_ADD)
#endif

#define DEFINE_KERNEL(SUFFIX, T, UINT, FABS, FAST)                                                            \
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
    DEFINE_FOLDS(SUFFIX, T, UINT, FABS, FAST)                                                                 \
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

DEFINE_KERNEL(f32, float, uint32_t, fabsf, FUSED)
DEFINE_KERNEL(f64, double, uint64_t, fabs, MUL_ADD)

/* The same totals read straight from two files' pages in the page cache (mapped, not copied into a buffer first:
 * reading large files through read() cost a copy as long as the kernel itself). A file cut short under a mapping
 * raises SIGBUS on the first page past its new end: while this thread folds a mapping, SIGBUS jumps back here and
 * the call reports the file as cut short; a SIGBUS anywhere else goes to the handler installed before this one
 * (Python's faulthandler, or the default: the process dies as it would have). */
/* In static TLS (initial-exec): the handler reads them on any thread, and a thread's first access to a dynamic TLS
 * block may allocate, which a signal handler must never do. */
#if defined(__GNUC__)
#define SIGNAL_SAFE_TLS __thread __attribute__((tls_model("initial-exec")))
#else
#define SIGNAL_SAFE_TLS __thread
#endif
static SIGNAL_SAFE_TLS sigjmp_buf *mapped_jump; /* set only while this thread reads its mappings */
static SIGNAL_SAFE_TLS void *mapped_fault;      /* the address that raised it */
static struct sigaction previous_bus;
static pthread_mutex_t bus_lock = PTHREAD_MUTEX_INITIALIZER;
static int bus_installed;

static void on_bus(int sig, siginfo_t *info, void *context)
{
    sigjmp_buf *jump = mapped_jump;
    if (jump) {
        mapped_fault = info->si_addr;
        siglongjmp(*jump, 1);
    }
    if (previous_bus.sa_flags & SA_SIGINFO) {
        previous_bus.sa_sigaction(sig, info, context);
    } else if (previous_bus.sa_handler != SIG_DFL && previous_bus.sa_handler != SIG_IGN) {
        previous_bus.sa_handler(sig);
    } else { /* the default action: a fault retried after return raises it again, with no handler left */
        signal(sig, SIG_DFL);
        raise(sig);
    }
}

static int bus_is_ours(const struct sigaction *current)
{
    return (current->sa_flags & SA_SIGINFO) && current->sa_sigaction == on_bus;
}

/* Put on_bus in front before each fold: a handler installed since the last one (a framework imported later, Python's
 * signal.signal, faulthandler enabled again) would otherwise see this fold's SIGBUS first and end the process; it
 * becomes the one other faults are handed to. One sigaction call when nothing changed. */
static void ensure_bus(void)
{
    struct sigaction current;
    if (sigaction(SIGBUS, NULL, &current) == 0 && bus_is_ours(&current)) return;
    pthread_mutex_lock(&bus_lock);
    if (sigaction(SIGBUS, NULL, &current) != 0) {
        bus_installed = 0;
    } else if (!bus_is_ours(&current)) {
        struct sigaction action;
        memset(&action, 0, sizeof action);
        action.sa_sigaction = on_bus;
        action.sa_flags = SA_SIGINFO | SA_ONSTACK;
        sigemptyset(&action.sa_mask);
        bus_installed = sigaction(SIGBUS, &action, &previous_bus) == 0;
    }
    pthread_mutex_unlock(&bus_lock);
}

/* `bytes` of file `fd` from byte `offset`, mapped read-only; `*base` the start of the mapping, `*length` its size. */
static const char *map_file(int fd, int64_t offset, int64_t bytes, void **base, size_t *length)
{
    int64_t page = sysconf(_SC_PAGESIZE), start = offset - offset % page;
    *length = (size_t)(offset - start + bytes);
    *base = mmap(NULL, *length, PROT_READ, MAP_SHARED, fd, (off_t)start);
    return *base == MAP_FAILED ? NULL : (const char *)*base + (offset - start);
}

static int too_short(int fd, int64_t end)
{
    struct stat st;
    return fstat(fd, &st) != 0 || st.st_size < end;
}

#define MAPPED_OK 0
#define MAPPED_SHORT_A 1 /* a file is shorter than the data it was listed with: cut short since */
#define MAPPED_SHORT_B 2
#define MAPPED_UNMAPPABLE 3 /* mmap refused (a file system without it): the caller reads the files instead */

/* Fold `n` elements of type `size` (4: float32, 8: float64) at byte `offset_a` of file `fd_a` and `offset_b` of
 * `fd_b` into `t`, as aligner_accumulate would; `t` is left as it was unless the call returns MAPPED_OK. */
int aligner_accumulate_mapped(int fd_a, int64_t offset_a, int fd_b, int64_t offset_b, int64_t n, int size,
                              double rtol, double atol, Totals *t)
{
    ensure_bus();
    if (!bus_installed || n <= 0 || (size != 4 && size != 8)) return MAPPED_UNMAPPABLE;
    void *base_a = MAP_FAILED, *base_b = MAP_FAILED;
    size_t length_a = 0, length_b = 0;
    const char *a = map_file(fd_a, offset_a, n * size, &base_a, &length_a);
    const char *b = a ? map_file(fd_b, offset_b, n * size, &base_b, &length_b) : NULL;
    volatile int status = MAPPED_UNMAPPABLE;
    if (a && b) {
        Totals work = *t;
        sigjmp_buf jump;
        if (sigsetjmp(jump, 1) == 0) {
            mapped_jump = &jump;
            if (size == 4) aligner_accumulate_f32((const float *)a, (const float *)b, n, rtol, atol, &work);
            else aligner_accumulate_f64((const double *)a, (const double *)b, n, rtol, atol, &work);
            mapped_jump = NULL;
            status = MAPPED_OK;
        } else { /* a page is gone: its file was cut */
            mapped_jump = NULL;
            status = -1;
        }
        /* which file is short now (a cut inside the last page reads zeros, not SIGBUS: only its size tells) */
        if (too_short(fd_a, offset_a + n * size)) {
            status = MAPPED_SHORT_A;
        } else if (too_short(fd_b, offset_b + n * size)) {
            status = MAPPED_SHORT_B;
        } else if (status == -1) { /* cut, then grown back: the faulting page names it */
            const char *fault = mapped_fault;
            int in_b = fault >= (const char *)base_b && fault < (const char *)base_b + length_b;
            status = in_b ? MAPPED_SHORT_B : MAPPED_SHORT_A;
        }
        if (status == MAPPED_OK) *t = work;
    }
    if (base_a != MAP_FAILED) munmap(base_a, length_a);
    if (base_b != MAP_FAILED) munmap(base_b, length_b);
    return status;
}

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

/* XXH3-128 (xxhash.h, vendored from xxHash 0.8.2, BSD-2-Clause), compiled into this module. */
#define XXH_INLINE_ALL
#include "xxhash.h"

/* XXH3-128 of `head` then `data`, the canonical (big-endian) 16 bytes: the name of a dumped tensor's file. */
static void content_digest(const Py_buffer *head, const Py_buffer *data, unsigned char out[16])
{
    XXH3_state_t state;
    XXH3_128bits_reset(&state);
    XXH3_128bits_update(&state, head->buf, (size_t)head->len);
    XXH3_128bits_update(&state, data->buf, (size_t)data->len);
    XXH128_canonical_t canonical;
    XXH128_canonicalFromHash(&canonical, XXH3_128bits_digest(&state));
    memcpy(out, canonical.digest, 16);
}

/* The elements stats and digest take in turn: a part that stays in cache between the two reads (a multiple of
 * BLOCK, so the statistics fold the same blocks in the same order as over the whole array). */
#define SUMMARY_PART (BLOCK * 8)

/* `aligner_stats_*` on one thread and `content_digest` of the same array, part by part: the digest reads each part
 * from cache right after the statistics, where two passes over an array larger than the cache read it from memory
 * twice. The same statistics and digest, bit for bit (the digest's state takes its input in any pieces). */
static void stats_and_digest(const char *x, int64_t n, Py_ssize_t size, double nz, double no, double tiny,
                             const Py_buffer *head, Stats *s, unsigned char out[16])
{
    XXH3_state_t state;
    XXH3_128bits_reset(&state);
    XXH3_128bits_update(&state, head->buf, (size_t)head->len);
    for (int64_t start = 0; start < n; start += SUMMARY_PART) {
        int64_t len = n - start < SUMMARY_PART ? n - start : SUMMARY_PART;
        const char *part = x + start * size;
        if (size == 4) fold_f32(part, len, nz, no, tiny, s);
        else fold_f64(part, len, nz, no, tiny, s);
        XXH3_128bits_update(&state, part, (size_t)(len * size));
    }
    XXH128_canonical_t canonical;
    XXH128_canonicalFromHash(&canonical, XXH3_128bits_digest(&state));
    memcpy(out, canonical.digest, 16);
}

/* digest(head, data) -> 16 bytes: XXH3-128 of two C-contiguous buffers, without the GIL. */
static PyObject *py_digest(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "digest(head, data) takes 2 arguments");
        return NULL;
    }
    Py_buffer head, data;
    if (PyObject_GetBuffer(args[0], &head, PyBUF_SIMPLE) < 0) return NULL;
    if (PyObject_GetBuffer(args[1], &data, PyBUF_C_CONTIGUOUS) < 0) {
        PyBuffer_Release(&head);
        return NULL;
    }
    unsigned char out[16];
    Py_BEGIN_ALLOW_THREADS
    content_digest(&head, &data, out);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&data);
    PyBuffer_Release(&head);
    return PyBytes_FromStringAndSize((const char *)out, 16);
}

/* summary(array, near_zero, near_one, tiny, threads, head) -> (lo, hi, sum, squares, nan, inf, zeros, near_zero,
 * near_one, tiny, digest): the statistics of a C-contiguous float32/float64 buffer in one pass on up to `threads`
 * threads and, where `head` is bytes (not None), `digest(head, array)` of the same memory while it is in cache; one
 * call without the GIL, where ctypes and a second hashing call cost ~10 us a tensor (most of a small one's). */
static PyObject *py_summary(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError, "summary(array, near_zero, near_one, tiny, threads, head) takes 6 arguments");
        return NULL;
    }
    double nz = PyFloat_AsDouble(args[1]), no = PyFloat_AsDouble(args[2]), tiny = PyFloat_AsDouble(args[3]);
    long threads = PyLong_AsLong(args[4]);
    if (PyErr_Occurred()) return NULL;
    Py_buffer view, head = {0};
    int hashed = args[5] != Py_None;
    if (hashed && PyObject_GetBuffer(args[5], &head, PyBUF_SIMPLE) < 0) return NULL;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) {
        if (hashed) PyBuffer_Release(&head);
        return NULL;
    }
    const char *format = view.format ? view.format : "B";
    int f32 = view.itemsize == 4 && strcmp(format, "f") == 0, f64 = view.itemsize == 8 && strcmp(format, "d") == 0;
    if (!f32 && !f64) {
        PyBuffer_Release(&view);
        if (hashed) PyBuffer_Release(&head);
        PyErr_Format(PyExc_ValueError, "summary needs native float32 or float64, got format '%s'", format);
        return NULL;
    }
    Stats s = {INFINITY, -INFINITY, 0, 0, 0, 0, 0, 0, 0, 0};
    unsigned char out[16];
    int64_t n = view.len / view.itemsize;
    Py_BEGIN_ALLOW_THREADS
    if (hashed && threads <= 1) {
        stats_and_digest(view.buf, n, view.itemsize, nz, no, tiny, &head, &s, out);
    } else {
        if (f32) aligner_stats_f32(view.buf, n, nz, no, tiny, (int)threads, &s);
        else aligner_stats_f64(view.buf, n, nz, no, tiny, (int)threads, &s);
        if (hashed) content_digest(&head, &view, out);
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&view);
    if (hashed) PyBuffer_Release(&head);
    return Py_BuildValue("(ddddLLLLLLN)", s.lo, s.hi, s.sum, s.squares, (long long)s.nan, (long long)s.inf,
                         (long long)s.zeros, (long long)s.near_zero, (long long)s.near_one, (long long)s.tiny,
                         hashed ? PyBytes_FromStringAndSize((const char *)out, 16) : Py_NewRef(Py_None));
}

static PyMethodDef kernel_methods[] = {
    {"digest", (PyCFunction)(void (*)(void))py_digest, METH_FASTCALL, "XXH3-128 of two buffers (16 bytes)."},
    {"summary", (PyCFunction)(void (*)(void))py_summary, METH_FASTCALL,
     "One array's statistics (and digest) in one pass."},
    {NULL, NULL, 0, NULL}};

/* Importable, so that Python's import system finds this shared library wherever it was installed (ctypes binds the
 * metric kernels by name); `summary` and `digest` are called directly, being called once per dumped tensor. */
static struct PyModuleDef kernel_module = {PyModuleDef_HEAD_INIT, "_kernel",
                                           "Fused metric and statistics kernels.", -1, kernel_methods};

PyMODINIT_FUNC PyInit__kernel(void) { return PyModule_Create(&kernel_module); }
