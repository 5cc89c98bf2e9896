"""The `datasets.IterableDataset` that hskstore.share.export.iterable_dataset returns (imported only there:
hskstore itself does not need datasets).

torch has no uint64 tensors and datasets cannot format a `text_hash` of 2^63 or more for torch, so
`with_format("torch")` asks for the store's rows with `text_hash` as int64 with the same bits (what
`signed_hash=True` gives; `.view(np.uint64)` gives the hash back). Every other format keeps uint64.
"""

from __future__ import annotations

import datasets

# formats whose tensors have no uint64: text_hash is given to them as int64 with the same bits
_SIGNED_FORMATS = ("torch", "pt")


class StoreRows(datasets.IterableDataset):
    """A store's decoded rows (`iterable_dataset`); `hsk_url` and `hsk_signed` say which and how."""

    hsk_url: str = ""
    hsk_signed: bool = False

    def with_format(self, type: str | None = None, **kwargs):  # noqa: A002 (datasets' own argument name)
        if type in _SIGNED_FORMATS and not self.hsk_signed:
            from hskstore.share.export import iterable_dataset

            return iterable_dataset(self.hsk_url, signed_hash=True).with_format(type, **kwargs)
        return super().with_format(type, **kwargs)
