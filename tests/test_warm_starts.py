"""Starting parts of a model from other runs' weights (``model.init.modules``): an image-to-text model's decoder from
a language model's checkpoint and its encoder from a ViT classifier's or timm's weights, at another image size."""

from __future__ import annotations

import pytest
import timm
import torch
from safetensors.torch import save_file
from timm.layers import resample_abs_pos_embed

from lightformer.cli.checks import check_checkpoint_files
from lightformer.errors import CheckpointError, ConfigError
from lightformer.io.checkpoints import InitConfig
from lightformer.models.gpt import GPTConfig
from lightformer.models.vision_text import VisionEncoderDecoderConfig
from lightformer.models.vit import VisionTransformer, ViTConfig, resample_positions
from lightformer.tasks import ImageToTextTask, LanguageModelTask
from lightformer.tokenization.text import Tokenizer
from tiny_runs import FactsOnly, with_data

TEXT = "It is a truth universally acknowledged, that a single man in possession of a good fortune"
TOKENIZER = Tokenizer.train_char([TEXT])
DECODER = dict(d_model=32, n_heads=2, n_layers=2, block_size=16)
LINES = dict(image_size=(16, 64), patch_size=(16, 4))
ENCODER = dict(d_model=32, n_heads=2, n_layers=2, patch_size=LINES["patch_size"])


def lm_checkpoint(tmp_path, tokenizer: Tokenizer = TOKENIZER) -> tuple[str, LanguageModelTask]:
    """A language model's run checkpoint (its facts and weights) of the decoder's shape."""
    torch.manual_seed(1)
    net = GPTConfig(block_size=16, n_layers=2, n_heads=2, d_model=32)
    facts = {"tokenizer": tokenizer.to_str(), "vocab_size": tokenizer.vocab_size, "pad_id": tokenizer.pad_id}
    lm = LanguageModelTask(net=net, data_facts=facts)
    path = tmp_path / "lm.ckpt"
    torch.save({"state_dict": lm.state_dict(), "hyper_parameters": dict(lm.hparams)}, path)
    return str(path), lm


def reader(
    init: dict, image_size=LINES["image_size"], in_channels: int = 1, encoder=None, decoder=None
) -> ImageToTextTask:
    """An image-to-text task starting as ``init`` says, on data of that image size and channels; its towers' fields
    changed by ``encoder`` and ``decoder``."""
    torch.manual_seed(0)
    facts = dict(tokenizer=TOKENIZER.to_str(), vocab_size=TOKENIZER.vocab_size, pad_id=TOKENIZER.pad_id,
                 image_size=image_size, in_channels=in_channels, normalize_mean=(0.5,) * in_channels,
                 normalize_std=(0.25,) * in_channels, max_length=12)  # fmt: skip
    net = VisionEncoderDecoderConfig(encoder={**ENCODER, **(encoder or {})}, decoder={**DECODER, **(decoder or {})})
    task = ImageToTextTask(net=net, init=InitConfig(**init), data_facts=facts)
    return with_data(task, FactsOnly(**facts))


def test_the_decoder_starts_from_a_language_models_run_and_only_cross_attention_is_new(tmp_path):
    path, lm = lm_checkpoint(tmp_path)
    task = reader({"modules": {"decoder": path}})
    fresh = {name: value.clone() for name, value in task.model.state_dict().items()}
    task.setup("fit")
    state = task.model.state_dict()
    for name, value in lm.model.state_dict().items():
        assert torch.equal(state[f"decoder.{name}"], value), name
    new = {name for name in state if name not in task.pretrained}
    assert set(task.pretrained) == {f"decoder.{name}" for name in lm.model.state_dict()}
    assert {name.split(".")[0] for name in new} == {"encoder", "encoder_to_decoder", "decoder"} - {"encoder_to_decoder"}
    new_in_decoder = {name for name in new if name.startswith("decoder.")}
    assert new_in_decoder and all(".cross_attn." in name or "norm_cross" in name for name in new_in_decoder), (
        new_in_decoder
    )
    assert all(torch.equal(state[name], fresh[name]) for name in new)  # left as initialised


