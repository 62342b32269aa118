"""Shared-memory transport for the pool: the per-worker control block, raw string copies and
int32 ID copies, and views of IDs that live in shared memory.

A request moves a str as its raw PEP 393 buffer (1, 2 or 4 bytes per code point): one memcpy
in, one ``PyUnicode_FromKindAndData`` out, no UTF-8 transcode. The control block's sequence
numbers are written last with release stores and read with acquire loads, so a side that sees a
new sequence number also sees everything written before it.
"""
from libc.stdint cimport uint32_t, uint64_t
from libc.string cimport memcpy, memset

from dtok_ext.buffers cimport IdBuffer, fill_int32_export, release_int32_export
from dtok_ext.unicode_text cimport PyUnicode_DATA, PyUnicode_GET_LENGTH, PyUnicode_KIND

cdef extern from "Python.h":
    object PyUnicode_FromKindAndData(int kind, const void* buffer, Py_ssize_t size)

cdef extern from *:
    """
    static inline unsigned long long dtok_load_acquire(const unsigned long long* p) {
        return __atomic_load_n(p, __ATOMIC_ACQUIRE);
    }
    static inline void dtok_store_release(unsigned long long* p, unsigned long long v) {
        __atomic_store_n(p, v, __ATOMIC_RELEASE);
    }
    """
    unsigned long long dtok_load_acquire(const unsigned long long* p) nogil
    void dtok_store_release(unsigned long long* p, unsigned long long v) nogil


ctypedef struct ControlBlock:
    # front end -> worker
    uint64_t req_seq          # written last (release)
    uint32_t op
    uint32_t kind             # kind of the text (1, 2, 4)
    uint64_t text_chars
    uint32_t flags
    uint32_t reserved_a
    uint64_t plan_words       # int64 words of the plan table in the payload (session ops)
    uint64_t payload_gen
    uint64_t result_gen
    uint64_t session_id
    uint64_t seg_gen          # session segment to write into
    uint64_t old_seg_gen      # segment holding the session's current IDs (0: none; == seg_gen: in place)
    uint64_t seg_capacity     # ints
    uint64_t n_body           # current body length of the session (IDs, no prefix/suffix)
    uint64_t n_drops          # session ids to forget, first in the payload
    uint64_t dst_valid        # leading ints of the target segment that already hold the current IDs
    uint64_t reserved0[2]
    # worker -> front end
    uint64_t resp_seq         # written last (release)
    uint32_t status
    uint32_t reserved1
    uint64_t n_ids
    uint64_t keep             # leading IDs (prefix included) that did not change
    uint64_t report_words     # int64 words of the session report in the result segment
    double service_ms
    double picked_at          # CLOCK_MONOTONIC seconds: the worker saw the request
    double answered_at        # ... and published the answer
    uint64_t pid
    uint64_t tasks_done
    uint64_t ready
    uint64_t reserved2[2]
    char error[512]

CONTROL_SIZE = 4096
assert sizeof(ControlBlock) <= 4096



