"""README.md and the guide are a contract: the README's set-up commands are what CI runs, every `hsk`
command in the docs parses as written, the README's first flow and the guide pages' blocks run in order
(on a tiny teacher and small slices), the quickstart and each command it suggests next run for real, and
the method is explained by the repository's own docs."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from pipelines.cli import command as hsk_command
from pipelines.cli import main

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()

# The pages whose shell and python blocks run, in this order, in one working folder: the README's first
# flow makes the teacher and sst2.zarr the guide's pages then use.
RUN_PAGES = ("README.md", "docs/guide/dump.md", "docs/guide/train.md", "docs/guide/hf-trainer.md",
             "docs/guide/methods.md",
             "docs/guide/rosita.md", "docs/guide/lightpaff.md", "docs/guide/sweeps.md", "docs/guide/sharing.md",
             "docs/guide/scaling.md")
# Guide pages whose blocks do not run here, and why (their `hsk` commands are still parsed below).
NOT_RUN_PAGES = {
    "docs/guide/gpus.md": "needs a GPU",
    "docs/guide/gpu-dump.md": "needs a GPU",
    "docs/guide/teachers.md": "new (issue 39): add it to RUN_PAGES once its blocks take seconds on a CPU",
    "docs/guide/troubleshooting.md": "new (issue 39): add it to RUN_PAGES once its blocks take seconds on a CPU",
    "docs/guide/sharing-security.md": "new (issue 39): add it to RUN_PAGES once its blocks take seconds on a CPU",
    "docs/guide/adding-a-codec.md": "new (issue 39): add it to RUN_PAGES once its blocks take seconds on a CPU",
    "docs/guide/zarr-tools.md": "reads the committed vectors; tests/test_zarr_tools.py makes the same reads",
    "docs/guide/lm-stores.md": "runs in test_lm_guide_blocks_run, on a tiny random Llama for its teachers",
    "docs/guide/adding-a-store-kind.md": "its code shows a registration that hsk itself makes",
}
# Every page whose `hsk` commands must parse as written (the generated CLI reference is the CLI itself).
DOC_PAGES = ("README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").rglob("*.md")
                                  if p.parts[-2:] != ("reference", "cli.md")))


def page_text(page: str) -> str:
    return (ROOT / page).read_text()


def readme_commands() -> list[str]:
    blocks = README.split("```bash\n")[1:]
    return [b.split("```")[0].strip() for b in blocks]


def hsk_commands(text: str = README, spans: bool = True) -> list[list[str]]:
    """Every `hsk ...` command of a page: code-block lines (also after `&&`) and, with `spans`, inline
    `hsk ...` spans that have arguments; prose placeholders ("...") are not commands."""
    found: list[str] = []
    in_code = False
    for line in text.splitlines():
        if line.startswith("```"):
            in_code = not in_code
            continue
        if in_code:
            found += [part.strip() for part in line.split("&&") if part.strip().startswith("hsk ")]
        elif spans:
            found += [span for span in re.findall(r"`(hsk [^`]+)`", line) if len(span.split()) > 2]
    return [shlex.split(cmd, comments=True)[1:] for cmd in found if "..." not in cmd]


def doc_commands() -> list[tuple[str, list[str]]]:
    """The README's commands, inline ones too, and every code-block command of the docs (their inline
    spans name options in prose, `hsk train --method NAME`, and are not whole commands)."""
    return [(page, args) for page in DOC_PAGES
            for args in hsk_commands(page_text(page), spans=page in RUN_PAGES[:1])]


def test_ci_runs_the_readme_test_command():
    main_job, tests = readme_commands()[:2]
    assert "hsk quickstart" in main_job and "pytest" in tests
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert tests in ci


def test_readme_has_the_commands_it_promises():
    """The README's first flow goes from a teacher to an evaluated student; the guide covers the rest."""
    assert [args[0] for args in hsk_commands()] == ["quickstart", "doctor", "teacher", "dump", "info", "train", "eval"]
    commands = [args for page in RUN_PAGES for args in hsk_commands(page_text(page), spans=False)]
    names = {args[0] for args in commands}
    assert {"teacher", "dump", "info", "verify", "train", "eval", "derive", "sweep", "report", "quickstart"} <= names
    assert all("--out" in args for args in commands if args[0] in ("train", "derive", "report"))


