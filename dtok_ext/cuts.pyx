"""Safe cuts: positions b where encode(S[:b]) + encode(S[b:]) == encode(S).

One predicate (:meth:`CutRules.verdict`, completed by :meth:`CutRules.resolve` for NFC files) serves
both chunked encoding (`limit = len(S)`) and session repair (`S` = the new text, `limit` = the
length of the old text, so that every check except the special-token scan reads only old text).
A position is safe when no occurrence of any added-token string covers it, and either

* it is a boundary of an added-token occurrence that the reference's leftmost-longest scan must
  select (an occurrence that starts at b, or ends at b and is not covered at its start); the
  texts on both sides are then normalized and pre-tokenized separately by the reference; or
* the characters at b-1 and b form an accepted class transition of the pre-tokenizer family, and,
  for NFC files, the normalizer provably splits at b (anchors a < b < c where it always splits,
  N(S[a:c]) == N(S[a:b]) + N(S[b:c])) and the transition still holds on the normalized characters.

The argument for each family's transition set is in :mod:`dtok.families`.
"""
from cpython cimport array
from cpython.object cimport Py_SIZE
import array

from dtok_ext.utf8 cimport cache_utf8_if_clean
from dtok_ext.unicode_text cimport Py_UCS1, Py_UCS2, UText, uread, utext_of
from dtok_ext.specials cimport SpecialMatcher

cdef extern from "Python.h":
    bint PyUnicode_IS_ASCII(object u)
    object PyUnicode_New(Py_ssize_t size, Py_UCS4 maxchar)
    void PyUnicode_WRITE(int kind, void* data, Py_ssize_t index, Py_UCS4 value)

cdef Py_UCS4 SEPARATOR = 0xFDD0

# What CutRules.route says of a stretch of text (its first value).
ROUTE_FAST = 0  # the fast encoder may take it
ROUTE_GUARD = 1  # it holds a guard character: the reference must take that stretch
ROUTE_NFC = 2  # it holds a non-anchor of NFC: check what the reference normalizer does there
# What CutRules.is_safe says of a position (the .pxd's verdicts, for Python callers).
VERDICT_NOT_SAFE = NOT_SAFE
VERDICT_AT_SPECIAL = SAFE_AT_SPECIAL
VERDICT_TRANSITION = SAFE_TRANSITION

cdef enum:
    NFC_WINDOW = 256  # code points searched on each side of a cut for an NFC anchor
    # Positions a scan asks SpecialMatcher.may_touch about at once: one question reads
    # SPECIALS_BLOCK + max_len characters, where the automaton's checks read ~2 max_len at
    # each position (15 cuts of 1M adversarial characters, Llama-3.1: 0.09 ms with the checks
    # at every position, 0.01-0.04 asking once per block)
    SPECIALS_BLOCK = 32



ctypedef fused _unit:  # one PEP 393 width
    Py_UCS1
    Py_UCS2
    Py_UCS4


cdef enum:
    SCAN_BLOCK = 256  # characters checked at once against the clean prefix of the code space


cdef extern from *:
    """
    /* Does any of p[0..n) lie outside the clean ranges (>= below and outside [lo, lo+width))?
       Plain C in the string's own width, so that the compiler vectorizes it (no early exit,
       one OR-reduction; 16 one-byte or 8 two-byte characters per SSE2 instruction). */
    #define DTOK_OUTSIDE(NAME, T, MAXV)                                                    \
        static inline int NAME(const T* p, Py_ssize_t n, unsigned int below,               \
                               unsigned int lo, unsigned int width) {                      \
            if (below > MAXV) return 0;                                                    \
            if (lo > MAXV) { lo = 0; width = 0; }                                          \
            else if ((unsigned long long)lo + width > (unsigned long long)MAXV + 1)        \
                width = (unsigned int)((unsigned long long)MAXV + 1 - lo);                 \
            T b = (T)below, l = (T)lo, w = (T)width, acc = 0;                              \
            for (Py_ssize_t j = 0; j < n; j++) {                                           \
                T ch = p[j];                                                               \
                acc |= (T)((ch >= b) & ((T)(ch - l) >= w));                                \
            }                                                                              \
            return acc != 0;                                                               \
        }
    DTOK_OUTSIDE(dtok_outside_1, Py_UCS1, 0xFFu)
    DTOK_OUTSIDE(dtok_outside_2, Py_UCS2, 0xFFFFu)
    DTOK_OUTSIDE(dtok_outside_4, Py_UCS4, 0xFFFFFFFFu)
    """
    bint dtok_outside_1(const Py_UCS1* p, Py_ssize_t n, unsigned int below, unsigned int lo,
                        unsigned int width) noexcept nogil
    bint dtok_outside_2(const Py_UCS2* p, Py_ssize_t n, unsigned int below, unsigned int lo,
                        unsigned int width) noexcept nogil
    bint dtok_outside_4(const Py_UCS4* p, Py_ssize_t n, unsigned int below, unsigned int lo,
                        unsigned int width) noexcept nogil


