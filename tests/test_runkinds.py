"""Run kinds (pipelines/runkinds.py, pipelines/kinds/): each store kind's compute found by name, its flags typed in
its own module, a flag of another kind refused, the kind's default method, and a plugin kind loaded by name alone."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import hsk, tree_hashes

from hskstore.format import kinds as store_kinds
from pipelines import runkinds
from pipelines.cli import main
from pipelines.core.flags import flag_fields
from pipelines.kinds.clm import ClmTeacherOptions
from pipelines.methods import get_method

REPO = Path(__file__).resolve().parents[1]


def test_every_built_in_store_kind_has_a_run_kind_with_a_method_that_reads_it():
    for name in runkinds.builtin():
        kind = runkinds.get(name)
        assert kind.name == name and store_kinds.get(name).name == name
        assert name in get_method(kind.default_method).kinds
        for part in ("dump", "prepare", "teacher", "evaluate"):
            if getattr(kind, part) is not None:
                assert callable(kind.load(part)), (name, part)
        assert dataclasses.is_dataclass(kind.dump_options) and flag_fields(kind.dump_options)


def test_the_registry_and_every_kind_declaration_import_without_torch():
    code = ("import sys\nfrom pipelines import runkinds\nfor n in runkinds.builtin(): runkinds.get(n)\n"
            "import pipelines.cli.generated\nprint(sorted(m for m in sys.modules if m.split('.')[0] == 'torch'))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


@pytest.mark.parametrize("extra, owner", [(["--task", "sst2"], "--objective task and seq2seq"),
                                          (["--config", "3,8,0.2"], "--objective task"),
                                          (["--decode", "greedy"], "--objective seq2seq"),
                                          (["--write-processes", "2"], "--objective task")])
def test_a_flag_of_another_kind_is_refused_naming_its_kind(extra, owner, clm_teacher, clm_corpus, tmp_path):
    """`hsk dump --objective clm` with a task or seq2seq flag: one line naming the flag and its kind, nothing
    written, the corpus and the teacher unchanged (before, the flag was accepted and ignored)."""
    before = tree_hashes(clm_teacher), clm_corpus.read_bytes()
    out = tmp_path / "lm.zarr"
    rc, _, err = hsk("dump", "--objective", "clm", "--teacher", str(clm_teacher), "--text-file", str(clm_corpus),
                     "--out", str(out), *extra)
    lines = err.strip().splitlines()
    assert rc == 2 and len(lines) == 1, err
    assert lines[0] == f"hsk: error: {extra[0]} is an option of {owner}, not of --objective clm: drop it"
    assert not out.exists() and (tree_hashes(clm_teacher), clm_corpus.read_bytes()) == before


def test_teacher_and_eval_refuse_a_flag_of_another_kind(tmp_path):
    rc, _, err = hsk("teacher", "--objective", "clm", "--task", "sst2", "--out", str(tmp_path / "t"))
    assert rc == 2 and err.strip() == "hsk: error: --task is an option of --objective task, not of --objective clm: " \
                                      "drop it"
    rc, _, err = hsk("eval", str(tmp_path), "--task", "sst2", "--block-size", "64")
    assert rc == 2 and "--block-size is an option of the clm evaluation, not of the task evaluation" in err
    # a kind's options by name (how a package's kind takes its own): the kind's dataclass reads them, or refuses
    rc, _, err = hsk("teacher", "--objective", "clm", "--set", "blocks=64", "--out", str(tmp_path / "t"))
    assert rc == 2 and err.strip() == ("hsk: error: --set blocks: ClmTeacherOptions has no field 'blocks'; its "
                                       f"fields: {', '.join(f.name for f in dataclasses.fields(ClmTeacherOptions))}")
    rc, _, err = hsk("eval", str(tmp_path), "--objective", "clm", "--set", "block_size=many")
    assert rc == 2 and err.strip() == "hsk: error: --set block_size=many: cannot read 'many' as int", err
    rc, _, err = hsk("eval", str(tmp_path), "--objective", "mlm")
    assert rc == 2 and err.strip() == "hsk: error: --objective mlm: the mlm kind has no evaluation of its own", err
    assert not (tmp_path / "t").exists()


@pytest.fixture(scope="module")
def clm_store(tmp_path_factory, clm_teacher, clm_corpus) -> Path:
    out = tmp_path_factory.mktemp("runkind_clm") / "lm.zarr"
    assert main(["dump", "--objective", "clm", "--teacher", str(clm_teacher), "--text-file", str(clm_corpus),
                 "--support", "topk:8", "--block-size", "32", "--limit", "40", "--shard-rows", "8", "--no-progress",
                 "--device", "cpu", "--out", str(out)]) == 0
    return out


def test_a_store_trains_with_its_kinds_method_when_none_is_named(clm_store, tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["train", "--store", str(clm_store), "--student", "first2", "--max-steps", "2", "--batch-size", "4",
                 "--device", "cpu", "--no-progress", "--out", str(out)]) == 0
    said = [line for line in capsys.readouterr().out.splitlines() if line.startswith("method:")]
    assert said == ["method: clm-kd (what a clm store trains with unless --method says otherwise; `hsk methods` "
                    "lists them)"]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["method"] == "clm-kd" and summary["steps"] == 2


def test_a_method_that_cannot_read_the_store_is_refused_naming_those_that_can(clm_store, tmp_path):
    before = tree_hashes(clm_store)
    out = tmp_path / "run"
    rc, _, err = hsk("train", "--store", str(clm_store), "--student", "first2", "--method", "kd", "--out", str(out))
    lines = err.strip().splitlines()
    assert rc == 2 and len(lines) == 1, err
    assert f"method kd reads task stores, and {clm_store} is a clm store (" in lines[0]
    fits = lines[0].split("): pass --method ")[1].split(" (or leave --method out")[0].split(" or ")
    assert "clm-kd" in fits and "kd" not in fits and lines[0].endswith("(or leave --method out: its kind's default)")
    assert tree_hashes(clm_store) == before and not out.exists()


def _site(tmp_path: Path, entry: str) -> Path:
    """A folder holding an installed package's metadata whose hsk.run_kinds entry point is `entry`."""
    dist = tmp_path / "site" / "toy_kind-0.3.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: toy-kind\nVersion: 0.3\n")
    (dist / "entry_points.txt").write_text(f"[hsk.run_kinds]\n{entry}\n")
    return tmp_path / "site"