def test_readme_first_flow_is_small():
    """The first flow a newcomer copies finishes in minutes on a CPU: the quickstart's sizes and schedule
    (pipelines/quickstart.py), a student whose weights come from the teacher, never a random init."""
    flow = {args[0]: dict(zip(args[1::2], args[2::2])) for args in hsk_commands() if args[0] != "quickstart"}
    assert flow["teacher"]["--limit"] == "2000" and flow["teacher"]["--epochs"] == "1"
    assert flow["dump"]["--limit"] == "4000"
    assert flow["train"]["--student"] == "bert2"  # the teacher's first layers
    assert flow["train"]["--epochs-hsk"] == flow["train"]["--epochs-pred"] == "1"


def test_getting_started_runs_the_readme_flow():
    """The site's Getting started shows the README's set-up and first flow, character for character."""
    guide = page_text("docs/getting-started.md")
    for block in readme_commands()[:3]:
        assert f"```bash\n{block}\n```" in guide


def test_every_guide_page_is_run_or_says_why_not():
    guide = {str(p.relative_to(ROOT)) for p in (ROOT / "docs" / "guide").glob("*.md")}
    assert guide == {p for p in RUN_PAGES if p.startswith("docs/guide/")} | set(NOT_RUN_PAGES)


@pytest.mark.parametrize("page,args", doc_commands(), ids=lambda x: x if isinstance(x, str) else " ".join(x)[:60])
def test_every_documented_command_parses_as_written(page, args, capsys):
    """Options, types and required arguments are checked as the CLI would, without running the command."""
    command = hsk_command().commands.get(args[0])  # as `hsk` runs: older option names are hidden aliases
    assert command is not None, f"{page} uses an unknown command: hsk {args[0]}"
    try:
        if "--help" not in args:  # --help stops parsing: the help run below covers it
            command.make_context(args[0], list(args[1:]))
    except Exception as exc:  # Typer's own click: a UsageError / MissingParameter / BadParameter
        message = exc.format_message() if hasattr(exc, "format_message") else str(exc)
        pytest.fail(f"{page}: `hsk {' '.join(args)}` does not parse: {message}")
    assert main([args[0], "--help"]) == 0
    assert "Usage: hsk" in capsys.readouterr().out


def test_method_is_explained_by_the_repository_itself():
    assert (ROOT / "docs" / "METHOD.md").is_file()
    for path in [ROOT / "README.md", *ROOT.glob("docs/**/*.md"), *ROOT.glob("pipelines/**/*.py"),
                 *ROOT.glob("hskstore/**/*.py"), *ROOT.glob("notebooks/*.ipynb")]:
        text = path.read_text()
        assert "shared/docs" not in text and "shared/seeds" not in text, path


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("all_minilm_l6_v2") is None, reason="needs the 'minilm' extra")
def test_readme_quickstart_runs(tmp_path, glue_dir, monkeypatch, capsys):
    """The README's main job, as written except for a smaller size and a temporary --out."""
    setup = readme_commands()[0]
    args = shlex.split(setup.split("&& hsk ")[-1])
    assert args[0] == "quickstart" and args[1:] == ["--data-dir", "../shared/data/glue"]
    monkeypatch.chdir(ROOT)  # the README runs from the repository root
    out = tmp_path / "qs"
    code = main([*args, "--out", str(out), "--teacher-examples", "64", "--dump-examples", "96", "--device", "cpu",
                 "--no-progress"])
    captured = capsys.readouterr()
    printed = captured.out
    assert "\r" not in captured.err  # --no-progress: no bar redraws in a log
    assert code == 0
    summary = json.loads((out / "quickstart.json").read_text())
    assert summary["rows"] == 96 and Path(summary["student"]).is_dir()
    assert f"teacher  {out / 'teacher'}" in printed and "Next, try:" in printed
    next_steps = [line.strip() for line in printed.splitlines()[printed.splitlines().index("Next, try:") + 1:]]
    assert [cmd.split()[1] for cmd in next_steps[:3]] == ["eval", "derive", "train"]
    for command in next_steps:  # every suggestion runs as printed (size flags of SIZES added)
        args = sized(shlex.split(command)[1:], tmp_path)
        assert main(args) == 0, f"the quickstart suggested `{command}`, which failed"
    assert "config 1,8,0.1" in capsys.readouterr().out


