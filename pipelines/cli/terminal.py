"""What hsk prints reaches the terminal as text only: the one place control characters are escaped.

Store metadata, folder names, checkpoint names and cards are what someone else wrote; printed raw, an
escape sequence in them (`\\x1b[2J`, a title change, a fake prompt) would drive the user's terminal.
`main` writes through `printable_streams`: every character written to stdout and stderr that is not
printable is shown escaped (ESC as `\\x1b`), except the line breaks, carriage returns (progress bars)
and tabs of hsk's own layout; a character the stream's encoding lacks is escaped too. Layout a value
could break (a newline in a table cell or a report line) is escaped where that value is formatted
(hskstore.errors.printable).
"""

from __future__ import annotations

import io
import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager

from hskstore.errors import printable

_LAYOUT = re.compile(r"([\n\r\t])")


def shown(text: str) -> str:
    """`text` as the terminal gets it: every control character escaped but line breaks, \\r and tabs."""
    if text.isprintable():
        return text
    return "".join(part if i % 2 else printable(part) for i, part in enumerate(_LAYOUT.split(text)))


class PrintableStream(io.TextIOBase):
    """A text stream writing `shown(text)` to another. It offers no `.buffer`, so nothing (click included)
    writes bytes past it."""

    def __init__(self, stream) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        if not isinstance(text, str):
            raise TypeError(f"write() argument must be str, not {type(text).__name__}")
        text = shown(text)
        try:
            self._stream.write(text)
        except UnicodeEncodeError:  # a terminal whose encoding lacks a character (PYTHONIOENCODING=ascii): escaped
            encoding = self.encoding or "ascii"
            self._stream.write(text.encode(encoding, "backslashreplace").decode(encoding))
        return len(text)

    def flush(self) -> None:
        self._stream.flush()

    def isatty(self) -> bool:
        return self._stream.isatty()

    def fileno(self) -> int:
        return self._stream.fileno()

    def writable(self) -> bool:
        return True

    @property
    def encoding(self) -> str | None:  # type: ignore[override]
        return getattr(self._stream, "encoding", None)

    @property
    def errors(self) -> str | None:  # type: ignore[override]
        return getattr(self._stream, "errors", None)


@contextmanager
def printable_streams() -> Iterator[None]:
    """Write stdout and stderr through PrintableStream while the body runs (restored after)."""
    out, err = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = PrintableStream(out), PrintableStream(err)
    try:
        yield
    finally:
        sys.stdout, sys.stderr = out, err
