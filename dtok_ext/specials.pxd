# Aho-Corasick automaton over the added-token strings of a tokenizer (code points, exact match).
from dtok_ext.unicode_text cimport UText


cdef class SpecialMatcher:
    cdef object _arrays                 # keeps the array.array buffers below alive
    cdef const int* edge_begin          # per node: first edge index; edges of a node are sorted by char
    cdef const int* edge_end
    cdef const Py_UCS4* edge_char
    cdef const int* edge_next
    cdef const int* fail
    cdef const int* term_len            # length of the pattern that ends exactly at this node, or 0
    cdef const int* dict_link           # nearest node on the fail chain with term_len > 0, or -1
    cdef const int* max_out             # longest pattern that ends at this node (own or via fail chain)
    cdef readonly int n_nodes
    cdef readonly int n_patterns
    cdef readonly int max_len
    cdef object _starts                 # bytes: 1 for a BMP code point that begins some pattern
    cdef const unsigned char* starts
    cdef bint astral_starts             # some pattern begins with a code point above U+FFFF

    cdef bint may_start_in(self, const UText* t, Py_ssize_t start, Py_ssize_t stop) noexcept nogil
    cdef bint may_touch(self, const UText* t, Py_ssize_t lo, Py_ssize_t hi) noexcept nogil

    cdef int _goto(self, int node, Py_UCS4 ch) noexcept nogil
    cdef int _step(self, int state, Py_UCS4 ch) noexcept nogil
    cdef bint covers(self, const UText* t, Py_ssize_t b) noexcept nogil
    cdef bint starts_at(self, const UText* t, Py_ssize_t b, Py_ssize_t limit) noexcept nogil
    cdef bint ends_at_unshadowed(self, const UText* t, Py_ssize_t b) noexcept nogil
    cdef bint touches(self, const UText* t, Py_ssize_t a, Py_ssize_t c) noexcept nogil
