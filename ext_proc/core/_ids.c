/* Token ids checked in one pass over their text: the compiled twin of
 * ext_proc/core/ids.py's checks, which stay the reference (tests/core/test_ids_native.py
 * and test_ids_native_loops.py compare the two).
 *
 * read(span, bound=None, portable=False) -> (count, text[, below]) | None
 *     ``span`` (any buffer) when it is a well-formed array of ids (ids.py's module
 *     docstring), with or without one space after each comma: how many ids and the
 *     canonical text (``span`` itself when it has no spaces and cannot change: a bytes
 *     object, or a view of one, the bytes' own memory; else a copy, compacted where it
 *     had spaces). None when it is not well-formed, as ``ids._well_formed`` says.
 *     With a ``bound``, ``below`` tells in the same pass whether every id is below it
 *     (``fault``'s None), the bound compared as ``fault`` compares it. ``portable``:
 *     the SSE2 (or scalar) loop even where the CPU has AVX2 (the tests compare both).
 *
 * implementation() -> "avx2" | "sse2" | "scalar": the loop ``read`` runs on this CPU.
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
 * The bytes are classified 64 at a time (a chunk) into 64-bit masks: digits, commas,
 * zeros (AVX2 where the CPU has it, chosen once at import, else SSE2, else one byte at a
 * time; every loop computes the same masks). The closing ']' counts as the comma
 * ending the last item, the '[' as one ending an item before the first. Then, as
 * bitwise operations on the masks (a shift carries the previous chunk's bits in):
 * an item is empty where a comma starts it; it has a leading zero where a zero starts
 * it and a digit follows; it is ``k`` digits or longer where its comma has no comma
 * within the ``k`` bytes before it. Without leading zeros a longer item is a larger
 * number, so only the items of exactly as many digits as ``bound - 1`` (the limit) can
 * be above it without being longer; items of more digits are beyond it. Such an item
 * is above the limit only if its first two digits are not below the limit's (with a
 * one-digit limit: its digit above it), a mask of each chunk taken where the items
 * start; only those items are compared with the limit, byte by byte. While no item is
 * known to reach the bound, no item is longer than the limit (at most 10 digits), so
 * none is longer than MAX_DIGITS: that check runs only once one reaches it, or without
 * a bound. A space is neither digit nor comma, so a span holding one fails the pass;
 * only then, and when a space is there, is it compacted and read again (a span without
 * a space compacts to itself). Compacting classifies the spaces and commas into masks
 * too: a space is kept out only with a comma just before it (else the span is not
 * well-formed: None), and the other bytes are packed in order into the text's own
 * bytes, behind the place they are read from (shuffles where the CPU has AVX2, else
 * copies of the runs between spaces), the last bytes one at a time. The first byte
 * that is neither digit nor comma, or the first empty item, gives the first malformed
 * item's index: the commas before it. The largest item's value is read (at most 20
 * digits: below 2**64, checked) only once some item is known to reach the bound.
 * Every read stays inside the buffer: the two-digit mask reads one byte past a chunk,
 * which for a whole chunk is at most the ']', and the last chunk is copied into a
 * padded one. Compacting reads whole blocks of the span only (a run's copy at most 15
 * bytes past its chunk, while 16 more follow it), and writes at most to where it reads
 * (the text has the span's length). Nothing is global or mutable but the choice of
 * loop, written once at import (compacting follows it).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#ifdef __SSE2__
#include <emmintrin.h>
#endif
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define HAVE_AVX2_VERSION 1
#endif

/* ids.py's MAX_DIGITS; orjson writes ints below 2**64: 20 digits at most. */
#define MAX_DIGITS 18
#define MAX_WRITTEN 20
#define CHUNK 64

/* One chunk: bit i stands for byte i. ``ends`` are the commas, and the ']' in the
 * last chunk; ``other`` the bytes that are none of those nor digits (not counting the
 * padding after the ']'). ``ahead``, with a limit: where the byte, and the one after it
 * (read past the chunk: the caller makes it readable), are not below the limit's first
 * two digits (with a one-digit limit: where the byte is above it); it only tells where
 * an item of the limit's length starts (its bytes all digits, at least two), so other
 * bytes may be set or not. */
typedef struct {
    uint64_t digits, ends, zeros, other;
    uint64_t ahead;
} masks;

/* The masks of the 64 bytes at ``q``, whose byte 64 is readable (SSE2, else one byte
 * at a time); ``digits``: the limit's length, 0 for none. ``checked``: the bytes are
 * known to be digits and commas only (a well-formed text), so only the commas and
 * ``ahead`` are looked for. */
