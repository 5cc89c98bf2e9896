"""Attention rows are the same bits on every device (issue 35): q . k summed in float64 in head-dimension order.

The CPU tests check pipelines/dump/attention_scores.py against the definition in docs/STORE_FORMAT.md,
written here in numpy; the CUDA tests (skipped without a GPU) check that the torch engine on a GPU writes
the numpy reference's bytes, array by array and store by store.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch
from conftest import save_tiny_teacher
from test_select_torch import SEP, T, assert_same_bytes, crafted_probe, selection_for

from hskstore import open_store
from pipelines.cli import main
from pipelines.dump.attention_scores import query_key_scores
from pipelines.dump.probe import ProbeOutput
from pipelines.dump.select_torch import HostCopies, host_arrays, select_batch
from pipelines.dump.targets import encode_batch

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU in this run")


def documented_scores(rows: np.ndarray, k: np.ndarray, heads: int) -> np.ndarray:
    """docs/STORE_FORMAT.md's definition: float64 products added in order of e, / sqrt(d/H), then float32."""
    b, n, d = rows.shape
    head = d // heads
    q = rows.astype(np.float64).reshape(b, n, heads, head).transpose(0, 2, 1, 3)
    keys = k.astype(np.float64).reshape(b, k.shape[1], heads, head).transpose(0, 2, 3, 1)
    acc = np.zeros((b, heads, n, k.shape[1]))
    for e in range(head):
        acc = acc + q[..., e, None] * keys[:, :, e, None, :]
    return (acc / np.float64(math.sqrt(head))).astype(np.float32)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("heads", [1, 3, 4])
def test_scores_follow_the_documented_definition(dtype, heads):
    gen = torch.Generator().manual_seed(heads)
    rows = (torch.randn(5, 6, 48, generator=gen) * torch.logspace(-3, 3, 48)).to(dtype)
    k = (torch.randn(5, 11, 48, generator=gen) * 10).to(dtype)
    got = query_key_scores(rows, k, heads)
    want = documented_scores(rows.float().numpy(), k.float().numpy(), heads)
    assert got.dtype == torch.float32 and got.numpy().tobytes() == want.tobytes()
    matmul = torch.einsum("bnhe,bthe->bhnt", rows.float().view(5, 6, heads, -1), k.float().view(5, 11, heads, -1))
    torch.testing.assert_close(got, matmul / math.sqrt(48 // heads), rtol=1e-4, atol=1e-3)


def test_the_scores_do_not_depend_on_the_thread_count():
    gen = torch.Generator().manual_seed(0)
    rows, k = torch.randn(16, 8, 384, generator=gen), torch.randn(16, 64, 384, generator=gen)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = query_key_scores(rows, k, 12)
        torch.set_num_threads(max(2, threads))
        many = query_key_scores(rows, k, 12)
    finally:
        torch.set_num_threads(threads)
    assert one.numpy().tobytes() == many.numpy().tobytes()


@needs_cuda
def test_cuda_scores_are_the_cpu_bits():
    gen = torch.Generator().manual_seed(1)
    rows, k = torch.randn(32, 8, 768, generator=gen), torch.randn(32, 128, 768, generator=gen)
    on_gpu = query_key_scores(rows.cuda(), k.cuda(), 12).cpu()
    assert on_gpu.numpy().tobytes() == query_key_scores(rows, k, 12).numpy().tobytes()


@needs_cuda
def test_cuda_engine_writes_the_reference_attention_rows():
    probe, ids, lengths = crafted_probe(7)
    on_gpu = ProbeOutput(probe.logits.cuda(), {j: h.cuda() for j, h in probe.hidden.items()},
                         {k: s.cuda() for k, s in probe.cls_scores.items()},
                         {k: (q.cuda(), kk.cuda()) for k, (q, kk) in probe.qk.items()})
    for values, scores in itertools.product(["float16", "int8", "int4", "mxfp4"], ["pre-softmax", "post-softmax"]):
        selection = selection_for(value_dtype=values, attention_scores=scores, attention_rows=True)
        ref = encode_batch(probe, ids, lengths, selection, SEP, T)
        got = host_arrays(*HostCopies().start(select_batch(on_gpu, ids, lengths, selection, SEP, T)))
        assert_same_bytes(ref, got)


@needs_cuda
@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_cuda_stores_of_both_engines_are_identical(glue_dir, tiny_tokenizer, tmp_path, precision):
    """The issue's case: a GPU dump with --attention-rows, torch engine against the numpy reference."""
    teacher = save_tiny_teacher(tmp_path / "teacher", tiny_tokenizer, num_layers=4, seed=2)
    sums = []
    for engine in ("torch", "numpy"):
        out = tmp_path / f"{engine}.zarr"
        assert main(["dump", "--task", "qnli", "--split", "dev", "--teacher", str(teacher), "--data-dir",
                     str(glue_dir), "--limit", "200", "--config", "2,8,0.2", "--student-layers", "2",
                     "--attention-rows", "--values", "int8", "--device", "cuda", "--precision", precision,
                     "--selection-engine", engine, "--no-progress", "--out", str(out)]) == 0
        sums.append(open_store(str(out)).meta["checksums"])
    assert sums[0] == sums[1]
