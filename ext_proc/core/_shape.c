/* A body's shape in one pass over its bytes: the compiled twin of
 * ext_proc/core/reading.py's ``_scanned``, which stays the reference
 * (tests/core/test_shape_native.py compares the two).
 *
 * shape(raw, max_values, portable=False) -> (values, long_digits)
 *     ``values``: one more than the bytes of ``raw`` among ``,`` ``:`` ``[`` ``{``;
 *     ``long_digits``: whether ``raw`` holds a run of more than ``MAX_DIGITS`` ASCII
 *     digits. With ``max_values`` 0 or more, the scan stops at the end of the first
 *     block of ``BLOCK`` bytes after which ``values`` exceeds it (both answers then
 *     stand for the bytes up to there), as the reference's loop over blocks does;
 *     negative: no limit. ``portable``: the SSE2 (or scalar) loop even where the CPU
 *     has AVX2 (the tests compare both).
 *
 * Why it is sound. Sixty-four bytes at a time (a chunk) are classified: the separators
 * and the digits. ``[`` and ``{`` are the two bytes that are ``{`` once their 0x20 bit
 * is set; the AVX2 loop instead looks each byte's two nibbles up (pshufb, which gives 0
 * for bytes of 0x80 and up) and ANDs them into a class: 0x80 for a digit, 1, 2 or 4
 * for a separator (one bit per pair of nibble sets, so that no other byte gets one),
 * 0 else. The vector loops count separators per byte place (a byte of 8 bits, summed
 * by psadbw before it can reach 256: ``ROUNDS``); the others by popcount of a mask.
 * A run of digits is followed across chunks: ``run`` is the number of digits that end
 * the bytes seen so far; a run crossing into a chunk is ``run`` plus the chunk's
 * leading digits, and a run inside one is found by doubling (a bit left where 2, 4, 8,
 * 16 then 19 digits start). The vector loops skip that work where every aligned group
 * of 8 bytes (the bytes scanned are cut in 8s from the buffer's start, as in chunks)
 * holds a non-digit and ``run`` is below ``LONG_DIGITS - 7``: a run inside the bytes
 * then spans parts of at most two groups (14 digits), one crossing into them adds at
 * most 7 leading digits to ``run`` (18), so no run of ``LONG_DIGITS`` ends there, and
 * the new ``run`` is the trailing digits of the last group, at most 7 (the AVX2 loop
 * reads those back from the bytes only when the next pair of chunks needs it: an
 * 8-byte read inside what it has scanned). The reference finds a run when its last
 * digit lies in a scanned block (each block maps the 18 bytes before it too), which is
 * what the running count sees when it stops at the same block's end. Blocks are a
 * whole number of chunks. The last, partial chunk is classified one byte at a time:
 * nothing is read past the buffer's end. Nothing is global or mutable but the choice of
 * loop, written once at import.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

#ifdef __SSE2__
#include <emmintrin.h>
#endif
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define HAVE_AVX2_VERSION 1
#endif

/* reading.py's _LONG_DIGITS (ids.MAX_DIGITS + 1) and _BLOCK. */
#define LONG_DIGITS 19
#define BLOCK ((Py_ssize_t)1 << 20)
#define CHUNK 64
/* The vector loops count separators per byte place, at most 4 a place a round (a pair
 * of chunks for AVX2, a chunk for SSE2) in 8 bits: summed every this many rounds. */
#define ROUNDS 63

typedef struct {
    Py_ssize_t values;
    int run; /* digits ending the bytes seen, capped at LONG_DIGITS */
    int long_digits;
} state;

static inline __attribute__((always_inline)) int popcount64(uint64_t x) {
    return __builtin_popcountll(x);
}

/* Takes in one chunk's digits (``run`` and ``long_digits``). */
static inline __attribute__((always_inline)) void step_digits(state *s, uint64_t digits) {
    if (s->long_digits || digits == 0) {
        s->run = 0;
        return;
    }
    uint64_t others = ~digits;
    int lead = others ? __builtin_ctzll(others) : CHUNK;
    uint64_t at = digits & (digits >> 1); /* 2 digits start here */
    at &= at >> 2;                         /* 4 */
    at &= at >> 4;                         /* 8 */
    at &= at >> 8;                         /* 16 */
    at &= at >> 3;                         /* 19 */
    if (s->run + lead >= LONG_DIGITS || at) {
        s->long_digits = 1;
        return;
    }
    s->run = others ? __builtin_clzll(others) : s->run + CHUNK;
}

