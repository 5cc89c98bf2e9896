"""Seq2seq stores (`hsk dump --objective seq2seq`): tiny random T5 and BART teachers and a decoder-only Llama,
through the real CLI: the stored supports against the teacher's own log-softmax, the stored output against
its own greedy decoding, resume after an interrupted dump, derive, training a 2-layer student, the refusals,
and `hsk eval --pairs-file`."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import (
    build_bpe_tokenizer,
    chunk_bytes,
    corpus_lines,
    kill_dump_midway,
    recorded_starts,
    resume_offset,
    save_tiny_seq2seq,
    seq2seq_pairs_file,
    tree_hashes,
)

from hskstore import open_store
from hskstore.format.seq2seq import Decoding, Seq2seqSelection
from pipelines.cli import main
from pipelines.core.pair_models import decoder_only_inputs

PROMPT = "Paraphrase: {source}\\nAnswer:"


def _dump(teacher: Path, pairs: Path, out: Path, *extra: str) -> int:
    return main(["dump", "--objective", "seq2seq", "--teacher", str(teacher), "--data-file", str(pairs),
                 "--max-length", "40", "--max-target", "16", "--shard-rows", "8", "--batch-size", "4",
                 "--no-progress", "--device", "cpu", "--out", str(out), *extra])


@pytest.fixture(scope="module")
def teachers(s2s_teachers):
    return s2s_teachers


@pytest.fixture(scope="module")
def pairs(s2s_pairs):
    return s2s_pairs


@pytest.fixture(scope="module")
def stores(tmp_path_factory, teachers, pairs):
    """Per teacher: its greedy output with top-8 on it; T5 also top-8 on the reference and RS-KD draws."""
    tmp = tmp_path_factory.mktemp("s2s_stores")
    made = {}
    for arch, teacher in teachers.items():
        extra = ("--prompt", PROMPT) if arch == "llama" else ()
        made[arch] = tmp / f"{arch}.zarr"
        assert _dump(teacher, pairs, made[arch], "--support", "topk:8", "--decode", "greedy", *extra) == 0
    made["t5-ref"] = tmp / "t5-ref.zarr"
    assert _dump(teachers["t5"], pairs, made["t5-ref"], "--support", "topk:8") == 0
    made["t5-sample"] = tmp / "t5-sample.zarr"
    assert _dump(teachers["t5"], pairs, made["t5-sample"], "--support", "sample:16", "--supports-on", "reference") == 0
    return made


def _model(teacher: Path):
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForSeq2SeqLM

    auto = AutoModelForSeq2SeqLM if AutoConfig.from_pretrained(teacher).is_encoder_decoder else AutoModelForCausalLM
    return auto.from_pretrained(teacher, dtype=torch.float32).eval()


def _teacher_logprobs(teacher: Path, row: dict, i: int, on: str) -> torch.Tensor:
    """The teacher's log-softmax over target `on` of pair i, computed here with plain transformers."""
    model = _model(teacher)
    src = torch.as_tensor(row["source_ids"][i, : row["source_length"][i]].astype(np.int64))[None]
    tgt = torch.as_tensor(row[f"{on}_ids"][i, : row[f"{on}_length"][i]].astype(np.int64))[None]
    with torch.no_grad():
        if model.config.is_encoder_decoder:
            start = torch.tensor([[model.config.decoder_start_token_id]])
            logits = model(input_ids=src, decoder_input_ids=torch.cat([start, tgt[:, :-1]], 1)).logits[0]
        else:
            logits = model(input_ids=torch.cat([src, tgt], 1)).logits[0, src.shape[1] - 1: -1]
    return torch.log_softmax(logits.float(), -1)


# --- the format ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("text", ["beam", "beam:1", "beam:65", "sample", "greedy:2", "top"])
def test_a_bad_decoding_is_one_line_naming_it(text):
    from hskstore.format.config import ConfigError

    with pytest.raises(ConfigError, match="--decode"):
        Decoding.parse(text, 16)


def test_prompt_tokens_carry_no_loss_in_a_decoder_only_pair():
    """Position t of the target is predicted at the prompt's last token + t; nothing of the prompt is a target."""
    sel = Seq2seqSelection.make(None, Decoding("greedy", 1, 4), architecture="decoder-only", vocab_size=50,
                                max_source=5, max_target=4, eos_id=1, pad_id=0, decoder_start_id=None,
                                prompt="{source}")
    source = np.array([[7, 8, 9, 0, 0], [7, 0, 0, 0, 0]])
    target = np.array([[20, 21, 1, 0], [30, 1, 0, 0]])
    inputs = decoder_only_inputs(source, np.array([3, 1]), target, np.array([3, 2]), sel, "cpu")
    assert inputs.kwargs["input_ids"].tolist() == [[7, 8, 9, 20, 21, 1], [7, 30, 1, 0, 0, 0]]
    assert inputs.kwargs["attention_mask"].tolist() == [[1] * 6, [1, 1, 1, 0, 0, 0]]
    seq = inputs.kwargs["input_ids"]
    for row, length in ((0, 3), (1, 2)):
        index = inputs.index[row, :length]
        assert (seq[row, index + 1] == torch.as_tensor(target[row, :length])).all()  # the next token is the target's


