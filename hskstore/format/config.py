"""The compression config (N^D, N^L, W) and the selection choices a store records.

docs/METHOD.md sections 1-3. Pure Python: no numpy, no torch.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from .. import codecs
from ..errors import UserError


@dataclass(frozen=True)
class Choice:
    """One named choice of `hsk dump`, declared once: Selection, DumpOptions and the CLI read its values,
    default and help from here."""

    flag: str  # the CLI's option
    field: str  # the DumpOptions (and, for a store's choices, Selection) field
    label: str  # its name in a store's selection: what an error about a store's metadata says
    what: str  # the first words of its help
    meanings: tuple[tuple[str, str], ...]  # (value, what it does, "" when the name says it); the default first
    note: str = ""  # said after the values in the help

    @property
    def values(self) -> tuple[str, ...]:
        return tuple(value for value, _ in self.meanings)

    @property
    def default(self) -> str:
        return self.meanings[0][0]

    @property
    def help(self) -> str:
        parts = [f"{value} ({meaning})" if meaning else value for value, meaning in self.meanings]
        joined = ("; " if any("," in meaning for _, meaning in self.meanings) else ", ").join(parts)
        return f"{self.what}: {joined}." + (f" {self.note}" if self.note else "")


TOKENS = Choice("--tokens", "token_strategy", "token strategy", "Token strategy", (
    ("att-nosep", "the NL tokens [CLS] attends to most, [SEP] excluded"), ("att", "the same, [SEP] included"),
    ("left", "the first NL tokens"), ("cls", "position 0 only, NL=1")))
WIDTH = Choice("--width", "width_strategy", "width strategy", "Width strategy", (
    ("mag", "per-vector magnitude"), ("uniform", "evenly spaced activations"),
    ("rand", "seeded by --width-seed, nested across widths")))
SCORES = Choice("--scores", "attention_scores", "attention scores", "Ranking scores", (
    ("pre-softmax", "reference code"), ("post-softmax", "paper text")))
RANKING = Choice("--ranking", "ranking_map", "ranking map", "Attention ranking the tokens", (
    ("ltop12", "L_top=L map"), ("own", "each kept layer's own attention")))
VALUES = Choice("--values", "value_dtype", "value dtype", "Value encoding",  # the registered codecs
                tuple((c.name, c.help) for c in codecs.declared() if c.alone))
ENGINE = Choice("--selection-engine", "selection_engine", "selection engine",
                "Where tokens are ranked, masked and encoded", (
                    ("torch", "on the teacher's device; only the selected bytes leave it"),
                    ("numpy", "the reference, on the host")), note="Both write the same bytes.")
# The teacher forward's arithmetic: recorded with the teacher (meta["teacher"]["precision"], absent = fp32).
PRECISION = Choice("--precision", "precision", "teacher precision", "The teacher forward's arithmetic", (
    ("auto", "fp32 on a CPU, fp16 on a CUDA GPU of compute capability 7.0 or more"), ("fp32", ""),
    ("tf32", "fp32 with TF32 tensor-core matmuls, Ampere GPUs on"), ("fp16", "autocast"), ("bf16", "autocast")),
    note="Recorded in the store; a resume must use the same.")
STORE_CHOICES = (TOKENS, WIDTH, SCORES, RANKING, VALUES)  # what a store's selection records
DUMP_CHOICES = (*STORE_CHOICES, ENGINE, PRECISION)

# Where hsk knowingly differs from the authors' code (docs/METHOD.md); written into every store.
DEVIATIONS = {
    "width_mask": "per-vector magnitude top-k (reference code: one threshold per layer over the batch)",
    "sep_exclusion": "[SEP] positions found per example (reference code: SEP count of the batch's first example)",
    "teacher_logits": "logits exactly as the classification head computes them (reference: extra ReLU)",
}


class ConfigError(UserError, ValueError):
    """A config string or selection choice that cannot be used."""


def check_choices(choices: list[tuple[str, str, tuple[str, ...]]]) -> None:
    """Refuse the first (label, value, allowed) whose value is not allowed, in one line."""
    for label, value, allowed in choices:
        if value not in allowed:
            raise ConfigError(f"unknown {label} {value!r}; choose one of {', '.join(allowed)}")


def check_at_least(flag: str, value: int | None, low: int, *, high: int | None = None,
                   error: type[UserError] = ConfigError) -> None:
    """Refuse a whole number below `low` (or above `high`, when given), in one line; None passes (the default
    applies)."""
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise error(f"{flag} must be an integer >= {low}, got {value!r}")
    if high is not None and value > high:
        raise error(f"{flag} must be at most {high}, got {value!r}")


def check_between(label: str, value: float | None, low: float, high: float, *, ends: str = "[]",
                  error: type[UserError] = ConfigError) -> None:
    """Refuse a number outside low..high, in one line; `ends` says which ends are allowed ("[)": not `high`).
    None passes (the default applies)."""
    if value is None:
        return
    above = value >= low if ends[0] == "[" else value > low
    below = value <= high if ends[1] == "]" else value < high
    if not (above and below):
        raise error(f"{label} must be in {ends[0]}{low:g}, {high:g}{ends[1]}, got {value}")


@dataclass(frozen=True)
class Bound:
    """A whole-number option of `hsk dump`, declared once: its flag, field, default, least value and help."""

    flag: str
    field: str
    default: int | None
    low: int
    help: str

    def check(self, value: int | None) -> None:
        check_at_least(self.flag, value, self.low)


# The reference student's depth when none is given. The flag's own default is None, so that a depth the user
# chose can be told apart: one deeper than the teacher is refused (its map repeats teacher layers).
REF_STUDENT_LAYERS = 4
STUDENT_LAYERS = Bound("--student-layers", "ref_student_layers", None, 1,
                       f"Depth S of the reference student whose layer map picks layers, at most the teacher's "
                       f"depth [default: {REF_STUDENT_LAYERS}].")
L_TOP = Bound("--l-top", "l_top", None, 1, "Top teacher layer of the layer map [default: round(10/12 * L)].")
WIDTH_SEED = Bound("--width-seed", "width_seed", 0, 0, "Seed of the rand width mask.")
MAX_LENGTH = Bound("--max-length", "max_length", None, 2,  # [CLS] and [SEP] at least
                   "Max tokens per example [default: 64 for CoLA/SST-2, else 128].")
BATCH_SIZE = Bound("--batch-size", "batch_size", 64, 1, "Teacher batch size.")
SHARD_ROWS = Bound("--shard-rows", "shard_rows", 1024, 1,
                   "Examples per shard (the unit of writing, resuming, streaming).")
TOP_K = Bound("--top-k", "top_k", 64, 1, "--objective mlm: teacher vocabulary ids kept per masked position.")
MASK_SEED = Bound("--mask-seed", "mask_seed", 0, 0, "--objective mlm: seed of BERT's masking (15%; 80/10/10).")
DUMP_BOUNDS = (BATCH_SIZE, SHARD_ROWS, MAX_LENGTH, WIDTH_SEED, L_TOP)  # checked in this order
MLM_BOUNDS = (BATCH_SIZE, SHARD_ROWS, MAX_LENGTH, TOP_K, MASK_SEED)


@dataclass(frozen=True)
class HSKConfig:
    """How much hidden-state knowledge to keep: N^D layers, N^L tokens, a width ratio W."""

    n_layers: int
    n_tokens: int
    width: float

    @classmethod
    def parse(cls, text: str) -> HSKConfig:
        """Parse "ND,NL,W", e.g. "3,8,0.2"; "0,0,0" means logits only."""
        parts = [p.strip() for p in str(text).split(",")]
        usage = f"--config must be 'ND,NL,W' (layers, tokens, width ratio), e.g. '3,8,0.2' or '0,0,0'; got {text!r}"
        if len(parts) != 3:
            raise ConfigError(usage)
        try:
            n_layers, n_tokens, width = int(parts[0]), int(parts[1]), float(parts[2])
        except ValueError:
            raise ConfigError(usage + ": ND and NL must be integers, W a number") from None
        return cls(n_layers, n_tokens, width)

    def __post_init__(self) -> None:
        if self.n_layers < 0 or self.n_tokens < 0:
            raise ConfigError(f"config {self}: layer and token counts cannot be negative")
        if not 0.0 <= self.width <= 1.0:
            raise ConfigError(f"config {self}: width ratio W must be in (0, 1], got {self.width}")
        zeros = [self.n_layers == 0, self.n_tokens == 0, self.width == 0.0]
        if any(zeros) and not all(zeros):
            raise ConfigError(
                f"config {self}: either all of ND, NL, W are zero (logits only, '0,0,0') or none is"
            )

    def __str__(self) -> str:
        return f"{self.n_layers},{self.n_tokens},{self.width:g}"

    @property
    def logits_only(self) -> bool:
        return self.n_layers == 0

    def n_width(self, hidden_size: int) -> int:
        """N^W = round(W * d_T): the number of activations each kept vector keeps."""
        if self.logits_only:
            return 0
        return max(1, round(self.width * hidden_size))

    def amount(self, hidden_size: int) -> float:
        """Amount of HSK A = N^D * N^L * N^W / d_T, in units of one full token vector."""
        return self.n_layers * self.n_tokens * self.n_width(hidden_size) / hidden_size


@dataclass(frozen=True)
class Selection:
    """Everything that decides which values a store keeps; recorded verbatim in the store."""

    config: HSKConfig
    hidden_size: int
    teacher_num_layers: int
    teacher_layers: tuple[int, ...]  # kept teacher hidden states (0 = embedding output), one per entry
    student_entries: tuple[int, ...] | None  # reference student entries they serve (None: explicit list)
    ranking_layers: tuple[int, ...]  # teacher attention layer (1..L) that ranks the tokens of each entry
    ref_student_layers: int | None = REF_STUDENT_LAYERS
    l_top: int | None = None
    token_strategy: str = TOKENS.default
    ranking_map: str = RANKING.default
    attention_scores: str = SCORES.default
    width_strategy: str = WIDTH.default
    width_seed: int = WIDTH_SEED.default
    value_dtype: str = VALUES.default
    deviations: dict = field(default_factory=lambda: dict(DEVIATIONS))
    # TinyBERT attention rows (`hsk dump --attention-rows`): the teacher's head count when the store
    # keeps the pre-softmax scores of the kept tokens' query rows; 0 = not kept (the key is then left
    # out of the metadata, so stores without them read exactly as before).
    attention_heads: int = 0

    def __post_init__(self) -> None:
        check_choices([(c.label, getattr(self, c.field), c.values) for c in STORE_CHOICES])
        if (
            len(self.teacher_layers) != self.config.n_layers
            or len(self.ranking_layers) != self.config.n_layers
        ):
            raise ConfigError(
                f"config {self.config} keeps {self.config.n_layers} layers but the layer map gives "
                f"{list(self.teacher_layers)}"
            )
        if self.attention_heads < 0 or (self.attention_heads and self.config.logits_only):
            raise ConfigError("attention rows belong to kept layers: use them with a config that keeps layers "
                              f"(got {self.config} with {self.attention_heads} heads)")
        if self.token_strategy == "cls" and self.config.n_tokens > 1:
            raise ConfigError("token strategy 'cls' keeps only position 0: use NL=1, e.g. '--config 3,1,0.2'")

    @property
    def n_width(self) -> int:
        return self.config.n_width(self.hidden_size)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["config"] = str(self.config)
        d["teacher_layers"] = list(self.teacher_layers)
        d["ranking_layers"] = list(self.ranking_layers)
        d["student_entries"] = None if self.student_entries is None else list(self.student_entries)
        if not self.attention_heads:
            del d["attention_heads"]
        return d

    def label(self) -> tuple[str, str]:
        """(config, codec): how a catalog and the card's title name this selection."""
        return str(self.config), self.value_dtype

    def kept(self) -> str:
        """What the store keeps, in one clause (the card, croissant's rai:dataPreprocessingProtocol)."""
        return (f"hidden-state knowledge kept at config {self.config} ({self.token_strategy} tokens, "
                f"{self.width_strategy} width, {self.value_dtype} values)")

    @property
    def attention_rows(self) -> bool:
        """Whether the store keeps attention rows (per kept layer above the embeddings)."""
        return self.attention_heads > 0

    @classmethod
    def from_dict(cls, d: dict) -> Selection:
        d = dict(d)
        d["config"] = HSKConfig.parse(d["config"])
        for key in ("teacher_layers", "ranking_layers"):
            d[key] = tuple(d[key])
        if d.get("student_entries") is not None:
            d["student_entries"] = tuple(d["student_entries"])
        return cls(**d)
