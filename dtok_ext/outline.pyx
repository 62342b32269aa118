# cython: language_level=3
"""A tokenizer.json document without its bulk: the model's vocabulary and merges emptied before
the document is parsed, so that admission (which reads only the small sections) does not build
~50 MB of Python objects for a 150K-entry vocabulary (and leave ~3 MiB of allocator space behind).

The document is scanned once, at memory speed, for the top-level object's members; inside each
top-level member named ``outer`` (an object) the values of the members named in ``inner`` are
replaced by an empty container of their own kind (``{}`` or ``[]``). Parsing the result gives
exactly what parsing the document gives, those values emptied. Anything the scan does not expect
gives None (the caller parses the whole document): it never guesses.
"""
import json

cdef inline Py_ssize_t skip_ws(const unsigned char* s, Py_ssize_t i, Py_ssize_t n) noexcept nogil:
    while i < n and (s[i] == 32 or s[i] == 9 or s[i] == 10 or s[i] == 13):
        i += 1
    return i


cdef inline Py_ssize_t skip_string(const unsigned char* s, Py_ssize_t i, Py_ssize_t n) noexcept nogil:
    """i at an opening quote: the index after the closing one (-1: unterminated)."""
    i += 1
    while i < n:
        if s[i] == 92:  # backslash: the next byte is escaped
            i += 2
        elif s[i] == 34:
            return i + 1
        else:
            i += 1
    return -1


cdef Py_ssize_t skip_value(const unsigned char* s, Py_ssize_t i, Py_ssize_t n) noexcept nogil:
    """i at a value's first byte: the index after it (-1: malformed)."""
    cdef Py_ssize_t depth = 0
    cdef unsigned char c
    if i >= n:
        return -1
    c = s[i]
    if c == 34:
        return skip_string(s, i, n)
    if c != 123 and c != 91:  # a number, true, false, null
        while i < n and s[i] not in b",}] \t\n\r":
            i += 1
        return i
    while i < n:
        c = s[i]
        if c == 34:
            i = skip_string(s, i, n)
            if i < 0:
                return -1
            continue
        if c == 123 or c == 91:
            depth += 1
        elif c == 125 or c == 93:
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    return -1


cdef object key_at(bytes raw, Py_ssize_t start, Py_ssize_t end):
    """The member name raw[start:end] (quotes included) as the parser reads it."""
    cdef bytes quoted = raw[start:end]
    if b"\\" in quoted:
        return json.loads(quoted)
    return quoted[1 : len(quoted) - 1].decode("utf-8")


cdef tuple members(bytes raw, Py_ssize_t i, Py_ssize_t n):
    """The members of the object opening at raw[i], ``[(name, value_start, value_end)]``, and
    the index after the object; None when malformed. (No negative indexing in this module: it
    is built with ``wraparound=False``.)"""
    cdef const unsigned char* s = raw
    cdef Py_ssize_t k0, k1, v0, v1
    out = []
    i = skip_ws(s, i + 1, n)
    if i < n and s[i] == 125:
        return out, i + 1
    while True:
        if i >= n or s[i] != 34:
            return None
        k0 = i
        k1 = skip_string(s, i, n)
        if k1 < 0:
            return None
        i = skip_ws(s, k1, n)
        if i >= n or s[i] != 58:  # ':'
            return None
        v0 = skip_ws(s, i + 1, n)
        with nogil:
            v1 = skip_value(s, v0, n)
        if v1 <= v0:
            return None
        out.append((key_at(raw, k0, k1), v0, v1))
        i = skip_ws(s, v1, n)
        if i < n and s[i] == 44:  # ','
            i = skip_ws(s, i + 1, n)
            continue
        if i < n and s[i] == 125:
            return out, i + 1
        return None


def emptied(bytes raw not None, str outer, frozenset inner):
    """``raw`` (a JSON object, UTF-8) with the values of ``inner`` members of each top-level
    ``outer`` object replaced by empty containers of the same kind; None when the document is
    not what the scan expects.

    >>> emptied(b'{"model": {"type": "BPE", "vocab": {"a": 0}, "merges": [["a", "b"]]}, "x": [1]}',
    ...         "model", frozenset({"vocab", "merges"}))
    b'{"model": {"type": "BPE", "vocab": {}, "merges": []}, "x": [1]}'
    """
    cdef const unsigned char* s = raw
    cdef Py_ssize_t n = len(raw), i
    i = skip_ws(s, 0, n)
    if i >= n or s[i] != 123:
        return None
    try:
        top = members(raw, i, n)
    except ValueError:  # a member name that is not UTF-8 or not a JSON string
        return None
    if top is None or skip_ws(s, top[1], n) != n:
        return None
    cuts = []  # value spans to empty, in order
    for name, v0, v1 in top[0]:
        if name != outer or s[v0] != 123:
            continue
        try:
            inside = members(raw, v0, v1)
        except ValueError:
            return None
        if inside is None or inside[1] != v1:
            return None
        for inner_name, w0, w1 in inside[0]:
            if inner_name in inner and (s[w0] == 123 or s[w0] == 91):
                cuts.append((w0, w1))
    pieces = []
    i = 0
    for w0, w1 in cuts:
        pieces.append(raw[i:w0])
        pieces.append(b"{}" if s[w0] == 123 else b"[]")
        i = w1
    pieces.append(raw[i:])
    return b"".join(pieces)
