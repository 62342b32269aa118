# Read-only access to a str's PEP 393 buffer (1, 2 or 4 bytes per code point) without copying it.
# Every scan in dtok_ext goes through UText so that it can run with the GIL released.

cdef extern from "Python.h":
    int PyUnicode_KIND(object u)
    void* PyUnicode_DATA(object u)
    Py_ssize_t PyUnicode_GET_LENGTH(object u)
    ctypedef unsigned char Py_UCS1
    ctypedef unsigned short Py_UCS2


ctypedef struct UText:
    int kind
    const void* data
    Py_ssize_t length


cdef inline UText utext_of(str s) noexcept:
    # The caller keeps `s` alive for as long as the UText is used.
    cdef UText t
    t.kind = PyUnicode_KIND(s)
    t.data = PyUnicode_DATA(s)
    t.length = PyUnicode_GET_LENGTH(s)
    return t


cdef inline Py_UCS4 uread(const UText* t, Py_ssize_t i) noexcept nogil:
    if t.kind == 1:
        return (<const Py_UCS1*>t.data)[i]
    elif t.kind == 2:
        return (<const Py_UCS2*>t.data)[i]
    return (<const Py_UCS4*>t.data)[i]