def test_a_decoder_start_trained_with_another_tokenizer_is_refused_by_name(tmp_path):
    other = Tokenizer.train_char([TEXT.upper()])
    path, _ = lm_checkpoint(tmp_path, other)
    with pytest.raises(
        CheckpointError, match=r"model.init.modules.decoder .*lm.ckpt was trained with another tokenizer"
    ):
        reader({"modules": {"decoder": path}}).setup("fit")


def test_a_module_start_names_a_module_the_model_has_and_a_file_that_exists(tmp_path):
    path, _ = lm_checkpoint(tmp_path)
    with pytest.raises(ConfigError, match=r"model.init.modules.decoder_stack: the model has no module 'decoder_stack'"):
        reader({"modules": {"decoder_stack": path}}).setup("fit")
    with pytest.raises(ConfigError, match="must map a module's path"):
        InitConfig(modules={"decoder.": path})
    config = {"model.init_args.init": {"modules": {"decoder": str(tmp_path / "missing.ckpt")}}}
    with pytest.raises(CheckpointError, match="model.init.modules.decoder: the file .*missing.ckpt' does not exist"):
        check_checkpoint_files("fit", config)
    # A decoder of another shape than the language model's: refused (init.strict), naming a tensor and both sizes.
    with pytest.raises(ConfigError, match=r"model.init.modules.decoder .*have another shape.*\[64, 32\]"):
        reader({"modules": {"decoder": path}}, decoder={"d_ff": 64}).check_init(starting=True)


def test_the_encoder_starts_from_timm_vit_weights_of_another_image_size_its_positions_resampled(tmp_path):
    """timm's square 32 x 32 ViT (patch 16 x 16 over 3 channels: a 2 x 2 grid and a class token) starting the encoder
    of 32 x 96 colour images: a 2 x 6 grid without a class token, the positions resampled as timm resamples them."""
    vit = timm.create_model(
        "vit_tiny_patch16_224", pretrained=False, img_size=32, embed_dim=32, depth=2, num_heads=2, num_classes=5
    )
    save_file({name: value.contiguous() for name, value in vit.state_dict().items()}, tmp_path / "vit.safetensors")
    start = {"modules": {"encoder": str(tmp_path / "vit.safetensors")}}
    task = reader(start, image_size=(32, 96), in_channels=3, encoder={"patch_size": 16})
    task.setup("fit")
    state, timm_state = task.model.state_dict(), vit.state_dict()
    assert torch.equal(state["encoder.patch_embed.proj.weight"], timm_state["patch_embed.proj.weight"])
    assert torch.equal(state["encoder.encoder.layers.1.ffn.fc2.weight"], timm_state["blocks.1.mlp.fc2.weight"])
    expected = resample_abs_pos_embed(timm_state["pos_embed"][:, 1:], [2, 6], [2, 2], num_prefix_tokens=0)[0]
    torch.testing.assert_close(state["encoder.pos_embed.weight"], expected)
    assert not any(name.startswith("decoder.") for name in task.pretrained)


def test_a_position_table_of_the_same_grid_or_of_no_square_grid_is_left_as_it_is():
    config = ViTConfig(image_size=(16, 48), patch_size=(16, 4), in_channels=1, num_classes=0, d_model=16,
                       n_layers=1, n_heads=2, pool="mean")  # fmt: skip
    model = VisionTransformer(config)
    same = {"pos_embed.weight": torch.randn(12, 16)}
    assert resample_positions(model, same)["pos_embed.weight"] is same["pos_embed.weight"]
    odd = {"pos_embed.weight": torch.randn(7, 16)}  # 7 and 6 are not squares
    assert resample_positions(model, odd)["pos_embed.weight"] is odd["pos_embed.weight"]
    square = resample_positions(model, {"pos_embed.weight": torch.randn(1 + 9, 16)})  # a class token and 3 x 3
    assert square["pos_embed.weight"].shape == (12, 16)


