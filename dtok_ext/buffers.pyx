"""int32 ID buffers: one allocation per result, filled from the encoder's output without a detour
through numpy or per-item Python calls, exported read-only through the buffer protocol.

An :class:`IdBuffer` counts the views it has exported. A session's buffer is spliced in place
(its tail rewritten, maybe grown) only while no view of it is alive; otherwise the splice goes to a
fresh buffer (copy on write), so a memoryview handed to a caller never changes under it.
"""
from cpython.buffer cimport PyBUF_FORMAT, PyBUF_ND, PyBUF_STRIDES, PyBUF_WRITABLE
from cpython.list cimport PyList_GET_ITEM, PyList_GET_SIZE
from cpython.long cimport PyLong_AsLong
from cpython.mem cimport PyMem_Free, PyMem_Malloc, PyMem_Realloc
from libc.string cimport memcmp, memcpy

cdef char* _FORMAT = b"i"


cdef Py_ssize_t _put(int* out, object part) except -1:
    """Write one part (list of ints, tuple, or C-contiguous int32 buffer) at out; its length."""
    cdef Py_ssize_t j, n
    cdef const int[::1] view
    if type(part) is list:
        n = PyList_GET_SIZE(part)
        for j in range(n):
            out[j] = <int>PyLong_AsLong(<object>PyList_GET_ITEM(part, j))
        return n
    if type(part) is tuple:
        n = len(part)
        for j in range(n):
            out[j] = <int>part[j]
        return n
    view = part
    n = view.shape[0]
    if n:
        memcpy(out, &view[0], n * sizeof(int))
    return n


cdef class IdBuffer:
    """A growable int32 array that exports read-only views and knows whether any is alive.

    >>> b = IdBuffer.concat([[1, 2], (3,)], prefix=(0,))
    >>> list(memoryview(b)), b.exports
    ([0, 1, 2, 3], 0)
    >>> v = b.view(1)
    >>> b.exports, list(v)
    (1, [1, 2, 3])
    >>> c = b.splice(2, [[7, 8]])      # a view is alive: copy on write
    >>> c is b, list(v), list(memoryview(c))
    (False, [1, 2, 3], [0, 1, 7, 8])
    >>> del v
    >>> b.splice(1, [[5]]) is b        # no view alive: in place
    True
    """

    def __cinit__(self):
        self.data = NULL
        self.length = 0
        self.capacity = 0
        self.exports = 0

    def __dealloc__(self):
        PyMem_Free(self.data)

    cdef int reserve(self, Py_ssize_t capacity) except -1:
        cdef int* grown
        if capacity <= self.capacity:
            return 0
        if self.exports:
            raise BufferError("cannot grow an IdBuffer while a view of it is alive")
        grown = <int*>PyMem_Realloc(self.data, max(capacity, 1) * sizeof(int))
        if grown == NULL:
            raise MemoryError()
        self.data = grown
        self.capacity = capacity
        return 0

    @staticmethod
    def concat(parts, prefix=(), suffix=(), Py_ssize_t headroom=0):
        """prefix + parts... + suffix in one new buffer, with `headroom` spare capacity."""
        cdef IdBuffer out = IdBuffer()
        cdef Py_ssize_t total = len(prefix) + len(suffix)
        for p in parts:
            total += len(p)
        out.reserve(total + headroom)
        out.length = _fill(out.data, parts, tuple(prefix), tuple(suffix))
        return out

    def splice(self, Py_ssize_t keep, parts, suffix=(), Py_ssize_t headroom=0):
        """self[:keep] + parts... + suffix: in place when no view is alive and it fits,
        otherwise in a new buffer (copy on write). Returns the buffer that holds the result."""
        cdef IdBuffer out
        cdef Py_ssize_t total = keep + len(suffix)
        if keep < 0 or keep > self.length:
            raise ValueError("keep out of range")
        for p in parts:
            total += len(p)
        if self.exports == 0 and total <= self.capacity:
            out = self
        elif self.exports == 0:
            self.reserve(total + headroom)
            out = self
        else:
            out = IdBuffer()
            out.reserve(total + headroom)
            memcpy(out.data, self.data, keep * sizeof(int))
        out.length = keep + _fill(out.data + keep, parts, (), tuple(suffix))
        return out

    def splice_into(self, IdBuffer dst not None, Py_ssize_t valid, Py_ssize_t keep, parts,
                    suffix=(), Py_ssize_t headroom=0):
        """self[:keep] + parts... + suffix written into ``dst``, whose first ``valid`` IDs
        already equal self's (only self[valid:keep] is copied): the copy on write of a session
        whose caller holds a view of self, into the buffer it held before. Returns dst.

        >>> a = IdBuffer.concat([[1, 2, 3, 4]])
        >>> b = a.splice(4, [[5]], headroom=8)    # no view alive: in place, b is a
        >>> spare = IdBuffer.concat([[1, 2, 9]])  # an older state that shares [1, 2]
        >>> list(memoryview(b.splice_into(spare, 2, 3, [[7]])))
        [1, 2, 3, 7]
        """
        cdef Py_ssize_t total = keep + len(suffix)
        if dst is self:
            raise ValueError("splice_into needs another buffer")
        if keep < 0 or keep > self.length or valid < 0 or valid > dst.length:
            raise ValueError("keep or valid out of range")
        if dst.exports:
            raise BufferError("cannot write an IdBuffer while a view of it is alive")
        for p in parts:
            total += len(p)
        if total > dst.capacity:
            dst.reserve(total + headroom)
        if valid > keep:
            valid = keep
        if keep > valid:
            memcpy(dst.data + valid, self.data + valid, (keep - valid) * sizeof(int))
        dst.length = keep + _fill(dst.data + keep, parts, (), tuple(suffix))
        return dst

    def view(self, Py_ssize_t start=0, stop=None):
        """Read-only memoryview of self[start:stop]."""
        cdef Py_ssize_t end = self.length if stop is None else stop
        return memoryview(self)[start:end]

    def __len__(self):
        return self.length

    @property
    def nbytes(self):
        """Bytes held (capacity), for memory accounting."""
        return self.capacity * sizeof(int)

    def __getbuffer__(self, Py_buffer* buf, int flags):
        fill_int32_export(buf, self, self.data, self.length, flags)
        self.exports += 1

    def __releasebuffer__(self, Py_buffer* buf):
        release_int32_export(buf)
        self.exports -= 1


