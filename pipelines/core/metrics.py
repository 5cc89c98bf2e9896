"""GLUE metrics in plain numpy (docs/METHOD.md section 10), so evaluation needs no sklearn or scipy.

Degenerate inputs follow sklearn/scipy: Matthews correlation and F1 are 0.0 where undefined
(e.g. one predicted class); Pearson and Spearman are NaN when either side is constant.
"""

from __future__ import annotations

import numpy as np

from pipelines.core.tasks import Task, get_task


def _pair(predictions: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    p, y = np.asarray(predictions).reshape(-1), np.asarray(labels).reshape(-1)
    if p.shape != y.shape:
        raise ValueError(f"predictions and labels differ in length: {p.shape[0]} vs {y.shape[0]}")
    return p, y


def accuracy(predictions: np.ndarray, labels: np.ndarray) -> float:
    p, y = _pair(predictions, labels)
    return float(np.mean(p == y)) if len(y) else float("nan")


def f1(predictions: np.ndarray, labels: np.ndarray) -> float:
    """Binary F1 of the positive class 1."""
    p, y = _pair(predictions, labels)
    tp = np.sum((p == 1) & (y == 1))
    fp = np.sum((p == 1) & (y != 1))
    fn = np.sum((p != 1) & (y == 1))
    denom = 2 * tp + fp + fn
    return float(2 * tp / denom) if denom else 0.0


def matthews_corrcoef(predictions: np.ndarray, labels: np.ndarray) -> float:
    """Matthews correlation, multi-class form (Gorodkin's R_K; equals the binary formula for 2 classes)."""
    p, y = _pair(predictions, labels)
    classes, inv = np.unique(np.concatenate([y, p]), return_inverse=True)
    k, n = len(classes), len(y)
    confusion = np.zeros((k, k), dtype=np.float64)
    np.add.at(confusion, (inv[:n], inv[n:]), 1.0)
    t, q = confusion.sum(axis=1), confusion.sum(axis=0)  # true / predicted class counts
    c, s = np.trace(confusion), float(n)
    cov_yp = c * s - t @ q
    cov_pp = s * s - q @ q
    cov_yy = s * s - t @ t
    denom = np.sqrt(cov_pp * cov_yy)
    return float(cov_yp / denom) if denom > 0 else 0.0


def pearson(x: np.ndarray, y: np.ndarray) -> float:
    a, b = _pair(x, y)
    a, b = a.astype(np.float64), b.astype(np.float64)
    a, b = a - a.mean(), b - b.mean()
    denom = np.sqrt((a @ a) * (b @ b))
    return float(np.clip((a @ b) / denom, -1.0, 1.0)) if denom > 0 else float("nan")


def rankdata(x: np.ndarray) -> np.ndarray:
    """1-based ranks; tied values share the average of their ranks (scipy's 'average' method)."""
    values, inverse, counts = np.unique(np.asarray(x).reshape(-1), return_inverse=True, return_counts=True)
    starts = np.cumsum(counts) - counts  # 0-based rank of each distinct value's first occurrence
    return (starts + (counts + 1) / 2.0)[inverse]


def spearman(x: np.ndarray, y: np.ndarray) -> float:
    """Spearman rank correlation: Pearson on average ranks (ties handled)."""
    a, b = _pair(x, y)
    return pearson(rankdata(a), rankdata(b))


def _labelled_scores(task: Task, pred: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Regression: (scores, gold) as float64 over the rows with a gold score (not NaN)."""
    if pred.ndim == 2 and pred.shape[1] == 1:
        pred = pred[:, 0]
    if pred.ndim != 1:
        raise ValueError(
            f"{task.name} is a regression task: expected scores [N] or [N, 1], got {pred.shape}"
        )
    keep = ~np.isnan(y.astype(np.float64))
    return pred[keep].astype(np.float64), y[keep].astype(np.float64)


def _labelled_classes(task: Task, pred: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Classification: (predicted ids, gold ids) as int64 over the rows with a gold label (>= 0, not NaN)."""
    if pred.ndim == 2:
        if pred.shape[1] != task.num_labels:
            raise ValueError(f"{task.name} has {task.num_labels} classes but logits are {pred.shape}")
        pred = pred.argmax(axis=1)
    elif pred.ndim != 1:
        raise ValueError(f"expected logits [N, C] or class ids [N], got {pred.shape}")
    yf = y.astype(np.float64)
    keep = ~np.isnan(yf) & (yf >= 0)
    return pred[keep].astype(np.int64), y[keep].astype(np.int64)


def compute_metrics(task: Task | str, predictions: np.ndarray, labels: np.ndarray) -> dict[str, float]:
    """All metrics of a task (primary first), over the rows that have a gold label.

    predictions: logits [N, C] (argmax is taken) or class ids [N] for classification; scores [N] or
    [N, 1] for regression. labels: int class ids with -1 = no label, or floats with NaN = no label.
    With no labelled row every metric is NaN.
    """
    task = get_task(task)
    pred = np.asarray(predictions)
    y = np.asarray(labels).reshape(-1)
    if pred.shape[0] != y.shape[0]:
        raise ValueError(f"{pred.shape[0]} predictions for {y.shape[0]} labels")
    pred, y = _labelled_scores(task, pred, y) if task.is_regression else _labelled_classes(task, pred, y)

    if len(y) == 0:
        return {name: float("nan") for name in task.metrics}
    fns = {
        "accuracy": accuracy,
        "f1": f1,
        "matthews": matthews_corrcoef,
        "pearson": pearson,
        "spearman": spearman,
    }
    return {name: fns[name](pred, y) for name in task.metrics}
