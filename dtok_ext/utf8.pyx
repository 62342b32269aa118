"""A str's UTF-8, written once, where every encoder finds it.

Every encoder dtok calls (fastokens, gigatoken, tokenizers) reads a str as UTF-8 through
``PyUnicode_AsUTF8AndSize``, which for a non-ASCII str encodes it with CPython's per-character
loop and keeps the result on the str object. On 1M characters of prose in a two-byte str that
loop took ~0.5 ms, a fifth of fastokens' whole encode. :func:`cache_utf8` writes the same bytes
with vector loops (a block of plain ASCII is one narrowing copy) and without the GIL, and leaves
them where CPython keeps its own (the str's ``utf8`` field); the encoders then read them as if
CPython had made them. It declines (returns False, the str untouched) wherever that is not
provably what CPython would do itself: a str that is ASCII (its UTF-8 is its buffer), not of
the exact type str, not compact, already holding its UTF-8, holding a surrogate (CPython
raises: the encoder reports it as before), a free-threaded build, or a process whose ``PyMem``
and ``PyObject`` allocators differ (debug hooks, tracemalloc): CPython frees the bytes with the
one of the two its version uses, so both must be the same allocator.
"""
from dtok_ext.unicode_text cimport Py_UCS1, Py_UCS2, UText, utext_of

cdef extern from "Python.h":
    bint PyUnicode_IS_ASCII(object u)
    bint PyUnicode_IS_COMPACT(object u)
    void* PyMem_Malloc(size_t n) nogil
    void PyMem_Free(void* p)
    void* PyMem_Realloc(void* p, size_t n)

