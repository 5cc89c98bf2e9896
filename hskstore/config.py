"""The compression config (N^D, N^L, W) and the selection choices a store records.

docs/METHOD.md sections 1-3. Pure Python: no numpy, no torch.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from .errors import UserError

TOKEN_STRATEGIES = ("att-nosep", "att", "left", "cls")
WIDTH_STRATEGIES = ("mag", "uniform", "rand")
ATTENTION_SCORES = ("pre-softmax", "post-softmax")
RANKING_MAPS = ("ltop12", "own")
VALUE_DTYPES = ("float16", "int8", "int4", "mxfp4")  # int4 and mxfp4: format 2

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
    ref_student_layers: int | None = 4
    l_top: int | None = None
    token_strategy: str = "att-nosep"
    ranking_map: str = "ltop12"
    attention_scores: str = "pre-softmax"
    width_strategy: str = "mag"
    width_seed: int = 0
    value_dtype: str = "float16"
    deviations: dict = field(default_factory=lambda: dict(DEVIATIONS))
    # TinyBERT attention rows (`hsk dump --attention-rows`): the teacher's head count when the store
    # keeps the pre-softmax scores of the kept tokens' query rows; 0 = not kept (the key is then left
    # out of the metadata, so stores without them read exactly as before).
    attention_heads: int = 0

    def __post_init__(self) -> None:
        check_choices([
            ("token strategy", self.token_strategy, TOKEN_STRATEGIES),
            ("width strategy", self.width_strategy, WIDTH_STRATEGIES),
            ("attention scores", self.attention_scores, ATTENTION_SCORES),
            ("ranking map", self.ranking_map, RANKING_MAPS),
            ("value dtype", self.value_dtype, VALUE_DTYPES),
        ])
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
