# A str's UTF-8 written once where every encoder finds it (see utf8.pyx).

cdef bint cache_utf8_if_clean(str text, const unsigned char* flags, unsigned char refuse,
                              unsigned char need) noexcept
