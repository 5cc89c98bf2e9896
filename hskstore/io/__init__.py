"""Storage I/O: where a store lives (local or fsspec), opening, reading, writing and leasing it, the output
rule, and what the writer writes into every store beside its arrays (card, croissant.json, lineage records).
Imports the format, never hskstore.share or hskstore.method."""
