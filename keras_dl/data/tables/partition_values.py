"""Delta partition values, from the log's text to Python values, read as delta-kernel reads them.

The Delta protocol ("Partition Value Serialization") stores every partition value as a string.
delta-kernel-rs (``PrimitiveType::parse_scalar``, which deltalake 1.x
uses) reads them, and :func:`parse_partition_text` reads the same strings to the same values
and refuses the same strings. Measured against deltalake 1.6 (``tests/data/tables/test_partition_values.py``):

- **null**: a JSON null or a missing key. An empty text is a null too, except in a string or
  binary column, where it is the empty value (kernel's scan and Spark; the protocol's text says
  null for every type, and deltalake's ``to_pyarrow_table`` still reads it so).
- **string**: the text itself, any Unicode. **binary**: the UTF-8 bytes of the text. The Hive
  escapes of the file's folder play no part: values come from the log.
- **byte/short/integer/long**: ``[+-]?[0-9]+`` in range (Rust's ``from_str``: no spaces, no
  ``_``, no ``5.0``).
- **float/double**: Rust's float grammar: ``1``, ``-1.5e3``, ``.5``, ``5.``, ``inf``,
  ``Infinity``, ``NaN`` (any case), correctly rounded to the column's width (a ``float`` is
  rounded once, from the text, not through a double).
- **decimal(p, s)**: digits with exactly ``s`` fraction digits, counting an exponent
  (``12.50`` and ``1250e-2`` for ``decimal(10,2)``; ``12.5`` is refused), at most ``p`` digits.
- **boolean**: ``true``/``false``, any case.
- **date**: ``{year}-{month}-{day}``; chrono's ``%Y-%m-%d``: 1-2 digit month and day, a signed
  year of any length or an unsigned one of up to 4 digits, whitespace before a number.
- **timestamp / timestamp_ntz**: ``{date} {hour}:{minute}:{second}[.{fraction}]``, read as UTC
  (kernel does not apply the writer's zone); a ``timestamp`` may also be RFC 3339
  (``2024-01-01T10:00:00.5Z``, ``+05:30``, ``UTC``), normalized to UTC. Fractions past
  microseconds are truncated toward zero; second 60 is a leap second (the next minute).

Python holds dates and datetimes of years 1 to 9999 only: a value outside them is refused.
"""

from __future__ import annotations

import re
from datetime import date, datetime, timedelta, timezone
from decimal import Decimal
from fractions import Fraction
from typing import Any

import numpy as np
import pyarrow as pa

_INT = re.compile(r"[+-]?[0-9]+")
_FLOAT = re.compile(
    r"[+-]?(?:([0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?|(inf|infinity|nan))", re.I
)
# Rust's char::is_whitespace (Unicode White_Space); Python's str.isspace adds U+001C-U+001F.
_WS = frozenset("\t\n\v\f\r \x85\xa0\u1680\u2028\u2029\u202f\u205f\u3000") | frozenset(
    map(chr, range(0x2000, 0x200B))
)
_EPOCH_DAYS = date(1970, 1, 1).toordinal()
_UTC_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


class BadValue(ValueError):
    """The text is not a value of the type (kernel refuses it too)."""


def parse_partition_text(text: str, kind: pa.DataType) -> Any:
    """One partition value of type ``kind`` (a null is None, not text), as delta-kernel reads it.

    An empty text is the empty string or bytes in a string or binary column, and a null in
    any other: kernel's scan (``empty_string_partition_cast``) and Spark (a non-ANSI cast) read
    it so, and delta-rs writes an empty string as ``""``, so it reads back as written.

    Raises:
        BadValue: For text that delta-kernel refuses, or a date or time Python cannot hold.
    """
    if text == "":
        return "" if _is_string(kind) else b"" if _is_binary(kind) else None
    if _is_string(kind):
        return text
    if _is_binary(kind):
        try:
            return text.encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate from a \ud800 escape
            raise BadValue(text) from None
    if pa.types.is_integer(kind):
        if not _INT.fullmatch(text):
            raise BadValue(text)
        value, bits = int(text), kind.bit_width
        if not -(1 << (bits - 1)) <= value < 1 << (bits - 1):
            raise BadValue(text)
        return value
    if pa.types.is_floating(kind):
        return _float(text, kind)
    if pa.types.is_decimal(kind):
        return _decimal(text, kind.precision, kind.scale)
    if pa.types.is_boolean(kind):
        if text.isascii() and text.lower() in ("true", "false"):
            return text.lower() == "true"
        raise BadValue(text)
    if pa.types.is_date(kind):
        scan = _Scan(text)
        days = scan.date(spaced=False)
        scan.end()
        return _date(days)
    if pa.types.is_timestamp(kind):
        return _timestamp(text, utc=kind.tz is not None)
    raise BadValue(f"{kind} is not a partition column type")


