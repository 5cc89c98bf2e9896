"""Teachers and students of every encoder architecture hsk reads, end to end on tiny random configs.

Each architecture is built with `AutoConfig.for_model` and `AutoModelForSequenceClassification.from_config`
(4 layers, d 32) over the tiny WordPiece vocabulary; RoBERTa keeps a byte-level BPE tokenizer and XLM-RoBERTa
a unigram one, so that their `</s></s>` pair separator is what the store sees. docs/guide/teachers.md names
these tests row by row.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import _WORDS, build_tiny_tokenizer, chunk_bytes
from conftest import dump_args as shared_dump_args

from hskstore import open_store
from pipelines.cli import main
from pipelines.dump.scores import MASKED_SCORE, SCORE_READERS

ARCHITECTURES = ["bert", "roberta", "distilbert", "electra", "albert", "xlm-roberta", "deberta-v2", "modernbert"]
_SIZE = dict(hidden_size=32, num_hidden_layers=4, num_attention_heads=4, intermediate_size=64,
             max_position_embeddings=160)
_CONFIGS = {
    "bert": dict(_SIZE, type_vocab_size=2),
    "roberta": dict(_SIZE, type_vocab_size=1),
    "xlm-roberta": dict(_SIZE, type_vocab_size=1),
    "electra": dict(_SIZE, embedding_size=16, type_vocab_size=2),
    "albert": dict(_SIZE, embedding_size=16, type_vocab_size=2),
    "distilbert": dict(dim=32, n_layers=4, n_heads=4, hidden_dim=64, max_position_embeddings=160),
    # DeBERTa-v3's shape: relative attention with c2p and p2c terms, log buckets, shared keys, no absolute positions
    "deberta-v2": dict(_SIZE, type_vocab_size=0, relative_attention=True, pos_att_type=["p2c", "c2p"],
                       position_buckets=16, max_relative_positions=-1, norm_rel_ebd="layer_norm", share_att_key=True,
                       position_biased_input=False),
    # layers 2 and 4 attend within a window of 8 tokens ([CLS] sees positions 0..4 there)
    "modernbert": dict(_SIZE, global_attn_every_n_layers=2, local_attention=8, classifier_pooling="cls"),
}


def save_tokenizer(model_type: str, out: Path) -> Path:
    """The tiny WordPiece tokenizer, or for RoBERTa a byte-level BPE and for XLM-RoBERTa a unigram one."""
    if model_type == "roberta":
        from tokenizers.pre_tokenizers import ByteLevel
        from transformers import RobertaTokenizer

        vocab = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"] + sorted(ByteLevel.alphabet())
        RobertaTokenizer(vocab={t: i for i, t in enumerate(vocab)}, merges=[]).save_pretrained(out)
        return out
    if model_type == "xlm-roberta":
        from transformers import XLMRobertaTokenizer

        pieces = ([(s, 0.0) for s in ("<s>", "<pad>", "</s>", "<unk>")] + [("▁" + w, -1.0) for w in _WORDS.split()]
                  + [(c, -5.0) for c in "▁abcdefghijklmnopqrstuvwxyz0123456789.,!?'\"-():;/&*$%"] + [("<mask>", 0.0)])
        XLMRobertaTokenizer(vocab=pieces).save_pretrained(out)
        return out
    return build_tiny_tokenizer(out)


def tiny_classifier(model_type: str, tokenizer, *, seed: int = 1, num_layers: int = 4, **overrides):
    """A random AutoModelForSequenceClassification of `model_type` over `tokenizer`'s vocabulary, in eval mode."""
    from transformers import AutoConfig, AutoModelForSequenceClassification

    fields = dict(_CONFIGS[model_type], vocab_size=len(tokenizer), num_labels=2, pad_token_id=tokenizer.pad_token_id,
                  **overrides)
    fields["n_layers" if model_type == "distilbert" else "num_hidden_layers"] = num_layers
    if model_type == "modernbert":
        fields.update(cls_token_id=tokenizer.cls_token_id, sep_token_id=tokenizer.sep_token_id,
                      bos_token_id=tokenizer.cls_token_id, eos_token_id=tokenizer.sep_token_id)
    torch.manual_seed(seed)
    return AutoModelForSequenceClassification.from_config(AutoConfig.for_model(model_type, **fields)).eval()


