/* The carrier scan in one pass over a body's bytes: the compiled twin of
 * ext_proc/core/bytescan.py's ``quoted`` and ext_proc/core/spelling.py's escape search,
 * which stay the reference (tests/core/test_scan_native.py compares the two).
 *
 * ``Matcher(names, escapes)`` holds the names (each at least one byte, none holding a
 * quote) and the bytes that, after ``\u00``, start an escape of one of their
 * characters. ``quoted(raw, most)`` counts, for each name, the quotes of ``raw`` that
 * begin ``"name"``, each count capped at ``most``: the run from each quote to the next
 * one is looked up among the names of its length. ``spelled(raw, most)`` is None when
 * ``raw`` is not braced (``spelling._braced``) or holds ``\u00`` and one of the escape
 * bytes, else ``quoted``'s counts.
 *
 * Every read is within the buffer: a run is the bytes strictly between two quotes
 * found in it, a block of 64 bytes is loaded only while its 65 bytes (the 64 and the
 * next) are in the buffer, and an escape's five bytes are read one by one only when
 * all five lie before the end. A Matcher is immutable once built, so the scan may run
 * without the GIL while the caller's buffer stays held. The loop over blocks runs AVX2
 * where the CPU has it (chosen once at import), else SSE2, else bytes one by one; a
 * third argument ``portable`` of ``quoted`` and ``spelled`` asks for the SSE2 loop. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <string.h>

#ifdef __SSE2__
#include <emmintrin.h>
#endif

/* Bodies from this size are scanned without the GIL: the scan is long enough for the
 * interpreter's other threads to gain from it. */
#define UNLOCKED_MIN ((Py_ssize_t)1 << 20)

typedef struct {
    PyObject_HEAD
    /* The names as given (a tuple of bytes), kept alive for their buffers and as the
     * keys of every answer. */
    PyObject *names;
    Py_ssize_t count;
    /* The names' bytes (and each name's object, for the answers), sorted by
     * length: ``first[n]`` .. ``first[n+1]`` are the positions of the names of
     * length n (n <= longest). */
    const char **bytes;
    PyObject **keys;
    Py_ssize_t *first;
    Py_ssize_t longest;
    /* escape[b]: ``\u00`` then b starts an escape of a name's character. */
    unsigned char escape[256];
} Matcher;

static void matcher_free_arrays(Matcher *self) {
    PyMem_Free(self->bytes);
    PyMem_Free(self->keys);
    PyMem_Free(self->first);
    self->bytes = NULL;
    self->keys = NULL;
    self->first = NULL;
}

static void matcher_dealloc(PyObject *object) {
    Matcher *self = (Matcher *)object;
    matcher_free_arrays(self);
    Py_XDECREF(self->names);
    Py_TYPE(object)->tp_free(object);
}