cdef int fill_int32_export(Py_buffer* buf, object owner, void* data, Py_ssize_t length,
                           int flags) except -1:
    cdef Py_ssize_t* dims
    if flags & PyBUF_WRITABLE:
        raise BufferError("dtok ID buffers are read-only")
    dims = <Py_ssize_t*>PyMem_Malloc(2 * sizeof(Py_ssize_t))  # shape, strides of this export
    if dims == NULL:
        raise MemoryError()
    dims[0] = length
    dims[1] = sizeof(int)
    buf.buf = data
    buf.obj = owner
    buf.len = length * sizeof(int)
    buf.readonly = 1
    buf.itemsize = sizeof(int)
    buf.format = _FORMAT if flags & PyBUF_FORMAT else NULL
    buf.ndim = 1
    buf.shape = dims if flags & PyBUF_ND else NULL
    buf.strides = dims + 1 if flags & PyBUF_STRIDES else NULL
    buf.suboffsets = NULL
    buf.internal = dims
    return 0


cdef void release_int32_export(Py_buffer* buf) noexcept:
    PyMem_Free(buf.internal)


cdef Py_ssize_t _fill(int* o, parts, tuple prefix, tuple suffix) except -1:
    cdef Py_ssize_t pos = 0
    pos += _put(o + pos, prefix)
    for p in parts:
        pos += _put(o + pos, p)
    pos += _put(o + pos, suffix)
    return pos


def ids_from_list(list ids):
    """IdBuffer from a list of ints (the reference's Encoding.ids)."""
    return IdBuffer.concat((ids,))


def equal_ids(buffer, Py_ssize_t pos, parts):
    """buffer (int32) holds the concatenated int32 parts from index pos on."""
    cdef const int[::1] data = buffer
    cdef const int[::1] view
    cdef Py_ssize_t n
    if pos < 0:
        return False
    for p in parts:
        view = p
        n = view.shape[0]
        if pos + n > data.shape[0]:
            return False
        if n and memcmp(&data[pos], &view[0], n * sizeof(int)) != 0:
            return False
        pos += n
    return True


cdef extern from "Python.h":
    ctypedef struct PyListObject:
        PyObject** ob_item
    ctypedef struct PyObject:
        Py_ssize_t ob_refcnt


# The int objects of token IDs below this, shared by every IdList of the process: a session's
# list then costs 8 bytes a token (its item) instead of 40 (the item and an int object of its
# own); at 100K tokens 0.8 MB instead of 4 MB, so a session budget holds twice the sessions.
# The table grows to the largest ID seen (Qwen3's 151,669: ~6 MB once per process).
SHARED_INTS = 1 << 18
cdef list _ints = []


cdef list _listed(const int[::1] view, Py_ssize_t start, Py_ssize_t n):
    """``view[start:n]`` as a list of int objects, each the shared one of its value."""
    cdef Py_ssize_t j, size, top = -1
    cdef int v
    cdef list table = _ints, out = []
    for j in range(start, n):
        if view[j] > top:
            top = view[j]
    size = len(table)
    if size <= top and size < SHARED_INTS:  # IDs above the table's bound get their own
        size = min(SHARED_INTS, ((top >> 12) + 1) << 12)
        table.extend(range(len(table), size))
    for j in range(start, n):
        v = view[j]
        out.append(table[v] if 0 <= v < size else v)
    return out