static inline __attribute__((always_inline)) void classify(const uint8_t *q, masks *k,
                                                           const char *limit, int digits,
                                                           int checked) {
    uint64_t found_digits = 0, commas = 0, zeros = 0, ahead = 0;
#ifdef __SSE2__
    const __m128i below = _mm_set1_epi8('0' - 1);
    const __m128i over = _mm_set1_epi8('9' + 1);
    const __m128i comma = _mm_set1_epi8(',');
    const __m128i zero = _mm_set1_epi8('0');
    const __m128i first = _mm_set1_epi8(digits ? limit[0] : 0);
    const __m128i second = _mm_set1_epi8((char)(digits >= 2 ? limit[1] - 1 : 0));
    for (int part = 0; part < 4; part++) {
        __m128i block = _mm_loadu_si128((const __m128i *)(q + 16 * part));
        int shift = 16 * part;
        commas |= (uint64_t)(unsigned)_mm_movemask_epi8(_mm_cmpeq_epi8(block, comma)) << shift;
        if (digits) {
            /* Digits compare as the bytes they are (all below 0x80). */
            __m128i up = _mm_cmpgt_epi8(block, first);
            if (digits >= 2) {
                __m128i next = _mm_loadu_si128((const __m128i *)(q + 16 * part + 1));
                up = _mm_or_si128(up, _mm_and_si128(_mm_cmpeq_epi8(block, first),
                                                    _mm_cmpgt_epi8(next, second)));
            }
            ahead |= (uint64_t)(unsigned)_mm_movemask_epi8(up) << shift;
        }
        if (checked) {
            continue;
        }
        /* Bytes of 0x80 and above compare as negative: not digits. */
        __m128i d = _mm_and_si128(_mm_cmpgt_epi8(block, below), _mm_cmplt_epi8(block, over));
        found_digits |= (uint64_t)(unsigned)_mm_movemask_epi8(d) << shift;
        zeros |= (uint64_t)(unsigned)_mm_movemask_epi8(_mm_cmpeq_epi8(block, zero)) << shift;
    }
#else
    for (int i = 0; i < CHUNK; i++) {
        uint64_t bit = (uint64_t)1 << i;
        found_digits |= (uint8_t)(q[i] - '0') < 10 ? bit : 0;
        commas |= q[i] == ',' ? bit : 0;
        zeros |= q[i] == '0' ? bit : 0;
        if (digits) {
            uint8_t l0 = (uint8_t)limit[0];
            int up = q[i] > l0 || (digits >= 2 && q[i] == l0 && q[i + 1] >= (uint8_t)limit[1]);
            ahead |= up ? bit : 0;
        }
    }
#endif
    k->ends = commas;
    k->ahead = ahead;
    if (checked) {
        k->digits = ~commas;
        k->zeros = 0;
        k->other = 0;
        return;
    }
    k->digits = found_digits;
    k->zeros = zeros;
    k->other = ~(found_digits | commas);
}

#ifdef HAVE_AVX2_VERSION
/* classify's masks (never ``checked``), 32 bytes at a time. */
static inline __attribute__((target("avx2,popcnt,bmi"))) void
classify_avx2(const uint8_t *q, masks *k, const char *limit, int digits) {
    const __m256i below = _mm256_set1_epi8('0' - 1);
    const __m256i over = _mm256_set1_epi8('9' + 1);
    const __m256i comma = _mm256_set1_epi8(',');
    const __m256i zero = _mm256_set1_epi8('0');
    const __m256i first = _mm256_set1_epi8(digits ? limit[0] : 0);
    const __m256i second = _mm256_set1_epi8((char)(digits >= 2 ? limit[1] - 1 : 0));
    uint64_t found_digits = 0, commas = 0, zeros = 0, ahead = 0;
    for (int part = 0; part < 2; part++) {
        __m256i block = _mm256_loadu_si256((const __m256i *)(q + 32 * part));
        int shift = 32 * part;
        /* Bytes of 0x80 and above compare as negative: not digits. */
        __m256i d =
            _mm256_and_si256(_mm256_cmpgt_epi8(block, below), _mm256_cmpgt_epi8(over, block));
        found_digits |= (uint64_t)(uint32_t)_mm256_movemask_epi8(d) << shift;
        commas |= (uint64_t)(uint32_t)_mm256_movemask_epi8(_mm256_cmpeq_epi8(block, comma))
                  << shift;
        zeros |= (uint64_t)(uint32_t)_mm256_movemask_epi8(_mm256_cmpeq_epi8(block, zero)) << shift;
        if (digits) {
            __m256i up = _mm256_cmpgt_epi8(block, first);
            if (digits >= 2) {
                __m256i next = _mm256_loadu_si256((const __m256i *)(q + 32 * part + 1));
                up = _mm256_or_si256(up, _mm256_and_si256(_mm256_cmpeq_epi8(block, first),
                                                          _mm256_cmpgt_epi8(next, second)));
            }
            ahead |= (uint64_t)(uint32_t)_mm256_movemask_epi8(up) << shift;
        }
    }
    k->digits = found_digits;
    k->ends = commas;
    k->zeros = zeros;
    k->other = ~(found_digits | commas);
    k->ahead = ahead;
}
#endif

