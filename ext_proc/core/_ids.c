/* Token ids checked in one pass over their text: the compiled twin of
 * ext_proc/core/ids.py's checks, which stay the reference (tests/core/test_ids_native.py
 * compares the two).
 *
 * read(span[, bound]) -> (count, text[, below]) | None
 *     ``span`` (any buffer) when it is a well-formed array of ids (ids.py's module
 *     docstring), with or without one space after each comma: how many ids and the
 *     canonical text (``span`` itself when it is a bytes object without spaces, else a
 *     compacted copy). None when it is not well-formed, as ``ids._well_formed`` says.
 *     With ``bound``, ``below`` tells in the same pass whether every id is below it
 *     (``fault``'s None), the bound compared as ``fault`` compares it.
 *
 * fault(text, bound, checked=False) -> None | (malformed, index, value) | NotImplemented
 *     For the canonical text of ids (``checked``: read's, whose grammar is not checked
 *     again), or orjson's text of a non-empty list: None when
 *     every item is an id below ``bound`` (at most 2**31) and the text is well-formed;
 *     (True, index, 0) for the first item that is not a run of digits; else
 *     (False, index, value) for the largest item, at or above ``bound``, and the index
 *     of its first occurrence: ``ids.Fault`` exactly. NotImplemented where the text is
 *     not one orjson writes for a list (a leading zero, an item of more than 20 digits):
 *     the reference decides from the items.
 *
 * Why it is sound. Between the brackets a well-formed text holds digits and commas only.
 * Sixteen bytes are classified at a time (SSE2; else one byte at a time) into 64-bit
 * masks of a 64-byte chunk: digits, commas, zeros. The closing ']' counts as the comma
 * ending the last item, the '[' as one ending an item before the first. Then, as
 * bitwise operations on the masks (a shift carries the previous chunk's bits in):
 * an item is empty where a comma starts it; it has a leading zero where a zero starts
 * it and a digit follows; it is ``k`` digits or longer where its comma has no comma
 * within the ``k`` bytes before it. Without leading zeros a longer item is a larger
 * number, so only the items of exactly as many digits as ``bound - 1`` are compared
 * with it, byte by byte; items of more digits are beyond it. The first byte that is
 * neither digit nor comma, or the first empty item, gives the first malformed item's
 * index: the commas before it. The largest item's value is read (at most 20 digits:
 * below 2**64, checked) only once some item is known to reach the bound.
 * Every read stays inside the buffer (the last chunk is copied into a padded one);
 * nothing is global or mutable.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#ifdef __SSE2__
#include <emmintrin.h>
#endif

/* ids.py's MAX_DIGITS; orjson writes ints below 2**64: 20 digits at most. */
#define MAX_DIGITS 18
#define MAX_WRITTEN 20
#define CHUNK 64

/* One chunk: bit i stands for byte i. ``ends`` are the commas, and the ']' in the
 * last chunk; ``other`` the bytes that are none of those nor digits (not counting the
 * padding after the ']'). */
typedef struct {
    uint64_t digits, ends, zeros, other;
    uint64_t high; /* the bytes at or above ``first`` (classify's) */
} masks;

/* The masks of the 64 bytes at ``q``; ``high`` only where ``first`` is a digit.
 * ``checked``: the bytes are known to be digits and commas only (a well-formed text),
 * so only the commas and ``high`` are looked for. */