def test_a_broken_run_kind_plugin_fails_its_own_kind_alone(clm_store, tmp_path):
    """Run kinds load per name: a plugin that cannot be imported stops `--objective toy` in one line naming its
    package, and a causal-LM store still trains (the plugin is never imported for it)."""
    site = _site(tmp_path, "toy = no_such_module_for_toy")
    env = {"PYTHONPATH": os.pathsep.join([str(site), str(REPO)])}
    rc, _, err = hsk("dump", "--objective", "toy", "--teacher", "t", "--out", str(tmp_path / "toy.zarr"), **env)
    lines = err.strip().splitlines()
    assert rc == 2 and len(lines) == 1, err
    assert lines[0].startswith("hsk: error: the hsk.run_kinds extension 'toy' of toy-kind 0.3") and \
        "uninstall toy-kind" in lines[0]
    rc, out, err = hsk("train", "--store", str(clm_store), "--student", "first2", "--max-steps", "1", "--batch-size",
                       "4", "--device", "cpu", "--no-progress", "--out", str(tmp_path / "run"), timeout=300, **env)
    assert rc == 0, err
    assert "method: clm-kd" in out
    rc, out, err = hsk("info", str(clm_store), **env)
    assert rc == 0 and "clm" in out, err


# --- where each run kind lives: the run-kind half of tests/test_store_kinds.py's check -----------------------------
# A run kind's modules are those its declaration names: the module declaring its RunKind, the modules of its entry
# points (dump, prepare, teacher, evaluate, feed) and of the methods that read its stores (Method.kinds). Beside them,
# OWN lists each kind's other modules (each must be imported by one of those: a stale or unrelated entry fails), and
# DECLARATIONS the shared tables looked up by name that hold every kind's line. Any other module of pipelines/ whose
# code (comments left out) names the kind branches on it, and fails the test.

