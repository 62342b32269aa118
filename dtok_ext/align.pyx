"""Where a stored text and a new one agree: their common prefix, and the stretches of the stored
text that reappear, in order, later in the new one (a removed think block, a truncated tool
output, an inserted turn).

Nothing here decides safety or IDs: these are string facts (every reported stretch is equal
character for character in both texts), found at memory speed. :mod:`dtok.repair` turns them
into reused ID slices, with seams checked as safe cuts.

Stretches are found the way rsync finds blocks: positions of the stored text (a regular grid)
each give a probe, the ``width`` characters that start there; the new text is scanned once
with a rolling hash, each hash hit is compared character by character,
and a confirmed hit is extended backward and forward as far as the texts agree. The work is the
scanned part of the new text (changed and appended text) plus the compared characters, bounded by
a budget.

>>> common_prefix("abcdef", "abcxyz")
3
>>> old = "HEAD " + "x" * 40 + " THINK " * 10 + "KEPT " + "y" * 40
>>> new = "HEAD " + "x" * 40 + "KEPT " + "y" * 40 + " more"
>>> p = common_prefix(old, new)
>>> runs, work = match_runs(old, new, p, p, [old.index("KEPT")], 8, 10_000)
>>> [(old[a:b] == new[c:c + b - a], old[a:b][:4]) for a, b, c in runs]
[(True, 'KEPT')]
"""
from cpython.mem cimport PyMem_Free, PyMem_Malloc
from libc.stdint cimport uint64_t
from libc.string cimport memcmp, memset

from dtok_ext.unicode_text cimport UText, uread, utext_of

cdef enum:
    BLOCK = 512  # characters compared per memcmp when both texts have the same PEP 393 kind

cdef extern from *:
    """
    #define DTOK_ALIGN_BASE 0x100000001B3ULL  /* rolling-hash multiplier (odd) */
    """
    uint64_t BASE "DTOK_ALIGN_BASE"


cdef Py_ssize_t same_after(const UText* a, Py_ssize_t i, const UText* b, Py_ssize_t j,
                           Py_ssize_t limit) noexcept nogil:
    """The largest k <= limit with a[i:i+k] == b[j:j+k]."""
    cdef Py_ssize_t k = 0
    cdef int kind = a.kind
    if kind == b.kind:
        while k + BLOCK <= limit and memcmp(<const char*>a.data + (i + k) * kind,
                                            <const char*>b.data + (j + k) * kind,
                                            BLOCK * kind) == 0:
            k += BLOCK
    while k < limit and uread(a, i + k) == uread(b, j + k):
        k += 1
    return k


cdef Py_ssize_t same_before(const UText* a, Py_ssize_t i, const UText* b, Py_ssize_t j,
                            Py_ssize_t limit) noexcept nogil:
    """The largest k <= limit with a[i-k:i] == b[j-k:j]."""
    cdef Py_ssize_t k = 0
    cdef int kind = a.kind
    if kind == b.kind:
        while k + BLOCK <= limit and memcmp(<const char*>a.data + (i - k - BLOCK) * kind,
                                            <const char*>b.data + (j - k - BLOCK) * kind,
                                            BLOCK * kind) == 0:
            k += BLOCK
    while k < limit and uread(a, i - k - 1) == uread(b, j - k - 1):
        k += 1
    return k


# Below this many characters common_prefix keeps the GIL: a session's next turn compares its
# text (~400K characters at 100K tokens: 0.03-0.1 ms) on a serving engine's event loop, where
# each release of the GIL may wait up to the switch interval (5 ms) to get it back from
# another thread; longer texts are worth another thread's progress meanwhile.
NOGIL_MIN_CHARS = 1 << 21


def common_prefix(str a not None, str b not None):
    """Length of the longest common prefix of a and b (memory speed for texts of one kind)."""
    cdef UText ta = utext_of(a), tb = utext_of(b)
    cdef Py_ssize_t n = ta.length if ta.length < tb.length else tb.length, k
    if n < NOGIL_MIN_CHARS:
        return same_after(&ta, 0, &tb, 0, n)
    with nogil:
        k = same_after(&ta, 0, &tb, 0, n)
    return k


cdef inline uint64_t mix(uint64_t h) noexcept nogil:
    h ^= h >> 31
    h *= 0x9E3779B97F4A7C15ULL
    return h ^ (h >> 29)