/* The chunks of the bytes between the brackets: ``p[0..m)``, ``p[m]`` being ']'. */
typedef struct {
    const uint8_t *p;
    Py_ssize_t m;
    Py_ssize_t at;        /* where the next chunk starts; past m once the last was given */
    uint64_t prev_ends;   /* the previous chunk's ends (the '[' before the first) */
    uint64_t prev_lead;   /* the previous chunk's zeros that start an item */
    uint64_t prev_ahead;  /* the previous chunk's ``ahead`` */
    const char *limit;    /* classify's ``limit`` and ``digits`` (0: none) */
    int digits;
    int checked;          /* classify's ``checked`` */
} chunks;

/* The last chunk, copied, and the one byte after it that classify reads; apart from
 * ``chunks``, whose address is then never taken, so that it can live in registers. */
typedef struct {
    uint8_t bytes[CHUNK + 1];
} padded;

static inline __attribute__((always_inline)) void
chunks_init(chunks *c, const uint8_t *p, Py_ssize_t m, const char *limit, int digits, int checked) {
    c->limit = limit;
    c->digits = digits;
    c->checked = checked;
    c->prev_ahead = 0;
    c->p = p;
    c->m = m;
    c->at = 0;
    c->prev_ends = (uint64_t)1 << 63; /* the '[' stands just before p[0] */
    c->prev_lead = 0;
}

/* The next chunk's masks, ``*at`` where it starts; 0 once every chunk was given.
 * ``avx``: the whole chunks are classified with AVX2 (only in a function compiled for
 * it, and never ``checked``). */
static inline __attribute__((always_inline)) int chunks_next(chunks *c, masks *k, Py_ssize_t *at,
                                                             padded *pad, const int avx) {
    Py_ssize_t left = c->m - c->at;
    if (left < 0) {
        return 0;
    }
    *at = c->at;
    if (left >= CHUNK) {
        /* The byte after the chunk, which classify reads, is at most p[m], the ']'. */
#ifdef HAVE_AVX2_VERSION
        if (avx) {
            classify_avx2(c->p + c->at, k, c->limit, c->digits);
        } else
#endif
        {
            (void)avx;
            classify(c->p + c->at, k, c->limit, c->digits, c->checked);
        }
        c->at += CHUNK;
        return 1;
    }
    /* The last chunk: the bytes left and the ']' (at bit ``left``), then padding. */
    memset(pad->bytes, 0, CHUNK + 1);
    memcpy(pad->bytes, c->p + c->at, (size_t)left + 1);
    classify(pad->bytes, k, c->limit, c->digits, c->checked);
    uint64_t bracket = (uint64_t)1 << left;
    uint64_t inside = bracket | (bracket - 1);
    k->ends |= bracket;
    k->digits &= inside & ~bracket;
    k->other &= inside & ~bracket;
    c->at = c->m + 1;
    return 1;
}