/* Takes in one chunk's masks. */
static inline __attribute__((always_inline)) void step(state *s, uint64_t seps,
                                                      uint64_t digits) {
    s->values += popcount64(seps);
    step_digits(s, digits);
}

static inline __attribute__((always_inline)) int is_separator(uint8_t c) {
    return c == ',' || c == ':' || (c | 0x20) == '{';
}

/* The masks of the ``n`` (< CHUNK) bytes at ``p``, one byte at a time. */
static inline void classify_bytes(const uint8_t *p, Py_ssize_t n, uint64_t *seps,
                                  uint64_t *digits) {
    uint64_t sep = 0, dig = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        uint64_t bit = (uint64_t)1 << i;
        sep |= is_separator(p[i]) ? bit : 0;
        dig |= (uint8_t)(p[i] - '0') < 10 ? bit : 0;
    }
    *seps = sep;
    *digits = dig;
}

/* Whether each aligned group of 8 bytes of a chunk holds a non-digit: then no run of
 * digits inside the chunk is longer than 14, and one crossing into it has at most 7
 * of its digits. */
static inline __attribute__((always_inline)) int no_eight_digits(uint64_t digits) {
    uint64_t all = digits & (digits >> 1); /* 2 digits start here */
    all &= all >> 2;                        /* 4 */
    all &= all >> 4;                        /* 8 */
    return (all & 0x0101010101010101ULL) == 0;
}

/* The chunks of p[start:end] (a whole number of them) taken in. */
#ifdef __SSE2__
static void chunks_portable(state *s, const uint8_t *p, Py_ssize_t start, Py_ssize_t end) {
    const __m128i comma = _mm_set1_epi8(','), colon = _mm_set1_epi8(':');
    const __m128i brace = _mm_set1_epi8('{'), bit5 = _mm_set1_epi8(0x20);
    const __m128i below = _mm_set1_epi8('0' - 1), above = _mm_set1_epi8('9' + 1);
    const __m128i zero = _mm_setzero_si128();
    Py_ssize_t i = start;
    while (i < end) {
        Py_ssize_t chunks = (end - i) / CHUNK;
        Py_ssize_t stop = i + CHUNK * (chunks < ROUNDS ? chunks : ROUNDS);
        __m128i counts = zero; /* separators per byte place, at most 4 a chunk */
        for (; i < stop; i += CHUNK) {
            uint64_t digits = 0;
            for (int part = 0; part < 4; part++) {
                __m128i b = _mm_loadu_si128((const __m128i *)(p + i + 16 * part));
                __m128i sep = _mm_or_si128(
                    _mm_or_si128(_mm_cmpeq_epi8(b, comma), _mm_cmpeq_epi8(b, colon)),
                    _mm_cmpeq_epi8(_mm_or_si128(b, bit5), brace));
                counts = _mm_sub_epi8(counts, sep);
                /* Signed comparisons: bytes of 0x80 and up are negative, below '0'. */
                __m128i d = _mm_and_si128(_mm_cmpgt_epi8(b, below), _mm_cmplt_epi8(b, above));
                digits |= (uint64_t)(unsigned)_mm_movemask_epi8(d) << (16 * part);
            }
            if (!s->long_digits && no_eight_digits(digits) && s->run < LONG_DIGITS - 7) {
                /* Every run ending here is shorter than 19 (no_eight_digits). */
                s->run = __builtin_clzll(~digits);
            } else {
                step_digits(s, digits);
            }
        }
        uint64_t sums[2];
        _mm_storeu_si128((__m128i *)sums, _mm_sad_epu8(counts, zero));
        s->values += (Py_ssize_t)(sums[0] + sums[1]);
    }
}
#else
static void chunks_portable(state *s, const uint8_t *p, Py_ssize_t start, Py_ssize_t end) {
    for (Py_ssize_t i = start; i < end; i += CHUNK) {
        uint64_t seps, digits;
        classify_bytes(p + i, CHUNK, &seps, &digits);
        step(s, seps, digits);
    }
}
#endif