# --------------------------------------------------------------------------------------------------
# The README's code blocks, run in order

# Commands the runner does not run, and why; a line of a run page containing the key is skipped. Keep it short.
NOT_RUN = {
    "python3 -m venv": "the set-up: the tests run inside it (CI runs it; test_readme_quickstart_runs runs the "
                       "quickstart)",
    'pip install -e ".[': "installs an extra: the test extra already holds what these pages use (jupyter execute)",
    "AWS_ENDPOINT_URL": "needs your S3 endpoint and credentials: tests/test_s3.py runs these commands against "
                        "its own S3 server",
    "my-bucket": "as above (tests/test_s3.py)",
    "/tmp/weed": "starts a SeaweedFS server as tests/s3_server.py does for tests/test_s3.py",
    "--workers 2": "a dask cluster of 2 processes: tests/test_dump_distributed.py and tests/test_sweep.py run it",
    "torchrun": "2 training processes: tests/test_ddp.py runs it",
    "LMDistillTrainer(": "needs a causal-LM store and teacher: test_lm_guide_blocks_run runs it on a tiny Llama",
    "register(Method(": "registers a method in the test process: tests/test_method.py adds methods the same way",
    "upload_folder(": "pushes to the Hugging Face Hub (network and a token): tests/test_share.py builds the folder "
                      "it pushes, offline",
}
# Documented size flags only (set, or replaced where the README gives them), so that the flow runs in seconds.
SIZES = {
    "teacher": {"--limit": "64", "--epochs": "1", "--eval-limit": "32", "--batch-size": "16"},
    "dump": {"--limit": "64"},
    "train": {"--max-steps": "2", "--eval-limit": "32"},
    "eval": {"--eval-limit": "32"},
    "student": {"--limit": "64"},
    "sweep": {"--max-steps": "1", "--eval-limit": "16"},
}


@dataclass(frozen=True)
class Block:
    lang: str
    lines: tuple[str, ...]
    line_no: int  # of the opening fence


def readme_blocks(text: str = README) -> list[Block]:
    """Every fenced code block of a page (the README by default), in order."""
    blocks, lang, body, start = [], None, [], 0
    for no, line in enumerate(text.splitlines(), 1):
        if line.startswith("```"):
            if lang is None:
                lang, body, start = line[3:].strip(), [], no
            else:
                blocks.append(Block(lang, tuple(body), start))
                lang = None
            continue
        if lang is not None:
            body.append(line)
    return blocks


def _set_flags(args: list[str], flags: dict[str, str]) -> list[str]:
    args = list(args)
    for flag, value in flags.items():
        if flag in args:
            args[args.index(flag) + 1] = value
        else:
            args += [flag, value]
    return args


def sized(args: list[str], tiny_base: Path) -> list[str]:
    """The README's `hsk` arguments with the test's sizes and a tiny base encoder instead of MiniLM."""
    if "--base" in args:
        args[args.index("--base") + 1] = str(tiny_base)
    flags = SIZES.get(args[0], {})
    if args[:2] == ["teacher", "--objective"]:
        flags = {k: v for k, v in flags.items() if k != "--eval-limit"}  # an MLM teacher holds out its own rows
    if args[:2] == ["dump", "--objective"] or args[0] == "dump":
        flags = SIZES["dump"]
    return _set_flags(args, flags)


def _tiny_base(folder: Path) -> Path:
    """A base encoder as small as a test allows and as wide as the README's ROSITA recipe needs
    (4 layers, 4 heads of 32, FFN 384, the tiny vocabulary)."""
    from conftest import build_tiny_tokenizer, make_tiny_bert

    make_tiny_bert(num_layers=4, hidden=128, heads=4, head=False, intermediate_size=384).save_pretrained(folder)
    build_tiny_tokenizer(folder)
    return folder