cdef class IdList:
    """A session's IDs as a Python list (what serving engines take), kept up to date in
    O(changed IDs) instead of O(all IDs). Its int objects are shared with every other IdList
    of the process (``SHARED_INTS``): a list costs 8 bytes a token, not 40.

    ``update(ids, keep)`` returns a list equal to ``ids`` (an int32 buffer); ``keep`` says how
    many leading IDs did not change since the last update. The list handed out last time is
    updated in place when nobody else holds it any more (its reference count) and its first
    ``keep`` items are still the ones handed out (a pointer comparison with a private copy, at
    memory speed: a holder that changed it and let go is caught). A caller that holds the last
    list while asking for the next one (``ids = encode_list(...)`` in a loop) gets the list it
    held before, the *spare*, brought up to date from where it last agreed (``spare_valid``)
    when nobody holds that one; otherwise a new list is made from the private copy. A list
    held elsewhere never changes.

    >>> from array import array
    >>> il = IdList()
    >>> a = il.update(memoryview(array("i", [1, 2, 3])), 0)
    >>> b = il.update(memoryview(array("i", [1, 2, 4, 5])), 2)   # `a` is still held: a new list
    >>> a == [1, 2, 3], b == [1, 2, 4, 5], a is b
    (True, True, False)
    >>> del a, b
    >>> c = il.update(memoryview(array("i", [1, 2, 4, 5, 6])), 4)
    >>> c == [1, 2, 4, 5, 6], il.in_place
    (True, 1)
    >>> d = il.update(memoryview(array("i", [1, 2, 4, 5, 6, 7])), 5)  # `c` held: the spare
    >>> d is not c, d == [1, 2, 4, 5, 6, 7], c == [1, 2, 4, 5, 6], il.from_spare
    (True, True, True, 1)
    >>> del c  # as ``ids = encode_list(...)`` in a loop lets go of the list before the last
    >>> e = il.update(memoryview(array("i", [1, 2, 4, 5, 6, 7, 8])), 6)  # `d` held: c's list
    >>> e == [1, 2, 4, 5, 6, 7, 8], d == [1, 2, 4, 5, 6, 7], il.from_spare
    (True, True, 2)
    """

    cdef list truth  # private: never handed out
    cdef object out  # the list handed out last
    cdef object spare  # the one handed out before it
    cdef Py_ssize_t spare_valid  # its leading items that still equal truth's
    cdef readonly Py_ssize_t in_place  # updates done in place (for tests and stats)
    cdef readonly Py_ssize_t from_spare  # updates done in the spare
    cdef readonly Py_ssize_t made  # lists built whole (O(all IDs))

    def __cinit__(self):
        self.truth = []
        self.out = None
        self.spare = None
        self.spare_valid = 0
        self.in_place = 0
        self.from_spare = 0
        self.made = 0

    @property
    def nbytes(self):
        """Bytes held: the lists' item arrays (the int objects are the process's shared ones)."""
        n = len(self.truth)
        return n * 8 + (n * 8 if self.out is not None else 0) \
            + (len(self.spare) * 8 if self.spare is not None else 0)

    def update(self, ids, Py_ssize_t keep):
        cdef const int[::1] view = ids
        cdef Py_ssize_t n = view.shape[0], n_prev = len(self.truth), j, valid
        cdef list truth = self.truth
        cdef list out, spare
        if keep > n_prev:
            keep = n_prev
        if keep > n:
            keep = n
        del truth[keep:]
        truth.extend(_listed(view, keep, n))
        out = self.out
        self.out = None
        spare = self.spare
        self.spare = None
        valid = min(self.spare_valid, keep)
        # only `out` (the local) refers to the list now, if nobody else holds it
        if _unchanged(out, truth, n_prev, keep):
            del out[keep:]
            out.extend(truth[keep:])
            self.in_place += 1
            self.spare, self.spare_valid = spare, valid
        else:
            if _unchanged(spare, truth, -1, valid):  # the caller holds `out`: its spare
                del spare[valid:]
                spare.extend(truth[valid:])
                self.from_spare += 1
            else:
                spare = list(truth)
                self.made += 1
            if out is not None:
                self.spare, self.spare_valid = out, keep
            out = spare
        self.out = out
        return out


cdef bint _unchanged(object lst, list truth, Py_ssize_t length, Py_ssize_t keep):
    """``lst`` is held by nobody but the caller's one local (a borrowed argument adds no
    reference), has ``length`` items (-1: any) and its first ``keep`` items are truth's (pointer
    comparison)."""
    return (lst is not None and (<PyObject*>lst).ob_refcnt == 1 and
            (length < 0 or len(lst) == length) and len(lst) >= keep and
            memcmp((<PyListObject*>lst).ob_item, (<PyListObject*>truth).ob_item,
                   keep * sizeof(PyObject*)) == 0)