cdef inline Py_ssize_t _scan(const unsigned char* table, const _unit* p, Py_ssize_t start,
                             Py_ssize_t stop, unsigned char need, const _Clean* clean
                             ) noexcept nogil:
    # A block whose characters all lie in the clean ranges is passed at vector speed; only
    # other blocks read the table.
    cdef Py_ssize_t i = start, j, end
    cdef bint outside
    cdef unsigned int below = clean.below, lo = clean.lo, width = clean.hi - clean.lo
    cdef unsigned char c
    while i < stop:
        end = i + SCAN_BLOCK
        if end > stop:
            end = stop
        if _unit is Py_UCS1:
            outside = dtok_outside_1(p + i, end - i, below, lo, width)
        elif _unit is Py_UCS2:
            outside = dtok_outside_2(p + i, end - i, below, lo, width)
        else:
            outside = dtok_outside_4(p + i, end - i, below, lo, width)
        if outside:
            for j in range(i, end):
                c = table[p[j]]
                if (c & FAST_GUARD) or (c & need) != need:
                    return j
        i = end
    return -1


cdef inline bint _is_clean(const unsigned char* table, unsigned int c, unsigned char need
                           ) noexcept nogil:
    return not (table[c] & FAST_GUARD) and (table[c] & need) == need


cdef _Clean _clean_ranges(const unsigned char* table, unsigned char need) noexcept nogil:
    """Where every code point is clean (not a guard character; with ``need``, an anchor):
    a prefix of the code space, and the run around the General Punctuation block that prose
    uses (curly quotes, dashes), so that such text is checked at vector speed."""
    cdef _Clean r
    r.below = 0
    while r.below < 0x110000 and _is_clean(table, r.below, need):
        r.below += 1
    r.lo = r.hi = 0x2019
    if _is_clean(table, 0x2019, need):
        while r.lo > 0 and _is_clean(table, r.lo - 1, need):
            r.lo -= 1
        while r.hi < 0x110000 and _is_clean(table, r.hi, need):
            r.hi += 1
    return r


cdef Py_ssize_t _first_flagged(const unsigned char* table, const _Clean* clean, const UText* t,
                               Py_ssize_t start, Py_ssize_t stop,
                               unsigned char need) noexcept nogil:
    """First i in [start, stop) whose character is a guard character, or lacks a flag of
    ``need`` (NFC_ANCHOR or 0; ``clean`` its clean ranges); -1 if none. One loop per string
    width."""
    if t.kind == 1:
        return _scan(table, <const Py_UCS1*>t.data, start, stop, need, clean)
    if t.kind == 2:
        return _scan(table, <const Py_UCS2*>t.data, start, stop, need, clean)
    return _scan(table, <const Py_UCS4*>t.data, start, stop, need, clean)


