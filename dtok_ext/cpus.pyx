"""Which CPU the calling thread runs on: what dtok's encoding threads are kept off when they are
woken beside it (:mod:`dtok.encode_threads`).

>>> current_cpu() >= -1
True
"""

cdef extern from *:
    """
    #if defined(__linux__)
    #include <sched.h>
    static int dtok_current_cpu(void) { return sched_getcpu(); }
    #else
    static int dtok_current_cpu(void) { return -1; }
    #endif
    """
    int dtok_current_cpu() nogil


def current_cpu() -> int:
    """The CPU the calling thread is running on now (it may move right after), or -1 where the
    system does not say (not Linux)."""
    return dtok_current_cpu()
