"""The image-to-text model: a ViT's patches feeding a GPT decoder's cross-attention (models.vision_text)."""

from __future__ import annotations

import pytest
import torch
from torchmetrics.functional.text import char_error_rate

from lightformer.generation import beam_search
from lightformer.models.gpt import GPT, GPTConfig
from lightformer.models.vision_text import VisionEncoderDecoder, VisionEncoderDecoderConfig
from lightformer.nn import record_attention
from lightformer.tasks import ImageToTextTask
from lightformer.tokenization.text import Tokenizer

VOCAB = 20
ENCODER = dict(image_size=(16, 48), in_channels=1, patch_size=(16, 4), d_model=32, n_heads=2, n_layers=2)
DECODER = dict(vocab_size=VOCAB, block_size=12, d_model=32, n_heads=2, n_layers=2)


def config(encoder: dict | None = None, decoder: dict | None = None, **changes) -> VisionEncoderDecoderConfig:
    """The test shape, each tower's fields changed by ``encoder`` and ``decoder``."""
    towers = dict(encoder={**ENCODER, **(encoder or {})}, decoder={**DECODER, **(decoder or {})})
    return VisionEncoderDecoderConfig(**towers, **changes)


def model(**changes) -> VisionEncoderDecoder:
    torch.manual_seed(0)
    return VisionEncoderDecoder(config(**changes)).eval()


def test_the_decoder_reads_every_patch_of_a_rectangular_image_in_tall_narrow_patches():
    m = model()
    images, tgt = torch.randn(3, 1, 16, 48), torch.randint(0, VOCAB, (3, 7))
    assert m.encode(images).shape == (3, 12, 32)  # 48 / 4 patches of the full height
    assert m(images, tgt).shape == (3, 7, VOCAB)
    changed = images.clone()
    changed[1, :, :, -4:] += 1.0  # the last patch of the second image only
    difference = (m(changed, tgt) - m(images, tgt)).abs().amax(dim=(1, 2))
    assert difference[1] > 1e-4 and difference[0] == 0 and difference[2] == 0


@pytest.mark.parametrize("encoder", [{}, {"d_model": 48, "n_heads": 3}])
def test_incremental_decoding_with_the_kv_cache_gives_the_full_forward_passs_logits(encoder):
    m = model(encoder=encoder)
    images, ids = torch.randn(2, 1, 16, 48), torch.randint(0, VOCAB, (2, 6))
    full = m(images, ids)
    decoder, cache = m.incremental_decoder(images), None
    cache = decoder.new_cache()
    steps = [decoder(ids[:, i : i + 1], cache) for i in range(ids.shape[1])]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=1e-5)


def test_beam_search_of_one_beam_is_greedy_decoding_of_the_full_forward_pass():
    m = model()
    images = torch.randn(2, 1, 16, 48)
    hypotheses, _ = beam_search(m.incremental_decoder(images), 2, 1, 1, 2, 8, 1.0, device=images.device)
    for row, hypothesis in enumerate(hypotheses):
        ids = torch.tensor([[1]])
        for _ in range(8):
            next_id = int(m(images[row : row + 1], ids)[0, -1].argmax())
            if next_id == 2:
                break
            ids = torch.cat([ids, torch.tensor([[next_id]])], dim=1)
        assert hypothesis == ids[0, 1:].tolist()


def test_a_gpts_weights_load_into_the_decoder_by_name_leaving_only_the_cross_attention_fresh():
    gpt = GPT(GPTConfig(vocab_size=VOCAB, block_size=12, n_layers=2, n_heads=2, d_model=32))
    m = model()
    missing, unexpected = m.decoder.load_state_dict(gpt.state_dict(), strict=False)
    assert not unexpected
    assert missing and all(".cross_attn." in name or ".norm_cross." in name for name in missing)
    torch.testing.assert_close(m.decoder.embed.weight, gpt.embed.weight)


def test_a_shape_that_does_not_tile_or_divide_is_refused_naming_the_stack_and_the_field():
    with pytest.raises(ValueError, match="the encoder: the widths: image_size=50 is not a multiple of patch_size=4"):
        config(encoder={"image_size": (16, 50)})
    with pytest.raises(ValueError, match="the decoder: d_model=32 is not divisible by n_heads=3"):
        config(decoder={"n_heads": 3})
    with pytest.raises(ValueError, match="the encoder: .*unexpected keyword argument 'encoder_layers'"):
        config(encoder={"encoder_layers": 2})


