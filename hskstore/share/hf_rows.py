"""The `datasets.IterableDataset` class that hskstore.share.export.iterable_dataset returns.

torch has no uint64 tensors and datasets cannot format a `text_hash` of 2^63 or more for torch, so
`with_format("torch")` asks for the store's rows with `text_hash` as int64 with the same bits (what
`signed_hash=True` gives; `.view(np.uint64)` gives the hash back). Every other format keeps uint64.
The class is made on first use (`StoreRows`, module attribute): hskstore itself imports without datasets.
"""

from __future__ import annotations

import functools

# formats whose tensors have no uint64: text_hash is given to them as int64 with the same bits
_SIGNED_FORMATS = ("torch", "pt")


@functools.cache
def store_rows_class() -> type:
    import datasets

    class StoreRows(datasets.IterableDataset):
        """A store's decoded rows. `hsk_signed_twin`: the from_generator arguments of the same rows with text_hash
        as int64 (None when these rows are that already)."""

        hsk_signed_twin: dict | None = None

        def with_format(self, type: str | None = None, **kwargs):  # noqa: A002 (datasets' own argument name)
            if type in _SIGNED_FORMATS and self.hsk_signed_twin is not None:
                return datasets.IterableDataset.from_generator(**self.hsk_signed_twin).with_format(type, **kwargs)
            return super().with_format(type, **kwargs)

    StoreRows.__module__, StoreRows.__qualname__ = __name__, "StoreRows"  # pickled by reference, as module-level
    return StoreRows


def __getattr__(name: str):
    if name == "StoreRows":
        return store_rows_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