static inline void classify(const uint8_t *q, masks *k, uint8_t first, int checked) {
    uint64_t digits = 0, commas = 0, zeros = 0, high = 0;
    int by_first = (uint8_t)(first - '0') < 10;
    if (checked) {
#ifdef __SSE2__
        const __m128i comma = _mm_set1_epi8(',');
        const __m128i at_least = _mm_set1_epi8((char)(first - 1));
        for (int part = 0; part < 4; part++) {
            __m128i block = _mm_loadu_si128((const __m128i *)(q + 16 * part));
            int shift = 16 * part;
            commas |= (uint64_t)(unsigned)_mm_movemask_epi8(_mm_cmpeq_epi8(block, comma)) << shift;
            high |= (uint64_t)(unsigned)_mm_movemask_epi8(_mm_cmpgt_epi8(block, at_least)) << shift;
        }
#else
        for (int i = 0; i < CHUNK; i++) {
            uint64_t bit = (uint64_t)1 << i;
            commas |= q[i] == ',' ? bit : 0;
            high |= by_first && q[i] >= first && q[i] < 0x80 ? bit : 0;
        }
#endif
        k->digits = ~commas;
        k->ends = commas;
        k->zeros = 0;
        k->other = 0;
        k->high = by_first ? high : 0;
        return;
    }
#ifdef __SSE2__
    const __m128i below = _mm_set1_epi8('0' - 1);
    const __m128i above = _mm_set1_epi8('9' + 1);
    const __m128i comma = _mm_set1_epi8(',');
    const __m128i zero = _mm_set1_epi8('0');
    for (int part = 0; part < 4; part++) {
        __m128i block = _mm_loadu_si128((const __m128i *)(q + 16 * part));
        /* Bytes of 0x80 and above compare as negative: not digits. */
        __m128i d = _mm_and_si128(_mm_cmpgt_epi8(block, below), _mm_cmplt_epi8(block, above));
        int shift = 16 * part;
        digits |= (uint64_t)(unsigned)_mm_movemask_epi8(d) << shift;
        commas |= (uint64_t)(unsigned)_mm_movemask_epi8(_mm_cmpeq_epi8(block, comma)) << shift;
        zeros |= (uint64_t)(unsigned)_mm_movemask_epi8(_mm_cmpeq_epi8(block, zero)) << shift;
        if (by_first) {
            __m128i at_least = _mm_cmpgt_epi8(block, _mm_set1_epi8((char)(first - 1)));
            high |= (uint64_t)(unsigned)_mm_movemask_epi8(at_least) << shift;
        }
    }
#else
    for (int i = 0; i < CHUNK; i++) {
        uint64_t bit = (uint64_t)1 << i;
        digits |= (uint8_t)(q[i] - '0') < 10 ? bit : 0;
        commas |= q[i] == ',' ? bit : 0;
        zeros |= q[i] == '0' ? bit : 0;
        high |= by_first && q[i] >= first && q[i] < 0x80 ? bit : 0;
    }
#endif
    k->digits = digits;
    k->ends = commas;
    k->zeros = zeros;
    k->other = ~(digits | commas);
    k->high = high;
}

/* The chunks of the bytes between the brackets: ``p[0..m)``, ``p[m]`` being ']'. */
typedef struct {
    const uint8_t *p;
    Py_ssize_t m;
    Py_ssize_t at;      /* where the next chunk starts; past m once the last was given */
    uint64_t prev_ends; /* the previous chunk's ends (the '[' before the first) */
    uint64_t prev_lead; /* the previous chunk's zeros that start an item */
    uint64_t prev_high; /* the previous chunk's ``high`` */
    uint8_t first;      /* classify's ``first`` */
    int checked;        /* classify's ``checked`` */
    uint8_t pad[CHUNK]; /* the last chunk, copied */
} chunks;

static void chunks_init(chunks *c, const uint8_t *p, Py_ssize_t m, uint8_t first, int checked) {
    c->first = first;
    c->checked = checked;
    c->prev_high = 0;
    c->p = p;
    c->m = m;
    c->at = 0;
    c->prev_ends = (uint64_t)1 << 63; /* the '[' stands just before p[0] */
    c->prev_lead = 0;
}

/* The next chunk's masks, ``*at`` where it starts; 0 once every chunk was given. */
static inline int chunks_next(chunks *c, masks *k, Py_ssize_t *at) {
    Py_ssize_t left = c->m - c->at;
    if (left < 0) {
        return 0;
    }
    *at = c->at;
    if (left >= CHUNK) {
        classify(c->p + c->at, k, c->first, c->checked);
        c->at += CHUNK;
        return 1;
    }
    /* The last chunk: the bytes left and the ']' (at bit ``left``), then padding. */
    memset(c->pad, 0, CHUNK);
    memcpy(c->pad, c->p + c->at, (size_t)left + 1);
    classify(c->pad, k, c->first, c->checked);
    uint64_t bracket = (uint64_t)1 << left;
    uint64_t inside = bracket | (bracket - 1);
    k->ends |= bracket;
    k->digits &= inside & ~bracket;
    k->other &= inside & ~bracket;
    c->at = c->m + 1;
    return 1;
}

/* Where an item starts: just after an end (this chunk's or the previous one's). */
static inline uint64_t starts(const chunks *c, const masks *k) {
    return (k->ends << 1) | (c->prev_ends >> 63);
}

/* Where an end has another end within the ``width`` (1..63) bytes before it: the
 * ends shifted by 1 to ``width`` places, the previous chunk's carried in (a 128-bit
 * shift in two words; every shift below is by 1..63 places). */
