# Scheduler heaps (see heap.pyx).

cdef struct HeapItem:
    double key
    long long seq          # tie-break: arrival order
    void* obj              # a strong reference, owned by the heap


cdef class TaskHeap:
    cdef HeapItem* items
    cdef Py_ssize_t size
    cdef Py_ssize_t cap
