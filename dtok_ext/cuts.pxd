# The one safe-cut predicate, shared by chunked encoding and session repair.
from dtok_ext.unicode_text cimport UText
from dtok_ext.specials cimport SpecialMatcher

# Layout of one class-table byte (one byte per code point, built by dtok.tables).
cdef enum:
    CLASS_MASK = 0x3F      # pre-tokenizer character class of the family
    NFC_ANCHOR = 0x40      # the reference NFC normalizer always splits before this character
    FAST_GUARD = 0x80      # the fast encoder is not trusted with this character

cdef enum:
    NOT_SAFE = 0
    SAFE_AT_SPECIAL = 1    # at a boundary of an added-token occurrence the scan must select
    SAFE_TRANSITION = 2    # accepted class transition, normalization checked
    NEEDS_NFC = 3          # accepted raw transition; the NFC equation must still be checked

ctypedef struct _Clean:
    unsigned int below  # every code point below this is clean
    unsigned int lo, hi  # and every one in [lo, hi): the run around U+2019 (quotes, dashes)

cdef class CutRules:
    cdef object _table
    cdef const unsigned char* table
    cdef _Clean clean[2]  # the clean ranges of the table: [0] guards only, [1] NFC anchors too
    cdef unsigned char accept[64 * 64]
    cdef readonly SpecialMatcher specials
    cdef readonly SpecialMatcher declared  # strings only a config declares: no cut inside one
    cdef readonly bint nfc
    cdef object _normalize
    cdef public bint _check_nfc         # private test hooks: the control battery switches these off
    cdef public bint _check_specials
    cdef public bint _check_new_text    # continuations: a seam must be a cut of the new text too

    cdef int verdict(self, const UText* t, Py_ssize_t b, Py_ssize_t limit,
                     bint specials_near) noexcept nogil
    cdef int nfc_ok(self, str text, const UText* t, Py_ssize_t b, Py_ssize_t limit) except -1
    cdef int resolve(self, str text, const UText* t, Py_ssize_t b, Py_ssize_t limit) except -1
    cdef Py_ssize_t scan_back(self, str text, Py_ssize_t start, Py_ssize_t stop,
                              Py_ssize_t limit) except -2
    cdef Py_ssize_t scan_forward(self, str text, Py_ssize_t start, Py_ssize_t stop,
                                 Py_ssize_t limit) except -2
    cdef bint cut_or_end(self, str text, const UText* t, Py_ssize_t b) except -1
    cdef Py_ssize_t _seam(self, str old, Py_ssize_t old_pos, str new, Py_ssize_t new_pos,
                          Py_ssize_t count, int direction) except -2
    cdef list _grid(self, str text, Py_ssize_t start, Py_ssize_t end, Py_ssize_t spacing,
                    Py_ssize_t budget)
