"""Config grids for `hsk sweep`: which derived configs a sweep trains on, chosen from the source store.

`table5_grid` (the paper's Table-5-like grid, grouped by amount of HSK), `budget_grid` (configs whose
store fits a byte budget per example) and `estimate_bytes_per_example`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from hskstore import codecs
from hskstore.format.config import HSKConfig, Selection
from hskstore.format.meta import StoreMeta
from hskstore.format.schema import ids_dtype
from hskstore.io.reader import HSKStore

# Amounts of HSK the grid aims at (token-vector units); powers of two continue up to the source's A.
BASE_TARGETS = (0.1, 0.5, 1.0)
# Candidate N^L and W values: round numbers, so configs read well in a table.
TOKEN_MENU = (1, 2, 3, 4, 5, 6, 8, 9, 10, 12, 16, 20, 24, 32, 48, 64, 96, 128)
WIDTH_MENU = (0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0)
# The paper's storage anchors (docs/METHOD.md section 4), added to the grid when the source can give them.
PAPER_CONFIGS = ("1,9,0.1", "5,2,0.3", "3,8,0.2")
# A candidate counts for a target amount within this factor (and is preferred within TIGHT).
TOLERANCE = 1.4
TIGHT = 1.15


def _meta(source: dict | StoreMeta | HSKStore) -> StoreMeta:
    if isinstance(source, HSKStore):
        return source.metadata
    return source if isinstance(source, StoreMeta) else StoreMeta.parse(source)


def selection(meta: dict | StoreMeta) -> Selection:
    """A task store's HSK selection, from its metadata."""
    return Selection.from_dict(_meta(meta).selection)


def _candidates(sel: Selection) -> list[HSKConfig]:
    """Every round-numbered config derivable from a source with selection `sel` (see hskstore.share.derive)."""
    src = sel.config
    if src.logits_only:
        return []
    tokens = sorted({n for n in TOKEN_MENU if n <= src.n_tokens} | {src.n_tokens})
    widths = _widths(sel)
    return [HSKConfig(nd, nl, w) for nd in range(1, src.n_layers + 1) for nl in tokens for w in widths]


def _widths(sel: Selection) -> list[float]:
    """The width ratios a source can be narrowed to, one per distinct N^W."""
    src = sel.config
    if sel.width_strategy == "uniform" or not codecs.get(sel.value_dtype).lossless:
        widths = [src.width]  # uniform masks do not nest; quantised codes cannot be re-ranked narrower
    else:
        widths = sorted({w for w in WIDTH_MENU if w <= src.width} | {src.width})
    seen_nw: set[int] = set()
    width_values = []
    for w in widths:  # two ratios with the same N^W give the same store: keep the smaller ratio
        nw = HSKConfig(1, 1, w).n_width(sel.hidden_size)
        if nw <= sel.n_width and nw not in seen_nw:
            seen_nw.add(nw)
            width_values.append(w)
    return width_values


def _ladder(limit: float) -> list[float]:
    """0.1, 0.5, 1, 2, 4, 8, ... up to `limit` (inclusive)."""
    out = [t for t in BASE_TARGETS if t <= limit]
    while out and out[-1] >= BASE_TARGETS[-1] and out[-1] * 2 <= limit:
        out.append(out[-1] * 2)
    return out


def _pick(cands: list[HSKConfig], sel: Selection, target: float, per_amount: int, taken: set[str]) -> list[HSKConfig]:
    """Up to `per_amount` configs of amount ~target, spending the budget differently.

    First the most balanced one (all three dimensions compressed by a similar factor: the paper's
    3-D compression), then one rich in tokens, one rich in layers, one rich in width.
    """
    d, src = sel.hidden_size, sel.config
    src_nw = sel.n_width

    def closeness(c: HSKConfig) -> float:
        return abs(math.log(c.amount(d) / target))

    near = [c for c in cands if closeness(c) <= math.log(TOLERANCE) and str(c) not in taken]
    if not near:
        return []

    def fractions(c: HSKConfig) -> tuple[float, float, float]:
        return (
            math.log(c.n_layers / src.n_layers),
            math.log(c.n_tokens / src.n_tokens),
            math.log(c.n_width(d) / src_nw),
        )

    def imbalance(c: HSKConfig) -> float:
        f = fractions(c)
        mean = sum(f) / 3
        return sum((x - mean) ** 2 for x in f)

    def loose(c: HSKConfig) -> bool:
        return closeness(c) > math.log(TIGHT)

    orders = [
        lambda c: (loose(c), round(imbalance(c), 6), closeness(c), str(c)),
        lambda c: (loose(c), -fractions(c)[1], closeness(c), str(c)),  # tokens
        lambda c: (loose(c), -fractions(c)[0], closeness(c), str(c)),  # layers
        lambda c: (loose(c), -fractions(c)[2], closeness(c), str(c)),  # width
    ]
    chosen: list[HSKConfig] = []
    for key in orders:
        if len(chosen) >= per_amount:
            break
        best = min(near, key=key)
        if best not in chosen:
            chosen.append(best)
    return chosen