def save_teacher(model_type: str, out: Path, tokenizer_dir: Path | None = None, *, seed: int = 1,
                 num_layers: int = 4) -> Path:
    """Save a tiny random `model_type` classifier with its tokenizer (tokenizer_dir's, else its own kind)."""
    from transformers import AutoTokenizer

    out = Path(out)
    source = tokenizer_dir or save_tokenizer(model_type, out.with_name(out.name + "-tokenizer"))
    tokenizer = AutoTokenizer.from_pretrained(source)
    tiny_classifier(model_type, tokenizer, seed=seed, num_layers=num_layers).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


# --- the [CLS] rows are the scores the model computes ------------------------------------------------------
def eager_scores(model, enc: dict, monkeypatch) -> list[torch.Tensor]:
    """The input of every softmax over keys in an eager forward: each layer's masked scores [B, heads, T, T]."""
    model.config._attn_implementation = "eager"
    captured, softmax = [], torch.nn.functional.softmax

    def spy(x, *args, **kwargs):
        if x.dim() == 4:
            captured.append(x.float())
        return softmax(x, *args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "softmax", spy)
    with torch.no_grad():
        model(**enc)
    monkeypatch.undo()
    return captured


# DeBERTa variants beside the v3 shape: separate position projections, one relative term, no log buckets,
# DeBERTa-v2's absolute positions too.
_DEBERTA_VARIANTS = {
    "separate-c2p": dict(share_att_key=False, pos_att_type=["c2p"]),
    "separate-p2c-unbucketed": dict(share_att_key=False, pos_att_type=["p2c"], position_buckets=-1,
                                    max_relative_positions=24),
    "v2-absolute-positions": dict(position_biased_input=True, position_buckets=-1),
}


@pytest.mark.parametrize("model_type, overrides", [(t, {}) for t in ARCHITECTURES] + [
    ("deberta-v2", _DEBERTA_VARIANTS[v]) for v in _DEBERTA_VARIANTS], ids=ARCHITECTURES + list(_DEBERTA_VARIANTS))
def test_cls_rows_are_the_scores_the_model_computes(model_type, overrides, tmp_path, monkeypatch):
    from transformers import AutoTokenizer

    from pipelines.dump.probe import TeacherProbe

    tokenizer = AutoTokenizer.from_pretrained(save_tokenizer(model_type, tmp_path / "tok"))
    model = tiny_classifier(model_type, tokenizer, **overrides)
    enc = dict(tokenizer(["the film is good and very charming , funny and moving", "a bad movie"],
                         ["not boring", "the best drama ever made"], padding=True, return_tensors="pt"))
    if not getattr(model.config, "type_vocab_size", 0):
        enc.pop("token_type_ids", None)
    probe = TeacherProbe(model, [1, 2, 3, 4])
    rows = probe(enc["input_ids"], enc.get("token_type_ids"), enc["attention_mask"], [4]).cls_scores
    probe.close()
    want = eager_scores(model, enc, monkeypatch)
    assert len(want) == 4
    real = enc["attention_mask"].bool()[:, None, :].expand(-1, 4, -1)
    for layer in range(1, 5):
        got, ref = rows[layer].float(), want[layer - 1][:, :, 0, :].expand(-1, 4, -1)
        hidden = ref < -1e30  # what the model's mask hides ([CLS] outside a local window, padding)
        assert torch.allclose(got[real & ~hidden], ref[real & ~hidden], rtol=1e-5, atol=1e-6)
        assert bool((got[real & hidden] == MASKED_SCORE).all())
        local = model_type == "modernbert" and layer % 2 == 0
        assert bool((real & hidden).any()) == local  # only ModernBERT's local layers hide real tokens