static PyObject *matcher_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"names", "escapes", NULL};
    PyObject *names;
    Py_buffer escapes;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O!y*:Matcher", kwlist, &PyTuple_Type,
                                     &names, &escapes)) {
        return NULL;
    }
    Matcher *self = (Matcher *)type->tp_alloc(type, 0);
    if (self == NULL) {
        PyBuffer_Release(&escapes);
        return NULL;
    }
    memset(self->escape, 0, sizeof self->escape);
    for (Py_ssize_t i = 0; i < escapes.len; i++) {
        self->escape[((const unsigned char *)escapes.buf)[i]] = 1;
    }
    PyBuffer_Release(&escapes);
    Py_INCREF(names);
    self->names = names;
    Py_ssize_t count = PyTuple_GET_SIZE(names);
    self->count = count;
    self->longest = 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *name = PyTuple_GET_ITEM(names, i);
        if (!PyBytes_Check(name)) {
            PyErr_SetString(PyExc_TypeError, "names are bytes");
            goto fail;
        }
        Py_ssize_t length = PyBytes_GET_SIZE(name);
        if (length < 1 || memchr(PyBytes_AS_STRING(name), '"', (size_t)length) != NULL) {
            PyErr_SetString(PyExc_ValueError, "a name is at least one byte, no quote");
            goto fail;
        }
        if (length > self->longest) {
            self->longest = length;
        }
    }
    size_t slots = (size_t)(count > 0 ? count : 1);
    self->bytes = PyMem_New(const char *, slots);
    self->keys = PyMem_New(PyObject *, slots);
    self->first = PyMem_New(Py_ssize_t, (size_t)self->longest + 2);
    if (self->bytes == NULL || self->keys == NULL ||
        self->first == NULL) {
        PyErr_NoMemory();
        goto fail;
    }
    /* Counting sort by length; a name given twice is kept once (its first copy), so
     * each quote is counted for one name at most. */
    Py_ssize_t placed = 0;
    for (Py_ssize_t length = 0; length <= self->longest; length++) {
        self->first[length] = placed;
        for (Py_ssize_t i = 0; i < count; i++) {
            PyObject *name = PyTuple_GET_ITEM(names, i);
            if (PyBytes_GET_SIZE(name) != length) {
                continue;
            }
            const char *text = PyBytes_AS_STRING(name);
            int seen = 0;
            for (Py_ssize_t j = self->first[length]; j < placed; j++) {
                if (memcmp(self->bytes[j], text, (size_t)length) == 0) {
                    seen = 1;
                    break;
                }
            }
            if (!seen) {
                self->bytes[placed] = text;
                self->keys[placed] = name;
                placed++;
            }
        }
    }
    self->first[self->longest + 1] = placed;
    self->count = placed;
    return (PyObject *)self;
fail:
    Py_DECREF(self);
    return NULL;
}

/* One scan's state: the quote before the current one (-1: none yet), and for each
 * sorted name the quotes that begin it so far, to ``most`` (``full``: how many names
 * have reached ``most``). */
typedef struct {
    const Matcher *matcher;
    const unsigned char *raw;
    Py_ssize_t size;
    Py_ssize_t most;
    Py_ssize_t previous;
    Py_ssize_t full;
    Py_ssize_t *counts;
} Scan;

/* A quote at ``at``: the run from the previous quote to it is looked up among the
 * names of its length (a name holds no quote, so a quote begins ``"name"`` exactly
 * when the next quote follows the name). */
static inline void at_quote(Scan *scan, Py_ssize_t at) {
    const Matcher *self = scan->matcher;
    if (scan->previous >= 0) {
        Py_ssize_t length = at - scan->previous - 1;
        const unsigned char *run = scan->raw + scan->previous + 1;
        if (length >= 1 && length <= self->longest) {
            for (Py_ssize_t i = self->first[length]; i < self->first[length + 1]; i++) {
                const char *name = self->bytes[i];
                if ((unsigned char)name[0] == run[0] &&
                    (unsigned char)name[length - 1] == run[length - 1] &&
                    memcmp(name, run, (size_t)length) == 0) {
                    if (scan->counts[i] < scan->most && ++scan->counts[i] == scan->most) {
                        scan->full++;
                    }
                    break;
                }
            }
        }
    }
    scan->previous = at;
}

/* Whether the backslash at ``at`` begins ``\u00`` and an escape byte, all five bytes
 * within the buffer. */
static inline int at_backslash(const Scan *scan, Py_ssize_t at) {
    const unsigned char *raw = scan->raw;
    return at + 5 <= scan->size && raw[at + 1] == 'u' && raw[at + 2] == '0' &&
           raw[at + 3] == '0' && scan->matcher->escape[raw[at + 4]];
}

/* Each position of ``mask`` (bit k: byte ``i + k``) looked at in order, a quote's run
 * looked up, a backslash's escape looked for: 1 when an escape is found, 0 when the
 * scan may stop (every name counted to ``most``, no escape asked for), -1 to go on. */
