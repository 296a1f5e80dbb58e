# cython: language_level=3, boundscheck=False, wraparound=False
"""Cython twin of dra_driver.allocator.quantity.parse_quantity.

The scanner walks the string once with C chars and keeps the mantissa in a C integer while it
fits (every realistic quantity); only 19+ significant digits fall back to Python integers.
Semantics must match the reference exactly: tests compare both on fixed and random inputs.
Request rounding (`round_request`) has no twin: it runs once per candidate device, on Python
integers, so it has one arithmetic and no overflow at any int64 edge.
"""

from dra_driver.allocator.quantity import (
    BINARY_SUFFIXES,
    DECIMAL_SUFFIXES,
    INT64_MAX,
    MAX_EXPONENT,
    QuantityError,
)


cdef inline bint _is_digit(Py_UCS4 c):
    return c >= u'0' and c <= u'9'


cdef int _exponent(str suffix, str text) except? -99999:
    cdef Py_ssize_t i = 1, n = len(suffix)
    cdef int esign = 1
    cdef long value = 0
    if i < n and (suffix[i] == u'+' or suffix[i] == u'-'):
        if suffix[i] == u'-':
            esign = -1
        i += 1
    if i >= n:
        raise QuantityError(f"quantity {text!r} has a malformed exponent")
    if n - i > 4:
        raise QuantityError(f"quantity {text!r} is out of range")
    while i < n:
        if not _is_digit(suffix[i]):
            raise QuantityError(f"quantity {text!r} has a malformed exponent")
        value = value * 10 + (<long>suffix[i] - 48)
        i += 1
    if value > MAX_EXPONENT * 4:
        raise QuantityError(f"quantity {text!r} is out of range")
    return esign * <int>value


def parse_quantity(text, int scale=0):
    """Same contract as dra_driver.allocator.quantity.parse_quantity."""
    if not isinstance(text, str) or not text:
        raise QuantityError("quantity must be a non-empty string")
    if scale < 0 or scale > 9:
        raise QuantityError(f"scale {scale} not in 0..9")
    cdef str s = <str>text
    cdef Py_ssize_t n = len(s), pos = 0, frac_digits = 0, digits = 0
    cdef int sign = 1, exponent = 0
    cdef unsigned long long small = 0
    cdef bint big = False
    cdef Py_UCS4 c
    big_mantissa = 0
    if s[0] == u'+' or s[0] == u'-':
        if s[0] == u'-':
            sign = -1
        pos = 1
    cdef Py_ssize_t start = pos
    cdef bint seen_dot = False
    while pos < n:
        c = s[pos]
        if _is_digit(c):
            if not big and small < 100000000000000000ULL:
                small = small * 10 + (<unsigned long long>c - 48)
            else:
                if not big:
                    big_mantissa = small
                    big = True
                big_mantissa = big_mantissa * 10 + (<long>c - 48)
            digits += 1
            if seen_dot:
                frac_digits += 1
        elif c == u'.' and not seen_dot:
            seen_dot = True
        else:
            break
        pos += 1
    if digits == 0:
        raise QuantityError(f"quantity {text!r} has no digits")
    cdef str suffix = s[pos:]
    mantissa = big_mantissa if big else small
    # Python integers from here on: `10 ** <C int>` would be computed as a C double.
    cdef object ten = 10
    numerator = mantissa * ten ** scale
    denominator = ten ** frac_digits
    # The suffix tables are the reference module's: one definition of the units.
    binary = BINARY_SUFFIXES.get(suffix)
    if binary is not None:
        numerator *= (<object>1024) ** binary
    else:
        decimal = DECIMAL_SUFFIXES.get(suffix)
        if decimal is not None:
            exponent = decimal
        elif len(suffix) > 0 and (suffix[0] == u'e' or suffix[0] == u'E'):
            exponent = _exponent(suffix, s)
        else:
            raise QuantityError(f"quantity {text!r} has an unknown suffix {suffix!r}")
        if mantissa and exponent > MAX_EXPONENT:
            raise QuantityError(f"quantity {text!r} does not fit in int64")
        if exponent >= 0:
            numerator *= ten ** exponent
        else:
            denominator *= ten ** -exponent
    value = -(-numerator // denominator)
    if value > INT64_MAX:
        raise QuantityError(f"quantity {text!r} does not fit in int64")
    return sign * value