def _run_shell(line: str, cwd: Path, page: str = "README.md") -> None:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
               MPLBACKEND="Agg", PATH=os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]]))
    line = line.replace(" notebooks/", f" {ROOT / 'notebooks'}/")  # the README runs from the repository root
    done = subprocess.run(["bash", "-c", line], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"{page}: line failed: {line}\n{done.stdout[-2000:]}{done.stderr[-2000:]}"


def _commands(block: Block) -> list[str]:
    out = []
    for line in block.lines:
        if not line.strip() or line.strip().startswith("#"):
            continue
        if any(key in line for key in NOT_RUN):
            continue
        out.append(line)
    return out


def run_blocks() -> list[tuple[str, Block]]:
    """(page, block) for every code block of RUN_PAGES, in order."""
    return [(page, block) for page in RUN_PAGES for block in readme_blocks(page_text(page))]


def test_readme_blocks_have_no_unknown_skips():
    """Each NOT_RUN entry still matches a line of a run page: the list cannot hide a block that was removed."""
    text = "\n".join(line for _, b in run_blocks() for line in b.lines)
    assert all(key in text for key in NOT_RUN), [key for key in NOT_RUN if key not in text]
    shell = [b for _, b in run_blocks() if b.lang in ("", "bash", "console", "sh")]
    skipped = [line for b in shell for line in b.lines if any(key in line for key in NOT_RUN)]
    run = [line for b in shell for line in _commands(b)]
    assert len(skipped) <= 20 and len(run) >= 20, (len(skipped), len(run))  # set-up, S3, dask, torchrun


@pytest.mark.slow
def test_readme_blocks_run_in_order(tmp_path, glue_dir, monkeypatch):
    """Every shell and python block of README.md and the guide's RUN_PAGES, in order, as written: only the
    documented size flags
    (SIZES) and a tiny base encoder instead of MiniLM are substituted; NOT_RUN says what is not run
    and where it is tested instead. Runs where ../shared/data/glue is the GLUE folder, as in the repo."""
    (tmp_path / "shared" / "data").mkdir(parents=True)
    (tmp_path / "shared" / "data" / "glue").symlink_to(glue_dir)
    work = tmp_path / "work"
    work.mkdir()
    tiny = _tiny_base(tmp_path / "tiny-base")
    monkeypatch.chdir(work)
    monkeypatch.delenv("HSK_DATA_DIR", raising=False)
    ran = []
    for page, block in run_blocks():
        if block.lang == "python":
            source = "\n".join(block.lines)
            if not any(key in source for key in NOT_RUN):
                exec(compile(source, f"{page}:{block.line_no}", "exec"), {})
                ran.append(f"python block at {page}:{block.line_no}")
            continue
        if block.lang not in ("", "bash", "console", "sh"):
            continue
        for line in _commands(block):
            for part in (p.strip() for p in line.split("&&")):
                if part.startswith("hsk "):
                    args = sized(shlex.split(part, comments=True)[1:], tiny)
                    assert main(args) == 0, f"{page}:{block.line_no}: `{part}` failed (ran as hsk {args})"
                else:
                    _run_shell(part, work, page)
                ran.append(part)
    # Run from the repository root, the docs' commands leave nothing git would track there: outputs go under
    # runs/, stores are *.zarr and bundles *.hsk.zip (.gitignore)
    left = [f"{p.name}/" if p.is_dir() else p.name for p in work.iterdir()]
    ignored = subprocess.run(["git", "check-ignore", "--no-index", "--stdin"], cwd=ROOT, input="\n".join(left),
                             capture_output=True, text=True).stdout.split()
    assert sorted(set(left) - set(ignored)) == []
    assert (work / "runs" / "sweep" / "notebook" / "marginal_utility.png").is_file()
    assert json.loads((work / "runs" / "bert2" / "summary.json").read_text())["method"] == "mud"
    assert len(ran) >= 20


# --------------------------------------------------------------------------------------------------
# docs/guide/lm-stores.md and the LM part of docs/guide/hf-trainer.md, run as written on a tiny teacher

# Size flags of the LM guide's commands (replaced or added): blocks of 32 tokens, a few documents and steps.
LM_SIZES = {
    "dump": {"--limit": "24", "--block-size": "32", "--max-length": "40", "--max-target": "12", "--batch-size": "8"},
    "teacher": {"--limit": "24", "--max-length": "32"},
    "train": {"--max-steps": "2"},
    "eval": {"--eval-limit": "4", "--block-size": "32", "--max-length": "40", "--max-target": "6"},
}
LM_PAGES = ("docs/guide/lm-stores.md", "docs/guide/hf-trainer.md")


def _lm_sized(args: list[str]) -> list[str]:
    flags = {k: v for k, v in LM_SIZES.get(args[0], {}).items()
             if k in args or k in ("--limit", "--max-steps", "--eval-limit")}
    if args[0] == "eval" and "--pairs-file" in args:
        flags.pop("--block-size", None)
    if args[0] == "eval" and "--text-file" in args:
        flags = {k: v for k, v in flags.items() if k in ("--eval-limit", "--block-size")}
    return _set_flags(args, flags)


def _lm_files(work: Path) -> None:
    """What the guide's commands read: a corpus and held-out text, pairs and held-out pairs, and runs/my-lm (a
    tiny random Llama over a BPE tokenizer of the corpus; it also stands in for smollm2)."""
    from conftest import build_bpe_tokenizer, corpus_lines, save_tiny_causal_lm

    lines = corpus_lines(400)
    (work / "corpus.txt").write_text("\n".join(lines[:300]) + "\n", encoding="utf-8")
    (work / "test.txt").write_text("\n".join(lines[300:340]) + "\n", encoding="utf-8")
    for name, rows in (("pairs.tsv", lines[:32]), ("dev.tsv", lines[340:352])):
        (work / name).write_text("source\ttarget\n" + "".join(f"{a}\t{b}\n" for a, b in zip(rows[::2], rows[1::2])),
                                 encoding="utf-8")
    save_tiny_causal_lm(work / "runs" / "my-lm", build_bpe_tokenizer(work / "tok", lines))


@pytest.mark.slow
def test_lm_guide_blocks_run(tmp_path, glue_dir, monkeypatch):
    """Every shell and python block of the LM guide (and the LM section of the Trainer guide), in order, as
    written: LM_SIZES shrink the sizes, a tiny Llama is runs/my-lm and stands in for smollm2 (the guide's point
    there is the command's shape; a real SmolLM2 takes minutes on 2 cores); `pip install` lines are skipped."""
    from pipelines.core import models

    work = tmp_path / "work"
    work.mkdir()
    _lm_files(work)
    monkeypatch.setitem(models.NAMED, "smollm2", lambda: str(work / "runs" / "my-lm"))
    monkeypatch.chdir(work)
    variables: dict[str, str] = {}
    ran = []
    for page in LM_PAGES:
        for block in readme_blocks(page_text(page)):
            source = "\n".join(block.lines)
            if block.lang == "python" and "LMStoreDataset" in source:
                exec(compile(source, f"{page}:{block.line_no}", "exec"), {})
                ran.append(f"python block at {page}:{block.line_no}")
            if block.lang != "bash" or page != LM_PAGES[0]:
                continue
            for line in block.lines:
                if not line.strip() or line.strip().startswith(("#", "pip ")):
                    continue
                if re.fullmatch(r"[A-Z]+='.*'", line.strip()):  # PROMPT='...': the shell variable the block uses
                    name, value = line.strip().split("=", 1)
                    variables[name] = shlex.split(value)[0]
                    continue
                text = re.sub(r"\$(\w+)", lambda m: variables.get(m.group(1), m.group(0)), line)
                if text.startswith("hsk teacher"):  # it writes runs/my-lm, which the first block already reads
                    text = text.replace("runs/my-lm", "runs/my-lm-tuned")
                args = _lm_sized(shlex.split(text, comments=True)[1:])
                assert main(args) == 0, f"{page}:{block.line_no}: `{line}` failed (ran as hsk {args})"
                ran.append(line)
    assert len(ran) >= 12 and (work / "runs" / "para" / "best").is_dir() and (work / "runs" / "hf-lm").is_dir()