static inline __attribute__((always_inline)) int take_mask(Scan *scan, Py_ssize_t i,
                                                          unsigned long long mask,
                                                          int escapes) {
    while (mask != 0) {
        Py_ssize_t at = i + __builtin_ctzll(mask);
        if (scan->raw[at] == '"') {
            at_quote(scan, at);
        } else if (at_backslash(scan, at)) {
            return 1;
        }
        mask &= mask - 1;
    }
    return !escapes && scan->full == scan->matcher->count ? 0 : -1;
}

/* The blocks of 64 bytes from ``*from`` (``*from`` left where the bytes one by one
 * begin), each block loaded (at offsets 0 and 1) only while all its 65 bytes are in
 * the buffer: ``take_mask``'s answer once it is not -1, else -1. */
typedef int (*blocks_fn)(Scan *, Py_ssize_t *, int);

#ifdef __SSE2__
static int blocks_sse2(Scan *scan, Py_ssize_t *from, int escapes) {
    const __m128i quote = _mm_set1_epi8('"');
    const __m128i backslash = _mm_set1_epi8('\\');
    const __m128i letter_u = _mm_set1_epi8('u');
    const unsigned char *raw = scan->raw;
    Py_ssize_t i = *from;
    for (; i + 65 <= scan->size; i += 64) {
        const unsigned char *block = raw + i;
        __m128i hits[4];
        for (int part = 0; part < 4; part++) {
            __m128i bytes = _mm_loadu_si128((const __m128i *)(block + 16 * part));
            hits[part] = _mm_cmpeq_epi8(bytes, quote);
            if (escapes) {
                __m128i next = _mm_loadu_si128((const __m128i *)(block + 16 * part + 1));
                hits[part] = _mm_or_si128(
                    hits[part], _mm_and_si128(_mm_cmpeq_epi8(bytes, backslash),
                                              _mm_cmpeq_epi8(next, letter_u)));
            }
        }
        __m128i any = _mm_or_si128(_mm_or_si128(hits[0], hits[1]), _mm_or_si128(hits[2], hits[3]));
        if (_mm_movemask_epi8(any) == 0) {
            continue;
        }
        unsigned long long mask = 0;
        for (int part = 0; part < 4; part++) {
            mask |= (unsigned long long)(unsigned)_mm_movemask_epi8(hits[part]) << (16 * part);
        }
        int found = take_mask(scan, i, mask, escapes);
        if (found >= 0) {
            return found;
        }
    }
    *from = i;
    return -1;
}
#endif

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define HAVE_AVX2_VERSION 1
/* ``blocks_sse2`` with 32 bytes a vector, where the CPU has AVX2 (PyInit__scan). */
__attribute__((target("avx2"))) static int blocks_avx2(Scan *scan, Py_ssize_t *from,
                                                       int escapes) {
    const __m256i quote = _mm256_set1_epi8('"');
    const __m256i backslash = _mm256_set1_epi8('\\');
    const __m256i letter_u = _mm256_set1_epi8('u');
    const unsigned char *raw = scan->raw;
    Py_ssize_t i = *from;
    for (; i + 65 <= scan->size; i += 64) {
        const unsigned char *block = raw + i;
        __m256i low = _mm256_loadu_si256((const __m256i *)block);
        __m256i high = _mm256_loadu_si256((const __m256i *)(block + 32));
        __m256i hits_low = _mm256_cmpeq_epi8(low, quote);
        __m256i hits_high = _mm256_cmpeq_epi8(high, quote);
        if (escapes) {
            __m256i next_low = _mm256_loadu_si256((const __m256i *)(block + 1));
            __m256i next_high = _mm256_loadu_si256((const __m256i *)(block + 33));
            hits_low = _mm256_or_si256(hits_low,
                                       _mm256_and_si256(_mm256_cmpeq_epi8(low, backslash),
                                                        _mm256_cmpeq_epi8(next_low, letter_u)));
            hits_high = _mm256_or_si256(hits_high,
                                        _mm256_and_si256(_mm256_cmpeq_epi8(high, backslash),
                                                         _mm256_cmpeq_epi8(next_high, letter_u)));
        }
        if (_mm256_testz_si256(_mm256_or_si256(hits_low, hits_high),
                               _mm256_set1_epi8((char)0xFF))) {
            continue;
        }
        unsigned long long mask =
            (unsigned long long)(unsigned)_mm256_movemask_epi8(hits_low) |
            (unsigned long long)(unsigned)_mm256_movemask_epi8(hits_high) << 32;
        int found = take_mask(scan, i, mask, escapes);
        if (found >= 0) {
            return found;
        }
    }
    *from = i;
    return -1;
}
#endif

