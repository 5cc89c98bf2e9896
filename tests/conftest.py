"""Shared test fixtures: the real GLUE files from ../shared, a tiny tokenizer, tiny BERT models.

Heavy imports (transformers) happen inside the helpers, so tests that do not use them stay fast.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

# The repo sits next to shared/: <root>/main (this repo) and <root>/shared/data/glue.
GLUE_DIR = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "glue"
REPO = Path(__file__).resolve().parents[1]
HSK = [sys.executable, "-c", "from pipelines.cli import run; run()"]  # the `hsk` command of this checkout

SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
# Frequent lowercase words of SST-2 reviews, plus characters and suffix pieces, so that WordPiece
# can spell any lowercase ASCII word and a tiny model has real tokens to learn from.
_WORDS = """
the a an and of to is in it that this as with for but film movie one its all be his her he she they
has have are was by on not you from at more about like than so if or just there what who story good
best bad great funny love life characters character work well even much comedy too no out can time
into up little some most make way does very never performances performance drama both director new
any real ever being enough made only own may nothing n't 's fun dull boring beautiful worst charming
heart interesting long script screen audience minutes plot moving entertaining feel
"""
_PUNCT = list(".,!?'\"-():;/&*$%")
TINY_VOCAB: list[str] = list(
    dict.fromkeys(
        SPECIAL_TOKENS
        + _WORDS.split()
        + _PUNCT
        + list("abcdefghijklmnopqrstuvwxyz0123456789")
        + [f"##{c}" for c in "abcdefghijklmnopqrstuvwxyz0123456789"]
        + ["##s", "##ed", "##ing", "##ly", "##er", "##es", "##y"]
    )
)


_THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


def pytest_configure(config: pytest.Config) -> None:
    """Under pytest-xdist (`pytest -n 2`, the README's test command), one torch thread per worker: two workers of
    two threads each on CI's two cores would wait on each other. The variables reach the `hsk` processes the
    tests start too, so an in-process dump and a subprocess one still run on the same thread count."""
    if not hasattr(config, "workerinput"):  # the controller, or a run without xdist: torch's defaults
        return
    for name in _THREAD_VARIABLES:
        os.environ.setdefault(name, "1")
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))


@pytest.fixture(scope="session")
def glue_dir() -> Path:
    """The original glue_data files shipped in ../shared/data/glue (skips the test if absent)."""
    if not GLUE_DIR.is_dir():
        pytest.skip(f"GLUE data not found at {GLUE_DIR}")
    return GLUE_DIR


def build_tiny_tokenizer(
    out_dir: str | Path, words: list[str] | None = None, *, extra: list[str] | None = None
) -> Path:
    """Save a lowercasing WordPiece BertTokenizer over `words` (default TINY_VOCAB) + `extra` to out_dir."""
    from transformers import BertTokenizer

    vocab = list(dict.fromkeys(SPECIAL_TOKENS + list(words or TINY_VOCAB) + list(extra or [])))
    # transformers 5: the tokenizer takes the vocab itself (a vocab_file= argument is ignored).
    tokenizer = BertTokenizer(vocab={tok: i for i, tok in enumerate(vocab)}, do_lower_case=True)
    out = Path(out_dir)
    tokenizer.save_pretrained(out)
    return out


@pytest.fixture(scope="session")
def tiny_tokenizer_builder():
    """`build_tiny_tokenizer(out_dir, words=None, *, extra=None) -> Path` as a fixture."""
    return build_tiny_tokenizer


@pytest.fixture(scope="session")
def tiny_tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A saved tiny tokenizer folder (vocab TINY_VOCAB); load it with AutoTokenizer or load_tokenizer."""
    return build_tiny_tokenizer(tmp_path_factory.mktemp("tiny_tokenizer"))


def tiny_bert_config(
    num_layers: int = 2,
    hidden: int = 32,
    heads: int = 4,
    num_labels: int = 2,
    vocab_size: int = len(TINY_VOCAB),
    **kwargs,
):
    """A BertConfig small enough to train in a test (max 128 positions, FFN 2x hidden)."""
    from transformers import BertConfig

    defaults = dict(
        vocab_size=vocab_size,
        hidden_size=hidden,
        num_hidden_layers=num_layers,
        num_attention_heads=heads,
        intermediate_size=2 * hidden,
        max_position_embeddings=128,
        type_vocab_size=2,
        num_labels=num_labels,
        pad_token_id=0,
    )
    defaults.update(kwargs)
    return BertConfig(**defaults)


def make_tiny_bert(
    num_layers: int = 2,
    hidden: int = 32,
    heads: int = 4,
    num_labels: int = 2,
    vocab_size: int = len(TINY_VOCAB),
    *,
    seed: int = 0,
    head: bool = True,
    **kwargs,
):
    """A randomly initialised tiny BERT (seeded), in eval mode.

    head=True: BertForSequenceClassification (a "fine-tuned" teacher); head=False: BertModel (a base).
    """
    import torch
    from transformers import BertForSequenceClassification, BertModel

    config = tiny_bert_config(num_layers, hidden, heads, num_labels, vocab_size, **kwargs)
    torch.manual_seed(seed)
    model = BertForSequenceClassification(config) if head else BertModel(config)
    return model.eval()


@pytest.fixture(scope="session")
def tiny_bert_factory():
    """`make_tiny_bert` as a fixture, for tests that prefer fixtures to importing conftest."""
    return make_tiny_bert


@pytest.fixture(scope="session")
def tiny_base_dir(tmp_path_factory: pytest.TempPathFactory, tiny_tokenizer: Path) -> Path:
    """A saved tiny base encoder (BertModel, 2 layers, hidden 32) with the tiny tokenizer: a stand-in
    for a hub base model such as bert-base-uncased."""
    from transformers import AutoTokenizer

    out = tmp_path_factory.mktemp("tiny_base")
    make_tiny_bert(head=False).save_pretrained(out)
    AutoTokenizer.from_pretrained(tiny_tokenizer).save_pretrained(out)
    return out


def save_tiny_teacher(out: str | Path, tokenizer_dir: str | Path, *, num_layers: int = 4, seed: int = 1,
                      confident: bool = False) -> Path:
    """Save a 'fine-tuned' tiny teacher (random BertForSequenceClassification) with its tokenizer.

    confident=True scales the head so the teacher's soft targets are far from uniform.
    """
    import torch
    from transformers import AutoTokenizer

    teacher = make_tiny_bert(num_layers=num_layers, seed=seed)
    if confident:
        with torch.no_grad():
            teacher.classifier.weight.mul_(200.0)
            teacher.classifier.bias.copy_(torch.tensor([1.5, -1.0]))
    teacher.save_pretrained(out)
    AutoTokenizer.from_pretrained(tokenizer_dir).save_pretrained(out)
    return Path(out)


@pytest.fixture(scope="session")
def teacher_dir(tmp_path_factory: pytest.TempPathFactory, tiny_tokenizer: Path) -> Path:
    """The tiny teacher most tests dump from (4 layers, seed 1), saved once for the session; a test file
    that needs another one defines its own `teacher_dir`."""
    return save_tiny_teacher(tmp_path_factory.mktemp("teacher"), tiny_tokenizer, num_layers=4, seed=1)


@pytest.fixture(scope="session")
def confident_teacher_dir(tmp_path_factory: pytest.TempPathFactory, tiny_tokenizer: Path) -> Path:
    """`teacher_dir` with a scaled head (soft targets far from uniform), saved once for the session."""
    return save_tiny_teacher(tmp_path_factory.mktemp("teacher"), tiny_tokenizer, num_layers=4, seed=1, confident=True)


def stop_at_step_script(step: int, *, epochs: int, batch_size: int, max_steps: int, workers: int) -> str:
    """A Python script (argv: store, out, data_dir) that trains `kd` on bert2 and stops after step `step` with
    its checkpoint written: what a killed run leaves, for resume tests run as a process or under torchrun."""
    return f"""
import sys
from pipelines.train.run.driver import train
from pipelines.train.options import TrainOptions

class Stop(Exception):
    pass

def stop(record):
    if record["step"] == {step}:
        raise Stop

store, out, data_dir = sys.argv[1:4]
options = TrainOptions(method="kd", method_options={{"epochs": {epochs}, "lr": 1e-3}}, batch_size={batch_size},
                       max_steps={max_steps}, seed=5, eval_limit=16, log_every=1, workers={workers}, progress=False,
                       checkpoint_every=1)
try:
    train(options, student="bert2", out_dir=out, store=store, data_dir=data_dir, on_step=stop)
except Stop:
    print("stopped")
"""


@pytest.fixture(scope="session")
def s3_server():
    """A SeaweedFS S3 server on loopback for the whole session (tests/s3_server.py); skips with the
    reason where it cannot start."""
    from s3_server import S3Unavailable, start_s3_server

    try:
        server = start_s3_server()
    except S3Unavailable as exc:
        pytest.skip(f"no S3 server: {exc}")
    yield server
    server.stop()


@pytest.fixture
def s3(s3_server, monkeypatch):
    """The S3 server's standard AWS variables set for this test; yields the server (bucket s3_server.BUCKET)."""
    for key, value in s3_server.env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    yield s3_server


@pytest.fixture(autouse=True)
def _torch_threads_restored():
    """Some commands set torch's thread count for their process (a sweep's local runs, a dask worker's
    dump), and dask sets OMP_NUM_THREADS and friends in the environment of the process that starts a
    cluster; run in-process by a test, either would leak into the next test's dumps, whose stores record
    the thread count (it changes float bits on CPU) and then refuse a resume from a subprocess."""
    env = {name: os.environ.get(name) for name in _THREAD_VARIABLES}
    torch = sys.modules.get("torch")
    before = torch.get_num_threads() if torch is not None else None
    yield
    for name, value in env.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    torch = sys.modules.get("torch")
    if torch is not None and before is not None and torch.get_num_threads() != before:
        torch.set_num_threads(before)


# --- causal LMs (hsk dump --objective clm) ---------------------------------------------------------------------
# Tiny random configs of the architectures a causal-LM store is tested with. initializer_range 0.2 (not 0.02)
# gives a teacher with a shape (entropy ~5 nats of 5.7 at V = 300) that a 2-layer student can learn from.
CAUSAL_CONFIGS = {
    "llama": ("LlamaConfig", dict(hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4,
                                  num_key_value_heads=2, max_position_embeddings=256, initializer_range=0.2)),
    "gpt2": ("GPT2Config", dict(n_embd=32, n_layer=3, n_head=4, n_positions=256, initializer_range=0.2)),
    "qwen2": ("Qwen2Config", dict(hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4,
                                  num_key_value_heads=2, max_position_embeddings=256, initializer_range=0.2)),
}


def build_bpe_tokenizer(out_dir: str | Path, texts: list[str], vocab_size: int = 300) -> Path:
    """A byte-level BPE tokenizer trained on `texts`, with an EOS token, saved to out_dir."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<eos>"],
                                                       initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>").save_pretrained(out_dir)
    return Path(out_dir)


def save_tiny_causal_lm(out: str | Path, tokenizer_dir: str | Path, arch: str = "llama", *, seed: int = 0,
                        vocab_size: int | None = None) -> Path:
    """A random causal LM of `arch` (CAUSAL_CONFIGS) over the tokenizer at tokenizer_dir, saved with it."""
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    name, sizes = CAUSAL_CONFIGS[arch]
    eos = tokenizer.eos_token_id
    config = getattr(transformers, name)(vocab_size=vocab_size or len(tokenizer), eos_token_id=eos, bos_token_id=eos,
                                         pad_token_id=eos, **sizes)
    torch.manual_seed(seed)
    AutoModelForCausalLM.from_config(config).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return Path(out)


SEQ2SEQ_CONFIGS = {
    "t5": ("T5Config", dict(d_model=32, d_kv=8, d_ff=64, num_layers=3, num_decoder_layers=3, num_heads=4)),
    "bart": ("BartConfig", dict(d_model=32, encoder_layers=3, decoder_layers=3, encoder_attention_heads=4,
                                decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64,
                                max_position_embeddings=128, init_std=0.2, forced_bos_token_id=None)),
}


def save_tiny_seq2seq(out: str | Path, tokenizer_dir: str | Path, arch: str = "t5", *, seed: int = 0) -> Path:
    """A random encoder-decoder of `arch` (SEQ2SEQ_CONFIGS: 3 + 3 layers, d 32) over the tokenizer, saved with it."""
    import torch
    import transformers
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    name, sizes = SEQ2SEQ_CONFIGS[arch]
    eos = tokenizer.eos_token_id
    config = getattr(transformers, name)(vocab_size=len(tokenizer), eos_token_id=eos, pad_token_id=eos,
                                         bos_token_id=eos, decoder_start_token_id=eos, **sizes)
    torch.manual_seed(seed)
    AutoModelForSeq2SeqLM.from_config(config).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return Path(out)


def kill_dump_midway(args: list[str], out: Path, shards: int = 2) -> None:
    """Run `hsk ARGS --out OUT` in a process and kill -9 it once `shards` shards are written (before the last)."""
    import signal
    import subprocess
    import sys
    import time

    import zarr

    from hskstore.format.schema import PROGRESS_DONE

    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    proc = subprocess.Popen([sys.executable, "-c", "from pipelines.cli import run; run()", *args, "--out", str(out)],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None:
        try:
            if zarr.open_group(str(out), mode="r")[PROGRESS_DONE][:].sum() >= shards:
                break
        except Exception:  # the store is not there yet, or half-created
            pass
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    group = zarr.open_group(str(out), mode="r")
    # unfinished: a streamed dump's progress arrays grow as it reads, so all of them may be done at the kill
    assert not group.attrs.get("hsk", {}).get("complete"), "the kill should land mid-dump"
    assert group[PROGRESS_DONE][:].sum() > 0, "the kill should land after a shard is written"


def chunk_bytes(url: Path) -> dict[str, bytes]:
    """Every stored file of a store but its rendered metadata (zarr.json, card, Croissant) and progress."""
    rendered = ("zarr.json", "README.md", "croissant.json")
    return {str(p.relative_to(url)): p.read_bytes() for p in sorted(url.rglob("*"))
            if p.is_file() and p.name not in rendered and "_progress" not in p.parts}


def dump_args(teacher: str | Path, glue_dir: str | Path, out: str | Path | None, *extra: str, task: str = "sst2",
              config: str | None = "2,4,0.25", rows: int = 24, shard_rows: int = 8, max_length: int = 32,
              batch_size: int | None = None, student_layers: int | None = None, split: str | None = None) -> list[str]:
    """`hsk dump` arguments of a small CPU store of GLUE rows (without --out when out is None). A test file's own
    variant is these keywords (a `functools.partial` at its top); `extra` comes last, so a repeated option wins."""
    args = ["dump", "--task", task, "--teacher", str(teacher), "--data-dir", str(glue_dir), "--limit", str(rows),
            "--shard-rows", str(shard_rows), "--max-length", str(max_length), "--no-progress", "--device", "cpu"]
    for flag, value in (("--config", config), ("--student-layers", student_layers), ("--batch-size", batch_size),
                        ("--split", split), ("--out", out)):
        if value is not None:
            args += [flag, str(value)]
    return [*args, *extra]


@pytest.fixture(scope="session")
def sst2_store(tmp_path_factory: pytest.TempPathFactory, teacher_dir: Path, glue_dir: Path) -> Path:
    """A folder holding `sst2.zarr`, as the README's dump names it: 24 SST-2 rows of `teacher_dir` in 3 shards
    (config 2,4,0.5); tests read it and never write into it."""
    from pipelines.cli import main

    folder = tmp_path_factory.mktemp("readme")
    args = dump_args(teacher_dir, glue_dir, folder / "sst2.zarr", config="2,4,0.5", student_layers=2, batch_size=8)
    assert main(args) == 0
    return folder


def hsk_env(**extra: str | None) -> dict[str, str]:
    """The environment of an `hsk` process a test starts: this checkout importable, the hub offline, no fault
    injected; `extra` on top (a None value unsets the variable)."""
    env = dict(os.environ, PYTHONPATH=str(REPO), HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    env.pop("HSK_FAULT", None)
    env.update(extra)
    return {key: value for key, value in env.items() if value is not None}


def hsk(*args: str, timeout: float = 120, **extra: str | None) -> tuple[int, str, str]:
    """(exit status, stdout, stderr) of `hsk ARGS` in a new process (environment `hsk_env(**extra)`), killed after
    `timeout` seconds: a hang fails the test, not the suite."""
    proc = subprocess.run([*HSK, *args], env=hsk_env(**extra), capture_output=True, text=True, timeout=timeout)
    return proc.returncode, proc.stdout, proc.stderr


def run_group(cmd: list[str], *, env: dict[str, str], timeout: float, cwd: str | Path | None = None
              ) -> subprocess.CompletedProcess:
    """`cmd` in a session of its own, like subprocess.run with capture_output and text; when it runs past `timeout`,
    or the test is stopped (Ctrl-C, SIGTERM), the whole group is killed: torchrun's workers included, so no
    orphaned process outlives the test."""
    import signal
    import threading

    proc = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, signal.default_int_handler) if main_thread else None
    try:
        out, err = proc.communicate(timeout=timeout)
    except BaseException:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
    finally:
        if main_thread:
            signal.signal(signal.SIGTERM, previous)
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def one_error_line(result: tuple[int, str, str], *words: str) -> str:
    """The one `hsk: error: ...` line of a refused `hsk(...)` run (exit status 2, no traceback), holding `words`."""
    code, out, err = result
    assert code == 2, out + err
    assert "Traceback" not in out + err, err
    lines = [ln for ln in (out + err).splitlines() if ln.startswith("hsk: error: ")]
    assert len(lines) == 1, out + err
    for word in words:
        assert word in lines[0], lines[0]
    return lines[0]


def tree_hashes(root: Path) -> dict[str, str]:
    """Every entry under root, links not followed: a file by its sha256, a link by its target, a folder as such."""
    import hashlib

    out = {}
    for path in sorted(root.rglob("*")):
        rel = str(path.relative_to(root))
        if path.is_symlink():
            out[rel] = "link:" + os.readlink(path)
        elif path.is_file():
            out[rel] = hashlib.sha256(path.read_bytes()).hexdigest()
        else:
            out[rel] = "dir" if path.is_dir() else "special"
    return out


def corpus_lines(n: int = 300) -> list[str]:
    """Real English: the first SST-2 training sentences (documents of a causal-LM corpus)."""
    rows = (GLUE_DIR / "SST-2" / "train.tsv").read_text(encoding="utf-8").splitlines()[1:]
    return [row.split("\t")[0] for row in rows[:n]]


@pytest.fixture(scope="session")
def clm_corpus(tmp_path_factory: pytest.TempPathFactory, glue_dir: Path) -> Path:
    """A text file of 300 documents, one per line."""
    path = tmp_path_factory.mktemp("clm_corpus") / "corpus.txt"
    path.write_text("\n".join(corpus_lines()) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="session")
def bpe_tokenizer(tmp_path_factory: pytest.TempPathFactory, glue_dir: Path) -> Path:
    return build_bpe_tokenizer(tmp_path_factory.mktemp("bpe"), corpus_lines(2000))


@pytest.fixture(scope="session")
def clm_teacher(tmp_path_factory: pytest.TempPathFactory, bpe_tokenizer: Path) -> Path:
    """A tiny random Llama (4 layers, d 32, vocabulary 300) with its tokenizer."""
    return save_tiny_causal_lm(tmp_path_factory.mktemp("clm_teacher"), bpe_tokenizer, "llama")


def clm_dump_args(teacher: Path, corpus: Path, out: Path, *extra: str, support: str = "topk:8") -> list[str]:
    """`hsk dump --objective clm` of a small store: 40 documents in blocks of 16 tokens, 8 blocks a shard."""
    return ["dump", "--objective", "clm", "--teacher", str(teacher), "--text-file", str(corpus), "--support", support,
            "--block-size", "16", "--limit", "40", "--shard-rows", "8", "--batch-size", "8", "--no-progress",
            "--device", "cpu", "--out", str(out), *extra]


@pytest.fixture(scope="session")
def small_clm_store(tmp_path_factory: pytest.TempPathFactory, clm_teacher: Path, clm_corpus: Path) -> Path:
    """A small top-8 causal-LM store of the tiny Llama (clm_dump_args); tests copy it before changing it."""
    from pipelines.cli import main

    out = tmp_path_factory.mktemp("small_clm") / "lm.zarr"
    assert main(clm_dump_args(clm_teacher, clm_corpus, out)) == 0
    return out


@pytest.fixture
def dask_cluster():
    """A LocalCluster of 2 worker processes (with nannies, which restart a killed worker) and a client of it."""
    import logging

    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                      dashboard_address="127.0.0.1:0", silence_logs=logging.ERROR) as c, Client(c) as client:
        yield c, client


def dump_killing_a_worker(args: list[str], out: Path, client, shards: int = 2) -> tuple[int, int]:
    """`hsk ARGS` (a dump onto `client`'s cluster, in a thread of this process) with the process of a worker busy on
    a shard killed (-9) once `shards` shards of the store at `out` are written; (exit status, the killed pid)."""
    import signal
    import threading
    import time

    import zarr

    from hskstore.format.schema import PROGRESS_DONE
    from pipelines.cli import main

    status: dict = {}
    driver = threading.Thread(target=lambda: status.update(code=main(args)))
    driver.start()
    killed = None
    deadline = time.time() + 180
    while killed is None and driver.is_alive() and time.time() < deadline:
        try:
            done = zarr.open_group(str(out), mode="r")[PROGRESS_DONE][:]
        except Exception:  # the store is not created yet
            done = None
        busy = [addr for addr, tasks in client.processing().items() if tasks]
        if done is not None and done.sum() >= shards and busy:
            assert done.sum() < len(done), "the dump was not finished at the kill"
            killed = client.run(os.getpid)[busy[0]]
            os.kill(killed, signal.SIGKILL)  # the worker process itself, mid-shard
        time.sleep(0.01)
    driver.join(timeout=300)
    assert killed is not None, "the kill should land mid-dump"
    assert killed not in client.run(os.getpid).values()  # that process is gone; the nanny started another
    return status.get("code"), killed


def seq2seq_pairs_file(folder: Path, n: int = 24) -> Path:
    """n pairs of real English (consecutive SST-2 sentences), as a TSV with a header."""
    lines = corpus_lines(2 * n)
    path = folder / "pairs.tsv"
    path.write_text("source\ttarget\n" + "".join(f"{a}\t{b}\n" for a, b in zip(lines[::2], lines[1::2])),
                    encoding="utf-8")
    return path


@pytest.fixture(scope="session")
def s2s_teachers(tmp_path_factory: pytest.TempPathFactory, bpe_tokenizer: Path) -> dict[str, Path]:
    """Tiny random seq2seq teachers over the BPE tokenizer: T5 and BART (save_tiny_seq2seq), and a Llama."""
    tmp = tmp_path_factory.mktemp("s2s_teachers")
    made = {arch: save_tiny_seq2seq(tmp / arch, bpe_tokenizer, arch) for arch in ("t5", "bart")}
    made["llama"] = save_tiny_causal_lm(tmp / "llama", bpe_tokenizer, "llama")
    return made


@pytest.fixture(scope="session")
def s2s_pairs(tmp_path_factory: pytest.TempPathFactory, glue_dir: Path) -> Path:
    """24 pairs of real English (seq2seq_pairs_file)."""
    return seq2seq_pairs_file(tmp_path_factory.mktemp("s2s_pairs"))


def resume_offset(out: Path) -> int:
    """Where a killed streamed dump (causal-LM, seq2seq) resumes its corpus: the offset (byte or row) its first
    pending shard's rows start at, as the store's corpus cursors record it."""
    import numpy as np
    import zarr

    from hskstore.format.schema import PROGRESS_DONE
    from pipelines.dump.corpus import CURSORS

    group = zarr.open_group(str(out), mode="r")
    first = int(np.argmin(group[PROGRESS_DONE][:].astype(bool)))
    return int(group[CURSORS][first - 1][5])


def recorded_starts(monkeypatch: pytest.MonkeyPatch, module, name: str, start_of) -> list:
    """`module.name` (a corpus reader, a generator function) wrapped so that each call records `start_of(*args)`:
    where a resumed dump reads its corpus from."""
    starts: list = []
    reader = getattr(module, name)

    def recorded(*args):
        starts.append(start_of(*args))
        yield from reader(*args)

    monkeypatch.setattr(module, name, recorded)
    return starts