# --- every architecture as a teacher, through the CLI --------------------------------------------------------
dump_args = functools.partial(shared_dump_args, task="mrpc", config="2,8,0.2", student_layers=2, rows=32, max_length=64,
                              shard_rows=16, batch_size=16)


# TinyBERT attention rows are q.k/sqrt(d_head) over every key: what ModernBERT's global layers (1, 3) compute,
# not its local ones, nor DeBERTa's disentangled scores.
_ROWS = {"deberta-v2": None, "modernbert": ["--attention-rows", "--layers", "1,3"]}


def student_of_another_kind(model_type: str) -> str:
    return ARCHITECTURES[(ARCHITECTURES.index(model_type) + 1) % len(ARCHITECTURES)]


@pytest.mark.parametrize("model_type", ARCHITECTURES)
def test_teacher_end_to_end(model_type, tmp_path, glue_dir, capsys):
    """Dump (both selection engines, same bytes), verify, info, derive, train a student of another kind."""
    teacher = save_teacher(model_type, tmp_path / "teacher-mrpc")
    rows = _ROWS.get(model_type, ["--attention-rows"])
    for engine in ("torch", "numpy"):
        assert main(dump_args(teacher, glue_dir, tmp_path / f"{engine}.zarr", *(rows or []),
                              "--selection-engine", engine)) == 0
    assert chunk_bytes(tmp_path / "torch.zarr") == chunk_bytes(tmp_path / "numpy.zarr")
    store_path = tmp_path / "torch.zarr"
    assert main(["verify", str(store_path)]) == 0
    store, reader = open_store(str(store_path)), SCORE_READERS[model_type]
    if reader == "projections":  # the format's default: left unsaid, as in every store before the record
        assert (store.metadata.teacher.model_type, store.metadata.teacher.scores) == (None, None)
        assert "[CLS] attention rows read by projections" in _info(store_path, capsys)
    else:
        assert (store.metadata.teacher.model_type, store.metadata.teacher.scores) == (model_type, reader)
        assert f"[CLS] attention rows of a {model_type} teacher, read by {reader}" in _info(store_path, capsys)
        assert f'scores: "{reader}"' in (store_path / "README.md").read_text()
    _assert_no_separator_kept(store, doubled=model_type in ("roberta", "xlm-roberta"))
    if rows is not None:
        assert any(name.endswith("/attention") for name in store.meta["checksums"])

    derived = tmp_path / "derived.zarr"
    assert main(["derive", str(store_path), "--config", "1,4,0.2", "--out", str(derived)]) == 0
    assert main(["verify", str(derived)]) == 0

    student = save_teacher(student_of_another_kind(model_type), tmp_path / "student", teacher, seed=3, num_layers=2)
    assert _train(store_path, student, tmp_path / "run", glue_dir) == 0


def _info(store: Path, capsys) -> str:
    capsys.readouterr()
    assert main(["info", str(store)]) == 0
    return capsys.readouterr().out


def _train(store: Path, student: Path | str, out: Path, glue_dir: Path) -> int:
    return main(["train", "--store", str(store), "--student", str(student), "--out", str(out), "--data-dir",
                 str(glue_dir), "--max-steps", "1", "--eval-limit", "8", "--no-progress"])


def _assert_no_separator_kept(store, doubled: bool) -> None:
    """att-nosep: no kept position is a separator, RoBERTa's doubled `</s></s>` pair separator included."""
    sep = store.meta["tokenizer"]["sep_id"]
    data = store.read(slice(None))
    ids = data["input_ids"]
    for layer in store.layers:
        positions = data[f"{layer.name}/positions"].astype(np.int64)
        kept = np.take_along_axis(ids, np.maximum(positions, 0), axis=1)[positions >= 0]
        assert kept.size and not (kept == sep).any()
    pairs = (ids[:, 1:] == sep) & (ids[:, :-1] == sep)  # `</s></s>` between the two sentences of every row
    assert pairs.any(axis=1).all() == doubled


