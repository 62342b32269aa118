# Growable, read-only-exported int32 ID buffers (see buffers.pyx).

cdef class IdBuffer:
    cdef int* data
    cdef readonly Py_ssize_t length
    cdef readonly Py_ssize_t capacity
    cdef readonly Py_ssize_t exports     # views alive; > 0 means: never write under them

    cdef int reserve(self, Py_ssize_t capacity) except -1


# Fill a read-only, 1-D int32 export of `data[0:length]` owned by `owner` (shared by every ID
# exporter); release_int32_export frees what it allocated.
cdef int fill_int32_export(Py_buffer* buf, object owner, void* data, Py_ssize_t length,
                           int flags) except -1
cdef void release_int32_export(Py_buffer* buf) noexcept