def test_each_tower_has_its_own_width_heads_norm_dropout_and_feed_forward_width():
    encoder = dict(d_model=24, n_heads=3, d_ff=40, norm="rmsnorm", dropout=0.2, attn_dropout=0.05, norm_eps=1e-3)
    decoder = dict(d_ff=72, norm="layernorm", dropout=0.1, activation="swiglu")
    m = model(encoder=encoder, decoder=decoder)
    vit_layer, gpt_layer = m.encoder.encoder.layers[0], m.decoder.decoder.layers[0]
    assert isinstance(vit_layer.norm1, torch.nn.RMSNorm) and vit_layer.norm1.eps == 1e-3
    assert isinstance(gpt_layer.norm1, torch.nn.LayerNorm) and gpt_layer.norm1.eps == 1e-5
    assert vit_layer.ffn.fc1.out_features == 40 and gpt_layer.ffn.fc2.in_features == 72
    assert vit_layer.self_attn.n_heads == 3 and gpt_layer.cross_attn.n_heads == 2
    assert (vit_layer.dropout.p, vit_layer.self_attn.dropout) == (0.2, 0.05)
    assert (gpt_layer.dropout.p, gpt_layer.self_attn.dropout) == (0.1, 0.1)  # a GPT's attention: its dropout
    assert m.encoder_to_decoder.in_features == 24 and m.encoder_to_decoder.out_features == 32
    assert m.encode(torch.randn(2, 1, 16, 48)).shape == (2, 12, 32)


def test_the_encoder_is_a_headless_mean_pooled_vit_whatever_its_config_says_and_a_head_is_refused():
    from lightformer.models.vit import ViTConfig

    given = config(encoder={"pool": "cls", "num_classes": 0}).encoder
    assert (given.pool, given.num_classes) == ("mean", 0)
    whole = VisionEncoderDecoderConfig(encoder=ViTConfig(**ENCODER), decoder=DECODER)  # ViTConfig: num_classes None
    assert (whole.encoder.pool, whole.encoder.num_classes) == ("mean", 0)
    with pytest.raises(ValueError, match="encoder.num_classes=10: the encoder of an image-to-text model has no"):
        config(encoder={"num_classes": 10})


# --- the task: it learns to read --------------------------------------------------------------------------------

DIGITS = {  # 5 × 3 bitmaps, a glyph per digit: the smallest "typeface" a model can learn to read in seconds
    "0": "111101101101111", "1": "010110010010111", "2": "111001111100111", "3": "111001111001111",
    "4": "101101111001001", "5": "111100111001111", "6": "111100111101111", "7": "111001010010010",
    "8": "111101111101111", "9": "111101111001111",
}  # fmt: skip


def digit_line(text: str, width: int = 32) -> torch.Tensor:
    """A text of digits drawn at 4 pixels a glyph, on a 8 × ``width`` canvas, dark ink on white: ``(1, 8, width)``."""
    image = torch.ones(1, 8, width)
    for i, digit in enumerate(text):
        glyph = torch.tensor([float(bit) for bit in DIGITS[digit]]).view(5, 3)
        image[0, 1:6, 1 + 4 * i : 4 + 4 * i] = 1 - glyph
    return image


def digit_task(**options):
    from lightformer.facts import DataFacts
    from lightformer.tasks.image_text import ImageToTextTask
    from lightformer.tokenization.text import Tokenizer

    tokenizer = Tokenizer.train_char(["0123456789"])
    facts = DataFacts(tokenizer=tokenizer.to_str(), vocab_size=tokenizer.vocab_size, pad_id=tokenizer.pad_id,
                      image_size=(8, 32), in_channels=1, normalize_mean=(0.5,), normalize_std=(0.5,),
                      max_length=10)  # fmt: skip
    shape = dict(d_model=48, n_heads=2, n_layers=2)
    net = dict(encoder=dict(patch_size=(8, 4), **shape), decoder=dict(block_size=10, **shape))
    net |= options.pop("net", {})
    return ImageToTextTask(net=net, data_facts=facts, label_smoothing=0.0, **options), tokenizer


def digit_batch(texts: list[str], tokenizer) -> dict:
    ids = [tokenizer.encode(text, add_bos=True, add_eos=True) for text in texts]
    tgt = torch.full((len(ids), max(map(len, ids))), tokenizer.pad_id)
    for row, line in enumerate(ids):
        tgt[row, : len(line)] = torch.tensor(line)
    return {"images": (torch.stack([digit_line(t) for t in texts]) - 0.5) / 0.5, "tgt": tgt, "text": texts}