# --- every architecture as a student, from a BERT and a ModernBERT store --------------------------------------
@pytest.fixture(scope="module")
def sst2_stores(tmp_path_factory, tiny_tokenizer, glue_dir) -> dict[str, Path]:
    """SST-2 stores of a BERT, a ModernBERT and a DeBERTa-v2 teacher over the tiny WordPiece vocabulary."""
    stores = {}
    for model_type in ("bert", "modernbert", "deberta-v2"):
        root = tmp_path_factory.mktemp(model_type)
        teacher = save_teacher(model_type, root / "teacher-sst2", tiny_tokenizer)
        stores[model_type] = root / "sst2.zarr"
        args = dump_args(teacher, glue_dir, stores[model_type])
        args[args.index("mrpc")] = "sst2"
        assert main(args) == 0
    return stores


@pytest.mark.parametrize("store_of", ["bert", "modernbert"])
@pytest.mark.parametrize("model_type", ARCHITECTURES)
def test_every_architecture_trains_as_a_student(model_type, store_of, sst2_stores, tiny_tokenizer, tmp_path, glue_dir):
    student = save_teacher(model_type, tmp_path / "student", tiny_tokenizer, seed=3, num_layers=2)
    assert _train(sst2_stores[store_of], student, tmp_path / "run", glue_dir) == 0
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["student"]["num_layers"] == 2


@pytest.mark.parametrize("store_of", ["modernbert", "deberta-v2"])
def test_bert2_takes_the_first_layers_of_any_teacher(store_of, sst2_stores, tmp_path, glue_dir):
    """bert<k>: the teacher's own first k layers (a ModernBERT keeps its first k layer types)."""
    assert _train(sst2_stores[store_of], "bert2", tmp_path / "run", glue_dir) == 0
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(tmp_path / "run" / "best")
    assert (config.model_type, config.num_hidden_layers) == (store_of, 2)


def test_an_architecture_hsk_cannot_read_is_refused_in_one_line(tiny_tokenizer, tmp_path, glue_dir, capsys):
    from transformers import AutoConfig, AutoModelForSequenceClassification, AutoTokenizer

    config = AutoConfig.for_model("mpnet", vocab_size=len(AutoTokenizer.from_pretrained(tiny_tokenizer)),
                                  **{k: _SIZE[k] for k in ("hidden_size", "num_attention_heads", "intermediate_size")},
                                  num_hidden_layers=2, num_labels=2)
    teacher = tmp_path / "teacher-sst2"
    AutoModelForSequenceClassification.from_config(config).save_pretrained(teacher)
    AutoTokenizer.from_pretrained(tiny_tokenizer).save_pretrained(teacher)
    args = dump_args(teacher, glue_dir, tmp_path / "s.zarr")
    args[args.index("mrpc")] = "sst2"
    capsys.readouterr()
    assert main(args) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("hsk: error: hsk cannot read the attention scores of a mpnet teacher")
    assert all(name in err[0] for name in ARCHITECTURES)
    assert not (tmp_path / "s.zarr").exists()


@pytest.mark.parametrize("model_type, says", [
    ("deberta-v2", "a deberta-v2 teacher adds relative-position terms"),
    ("modernbert", "teacher layers [2] attend within a local window"),  # layers 2 and 4 are local
])
def test_attention_rows_where_undefined_are_refused(model_type, says, tiny_tokenizer, tmp_path, glue_dir, capsys):
    teacher = save_teacher(model_type, tmp_path / "teacher-mrpc", tiny_tokenizer)
    capsys.readouterr()
    assert main(dump_args(teacher, glue_dir, tmp_path / "s.zarr", "--attention-rows")) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("hsk: error: --attention-rows") and says in err[0]
    assert not (tmp_path / "s.zarr").exists()