cdef class Control:
    """Typed access to a worker's control block inside a shared mapping."""

    cdef unsigned char[::1] _mem
    cdef ControlBlock* c

    def __init__(self, buffer):
        self._mem = buffer
        if self._mem.shape[0] < CONTROL_SIZE:
            raise ValueError("control mapping too small")
        self.c = <ControlBlock*>&self._mem[0]

    def release(self):
        self.c = NULL
        self._mem = None

    def clear(self):
        memset(self.c, 0, sizeof(ControlBlock))

    # request / response publication
    def publish_request(self, unsigned long long seq):
        dtok_store_release(<unsigned long long*>&self.c.req_seq, seq)

    def publish_response(self, unsigned long long seq):
        dtok_store_release(<unsigned long long*>&self.c.resp_seq, seq)

    @property
    def req_seq(self):
        return dtok_load_acquire(<const unsigned long long*>&self.c.req_seq)

    @property
    def resp_seq(self):
        return dtok_load_acquire(<const unsigned long long*>&self.c.resp_seq)

    property op:
        def __get__(self): return self.c.op
        def __set__(self, v): self.c.op = v
    property kind:
        def __get__(self): return self.c.kind
        def __set__(self, v): self.c.kind = v
    property text_chars:
        def __get__(self): return self.c.text_chars
        def __set__(self, v): self.c.text_chars = v
    property flags:
        def __get__(self): return self.c.flags
        def __set__(self, v): self.c.flags = v
    property plan_words:
        def __get__(self): return self.c.plan_words
        def __set__(self, v): self.c.plan_words = v
    property payload_gen:
        def __get__(self): return self.c.payload_gen
        def __set__(self, v): self.c.payload_gen = v
    property result_gen:
        def __get__(self): return self.c.result_gen
        def __set__(self, v): self.c.result_gen = v
    property session_id:
        def __get__(self): return self.c.session_id
        def __set__(self, v): self.c.session_id = v
    property seg_gen:
        def __get__(self): return self.c.seg_gen
        def __set__(self, v): self.c.seg_gen = v
    property old_seg_gen:
        def __get__(self): return self.c.old_seg_gen
        def __set__(self, v): self.c.old_seg_gen = v
    property seg_capacity:
        def __get__(self): return self.c.seg_capacity
        def __set__(self, v): self.c.seg_capacity = v
    property n_body:
        def __get__(self): return self.c.n_body
        def __set__(self, v): self.c.n_body = v
    property n_drops:
        def __get__(self): return self.c.n_drops
        def __set__(self, v): self.c.n_drops = v
    property dst_valid:
        def __get__(self): return self.c.dst_valid
        def __set__(self, v): self.c.dst_valid = v
    property status:
        def __get__(self): return self.c.status
        def __set__(self, v): self.c.status = v
    property n_ids:
        def __get__(self): return self.c.n_ids
        def __set__(self, v): self.c.n_ids = v
    property keep:
        def __get__(self): return self.c.keep
        def __set__(self, v): self.c.keep = v
    property report_words:
        def __get__(self): return self.c.report_words
        def __set__(self, v): self.c.report_words = v
    property service_ms:
        def __get__(self): return self.c.service_ms
        def __set__(self, v): self.c.service_ms = v
    property picked_at:
        def __get__(self): return self.c.picked_at
        def __set__(self, v): self.c.picked_at = v
    property answered_at:
        def __get__(self): return self.c.answered_at
        def __set__(self, v): self.c.answered_at = v
    property pid:
        def __get__(self): return self.c.pid
        def __set__(self, v): self.c.pid = v
    property tasks_done:
        def __get__(self): return self.c.tasks_done
        def __set__(self, v): self.c.tasks_done = v
    property ready:
        def __get__(self): return self.c.ready
        def __set__(self, v): self.c.ready = v

    property error:
        def __get__(self):
            return (<bytes>self.c.error).decode("utf-8", "replace")
        def __set__(self, str v):
            cdef bytes b = v.encode("utf-8", "replace")[:511]
            memcpy(self.c.error, <const char*>b, len(b))
            self.c.error[len(b)] = 0


def str_nbytes(str s not None):
    """Bytes of the raw PEP 393 buffer of s."""
    return PyUnicode_GET_LENGTH(s) * PyUnicode_KIND(s)


def utf8_length(str s not None):
    """Bytes of s in UTF-8, counted from its PEP 393 buffer (no copy); a lone surrogate counts 3."""
    cdef Py_ssize_t n = PyUnicode_GET_LENGTH(s), i, total = 0
    cdef int kind = PyUnicode_KIND(s)
    cdef const unsigned char* d1
    cdef const unsigned short* d2
    cdef const unsigned int* d4
    cdef unsigned int c
    if kind == 1:
        d1 = <const unsigned char*>PyUnicode_DATA(s)
        for i in range(n):
            total += 1 + (d1[i] >> 7)
    elif kind == 2:
        d2 = <const unsigned short*>PyUnicode_DATA(s)
        for i in range(n):
            c = d2[i]
            total += 1 if c < 0x80 else (2 if c < 0x800 else 3)
    else:
        d4 = <const unsigned int*>PyUnicode_DATA(s)
        for i in range(n):
            c = d4[i]
            total += 1 if c < 0x80 else (2 if c < 0x800 else (3 if c < 0x10000 else 4))
    return total