def _is_string(kind: pa.DataType) -> bool:
    return pa.types.is_string(kind) or pa.types.is_large_string(kind)


def _is_binary(kind: pa.DataType) -> bool:
    return pa.types.is_binary(kind) or pa.types.is_large_binary(kind)


def _float(text: str, kind: pa.DataType) -> float:
    m = _FLOAT.fullmatch(text)
    if not m:
        raise BadValue(text)
    double = float(text)  # correctly rounded, as Rust's f64 parse
    if kind.bit_width == 64 or m.group(2) or double == 0 or not np.isfinite(double):
        return double if kind.bit_width == 64 else float(np.float32(double))
    single = float(_single(abs(double), text.lstrip("+-")))
    return single if double > 0 else -single


def _single(double: float, text: str) -> np.float32:
    """The float nearest the positive decimal ``text``, whose nearest double is ``double``.

    Rounding to the double first, then to a float, is wrong only when the double lands exactly
    halfway between two floats; then the exact text decides (ties to even).
    """
    with np.errstate(over="ignore"):  # past the largest float: inf, as Rust's parse
        single = np.float32(double)
        if Fraction(double) == _exact(single):
            return single  # the double is a float: the text rounds to it too
        if np.isinf(single) or single > double:
            low, high = np.nextafter(single, np.float32(0)), single
        else:
            low, high = single, np.nextafter(single, np.float32(np.inf))
    middle = (_exact(low) + _exact(high)) / 2
    if Fraction(double) != middle:
        return single
    exact = Fraction(text)
    if exact == middle:
        return single  # a true tie: numpy rounded it to even, as Rust does
    return low if exact < middle else high


def _exact(single: np.float32) -> Fraction:
    return Fraction(2**128) if np.isinf(single) else Fraction(float(single))


def _decimal(text: str, precision: int, scale: int) -> Decimal:
    """Kernel's ``parse_decimal``: the fraction digits minus the exponent must equal ``scale``."""
    base, exp = text, 0
    cut = next((i for i, c in enumerate(text) if c in "eE"), None)
    if cut is not None:
        base, exp = text[:cut], _rust_int(text[cut + 1 :])
    if not base:
        raise BadValue(text)
    whole, dot, frac = base.partition(".")
    digits = whole + frac  # as kernel: "int_part" then "frac_part", parsed as one integer
    if frac == "" and dot:
        digits = whole
    if len(frac) - exp != scale:
        raise BadValue(text)
    value = _rust_int(digits)
    if abs(value) >= 10**precision:
        raise BadValue(text)
    sign = int(value < 0)
    return Decimal((sign, tuple(map(int, str(abs(value)))), -scale))  # exact: no context rounding


def _rust_int(text: str) -> int:
    if not _INT.fullmatch(text):
        raise BadValue(text)
    return int(text)


def _timestamp(text: str, utc: bool) -> datetime:
    try:  # "%Y-%m-%d %H:%M:%S%.f", as UTC
        scan = _Scan(text)
        days = scan.date(spaced=False)
        scan.spaces()
        nanos = scan.time(spaced=False)
        scan.end()
        offset = 0
    except BadValue:
        if not utc:
            raise
        scan = _Scan(text)  # chrono's relaxed RFC 3339 ("%+"): the offset is required
        days = scan.date(spaced=True)
        scan.separator()
        nanos = scan.time(spaced=True)
        scan.spaces()
        offset = scan.offset()
        scan.end()
    total = days * 86_400_000_000_000 + nanos - offset * 1_000_000_000
    micros = abs(total) // 1000 * (1 if total >= 0 else -1)  # toward zero, as num_microseconds
    try:
        stamp = _UTC_EPOCH + timedelta(microseconds=micros)
    except OverflowError:
        raise BadValue(text) from None
    return stamp if utc else stamp.replace(tzinfo=None)


def _date(days: int) -> date:
    try:
        return date.fromordinal(days + _EPOCH_DAYS)
    except (ValueError, OverflowError):
        raise BadValue(f"day {days}") from None