# --- a start's tokenizer, whatever its kind, against the data's ----------------------------------------------------


def wordpiece_folder(folder, tokens: list[str]):
    """A BERT folder's tokenizer as ``transformers`` saves it (tokenizer.json, vocab.txt, ...): WordPiece."""
    import transformers

    vocab = {token: i for i, token in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *tokens])}
    transformers.BertTokenizerFast(vocab=vocab).save_pretrained(folder)
    return folder


def bpe_folder(folder, tokens: list[str], with_json: bool = True):
    """A GPT-2 or CLIP folder's byte-level BPE of ``tokens`` (no merges): its tokenizer.json, or only its vocab.json
    and merges.txt as older exports have them."""
    import json

    from tokenizers import Tokenizer as RawTokenizer
    from tokenizers import models

    folder.mkdir(parents=True, exist_ok=True)
    vocab = {token: i for i, token in enumerate(tokens)}
    if with_json:
        RawTokenizer(models.BPE(vocab, [])).save(str(folder / "tokenizer.json"))
    else:
        (folder / "vocab.json").write_text(json.dumps(vocab))
        (folder / "merges.txt").write_text("#version: 0.2\n")
    return folder


def start_refusal(folder, data: Tokenizer = TOKENIZER) -> str:
    from lightformer.io.checkpoints import check_start_tokenizer

    with pytest.raises(CheckpointError) as refused:
        check_start_tokenizer(str(folder), "model.init.checkpoint", data.to_str())
    return str(refused.value)


def test_a_hugging_face_folder_with_its_own_tokenizer_is_refused_naming_both(tmp_path):
    """Before: ``checkpoint_tokenizer`` returned None for any tokenizer.json lightformer could not parse, and the start
    loaded the folder's weights against the data's ids (BERT's WordPiece, GPT-2's characters in their own order, a
    CLIP BPE of the data's very size)."""
    characters = sorted(set(TEXT))
    bert = start_refusal(wordpiece_folder(tmp_path / "bert", ["the", "merely", *characters]))
    assert {path.name for path in (tmp_path / "bert").iterdir()} >= {"tokenizer.json"}
    assert f"model.init.checkpoint {tmp_path / 'bert'} was trained with another tokenizer than the data's" in bert
    size, file = 5 + 2 + len(characters), tmp_path / "bert" / "tokenizer.json"
    assert (f"WordPiece tokenizer of {size} tokens ({file}) vs char tokenizer of {TOKENIZER.vocab_size} tokens; "
            "id 0 is '[PAD]' in the first, '<pad>' in the second") in bert  # fmt: skip
    assert "lightformer's own tokenizers (char, bpe) only" in bert and "data.init_args.tokenizer.file" not in bert

    gpt2 = start_refusal(bpe_folder(tmp_path / "gpt2", list(reversed(TOKENIZER.vocabulary().tokens))))
    assert f"BPE tokenizer of {TOKENIZER.vocab_size} tokens ({tmp_path / 'gpt2' / 'tokenizer.json'})" in gpt2

    data = Tokenizer.train_bpe([TEXT * 3], vocab_size=300)
    clip = [f"<|{i}|>" for i in range(data.vocab_size)]  # the data's size, other tokens
    assert "BPE tokenizer of 300 tokens" in start_refusal(bpe_folder(tmp_path / "clip", clip), data)
    older = start_refusal(bpe_folder(tmp_path / "older", clip, with_json=False), data)
    assert f"({tmp_path / 'older' / 'vocab.json'})" in older


