# Memory-speed comparison of two texts (see align.pyx).
from dtok_ext.unicode_text cimport UText

cdef Py_ssize_t same_after(const UText* a, Py_ssize_t i, const UText* b, Py_ssize_t j,
                           Py_ssize_t limit) noexcept nogil
cdef Py_ssize_t same_before(const UText* a, Py_ssize_t i, const UText* b, Py_ssize_t j,
                            Py_ssize_t limit) noexcept nogil