class _Scan:
    """chrono's parser items over ``text``: numbers skip whitespace before them; literals don't."""

    def __init__(self, text: str):
        self.text, self.at = text, 0

    def spaces(self) -> None:
        while self.at < len(self.text) and self.text[self.at] in _WS:
            self.at += 1

    def literal(self, char: str) -> None:
        if not self.text.startswith(char, self.at):
            raise BadValue(self.text)
        self.at += len(char)

    def number(self, width: int, signed: bool = False) -> int:
        self.spaces()
        sign = self.text[self.at : self.at + 1]
        if signed and sign in ("+", "-"):
            self.at += 1
            return (-1 if sign == "-" else 1) * self._digits(1, None)
        return self._digits(1, width)

    def _digits(self, least: int, most: int | None) -> int:
        start = self.at
        while self.at < len(self.text) and "0" <= self.text[self.at] <= "9":
            if most is not None and self.at - start == most:
                break
            self.at += 1
        if self.at - start < least:
            raise BadValue(self.text)
        return int(self.text[start : self.at] or 0)

    def date(self, spaced: bool) -> int:
        """``%Y-%m-%d`` as days since 1970-01-01 (proleptic Gregorian, any year)."""
        year = self.number(4, signed=True)
        if spaced:
            self.spaces()
        self.literal("-")
        month = self.number(2)
        if spaced:
            self.spaces()
        self.literal("-")
        day = self.number(2)
        if not 1 <= month <= 12 or not 1 <= day <= _month_days(year, month):
            raise BadValue(self.text)
        return _days_from_civil(year, month, day)

    def time(self, spaced: bool) -> int:
        """``%H:%M:%S%.f`` as nanoseconds into the day (second 60 runs into the next minute)."""
        hour = self.number(2)
        if spaced:
            self.spaces()
        self.literal(":")
        minute = self.number(2)
        if spaced:
            self.spaces()
        self.literal(":")
        second = self.number(2)
        nanos = 0
        if self.text.startswith(".", self.at):
            self.at += 1
            start = self.at
            nanos = self._digits(1, 9) * 10 ** (9 - (self.at - start))
            self._digits(0, None)  # digits past nanoseconds are read and dropped
        if hour > 23 or minute > 59 or second > 60:
            raise BadValue(self.text)
        return ((hour * 60 + minute) * 60 + second) * 1_000_000_000 + nanos

    def separator(self) -> None:
        if self.text[self.at : self.at + 1] not in ("T", "t", " "):
            raise BadValue(self.text)
        self.at += 1

    def offset(self) -> int:
        """``Z``, ``UTC`` or ``±HH[:]MM`` (any colons or spaces between), in seconds."""
        rest = self.text[self.at :]
        if rest[:3].isascii() and rest[:3].upper() == "UTC":
            self.at += 3
            return 0
        if rest[:1] in ("Z", "z"):
            self.at += 1
            return 0
        if rest[:1] not in ("+", "-", "\u2212"):
            raise BadValue(self.text)
        sign = 1 if rest[0] == "+" else -1
        self.at += 1
        hours = self._two_digits()
        while self.at < len(self.text) and (self.text[self.at] == ":" or self.text[self.at] in _WS):
            self.at += 1
        minutes = self._two_digits()
        seconds = hours * 3600 + minutes * 60
        if minutes > 59 or seconds >= 86_400:
            raise BadValue(self.text)
        return sign * seconds

    def _two_digits(self) -> int:
        pair = self.text[self.at : self.at + 2]
        if len(pair) != 2 or not all("0" <= c <= "9" for c in pair):
            raise BadValue(self.text)
        self.at += 2
        return int(pair)

    def end(self) -> None:
        if self.at != len(self.text):
            raise BadValue(self.text)


def _month_days(year: int, month: int) -> int:
    if month == 2:
        return 29 if year % 4 == 0 and (year % 100 != 0 or year % 400 == 0) else 28
    return 30 if month in (4, 6, 9, 11) else 31


def _days_from_civil(year: int, month: int, day: int) -> int:
    """Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's algorithm)."""
    year -= month <= 2
    era = year // 400
    yoe = year - era * 400
    doy = (153 * (month + (-3 if month > 2 else 9)) + 2) // 5 + day - 1
    doe = yoe * 365 + yoe // 4 - yoe // 100 + doy
    return era * 146_097 + doe - 719_468