# --- the dump --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("arch", ["t5", "bart", "llama"])
def test_the_stored_output_is_the_teachers_greedy_decoding_and_its_top1(stores, teachers, arch):
    """Under teacher forcing on its own greedy output, the teacher's argmax at each position is the token it
    emitted: the stored top-1 ids equal the stored output, and the stored log-probs are its log-softmax."""
    store = open_store(str(stores[arch]))
    row = store.read_shard(0)
    targets = store.targets(row)
    real = np.arange(16)[None, :] < row["teacher_length"][:, None]
    assert real.sum() > 20
    assert np.array_equal(targets.ids[..., 0][real], row["teacher_ids"][real])
    assert np.array_equal(targets.kept, real)
    expected = _teacher_logprobs(teachers[arch], row, 1, "teacher")
    n = int(row["teacher_length"][1])
    stored = np.log(targets.probs[1, :n]).astype(np.float32)
    teacher = expected.gather(-1, torch.as_tensor(targets.ids[1, :n]))
    assert np.allclose(stored, teacher.numpy(), atol=2e-3)


def test_supports_on_the_reference_are_the_teachers_log_softmax(stores, teachers):
    store = open_store(str(stores["t5-ref"]))
    row = store.read_shard(1)
    assert "teacher_ids" not in row and store.s2s.supports_on == "reference"
    targets = store.targets(row)
    short = row["reference_length"] < store.s2s.max_target
    assert short.any() and (row["reference_ids"][short, row["reference_length"][short] - 1] == store.s2s.eos_id).all()
    for i in range(3):  # every target ends with EOS, unless cut at max_target
        n = int(row["reference_length"][i])
        expected = _teacher_logprobs(teachers["t5"], row, i, "reference")
        assert np.array_equal(targets.ids[i, :n], expected.topk(8, -1).indices.numpy())
        assert np.allclose(np.log(targets.probs[i, :n]), expected.topk(8, -1).values.numpy(), atol=2e-3)


def test_sampled_counts_add_up_to_the_draws(stores):
    store = open_store(str(stores["t5-sample"]))
    targets = store.targets(store.read_shard(0))
    sums = (targets.probs * targets.used).sum(-1)
    assert np.allclose(sums[targets.kept], 1.0) and (sums[~targets.kept] == 0).all()


def test_derive_a_smaller_support_keeps_the_pairs_and_the_output(stores, tmp_path):
    out = tmp_path / "top2.zarr"
    assert main(["derive", str(stores["bart"]), "--support", "topk:2", "--out", str(out)]) == 0
    assert main(["verify", str(out)]) == 0
    src, new = open_store(str(stores["bart"])), open_store(str(out))
    a, b = src.read_shard(0), new.read_shard(0)
    assert np.array_equal(a["teacher_ids"], b["teacher_ids"]) and np.array_equal(a["source_ids"], b["source_ids"])
    assert np.array_equal(src.targets(a).ids[..., :2], new.targets(b).ids)
    assert new.storage_report()["word_bytes_per_pair"] < src.storage_report()["word_bytes_per_pair"]


