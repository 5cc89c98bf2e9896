"""Errors a user can act on; every message says what to do next."""


class UserError(Exception):
    """Something the user can fix (a flag, a file, a store, the data): `hsk` prints its message as one line
    and exits with status 2. Every other exception is a bug and keeps its traceback."""


class StoreError(UserError, RuntimeError):
    """Base class for store problems."""


class StoreExistsError(StoreError):
    """The output already holds a store (or other data) that would be overwritten."""


class IncompleteStoreError(StoreError):
    """The dump that writes this store has not finished."""


class CorruptStoreError(StoreError):
    """Data or metadata do not match their checksums, or cannot be read at all."""


class UnverifiedStoreError(StoreError):
    """A complete store whose metadata no manifest covers (format 1, or its manifest deleted): refused
    unless the reader opts in; `hsk upgrade` covers it."""


class ProvenanceError(StoreError):
    """The store was made by another teacher, tokenizer, dataset or config than expected."""


def shown(path: object) -> str:
    """A path as an error shows it: a local path absolute (resolved against the working folder, which a reader of
    the message may no longer know), a URL as it is."""
    import os

    text = str(path)
    if "://" in text:
        return text
    return os.path.abspath(os.path.expanduser(text))


def printable(text: object, *, keep_newlines: bool = False) -> str:
    """`text` with control characters escaped (ESC as \\x1b...), for names that come from stores, files or
    checkpoints and go to a terminal. `keep_newlines` keeps line breaks of multi-line messages."""
    text = str(text)
    if text.isprintable():
        return text
    out = []
    for ch in text:
        if ch.isprintable() or (keep_newlines and ch == "\n"):
            out.append(ch)
        else:
            out.append(ascii(ch)[1:-1])
    return "".join(out)
