"""Masking transforms: BERT's rates and 80/10/10 split, whole words, T5 span statistics and round trips, NSP pairs."""

import numpy as np
import pytest

from lightformer.data.objectives.masking import (
    IGNORE_INDEX,
    mask_tokens,
    nsp_pair,
    random_spans_noise_mask,
    reconstruct_from_spans,
    span_corruption,
)

PAD_ID, CLS_ID, SEP_ID, MASK_ID = 0, 1, 2, 3
NUM_SPECIAL = 5
SEQ_LEN = 128
# T5's sentinels: the top of a 32,100-token vocabulary, counting down.
SENTINELS = np.arange(32099, 31999, -1)


def bert_sequence(rng: np.random.Generator, vocab_size: int) -> tuple[np.ndarray, np.ndarray]:
    """`[CLS] text [SEP] text [SEP] [PAD]...` of SEQ_LEN tokens in uint16 (as stored), and where it is maskable."""
    ids = rng.integers(NUM_SPECIAL, vocab_size, size=SEQ_LEN).astype(np.uint16)
    used = int(rng.integers(SEQ_LEN // 2, SEQ_LEN + 1))
    ids[used:] = PAD_ID
    ids[0], ids[used - 1], ids[int(rng.integers(2, used - 2))] = CLS_ID, SEP_ID, SEP_ID
    return ids, ids >= NUM_SPECIAL


@pytest.fixture(scope="module")
def masked_sample() -> dict[str, np.ndarray]:
    """2,400 masked sequences (about 230k maskable tokens), concatenated, with a vocabulary of 30,000."""
    vocab_size, data_rng, rng = 30_000, np.random.default_rng(1), np.random.default_rng(2)
    originals, maskables, inputs, labels = [], [], [], []
    for _ in range(2400):
        ids, maskable = bert_sequence(data_rng, vocab_size)
        before = ids.copy()
        masked, label = mask_tokens(
            ids, rng, mask_id=MASK_ID, vocab_size=vocab_size, maskable=maskable, random_low=NUM_SPECIAL
        )
        np.testing.assert_array_equal(ids, before)  # the input array is never modified
        assert masked.dtype == np.int64 and label.dtype == np.int64 and masked.shape == ids.shape
        originals.append(ids.astype(np.int64))
        maskables.append(maskable)
        inputs.append(masked)
        labels.append(label)
    return {
        "vocab_size": np.int64(vocab_size),
        "original": np.concatenate(originals),
        "maskable": np.concatenate(maskables),
        "inputs": np.concatenate(inputs),
        "labels": np.concatenate(labels),
    }


def test_mask_tokens_selection_rate_and_labels(masked_sample: dict[str, np.ndarray]) -> None:
    original, maskable, inputs, labels = (masked_sample[k] for k in ("original", "maskable", "inputs", "labels"))
    assert maskable.sum() >= 200_000
    selected = labels != IGNORE_INDEX
    assert abs(selected.sum() / maskable.sum() - 0.15) < 0.005
    assert not (selected & ~maskable).any()  # special tokens never selected...
    np.testing.assert_array_equal(inputs[~maskable], original[~maskable])  # ...nor changed
    np.testing.assert_array_equal(inputs[~selected], original[~selected])  # nothing unselected changes
    np.testing.assert_array_equal(labels[selected], original[selected])


def test_mask_tokens_80_10_10_split(masked_sample: dict[str, np.ndarray]) -> None:
    vocab_size = int(masked_sample["vocab_size"])
    original, inputs, labels = (masked_sample[k] for k in ("original", "inputs", "labels"))
    selected = labels != IGNORE_INDEX
    chosen_input, chosen_original = inputs[selected], original[selected]
    masked = chosen_input == MASK_ID
    unchanged = chosen_input == chosen_original
    randomised = ~masked & ~unchanged
    # A random replacement equals the original with probability 1 / (number of candidate tokens).
    chance_same = 1 / (vocab_size - NUM_SPECIAL)
    assert abs(masked.mean() - 0.8) < 0.01
    assert abs(unchanged.mean() - (0.1 + 0.1 * chance_same)) < 0.01
    assert abs(randomised.mean() - 0.1 * (1 - chance_same)) < 0.01


def test_mask_tokens_random_replacements_are_uniform(masked_sample: dict[str, np.ndarray]) -> None:
    vocab_size = int(masked_sample["vocab_size"])
    original, inputs, labels = (masked_sample[k] for k in ("original", "inputs", "labels"))
    selected = labels != IGNORE_INDEX
    replacements = inputs[selected & (inputs != MASK_ID) & (inputs != original)]
    assert len(replacements) > 2000
    assert replacements.min() >= NUM_SPECIAL and replacements.max() < vocab_size
    span = vocab_size - NUM_SPECIAL
    assert replacements.min() < NUM_SPECIAL + 0.01 * span and replacements.max() >= vocab_size - 0.01 * span
    # 10 equal bins; chi-square with 9 degrees of freedom is below 27.9 with probability 0.999.
    counts = np.bincount((replacements - NUM_SPECIAL) * 10 // span, minlength=10)
    expected = len(replacements) / 10
    assert ((counts - expected) ** 2 / expected).sum() < 27.9


def test_mask_tokens_is_deterministic_in_the_generator() -> None:
    ids, maskable = bert_sequence(np.random.default_rng(0), 1000)

    def corrupt(seed: int) -> tuple[np.ndarray, np.ndarray]:
        rng = np.random.default_rng(seed)
        return mask_tokens(ids, rng, mask_id=MASK_ID, vocab_size=1000, maskable=maskable, random_low=NUM_SPECIAL)

    first, again, other = corrupt(7), corrupt(7), corrupt(8)
    np.testing.assert_array_equal(first[0], again[0])
    np.testing.assert_array_equal(first[1], again[1])
    assert not np.array_equal(first[1], other[1])


def test_mask_tokens_small_and_edge_cases() -> None:
    rng = np.random.default_rng(0)
    # Nothing maskable: nothing selected. One maskable token: max(1, round(0.15)) = 1 is selected.
    nothing = mask_tokens(np.array([1, 2]), rng, mask_id=3, vocab_size=10, maskable=np.zeros(2, bool))
    np.testing.assert_array_equal(nothing[1], [IGNORE_INDEX, IGNORE_INDEX])
    one = mask_tokens(np.array([1, 7, 2]), rng, mask_id=3, vocab_size=10, maskable=np.array([False, True, False]))
    np.testing.assert_array_equal(one[1], [IGNORE_INDEX, 7, IGNORE_INDEX])
    # mask_fraction=1: every selected token becomes [MASK]; probability=1: every maskable token is selected.
    ids = np.arange(5, 25)
    inputs, labels = mask_tokens(
        ids,
        rng,
        mask_id=3,
        vocab_size=30,
        maskable=np.ones(20, bool),
        probability=1.0,
        mask_fraction=1.0,
        random_fraction=0.0,
    )
    assert (inputs == 3).all()
    np.testing.assert_array_equal(labels, ids)


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        ({"probability": 0.0}, "probability"),
        ({"probability": 1.5}, "probability"),
        ({"mask_fraction": -0.1}, "mask_fraction"),
        ({"mask_fraction": 0.8, "random_fraction": 0.3}, "random_fraction"),
        ({"mask_id": 50}, "mask_id"),
        ({"mask_id": -1}, "mask_id"),
        ({"random_low": 50}, "random_low"),
        ({"maskable": np.ones(9, bool)}, "maskable"),
        ({"maskable": np.ones(10, np.int64)}, "maskable"),
        ({"word_starts": np.ones(11, bool)}, "word_starts"),
        ({"vocab_size": 10}, "ids"),
        ({"ids": np.ones((2, 5), np.int64)}, "ids"),
    ],
)
def test_mask_tokens_rejects_bad_arguments(overrides: dict, named: str) -> None:
    arguments = {"ids": np.arange(10, 20), "mask_id": 3, "vocab_size": 50, "maskable": np.ones(10, bool)}
    arguments.update(overrides)
    ids = arguments.pop("ids")
    with pytest.raises(ValueError, match=named):
        mask_tokens(ids, np.random.default_rng(0), **arguments)


def test_whole_word_masking_selects_whole_words_at_the_rate() -> None:
    vocab_size, data_rng, rng = 1000, np.random.default_rng(3), np.random.default_rng(4)
    maskable_total = selected_total = mixed_words = 0
    for _ in range(1600):
        ids, maskable = bert_sequence(data_rng, vocab_size)
        word_lengths = data_rng.integers(1, 5, size=SEQ_LEN)
        word_starts = np.zeros(SEQ_LEN, bool)
        word_starts[np.cumsum(word_lengths)[np.cumsum(word_lengths) < SEQ_LEN]] = True
        word_starts[0] = True
        inputs, labels = mask_tokens(
            ids,
            rng,
            mask_id=MASK_ID,
            vocab_size=vocab_size,
            maskable=maskable,
            word_starts=word_starts,
            random_low=NUM_SPECIAL,
        )
        selected = labels != IGNORE_INDEX
        assert not (selected & ~maskable).any()
        # A word: a maskable start (or the first maskable token after a special one) and the maskable
        # non-start tokens that follow it.
        begins = maskable & (word_starts | np.concatenate(([True], ~maskable[:-1])))
        word = (np.cumsum(begins) - 1)[maskable]
        chosen_tokens = np.bincount(word, weights=selected[maskable])
        tokens = np.bincount(word)
        assert ((chosen_tokens == 0) | (chosen_tokens == tokens)).all()
        masked_in_word = np.bincount(word, weights=(inputs == MASK_ID)[maskable])
        mixed_words += int(((masked_in_word > 0) & (masked_in_word < chosen_tokens)).sum())
        maskable_total += int(maskable.sum())
        selected_total += int(selected.sum())
    assert maskable_total >= 140_000
    assert abs(selected_total / maskable_total - 0.15) < 0.01
    assert mixed_words > 0  # the 80/10/10 choice is per token, not per word


def test_whole_word_masking_never_joins_words_across_special_tokens() -> None:
    # Tokens 3..5 continue no word of their own (word_starts False) but follow a [SEP]: they form a new word.
    ids = np.array([1, 10, 11, 2, 12, 13, 14, 2])
    maskable = np.array([False, True, True, False, True, True, True, False])
    word_starts = np.array([False, True, False, False, False, False, False, False])
    seen = set()
    for seed in range(50):
        _, labels = mask_tokens(
            ids,
            np.random.default_rng(seed),
            mask_id=3,
            vocab_size=20,
            maskable=maskable,
            word_starts=word_starts,
            probability=0.5,
        )
        seen.add(tuple(np.flatnonzero(labels != IGNORE_INDEX)))
    # round(0.5 * 5) = 2 tokens: only the word [10, 11] fits; the 3-token word would overshoot and is skipped.
    assert seen == {(1, 2)}


def test_random_spans_noise_mask_small_case() -> None:
    for mean_span_length, spans in [(3.0, 1), (1.5, 2), (1.0, 3)]:
        for seed in range(20):
            noise = random_spans_noise_mask(10, np.random.default_rng(seed), 0.3, mean_span_length)
            assert noise.dtype == np.bool_ and noise.shape == (10,)
            assert noise.sum() == 3 and not noise[0] and noise[-1]  # T5's layout ends on a noise span
            assert (np.diff(noise.astype(int)) == 1).sum() == spans == round(3 / mean_span_length)
    # Clipping: at least one noise token and one kept token, whatever the density.
    assert random_spans_noise_mask(2, np.random.default_rng(0), 0.01).tolist() == [False, True]
    assert random_spans_noise_mask(5, np.random.default_rng(0), 0.99, 1.0).tolist() == [False, True, True, True, True]


def test_random_spans_noise_mask_layout_is_random() -> None:
    masks = np.stack([random_spans_noise_mask(SEQ_LEN, np.random.default_rng(seed)) for seed in range(400)])
    # Away from the (always kept) first and (always noise) last token, every position is sometimes noise.
    assert masks[:, 1:-1].any(axis=0).all()
    assert len({mask.tobytes() for mask in masks}) == len(masks)


def test_span_corruption_statistics_and_round_trip() -> None:
    data_rng, rng = np.random.default_rng(5), np.random.default_rng(6)
    noise_tokens = spans = total = 0
    for _ in range(5000):
        ids = data_rng.integers(0, 32000, size=SEQ_LEN).astype(np.uint16)
        before = ids.copy()
        inputs, targets = span_corruption(ids, rng, sentinel_ids=SENTINELS)
        np.testing.assert_array_equal(ids, before)
        assert inputs.dtype == np.int64 and targets.dtype == np.int64
        in_inputs = inputs[np.isin(inputs, SENTINELS)]
        in_targets = targets[np.isin(targets, SENTINELS)]
        # The i-th span gets sentinel_ids[i], in both inputs and targets; targets start with the first sentinel.
        np.testing.assert_array_equal(in_inputs, SENTINELS[: len(in_inputs)])
        np.testing.assert_array_equal(in_targets, in_inputs)
        assert targets[0] == SENTINELS[0]
        assert inputs[0] == ids[0]  # the sequence starts with a kept token
        np.testing.assert_array_equal(reconstruct_from_spans(inputs, targets, SENTINELS), ids)
        assert len(inputs) + len(targets) == SEQ_LEN + 2 * len(in_inputs)
        noise_tokens += len(targets) - len(in_targets)
        spans += len(in_inputs)
        total += SEQ_LEN
    assert abs(noise_tokens / total - 0.15) < 0.005
    assert abs(noise_tokens / spans - 3.0) < 0.2


def test_span_corruption_round_trips_every_length() -> None:
    rng = np.random.default_rng(7)
    for length in range(2, 300):
        ids = rng.integers(0, 1000, size=length)
        inputs, targets = span_corruption(ids, rng, sentinel_ids=SENTINELS, noise_density=0.3, mean_span_length=2.0)
        np.testing.assert_array_equal(reconstruct_from_spans(inputs, targets, SENTINELS), ids)


def test_span_corruption_worked_example() -> None:
    # Seeds until the layout is a [X] . . [Y] . . . with 7 tokens: inputs `a X d e Y`, targets `X b c Y f g`.
    ids, sentinels = np.array([10, 11, 12, 13, 14, 15, 16]), [99, 98]
    for seed in range(1000):
        noise = random_spans_noise_mask(7, np.random.default_rng(seed), 4 / 7, 2.0)
        if noise.tolist() == [False, True, True, False, False, True, True]:
            break
    else:
        pytest.fail("no seed gave the layout")
    inputs, targets = span_corruption(
        ids, np.random.default_rng(seed), sentinel_ids=sentinels, noise_density=4 / 7, mean_span_length=2.0
    )
    assert inputs.tolist() == [10, 99, 13, 14, 98]
    assert targets.tolist() == [99, 11, 12, 98, 15, 16]


def test_span_corruption_rejects_bad_arguments() -> None:
    rng, ids = np.random.default_rng(0), np.arange(128)
    # 128 tokens at density 0.15 and mean 3 make round(19 / 3) = 6 spans: 5 sentinels are too few.
    with pytest.raises(ValueError, match="sentinel_ids"):
        span_corruption(ids, rng, sentinel_ids=SENTINELS[:5])
    span_corruption(ids, rng, sentinel_ids=SENTINELS[:6])
    with pytest.raises(ValueError, match="sentinel_ids"):
        span_corruption(ids, rng, sentinel_ids=[500, 500, 501, 502, 503, 504])
    with pytest.raises(ValueError, match="sentinel_ids"):
        span_corruption(np.append(ids, SENTINELS[3]), rng, sentinel_ids=SENTINELS)
    with pytest.raises(ValueError, match="at least 2 tokens"):
        span_corruption(np.array([5]), rng, sentinel_ids=SENTINELS)
    with pytest.raises(ValueError, match="length"):
        random_spans_noise_mask(1, rng)
    with pytest.raises(ValueError, match="noise_density"):
        span_corruption(ids, rng, sentinel_ids=SENTINELS, noise_density=1.0)
    with pytest.raises(ValueError, match="mean_span_length"):
        span_corruption(ids, rng, sentinel_ids=SENTINELS, mean_span_length=0.5)


def test_reconstruct_from_spans_is_lenient_with_model_output() -> None:
    inputs = np.array([5, 99, 7, 98, 9])
    # Junk before the first sentinel is ignored, a repeated sentinel counts once, a missing one fills nothing.
    assert reconstruct_from_spans(inputs, np.array([4, 99, 6, 99, 1]), [99, 98]).tolist() == [5, 6, 7, 9]


def test_nsp_pair_layout() -> None:
    ids, segments = nsp_pair(
        np.array([10, 11, 12]),
        np.array([20, 21]),
        cls_id=CLS_ID,
        sep_id=SEP_ID,
        max_length=16,
        rng=np.random.default_rng(0),
    )
    assert ids.tolist() == [CLS_ID, 10, 11, 12, SEP_ID, 20, 21, SEP_ID]
    assert segments.tolist() == [0, 0, 0, 0, 0, 1, 1, 1]
    assert ids.dtype == np.int64 and segments.dtype == np.int64


def test_nsp_pair_truncates_the_longer_segment_from_either_end() -> None:
    segment_a, segment_b = np.arange(100, 110), np.arange(200, 203)
    fronts_cut = 0
    for seed in range(200):
        ids, segments = nsp_pair(
            segment_a, segment_b, cls_id=CLS_ID, sep_id=SEP_ID, max_length=9, rng=np.random.default_rng(seed)
        )
        assert len(ids) == 9 and ids[0] == CLS_ID and ids[-1] == SEP_ID and (ids == SEP_ID).sum() == 2
        kept_a, kept_b = ids[1 : np.flatnonzero(ids == SEP_ID)[0]], ids[np.flatnonzero(ids == SEP_ID)[0] + 1 : -1]
        # 10 + 3 into 6: the longer A is cut to 3, B (never the longer) untouched.
        assert len(kept_a) == 3 and kept_b.tolist() == segment_b.tolist()
        assert np.array_equal(kept_a, np.arange(kept_a[0], kept_a[0] + 3))  # a contiguous piece of A
        assert segments.tolist() == [0] * 5 + [1] * 4
        fronts_cut += int(kept_a[0] - 100)
    assert abs(fronts_cut / (200 * 7) - 0.5) < 0.05  # half the cuts from the front, half from the back
    # Equal lengths cut B first (as BERT's truncate_seq_pair): 10 + 4 into 6 ends as 3 + 3.
    ids, _ = nsp_pair(
        segment_a, np.arange(200, 204), cls_id=CLS_ID, sep_id=SEP_ID, max_length=9, rng=np.random.default_rng(0)
    )
    assert np.flatnonzero(ids == SEP_ID).tolist() == [4, 8]


def test_nsp_pair_rejects_too_short_max_length() -> None:
    with pytest.raises(ValueError, match="max_length"):
        nsp_pair(np.array([5]), np.array([6]), cls_id=CLS_ID, sep_id=SEP_ID, max_length=4, rng=np.random.default_rng(0))