/* The loop over blocks this CPU runs best (NULL: bytes one by one), chosen once at
 * import and never changed after. */
#ifdef __SSE2__
static blocks_fn blocks = blocks_sse2;
#else
static blocks_fn blocks = NULL;
#endif

/* The scan of ``raw`` from its first byte to its last, each quote and (``escapes``)
 * each escape start in order: 1 when an escape is found, else 0 with the counts
 * filled. By blocks of 64 bytes (``blocks``): one mask of the positions that hold a
 * quote or (``escapes``) a backslash followed by ``u``, so that blocks of neither,
 * and a body's other backslashes, cost a few vector instructions; each position of
 * the mask is then looked at alone. The bytes after the last block are read one by
 * one. ``portable``: the SSE2 loop even where AVX2 runs (the tests compare both). */
static int scan_bytes(const Matcher *self, const unsigned char *raw, Py_ssize_t size,
                      Py_ssize_t most, int escapes, Py_ssize_t *counts, int portable) {
    Scan scan = {self, raw, size, most, -1, 0, counts};
    Py_ssize_t i = 0;
#ifdef __SSE2__
    blocks_fn run = portable ? blocks_sse2 : blocks;
#else
    (void)portable;
    blocks_fn run = blocks;
#endif
    if (run != NULL) {
        int found = run(&scan, &i, escapes);
        if (found >= 0) {
            return found;
        }
    }
    for (; i < size; i++) {
        if (raw[i] == '"') {
            at_quote(&scan, i);
        } else if (escapes && raw[i] == '\\' && at_backslash(&scan, i)) {
            return 1;
        }
    }
    return 0;
}

/* JSON's whitespace. */
static inline int is_space(unsigned char byte) {
    return byte == ' ' || byte == '\t' || byte == '\n' || byte == '\r';
}

/* spelling._braced: after an optional UTF-8 byte-order mark, the first EDGE bytes
 * hold whitespace then a brace; the last EDGE bytes hold a brace then whitespace. */
#define EDGE 64
static int braced(const unsigned char *raw, Py_ssize_t size) {
    Py_ssize_t start = 0;
    if (size >= 3 && raw[0] == 0xEF && raw[1] == 0xBB && raw[2] == 0xBF) {
        start = 3;
    }
    Py_ssize_t head_end = size - start > EDGE ? start + EDGE : size;
    Py_ssize_t at = start;
    while (at < head_end && is_space(raw[at])) {
        at++;
    }
    if (at == head_end || raw[at] != '{') {
        return 0;
    }
    Py_ssize_t tail_start = size > EDGE ? size - EDGE : 0;
    Py_ssize_t end = size;
    while (end > tail_start && is_space(raw[end - 1])) {
        end--;
    }
    return end > tail_start && raw[end - 1] == '}';
}

/* quoted (``spelling`` 0) or spelled (1): the arguments are the bytes (any buffer)
 * and ``most``. */
