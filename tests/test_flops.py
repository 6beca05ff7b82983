"""FLOPs per example without a count per batch shape (``lightformer.training.flops``): the polynomial in the sequence
lengths, fitted from a few short lengths, matches PyTorch's ``FlopCounterMode`` at the shapes training sees, for every
model; and the number of counts does not grow with the number of distinct batch shapes."""

import pytest
import torch
from lightning.fabric.utilities.throughput import measure_flops

from lightformer.models.bert import BertConfig, BertForPreTraining, BertForSequenceClassification
from lightformer.models.gpt import GPT, GPTConfig
from lightformer.models.seq2seq import EncoderDecoder, EncoderDecoderConfig
from lightformer.models.vit import VisionTransformer, ViTConfig
from lightformer.training.flops import FlopCounter, _outputs

SMALL = dict(n_heads=2, d_model=32)
MODELS = {
    "gpt": (lambda: GPT(GPTConfig(vocab_size=97, block_size=128, n_layers=2, **SMALL)), 1),
    "gpt_rope_swiglu": (
        lambda: GPT(
            GPTConfig(vocab_size=97, block_size=128, n_layers=1, position="rope", activation="swiglu", **SMALL)
        ),
        1,
    ),
    "seq2seq": (
        lambda: EncoderDecoder(
            EncoderDecoderConfig(
                src_vocab_size=61, tgt_vocab_size=61, n_encoder_layers=2, n_decoder_layers=2, d_ff=64, **SMALL
            )
        ),
        2,
    ),
    "bert_pretraining": (
        lambda: BertForPreTraining(BertConfig(vocab_size=53, max_len=128, n_layers=2, d_ff=64, **SMALL)),
        "ids+segments",
    ),
    "bert_classifier": (
        lambda: BertForSequenceClassification(
            BertConfig(vocab_size=53, max_len=128, n_layers=2, d_ff=64, num_classes=3, **SMALL)
        ),
        1,
    ),
}
# Lengths a run sees: the measured ones are 1 to 4, these are not.
SHAPES = {1: [(7,), (64,), (128,)], 2: [(9, 31), (64, 64), (120, 17)], "ids+segments": [(7,), (100,)]}


def inputs_of(kind, lengths) -> list[torch.Tensor]:
    if kind == "ids+segments":
        return [torch.zeros(3, lengths[0], dtype=torch.long)] * 2
    return [torch.zeros(3, length, dtype=torch.long) for length in lengths]


def counted(make, inputs, backward) -> int:
    """FlopCounterMode's count for one example of these inputs' shapes, directly."""
    with torch.device("meta"):
        model = make()
        example = [torch.zeros(1, *x.shape[1:], dtype=x.dtype) for x in inputs]
    loss = (lambda out: sum(o.float().sum() for o in _outputs(out))) if backward else None
    return measure_flops(model, lambda: model(*example), loss)


@pytest.mark.parametrize("backward", [False, True], ids=["forward", "training"])
@pytest.mark.parametrize("name", list(MODELS))
def test_the_fitted_count_matches_flop_counter_mode_at_unmeasured_lengths(name, backward):
    make, kind = MODELS[name]
    counter = FlopCounter(make)
    for lengths in SHAPES[kind]:
        inputs = inputs_of(kind, lengths)
        expected = counted(make, inputs, backward)
        assert counter.per_example(inputs, backward) == pytest.approx(expected, rel=0.02), lengths
    assert counter._polynomials, "sequence inputs are counted by the polynomial, not per shape"
    assert all(fit is not None for fit in counter._polynomials.values())


def test_images_are_counted_once_per_shape():
    make = lambda: VisionTransformer(ViTConfig(image_size=16, in_channels=1, num_classes=5, n_layers=2, **SMALL))
    counter = FlopCounter(make)
    images = [torch.zeros(4, 1, 16, 16)]
    assert counter.per_example(images, True) == counted(make, images, True)
    counter.per_example([torch.zeros(9, 1, 16, 16)], True)  # another batch size: the same count per example
    assert counter.measurements == 1


def test_the_counts_do_not_grow_with_the_number_of_distinct_batch_shapes():
    """What a throughput callback pays per step: after the first batch, new (source, target) lengths cost no count."""
    make, _ = MODELS["seq2seq"]
    counter = FlopCounter(make)
    counter.per_example(inputs_of(2, (5, 6)), backward=True)
    after_first = counter.measurements
    for source, target in [(s, t) for s in range(8, 120, 9) for t in range(7, 120, 11) if s != t]:
        counter.per_example(inputs_of(2, (source, target)), backward=True)
    assert counter.measurements == after_first