/* The chunk's masks become the previous chunk's. */
static inline __attribute__((always_inline)) void chunks_keep(chunks *c, const masks *k) {
    c->prev_ends = k->ends;
    c->prev_ahead = k->ahead;
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

/* ``x``'s bits as they stand ``width`` (1..63) places later, the previous chunk's
 * (``prev``) carried in: at an item's end, the mask of its first byte when ``width`` is
 * its length. */
static inline __attribute__((always_inline)) uint64_t later(uint64_t x, uint64_t prev, int width) {
    return (x << width) | (prev >> (64 - width));
}

/* Whether an item ending in this chunk has as many digits as the limit (``digits``,
 * 1..MAX_DIGITS) and more than it, or more digits; ``at`` is where the chunk starts in
 * ``p``, whose bytes run to ``p[c->m]`` (the ']'). An item of the limit's length can be
 * over it only where its first two digits are not below the limit's (``ahead``): only
 * those are compared whole. */
static inline __attribute__((always_inline)) int reach(const chunks *c, const masks *k,
                                                       const uint8_t *p, Py_ssize_t at,
                                                       const char *limit, int digits,
                                                       uint64_t limit_key) {
    /* An end within ``digits`` bytes after the previous: an item shorter than the
     * limit; none within ``digits + 1``: one longer, beyond it. */
    uint64_t exact = k->ends & ~near(c, k, digits);
    if ((exact & ~behind(c, k, digits + 1)) != 0) {
        return 1;
    }
    uint64_t maybe = exact & later(k->ahead, c->prev_ahead, digits);
    while (maybe) {
        Py_ssize_t start = at + __builtin_ctzll(maybe) - digits;
        if (above_limit(p + start, start + 8 <= c->m + 1, limit, digits, limit_key)) {
            return 1;
        }
        maybe &= maybe - 1;
    }
    return 0;
}

/* How many items ``p[0..m)`` holds when the array ``[p]`` is well-formed; -1 when not.
 * With a ``limit`` (bound - 1 in decimal, ``digits`` long; 0 digits: none),
 * ``*reaches`` tells in the same pass whether some id is at or above the bound.
 * ``avx``: the AVX2 loop (inlined only into a function compiled for it); ``digits`` a
 * constant where inlined, so that the shifts of ``reach`` are. */
static inline __attribute__((always_inline)) Py_ssize_t
scan(const uint8_t *s, Py_ssize_t n, const char *limit, const int digits, int *reaches,
     const int avx) {
    if (n < 3 || s[0] != '[' || s[n - 1] != ']') {
        return -1;
    }
    uint64_t limit_key = digits >= 1 && digits <= 8 ? key_of((const uint8_t *)limit, digits, 0) : 0;
    chunks c;
    masks k;
    Py_ssize_t at, count = 0;
    int found = 0;
    chunks_init(&c, s + 1, n - 2, limit, digits, 0);
    padded pad;
    while (chunks_next(&c, &k, &at, &pad, avx)) {
        uint64_t bad = k.other | (k.ends & starts(&c, &k)) | led(&c, &k);
        /* Until some id reaches the limit, none ending here is longer than it (at most
         * 10 digits): none is longer than MAX_DIGITS either. */
        int unchecked = 1;
        if (digits >= 1 && !found) {
            found = reach(&c, &k, s + 1, at, limit, digits, limit_key);
            unchecked = found;
        }
        if (unchecked) {
            /* An end in each 8 bytes, and in the previous chunk's last 8: every item
             * ending here is shorter than 16 digits (the usual case, at less cost). */
            uint64_t eights = k.ends | (k.ends >> 4);
            eights |= eights >> 2;
            eights |= eights >> 1;
            int dense = (eights & 0x0101010101010101ULL) == 0x0101010101010101ULL &&
                        (c.prev_ends >> 56) != 0;
            bad |= dense ? 0 : k.ends & ~near(&c, &k, MAX_DIGITS + 1);
        }
        if (bad != 0) {
            return -1;
        }
        count += avx ? __builtin_popcountll(k.ends) : popcount(k.ends);
        chunks_keep(&c, &k);
    }
    *reaches = found;
    return count;
}

/* scan for each limit length a bound up to 2**31 has (1..10 digits), and none. */
#define SCAN_BY_DIGITS(avx)                                                                    \
    switch (digits) {                                                                          \
    case 0: return scan(s, n, NULL, 0, reaches, avx);                                          \
    case 1: return scan(s, n, limit, 1, reaches, avx);                                         \
    case 2: return scan(s, n, limit, 2, reaches, avx);                                         \
    case 3: return scan(s, n, limit, 3, reaches, avx);                                         \
    case 4: return scan(s, n, limit, 4, reaches, avx);                                         \
    case 5: return scan(s, n, limit, 5, reaches, avx);                                         \
    case 6: return scan(s, n, limit, 6, reaches, avx);                                         \
    case 7: return scan(s, n, limit, 7, reaches, avx);                                         \
    case 8: return scan(s, n, limit, 8, reaches, avx);                                         \
    case 9: return scan(s, n, limit, 9, reaches, avx);                                         \
    default: return scan(s, n, limit, 10, reaches, avx);                                       \
    }

typedef Py_ssize_t (*well_formed_fn)(const uint8_t *, Py_ssize_t, const char *, int, int *);

/* scan's SSE2 (else scalar) loop. ``digits``: 0..10 (limit_of's). */
static Py_ssize_t well_formed_portable(const uint8_t *s, Py_ssize_t n, const char *limit,
                                       int digits, int *reaches) {
    SCAN_BY_DIGITS(0)
}

#ifdef HAVE_AVX2_VERSION
/* scan's AVX2 loop. */
__attribute__((target("avx2,popcnt,bmi,bmi2"))) static Py_ssize_t
well_formed_avx2(const uint8_t *s, Py_ssize_t n, const char *limit, int digits, int *reaches) {
    SCAN_BY_DIGITS(1)
}
#endif

/* The loop the CPU runs best, chosen once at import (PyInit__ids); nothing else global
 * is written. */
static well_formed_fn well_formed = well_formed_portable;

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
    chunks_init(&c, p, n - 2, limit, digits, checked);
    padded pad;
    while (chunks_next(&c, &k, &at, &pad, 0)) {
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
        chunks_keep(&c, &k);
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

/* ``span[i..n)`` without the space after each comma, appended to ``out[0..k)`` (``k``
 * at most ``i``: ``out``, of ``n`` bytes, holds the byte written at ``k`` before ``k``
 * moves past it); 0 when a space stands anywhere else (first in the span, or after
 * anything but a comma). One byte at a time, without a branch on the byte: ``out[k]``
 * is written every time and kept only when it is not a space. ``*out_n``: the bytes
 * ``out`` holds. */
static int compact_from(const uint8_t *span, Py_ssize_t n, Py_ssize_t i, uint8_t *out,
                        Py_ssize_t k, Py_ssize_t *out_n) {
    int bad = 0;
    uint8_t prev = i > 0 ? span[i - 1] : 0;
    for (; i < n; i++) {
        uint8_t ch = span[i];
        int space = ch == ' ';
        out[k] = ch;
        bad |= space & (prev != ',');
        k += !space;
        prev = ch;
    }
    *out_n = k;
    return !bad;
}

typedef int (*compact_fn)(const uint8_t *, Py_ssize_t, uint8_t *, Py_ssize_t *);

/* The span compacted 64 bytes at a time (SSE2; else compact_from throughout): the
 * spaces and commas as masks, a space bad unless a comma is just before it (the
 * previous chunk's last byte carried in; none before the first), and the runs between
 * the spaces copied 16 bytes at a time. A run starts at or after the chunk and ends at
 * its end at the latest, so the copies read at most 15 bytes past the chunk and write
 * at most 15 past the run's place in ``out`` (at most the run's in ``span``): hence
 * only while 16 bytes follow the chunk; the rest is compact_from's. */
static int compact_portable(const uint8_t *span, Py_ssize_t n, uint8_t *out, Py_ssize_t *out_n) {
    Py_ssize_t i = 0, k = 0;
    uint64_t bad = 0;
#ifdef __SSE2__
    const __m128i space = _mm_set1_epi8(' ');
    const __m128i comma = _mm_set1_epi8(',');
    uint64_t carry = 0;
    for (; i + CHUNK + 16 <= n; i += CHUNK) {
        uint64_t spaces = 0, commas = 0;
        for (int part = 0; part < 4; part++) {
            __m128i block = _mm_loadu_si128((const __m128i *)(span + i + 16 * part));
            int shift = 16 * part;
            spaces |= (uint64_t)(unsigned)_mm_movemask_epi8(_mm_cmpeq_epi8(block, space))
                      << shift;
            commas |= (uint64_t)(unsigned)_mm_movemask_epi8(_mm_cmpeq_epi8(block, comma))
                      << shift;
        }
        bad |= spaces & ~((commas << 1) | carry);
        carry = commas >> 63;
        Py_ssize_t from = i;
        for (;;) {
            Py_ssize_t to = spaces ? i + __builtin_ctzll(spaces) : i + CHUNK;
            for (Py_ssize_t at = from; at < to; at += 16) {
                _mm_storeu_si128((__m128i *)(out + k + (at - from)),
                                 _mm_loadu_si128((const __m128i *)(span + at)));
            }
            k += to - from;
            if (!spaces) {
                break;
            }
            from = to + 1;
            spaces &= spaces - 1;
        }
    }
#endif
    return compact_from(span, n, i, out, k, out_n) && bad == 0;
}

#ifdef HAVE_AVX2_VERSION
/* For each set of spaces among 8 bytes (bit j: byte j is one), the shuffle that packs
 * the other bytes to the front in order (their places, then 0x80: a zero byte). */
static const uint64_t SQUEEZE[256] = {
    0x0706050403020100ULL, 0x8007060504030201ULL, 0x8007060504030200ULL, 0x8080070605040302ULL,
    0x8007060504030100ULL, 0x8080070605040301ULL, 0x8080070605040300ULL, 0x8080800706050403ULL,
    0x8007060504020100ULL, 0x8080070605040201ULL, 0x8080070605040200ULL, 0x8080800706050402ULL,
    0x8080070605040100ULL, 0x8080800706050401ULL, 0x8080800706050400ULL, 0x8080808007060504ULL,
    0x8007060503020100ULL, 0x8080070605030201ULL, 0x8080070605030200ULL, 0x8080800706050302ULL,
    0x8080070605030100ULL, 0x8080800706050301ULL, 0x8080800706050300ULL, 0x8080808007060503ULL,
    0x8080070605020100ULL, 0x8080800706050201ULL, 0x8080800706050200ULL, 0x8080808007060502ULL,
    0x8080800706050100ULL, 0x8080808007060501ULL, 0x8080808007060500ULL, 0x8080808080070605ULL,
    0x8007060403020100ULL, 0x8080070604030201ULL, 0x8080070604030200ULL, 0x8080800706040302ULL,
    0x8080070604030100ULL, 0x8080800706040301ULL, 0x8080800706040300ULL, 0x8080808007060403ULL,
    0x8080070604020100ULL, 0x8080800706040201ULL, 0x8080800706040200ULL, 0x8080808007060402ULL,
    0x8080800706040100ULL, 0x8080808007060401ULL, 0x8080808007060400ULL, 0x8080808080070604ULL,
    0x8080070603020100ULL, 0x8080800706030201ULL, 0x8080800706030200ULL, 0x8080808007060302ULL,
    0x8080800706030100ULL, 0x8080808007060301ULL, 0x8080808007060300ULL, 0x8080808080070603ULL,
    0x8080800706020100ULL, 0x8080808007060201ULL, 0x8080808007060200ULL, 0x8080808080070602ULL,
    0x8080808007060100ULL, 0x8080808080070601ULL, 0x8080808080070600ULL, 0x8080808080800706ULL,
    0x8007050403020100ULL, 0x8080070504030201ULL, 0x8080070504030200ULL, 0x8080800705040302ULL,
    0x8080070504030100ULL, 0x8080800705040301ULL, 0x8080800705040300ULL, 0x8080808007050403ULL,
    0x8080070504020100ULL, 0x8080800705040201ULL, 0x8080800705040200ULL, 0x8080808007050402ULL,
    0x8080800705040100ULL, 0x8080808007050401ULL, 0x8080808007050400ULL, 0x8080808080070504ULL,
    0x8080070503020100ULL, 0x8080800705030201ULL, 0x8080800705030200ULL, 0x8080808007050302ULL,
    0x8080800705030100ULL, 0x8080808007050301ULL, 0x8080808007050300ULL, 0x8080808080070503ULL,
    0x8080800705020100ULL, 0x8080808007050201ULL, 0x8080808007050200ULL, 0x8080808080070502ULL,
    0x8080808007050100ULL, 0x8080808080070501ULL, 0x8080808080070500ULL, 0x8080808080800705ULL,
    0x8080070403020100ULL, 0x8080800704030201ULL, 0x8080800704030200ULL, 0x8080808007040302ULL,
    0x8080800704030100ULL, 0x8080808007040301ULL, 0x8080808007040300ULL, 0x8080808080070403ULL,
    0x8080800704020100ULL, 0x8080808007040201ULL, 0x8080808007040200ULL, 0x8080808080070402ULL,
    0x8080808007040100ULL, 0x8080808080070401ULL, 0x8080808080070400ULL, 0x8080808080800704ULL,
    0x8080800703020100ULL, 0x8080808007030201ULL, 0x8080808007030200ULL, 0x8080808080070302ULL,
    0x8080808007030100ULL, 0x8080808080070301ULL, 0x8080808080070300ULL, 0x8080808080800703ULL,
    0x8080808007020100ULL, 0x8080808080070201ULL, 0x8080808080070200ULL, 0x8080808080800702ULL,
    0x8080808080070100ULL, 0x8080808080800701ULL, 0x8080808080800700ULL, 0x8080808080808007ULL,
    0x8006050403020100ULL, 0x8080060504030201ULL, 0x8080060504030200ULL, 0x8080800605040302ULL,
    0x8080060504030100ULL, 0x8080800605040301ULL, 0x8080800605040300ULL, 0x8080808006050403ULL,
    0x8080060504020100ULL, 0x8080800605040201ULL, 0x8080800605040200ULL, 0x8080808006050402ULL,
    0x8080800605040100ULL, 0x8080808006050401ULL, 0x8080808006050400ULL, 0x8080808080060504ULL,
    0x8080060503020100ULL, 0x8080800605030201ULL, 0x8080800605030200ULL, 0x8080808006050302ULL,
    0x8080800605030100ULL, 0x8080808006050301ULL, 0x8080808006050300ULL, 0x8080808080060503ULL,
    0x8080800605020100ULL, 0x8080808006050201ULL, 0x8080808006050200ULL, 0x8080808080060502ULL,
    0x8080808006050100ULL, 0x8080808080060501ULL, 0x8080808080060500ULL, 0x8080808080800605ULL,
    0x8080060403020100ULL, 0x8080800604030201ULL, 0x8080800604030200ULL, 0x8080808006040302ULL,
    0x8080800604030100ULL, 0x8080808006040301ULL, 0x8080808006040300ULL, 0x8080808080060403ULL,
    0x8080800604020100ULL, 0x8080808006040201ULL, 0x8080808006040200ULL, 0x8080808080060402ULL,
    0x8080808006040100ULL, 0x8080808080060401ULL, 0x8080808080060400ULL, 0x8080808080800604ULL,
    0x8080800603020100ULL, 0x8080808006030201ULL, 0x8080808006030200ULL, 0x8080808080060302ULL,
    0x8080808006030100ULL, 0x8080808080060301ULL, 0x8080808080060300ULL, 0x8080808080800603ULL,
    0x8080808006020100ULL, 0x8080808080060201ULL, 0x8080808080060200ULL, 0x8080808080800602ULL,
    0x8080808080060100ULL, 0x8080808080800601ULL, 0x8080808080800600ULL, 0x8080808080808006ULL,
    0x8080050403020100ULL, 0x8080800504030201ULL, 0x8080800504030200ULL, 0x8080808005040302ULL,
    0x8080800504030100ULL, 0x8080808005040301ULL, 0x8080808005040300ULL, 0x8080808080050403ULL,
    0x8080800504020100ULL, 0x8080808005040201ULL, 0x8080808005040200ULL, 0x8080808080050402ULL,
    0x8080808005040100ULL, 0x8080808080050401ULL, 0x8080808080050400ULL, 0x8080808080800504ULL,
    0x8080800503020100ULL, 0x8080808005030201ULL, 0x8080808005030200ULL, 0x8080808080050302ULL,
    0x8080808005030100ULL, 0x8080808080050301ULL, 0x8080808080050300ULL, 0x8080808080800503ULL,
    0x8080808005020100ULL, 0x8080808080050201ULL, 0x8080808080050200ULL, 0x8080808080800502ULL,
    0x8080808080050100ULL, 0x8080808080800501ULL, 0x8080808080800500ULL, 0x8080808080808005ULL,
    0x8080800403020100ULL, 0x8080808004030201ULL, 0x8080808004030200ULL, 0x8080808080040302ULL,
    0x8080808004030100ULL, 0x8080808080040301ULL, 0x8080808080040300ULL, 0x8080808080800403ULL,
    0x8080808004020100ULL, 0x8080808080040201ULL, 0x8080808080040200ULL, 0x8080808080800402ULL,
    0x8080808080040100ULL, 0x8080808080800401ULL, 0x8080808080800400ULL, 0x8080808080808004ULL,
    0x8080808003020100ULL, 0x8080808080030201ULL, 0x8080808080030200ULL, 0x8080808080800302ULL,
    0x8080808080030100ULL, 0x8080808080800301ULL, 0x8080808080800300ULL, 0x8080808080808003ULL,
    0x8080808080020100ULL, 0x8080808080800201ULL, 0x8080808080800200ULL, 0x8080808080808002ULL,
    0x8080808080800100ULL, 0x8080808080808001ULL, 0x8080808080808000ULL, 0x8080808080808080ULL,
};

/* Each place of the high half's shuffle moved up 8 (0x80 stays above 0x7F: a zero). */
#define HIGH_HALF 0x0808080808080808ULL

/* The span compacted 16 bytes at a time: a space must have a comma just before it (the previous
 * block's last byte carried in; none before the first), and the block's two halves are
 * packed by SQUEEZE and stored 8 bytes each at ``k``; ``k`` is at most the block's
 * start, so each store ends inside the block's bytes of ``out`` (whole blocks only:
 * the rest is compact_from's). */
__attribute__((target("avx2,popcnt,bmi,bmi2"))) static int
compact_avx2(const uint8_t *span, Py_ssize_t n, uint8_t *out, Py_ssize_t *out_n) {
    const __m256i space = _mm256_set1_epi8(' ');
    const __m256i comma = _mm256_set1_epi8(',');
    uint64_t carry = 0, bad = 0;
    Py_ssize_t i = 0, k = 0;
    for (; i + CHUNK <= n; i += CHUNK) {
        __m256i first = _mm256_loadu_si256((const __m256i *)(span + i));
        __m256i second = _mm256_loadu_si256((const __m256i *)(span + i + 32));
        uint64_t spaces =
            (uint64_t)(uint32_t)_mm256_movemask_epi8(_mm256_cmpeq_epi8(first, space)) |
            (uint64_t)(uint32_t)_mm256_movemask_epi8(_mm256_cmpeq_epi8(second, space)) << 32;
        uint64_t commas =
            (uint64_t)(uint32_t)_mm256_movemask_epi8(_mm256_cmpeq_epi8(first, comma)) |
            (uint64_t)(uint32_t)_mm256_movemask_epi8(_mm256_cmpeq_epi8(second, comma)) << 32;
        bad |= spaces & ~((commas << 1) | carry);
        carry = commas >> 63;
        for (int part = 0; part < 4; part++) {
            __m128i block = _mm_loadu_si128((const __m128i *)(span + i + 16 * part));
            uint32_t lo = (uint32_t)(spaces >> (16 * part)) & 0xFF;
            uint32_t hi = (uint32_t)(spaces >> (16 * part + 8)) & 0xFF;
            __m128i order =
                _mm_set_epi64x((long long)(SQUEEZE[hi] + HIGH_HALF), (long long)SQUEEZE[lo]);
            __m128i packed = _mm_shuffle_epi8(block, order);
            _mm_storel_epi64((__m128i *)(out + k), packed);
            k += 8 - __builtin_popcount(lo);
            _mm_storeh_pi((__m64 *)(void *)(out + k), _mm_castsi128_ps(packed));
            k += 8 - __builtin_popcount(hi);
        }
    }
    return compact_from(span, n, i, out, k, out_n) && bad == 0;
}
#endif

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

/* Whether ``arg``'s bytes can never change: a bytes object, or a memoryview of one (its
 * memory is the bytes' own). Such a span is its own text: no copy of it is made. */
static int immutable(PyObject *arg) {
    if (PyBytes_CheckExact(arg)) {
        return 1;
    }
    if (!PyMemoryView_Check(arg)) {
        return 0;
    }
    PyObject *base = PyMemoryView_GET_BASE(arg);
    return base != NULL && PyBytes_CheckExact(base);
}

static PyObject *ids_read(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs < 1 || nargs > 3) {
        PyErr_SetString(PyExc_TypeError,
                        "read(span, bound=None, portable=False) takes 1 to 3 arguments");
        return NULL;
    }
    char limit_text[24];
    const char *limit = NULL;
    int digits = 0, reaches = 0;
    if (nargs >= 2 && args[1] != Py_None) {
        if ((digits = limit_of(args[1], limit_text)) < 0) {
            return NULL;
        }
        limit = limit_text;
    }
    int portable = nargs == 3 ? PyObject_IsTrue(args[2]) : 0;
    if (portable < 0) {
        return NULL;
    }
    well_formed_fn run = portable ? well_formed_portable : well_formed;
    PyObject *arg = args[0];
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0) {
        return NULL;
    }
    const uint8_t *span = (const uint8_t *)view.buf;
    Py_ssize_t n = view.len;
    PyObject *text = NULL;
    int failed = 0;
    /* A space is neither digit nor comma: a span holding one is not well-formed as it
     * is, and compacting a span without one leaves it as it is. So the span is read as
     * it is first, and compacted only when that fails and a space is there. */
    Py_ssize_t count = run(span, n, limit, digits, &reaches);
    if (count >= 0) {
        text = immutable(arg) ? Py_NewRef(arg)
                              : PyBytes_FromStringAndSize((const char *)span, n);
        failed = text == NULL;
    } else if (memchr(span, ' ', (size_t)n) != NULL) {
        /* Compacted straight into the text's bytes, which then shrink to fit. */
        compact_fn squeeze = compact_portable;
#ifdef HAVE_AVX2_VERSION
        if (run == well_formed_avx2) {
            squeeze = compact_avx2;
        }
#endif
        PyObject *out = PyBytes_FromStringAndSize(NULL, n);
        Py_ssize_t k = 0;
        if (out == NULL) {
            failed = 1;
        } else if (squeeze(span, n, (uint8_t *)PyBytes_AS_STRING(out), &k) &&
                   (count = run((const uint8_t *)PyBytes_AS_STRING(out), k, limit, digits,
                                &reaches)) >= 0) {
            failed = _PyBytes_Resize(&out, k) < 0;
            text = out;
        } else {
            Py_DECREF(out);
        }
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

/* The loop ``read`` runs on this CPU. */
static PyObject *implementation(PyObject *self, PyObject *unused) {
    (void)self;
    (void)unused;
#ifdef HAVE_AVX2_VERSION
    if (well_formed == well_formed_avx2) {
        return PyUnicode_FromString("avx2");
    }
#endif
#ifdef __SSE2__
    return PyUnicode_FromString("sse2");
#else
    return PyUnicode_FromString("scalar");
#endif
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
     "read(span, bound=None, portable=False) -> (count, text[, below]) | None: the ids "
     "of a well-formed "
     "array (``below``: every id is below ``bound``)."},
    {"implementation", implementation, METH_NOARGS, "The loop read runs on this CPU."},
    {"fault", (PyCFunction)(void (*)(void))ids_fault, METH_FASTCALL,
     "fault(text, bound, checked=False) -> None | (malformed, index, value) | "
     "NotImplemented: why the ids are not valid (``checked``: text is read's)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_ids", "Token ids checked in one pass (ext_proc/core/ids.py).",
    0, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__ids(void) {
#ifdef HAVE_AVX2_VERSION
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("popcnt") &&
        __builtin_cpu_supports("bmi") && __builtin_cpu_supports("bmi2")) {
        well_formed = well_formed_avx2;
    }
#endif
    return PyModuleDef_Init(&module);
}