static PyObject *matcher_run(Matcher *self, PyObject *const *args, Py_ssize_t nargs,
                             int spelling) {
    if (nargs != 2 && nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "the arguments are raw, most and portable=False");
        return NULL;
    }
    int portable = nargs == 3 ? PyObject_IsTrue(args[2]) : 0;
    if (portable < 0) {
        return NULL;
    }
    Py_ssize_t most = PyLong_AsSsize_t(args[1]);
    if (most == -1 && PyErr_Occurred()) {
        return NULL;
    }
    if (most < 1) {
        PyErr_SetString(PyExc_ValueError, "most is at least 1");
        return NULL;
    }
    Py_buffer raw;
    if (PyObject_GetBuffer(args[0], &raw, PyBUF_SIMPLE) < 0) {
        return NULL;
    }
    if (spelling && !braced(raw.buf, raw.len)) {
        PyBuffer_Release(&raw);
        Py_RETURN_NONE;
    }
    /* A few names are counted on the stack. */
    Py_ssize_t few[128];
    Py_ssize_t *counts = few;
    size_t slots = (size_t)(self->count > 0 ? self->count : 1);
    if (self->count > 128) {
        counts = PyMem_New(Py_ssize_t, slots);
        if (counts == NULL) {
            PyBuffer_Release(&raw);
            return PyErr_NoMemory();
        }
    }
    memset(counts, 0, sizeof *counts * slots);
    int escaped;
    if (raw.len >= UNLOCKED_MIN) {
        Py_BEGIN_ALLOW_THREADS
        escaped = scan_bytes(self, raw.buf, raw.len, most, spelling, counts, portable);
        Py_END_ALLOW_THREADS
    } else {
        escaped = scan_bytes(self, raw.buf, raw.len, most, spelling, counts, portable);
    }
    PyBuffer_Release(&raw);
    PyObject *found = escaped ? Py_NewRef(Py_None) : PyDict_New();
    for (Py_ssize_t i = 0; !escaped && found != NULL && i < self->count; i++) {
        if (counts[i] == 0) {
            continue;
        }
        PyObject *number = PyLong_FromSsize_t(counts[i]);
        if (number == NULL || PyDict_SetItem(found, self->keys[i], number) < 0) {
            Py_CLEAR(found);
        }
        Py_XDECREF(number);
    }
    if (counts != few) {
        PyMem_Free(counts);
    }
    return found;
}

static PyObject *matcher_quoted(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    return matcher_run((Matcher *)self, args, nargs, 0);
}

static PyObject *matcher_spelled(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    return matcher_run((Matcher *)self, args, nargs, 1);
}

static PyMethodDef matcher_methods[] = {
    {"quoted", (PyCFunction)(void (*)(void))matcher_quoted, METH_FASTCALL,
     "quoted(raw, most): for each name, the quotes of raw that begin \"name\", to most."},
    {"spelled", (PyCFunction)(void (*)(void))matcher_spelled, METH_FASTCALL,
     "spelled(raw, most): None when raw is not braced (spelling._braced) or holds an "
     "escape of a name's character, else quoted(raw, most)."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject MatcherType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "ext_proc.core._scan.Matcher",
    .tp_basicsize = sizeof(Matcher),
    .tp_dealloc = matcher_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Matcher(names, escapes): the names sought between quotes, and the bytes "
              "that after \\u00 start an escape of one of their characters.",
    .tp_methods = matcher_methods,
    .tp_new = matcher_new,
};

static struct PyModuleDef scan_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "ext_proc.core._scan",
    .m_doc = "The carrier scan over a body's bytes (reference: ext_proc.core.bytescan).",
    .m_size = 0,
};

PyMODINIT_FUNC PyInit__scan(void) {
#ifdef HAVE_AVX2_VERSION
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2")) {
        blocks = blocks_avx2;
    }
#endif
    if (PyType_Ready(&MatcherType) < 0) {
        return NULL;
    }
    PyObject *module = PyModule_Create(&scan_module);
    if (module == NULL) {
        return NULL;
    }
    Py_INCREF(&MatcherType);
    if (PyModule_AddObject(module, "Matcher", (PyObject *)&MatcherType) < 0) {
        Py_DECREF(&MatcherType);
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
