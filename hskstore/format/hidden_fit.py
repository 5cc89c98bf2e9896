"""The fitted basis of the hidden-state support (`hsk dump --objective clm --support hidden:fit`): entropy-coded
uniform quantization of the final hidden state in a basis fitted to the teacher's head (docs/STORE_FORMAT.md,
"The fitted basis").

The teacher's logits are l = W h + b, its distribution p = softmax(l). A small error e in h costs, to second
order, KL(p || q) = e^T F e / 2 with F = Cov_{y~p}(w_y), the covariance of the head's rows under p: the Fisher
information of the logits' softmax in h. Averaged over positions, F says which directions of h the distribution
hears. With mu, S the mean and covariance of h over the fit's positions and S^1/2 its symmetric root,
lam, V = eigh(S^1/2 F S^1/2) (descending) gives unit-variance coordinates z = V^T S^-1/2 (h - mu) in which the
expected KL of an error is sum_i lam_i E[e_i^2] / 2 and the coordinates are uncorrelated. Each z_i is rounded on
a uniform grid of step Delta_i = sqrt(theta / lam_i) (the same weighted error lam_i Delta_i^2 / 12 per coordinate:
reverse water-filling), so the mean KL is d theta / 24: theta = 24 KL / d for a target KL. The indices
q_i = round(z_i / Delta_i) are stored as unscaled int8 (the `int8u` codec); most are small, so the store's
compressor (Blosc zstd with byte shuffle) stores them at about their entropy.

A reader needs nothing new: h - mu = A diag(Delta) q with A = S^1/2 V, so the stored head is W A diag(Delta) and
its bias W mu + b, and logits = head q + bias as for every hidden-state store. The writer keeps the encoder
(mu and diag(1/Delta) V^T S^-1/2) beside them, so that a resumed dump encodes the rest of the corpus as its start
was, without refitting. The fit runs in float64 on the host from the float16 states a float16 store keeps and
the stored head, so that a float16 store derives to the fitted codec with the bytes of a direct dump. Pure numpy.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from .config import ConfigError
from .domain import first_problem, int_within

FIT_CODEC = "int8u"  # the value codec of the indices
INDEX_LIMIT = 127  # indices are clipped to [-127, 127]
STEP_LIMIT = 64.0  # the widest step (z has unit variance): a coordinate the head barely hears rounds to 0
COVARIANCE_FLOOR = 1e-6  # added to S's diagonal, relative to its mean variance: S^-1/2 stays finite
CHUNK = 256  # positions per [chunk, V] float64 block of the Fisher's softmax
FIT_MEAN, FIT_ENCODER = "clm/fit_mean", "clm/fit_encoder"  # the encoder the writer keeps (not row arrays)


def theta_of(kl: float, width: int) -> float:
    """The weighted squared error per coordinate whose uniform steps give a mean KL of `kl` nats over `width`
    coordinates: each contributes lam Delta^2 / 24 = theta / 24."""
    return 24.0 * float(kl) / int(width)


def head_fisher(h: np.ndarray, weight: np.ndarray, bias: np.ndarray | None, softcap: float | None,
                chunk: int = CHUNK) -> np.ndarray:
    """float64 [d, d]: the mean over the positions h [N, d] of the Fisher information of the teacher's
    distribution in h, J^T (diag(p) - p p^T) J with J = d logits / d h = diag(g) W (g = 1 without softcap, else
    1 - tanh(u / c)^2): W^T diag(sum p g^2) W - M^T M, M = (p g) W, summed in chunks of positions."""
    w = np.asarray(weight, dtype=np.float64)
    b = None if bias is None else np.asarray(bias, dtype=np.float64)
    mass = np.zeros(w.shape[0])
    second = np.zeros((w.shape[1], w.shape[1]))
    for start in range(0, len(h), chunk):
        u = np.asarray(h[start:start + chunk], dtype=np.float64) @ w.T
        if b is not None:
            u += b
        g = np.ones_like(u) if not softcap else 1.0 - np.tanh(u / softcap) ** 2
        logits = softcap * np.tanh(u / softcap) if softcap else u
        p = np.exp(logits - logits.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        mass += (p * g * g).sum(0)
        m = (p * g) @ w
        second += m.T @ m
    fisher = (w.T * mass) @ w - second
    return (fisher + fisher.T) / (2 * max(len(h), 1))


def _symmetric_root(cov: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(S^1/2, S^-1/2) of a positive definite S."""
    e, u = np.linalg.eigh(cov)
    e = np.maximum(e, e.max() * 1e-12)
    return (u * np.sqrt(e)) @ u.T, (u / np.sqrt(e)) @ u.T