def test_the_task_learns_to_read_lines_of_digits_it_has_not_seen():
    torch.manual_seed(0)
    task, tokenizer = digit_task()
    generator = torch.Generator().manual_seed(0)

    def texts(n: int) -> list[str]:
        lengths = torch.randint(1, 8, (n,), generator=generator)
        return ["".join(str(int(d)) for d in torch.randint(0, 10, (int(k),), generator=generator)) for k in lengths]

    held_out = texts(64)
    optimizer = torch.optim.AdamW(task.parameters(), lr=1e-3)
    for _ in range(400):
        batch = digit_batch([t for t in texts(32) if t not in held_out] or ["0"], tokenizer)
        loss, _ = task._loss(batch)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    readings = task.read_images(digit_batch(held_out, tokenizer)["images"], beam_size=1)
    assert float(char_error_rate(readings, held_out)) < 0.05, list(zip(readings, held_out, strict=True))[:8]
    beamed = task.read_images(digit_batch(held_out, tokenizer)["images"], beam_size=3)
    assert float(char_error_rate(beamed, held_out)) < 0.05, list(zip(beamed, held_out, strict=True))[:8]


def test_the_ctc_loss_on_the_encoders_patches_is_added_in_training_only_and_needs_the_head():
    from lightformer.errors import ConfigError

    torch.manual_seed(0)
    task, tokenizer = digit_task(net={"ctc_head": True}, ctc_weight=0.5)
    batch = digit_batch(["123", "4", "5678901"], tokenizer)
    with_ctc, _ = task._loss(batch)
    task.eval()
    without, _ = task._loss(batch)
    logits, patch_logits = task.model(batch["images"], batch["tgt"][:, :-1], ctc=True)
    log_probs = patch_logits.log_softmax(-1).transpose(0, 1)
    lengths = torch.tensor([3, 1, 7])
    ctc = torch.nn.functional.ctc_loss(log_probs, batch["tgt"][:, 1:-1], torch.full((3,), 8), lengths, blank=0)
    torch.testing.assert_close(with_ctc, without + 0.5 * ctc)
    with pytest.raises(ConfigError, match="model.ctc_weight=0.5 must be at least 0, and above 0 only with"):
        digit_task(ctc_weight=0.5)


def test_the_attention_shown_for_each_written_token_is_the_one_it_was_generated_with():
    """The reading's attention maps (teacher-forced on the reading) are the cross-attention of each step of
    incremental decoding with the KV cache, token by token, EOS included."""
    tokenizer = Tokenizer.train_char(["a truth universally acknowledged"])
    facts = dict(tokenizer=tokenizer.to_str(), vocab_size=tokenizer.vocab_size, pad_id=tokenizer.pad_id,
                 image_size=(16, 48), in_channels=1, normalize_mean=(0.5,), normalize_std=(0.25,))  # fmt: skip
    torch.manual_seed(0)
    net = VisionEncoderDecoderConfig(encoder=dict(patch_size=(16, 4), d_model=32, n_heads=2, n_layers=1),
                                     decoder=dict(block_size=12, d_model=32, n_heads=2, n_layers=2))  # fmt: skip
    task = ImageToTextTask(net=net, data_facts=facts).eval()
    image = torch.randn(1, 16, 48)
    reading = "a truth"  # any text: the maps are of the model writing it
    tokens, maps = task.reading_attention(image, reading)
    assert tokens == [*reading, "<eos>"] and maps.shape == (len(tokens), 1, 12)
    torch.testing.assert_close(maps.sum(dim=(1, 2)), torch.ones(len(tokens)))
    ids = tokenizer.encode(reading, add_bos=True)
    decoder, cache = task.model.incremental_decoder(image[None]), None
    cache = decoder.new_cache()
    last = "decoder.decoder.layers.1.cross_attn"
    for step, token_id in enumerate(ids):
        with record_attention(task.model) as weights:
            decoder(torch.tensor([[token_id]]), cache)
        torch.testing.assert_close(weights[last][0, :, -1].mean(0), maps[step].flatten(), atol=1e-5, rtol=1e-5)


def test_the_command_line_parses_the_towers_from_yaml_and_from_dotted_options(capsys):
    """jsonargparse reads the nested frozen dataclasses: a config file's ``net.encoder`` and ``net.decoder``, an option
    ``--model.net.encoder.n_layers`` over them, and the joined model's default towers for the fields neither gives."""
    import yaml

    from lightformer.cli.main import main

    args = ["fit", "--config=configs/image_text/printed_lines.yaml", "--model.net.encoder.n_layers=2",
            "--model.net.decoder.dropout=0.2", "--print_config"]  # fmt: skip
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    assert exit_info.value.code in (None, 0)
    net = yaml.safe_load(capsys.readouterr().out)["model"]["init_args"]["net"]
    assert (net["encoder"]["n_layers"], net["encoder"]["d_model"], net["encoder"]["patch_size"]) == (2, 128, [32, 4])
    assert (net["encoder"]["pool"], net["encoder"]["num_classes"], net["encoder"]["in_channels"]) == ("mean", 0, 1)
    assert (net["decoder"]["n_layers"], net["decoder"]["dropout"], net["decoder"]["block_size"]) == (3, 0.2, 64)
    assert net["ctc_head"] is True
