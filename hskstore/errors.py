"""Errors a store user can act on; every message says what to do next."""


class StoreError(RuntimeError):
    """Base class for store problems."""


class StoreExistsError(StoreError):
    """The output already holds a store (or other data) that would be overwritten."""


class IncompleteStoreError(StoreError):
    """The dump that writes this store has not finished."""


class CorruptStoreError(StoreError):
    """Data or metadata do not match their checksums, or cannot be read at all."""


class ProvenanceError(StoreError):
    """The store was made by another teacher, tokenizer, dataset or config than expected."""