static inline uint64_t near(const chunks *c, const masks *k, int width) {
    uint64_t hi = (k->ends << 1) | (c->prev_ends >> 63);
    uint64_t lo = c->prev_ends << 1;
    int covered = 1;
    while (2 * covered <= width) {
        hi |= (hi << covered) | (lo >> (64 - covered));
        lo |= lo << covered;
        covered *= 2;
    }
    if (covered < width) {
        int more = width - covered;
        hi |= (hi << more) | (lo >> (64 - more));
    }
    return hi;
}

/* The ends exactly ``width`` (1..63) bytes before each place. */
static inline uint64_t behind(const chunks *c, const masks *k, int width) {
    return (k->ends << width) | (c->prev_ends >> (64 - width));
}

/* Where a digit follows a zero that starts an item: a leading zero's second digit. */
static inline uint64_t led(chunks *c, const masks *k) {
    uint64_t lead = k->zeros & starts(c, k);
    uint64_t found = k->digits & ((lead << 1) | (c->prev_lead >> 63));
    c->prev_lead = lead;
    return found;
}

/* ``len`` (1..8) bytes at ``p`` as a big-endian number, which orders runs of digits of
 * one length as their values; ``readable``: the 8 bytes from ``p`` are in the buffer. */
static inline uint64_t key_of(const uint8_t *p, int len, int readable) {
    uint64_t key = 0;
#if defined(__GNUC__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    if (readable) {
        memcpy(&key, p, 8);
        return __builtin_bswap64(key) >> (8 * (8 - len));
    }
#else
    (void)readable;
#endif
    for (int i = 0; i < len; i++) {
        key = (key << 8) | p[i];
    }
    return key;
}

/* Bits set in ``x`` (no popcnt instruction without -march). */
static inline int popcount(uint64_t x) {
    x = x - ((x >> 1) & 0x5555555555555555ULL);
    x = (x & 0x3333333333333333ULL) + ((x >> 2) & 0x3333333333333333ULL);
    x = (x + (x >> 4)) & 0x0F0F0F0F0F0F0F0FULL;
    return (int)((x * 0x0101010101010101ULL) >> 56);
}

/* The largest item of a text whose items are all runs of digits without leading
 * zeros, and the index of its first occurrence: by length, then by bytes. 0 when
 * one is longer than MAX_WRITTEN digits or the value does not fit 64 bits. */
static int largest(const uint8_t *p, Py_ssize_t m, uint64_t *value, Py_ssize_t *index) {
    const uint8_t *top = p;
    Py_ssize_t top_len = 0, count = 0, start = 0;
    for (Py_ssize_t at = 0; at <= m; at++) {
        if (at < m && p[at] != ',') {
            continue;
        }
        Py_ssize_t len = at - start;
        if (len > top_len || (len == top_len && memcmp(p + start, top, (size_t)len) > 0)) {
            top = p + start;
            top_len = len;
            *index = count;
        }
        count++;
        start = at + 1;
    }
    if (top_len > MAX_WRITTEN) {
        return 0;
    }
    uint64_t v = 0;
    for (Py_ssize_t i = 0; i < top_len; i++) {
        uint64_t digit = (uint64_t)(top[i] - '0');
        if (v > (UINT64_MAX - digit) / 10) {
            return 0;
        }
        v = v * 10 + digit;
    }
    *value = v;
    return 1;
}

/* Whether the ``digits`` digits at ``id`` are above ``limit``'s (``limit_key``: its
 * first 8 digits' key). */
static inline int above_limit(const uint8_t *id, int readable, const char *limit, int digits,
                              uint64_t limit_key) {
    if (digits <= 8) {
        return key_of(id, digits, readable) > limit_key;
    }
    return memcmp(id, limit, (size_t)digits) > 0;
}

/* Whether an item ending in this chunk has as many digits as the limit (``digits``)
 * and more than it, or more digits; ``at`` is where the chunk starts in ``p``, whose
 * bytes run to ``p[c->m]`` (the ']'). Only the items of exactly the limit's length whose
 * first digit is not below the limit's are compared whole. */