cdef extern from *:
    """
    #include <string.h>
    #ifdef Py_GIL_DISABLED
    #define DTOK_UTF8_CACHE_BUILD 0
    #else
    #define DTOK_UTF8_CACHE_BUILD 1
    #endif

    /* The allocators of the PyMem and PyObject domains are one and the same. */
    static int dtok_same_allocators(void) {
        PyMemAllocatorEx mem, obj;
        PyMem_GetAllocator(PYMEM_DOMAIN_MEM, &mem);
        PyMem_GetAllocator(PYMEM_DOMAIN_OBJ, &obj);
        return mem.ctx == obj.ctx && mem.malloc == obj.malloc && mem.calloc == obj.calloc
            && mem.realloc == obj.realloc && mem.free == obj.free;
    }

    static int dtok_utf8_is_empty(PyObject* s) {
        return ((PyCompactUnicodeObject*)s)->utf8 == NULL;
    }

    static void dtok_utf8_set(PyObject* s, char* buf, Py_ssize_t n) {
        ((PyCompactUnicodeObject*)s)->utf8 = buf;
        ((PyCompactUnicodeObject*)s)->utf8_length = n;
    }

    /* How many of the 16 characters at p lead below U+0080 (0..16); those are written to out
       as bytes (16 bytes are stored: the caller leaves room). SSE2 (every x86-64) where there
       is one, else plain loops. */
    #if defined(__GNUC__) || defined(__clang__)
    #define DTOK_CTZ(x) __builtin_ctz(x)
    #else
    static inline int DTOK_CTZ(unsigned int x) { int k = 0; while (!(x & 1u)) { x >>= 1; k++; } return k; }
    #endif
    #ifdef __SSE2__
    #include <emmintrin.h>
    static inline int dtok_leading(unsigned int non_ascii) {  /* one bit a character */
        return non_ascii ? DTOK_CTZ(non_ascii) : 16;
    }
    static inline int dtok_ascii16_1(const Py_UCS1* p, char* out) {
        __m128i v = _mm_loadu_si128((const __m128i*)p);
        _mm_storeu_si128((__m128i*)out, v);
        return dtok_leading((unsigned int)_mm_movemask_epi8(v));
    }
    static inline int dtok_ascii16_2(const Py_UCS2* p, char* out) {
        __m128i a = _mm_loadu_si128((const __m128i*)p), b = _mm_loadu_si128((const __m128i*)(p + 8));
        __m128i high = _mm_set1_epi16((short)0xFF80), zero = _mm_setzero_si128();
        /* packus reads the units as signed: only the ASCII lanes' bytes are kept */
        _mm_storeu_si128((__m128i*)out, _mm_packus_epi16(a, b));
        __m128i ascii = _mm_packs_epi16(_mm_cmpeq_epi16(_mm_and_si128(a, high), zero),
                                        _mm_cmpeq_epi16(_mm_and_si128(b, high), zero));
        return dtok_leading(~(unsigned int)_mm_movemask_epi8(ascii) & 0xFFFFu);
    }
    static inline int dtok_ascii16_4(const Py_UCS4* p, char* out) {
        __m128i a = _mm_loadu_si128((const __m128i*)p), b = _mm_loadu_si128((const __m128i*)(p + 4));
        __m128i c = _mm_loadu_si128((const __m128i*)(p + 8)), d = _mm_loadu_si128((const __m128i*)(p + 12));
        /* saturating packs map every code point >= 0x80 (at most 0x10FFFF) to a byte >= 0x80 */
        __m128i v = _mm_packus_epi16(_mm_packs_epi32(a, b), _mm_packs_epi32(c, d));
        _mm_storeu_si128((__m128i*)out, v);
        return dtok_leading((unsigned int)_mm_movemask_epi8(v));
    }
    #else
    #define DTOK_ASCII16(NAME, T)                                                          \
        static inline int NAME(const T* p, char* out) {                                    \
            int j = 0;                                                                     \
            for (; j < 16 && p[j] < 0x80u; j++) out[j] = (char)p[j];                       \
            return j;                                                                      \
        }
    DTOK_ASCII16(dtok_ascii16_1, Py_UCS1)
    DTOK_ASCII16(dtok_ascii16_2, Py_UCS2)
    DTOK_ASCII16(dtok_ascii16_4, Py_UCS4)
    #endif

    /* p[0..n) as UTF-8 at out (room for 4 bytes a character, or as many as the width can
       need); returns the end, or NULL at a surrogate (CPython's strict encoder raises). ASCII
       goes 16 characters at a time, up to the next other character; a run of others goes one
       by one, back to the vector step at the next ASCII character (until the last 16).
       With `flags`: also NULL at the first character c >= U+0080 whose flags[c] has a bit of
       `refuse` or lacks one of `need` (the caller vouches for the ASCII ones), so that one
       pass both checks a text's characters and writes its UTF-8. */
    #define DTOK_UTF8_WRITE(NAME, T, ASCII16)                                              \
        static char* NAME(const T* p, Py_ssize_t n, char* out, const unsigned char* flags,  \
                          unsigned char refuse, unsigned char need) {                      \
            Py_ssize_t i = 0;                                                              \
            while (i < n) {                                                                \
                if (i + 16 <= n) {                                                         \
                    int k = ASCII16(p + i, out);                                           \
                    i += k;                                                                \
                    out += k;                                                              \
                    if (k == 16)                                                           \
                        continue;                                                          \
                }                                                                          \
                for (; i < n; i++) {                                                       \
                    unsigned int c = p[i];                                                 \
                    if (c < 0x80u) {                                                       \
                        if (i + 16 <= n)                                                   \
                            break;                                                         \
                        *out++ = (char)c;                                                  \
                    } else if (flags && ((flags[c] & refuse) || (flags[c] & need) != need)) {  \
                        return NULL;                                                       \
                    } else if (c < 0x800u) {                                               \
                        *out++ = (char)(0xC0u | (c >> 6));                                 \
                        *out++ = (char)(0x80u | (c & 0x3Fu));                              \
                    } else if (c < 0x10000u) {                                             \
                        if (c - 0xD800u < 0x800u) return NULL;                             \
                        *out++ = (char)(0xE0u | (c >> 12));                                \
                        *out++ = (char)(0x80u | ((c >> 6) & 0x3Fu));                       \
                        *out++ = (char)(0x80u | (c & 0x3Fu));                              \
                    } else {                                                               \
                        *out++ = (char)(0xF0u | (c >> 18));                                \
                        *out++ = (char)(0x80u | ((c >> 12) & 0x3Fu));                      \
                        *out++ = (char)(0x80u | ((c >> 6) & 0x3Fu));                       \
                        *out++ = (char)(0x80u | (c & 0x3Fu));                              \
                    }                                                                      \
                }                                                                          \
            }                                                                              \
            return out;                                                                    \
        }
    DTOK_UTF8_WRITE(dtok_utf8_write_1, Py_UCS1, dtok_ascii16_1)
    DTOK_UTF8_WRITE(dtok_utf8_write_2, Py_UCS2, dtok_ascii16_2)
    DTOK_UTF8_WRITE(dtok_utf8_write_4, Py_UCS4, dtok_ascii16_4)
    """
    int DTOK_UTF8_CACHE_BUILD
    bint dtok_same_allocators()
    bint dtok_utf8_is_empty(object s)
    void dtok_utf8_set(object s, char* buf, Py_ssize_t n)
    char* dtok_utf8_write_1(const Py_UCS1* p, Py_ssize_t n, char* out, const unsigned char* flags,
                            unsigned char refuse, unsigned char need) noexcept nogil
    char* dtok_utf8_write_2(const Py_UCS2* p, Py_ssize_t n, char* out, const unsigned char* flags,
                            unsigned char refuse, unsigned char need) noexcept nogil
    char* dtok_utf8_write_4(const Py_UCS4* p, Py_ssize_t n, char* out, const unsigned char* flags,
                            unsigned char refuse, unsigned char need) noexcept nogil

