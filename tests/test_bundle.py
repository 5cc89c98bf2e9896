"""`hsk pack` as the user meets it: a rerun after a pack that stopped before the croissant.json beside its bundle
(a full disk) finishes it; a bundle named by a URL is refused in one line."""

from __future__ import annotations

from conftest import hsk, tree_hashes


def test_a_rerun_finishes_a_bundle_whose_croissant_json_was_not_written(small_clm_store, tmp_path):
    bundle, sibling = tmp_path / "lm.hsk.zip", tmp_path / "lm.croissant.json"
    assert hsk("pack", "--no-progress", str(small_clm_store), str(bundle), timeout=90)[0] == 0
    packed, described = bundle.read_bytes(), sibling.read_bytes()
    sibling.unlink()  # what a disk that filled up after the bundle took its name leaves
    code, out, err = hsk("pack", "--no-progress", str(small_clm_store), str(bundle), timeout=90)
    assert code == 0, err
    assert "already holds this store" in err and "writing its croissant.json" in err
    assert bundle.read_bytes() == packed and sibling.read_bytes() == described
    code, _, err = hsk("pack", "--no-progress", str(small_clm_store), str(bundle), timeout=90)
    assert code == 2 and "exists" in err and "--overwrite" in err  # complete now: a third pack is an overwrite


def test_a_bundle_of_another_store_at_the_name_is_still_refused(small_clm_store, tmp_path):
    other = tmp_path / "other.zarr"
    bundle = tmp_path / "lm.hsk.zip"
    assert hsk("pack", "--no-progress", str(small_clm_store), str(bundle), timeout=90)[0] == 0
    (tmp_path / "lm.croissant.json").unlink()
    assert hsk("derive", str(small_clm_store), "--support", "topk:4", "--out", str(other), "--no-progress",
               timeout=90)[0] == 0
    kept = bundle.read_bytes()
    code, _, err = hsk("pack", "--no-progress", str(other), str(bundle), timeout=90)
    assert code == 2 and "exists: pass --overwrite" in err and len(err.strip().splitlines()) == 1, err
    assert bundle.read_bytes() == kept


def test_pack_to_a_url_is_one_line_saying_how(small_clm_store, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    kept = tree_hashes(small_clm_store)
    code, out, err = hsk("pack", "--no-progress", str(small_clm_store), "s3://bucket/x.hsk.zip", timeout=60)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert "writes a local file, not a URL" in err and "x.hsk.zip" in err
    assert list(tmp_path.iterdir()) == []  # nothing made locally under a mangled name
    assert tree_hashes(small_clm_store) == kept