#ifdef HAVE_AVX2_VERSION
#define AVX2 __attribute__((target("avx2,popcnt")))

/* The digits that end the bytes before ``at``: at most 7 where the 8 bytes before
 * ``at`` hold a non-digit (the only use), never more than 8 bytes read back. */
static inline int trailing_digits(const uint8_t *at) {
    int n = 0;
    while (n < 8 && (uint8_t)(at[-1 - n] - '0') < 10) {
        n++;
    }
    return n;
}

/* Each byte's class: 0x80 for a digit, 1, 2 or 4 for a separator, 0 for any other
 * byte (the low nibble's table AND the high nibble's; pshufb gives 0 for bytes of
 * 0x80 and up). */
AVX2 static inline __m256i classes_avx2(const uint8_t *at, __m256i lo_t, __m256i hi_t,
                                        __m256i low4) {
    __m256i b = _mm256_loadu_si256((const __m256i *)at);
    __m256i lo = _mm256_shuffle_epi8(lo_t, b);
    __m256i hi = _mm256_shuffle_epi8(hi_t, _mm256_and_si256(_mm256_srli_epi16(b, 4), low4));
    return _mm256_and_si256(lo, hi);
}

AVX2 static inline uint64_t digits_avx2(__m256i c0, __m256i c1) {
    return (uint64_t)(uint32_t)_mm256_movemask_epi8(c0) |
           (uint64_t)(uint32_t)_mm256_movemask_epi8(c1) << 32;
}

AVX2 static void chunks_avx2(state *s, const uint8_t *p, Py_ssize_t start, Py_ssize_t end) {
#define D 0x80 /* digit */
    /* Classes by nibble: ',' is 0x2C (1), ':' 0x3A (2), '[' 0x5B and '{' 0x7B (4). */
    const __m256i lo_t = _mm256_setr_epi8(D, D, D, D, D, D, D, D, D, D, 2, 4, 1, 0, 0, 0,
                                          D, D, D, D, D, D, D, D, D, D, 2, 4, 1, 0, 0, 0);
    const __m256i hi_t = _mm256_setr_epi8(0, 0, 1, D | 2, 0, 4, 0, 4, 0, 0, 0, 0, 0, 0, 0, 0,
                                          0, 0, 1, D | 2, 0, 4, 0, 4, 0, 0, 0, 0, 0, 0, 0, 0);
#undef D
    const __m256i low4 = _mm256_set1_epi8(0x0F), zero = _mm256_setzero_si256();
    const __m256i eight_digits = _mm256_set1_epi8((char)0x80);
    __m256i total = zero; /* separators, four sums of 64 bits */
    /* ``run`` is stale: the digits that end p[:i] are its last at most 7, read back
     * when needed. */
    int stale = 0;
    Py_ssize_t i = start;
    while (end - i >= 2 * CHUNK) {
        Py_ssize_t pairs = (end - i) / (2 * CHUNK);
        Py_ssize_t stop = i + 2 * CHUNK * (pairs < ROUNDS ? pairs : ROUNDS);
        __m256i counts = zero; /* separators per byte place, at most 4 a pair */
        for (; i < stop; i += 2 * CHUNK) {
            __m256i c0 = classes_avx2(p + i, lo_t, hi_t, low4);
            __m256i c1 = classes_avx2(p + i + 32, lo_t, hi_t, low4);
            __m256i c2 = classes_avx2(p + i + 64, lo_t, hi_t, low4);
            __m256i c3 = classes_avx2(p + i + 96, lo_t, hi_t, low4);
            /* A separator's class is above 0 as a signed byte (a digit's is below). */
            __m256i seps = _mm256_add_epi8(
                _mm256_add_epi8(_mm256_cmpgt_epi8(c0, zero), _mm256_cmpgt_epi8(c1, zero)),
                _mm256_add_epi8(_mm256_cmpgt_epi8(c2, zero), _mm256_cmpgt_epi8(c3, zero)));
            counts = _mm256_sub_epi8(counts, seps);
            /* The aligned 8-byte groups made of digits only. */
            __m256i full = _mm256_or_si256(
                _mm256_or_si256(_mm256_cmpeq_epi64(c0, eight_digits),
                                _mm256_cmpeq_epi64(c1, eight_digits)),
                _mm256_or_si256(_mm256_cmpeq_epi64(c2, eight_digits),
                                _mm256_cmpeq_epi64(c3, eight_digits)));
            if (s->long_digits ||
                (_mm256_testz_si256(full, full) && (stale || s->run < LONG_DIGITS - 7))) {
                stale = 1;
                continue;
            }
            if (stale) {
                s->run = trailing_digits(p + i);
                stale = 0;
            }
            step_digits(s, digits_avx2(c0, c1));
            step_digits(s, digits_avx2(c2, c3));
        }
        total = _mm256_add_epi64(total, _mm256_sad_epu8(counts, zero));
    }
    if (stale && !s->long_digits) {
        s->run = trailing_digits(p + i);
    }
    if (i < end) { /* one chunk left */
        __m256i c0 = classes_avx2(p + i, lo_t, hi_t, low4);
        __m256i c1 = classes_avx2(p + i + 32, lo_t, hi_t, low4);
        __m256i seps = _mm256_sub_epi8(zero, _mm256_add_epi8(_mm256_cmpgt_epi8(c0, zero),
                                                            _mm256_cmpgt_epi8(c1, zero)));
        total = _mm256_add_epi64(total, _mm256_sad_epu8(seps, zero));
        step_digits(s, digits_avx2(c0, c1));
    }
    __m128i sum = _mm_add_epi64(_mm256_castsi256_si128(total), _mm256_extracti128_si256(total, 1));
    s->values += (Py_ssize_t)(_mm_cvtsi128_si64(sum) + _mm_extract_epi64(sum, 1));
}
#endif

