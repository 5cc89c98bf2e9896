"""The method's pure functions, pinned to the reference facts of METHOD.md sections 1-3."""

import numpy as np
import pytest

from hskstore.format import codec
from hskstore.format.config import ConfigError, HSKConfig
from hskstore.method.layermap import layer_map, ranking_layer_map, select_depth, student_to_store_layers
from hskstore.method.selection import attention_scores, eligible_tokens, rank_tokens, static_width_indices, width_mask


@pytest.mark.parametrize(
    "student, l_top, expected",
    [
        (4, 8, [0, 2, 4, 6, 8]),
        (4, 10, [0, 2, 5, 8, 10]),
        (4, 12, [0, 3, 6, 9, 12]),
        (6, 8, [0, 1, 3, 4, 5, 7, 8]),
        (6, 10, [0, 2, 3, 5, 7, 8, 10]),
        (6, 12, [0, 2, 4, 6, 8, 10, 12]),
    ],
)
def test_layer_map_table(student, l_top, expected):
    assert layer_map(student, l_top) == expected


def test_layer_map_uses_bankers_rounding():
    # 4 * 10 / 6 = 6.67 and 3 * 10 / 4 = 7.5 -> 8 (half to even), 1 * 10 / 4 = 2.5 -> 2
    assert layer_map(4, 10)[1] == 2 and layer_map(4, 10)[3] == 8
    assert layer_map(4, 10) != [int(s * 10 / 4 + 0.5) for s in range(5)]


def test_keep_last_entries_and_their_teacher_layers():
    layers, entries, ranking = select_depth(3, 12, ref_student_layers=4, l_top=8)
    assert entries == [2, 3, 4] and layers == [4, 6, 8]
    assert ranking == [6, 9, 12]  # the L_top=12 ranking map of entries 2..4
    layers, entries, _ = select_depth(5, 12, ref_student_layers=4, l_top=8)
    assert entries == [0, 1, 2, 3, 4] and layers == [0, 2, 4, 6, 8]  # embeddings only at N^D = S+1
    with pytest.raises(ConfigError, match="only 5 entries"):
        select_depth(6, 12, ref_student_layers=4, l_top=8)


def test_ranking_map_and_other_teacher_depths():
    assert ranking_layer_map(4, 12) == [1, 3, 6, 9, 12]
    layers, _, ranking = select_depth(3, 6, ref_student_layers=4)  # a 6-layer teacher, default L_top 5
    assert layers == [2, 4, 5] and all(1 <= r <= 6 for r in ranking)
    with pytest.raises(ConfigError, match="L_top"):
        select_depth(2, 6, ref_student_layers=4, l_top=8)


def test_explicit_layers_and_student_of_other_depth():
    layers, entries, ranking = select_depth(2, 6, explicit_layers=[6, 3])
    assert layers == [3, 6] and entries is None and ranking == [3, 6]
    # a 2-layer student meets stored entries 2..4 of a 4-layer reference at 1, 2 (top meets top)
    assert student_to_store_layers(8, [2, 3, 4], 4) == {2: 4, 3: 6, 4: 8}
    with pytest.raises(ConfigError, match="one to one"):
        student_to_store_layers(2, [2, 3, 4], 4)


@pytest.mark.parametrize("bad", ["3,8", "a,8,0.2", "3,8,1.5", "3,0,0.2", "-1,8,0.2", "3,8.5,0.2", ""])
def test_bad_config_strings_are_refused_clearly(bad):
    with pytest.raises(ConfigError, match="config"):
        HSKConfig.parse(bad)


def test_config_amount_and_logits_only():
    cfg = HSKConfig.parse("3,8,0.2")
    assert cfg.n_width(768) == 154 and cfg.amount(768) == pytest.approx(3 * 8 * 154 / 768)
    assert HSKConfig.parse("0,0,0").logits_only
    assert str(HSKConfig.parse(" 1, 9, 0.1 ")) == "1,9,0.1"


def _batch():
    # [CLS] a b [SEP] c [SEP] pad pad ;  [CLS] d [SEP] pad...
    ids = np.array([[101, 5, 6, 102, 7, 102, 0, 0], [101, 8, 102, 0, 0, 0, 0, 0]])
    lengths = np.array([6, 3])
    return ids, lengths