# Below this many characters the work is CPython's own (the call costs more than it saves).
MIN_CHARS = 4096


def available() -> bool:
    """Whether :func:`cache_utf8` may write a str's UTF-8 in this process (see the module
    docstring); read at each call, as debug hooks or tracemalloc may come and go."""
    return bool(DTOK_UTF8_CACHE_BUILD) and dtok_same_allocators()


def cache_utf8(text) -> bool:
    """Leave ``text``'s UTF-8 on the str as CPython itself would (``PyUnicode_AsUTF8AndSize``
    then returns those bytes, without encoding again); True if written here, False where
    declined (see the module docstring).

    >>> s = "“quoted” " * 1000
    >>> cache_utf8(s), cache_utf8(s)  # written once; then the str has its UTF-8
    (True, False)
    """
    return type(text) is str and _cache(<str>text)


def cache_utf8_each(list texts not None) -> int:
    """:func:`cache_utf8` of each str of ``texts`` (one encoder call's); how many were written."""
    return sum([cache_utf8(text) for text in texts])


cdef bint cache_utf8_if_clean(str text, const unsigned char* flags, unsigned char refuse,
                              unsigned char need) noexcept:
    """:func:`cache_utf8`, checking in the same pass that no character c >= U+0080 has a bit of
    ``refuse`` in ``flags[c]`` nor lacks one of ``need`` (the caller has checked the ASCII
    ones): True when written, False when declined or at the first such character (then
    nothing is left on the str). For ``CutRules.route``: one pass over a text that goes to a
    fast encoder instead of a scan and then the writing."""
    return _cache(text, flags, refuse, need)


cdef bint _cache(str text, const unsigned char* flags=NULL, unsigned char refuse=0,
                 unsigned char need=0) noexcept:
    cdef UText t
    cdef Py_ssize_t n
    cdef char* buf
    cdef char* shrunk
    cdef char* end
    if len(text) < MIN_CHARS or not DTOK_UTF8_CACHE_BUILD or PyUnicode_IS_ASCII(text) \
            or not PyUnicode_IS_COMPACT(text) or not dtok_utf8_is_empty(text) \
            or not dtok_same_allocators():
        return False
    t = utext_of(text)
    buf = <char*>PyMem_Malloc(t.length * (t.kind + (t.kind < 4)) + 1)  # 2, 3 or 4 per char
    if buf == NULL:
        return False
    with nogil:
        if t.kind == 1:
            end = dtok_utf8_write_1(<const Py_UCS1*>t.data, t.length, buf, flags, refuse, need)
        elif t.kind == 2:
            end = dtok_utf8_write_2(<const Py_UCS2*>t.data, t.length, buf, flags, refuse, need)
        else:
            end = dtok_utf8_write_4(<const Py_UCS4*>t.data, t.length, buf, flags, refuse, need)
    if end == NULL or not dtok_utf8_is_empty(text):
        # a surrogate (CPython raises, and the encoder reports it), a flagged character, or
        # another thread's encoder made the UTF-8 meanwhile
        PyMem_Free(buf)
        return False
    n = end - buf
    end[0] = 0
    shrunk = <char*>PyMem_Realloc(buf, n + 1)
    dtok_utf8_set(text, shrunk if shrunk != NULL else buf, n)
    return True