OWN = {"mlm": {"pipelines/train/kinds/mlm_teacher.py"},  # its teacher's fine-tuning (`hsk teacher --objective mlm`)
       "clm": {"pipelines/train/kinds/clm_teacher.py"}}
DECLARATIONS = {
    "pipelines/runkinds.py",  # the built-in kinds' declarations, by name
    "pipelines/registry.py",  # the vocabularies: each kind's store read and head are named after it
    "pipelines/train/students/adapter.py",  # the student adapters, keyed by head ("mlm", "clm")
}
# the first kind, the default objective: what names it is a comparison of an objective with it
TASK_NAMING = (r"""objective[^\n=!]*[!=]=\s*["']task["']|["']task["']\s*[!=]=[^\n]*objective"""
               r"|[!=]=\s*TASK\b|\bTASK\s*[!=]=")
PLUGIN_SITE = REPO / "tests" / "plugins"  # hsk-tokcls: a kind of a package (test_kind_plugins.py runs it)


def _plugin_run_kinds() -> list[str]:
    """The run kinds the test packages declare (their entry points, read as text: nothing is imported)."""
    import configparser

    names = []
    for entry_points in sorted(PLUGIN_SITE.glob("*.dist-info/entry_points.txt")):
        parser = configparser.ConfigParser(delimiters=("=",))
        parser.read_string(entry_points.read_text())
        names += list(parser["hsk.run_kinds"]) if parser.has_section("hsk.run_kinds") else []
    return names


def _module_path(module: str) -> str:
    return module.replace(".", "/") + ".py"


def _declared_modules(kind: runkinds.RunKind) -> set[str]:
    """The modules a run kind's declaration names: its own, its entry points', its methods'."""
    from pipelines.methods import all_methods

    where = [runkinds._DECLARED[kind.name], *(getattr(kind, part) or "" for part in
                                             ("dump", "prepare", "teacher", "evaluate", "feed"))]
    modules = {value.partition(":")[0] for value in where if value}
    modules |= {method.build.__module__ for method in all_methods() if kind.name in method.kinds}
    # hsk's own modules only: a test may have registered a method of its own in this process (test_methods.py)
    return {_module_path(module) for module in modules if module.startswith("pipelines.")}


def _imports(path: str) -> set[str]:
    """The pipelines modules a module imports (at its top or inside its functions), as paths."""
    import ast

    found = set()
    for node in ast.walk(ast.parse((REPO / path).read_text())):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
        found |= {_module_path(n) for n in names if n.startswith("pipelines.")}
    return {p for p in found if (REPO / p).is_file()}


def _code(path: Path) -> str:
    """A module's text without its comments (what it does, not what it says about it)."""
    import io
    import tokenize

    tokens = tokenize.generate_tokens(io.StringIO(path.read_text()).readline)
    return tokenize.untokenize((t.type, t.string) for t in tokens if t.type != tokenize.COMMENT)


def _naming(pattern: str) -> set[str]:
    import re

    return {str(p.relative_to(REPO)) for p in (REPO / "pipelines").rglob("*.py") if re.search(pattern, _code(p))}


@pytest.mark.parametrize("name", [*runkinds.builtin(), *_plugin_run_kinds()])
def test_each_run_kind_is_named_only_in_its_modules(name):
    """Outside a run kind's modules, pipelines/ looks it up by name and never branches on it; a package's kind
    (tests/plugins) is named nowhere in pipelines/ at all."""
    import re

    if name not in runkinds.builtin():
        assert _naming(rf"""["']{re.escape(name)}["']""") == set()
        return
    declared = _declared_modules(runkinds.get(name))
    reached = set().union(*(_imports(path) for path in declared))
    assert OWN.get(name, set()) <= reached, sorted(OWN.get(name, set()) - reached)  # each imported by the kind
    homes = declared | OWN.get(name, set()) | DECLARATIONS
    naming = _naming(TASK_NAMING if name == "task" else rf"""["']{re.escape(name)}["']""")
    assert naming <= homes, sorted(naming - homes)
