"""The fitted basis of the hidden-state support (`hsk dump --objective clm --support hidden:fit`,
hskstore.format.hidden_fit): the fit's facts (the folded head is exact, the coordinates are white, the Fisher is the
logits' softmax's, the measured KL tracks d theta / 24, the fit is deterministic), then the store through real `hsk`
processes: dump, info, verify, derive from float16 with a direct dump's bytes, resume without refitting, refusals."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import chunk_bytes, hsk, kill_dump_midway, one_error_line, tree_hashes

from hskstore import codecs, open_store
from hskstore.format.hidden_fit import FitEncoder, fit_basis, head_fisher, theta_of


def _teacher(seed: int = 0, n: int = 4096, d: int = 32, vocab: int = 300) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(h [n, d] float16, head [V, d], bias [V]): correlated states with a few wide dimensions (as LLMs' have) and
    a head whose softmax is neither flat nor one-hot."""
    rng = np.random.default_rng(seed)
    mix = rng.standard_normal((d, d)) / np.sqrt(d)
    h = rng.standard_normal((n, d)) @ mix * np.linspace(0.5, 3.0, d) + rng.standard_normal(d)
    weight = rng.standard_normal((vocab, d)) * 0.8
    return h.astype(np.float16), weight.astype(np.float32), rng.standard_normal(vocab).astype(np.float32)


def _log_softmax(x: np.ndarray) -> np.ndarray:
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def _kl(h: np.ndarray, q: np.ndarray, weight, bias, folded) -> tuple[float, float]:
    p = _log_softmax(h.astype(np.float64) @ weight.T.astype(np.float64) + bias)
    r = _log_softmax(q.astype(np.float64) @ folded[0].T.astype(np.float64) + folded[1])
    return float((np.exp(p) * (p - r)).sum(-1).mean()), float((p.argmax(-1) == r.argmax(-1)).mean())


# --- the fit's facts ------------------------------------------------------------------------------------------------


def test_the_folded_head_of_unrounded_coordinates_is_the_teachers_head():
    h, weight, bias = _teacher()
    basis = fit_basis(h[:2048], weight, bias, None, 0.01)
    coords = basis.encoder.coordinates(h[2048:])
    np.testing.assert_allclose(basis.decode(coords), h[2048:].astype(np.float64), atol=1e-9)
    folded = basis.folded(weight, bias)
    ours = coords @ folded[0].T.astype(np.float64) + folded[1]
    theirs = h[2048:].astype(np.float64) @ weight.T.astype(np.float64) + bias
    np.testing.assert_allclose(ours, theirs, atol=2e-4 * np.abs(theirs).max())  # the folded head is float32


def test_the_coordinates_are_white_and_the_fishers_eigenbasis():
    """z = steps x coordinates: identity covariance over the fit's positions, and A^T F A = diag(lam) for the
    decoder's columns A (a unit error in z_i costs lam_i / 2 nats, and errors in two coordinates do not mix)."""
    h, weight, bias = _teacher()
    basis = fit_basis(h, weight, bias, None, 0.01)
    z = basis.encoder.coordinates(h) * basis.steps
    # white up to the covariance floor (1e-6 of the mean variance), felt by the mixing's narrowest directions
    np.testing.assert_allclose(np.cov(z, rowvar=False), np.eye(32), atol=5e-3)
    a = basis.decoder / basis.steps
    fisher = head_fisher(h, weight, bias, None)
    np.testing.assert_allclose(a.T @ fisher @ a, np.diag(basis.importance), atol=1e-8 * basis.importance.max())
    assert (np.diff(basis.importance) <= 0).all()