def table5_grid(
    source_meta: dict | StoreMeta | HSKStore,
    *,
    per_amount: int = 2,
    targets: Sequence[float] | None = None,
    paper_anchors: bool = True,
) -> list[str]:
    """The paper's Table-5-like grid for a source store: configs grouped by amount of HSK.

    Amounts A ~ 0.1, 0.5, 1, 2, 4, 8, ... up to (not including) the source's own A, which is the
    'full' reference run. For each amount, `per_amount` configs that spend it differently (the
    most balanced first, then token-, layer- and width-rich ones), each a derivable subset of the
    source (N^D <= its N^D, N^L <= its N^L, N^W <= its N^W; the same width for uniform masks and
    int8 sources). `paper_anchors` adds the configs of docs/METHOD.md section 4 that the source can
    give. Returns 'ND,NL,W' strings sorted by amount.
    """
    meta = _meta(source_meta)
    sel = selection(meta)
    d = sel.hidden_size
    cands = _candidates(sel)
    if not cands:
        return []
    source_amount = sel.config.amount(d)
    taken: set[str] = {str(sel.config)}
    grid: list[HSKConfig] = []
    if targets is None:  # stay clearly below the source's own amount: that point is the 'full' run
        targets = [t for t in _ladder(source_amount) if t < source_amount / TIGHT]
    for target in sorted(t for t in targets if 0 < t < source_amount):
        picked = _pick(cands, sel, target, per_amount, taken)
        grid += picked
        taken |= {str(c) for c in picked}
    if paper_anchors:
        grid += _paper_anchors(cands, d, taken)
    return [str(c) for c in sorted(grid, key=lambda c: (c.amount(d), str(c)))]


def _paper_anchors(cands: list[HSKConfig], d: int, taken: set[str]) -> list[HSKConfig]:
    """The configs of docs/METHOD.md section 4 among the candidates, not yet taken (`taken` grows)."""
    out = []
    for text in PAPER_CONFIGS:
        cfg = HSKConfig.parse(text)
        # The store is the same for any W with the same N^W: use the candidate's spelling.
        same = [
            c
            for c in cands
            if (c.n_layers, c.n_tokens, c.n_width(d)) == (cfg.n_layers, cfg.n_tokens, cfg.n_width(d))
        ]
        if same and str(same[0]) not in taken:
            out.append(same[0])
            taken.add(str(same[0]))
    return out


def estimate_bytes_per_example(
    source_meta: dict | StoreMeta | HSKStore, config: HSKConfig | str, value_dtype: str = "float16"
) -> float:
    """Uncompressed bytes per example of a store at `config` derived from the source.

    An estimate: on disk, Blosc compresses the masks and token ids but hardly the values, and tiny
    stores pay a fixed overhead per chunk; `hsk info` tells the real size.
    """
    meta = _meta(source_meta)
    cfg = HSKConfig.parse(config) if isinstance(config, str) else config
    sel = selection(meta)
    d, length = sel.hidden_size, meta.max_length
    ids = 2 if ids_dtype(meta.tokenizer.vocab_size) == "uint16" else 4
    label = 4 if meta.task.regression else 2
    # row int64, text_hash uint64, label, logits float32, input_ids, token_type_ids uint8, length int16
    per_row = 8 + 8 + label + 4 * meta.teacher.num_labels + length * (ids + 1) + 2
    arrays = codecs.get(value_dtype).arrays(cfg.n_width(d))
    # positions int16, scores float32, values (and their scales), packed mask bits
    per_vector = 2 + 4 + (d + 7) // 8 + sum(
        int(np.prod(shape)) * np.dtype(dtype).itemsize for shape, dtype in arrays.values())
    return per_row + cfg.n_layers * cfg.n_tokens * per_vector


def budget_grid(
    source_meta: dict | StoreMeta | HSKStore, max_bytes_per_example: float, *, value_dtype: str = "float16",
    per_amount: int = 1,
) -> list[str]:
    """Configs whose store fits `max_bytes_per_example` (uncompressed estimate), grouped by amount.

    The Table-5 amounts that fit, plus the largest amount that still fits (the most balanced config
    of it): "how much HSK can I afford per example, and is it worth it?". Sorted by amount.
    """
    meta = _meta(source_meta)
    sel = selection(meta)
    d = sel.hidden_size
    fits = [c for c in _candidates(sel) if estimate_bytes_per_example(meta, c, value_dtype) <= max_bytes_per_example]
    if not fits:
        return []
    top = max(c.amount(d) for c in fits)
    grid: list[HSKConfig] = []
    taken: set[str] = set()
    for target in _ladder(top):
        picked = _pick(fits, sel, target, per_amount, taken)
        grid += picked
        taken |= {str(c) for c in picked}
    # Spend the whole budget: the most balanced config of the largest affordable amount.
    largest = _pick([c for c in fits if c.amount(d) == top], sel, top, 1, set())
    grid += [c for c in largest if str(c) not in taken]
    return [str(c) for c in sorted(set(grid), key=lambda c: (c.amount(d), str(c)))]
