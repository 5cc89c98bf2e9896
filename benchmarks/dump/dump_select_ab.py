"""The CPU dump against the bare forward, with this checkout's selection and with another's, in one process.

    git show ff67a8c:pipelines/dump/select_torch.py > /tmp/select_old.py
    python benchmarks/dump/dump_select_ab.py --old-select /tmp/select_old.py --limit 512 --rounds 4

Three arms, alternated (the order flips each round): the bare forward (benchmarks/dump/dump_throughput.py's),
the dump, and the same dump with `select_batch` taken from the file given (an earlier commit's
pipelines/dump/select_torch.py). Everything else is the same code, so the two dumps' ratios differ by
the selection alone. Random teacher weights, MiniLM size, QNLI dev, 3,8,0.2, batch 32, torch's threads
as `hsk dump` sets them (the physical cores).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import tempfile
from pathlib import Path

from transformers import BertForSequenceClassification, BertTokenizerFast

sys.path.insert(0, str(Path(__file__).resolve().parent))
import dump_throughput as dt  # noqa: E402

from hskstore.format.config import HSKConfig  # noqa: E402
from pipelines.core.data import load_examples  # noqa: E402
from pipelines.core.tasks import get_task  # noqa: E402
from pipelines.core.threads import use_threads  # noqa: E402
from pipelines.core.tokenize import encode  # noqa: E402
from pipelines.dump import stage  # noqa: E402


def load_module(path: str):
    spec = importlib.util.spec_from_file_location("select_other", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--old-select", required=True, help="Another commit's pipelines/dump/select_torch.py.")
    ap.add_argument("--data-dir", default=dt.DATA_DIR)
    ap.add_argument("--limit", type=int, default=512)
    ap.add_argument("--rounds", type=int, default=4)
    args = ap.parse_args()
    use_threads(None, "dump")
    old, new = load_module(args.old_select).select_batch, stage.select_batch
    task, work = get_task("qnli"), Path(tempfile.mkdtemp(prefix="hsk-bench-"))
    teacher = dt.make_teacher("minilm", task.num_labels, work / "teacher")
    model = BertForSequenceClassification.from_pretrained(teacher).eval()
    enc = encode(BertTokenizerFast.from_pretrained(teacher),
                 load_examples(task, "dev", data_dir=args.data_dir, limit=args.limit).texts, 128)
    options = stage.DumpOptions(config=HSKConfig.parse("3,8,0.2"), max_length=128, batch_size=32, device="cpu",
                                progress=False, overwrite=True)

    def dump_with(select) -> float:
        stage.select_batch = select
        try:
            return stage.dump("qnli", options, teacher=teacher, out=str(work / "s.zarr"), split="dev",
                              data_dir=args.data_dir, limit=args.limit, log=lambda *_: None).seconds
        finally:
            stage.select_batch = new

    arms = {"forward": lambda: dt.bare_forward(model, enc, 32, "cpu"), "dump": lambda: dump_with(new),
            "dump_old_select": lambda: dump_with(old)}
    arms["forward"]()  # warm-up
    n = args.limit
    for r in range(args.rounds):
        order = list(arms) if r % 2 == 0 else list(arms)[::-1]
        t = {arm: arms[arm]() for arm in order}
        print(f"round {r}: forward {n / t['forward']:.1f} ex/s; dump {n / t['dump']:.1f} ex/s, ratio "
              f"{t['forward'] / t['dump']:.3f}; with the other selection {n / t['dump_old_select']:.1f} ex/s, ratio "
              f"{t['forward'] / t['dump_old_select']:.3f} (load {[round(x, 2) for x in os.getloadavg()]})", flush=True)


if __name__ == "__main__":
    main()