@pytest.mark.parametrize("softcap", [None, 5.0])
def test_the_fisher_is_the_softmaxs_over_the_logits_jacobian(softcap):
    """head_fisher against J^T (diag(p) - p p^T) J per position, J the logits' Jacobian by finite differences."""
    h, weight, bias = _teacher(n=3)
    x = h.astype(np.float64)

    def logits(v):
        u = v @ weight.T.astype(np.float64) + bias
        return softcap * np.tanh(u / softcap) if softcap else u

    total = np.zeros((32, 32))
    for v in x:
        jac = np.stack([(logits(v + 1e-6 * e) - logits(v - 1e-6 * e)) / 2e-6 for e in np.eye(32)], 1)
        p = np.exp(_log_softmax(logits(v)))
        total += jac.T @ (np.diag(p) - np.outer(p, p)) @ jac
    np.testing.assert_allclose(head_fisher(x, weight, bias, softcap, chunk=2), total / 3, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("kl", [0.003, 0.01, 0.03])
def test_the_measured_kl_of_held_out_positions_tracks_d_theta_over_24(kl):
    """Fitted on 2,048 positions, measured on 2,048 others: within 25% of the target (second order in the error,
    and another sample than the fit's), next to nothing clipped."""
    h, weight, bias = _teacher(1)
    basis = fit_basis(h[:2048], weight, bias, None, kl)
    # a coordinate whose step exceeds its spread (sqrt 12) costs its variance, less than theta / 24
    assert basis.theta == theta_of(kl, 32) and 0.9 * kl < basis.predicted_kl <= kl + 1e-12
    q = basis.encoder.encode(h[2048:])
    measured, top1 = _kl(h[2048:], q, weight, bias, basis.folded(weight, bias))
    assert 0.75 * kl < measured < 1.25 * kl, measured
    assert basis.encoder.clipped(h[2048:]) < 1e-3 and top1 > 0.8  # the finest steps clip a 4-sigma tail


def test_the_fit_is_deterministic_and_its_digest_covers_the_encoder():
    h, weight, bias = _teacher()
    a, b = (fit_basis(h, weight, bias, None, 0.01) for _ in range(2))
    assert np.array_equal(a.encoder.matrix, b.encoder.matrix) and np.array_equal(a.encoder.mean, b.encoder.mean)
    assert a.encoder.digest() == b.encoder.digest()
    other = fit_basis(h, weight, bias, None, 0.02)
    assert other.encoder.digest() != a.encoder.digest()
    np.testing.assert_allclose(other.steps[:8], a.steps[:8] * np.sqrt(2))  # theta doubles: steps x sqrt(2)
    moved = FitEncoder(a.encoder.mean + 1e-12, a.encoder.matrix)
    assert moved.digest() != a.encoder.digest()


def test_int8u_rounds_clips_and_decodes_the_integers():
    codec = codecs.get("int8u")
    values, scale = codec.quantize(np.array([[0.49, 0.5, 1.5, -2.6, 300.0, -1e9]], dtype=np.float32))
    assert scale is None and values.dtype == np.int8 and values.tolist() == [[0, 0, 2, -3, 127, -127]]
    assert codec.decode(values, None, 6).tolist() == [[0.0, 0.0, 2.0, -3.0, 127.0, -127.0]]


# --- the store, through real hsk processes --------------------------------------------------------------------------


def _args(teacher, corpus, *extra: str) -> list[str]:
    return ["dump", "--objective", "clm", "--teacher", str(teacher), "--text-file", str(corpus), "--block-size", "32",
            "--limit", "60", "--shard-rows", "4", "--batch-size", "4", "--no-progress", "--device", "cpu", *extra]


FIT = ("--support", "hidden:fit", "--hidden-fit-tokens", "256", "--hidden-kl", "0.01")


@pytest.fixture(scope="module")
def fit_stores(tmp_path_factory, clm_teacher, clm_corpus) -> dict:
    tmp = tmp_path_factory.mktemp("fit")
    for name, support in (("fit", FIT), ("float16", ("--support", "hidden:float16"))):
        code, out, err = hsk(*_args(clm_teacher, clm_corpus, *support, "--out", str(tmp / f"{name}.zarr")))
        assert code == 0, out + err
    return {"fit": tmp / "fit.zarr", "float16": tmp / "float16.zarr", "tmp": tmp}


def test_a_fitted_store_records_its_fit_and_reconstructs_near_its_target(fit_stores):
    store = open_store(str(fit_stores["fit"]))
    sel = store.clm
    assert sel.hidden_codec == "int8u" and str(sel.described) == "hidden:fit" and sel.head_bias
    assert sel.hidden_fit.tokens == 256 and sel.hidden_fit.kl == 0.01 and sel.hidden_fit.clipped == 0
    assert sel.reconstruction_reference == "teacher" and 0.003 < sel.reconstruction_kl < 0.03
    assert store.fit_encoder().digest() == sel.hidden_fit.encoder_sha256
    data = store.read_shard(0)
    assert data["clm/hidden"].dtype == np.int8 and "clm/hidden_scale" not in data
    assert (data["clm/hidden"][~store.targets(data).kept] == 0).all()
    code, out, _ = hsk("info", str(fit_stores["fit"]))
    assert code == 0 and "int8u" in out and "fitted basis (target KL 0.01, 256 positions" in out
    assert "mean KL(teacher || stored)" in out
    code, out, _ = hsk("info", "--card", str(fit_stores["fit"]))
    assert code == 0 and "fitted basis" in out
    assert hsk("verify", str(fit_stores["fit"]))[0] == 0


def test_derive_from_float16_fits_the_same_basis_and_writes_the_dumps_bytes(fit_stores):
    out = fit_stores["tmp"] / "derived.zarr"
    code, text, err = hsk("derive", str(fit_stores["float16"]), "--support", "hidden:fit", "--hidden-fit-tokens",
                          "256", "--hidden-kl", "0.01", "--out", str(out), "--no-progress")
    assert code == 0, text + err
    derived, direct = open_store(str(out)), open_store(str(fit_stores["fit"]))
    assert derived.clm.hidden_fit == direct.clm.hidden_fit and derived.clm.head_sha256 == direct.clm.head_sha256
    for shard in range(direct.n_shards):
        a, b = derived.read_shard(shard), direct.read_shard(shard)
        assert sorted(a) == sorted(b) and all(np.array_equal(a[k], b[k]) for k in a), shard
    assert np.array_equal(derived.fit_encoder().matrix, direct.fit_encoder().matrix)
    assert derived.clm.reconstruction_reference == "source store" and derived.clm.reconstruction_kl < 0.03
    assert hsk("verify", str(out))[0] == 0


def test_the_kd_target_of_a_fitted_batch_is_near_the_teachers(fit_stores, clm_teacher):
    """The training loader decodes the int8u indices on the device and applies the folded head and bias: the
    teacher's log_softmax within the fit's KL (the stored indices are rounded), not exactly."""
    import torch
    from transformers import AutoModelForCausalLM

    from pipelines.train.kinds.clm import ClmFeed
    from pipelines.train.losses import lm

    store = open_store(str(fit_stores["fit"]))
    batch = ClmFeed(store).maker(None, [], "cpu", None)(store.read_shard(0))
    teacher = AutoModelForCausalLM.from_pretrained(clm_teacher, dtype=torch.float32).eval()
    with torch.no_grad():
        full = torch.log_softmax(teacher(input_ids=batch["input_ids"]).logits, -1)[batch["kd_mask"]]
    kl = float(lm.full_kl(torch.log_softmax(batch["teacher_logits"], -1), full).mean())
    assert 0.002 < kl < 0.03, kl


def test_a_killed_fitted_dump_resumes_with_its_stored_fit(fit_stores, clm_teacher, clm_corpus, tmp_path,
                                                          monkeypatch):
    """Killed after 3 of 17 shards; the resume reads the fit back (fitting again would fail here) and the store's
    bytes are the uninterrupted dump's."""
    import zarr

    from hskstore.format.schema import PROGRESS_DONE
    from pipelines.cli import main
    from pipelines.dump import clm as clm_dump

    args = _args(clm_teacher, clm_corpus, *FIT)
    kill_dump_midway(args, tmp_path / "k.zarr", shards=3)
    assert not zarr.open_group(str(tmp_path / "k.zarr"), mode="r")[PROGRESS_DONE][:].all()

    def refit(*_a, **_k):
        raise AssertionError("the resumed dump fitted its basis again")

    monkeypatch.setattr(clm_dump, "fit_hidden", refit)
    assert main([*args, "--out", str(tmp_path / "k.zarr")]) == 0
    assert chunk_bytes(tmp_path / "k.zarr") == chunk_bytes(fit_stores["fit"])


def test_what_a_fitted_basis_cannot_be_is_refused_in_one_line(fit_stores, clm_teacher, clm_corpus, tmp_path):
    before = tree_hashes(fit_stores["tmp"])
    cases = [
        (_args(clm_teacher, clm_corpus, *FIT[:2], "--hidden-kl", "0", "--out", str(tmp_path / "a.zarr")),
         ("--hidden-kl 0",)),
        (_args(clm_teacher, clm_corpus, *FIT[:2], "--hidden-fit-tokens", "40", "--out", str(tmp_path / "b.zarr")),
         ("--hidden-fit-tokens 40", "needs more than 64")),
        (["derive", str(fit_stores["fit"]), "--support", "hidden:int8", "--out", str(tmp_path / "c.zarr")],
         ("fitted basis", "float16 store")),
        # int8u holds indices the fit has scaled: on its own it would keep the integer part of raw values
        (_args(clm_teacher, clm_corpus, "--support", "hidden:int8u", "--out", str(tmp_path / "d.zarr")),
         ("hidden:int8u", "fitted basis (fit)")),
        (_args(clm_teacher, clm_corpus, "--support", "topk:4", "--logprobs", "int8u", "--out",
               str(tmp_path / "e.zarr")),
         ("--logprobs int8u", "choose one of float16")),
        (["dump", "--task", "sst2", "--config", "2,4,0.5", "--values", "int8u", "--out", str(tmp_path / "f.zarr")],
         ("--values 'int8u'", "nf4")),
    ]
    for args, words in cases:
        one_error_line(hsk(*args), *words)
    assert not list(tmp_path.iterdir()) and tree_hashes(fit_stores["tmp"]) == before


@pytest.mark.parametrize("forgery", ["index", "record"])
def test_train_on_a_forged_fitted_store_is_refused_and_leaves_no_run_folder(fit_stores, tmp_path, forgery):
    """A forger who knows the format and reseals: an index outside int8u's -127..127, or a fit record out of its
    domain. One line, no run folder, the store untouched."""
    import shutil
    from pathlib import Path

    from test_domain import reseal

    copy = Path(shutil.copytree(fit_stores["fit"], tmp_path / "forged.zarr"))
    if forgery == "index":
        reseal(copy, {"clm/hidden": lambda q: np.where(q != 0, np.int8(-128), q)})
    else:
        reseal(copy, selection=lambda meta: meta["selection"]["hidden_fit"].update(kl=-1.0))
    kept, run = tree_hashes(copy), tmp_path / "run"
    code, _, err = hsk("train", "--store", str(copy), "--student", "first2", "--method", "clm-kd", "--max-steps",
                       "2", "--batch-size", "4", "--device", "cpu", "--no-progress", "--out", str(run), timeout=300)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert ("clm/hidden" in err) if forgery == "index" else ("hidden_fit.kl" in err), err
    assert not run.exists() and tree_hashes(copy) == kept