def write_str(buffer, Py_ssize_t offset, str s not None):
    """Copy s's raw buffer to buffer[offset:]; returns its kind."""
    cdef unsigned char[::1] mem = buffer
    cdef Py_ssize_t n = PyUnicode_GET_LENGTH(s) * PyUnicode_KIND(s)
    if offset < 0 or offset + n > mem.shape[0]:
        raise ValueError("string does not fit")
    if n:
        memcpy(&mem[offset], PyUnicode_DATA(s), n)
    return PyUnicode_KIND(s)


def read_str(buffer, Py_ssize_t offset, int kind, Py_ssize_t nchars):
    """A str from a raw PEP 393 buffer written by write_str."""
    cdef const unsigned char[::1] mem = buffer
    if kind not in (1, 2, 4):
        raise ValueError("bad string kind")
    if offset < 0 or offset + nchars * kind > mem.shape[0]:
        raise ValueError("string out of range")
    if nchars == 0:
        return ""
    return PyUnicode_FromKindAndData(kind, &mem[offset], nchars)


def write_ids(buffer, Py_ssize_t offset_ints, parts):
    """Write int32 parts (buffers or tuples) consecutively at buffer[offset_ints*4:];
    returns the number of ints written."""
    cdef unsigned char[::1] mem = buffer
    cdef int* out = <int*>&mem[0]
    cdef Py_ssize_t cap = mem.shape[0] // sizeof(int), pos = offset_ints, n, j
    cdef const int[::1] view
    for p in parts:
        if type(p) is tuple:
            n = len(p)
            if pos + n > cap:
                raise ValueError("IDs do not fit")
            for j in range(n):
                out[pos + j] = <int>p[j]
        else:
            view = p
            n = view.shape[0]
            if pos + n > cap:
                raise ValueError("IDs do not fit")
            if n:
                memcpy(out + pos, &view[0], n * sizeof(int))
        pos += n
    return pos - offset_ints


def copy_ids(src, Py_ssize_t src_offset, dst, Py_ssize_t dst_offset, Py_ssize_t n):
    """Copy n int32 values between two buffers (offsets in ints)."""
    cdef const unsigned char[::1] a = src
    cdef unsigned char[::1] b = dst
    if n < 0 or (src_offset + n) * 4 > a.shape[0] or (dst_offset + n) * 4 > b.shape[0]:
        raise ValueError("copy out of range")
    if n:
        memcpy(&b[dst_offset * 4], &a[src_offset * 4], n * 4)


def read_ids(buffer, Py_ssize_t offset_ints, Py_ssize_t n):
    """A private int32 copy (IdBuffer) of n values at buffer[offset_ints*4:]."""
    cdef const unsigned char[::1] mem = buffer
    if n < 0 or (offset_ints + n) * 4 > mem.shape[0]:
        raise ValueError("IDs out of range")
    return IdBuffer.concat((memoryview(buffer)[offset_ints * 4 : (offset_ints + n) * 4].cast("i"),))


cdef class MappedIds:
    """Read-only views of int32 IDs that live in a shared mapping, with an export count.

    The front end never lets a worker write under a view that is alive: while ``exports`` is
    non-zero a session's next splice goes to a new segment.
    """

    cdef object mapping
    cdef const unsigned char[::1] _mem
    cdef readonly Py_ssize_t capacity      # ints
    cdef public Py_ssize_t length          # ints currently valid
    cdef readonly Py_ssize_t exports

    def __init__(self, mapping, Py_ssize_t capacity):
        self.mapping = mapping
        self._mem = mapping
        if capacity * 4 > self._mem.shape[0]:
            raise ValueError("capacity exceeds the mapping")
        self.capacity = capacity
        self.length = 0
        self.exports = 0

    def release(self):
        """Drop the pointer into the mapping (call once no view is alive)."""
        if self.exports:
            raise BufferError("views of these IDs are still alive")
        self._mem = None
        self.mapping = None

    def view(self, Py_ssize_t start=0, stop=None):
        cdef Py_ssize_t end = self.length if stop is None else stop
        return memoryview(self)[start:end]

    def __len__(self):
        return self.length

    def __getbuffer__(self, Py_buffer* buf, int flags):
        if self._mem is None:
            raise BufferError("released")
        fill_int32_export(buf, self, <void*>&self._mem[0], self.length, flags)
        self.exports += 1

    def __releasebuffer__(self, Py_buffer* buf):
        release_int32_export(buf)
        self.exports -= 1