typedef void (*chunks_fn)(state *, const uint8_t *, Py_ssize_t, Py_ssize_t);

/* The loop the CPU runs best, chosen once at import (PyInit__shape). */
static chunks_fn chunks = chunks_portable;

static PyObject *shape(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 2 && nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "shape(raw, max_values, portable=False)");
        return NULL;
    }
    int portable = nargs == 3 ? PyObject_IsTrue(args[2]) : 0;
    if (portable < 0) {
        return NULL;
    }
    chunks_fn run_chunks = portable ? chunks_portable : chunks;
    Py_ssize_t most = PyLong_AsSsize_t(args[1]);
    if (most == -1 && PyErr_Occurred()) {
        return NULL;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0) {
        return NULL;
    }
    const uint8_t *p = (const uint8_t *)view.buf;
    Py_ssize_t n = view.len;
    state s = {1, 0, 0};
    for (Py_ssize_t start = 0; start < n; start += BLOCK) {
        Py_ssize_t end = n - start > BLOCK ? start + BLOCK : n;
        Py_ssize_t whole = start + (end - start) / CHUNK * CHUNK;
        run_chunks(&s, p, start, whole);
        if (whole < end) {
            uint64_t seps, digits;
            classify_bytes(p + whole, end - whole, &seps, &digits);
            step(&s, seps, digits);
        }
        if (most >= 0 && s.values > most) {
            break;
        }
    }
    PyBuffer_Release(&view);
    return Py_BuildValue("(nO)", s.values, s.long_digits ? Py_True : Py_False);
}

static PyObject *implementation(PyObject *self, PyObject *unused) {
    (void)self;
    (void)unused;
#ifdef HAVE_AVX2_VERSION
    if (chunks == chunks_avx2) {
        return PyUnicode_FromString("avx2");
    }
#endif
#ifdef __SSE2__
    return PyUnicode_FromString("sse2");
#else
    return PyUnicode_FromString("scalar");
#endif
}

static PyMethodDef methods[] = {
    {"shape", (PyCFunction)(void (*)(void))shape, METH_FASTCALL,
     "shape(raw, max_values, portable=False) -> (values, long_digits)"},
    {"implementation", implementation, METH_NOARGS, "The loop this CPU runs."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef shape_module = {
    PyModuleDef_HEAD_INIT, "ext_proc.core._shape", "A body's shape in one pass.", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__shape(void) {
#ifdef HAVE_AVX2_VERSION
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("popcnt")) {
        chunks = chunks_avx2;
    }
#endif
    PyObject *module = PyModule_Create(&shape_module);
    if (module == NULL) {
        return NULL;
    }
    if (PyModule_AddIntConstant(module, "BLOCK", (long)BLOCK) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
