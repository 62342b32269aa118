"""Binary min-heaps of tasks for the pool scheduler, and the non-ASCII share used by the
service-time estimate.

A task's key never changes while it waits (shortest-first keys are the estimate plus the aged
arrival time), so each queue is a plain heap: push and pop in O(log n), peek in O(1).
"""
from cpython.mem cimport PyMem_Free, PyMem_Realloc
from cpython.ref cimport Py_DECREF, Py_INCREF, PyObject

from dtok_ext.unicode_text cimport UText, uread, utext_of


cdef inline bint _less(HeapItem* a, HeapItem* b) noexcept nogil:
    return a.key < b.key or (a.key == b.key and a.seq < b.seq)


cdef class TaskHeap:
    """Min-heap of (key, seq, task).

    >>> h = TaskHeap()
    >>> h.push(2.0, 1, "b"); h.push(1.0, 2, "a"); h.push(1.0, 3, "c")
    >>> h.peek_key(), len(h)
    (1.0, 3)
    >>> [h.pop() for _ in range(3)]
    ['a', 'c', 'b']
    >>> h.peek_key() is None
    True
    """

    def __cinit__(self):
        self.items = NULL
        self.size = 0
        self.cap = 0

    def __dealloc__(self):
        cdef Py_ssize_t i
        for i in range(self.size):
            Py_DECREF(<object>self.items[i].obj)
        PyMem_Free(self.items)

    def __len__(self):
        return self.size

    def push(self, double key, long long seq, obj):
        cdef Py_ssize_t i, parent
        cdef HeapItem item
        cdef HeapItem* grown
        if self.size == self.cap:
            grown = <HeapItem*>PyMem_Realloc(self.items, max(16, 2 * self.cap) * sizeof(HeapItem))
            if grown == NULL:
                raise MemoryError()
            self.items = grown
            self.cap = max(16, 2 * self.cap)
        Py_INCREF(obj)
        item.key = key
        item.seq = seq
        item.obj = <void*>obj
        i = self.size
        self.size += 1
        while i > 0:
            parent = (i - 1) >> 1
            if not _less(&item, &self.items[parent]):
                break
            self.items[i] = self.items[parent]
            i = parent
        self.items[i] = item

    def peek_key(self):
        """Key of the smallest task, or None when empty (constant time)."""
        if self.size == 0:
            return None
        return self.items[0].key

    def pop(self):
        """Remove and return the smallest task."""
        cdef HeapItem last
        cdef Py_ssize_t i = 0, child
        if self.size == 0:
            raise IndexError("pop from an empty TaskHeap")
        out = <object>self.items[0].obj
        Py_DECREF(out)  # the heap's reference; `out` holds its own
        self.size -= 1
        if self.size:
            last = self.items[self.size]
            while True:
                child = 2 * i + 1
                if child >= self.size:
                    break
                if child + 1 < self.size and _less(&self.items[child + 1], &self.items[child]):
                    child += 1
                if not _less(&self.items[child], &last):
                    break
                self.items[i] = self.items[child]
                i = child
            self.items[i] = last
        return out

    def drain(self):
        """Remove and return every task (any order)."""
        out = []
        while self.size:
            out.append(self.pop())
        return out


def nonascii_share(str text not None):
    """Share of non-ASCII characters: exact up to 2,048 characters, else from four windows of
    512 spread over the text (the estimate only orders queues, so it may be rough)."""
    cdef UText t = utext_of(text)
    cdef Py_ssize_t n = t.length, i, w, start, count = 0, seen = 0
    if t.kind == 1 and text.isascii():
        return 0.0
    if n == 0:
        return 0.0
    if n <= 2048:
        for i in range(n):
            count += uread(&t, i) > 127
        return count / <double>n
    for w in range(4):
        start = (n - 512) * w // 3
        for i in range(start, start + 512):
            count += uread(&t, i) > 127
        seen += 512
    return count / <double>seen