static inline int reach(const chunks *c, const masks *k, const uint8_t *p, Py_ssize_t at,
                        const char *limit, int digits, uint64_t limit_key) {
    /* An end within ``digits`` bytes after the previous: an item shorter than the
     * limit; none within ``digits + 1``: one longer, beyond it. */
    uint64_t shorter = near(c, k, digits);
    uint64_t not_longer = shorter | behind(c, k, digits + 1);
    if ((k->ends & ~not_longer) != 0) {
        return 1;
    }
    uint64_t high = (k->high << digits) | (c->prev_high >> (64 - digits));
    uint64_t exact = k->ends & ~shorter & not_longer & high;
    while (exact) {
        Py_ssize_t start = at + __builtin_ctzll(exact) - digits;
        if (above_limit(p + start, start + 8 <= c->m + 1, limit, digits, limit_key)) {
            return 1;
        }
        exact &= exact - 1;
    }
    return 0;
}

/* How many items ``p[0..m)`` holds when the array ``[p]`` is well-formed; -1 when not.
 * With a ``limit`` (bound - 1 in decimal, ``digits`` long), ``*reaches`` tells in the
 * same pass whether some id is at or above the bound. */
static Py_ssize_t well_formed(const uint8_t *s, Py_ssize_t n, const char *limit, int digits,
                              int *reaches) {
    if (n < 3 || s[0] != '[' || s[n - 1] != ']') {
        return -1;
    }
    int bounded = limit != NULL;
    uint64_t limit_key = bounded && digits <= 8 ? key_of((const uint8_t *)limit, digits, 0) : 0;
    chunks c;
    masks k;
    Py_ssize_t at, count = 0;
    chunks_init(&c, s + 1, n - 2, bounded ? (uint8_t)limit[0] : 0, 0);
    while (chunks_next(&c, &k, &at)) {
        uint64_t empty = k.ends & starts(&c, &k);
        /* An end in each 8 bytes, and in the previous chunk's last 8: every item
         * ending here is shorter than 16 digits (the usual case, at less cost). */
        uint64_t eights = k.ends | (k.ends >> 4);
        eights |= eights >> 2;
        eights |= eights >> 1;
        int dense = (eights & 0x0101010101010101ULL) == 0x0101010101010101ULL &&
                    (c.prev_ends >> 56) != 0;
        uint64_t longer = dense ? 0 : k.ends & ~near(&c, &k, MAX_DIGITS + 1);
        if ((k.other | empty | led(&c, &k) | longer) != 0) {
            return -1;
        }
        if (bounded && !*reaches) {
            *reaches = reach(&c, &k, s + 1, at, limit, digits, limit_key);
        }
        count += popcount(k.ends);
        c.prev_high = k.high;
        c.prev_ends = k.ends;
    }
    return count;
}

/* ``fault`` on the bytes ``s[0..n)``; ``limit`` is bound - 1 in decimal; ``checked``:
 * they are a well-formed text (``read``'s), only the bound is left to check. */
static PyObject *find_fault(const uint8_t *s, Py_ssize_t n, const char *limit, int digits,
                            int checked) {
    uint64_t limit_key = digits <= 8 ? key_of((const uint8_t *)limit, digits, 0) : 0;
    if (n < 3 || s[0] != '[' || s[n - 1] != ']') {
        return Py_NewRef(Py_NotImplemented);
    }
    const uint8_t *p = s + 1;
    chunks c;
    masks k;
    Py_ssize_t at, count = 0;
    int zeros = 0, reaches = 0;
    chunks_init(&c, p, n - 2, (uint8_t)limit[0], checked);
    while (chunks_next(&c, &k, &at)) {
        uint64_t bad = 0;
        if (!checked) {
            zeros |= led(&c, &k) != 0;
            bad = k.other | (k.ends & starts(&c, &k));
        }
        if (bad) {
            if (zeros) {
                return Py_NewRef(Py_NotImplemented);
            }
            uint64_t before = (bad & (0 - bad)) - 1; /* the bits below the first bad */
            Py_ssize_t index = count + popcount(k.ends & before);
            return Py_BuildValue("(OnK)", Py_True, index, 0ULL);
        }
        count += popcount(k.ends);
        if (!reaches) {
            reaches = reach(&c, &k, p, at, limit, digits, limit_key);
        }
        c.prev_high = k.high;
        c.prev_ends = k.ends;
    }
    if (zeros) {
        return Py_NewRef(Py_NotImplemented);
    }
    if (!reaches) {
        return Py_NewRef(Py_None);
    }
    uint64_t value = 0;
    Py_ssize_t index = 0;
    if (!largest(p, n - 2, &value, &index)) {
        return Py_NewRef(Py_NotImplemented);
    }
    return Py_BuildValue("(OnK)", Py_False, index, (unsigned long long)value);
}

