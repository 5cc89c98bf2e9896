"""hsk-tokcls: a token-classification store kind for hsk, as a package of its own (entry points only).

A `tokcls` store holds, per word-piece of raw text, a token classifier's distribution over its labels (the
top-k or all of them, as log-probabilities): what TinyBERT and TextBrewer distil NER students from. Its files,
one per layer, as docs/guide/adding-a-store-kind.md names them:

    store_kind.py  the format half (numpy only): the selection record, the arrays, their descriptions, the rules
    reader.py      its hskstore reader (`hsk info`)
    method.py      the method `tokcls-kd` and the names it adds to hsk's vocabularies (torch-free)
    run_kind.py    the run kind: its typed options and entry points (torch-free at import)
    compute.py     the dump, the feed and loss of `hsk train`, the evaluation (torch)

hsk finds them through hsk_tokcls-0.1.dist-info/entry_points.txt; nothing in hsk names this kind.
"""
