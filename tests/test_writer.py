"""The store writer as the user meets it (hskstore.io.writer): an `--overwrite` writes the store's own name into
its card and croissant.json, never its hidden staging folder's; a dump with other arguments on a store a live
writer holds is told to wait for that writer first (its --overwrite would be refused too)."""

from __future__ import annotations

import json
import shutil

from conftest import clm_dump_args, hsk, tree_hashes

from hskstore.io.lease import Lease


def test_an_overwrite_names_the_store_not_its_staging_folder(small_clm_store, clm_teacher, clm_corpus, tmp_path):
    store = shutil.copytree(small_clm_store, tmp_path / "lm.zarr")
    code, _, err = hsk(*clm_dump_args(clm_teacher, clm_corpus, store, "--overwrite", support="topk:4"), timeout=120)
    assert code == 0, err
    derived = tmp_path / "d.zarr"
    for _ in range(2):  # derive, then derive --overwrite
        code, _, err = hsk("derive", str(store), "--support", "topk:2", "--out", str(derived), "--no-progress",
                           *(["--overwrite"] if derived.exists() else []), timeout=90)
        assert code == 0, err
    for folder in (store, derived):
        card, croissant = (folder / "README.md").read_text(), json.loads((folder / "croissant.json").read_text())
        assert "hsk-staged" not in card + json.dumps(croissant), folder
        assert f'open_store("{folder.name}")' in card and croissant["name"] == folder.name


def test_a_dump_with_other_arguments_on_a_store_being_written_names_the_writer(small_clm_store, clm_teacher,
                                                                               clm_corpus, tmp_path):
    store = shutil.copytree(small_clm_store, tmp_path / "lm.zarr")
    doc = json.loads((store / "zarr.json").read_text())
    doc["attributes"]["hsk"]["complete"] = False  # what a live dump's output says of itself
    (store / "zarr.json").write_text(json.dumps(doc))
    holder = Lease(str(store)).acquire()  # the live dump (this process)
    try:
        kept = tree_hashes(store)
        code, _, err = hsk(*clm_dump_args(clm_teacher, clm_corpus, store, support="topk:4"), timeout=120)
        assert code == 2 and len(err.strip().splitlines()) == 1, err
        assert "is being written by" in err and "interrupted dump" not in err, err
        assert tree_hashes(store) == kept
    finally:
        holder.release()
    code, _, err = hsk(*clm_dump_args(clm_teacher, clm_corpus, store, support="topk:4"), timeout=120)
    assert code == 2 and "--overwrite" in err, err  # no writer: now the store's own refusal is what to act on
