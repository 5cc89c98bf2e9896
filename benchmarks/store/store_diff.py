"""How far apart two stores of the same rows and config are: the hidden states they keep, per layer.

Made for issue 35 (a teacher forward in fp16 against fp32): dump the same rows twice, with
`hsk dump --precision fp32` and `--precision fp16`, and compare. Per kept layer, over the slots where
both stores kept the same token (the fraction is printed: near-ties in the ranking can pick another
token), the mean relative difference sum|a - b| / sum|a| of the decoded values (a: the first store),
and the mean over vectors of ||a - b|| / ||a||; also the logits' relative difference and how often the
teacher's predicted class agrees. Reads both stores with hskstore's reader (numpy only).

Usage: python benchmarks/store/store_diff.py A.zarr B.zarr > diff.json
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field

import numpy as np

from hskstore import open_store


@dataclass
class LayerDiff:
    num: float = 0.0
    den: float = 0.0
    vector_rel: list = field(default_factory=list)
    slots: int = 0
    same: int = 0

    def add(self, xa: np.ndarray, xb: np.ndarray, pa: np.ndarray, pb: np.ndarray) -> None:
        same = (pa == pb) & (pa >= 0)  # slots that kept the same token in both stores
        va, vb = xa[same].astype(np.float64), xb[same].astype(np.float64)
        self.num += float(np.abs(va - vb).sum())
        self.den += float(np.abs(va).sum())
        norm = np.linalg.norm(va, axis=1)
        self.vector_rel.append(np.linalg.norm(va - vb, axis=1)[norm > 0] / norm[norm > 0])
        self.slots += int((pa >= 0).sum())
        self.same += int(same.sum())

    def summary(self, teacher_layer: int) -> dict:
        return {"teacher_layer": teacher_layer, "mean_relative_difference": self.num / self.den,
                "mean_vector_relative_l2": float(np.concatenate(self.vector_rel).mean()),
                "kept_slots": self.slots, "same_position_fraction": self.same / self.slots}


def compare(path_a: str, path_b: str) -> dict:
    a, b = open_store(path_a), open_store(path_b)
    if len(a) != len(b) or [k.name for k in a.layers] != [k.name for k in b.layers]:
        raise SystemExit("the stores differ in rows or layers: dump the same rows at the same config")
    layers = {k.name: LayerDiff() for k in a.layers}
    logit_num = logit_den = 0.0
    agree = 0
    for shard in range(a.n_shards):
        da, db = a.read_shard(shard), b.read_shard(shard)
        la, lb = da["logits"].astype(np.float64), db["logits"].astype(np.float64)
        logit_num += float(np.abs(la - lb).sum())
        logit_den += float(np.abs(la).sum())
        agree += int((la.argmax(1) == lb.argmax(1)).sum())
        for k in a.layers:
            layers[k.name].add(a.dense(da, k), b.dense(db, k), da[f"{k.name}/positions"], db[f"{k.name}/positions"])
    return {"a": path_a, "b": path_b, "rows": len(a),
            "layers": {k.name: layers[k.name].summary(k.teacher_layer) for k in a.layers},
            "logits_mean_relative_difference": logit_num / logit_den, "prediction_agreement": agree / len(a)}


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("a", help="the first store (the reference)")
    parser.add_argument("b", help="the second store, the same rows and config")
    args = parser.parse_args(argv)
    print(json.dumps(compare(args.a, args.b), indent=2))


if __name__ == "__main__":
    main(sys.argv[1:])
