"""The registry (pipelines/registry.py): torch-free, below methods and train; every name a Stage or Term holds
is declared there, checked when the Stage or Term is built, and implemented by pipelines.train under that name."""

from __future__ import annotations

import ast
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import save_tiny_teacher

from hskstore.format.config import HSKConfig
from pipelines import registry
from pipelines.dump.stage import DumpOptions, dump
from pipelines.registry import Method, MethodError, Stage, Term, register
from pipelines.train.data import sources
from pipelines.train.losses import attention, pairs
from pipelines.train.losses import terms as losses
from pipelines.train.run.loop import schedule_factor
from pipelines.train.students import heads
from pipelines.train.students.adapter import ADAPTERS

ROOT = Path(__file__).resolve().parents[1]


def test_registry_and_methods_import_without_torch():
    code = (
        "import sys\n"
        "sys.modules['torch'] = None\n"  # any `import torch` below raises ImportError
        "sys.modules['transformers'] = None\n"
        "import pipelines.registry, pipelines.methods\n"
        "print(','.join(m.name for m in pipelines.methods.all_methods()))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr
    assert set(out.stdout.strip().split(",")) >= {"mud", "kd", "pkd-skip", "pkd-last", "finetune", "pea",
                                                  "lightpaff", "lightpaff-pretrain", "tinybert-att"}


def _imported(path: Path) -> set[str]:
    """Every absolute module name a file imports, at module level or inside functions."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
    return names


def _package(module: str) -> str:
    """pipelines.<sub> for pipelines' modules (pipelines.registry is a package of its own), else the top name."""
    parts = module.split(".")
    return ".".join(parts[:2]) if parts[0] == "pipelines" and len(parts) > 1 else parts[0]


def test_methods_see_only_the_registry_and_no_package_imports_one_that_imports_it_back():
    torch_free = [ROOT / "pipelines" / "registry.py", *(ROOT / "pipelines" / "methods").glob("*.py")]
    allowed = ("pipelines.registry", "pipelines.methods", "pipelines.core.tasks", "hskstore")
    for path in torch_free:
        ours = {m for m in _imported(path) if m.split(".")[0] in ("pipelines", "hskstore", "torch", "transformers")}
        assert all(m.startswith(allowed) for m in ours), (path.name, sorted(ours))
    graph: dict[str, set[str]] = {}
    for path in [*(ROOT / "pipelines").rglob("*.py"), *(ROOT / "hskstore").rglob("*.py")]:
        here = _package(".".join(path.relative_to(ROOT).with_suffix("").parts))
        graph.setdefault(here, set()).update(
            _package(m) for m in _imported(path) if m.split(".")[0] in ("pipelines", "hskstore"))
    for package, targets in graph.items():
        for target in targets - {package}:
            assert package not in _reachable(graph, target), f"package cycle: {package} -> {target} -> ... -> {package}"


def _reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for nxt in graph.get(todo.pop(), set()) - seen:
            seen.add(nxt)
            todo.append(nxt)
    return seen


def test_every_declared_name_is_implemented_by_train_and_nothing_else_is():
    assert set(losses.LOSS_TERMS) == set(registry.LOSS_TERMS)
    # every head has the student's forward for it; "task" is the student's own classifier, the others swapped in
    # on it are sized in HEAD_SIZES
    assert set(ADAPTERS) == set(registry.HEADS)
    assert set(heads.HEAD_SIZES) | {"task"} == {h for h, fn in ADAPTERS.items() if fn.__name__ == "classifier_outputs"}
    assert set(pairs.RULES) == set(registry.PAIR_RULES)
    assert set(attention.HEAD_MAPS) == set(registry.HEAD_MAPS)
    # "mlm": the masked-LM arrays, read by lightpaff-pretrain's run (pipelines/train/kinds/lightpaff_pretrain.py);
    # "clm": a causal-LM store's, read by clm-kd's (pipelines/train/kinds/clm.py); "seq2seq": a seq2seq store's,
    # read by s2s-kd's (pipelines/train/kinds/seq2seq.py)
    assert set(sources.STORE_READS) | {"mlm", "clm", "clm-text", "seq2seq"} == set(registry.STORE_READS)
    factors = {name: schedule_factor(name, 100, 0.1) for name in registry.SCHEDULES}
    assert [round(f(5), 3) for f in factors.values()] == [1.0, 0.95, 0.5]  # constant, linear, warmup-linear
    for vocabulary in (registry.LOSS_TERMS, registry.HEADS, registry.STORE_READS, registry.PAIR_RULES,
                       registry.OUTPUTS, registry.TRAINS, registry.SCHEDULES, registry.HEAD_MAPS):
        assert all(d.strip() and "\n" not in d for d in vocabulary.values())  # each name says what it is


def _stage(**kw) -> Stage:
    base = dict(name="kd", epochs=1.0, lr=1e-4, terms=(Term("kl", "kl"),))
    return Stage(**{**base, **kw})


@pytest.mark.parametrize(("field", "value", "message"), [
    ("reads", ("logit",), "unknown store read 'logit'; known: logits, labels, layers, attention, mlm"),
    ("head", "ptp5", "unknown head 'ptp5'; known: task, ptp4, mlm"),
    ("pairs", "pkd-skp", "unknown pairing rule 'pkd-skp'; known: store, pkd-skip, pkd-last"),
    ("outputs", ("logits", "hidden"), "unknown output 'hidden'; known: logits, hidden_states"),
    ("trains", ("student", "proj"), "unknown trains 'proj'; known: student, projection"),
    ("schedule", "cosine", "unknown schedule 'cosine'; known: constant, linear, warmup-linear"),
    ("pair_loss", "hsk_mse+att_mse", "unknown pair loss term 'att_mse'; known: ce, kl"),
])
def test_a_misspelt_name_is_refused_when_the_stage_is_built(field, value, message):
    with pytest.raises(MethodError) as exc:
        _stage(**{field: value})
    assert message in str(exc.value) and str(exc.value).startswith("stage kd: ") and "\n" not in str(exc.value)


def test_a_misspelt_loss_term_is_refused_when_the_term_is_built_and_train_refuses_undeclared_terms():
    with pytest.raises(MethodError, match=r"^term kl: unknown loss term 'kll'; known: ce, kl, soft_ce, "):
        Term("kl", "kll")
    with pytest.raises(ValueError, match="declare_loss_term"):
        losses.loss_term("never_declared")(lambda x: x)
    with pytest.raises(ValueError, match="already declared"):
        registry.declare_loss_term("kl", "something else")
    assert registry.declare_loss_term("kl", registry.LOSS_TERMS["kl"]) == "kl"  # the same declaration again


def test_a_package_declares_its_kinds_store_read_before_a_stage_reads_it(monkeypatch):
    """What a package's kind streams is a store read it declares (pipelines.registry.declare_store_read): refused by
    a stage before, accepted after; hsk's own reads and a name declared otherwise cannot be redeclared."""
    monkeypatch.setattr(registry, "STORE_READS", dict(registry.STORE_READS))  # this process's vocabulary unchanged
    with pytest.raises(MethodError, match="unknown store read 'my-kind'"):
        _stage(reads=("my-kind",))
    assert registry.declare_store_read("my-kind", "my kind's inputs and targets") == "my-kind"
    assert registry.declare_store_read("my-kind", "my kind's inputs and targets") == "my-kind"  # the same again
    assert _stage(reads=("my-kind",)).reads == ("my-kind",)
    with pytest.raises(ValueError, match="store read 'my-kind' is already declared as: my kind's inputs"):
        registry.declare_store_read("my-kind", "something else")
    with pytest.raises(ValueError, match="store read 'clm' is already declared as: a causal-LM store's"):
        registry.declare_store_read("clm", "mine")


@dataclass
class _TypoOptions:
    epochs: float = 1.0


def _typo_build(options: _TypoOptions, ctx) -> list[Stage]:
    return [Stage(name="kd", epochs=options.epochs, lr=1e-4, terms=(Term("ce", "ce"), Term("kl", "kll")),
                  reads=("logits",))]


def test_hsk_train_with_a_misspelt_loss_term_stops_before_any_model_loads(tiny_tokenizer, glue_dir, tmp_path,
                                                                          capsys):
    from pipelines.cli import main

    teacher = save_tiny_teacher(tmp_path / "teacher", tiny_tokenizer, num_layers=2, seed=1)
    store = str(tmp_path / "s.zarr")
    dump("sst2", DumpOptions(config=HSKConfig.parse("0,0,0"), shard_rows=16, batch_size=16, progress=False),
         teacher=str(teacher), out=store, data_dir=str(glue_dir), limit=16, log=lambda *_: None)
    register(Method(name="test-typo", summary="test: a misspelt loss term", store_needs="logits", paper="-",
                    options=_TypoOptions, build=_typo_build))
    out = tmp_path / "run"
    capsys.readouterr()  # the dump's own output
    try:
        code = main(["train", "--store", store, "--student", "bert2", "--method", "test-typo", "--out", str(out),
                     "--no-eval", "--no-progress"])
    finally:
        registry._REGISTRY.pop("test-typo", None)
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and err.startswith("hsk: error:"), err
    assert "unknown loss term 'kll'; known: ce, kl, soft_ce" in err and "Traceback" not in err
    assert not out.exists()