def _signed(v: np.ndarray) -> np.ndarray:
    """Eigenvectors (columns) with their largest-magnitude entry positive: one basis whatever sign eigh picks."""
    peak = v[np.argmax(np.abs(v), axis=0), np.arange(v.shape[1])]
    return v * np.where(peak < 0, -1.0, 1.0)


@dataclass(frozen=True)
class FitEncoder:
    """What turns hidden states into indices: q = clip(rint((h - mean) @ matrix.T), -127, 127). The writer keeps
    it (FIT_MEAN, FIT_ENCODER) so that a resumed dump encodes as the first run did."""

    mean: np.ndarray  # [d] float64
    matrix: np.ndarray  # [d, d] float64: diag(1 / Delta) V^T S^-1/2

    def coordinates(self, h: np.ndarray) -> np.ndarray:
        """float64 [..., d]: the unrounded indices z / Delta of states h [..., d]."""
        flat = np.asarray(h, dtype=np.float64).reshape(-1, self.mean.shape[0])
        return ((flat - self.mean) @ self.matrix.T).reshape(np.shape(h))

    def encode(self, h: np.ndarray) -> np.ndarray:
        """int8 [..., d]: the indices of states h [..., d]."""
        return np.clip(np.rint(self.coordinates(h)), -INDEX_LIMIT, INDEX_LIMIT).astype(np.int8)

    def clipped(self, h: np.ndarray) -> float:
        """The fraction of the indices of h [N, d] that the int8 range clips."""
        return float((np.abs(self.coordinates(h)) > INDEX_LIMIT + 0.5).mean()) if len(h) else 0.0

    def digest(self) -> str:
        """`sha256:` over the mean's then the matrix's float64 little-endian bytes (row-major)."""
        digest = hashlib.sha256(np.ascontiguousarray(self.mean, dtype="<f8").tobytes())
        digest.update(np.ascontiguousarray(self.matrix, dtype="<f8").tobytes())
        return "sha256:" + digest.hexdigest()


