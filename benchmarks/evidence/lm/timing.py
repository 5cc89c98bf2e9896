"""The CPU costs that size run.py's `--scale cpu` (issue 47): one student step, the teacher per token, eval per token.

    nice python benchmarks/evidence/lm/timing.py [--teacher ~/.cache/hsk/models/smollm2-135m] [--layers 2]

Measures with plain transformers + torch (no hsk), so it runs before hsk's clm kind exists:
  - a training step of the first-k-layer student at block 128, batch 8: forward, a full-vocabulary
    KD loss against stored-size logits (so the 49,152-wide softmax is in it) and backward, Adam step;
  - the teacher's forward per token (what a dump and the online arm pay), batch 8 x 128;
  - the student's eval forward per token (what `hsk eval` pays per test token).
Each is the median of a few repeats after one warm-up. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

DEFAULT_TEACHER = Path("~/.cache/hsk/models/smollm2-135m").expanduser()


def median_seconds(fn, repeats: int) -> float:
    fn()  # warm-up: first-call allocations and kernel selection
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def student_from(teacher, layers: int):
    """The teacher's first `layers` layers, its embeddings, final norm and (tied) head: the study's student."""
    import copy

    from transformers import AutoModelForCausalLM

    config = copy.deepcopy(teacher.config)
    config.num_hidden_layers = layers
    student = AutoModelForCausalLM.from_config(config)
    student.load_state_dict(teacher.state_dict(), strict=False)  # layers >= k are simply not taken
    return student


def main(argv: list[str] | None = None) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--teacher", type=Path, default=DEFAULT_TEACHER)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--block", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    teacher = AutoModelForCausalLM.from_pretrained(args.teacher.expanduser(), dtype=torch.float32).eval()
    student = student_from(teacher, args.layers).train()
    vocab = teacher.config.vocab_size
    ids = torch.randint(0, vocab, (args.batch, args.block))
    target = torch.randn(args.batch, args.block, vocab).log_softmax(-1)  # stands in for a teacher's log-probs
    optimizer = torch.optim.AdamW(student.parameters(), lr=1e-4)

    def step() -> None:
        logits = student(ids).logits
        kd = torch.nn.functional.kl_div(logits.log_softmax(-1), target, log_target=True, reduction="batchmean")
        ce = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, vocab), ids[:, 1:].reshape(-1))
        (0.5 * kd + 0.5 * ce).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    def teacher_forward() -> None:
        with torch.inference_mode():
            teacher(ids).logits.log_softmax(-1)

    def student_eval() -> None:
        with torch.inference_mode():
            student(ids).logits.log_softmax(-1)

    tokens = args.batch * args.block
    result = {
        "layers": args.layers, "batch": args.batch, "block": args.block, "threads": args.threads,
        "student_step_s": median_seconds(step, args.repeats),
        "teacher_forward_s_per_token": median_seconds(teacher_forward, args.repeats) / tokens,
        "student_eval_s_per_token": median_seconds(student_eval, args.repeats) / tokens,
    }
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