def match_runs(str old not None, str new not None, Py_ssize_t old_from, Py_ssize_t new_from,
               probes, Py_ssize_t width, Py_ssize_t budget):
    """Stretches of ``old[old_from:]`` that reappear in ``new[new_from:]``, in order.

    ``probes`` are positions of ``old`` (ascending, each >= old_from) where a stretch may be
    recognised: a stretch is found when the ``width`` characters starting at a probe occur in
    ``new``; it is then extended both ways as far as the texts agree (never back past the end of
    the previous stretch). Returns ``(runs, work)``: runs are ``(old_start, old_end,
    new_start)`` with ``old[old_start:old_end] == new[new_start:new_start + old_end -
    old_start]``, increasing and disjoint in both texts; work counts scanned and compared
    characters, and the search stops once it exceeds ``budget``."""
    cdef UText to = utext_of(old), tn = utext_of(new)
    cdef Py_ssize_t n_probes = 0, cap = 1, i, k, slot, j, end_new, work = 0
    cdef Py_ssize_t last_old = old_from, last_new = new_from, best, o, back, fwd, lim
    cdef uint64_t h, top = 1, key
    cdef uint64_t* hashes = NULL
    cdef Py_ssize_t* offsets = NULL
    cdef Py_ssize_t* table = NULL
    runs = []
    if width < 1 or new_from + width > tn.length:
        return runs, 0
    usable = [p for p in probes if old_from <= p and p + width <= to.length]
    n_probes = len(usable)
    if n_probes == 0:
        return runs, 0
    while cap < 2 * n_probes:
        cap <<= 1
    hashes = <uint64_t*>PyMem_Malloc(n_probes * sizeof(uint64_t))
    offsets = <Py_ssize_t*>PyMem_Malloc(n_probes * sizeof(Py_ssize_t))
    table = <Py_ssize_t*>PyMem_Malloc(cap * sizeof(Py_ssize_t))
    if hashes == NULL or offsets == NULL or table == NULL:
        PyMem_Free(hashes); PyMem_Free(offsets); PyMem_Free(table)
        raise MemoryError()
    try:
        for i in range(n_probes):
            offsets[i] = usable[i]
        with nogil:
            memset(table, 0xFF, cap * sizeof(Py_ssize_t))  # -1: empty
            for i in range(width - 1):
                top *= BASE
            for i in range(n_probes):
                h = 0
                for k in range(width):
                    h = h * BASE + <uint64_t>uread(&to, offsets[i] + k)
                hashes[i] = h
                slot = <Py_ssize_t>(mix(h) & (cap - 1))
                while table[slot] >= 0:
                    slot = (slot + 1) & (cap - 1)
                table[slot] = i
            work = n_probes * width
            j = new_from
            h = 0
            for k in range(width):
                h = h * BASE + <uint64_t>uread(&tn, j + k)
            while j + width <= tn.length and work <= budget:
                # the earliest usable probe whose text is new[j:j+width]
                best = -1
                slot = <Py_ssize_t>(mix(h) & (cap - 1))
                while table[slot] >= 0:
                    i = table[slot]
                    if hashes[i] == h and offsets[i] >= last_old and (best < 0 or i < best):
                        work += width
                        if same_after(&to, offsets[i], &tn, j, width) == width:
                            best = i
                    slot = (slot + 1) & (cap - 1)
                if best >= 0:
                    o = offsets[best]
                    lim = o - last_old
                    if j - last_new < lim:
                        lim = j - last_new
                    back = same_before(&to, o, &tn, j, lim)
                    lim = to.length - o
                    if tn.length - j < lim:
                        lim = tn.length - j
                    fwd = same_after(&to, o, &tn, j, lim)
                    work += back + fwd
                    with gil:
                        runs.append((o - back, o + fwd, j - back))
                    last_old, last_new = o + fwd, j + fwd
                    j = last_new
                    if j + width > tn.length:
                        break
                    h = 0
                    for k in range(width):
                        h = h * BASE + <uint64_t>uread(&tn, j + k)
                    work += width
                    continue
                if j + width < tn.length:
                    h = (h - <uint64_t>uread(&tn, j) * top) * BASE + <uint64_t>uread(&tn, j + width)
                j += 1
                work += 1
    finally:
        PyMem_Free(hashes)
        PyMem_Free(offsets)
        PyMem_Free(table)
    return runs, work


cdef enum:
    FP_WINDOW = 64  # characters a fingerprint covers, ending at its offset


def fingerprints(str text not None, offsets, unsigned long long key):
    """Keyed 64-bit fingerprints of the ``FP_WINDOW`` characters that end at each offset (fewer
    at the start of the text), over code points, so a text's kind (1, 2 or 4 bytes per
    character) does not change them. Content lookup uses them only to choose which stored text
    to compare with; the comparison itself decides.

    >>> a = fingerprints("x" * 100 + "abc", [100, 103], 7)
    >>> a == fingerprints("x" * 100 + "abc" + "\U0001f600", [100, 103], 7), a[0] != a[1]
    (True, True)
    """
    cdef UText t = utext_of(text)
    cdef Py_ssize_t o, i, start
    cdef uint64_t h
    out = []
    for o in offsets:
        if o < 0 or o > t.length:
            raise ValueError("offset out of range")
        start = o - FP_WINDOW if o > FP_WINDOW else 0
        h = key ^ <uint64_t>(o - start)
        for i in range(start, o):
            h = (h ^ <uint64_t>uread(&t, i)) * 0x100000001B3ULL
        out.append(mix(h ^ (h >> 32)))
    return out