@dataclass(frozen=True)
class FittedBasis:
    """A fit: the encoder, the decoder A diag(Delta) (h = mean + decoder @ q), the coordinates' importances lam
    (nats per unit^2 of error x 2, descending) and steps Delta, and the theta they were made for."""

    encoder: FitEncoder
    decoder: np.ndarray  # [d, d] float64
    importance: np.ndarray  # [d] float64, descending
    steps: np.ndarray  # [d] float64
    theta: float

    @property
    def predicted_kl(self) -> float:
        """sum_i lam_i min(Delta_i^2 / 12, 1) / 2: the mean KL the steps are made for (d theta / 24 when no step is
        capped), a coordinate rounded to 0 costing at most its variance."""
        return float((self.importance * np.minimum(self.steps ** 2 / 12, 1.0)).sum() / 2)

    def decode(self, q: np.ndarray) -> np.ndarray:
        """float64 [..., d]: the states that indices q [..., d] stand for."""
        return self.encoder.mean + np.asarray(q, dtype=np.float64) @ self.decoder.T

    def folded(self, weight: np.ndarray, bias: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
        """The head and bias (float32) of the indices: weight @ decoder and weight @ mean + bias, so that
        folded q + bias' = weight h + bias for h = decode(q)."""
        w = np.asarray(weight, dtype=np.float64)
        b = w @ self.encoder.mean + (0.0 if bias is None else np.asarray(bias, dtype=np.float64))
        return (w @ self.decoder).astype(np.float32), b.astype(np.float32)


def fit_basis(h: np.ndarray, weight: np.ndarray, bias: np.ndarray | None, softcap: float | None,
              kl: float) -> FittedBasis:
    """The basis and steps fitted to states h [N, d] (float16 as stored, read as float64) under the head
    (weight [V, d], bias [V] or None, softcap) for a mean KL of `kl` nats. Deterministic: the same inputs give
    the same bytes."""
    x = np.asarray(h, dtype=np.float64)
    d = x.shape[1]
    mean = x.mean(0)
    cov = np.cov(x, rowvar=False).reshape(d, d)
    cov += np.eye(d) * COVARIANCE_FLOOR * max(float(np.trace(cov)) / d, 1e-30)
    root, inverse_root = _symmetric_root(cov)
    fisher = head_fisher(x, weight, bias, softcap)
    m = root @ fisher @ root
    lam, v = np.linalg.eigh((m + m.T) / 2)
    lam, v = np.maximum(lam[::-1], 0.0), _signed(v[:, ::-1])
    theta = theta_of(kl, d)
    with np.errstate(divide="ignore"):
        steps = np.minimum(np.sqrt(theta / lam), STEP_LIMIT)
    encoder = FitEncoder(mean, (v.T @ inverse_root) / steps[:, None])
    return FittedBasis(encoder, (root @ v) * steps[None, :], lam, steps, theta)


@dataclass(frozen=True)
class FitRecord:
    """A fitted store's `selection.hidden_fit`: the positions the fit read, its target and what it gave."""

    tokens: int  # the first `tokens` kept positions of the store, in row order
    kl: float  # the target mean KL (nats)
    theta: float  # 24 kl / d
    predicted_kl: float  # FittedBasis.predicted_kl
    clipped: float  # the fraction of the fit positions' indices the int8 range clips
    encoder_sha256: str  # FitEncoder.digest() of clm/fit_mean and clm/fit_encoder

    @classmethod
    def of(cls, basis: FittedBasis, h: np.ndarray, kl: float) -> FitRecord:
        return cls(len(h), float(kl), round(basis.theta, 12), round(basis.predicted_kl, 8),
                   round(basis.encoder.clipped(h), 8), basis.encoder.digest())

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> FitRecord:
        return cls(**{k: d.get(k) for k in cls.__dataclass_fields__})

    def described(self) -> str:
        return (f"fitted basis (target KL {self.kl:g}, {self.tokens} positions, {100 * self.clipped:.3f}% "
                "clipped)")


def fit_problem(record: Any, width: int | None) -> str | None:
    """A selection's hidden_fit out of its domain (None: in it, or absent)."""
    if record is None:
        return None
    if not isinstance(record, FitRecord):
        return "hidden_fit is not a mapping"
    positive = isinstance(record.kl, (int, float)) and not isinstance(record.kl, bool) and 0 < record.kl < 1e6
    return first_problem((int_within("hidden_fit.tokens", record.tokens, 1, 1 << 62),
                          None if positive else f"hidden_fit.kl {record.kl!r} is not a positive number",
                          None if isinstance(record.encoder_sha256, str) else
                          "hidden_fit.encoder_sha256 is not a digest",
                          None if width is None or record.tokens > width else
                          f"hidden_fit.tokens {record.tokens} is not above hidden_size {width}"))


def check_fit_request(kl: float, tokens: int) -> None:
    """`--hidden-kl` and `--hidden-fit-tokens` in their domain (a one-line ConfigError otherwise)."""
    if not (isinstance(kl, (int, float)) and 0 < kl < 10):
        raise ConfigError(f"--hidden-kl {kl!r}: pass the target mean KL in nats per token, e.g. 0.01 (0 < KL < 10)")
    if not (isinstance(tokens, int) and 1 <= tokens <= 1 << 24):
        raise ConfigError(f"--hidden-fit-tokens {tokens!r}: pass how many positions of the corpus's start the fit "
                          f"reads, e.g. 8192 (1 to {1 << 24})")


def check_fit_positions(found: int, width: int, asked: int) -> None:
    """The fit has more positions than the width (else S is singular): a one-line ConfigError otherwise."""
    if found <= 2 * width:
        raise ConfigError(f"--hidden-fit-tokens {asked}: the fit found {found} kept positions, and a basis of width "
                          f"{width} needs more than {2 * width}: pass a larger value or a longer corpus")


@dataclass(frozen=True)
class Fit:
    """What a writer keeps of a fit: its record, the folded head and bias (float32), the encoder."""

    record: FitRecord
    weight: np.ndarray  # [V, d] float32
    bias: np.ndarray  # [V] float32
    encoder: FitEncoder


def fit_head(h: np.ndarray, weight: np.ndarray, bias: np.ndarray | None, softcap: float | None, kl: float,
             asked: int) -> Fit:
    """The fit of the kept positions h [N, d] (the first `asked` of the store, or all it has) under the stored
    head, folded into it; a one-line ConfigError when there are too few positions."""
    check_fit_positions(len(h), h.shape[1], asked)
    basis = fit_basis(h, weight, bias, softcap, kl)
    return Fit(FitRecord.of(basis, h, kl), *basis.folded(weight, bias), basis.encoder)
