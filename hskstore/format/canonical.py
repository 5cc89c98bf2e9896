"""Canonical JSON: one byte string per JSON value, whichever language parsed and wrote it (RFC 8785, JCS).

The manifest of a format-4 store is a digest of these bytes, so a reader that parses JSON numbers as
float64 (JavaScript's `JSON.parse`) recomputes it: a number is written as ECMAScript writes that double
(`1.0` and `1` are both `1`, `1e-7` is `1e-7`, `0.00001` is `0.00001`), keys are sorted by their UTF-16 code
units, strings are escaped as `JSON.stringify` escapes them, and the text is UTF-8 (docs/STORE_FORMAT.md,
"Manifest: the exact bytes").
"""

from __future__ import annotations

import json
import math
from decimal import Decimal

import numpy as np

_SAFE_INT = 2**53  # below it every integer is a float64 exactly, and ECMAScript writes it in plain digits


def number(value: float | int) -> str:
    """The ECMAScript Number::toString of `value` as a float64 (what JSON.stringify writes); `null` for a value
    no float64 holds finitely (JSON.stringify writes NaN and the infinities so)."""
    if isinstance(value, int) and abs(value) < _SAFE_INT:
        return str(value)
    try:
        x = float(value)
    except OverflowError:  # an integer beyond float64: JSON.parse reads it as an infinity
        return "null"
    if not math.isfinite(x):
        return "null"
    if x == 0:
        return "0"
    if x < 0:
        return "-" + number(-x)
    return _positive(x)


def _positive(x: float) -> str:
    """ECMA-262 Number::toString for finite x > 0: the shortest round-trip digits (Python's repr finds the same
    ones, the nearest of several), then positional for 1e-7 < x < 1e21, else d.ddde+n."""
    sign, digits, exponent = Decimal(repr(x)).normalize().as_tuple()
    s = "".join(map(str, digits))
    k, n = len(s), exponent + len(s)  # x = 0.s * 10^n
    if k <= n <= 21:
        return s + "0" * (n - k)
    if 0 < n <= 21:
        return s[:n] + "." + s[n:]
    if -6 < n <= 0:
        return "0." + "0" * -n + s
    e = n - 1
    mantissa = s if k == 1 else s[0] + "." + s[1:]
    return f"{mantissa}e{'+' if e >= 0 else '-'}{abs(e)}"


def _key(text: str) -> bytes:
    return text.encode("utf-16-be", "surrogatepass")  # UTF-16 code unit order, as RFC 8785 sorts


def _text(value) -> str:
    if value is None or isinstance(value, bool):
        return {None: "null", True: "true", False: "false"}[value]
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, np.generic):
        return _text(value.item())
    if isinstance(value, (int, float)):
        return number(value)
    if isinstance(value, dict):
        items = sorted(((str(k), v) for k, v in value.items()), key=lambda item: _key(item[0]))
        return "{" + ",".join(json.dumps(k, ensure_ascii=False) + ":" + _text(v) for k, v in items) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_text(v) for v in value) + "]"
    return json.dumps(str(value), ensure_ascii=False)  # what json.dumps(default=str) would have written


def canonical(value) -> bytes:
    """The canonical JSON bytes (UTF-8) of `value`: parsed JSON (dicts, lists, strings, numbers, booleans, None)."""
    return _text(value).encode("utf-8", "surrogatepass")
