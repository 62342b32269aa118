"""Find every occurrence of every added-token string near a position, overlapping ones included.

The reference scans added tokens leftmost-longest, so of two overlapping occurrences only one is
selected; a cut inside the other could still change which one a chunk's scan selects. The cut rules
therefore ask about *all* occurrences, which is what an Aho-Corasick automaton reports.
"""
from array import array

from dtok_ext.unicode_text cimport UText, uread, utext_of


cdef class SpecialMatcher:
    """Automaton over a fixed list of strings.

    >>> m = SpecialMatcher(["<|a|>", "|a"])
    >>> m.find_all("x<|a|>y")
    [(1, 6), (2, 4)]
    """

    def __init__(self, patterns):
        pats = sorted({p for p in patterns if p})
        goto = [{}]
        term = [0]
        for p in pats:
            node = 0
            for ch in p:
                nxt = goto[node].get(ch)
                if nxt is None:
                    nxt = len(goto)
                    goto[node][ch] = nxt
                    goto.append({})
                    term.append(0)
                node = nxt
            term[node] = len(p)
        n = len(goto)
        fail = [0] * n
        order = []
        queue = list(goto[0].values())
        while queue:  # breadth-first, so a node's fail target is finished before the node
            order.extend(queue)
            nxt_queue = []
            for node in queue:
                for ch, child in goto[node].items():
                    f = fail[node]
                    while f and ch not in goto[f]:
                        f = fail[f]
                    fail[child] = goto[f].get(ch, 0)
                    nxt_queue.append(child)
            queue = nxt_queue
        dict_link = [-1] * n
        max_out = [0] * n
        for node in order:
            f = fail[node]
            dict_link[node] = f if term[f] else dict_link[f]
            max_out[node] = max(term[node], max_out[f])
        edge_begin, edge_end, edge_char, edge_next = [], [], [], []
        for node in range(n):
            edge_begin.append(len(edge_char))
            for ch in sorted(goto[node]):
                edge_char.append(ord(ch))
                edge_next.append(goto[node][ch])
            edge_end.append(len(edge_char))
        arrays = (
            array("i", edge_begin), array("i", edge_end), array("I", edge_char or [0]),
            array("i", edge_next or [0]), array("i", fail), array("i", term),
            array("i", dict_link), array("i", max_out),
        )
        assert arrays[2].itemsize == 4
        self._arrays = arrays
        cdef int[::1] v
        cdef unsigned int[::1] u
        v = arrays[0]; self.edge_begin = &v[0]
        v = arrays[1]; self.edge_end = &v[0]
        u = arrays[2]; self.edge_char = <const Py_UCS4*>&u[0]
        v = arrays[3]; self.edge_next = &v[0]
        v = arrays[4]; self.fail = &v[0]
        v = arrays[5]; self.term_len = &v[0]
        v = arrays[6]; self.dict_link = &v[0]
        v = arrays[7]; self.max_out = &v[0]
        self.n_nodes = n
        self.n_patterns = len(pats)
        self.max_len = max((len(p) for p in pats), default=0)
        # Which code points start some pattern: a cheap test before running the automaton
        # (most windows of ordinary text hold no such character). Astral ones are all "maybe"
        # when some pattern starts with one (emoji-rich text would otherwise always run it).
        starts = bytearray(0x10000)
        self.astral_starts = False
        for p in pats:
            if ord(p[0]) < 0x10000:
                starts[ord(p[0])] = 1
            else:
                self.astral_starts = True
        self._starts = bytes(starts)
        self.starts = <const unsigned char*>self._starts

    cdef int _goto(self, int node, Py_UCS4 ch) noexcept nogil:
        cdef int lo = self.edge_begin[node], hi = self.edge_end[node], mid
        while lo < hi:
            mid = (lo + hi) >> 1
            if self.edge_char[mid] < ch:
                lo = mid + 1
            else:
                hi = mid
        if lo < self.edge_end[node] and self.edge_char[lo] == ch:
            return self.edge_next[lo]
        return -1

    cdef int _step(self, int state, Py_UCS4 ch) noexcept nogil:
        cdef int nxt
        while True:
            nxt = self._goto(state, ch)
            if nxt >= 0:
                return nxt
            if state == 0:
                return 0
            state = self.fail[state]

    cdef bint may_start_in(self, const UText* t, Py_ssize_t start, Py_ssize_t stop) noexcept nogil:
        """Some character of t[start:stop] may begin a pattern."""
        cdef Py_ssize_t i
        cdef Py_UCS4 c
        for i in range(start, stop):
            c = uread(t, i)
            if c < 0x10000:
                if self.starts[c]:
                    return True
            elif self.astral_starts:
                return True
        return False

    cdef bint may_touch(self, const UText* t, Py_ssize_t lo, Py_ssize_t hi) noexcept nogil:
        """Whether an occurrence might start at, end at or cover some position b in [lo, hi]:
        such an occurrence [s, e) has b - max_len <= s <= b, and t[s] begins a pattern. False
        lets a scan over those positions skip the automaton."""
        if self.max_len == 0:
            return False
        lo -= self.max_len
        if lo < 0:
            lo = 0
        if hi >= t.length:
            hi = t.length - 1
        return self.may_start_in(t, lo, hi + 1)

    cdef bint covers(self, const UText* t, Py_ssize_t b) noexcept nogil:
        """Some occurrence [s, e) has s < b < e."""
        cdef Py_ssize_t i, e, start, stop
        cdef int state = 0
        if self.max_len < 2:
            return False
        start = b - self.max_len + 1
        if start < 0:
            start = 0
        if not self.may_start_in(t, start, b):  # an occurrence covering b starts before it
            return False
        stop = b + self.max_len - 1
        if stop > t.length:
            stop = t.length
        for i in range(start, stop):
            state = self._step(state, uread(t, i))
            e = i + 1
            if e > b and self.max_out[state] > e - b:
                return True
        return False

    cdef bint starts_at(self, const UText* t, Py_ssize_t b, Py_ssize_t limit) noexcept nogil:
        """Some occurrence [b, e) has e <= limit."""
        cdef Py_ssize_t i
        cdef int node = 0
        for i in range(b, limit):
            node = self._goto(node, uread(t, i))
            if node < 0:
                return False
            if self.term_len[node]:
                return True
        return False

    cdef bint ends_at_unshadowed(self, const UText* t, Py_ssize_t b) noexcept nogil:
        """Some occurrence [s, b) exists and no occurrence covers s.

        With no occurrence covering b either, the leftmost-longest scan then selects an
        occurrence that ends exactly at b, whatever precedes it.
        """
        cdef Py_ssize_t i, start
        cdef int state = 0, node
        if self.max_len == 0 or b <= 0:
            return False
        start = b - self.max_len
        if start < 0:
            start = 0
        if not self.may_start_in(t, start, b):
            return False
        for i in range(start, b):
            state = self._step(state, uread(t, i))
        node = state if self.term_len[state] else self.dict_link[state]
        while node > 0:
            if not self.covers(t, b - self.term_len[node]):
                return True
            node = self.dict_link[node]
        return False

    cdef bint touches(self, const UText* t, Py_ssize_t a, Py_ssize_t c) noexcept nogil:
        """Some occurrence [s, e) overlaps [a, c): s < c and e > a."""
        cdef Py_ssize_t i, e, start, stop, over
        cdef int state = 0
        if self.max_len == 0:
            return False
        start = a - self.max_len + 1
        if start < 0:
            start = 0
        stop = c + self.max_len - 1
        if stop > t.length:
            stop = t.length
        if not self.may_start_in(t, start, c if c < stop else stop):  # occurrences start before c
            return False
        for i in range(start, stop):
            state = self._step(state, uread(t, i))
            e = i + 1
            if e > a and self.max_out[state] > 0:
                over = e - c
                if over < 0:
                    over = 0
                if self.max_out[state] > over:
                    return True
        return False

    # Python-level views, for tests and explain().

    def find_all(self, str text):
        """Every occurrence (start, end) of every pattern, sorted."""
        cdef UText t = utext_of(text)
        cdef Py_ssize_t i
        cdef int state = 0, node
        out = []
        for i in range(t.length):
            state = self._step(state, uread(&t, i))
            node = state if self.term_len[state] else self.dict_link[state]
            while node > 0:
                out.append((i + 1 - self.term_len[node], i + 1))
                node = self.dict_link[node]
        out.sort()
        return out

    def covers_position(self, str text, Py_ssize_t b):
        cdef UText t = utext_of(text)
        return bool(self.covers(&t, b))

    def touches_range(self, str text, Py_ssize_t a, Py_ssize_t c):
        cdef UText t = utext_of(text)
        return bool(self.touches(&t, a, c))