def test_info_json_counts_word_and_sequence_bytes(stores, capsys):
    assert main(["info", str(stores["llama"]), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    flat = json.dumps(report)
    assert "word_bytes_per_pair" in flat and "sequence_bytes_per_pair" in flat
    assert main(["info", str(stores["llama"])]) == 0
    text = capsys.readouterr().out
    assert "decoder-only" in text and "Paraphrase" in text and "B/pair" in text


@pytest.mark.parametrize("extra, says", [
    (("--decode", "beam:1"), "--decode"),
    (("--support", "none"), "at least one"),
    (("--support", "topk:4", "--supports-on", "teacher"), "--supports-on teacher"),
    (("--decode", "greedy", "--prompt", "no placeholder"), "{source}"),
])
def test_bad_seq2seq_dumps_are_one_line_and_write_nothing(teachers, pairs, tmp_path, capsys, extra, says):
    before = pairs.read_bytes()
    assert _dump(teachers["t5"], pairs, tmp_path / "bad.zarr", *extra) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and says in err[0], err
    assert not (tmp_path / "bad.zarr").exists() and pairs.read_bytes() == before


def test_a_pair_with_an_empty_target_is_refused_by_its_row(teachers, tmp_path, capsys):
    bad = tmp_path / "bad.tsv"
    bad.write_text("source\ttarget\nfine .\talso fine .\nno target here .\t \n", encoding="utf-8")
    assert _dump(teachers["t5"], bad, tmp_path / "out.zarr", "--decode", "greedy") == 2
    err = capsys.readouterr().err.strip()
    assert "row 1" in err and "empty target" in err and not (tmp_path / "out.zarr").exists()


# --- training and evaluation -----------------------------------------------------------------------------------


@pytest.mark.parametrize("arch", ["t5", "bart", "llama"])
def test_a_two_layer_student_trains_from_the_store(stores, tmp_path, arch):
    out = tmp_path / "run"
    assert main(["train", "--store", str(stores[arch]), "--method", "s2s-kd", "--student", "first2", "--max-steps",
                 "4", "--batch-size", "4", "--set", "lr=3e-3", "--device", "cpu", "--no-progress", "--out",
                 str(out)]) == 0
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    losses = [r for r in records if "loss/kd" in r or "kd" in json.dumps(r)]
    assert losses, records[:2]
    student = _model(out / "best")
    depth = (student.config.num_decoder_layers if arch == "t5" else student.config.decoder_layers
             if arch == "bart" else student.config.num_hidden_layers)
    assert depth == 2


@pytest.mark.parametrize("arch, batch_size", [("t5", 1), ("llama", 1), ("llama", 5), ("t5", 24)])
def test_s2s_kd_trains_at_every_batch_size(stores, tmp_path, arch, batch_size):
    """One epoch at batch size 1 (every pair alone, the shortest too), 5 (a remainder of 4) and the whole store."""
    out = tmp_path / "run"
    assert main(["train", "--store", str(stores[arch]), "--method", "s2s-kd", "--student", "first2", "--batch-size",
                 str(batch_size), "--epochs", "1", "--device", "cpu", "--no-progress", "--out", str(out)]) == 0
    assert json.loads((out / "summary.json").read_text())["steps"] == -(-24 // batch_size)


def test_kd_lowers_the_students_kl_to_the_teacher(stores, tmp_path):
    """Word-level KD on the reference (lam 1) brings the student's distribution closer to the stored one than
    the reference alone does, from the same start, steps and seed."""
    from pipelines.core.pair_models import pair_model

    store = open_store(str(stores["t5-ref"]))
    row = store.read_shard(0)
    targets = store.targets(row)

    def kl_after(lam: str) -> float:
        out = tmp_path / f"run-{lam}"
        assert main(["train", "--store", str(stores["t5-ref"]), "--method", "s2s-kd", "--student", "first2",
                     "--set", f"lam={lam}", "--set", "lr=5e-3", "--max-steps", "12", "--batch-size", "8", "--device",
                     "cpu", "--no-progress", "--out", str(out)]) == 0
        student = _model(out / "best")
        inputs = pair_model("encoder-decoder").inputs(row["source_ids"], row["source_length"], row["reference_ids"],
                                                      row["reference_length"], store.s2s, "cpu")
        with torch.no_grad():
            q = torch.log_softmax(inputs.target_logits(student(**inputs.kwargs).logits), -1)
        p = torch.as_tensor(targets.probs)
        q_at = q.gather(-1, torch.as_tensor(targets.ids))
        kept = torch.as_tensor(targets.kept)
        return float((p * (torch.log(p.clamp(min=1e-30)) - q_at)).sum(-1)[kept].mean())

    assert kl_after("1") < kl_after("0")


def test_a_student_with_another_vocabulary_is_refused_in_one_line(stores, tmp_path, capsys):
    other_tok = build_bpe_tokenizer(tmp_path / "tok", corpus_lines(500), vocab_size=280)
    other = save_tiny_seq2seq(tmp_path / "other", other_tok, "t5")
    assert main(["train", "--store", str(stores["t5"]), "--student", str(other), "--method", "s2s-kd",
                 "--max-steps", "2", "--device", "cpu", "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "280 tokens" in err[0] and "300 tokens" in err[0], err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("sets, says", [
    (("--set", "on=teacher"), "--decode"),
    (("--set", "lam=0.5", "--set", "on=teacher"), "--decode"),
])
def test_training_on_what_the_store_lacks_is_refused(stores, tmp_path, capsys, sets, says):
    assert main(["train", "--store", str(stores["t5-ref"]), "--student", "first2", "--method", "s2s-kd", *sets,
                 "--max-steps", "2", "--device", "cpu", "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and says in err[0], err


def test_eval_scores_the_teacher_against_its_own_outputs_at_100(stores, teachers, tmp_path, capsys):
    """sacrebleu's BLEU and chrF of the teacher against references that are its own greedy outputs: 100."""
    from transformers import AutoTokenizer

    store = open_store(str(stores["llama"]))
    rows = store.read(slice(0, len(store)))
    tokenizer = AutoTokenizer.from_pretrained(teachers["llama"])
    sources = seq2seq_pairs_file(tmp_path).read_text(encoding="utf-8").splitlines()[1:]
    outputs = [tokenizer.decode(ids[:n], skip_special_tokens=True).strip()
               for ids, n in zip(rows["teacher_ids"], rows["teacher_length"])]
    kept = [(line.split("\t")[0], out) for line, out in zip(sources, outputs) if out and "\t" not in out]
    assert len(kept) >= 8
    own = tmp_path / "own.tsv"
    own.write_text("source\ttarget\n" + "".join(f"{a}\t{b}\n" for a, b in kept), encoding="utf-8")
    assert main(["eval", str(teachers["llama"]), "--pairs-file", str(own), "--prompt", PROMPT, "--max-length", "40",
                 "--max-target", "16", "--device", "cpu", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["pairs"] == len(kept)
    assert result["bleu"] == pytest.approx(100.0) and result["chrf"] == pytest.approx(100.0)
    assert result["perplexity"] > 1.0


def test_pack_export_and_croissant_go_through_the_kind(stores, tmp_path):
    """What every store has: a bundle that unpacks to a verified store, a Parquet export of every array, and
    croissant.json describing each of them."""
    import pyarrow.parquet as pq

    store = stores["t5"]
    assert main(["pack", str(store), str(tmp_path / "t5.hsk.zip")]) == 0
    assert main(["unpack", str(tmp_path / "t5.hsk.zip"), str(tmp_path / "back.zarr")]) == 0
    assert main(["verify", str(tmp_path / "back.zarr")]) == 0
    assert main(["export", str(store), str(tmp_path / "t5.parquet")]) == 0
    table = pq.read_table(tmp_path / "t5.parquet")
    names = set(open_store(str(store)).specs)
    assert table.num_rows == 24 and {name.replace("/", "_") for name in names} == set(table.schema.names)
    croissant = json.loads((store / "croissant.json").read_text())
    fields = {f["name"] for record in croissant["recordSet"] for f in record["field"]}
    assert {"source_ids", "reference_ids", "teacher_ids", "s2s_ids", "s2s_values"} <= fields


def test_a_glue_pair_task_gives_its_two_sentences(teachers, glue_dir, tmp_path):
    """--task mrpc: sentence 1 is the source, sentence 2 the target (the dataset's rows, in order)."""
    from transformers import AutoTokenizer

    out = tmp_path / "mrpc.zarr"
    assert main(["dump", "--objective", "seq2seq", "--teacher", str(teachers["t5"]), "--task", "mrpc", "--data-dir",
                 str(glue_dir), "--limit", "6", "--max-length", "200", "--max-target", "200", "--support", "topk:2",
                 "--no-progress", "--device", "cpu", "--out", str(out)]) == 0
    rows = open_store(str(out)).read(slice(0, 6))
    tokenizer = AutoTokenizer.from_pretrained(teachers["t5"])
    first = (glue_dir / "MRPC" / "train.tsv").read_text(encoding="utf-8-sig").splitlines()[1].split("\t")
    source = tokenizer.decode(rows["source_ids"][0, : rows["source_length"][0]], skip_special_tokens=True)
    target = tokenizer.decode(rows["reference_ids"][0, : rows["reference_length"][0]], skip_special_tokens=True)
    assert (source.strip(), target.strip()) == (first[3].strip(), first[4].strip())


# --- streamed pairs --------------------------------------------------------------------------------------------


def _tables(pairs: Path, folder: Path) -> dict[str, Path]:
    """The TSV's pairs as JSON lines (another key first, the columns named) and as Parquet (row groups of 5)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [line.split("\t") for line in pairs.read_text(encoding="utf-8").splitlines()[1:]]
    jsonl = folder / "pairs.jsonl"
    jsonl.write_text("".join(json.dumps({"id": i, "src": s, "tgt": t}) + "\n" for i, (s, t) in enumerate(rows)),
                     encoding="utf-8")
    parquet = folder / "pairs.parquet"
    pq.write_table(pa.table({"id": list(range(len(rows))), "src": [r[0] for r in rows], "tgt": [r[1] for r in rows]}),
                   parquet, row_group_size=5)
    return {"jsonl": jsonl, "parquet": parquet}


def test_json_lines_and_parquet_stream_the_bytes_of_the_tsv(stores, teachers, pairs, tmp_path):
    tables = _tables(pairs, tmp_path)
    reference = open_store(str(stores["t5-ref"]))
    for kind, path in tables.items():
        out = tmp_path / f"{kind}.zarr"
        assert _dump(teachers["t5"], path, out, "--support", "topk:8", "--text-columns", "src,tgt") == 0
        assert chunk_bytes(out) == chunk_bytes(stores["t5-ref"]), kind
        meta = open_store(str(out)).meta
        assert meta["dataset"]["fingerprint"] == reference.meta["dataset"]["fingerprint"]  # the same pairs, in order
        assert meta["dataset"]["n_rows"] == 24 and meta["layout"]["n_rows"] == 24
    assert main(["verify", str(tmp_path / "parquet.zarr")]) == 0


def test_limit_stops_the_read(teachers, pairs, tmp_path, monkeypatch):
    from pipelines.dump import corpus as corpus_module

    path = _tables(pairs, tmp_path)["jsonl"]
    read = []
    lines = corpus_module._lines

    def counted(source, index, start):
        for line in lines(source, index, start):
            read.append(line)
            yield line

    monkeypatch.setattr(corpus_module, "_lines", counted)
    assert _dump(teachers["t5"], path, tmp_path / "l.zarr", "--support", "topk:4", "--text-columns", "src,tgt",
                 "--limit", "10") == 0
    assert open_store(str(tmp_path / "l.zarr")).meta["layout"]["n_rows"] == 10
    assert len(read) == 10  # the 10 pairs (the columns are named: no line read to find them), nothing after


@pytest.mark.slow
def test_kill_9_mid_corpus_resumes_from_the_cursor_without_rereading(teachers, pairs, tmp_path, monkeypatch):
    from pipelines.dump import corpus as corpus_module

    path = _tables(pairs, tmp_path)["jsonl"]
    args = ["dump", "--objective", "seq2seq", "--teacher", str(teachers["t5"]), "--data-file", str(path),
            "--text-columns", "src,tgt", "--max-length", "40", "--max-target", "16", "--shard-rows", "2",
            "--batch-size", "2", "--no-progress", "--device", "cpu", "--support", "topk:8", "--decode", "greedy"]
    assert main(args + ["--out", str(tmp_path / "ref.zarr")]) == 0
    kill_dump_midway(args, tmp_path / "k.zarr", shards=3)
    assert main(["verify", str(tmp_path / "k.zarr")]) == 1  # a partial store is not taken for a whole one
    resume_at = resume_offset(tmp_path / "k.zarr")  # the byte offset of the first pending shard's first pair
    assert resume_at > 0
    seeks = recorded_starts(monkeypatch, corpus_module, "_lines", lambda source, index, start: start.offset)
    assert main(args + ["--out", str(tmp_path / "k.zarr")]) == 0
    assert seeks == [resume_at]  # one read, from the recorded cursor: nothing before it read again
    assert chunk_bytes(tmp_path / "k.zarr") == chunk_bytes(tmp_path / "ref.zarr")
    resumed, whole = (open_store(str(p)).meta for p in (tmp_path / "k.zarr", tmp_path / "ref.zarr"))
    assert resumed["dataset"] == whole["dataset"]  # the fingerprint's chain taken up where the kill left it
    assert main(["verify", str(tmp_path / "k.zarr")]) == 0


def test_unreadable_pairs_are_one_line_and_touch_nothing(teachers, pairs, tmp_path, capsys):
    tables = _tables(pairs, tmp_path)
    (tmp_path / "gap.jsonl").write_text('{"src": "a b", "tgt": "c"}\n{"src": "d"}\n', encoding="utf-8")
    cases = [((tables["jsonl"], "--text-columns", "src"), "two columns"),
             ((tables["parquet"], "--text-columns", "src,nope"), "has no column 'nope'"),
             ((tmp_path / "gap.jsonl", "--text-columns", "src,tgt"), "the line at byte 27 has an empty target"),
             ((tmp_path / "none.jsonl",), "no such file")]
    before = tree_hashes(tmp_path)
    for (data, *extra), says in cases:
        assert _dump(teachers["t5"], data, tmp_path / "bad.zarr", *extra) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("hsk: error:") and says in err[0], (says, err)
        assert tree_hashes(tmp_path) == before