def test_token_ranking_never_picks_sep_or_padding_and_cls_competes():
    ids, lengths = _batch()
    raw = np.array([[1.0, 5.0, 2.0, 9.0, 3.0, 8.0, 99.0, 99.0], [7.0, 1.0, 9.0, 50.0, 50.0, 0, 0, 0]])
    scores = attention_scores(raw[:, None, :], lengths, "pre-softmax")
    eligible = eligible_tokens(ids, lengths, sep_id=102, exclude_sep=True)
    positions, kept = rank_tokens(scores, eligible, 3, "att-nosep")
    assert positions[0].tolist() == [1, 4, 2]  # SEPs (9, 8) and padding (99) skipped
    assert kept[0].tolist() == [5.0, 3.0, 2.0]
    assert positions[1].tolist() == [0, 1, -1]  # CLS wins on its own score; only 2 eligible tokens
    # per example: the second row's SEP sits where the first row has a real token
    with_sep = rank_tokens(scores, eligible_tokens(ids, lengths, 102, exclude_sep=False), 3, "att")[0]
    assert with_sep[0].tolist() == [3, 5, 1] and with_sep[1].tolist() == [2, 0, 1]


def test_ranking_ties_go_to_lower_position_and_prefix_property():
    ids = np.array([[101, 5, 6, 7, 8, 102]])
    lengths = np.array([6])
    scores = np.array([[1.0, 2.0, 2.0, 3.0, 2.0, 0.0]], dtype=np.float32)
    eligible = eligible_tokens(ids, lengths, 102, True)
    p4 = rank_tokens(scores, eligible, 4, "att-nosep")[0]
    assert p4.tolist() == [[3, 1, 2, 4]]
    assert (rank_tokens(scores, eligible, 2, "att-nosep")[0] == p4[:, :2]).all()


def test_left_and_cls_strategies():
    ids, lengths = _batch()
    scores = np.zeros(ids.shape, dtype=np.float32)
    eligible = eligible_tokens(ids, lengths, 102, exclude_sep=False)
    assert rank_tokens(scores, eligible, 4, "left")[0].tolist() == [[0, 1, 2, 3], [0, 1, 2, -1]]
    assert rank_tokens(scores, eligible, 1, "cls")[0].tolist() == [[0], [0]]


def test_pre_and_post_softmax_scores_average_over_heads():
    rows = np.array([[[0.0, 2.0, 0.0, 7.0], [0.0, 0.0, 4.0, 7.0]]], dtype=np.float32)  # 2 heads, padding at 3
    pre = attention_scores(rows, np.array([3]), "pre-softmax")
    np.testing.assert_allclose(pre[0, :3], [0.0, 1.0, 2.0])
    assert pre[0, 3] == -np.inf
    post = attention_scores(rows, np.array([3]), "post-softmax")
    e1, e2 = np.exp([0.0, 2.0, 0.0]), np.exp([0.0, 0.0, 4.0])
    np.testing.assert_allclose(post[0, :3], (e1 / e1.sum() + e2 / e2.sum()) / 2, rtol=1e-6)
    assert post[0, :3].sum() == pytest.approx(1.0)


def test_magnitude_mask_keeps_exactly_round_w_d_per_vector():
    rng = np.random.default_rng(0)
    vectors = rng.normal(size=(3, 5, 64)).astype(np.float32)
    k = HSKConfig.parse("1,5,0.3").n_width(64)
    assert k == round(0.3 * 64) == 19
    mask = width_mask(vectors, k, "mag")
    assert (mask.sum(-1) == k).all()
    for v, m in zip(vectors.reshape(-1, 64), mask.reshape(-1, 64)):  # per vector, not per batch
        assert np.abs(v[m]).min() >= np.abs(v[~m]).max()
    valid = np.ones((3, 5), bool)
    valid[1, 2] = False
    assert width_mask(vectors, k, "mag", valid=valid)[1, 2].sum() == 0


def test_static_masks_uniform_and_nested_rand():
    assert static_width_indices("uniform", 10, 4).tolist() == [0, 2, 5, 8]  # round(2.5)=2, round(7.5)=8
    wide = set(static_width_indices("rand", 64, 20, seed=3).tolist())
    narrow = set(static_width_indices("rand", 64, 7, seed=3).tolist())
    assert len(wide) == 20 and narrow <= wide
    m = width_mask(np.ones((2, 64)), 7, "rand", seed=3)
    assert (m.sum(-1) == 7).all() and set(np.flatnonzero(m[0])) == narrow


@pytest.mark.parametrize("dtype", ["float16", "int8"])
def test_codec_round_trip(dtype):
    rng = np.random.default_rng(1)
    vectors = rng.normal(size=(4, 3, 20)).astype(np.float32)
    valid = np.array([[1, 1, 0]] * 4, dtype=bool)
    mask = width_mask(vectors, 6, "mag", valid=valid)
    values, scale = codec.encode_values(vectors, mask, 6, dtype)
    dense = codec.dense(dtype, values, codec.pack_mask(mask), 20, scale)
    expected = np.where(mask, vectors, 0.0)
    tol = 1e-3 if dtype == "float16" else np.abs(vectors).max() / 127
    np.testing.assert_allclose(dense, expected, atol=tol, rtol=1e-3)
    assert (dense[:, 2] == 0).all()
