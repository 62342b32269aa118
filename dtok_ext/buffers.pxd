# Growable, read-only-exported int32 ID buffers (see buffers.pyx).

cdef class IdBuffer:
    cdef int* data
    cdef readonly Py_ssize_t length
    cdef readonly Py_ssize_t capacity
    cdef readonly Py_ssize_t exports     # views alive; > 0 means: never write under them

    cdef int reserve(self, Py_ssize_t capacity) except -1