cdef class CutRules:
    """Cut predicate for one tokenizer: class table, accepted transitions, added tokens, NFC.

    Test seams: ``_check_nfc``, ``_check_specials`` and ``_check_new_text`` (public to Python,
    True in service) switch one safety condition off, so that a control can prove its check
    sees the wrong answers that follow; only ``dtok.testing.cut_checks_off`` sets them.
    """

    def __init__(self, bytes table not None, bytes accept not None, SpecialMatcher specials not None,
                 normalize=None, SpecialMatcher declared=None):
        if len(table) != 0x110000:
            raise ValueError("class table must have one byte per code point")
        if len(accept) != 64 * 64:
            raise ValueError("transition matrix must be 64 x 64")
        self._table = table
        self.table = <const unsigned char*>table
        self.clean[0] = _clean_ranges(self.table, 0)
        self.clean[1] = _clean_ranges(self.table, NFC_ANCHOR)
        for i in range(64 * 64):
            self.accept[i] = accept[i]
        self.specials = specials
        # Token strings that a tokenizer_config.json declares and the file does not hold: the
        # reference reads them as text (their edges are no added-token boundaries here), an
        # engine that adds them matches them, so a cut is kept out of their inside for both.
        self.declared = declared if declared is not None else SpecialMatcher([])
        self.nfc = normalize is not None
        self._normalize = normalize
        self._check_nfc = True
        self._check_specials = True
        self._check_new_text = True

    cdef int verdict(self, const UText* t, Py_ssize_t b, Py_ssize_t limit,
                     bint specials_near) noexcept nogil:
        # specials_near False: SpecialMatcher.may_touch found no added token that could start
        # at, end at or cover b (a scan asks once for a block of positions); the added-token
        # checks would all say no, so they are skipped.
        cdef unsigned char x, y, z
        if b <= 0 or b >= limit or b >= t.length:
            return NOT_SAFE
        if self.declared.max_len and self._check_specials and self.declared.covers(t, b):
            return NOT_SAFE
        if specials_near and self._check_specials and self.specials.max_len:
            if self.specials.covers(t, b):
                return NOT_SAFE
            if self.specials.starts_at(t, b, limit) or self.specials.ends_at_unshadowed(t, b):
                return SAFE_AT_SPECIAL
        x = self.table[uread(t, b - 1)]
        y = self.table[uread(t, b)]
        if not self.accept[(x & CLASS_MASK) * 64 + (y & CLASS_MASK)]:
            return NOT_SAFE
        if not self.nfc or not self._check_nfc:
            return SAFE_TRANSITION
        # Fast path: S[b-1], S[b] and S[b+1] (or the true end) are anchors, so the normalizer
        # splits at b and leaves both boundary characters as they are.
        if (x & NFC_ANCHOR) and (y & NFC_ANCHOR):
            if b + 1 == t.length:
                return SAFE_TRANSITION
            if b + 1 < limit:
                z = self.table[uread(t, b + 1)]
                if z & NFC_ANCHOR:
                    return SAFE_TRANSITION
        return NEEDS_NFC

    cdef int nfc_ok(self, str text, const UText* t, Py_ssize_t b, Py_ssize_t limit) except -1:
        cdef Py_ssize_t a = -1, c = -1, i, lo, hi
        cdef unsigned char x, y
        lo = b - NFC_WINDOW
        if lo < 0:
            lo = 0
        i = b - 1
        while i >= lo:
            if self.table[uread(t, i)] & NFC_ANCHOR:
                a = i
                break
            i -= 1
        if a < 0:
            if b > NFC_WINDOW:
                return 0
            a = 0  # the start of the text splits too
        hi = b + NFC_WINDOW
        if hi > limit - 1:
            hi = limit - 1
        i = b + 1
        while i <= hi:
            if self.table[uread(t, i)] & NFC_ANCHOR:
                c = i
                break
            i += 1
        if c < 0:
            if limit != t.length or t.length - b > NFC_WINDOW:
                return 0
            c = t.length  # the true end of the text
        # The anchors must lie between the same added-token occurrences as b.
        if self._check_specials and self.specials.touches(t, a, c):
            return 0
        try:
            left = self._normalize(text[a:b])
            right = self._normalize(text[b:c])
            if self._normalize(text[a:c]) != left + right or not left or not right:
                return 0
        except UnicodeError:  # a lone surrogate nearby: no cut here
            return 0
        x = self.table[ord(left[len(left) - 1])]
        y = self.table[ord(right[0])]
        return self.accept[(x & CLASS_MASK) * 64 + (y & CLASS_MASK)] != 0

    cdef int resolve(self, str text, const UText* t, Py_ssize_t b, Py_ssize_t limit) except -1:
        cdef int v = self.verdict(t, b, limit, True)
        if v == NEEDS_NFC:
            return SAFE_TRANSITION if self.nfc_ok(text, t, b, limit) else NOT_SAFE
        return v

    cdef Py_ssize_t scan_back(self, str text, Py_ssize_t start, Py_ssize_t stop,
                              Py_ssize_t limit) except -2:
        """First safe cut in start, start-1, ..., stop; -1 if none."""
        cdef UText t = utext_of(text)
        cdef Py_ssize_t b = start, block = start + 1  # `near` holds for positions [block, start]
        cdef int v
        cdef bint near = True
        if stop < 1:
            stop = 1
        while b >= stop:
            with nogil:
                while b >= stop:
                    if b < block:
                        block = b - SPECIALS_BLOCK + 1
                        if block < stop:
                            block = stop
                        near = self.specials.may_touch(&t, block, b)
                    v = self.verdict(&t, b, limit, near)
                    if v != NOT_SAFE:
                        break
                    b -= 1
            if b < stop:
                break
            if v != NEEDS_NFC or self.nfc_ok(text, &t, b, limit):
                return b
            b -= 1
        return -1

    cdef Py_ssize_t scan_forward(self, str text, Py_ssize_t start, Py_ssize_t stop,
                                 Py_ssize_t limit) except -2:
        """First safe cut in start, start+1, ..., stop; -1 if none."""
        cdef UText t = utext_of(text)
        cdef Py_ssize_t b = start, block = -1  # `near` holds for positions [start, block]
        cdef int v
        cdef bint near = True
        if b < 1:
            b = 1
        while b <= stop:
            with nogil:
                while b <= stop:
                    if b > block:
                        block = b + SPECIALS_BLOCK - 1
                        if block > stop:
                            block = stop
                        near = self.specials.may_touch(&t, b, block)
                    v = self.verdict(&t, b, limit, near)
                    if v != NOT_SAFE:
                        break
                    b += 1
            if b > stop:
                break
            if v != NEEDS_NFC or self.nfc_ok(text, &t, b, limit):
                return b
            b += 1
        return -1

    # Python surface (planner, repair, tests, explain)

    def is_safe(self, str text not None, Py_ssize_t b, limit=None):
        """Verdict for position b: VERDICT_NOT_SAFE (0), VERDICT_AT_SPECIAL (1: safe at an
        added token) or VERDICT_TRANSITION (2: safe at a class transition)."""
        cdef UText t = utext_of(text)
        cdef Py_ssize_t lim = len(text) if limit is None else limit
        return self.resolve(text, &t, b, lim)

    def safe_positions(self, str text not None, limit=None):
        """Every safe cut of `text` (for the exactness battery)."""
        cdef UText t = utext_of(text)
        cdef Py_ssize_t lim = len(text) if limit is None else limit
        cdef Py_ssize_t b
        return [b for b in range(1, len(text)) if self.resolve(text, &t, b, lim) != NOT_SAFE]

    def scan(self, str text not None, Py_ssize_t start, Py_ssize_t stop, limit=None):
        return self.scan_back(text, start, stop, len(text) if limit is None else limit)

    def plan(self, str text not None, int k, Py_ssize_t min_chunk, budgets):
        """Cuts for k chunks: from each tentative cut floor(i*N/k) scan backward, stage by stage
        through `budgets` (e.g. (48, 4096)), for a safe cut that leaves no chunk shorter than
        `min_chunk`. A missed cut leaves its text with the preceding chunk."""
        cdef Py_ssize_t n = len(text), prev = 0, target, hi, lo_limit, stage_hi, stage_lo, b
        cuts = []
        for i in range(1, k):
            target = i * n // k
            hi = min(target, n - min_chunk)
            lo_limit = prev + min_chunk
            b = -1
            stage_hi = hi
            for budget in budgets:
                stage_lo = max(hi - budget, lo_limit)
                if stage_lo > stage_hi:
                    continue
                b = self.scan_back(text, stage_hi, stage_lo, n)
                if b >= 0:
                    break
                stage_hi = stage_lo - 1
            if b >= 0:
                cuts.append(b)
                prev = b
        return cuts

    # Routing for the fast encoder: may a stretch of text go to it, or must it go to the reference?

    def route(self, str text not None, Py_ssize_t start=0, end=None, nfc=None, utf8=False):
        """(ROUTE_FAST, -1) when text[start:end] may go to the fast encoder; (ROUTE_GUARD, i) when
        text[i] is a guard character; (ROUTE_NFC, i) when text[i] is not an NFC anchor (NFC files: call nfc_windows and
        check that the reference normalizer leaves them unchanged). ``nfc=False`` skips the NFC
        part (the file's guard table proves the fast encoder normalizes as the reference does).
        ``utf8``: the whole text is about to go to an encoder if it routes fast; then its UTF-8
        is written in the same pass (``dtok_ext.utf8.cache_utf8_if_clean``) instead of by the
        encoder's call after this scan (1M characters of four-byte text: ~0.3 ms less).

        An ASCII text, when the 128 ASCII characters are all clean, costs O(1); otherwise one
        pass over the string's own buffer, one loop per PEP 393 width, without the GIL."""
        cdef UText t = utext_of(text)
        cdef Py_ssize_t i = -1, stop = t.length if end is None else end
        cdef Py_ssize_t first_non_anchor = -1
        cdef bint check_nfc = self.nfc if nfc is None else (self.nfc and nfc)
        cdef unsigned char need = NFC_ANCHOR if check_nfc else 0
        if stop > t.length:
            stop = t.length
        if start < 0:
            start = 0
        if start >= stop:
            return ROUTE_FAST, -1
        cdef const _Clean* clean = &self.clean[1 if need else 0]
        if PyUnicode_IS_ASCII(text) and clean.below >= 128:
            return ROUTE_FAST, -1
        if utf8 and start == 0 and stop == t.length and clean.below >= 128 \
                and cache_utf8_if_clean(text, self.table, FAST_GUARD, need):
            return ROUTE_FAST, -1  # else nothing was written: the scan finds why
        with nogil:
            i = _first_flagged(self.table, clean, &t, start, stop, need)
            if i >= 0 and not (self.table[uread(&t, i)] & FAST_GUARD):
                # a non-anchor: remember it, keep looking for a guard character
                first_non_anchor = i
                i = _first_flagged(self.table, &self.clean[0], &t, i, stop, 0)
        if i >= 0:
            return ROUTE_GUARD, i
        if first_non_anchor >= 0:
            return ROUTE_NFC, first_non_anchor
        return ROUTE_FAST, -1

    def guard_spans(self, str text not None, Py_ssize_t start=0, end=None):
        """Ranges [i, j) of consecutive guard characters in text[start:end]."""
        cdef UText t = utext_of(text)
        cdef Py_ssize_t i, j, stop = t.length if end is None else end
        out = []
        i = start
        while i < stop:
            with nogil:
                i = _first_flagged(self.table, &self.clean[0], &t, i, stop, 0)
                j = i
                if i >= 0:
                    j = i + 1
                    while j < stop and (self.table[uread(&t, j)] & FAST_GUARD):
                        j += 1
            if i < 0:
                break
            out.append((i, j))
            i = j
        return out

    def isolate(self, str text not None, spans, Py_ssize_t budget):
        """Merged stretches [a, b) that contain the given ranges and start and end at safe cuts
        (or at the text's ends), found within `budget` characters on either side."""
        cdef Py_ssize_t n = len(text), a, b, last_end
        out = []
        for lo, hi in sorted(spans):
            last_end = out[len(out) - 1][1] if out else -1
            if hi <= last_end:
                continue  # inside the previous stretch
            if lo < last_end:
                a = out.pop()[0]
            else:
                a = self.scan_back(text, lo, lo - budget, n) if lo > 0 else 0
                if a < 0:
                    a = 0
            b = self.scan_forward(text, hi, hi + budget, n) if hi < n else n
            if b < 0:
                b = n
            if out and a <= out[len(out) - 1][1]:
                a = out.pop()[0]
            out.append((a, b))
        return out

    def cut_free_stretches(self, str text not None, Py_ssize_t longest):
        """Stretches [a, b) of `text` from one safe cut (or its start) to the next (or its end)
        that are longer than `longest`: the only places a pre-token that long can be, since no
        pre-token holds a safe cut. Costs O(n / longest) short scans where cuts are frequent,
        one pass over each stretch found."""
        cdef Py_ssize_t n = len(text), p = 0, c
        out = []
        if longest < 1:
            longest = 1
        while n - p > longest:
            c = self.scan_back(text, p + longest, p + 1, n)
            if c >= 0:
                p = c
                continue
            c = self.scan_forward(text, p + longest + 1, n - 1, n)
            if c < 0:
                c = n
            out.append((p, c))
            p = c
        return out

    def nfc_windows(self, str text not None, Py_ssize_t start=0, end=None):
        """The stretches of text[start:end] that NFC can change: each from the anchor before a
        non-anchor character to the next anchor (the normalizer splits before every anchor, so
        the text is NFC exactly when each of these is)."""
        cdef UText t = utext_of(text)
        cdef Py_ssize_t i, stop = t.length if end is None else end
        cdef Py_ssize_t last_anchor = start, win_start = -1
        out = []
        for i in range(start, stop):
            if self.table[uread(&t, i)] & NFC_ANCHOR:
                if win_start >= 0:
                    out.append((win_start, i))
                    win_start = -1
                last_anchor = i
            elif win_start < 0:
                win_start = last_anchor
        if win_start >= 0:
            out.append((win_start, stop))
        return out

    def unstable_windows(self, str text not None):
        """The NFC windows of text that the reference normalizer would change.

        All windows are normalized in one call, joined by U+FDD0 (a noncharacter: an NFC
        anchor that nothing normalizes to), and compared with the input window by window.
        Returns None when text itself holds U+FDD0 (the caller checks another way)."""
        cdef UText t = utext_of(text)
        cdef Py_ssize_t i, j, k, n = t.length, total = 0, nw
        cdef Py_ssize_t last_anchor = 0, win_start = -1, a, c, pos
        cdef Py_UCS4 ch
        cdef array.array bounds = array.array("q")
        if self._normalize is None:
            return []
        for i in range(n):
            ch = uread(&t, i)
            if ch == SEPARATOR:
                return None
            if self.table[ch] & NFC_ANCHOR:
                if win_start >= 0:
                    bounds.append(win_start)
                    bounds.append(i)
                    total += i - win_start
                    win_start = -1
                last_anchor = i
            elif win_start < 0:
                win_start = last_anchor
        if win_start >= 0:
            bounds.append(win_start)
            bounds.append(n)
            total += n - win_start
        nw = len(bounds) // 2
        if nw == 0:
            return []
        cdef long long* bd = bounds.data.as_longlongs
        joined = PyUnicode_New(total + nw - 1, 0x10FFFF if t.kind == 4 else 0xFFFF)
        cdef UText jt = utext_of(joined)
        pos = 0
        for k in range(nw):
            if k:
                PyUnicode_WRITE(jt.kind, <void*>jt.data, pos, SEPARATOR)
                pos += 1
            for j in range(bd[2 * k], bd[2 * k + 1]):
                PyUnicode_WRITE(jt.kind, <void*>jt.data, pos, uread(&t, j))
                pos += 1
        try:
            out = self._normalize(joined)
        except UnicodeError:  # a lone surrogate: every window is suspect
            return [(bd[2 * k], bd[2 * k + 1]) for k in range(nw)]
        cdef UText ot = utext_of(out)
        bad = []
        pos = 0
        for k in range(nw):
            a, c = bd[2 * k], bd[2 * k + 1]
            j = pos
            while j < ot.length and uread(&ot, j) != SEPARATOR:
                j += 1
            if j - pos != c - a:
                bad.append((a, c))
            else:
                for i in range(c - a):
                    if uread(&ot, pos + i) != uread(&t, a + i):
                        bad.append((a, c))
                        break
            pos = j + 1
        return bad

    # Continuations (dtok.repair): cuts of two texts at once, and anchor grids.

    @property
    def context(self):
        """How far the verdict at b reads on either side of b (NFC window, added-token
        occurrences reaching b and the occurrences that could shadow them, the transition pair),
        so that two texts equal on [b - context, b + context] that reach neither end of either
        text within it get the same verdict at b."""
        return NFC_WINDOW + 2 * self.specials.max_len + 2

    cdef bint cut_or_end(self, str text, const UText* t, Py_ssize_t b) except -1:
        if b == 0 or b == t.length:
            return True
        return self.resolve(text, t, b, t.length) != NOT_SAFE

    def seam(self, str old not None, Py_ssize_t old_pos, str new not None, Py_ssize_t new_pos,
             Py_ssize_t count, int direction):
        """The first d in 0..count such that old_pos + d*direction is a cut of old and
        new_pos + d*direction is a cut of new (a cut: a safe cut of the whole text, or either end
        of it); -1 if none. direction is +1 (forward) or -1 (backward)."""
        if direction not in (1, -1):
            raise ValueError("direction must be +1 or -1")
        return self._seam(old, old_pos, new, new_pos, count, direction)

    cdef Py_ssize_t _seam(self, str old, Py_ssize_t old_pos, str new, Py_ssize_t new_pos,
                          Py_ssize_t count, int direction) except -2:
        cdef UText o = utext_of(old), n = utext_of(new)
        cdef Py_ssize_t d, a, b
        for d in range(count + 1):
            a = old_pos + d * direction
            b = new_pos + d * direction
            if a < 0 or b < 0 or a > o.length or b > n.length:
                break
            if self.cut_or_end(old, &o, a) and (not self._check_new_text
                                                or self.cut_or_end(new, &n, b)):
                return d
        return -1

    def grid(self, str text not None, Py_ssize_t start, Py_ssize_t end, Py_ssize_t spacing,
             Py_ssize_t budget):
        """Safe cuts of the whole text inside (start, end), about `spacing` apart: from each
        tentative position (the previous cut + spacing) scan back at most `budget` characters,
        never closer than spacing/4 to the previous cut or to `end`."""
        if spacing < 1:
            raise ValueError("spacing must be positive")
        return self._grid(text, start, end, spacing, budget)

    cdef list _grid(self, str text, Py_ssize_t start, Py_ssize_t end, Py_ssize_t spacing,
                    Py_ssize_t budget):
        cdef Py_ssize_t prev = start, target, lo, b, n = len(text)
        cdef Py_ssize_t quarter = spacing // 4 if spacing >= 4 else 1
        cdef list cuts = []
        target = start + spacing
        while target <= end - quarter:
            lo = target - budget
            if lo < prev + quarter:
                lo = prev + quarter
            b = self.scan_back(text, target, lo, n) if lo <= target else -1
            if b > prev:
                cuts.append(b)
                prev = b
                target = b + spacing
            else:
                target += spacing
        return cuts

    def append_pieces(self, str old not None, array.array offsets not None, str new not None,
                      Py_ssize_t scan_budget, Py_ssize_t spacing):
        """What a pure append (``new`` = ``old`` + more, :func:`dtok.repair.continue_append`)
        encodes, found in one call: ``(x, i, cuts, texts)``, the seam x (the first cut of both
        texts scanning back from the old end, at most ``scan_budget``; never 0), the index i of
        the anchor nearest to it (``offsets``: the stored anchors', :func:`nearest_anchor`), the
        grid cuts of ``new[x:]`` and the texts to encode: the old text between that anchor and
        the seam first where they differ, then ``new[x:]`` cut at the grid. None where there is
        no such seam."""
        cdef Py_ssize_t m = len(old), n = len(new), d, x, i, a
        if spacing < 1:
            raise ValueError("spacing must be positive")
        if n <= m:
            return None
        d = self._seam(old, m, new, m, scan_budget if scan_budget < m else m, -1)
        if d < 0 or d >= m:
            return None
        x = m - d
        i = _nearest(offsets, x)
        a = offsets.data.as_longlongs[i]
        cdef list cuts = self._grid(new, x, n, spacing, scan_budget)
        cdef list texts = []
        if a < x:
            texts.append(old[a:x])
        elif a > x:
            texts.append(old[x:a])
        cdef Py_ssize_t lo = x
        for b in cuts:
            texts.append(new[lo:b])
            lo = b
        texts.append(new[lo:n])
        return x, i, cuts, texts


