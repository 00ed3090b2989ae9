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
 * Why it is sound. Sixty-four bytes at a time are classified into two 64-bit masks
 * (bit i for byte i): the separators and the digits (SSE2, or AVX2 where the CPU has
 * it, chosen once at import; else one byte at a time). ``[`` and ``{`` are the two
 * bytes that are ``{`` once their 0x20 bit is set. The separators are counted by
 * popcount. A run of digits is followed across chunks: ``run`` is the number of digits
 * that end the bytes seen so far; a run crossing into a chunk is ``run`` plus the
 * chunk's leading digits, and a run inside one is found by doubling (a bit left where
 * 2, 4, 8, 16 then 19 digits start). The reference finds a run when its last digit lies
 * in a scanned block (each block maps the 18 bytes before it too), which is what the
 * running count sees when it stops at the same block's end. Blocks are a whole number
 * of chunks. The last, partial chunk is classified one byte at a time: nothing is read
 * past the buffer's end. Nothing is global or mutable but the choice of loop, written
 * once at import.
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

typedef struct {
    Py_ssize_t values;
    int run; /* digits ending the bytes seen, capped at LONG_DIGITS */
    int long_digits;
} state;

static inline __attribute__((always_inline)) int popcount64(uint64_t x) {
    return __builtin_popcountll(x);
}

/* Takes in one chunk's masks. */
static inline __attribute__((always_inline)) void step(state *s, uint64_t seps,
                                                      uint64_t digits) {
    s->values += popcount64(seps);
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

#ifdef __SSE2__
static inline __attribute__((always_inline)) void classify_sse2(const uint8_t *p,
                                                               uint64_t *seps,
                                                               uint64_t *digits) {
    const __m128i comma = _mm_set1_epi8(','), colon = _mm_set1_epi8(':');
    const __m128i brace = _mm_set1_epi8('{'), bit5 = _mm_set1_epi8(0x20);
    const __m128i below = _mm_set1_epi8('0' - 1), above = _mm_set1_epi8('9' + 1);
    uint64_t sep = 0, dig = 0;
    for (int part = 0; part < 4; part++) {
        __m128i b = _mm_loadu_si128((const __m128i *)(p + 16 * part));
        __m128i s = _mm_or_si128(_mm_or_si128(_mm_cmpeq_epi8(b, comma), _mm_cmpeq_epi8(b, colon)),
                                 _mm_cmpeq_epi8(_mm_or_si128(b, bit5), brace));
        /* Signed comparisons: bytes of 0x80 and up are negative, below '0'. */
        __m128i d = _mm_and_si128(_mm_cmpgt_epi8(b, below), _mm_cmplt_epi8(b, above));
        sep |= (uint64_t)(unsigned)_mm_movemask_epi8(s) << (16 * part);
        dig |= (uint64_t)(unsigned)_mm_movemask_epi8(d) << (16 * part);
    }
    *seps = sep;
    *digits = dig;
}
#define CLASSIFY_PORTABLE classify_sse2
#else
static inline void classify_scalar(const uint8_t *p, uint64_t *seps, uint64_t *digits) {
    classify_bytes(p, CHUNK, seps, digits);
}
#define CLASSIFY_PORTABLE classify_scalar
#endif

/* The chunks of p[start:end] (a whole number of them) taken in. */
static void chunks_portable(state *s, const uint8_t *p, Py_ssize_t start, Py_ssize_t end) {
    for (Py_ssize_t i = start; i < end; i += CHUNK) {
        uint64_t seps, digits;
        CLASSIFY_PORTABLE(p + i, &seps, &digits);
        step(s, seps, digits);
    }
}

#ifdef HAVE_AVX2_VERSION
__attribute__((target("avx2,popcnt"))) static void
chunks_avx2(state *s, const uint8_t *p, Py_ssize_t start, Py_ssize_t end) {
    const __m256i comma = _mm256_set1_epi8(','), colon = _mm256_set1_epi8(':');
    const __m256i brace = _mm256_set1_epi8('{'), bit5 = _mm256_set1_epi8(0x20);
    const __m256i below = _mm256_set1_epi8('0' - 1), above = _mm256_set1_epi8('9' + 1);
    for (Py_ssize_t i = start; i < end; i += CHUNK) {
        uint64_t seps = 0, digits = 0;
        for (int part = 0; part < 2; part++) {
            __m256i b = _mm256_loadu_si256((const __m256i *)(p + i + 32 * part));
            __m256i sep = _mm256_or_si256(
                _mm256_or_si256(_mm256_cmpeq_epi8(b, comma), _mm256_cmpeq_epi8(b, colon)),
                _mm256_cmpeq_epi8(_mm256_or_si256(b, bit5), brace));
            __m256i dig =
                _mm256_and_si256(_mm256_cmpgt_epi8(b, below), _mm256_cmpgt_epi8(above, b));
            seps |= (uint64_t)(uint32_t)_mm256_movemask_epi8(sep) << (32 * part);
            digits |= (uint64_t)(uint32_t)_mm256_movemask_epi8(dig) << (32 * part);
        }
        step(s, seps, digits);
    }
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