/* ``span`` without the space after each comma; 0 when a space stands anywhere else.
 * ``out`` has room for ``n`` bytes; ``*out_n`` is how many it holds. */
static int compact(const uint8_t *span, Py_ssize_t n, uint8_t *out, Py_ssize_t *out_n) {
    Py_ssize_t k = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        uint8_t ch = span[i];
        if (ch == ' ') {
            if (i == 0 || span[i - 1] != ',') {
                return 0;
            }
            continue;
        }
        out[k++] = ch;
    }
    *out_n = k;
    return 1;
}

/* ``bound - 1`` in decimal into ``limit`` (room for 24), its length returned; -1 with
 * an exception set when ``bound`` is not an int in [1, 2**31]. */
static int limit_of(PyObject *bound_arg, char *limit) {
    long long bound = PyLong_AsLongLong(bound_arg);
    if (bound == -1 && PyErr_Occurred()) {
        return -1;
    }
    if (bound < 1 || bound > ((long long)1 << 31)) {
        PyErr_SetString(PyExc_ValueError, "bound must be in [1, 2**31]");
        return -1;
    }
    return snprintf(limit, 24, "%lld", bound - 1);
}

static PyObject *ids_read(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 1 && nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "read(span[, bound]) takes 1 or 2 arguments");
        return NULL;
    }
    char limit_text[24];
    const char *limit = NULL;
    int digits = 0, reaches = 0;
    if (nargs == 2) {
        if ((digits = limit_of(args[1], limit_text)) < 0) {
            return NULL;
        }
        limit = limit_text;
    }
    PyObject *arg = args[0];
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0) {
        return NULL;
    }
    const uint8_t *span = (const uint8_t *)view.buf;
    Py_ssize_t n = view.len;
    PyObject *text = NULL;
    Py_ssize_t count = -1;
    int failed = 0;
    if (memchr(span, ' ', (size_t)n) == NULL) {
        count = well_formed(span, n, limit, digits, &reaches);
        if (count >= 0) {
            text = PyBytes_CheckExact(arg) ? Py_NewRef(arg)
                                           : PyBytes_FromStringAndSize((const char *)span, n);
            failed = text == NULL;
        }
    } else {
        uint8_t *compacted = PyMem_Malloc(n > 0 ? (size_t)n : 1);
        Py_ssize_t k = 0;
        if (compacted == NULL) {
            PyErr_NoMemory();
            failed = 1;
        } else if (compact(span, n, compacted, &k) &&
                   (count = well_formed(compacted, k, limit, digits, &reaches)) >= 0) {
            text = PyBytes_FromStringAndSize((const char *)compacted, k);
            failed = text == NULL;
        }
        PyMem_Free(compacted);
    }
    PyBuffer_Release(&view);
    if (failed) {
        return NULL;
    }
    if (text == NULL) {
        Py_RETURN_NONE;
    }
    if (limit == NULL) {
        return Py_BuildValue("(nN)", count, text);
    }
    return Py_BuildValue("(nNO)", count, text, reaches ? Py_False : Py_True);
}

static PyObject *ids_fault(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 2 && nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "fault(text, bound[, checked]) takes 2 or 3 arguments");
        return NULL;
    }
    int checked = nargs == 3 ? PyObject_IsTrue(args[2]) : 0;
    if (checked < 0) {
        return NULL;
    }
    char limit[24];
    int digits = limit_of(args[1], limit);
    if (digits < 0) {
        return NULL;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0) {
        return NULL;
    }
    PyObject *result = find_fault((const uint8_t *)view.buf, view.len, limit, digits, checked);
    PyBuffer_Release(&view);
    return result;
}

static PyMethodDef methods[] = {
    {"read", (PyCFunction)(void (*)(void))ids_read, METH_FASTCALL,
     "read(span[, bound]) -> (count, text[, below]) | None: the ids of a well-formed "
     "array (``below``: every id is below ``bound``)."},
    {"fault", (PyCFunction)(void (*)(void))ids_fault, METH_FASTCALL,
     "fault(text, bound, checked=False) -> None | (malformed, index, value) | "
     "NotImplemented: why the ids are not valid (``checked``: text is read's)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_ids", "Token ids checked in one pass (ext_proc/core/ids.py).",
    0, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__ids(void) { return PyModuleDef_Init(&module); }