# --- anchors (dtok.repair): a stored text's cuts with their token indices ---------------------

cdef array.array _INT64 = array.array("q")


cdef Py_ssize_t _bisect(const long long* o, Py_ssize_t lo, Py_ssize_t hi, long long value,
                        bint right) noexcept:
    """bisect_left (``right``: bisect_right) of ``value`` in ``o[lo:hi]``, ascending."""
    cdef Py_ssize_t mid
    while lo < hi:
        mid = (lo + hi) // 2
        if o[mid] < value or (right and o[mid] == value):
            lo = mid + 1
        else:
            hi = mid
    return lo


cdef Py_ssize_t _nearest(array.array offsets, Py_ssize_t pos) except -1:
    cdef const long long* o = offsets.data.as_longlongs
    cdef Py_ssize_t n = Py_SIZE(offsets), i
    if n == 0:
        raise ValueError("no anchors")
    i = _bisect(o, 0, n, pos, False)
    if i == n or (i > 0 and pos - o[i - 1] <= o[i] - pos):
        return i - 1
    return i


def nearest_anchor(array.array offsets not None, Py_ssize_t pos):
    """Index of the anchor offset nearest to pos (``offsets`` ascending, int64; the earlier of
    two as near)."""
    return _nearest(offsets, pos)


cdef class AnchorWriter:
    """The anchors of a new text as they are written (:func:`dtok.repair.next_anchors`): about
    one per ``spacing / 2`` characters (one closer than that to the anchor before it is
    dropped), ``(0, 0)`` first and the end always (:meth:`finish`). ``offsets`` and ``tokens``
    are int64 arrays."""

    cdef readonly Py_ssize_t gap
    cdef readonly array.array offsets
    cdef readonly array.array tokens

    def __cinit__(self, Py_ssize_t spacing):
        self.gap = spacing // 2 if spacing >= 2 else 1
        self.offsets = array.clone(_INT64, 1, True)  # (0, 0)
        self.tokens = array.clone(_INT64, 1, True)

    cpdef add(self, long long offset, long long token):
        cdef Py_ssize_t k = Py_SIZE(self.offsets)
        if offset - self.offsets.data.as_longlongs[k - 1] >= self.gap:
            array.resize_smart(self.offsets, k + 1)
            array.resize_smart(self.tokens, k + 1)
            self.offsets.data.as_longlongs[k] = offset
            self.tokens.data.as_longlongs[k] = token

    def keep(self, array.array offsets not None, array.array tokens not None, Py_ssize_t i,
             Py_ssize_t j):
        """Anchors ``i`` to ``j`` of another text as they are (a kept prefix's)."""
        if i >= j:
            return
        if i < 0 or j > Py_SIZE(offsets) or j > Py_SIZE(tokens):
            raise IndexError("anchors out of range")
        array.extend_buffer(self.offsets, <char*>&offsets.data.as_longlongs[i], j - i)
        array.extend_buffer(self.tokens, <char*>&tokens.data.as_longlongs[i], j - i)

    def keep_prefix(self, array.array offsets not None, array.array tokens not None,
                    long long until):
        """The anchors of a kept prefix as they are: those from ``gap`` to ``until``."""
        cdef const long long* o = offsets.data.as_longlongs
        cdef Py_ssize_t j = _bisect(o, 0, Py_SIZE(offsets), until, True)
        self.keep(offsets, tokens, _bisect(o, 0, j, self.gap, False), j)

    def fresh(self, Py_ssize_t start, long long token, list cuts, list encoded, Py_ssize_t end):
        """Fresh text ``[start, end)`` cut at ``cuts``, its pieces' IDs ``encoded`` (a list of
        int32 buffers per piece) after ``token`` IDs: each piece's start anchored, and the end.
        Returns ``(the IDs in order, the token index at the end)``."""
        cdef list tail = []
        cdef Py_ssize_t k, x = start
        if len(encoded) != len(cuts) + 1:
            raise ValueError("one list of IDs per piece")
        for k in range(len(cuts) + 1):
            self.add(x, token)
            for part in encoded[k]:
                token += len(part)
                tail.append(part)
            if k < len(cuts):
                x = cuts[k]
        self.add(end, token)
        return tail, token

    def finish(self, long long end, long long token):
        """The end anchored (an anchor closer to it than a quarter of ``gap`` is dropped)."""
        cdef Py_ssize_t k = Py_SIZE(self.offsets)
        cdef long long* o = self.offsets.data.as_longlongs
        if o[k - 1] != end:
            if k > 1 and end - o[k - 1] < self.gap // 4:
                k -= 1
                array.resize(self.offsets, k)
                array.resize(self.tokens, k)
            array.resize_smart(self.offsets, k + 1)
            array.resize_smart(self.tokens, k + 1)
            self.offsets.data.as_longlongs[k] = end
            self.tokens.data.as_longlongs[k] = token