def test_a_folder_with_the_datas_tokenizer_starts_and_one_with_none_warns(tmp_path):
    from lightformer.io.checkpoints import check_start_tokenizer

    ours = tmp_path / "export"
    ours.mkdir()
    TOKENIZER.save(ours / "tokenizer.json")
    check_start_tokenizer(str(ours), "model.init.checkpoint", TOKENIZER.to_str())  # the same ids: no refusal
    other = Tokenizer.train_char([TEXT + "XYZ"])
    assert f"data.init_args.tokenizer.file={ours / 'tokenizer.json'}" in start_refusal(ours, other)
    with pytest.warns(UserWarning, match="holds no tokenizer .*cannot check that its token weights"):
        check_start_tokenizer(str(tmp_path), "model.init.checkpoint", TOKENIZER.to_str())
    (tmp_path / "vocab.txt").write_bytes(b"\xff\xfe")
    with pytest.raises(CheckpointError, match="vocab.txt cannot be read as a tokenizer"):
        check_start_tokenizer(str(tmp_path), "model.init.checkpoint", TOKENIZER.to_str())


def test_fit_from_a_gpt2_folder_with_its_own_tokenizer_is_refused_and_a_post_norm_bert_into_a_pre_norm_one(tmp_path):
    """The two silent starts as a user meets them. Before: a GPT-2 folder of 85 characters in its own order into the
    character LM: "loaded 53 tensors; nothing new; nothing dropped", trained (the data's "e" read the folder's row for
    another character); a post-norm BERT folder into configs/classify/austen_scratch.yaml as shipped (rotary,
    pre-norm): its weights loaded into the other function without a word."""
    import transformers

    from lightformer.cli.checks import take_shape_from_init_checkpoint
    from lightformer.cli.main import main
    from lightformer.models.bert import BertConfig
    from tiny_runs import task_args

    folder = tmp_path / "gpt2"
    config = transformers.GPT2Config(vocab_size=85, n_positions=16, n_embd=32, n_layer=1, n_head=2)
    transformers.GPT2LMHeadModel(config).save_pretrained(folder)
    bpe_folder(folder, [chr(c) for c in range(200, 285)])
    with pytest.raises(SystemExit) as refused:
        main(["fit", *task_args("lm", tmp_path / "run"), f"--model.init.checkpoint={folder}", "--trainer.max_steps=1"])
    message = str(refused.value.code)
    assert f"model.init.checkpoint {folder} was trained with another tokenizer than the data's" in message
    assert "BPE tokenizer of 85 tokens" in message and "own tokenizers (char, bpe) only" in message

    bert = tmp_path / "bert"
    shape = dict(vocab_size=40, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=48)
    transformers.BertModel(transformers.BertConfig(**shape)).save_pretrained(bert)
    from jsonargparse import Namespace

    net = Namespace({**BertConfig().__dict__, "norm_first": True, "position": "rope"})
    model = Namespace(class_path="lightformer.tasks.TextClassificationTask",
                      init_args=Namespace(net=net, init=Namespace(checkpoint=str(bert))))  # fmt: skip
    with pytest.raises(ConfigError, match=r"model.net.norm_first=True is given, but model.init.checkpoint .*bert was "
                                          r"trained with norm_first=False: .*Remove model.net.norm_first"):  # fmt: skip
        take_shape_from_init_checkpoint(model, given={"norm_first", "position", "n_layers"})
    take_shape_from_init_checkpoint(model, given={"n_layers"})  # the folder's kind taken where none is given
    assert (net.norm_first, net.position) == (False, "learned")


def test_another_librarys_tokenizer_as_the_datas_is_refused_saying_which_tokenizers_encode(tmp_path):
    """``data.tokenizer.file`` at a GPT-2 folder's tokenizer.json: refused saying what lightformer's data encodes
    with (it said only "'<pad>' has id None, expected 0")."""
    from lightformer.tokenization.text import Tokenizer

    bpe_folder(tmp_path, ["a", "b", "<|endoftext|>"])
    ours = "lightformer encodes data with its own tokenizers only, as a run or an export writes them"
    with pytest.raises(ValueError, match=rf"special token '<pad>' has id None, expected 0 .*{ours}"):
        Tokenizer.from_file(tmp_path / "tokenizer.json")
    wordpiece_folder(tmp_path / "bert", ["the"])
    with pytest.raises(ValueError, match="model type 'WordPiece' is not supported.*its own tokenizers only"):
        Tokenizer.from_file(tmp_path / "bert" / "tokenizer.json")
