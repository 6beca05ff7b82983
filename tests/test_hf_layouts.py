"""Hugging Face layouts (``lightformer.io.hf_layouts``): a checkpoint exported with ``export --layout hf`` loads with
``from_pretrained`` (nothing missing or unexpected) and gives the same logits and greedy tokens as lightformer's
model; a folder written by ``transformers`` starts a lightformer model with the same logits; a shape no layout fits is
refused by the field to change. Tiny models built from configs, no download."""

from __future__ import annotations

import json
from dataclasses import fields
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers
import yaml
from jsonargparse import Namespace
from PIL import Image

from lightformer.cli.checks import take_shape_from_init_checkpoint
from lightformer.cli.commands import export
from lightformer.cli.main import cli_main, main
from lightformer.errors import ConfigError
from lightformer.generation import generate
from lightformer.io.checkpoints import InitConfig, pretrained_weights
from lightformer.models.bert import BertConfig
from lightformer.models.gpt import GPT, GPTConfig
from lightformer.models.seq2seq import EncoderDecoderConfig
from lightformer.models.vit import ViTConfig
from lightformer.tasks import (
    ImageClassificationTask,
    LanguageModelTask,
    MaskedLanguageModelTask,
    TextClassificationTask,
    TranslationTask,
)
from lightformer.tokenization.text import MASK, Tokenizer
from tiny_runs import build, last_checkpoint, task_args

transformers.utils.logging.disable_progress_bar()
TEXT = "It is a truth universally acknowledged, that a single man in possession of a good fortune\n"
CHARS = Tokenizer.train_char([TEXT])
GPT2 = dict(position="learned", norm="layernorm", bias=True)
LLAMA = dict(position="rope", norm="rmsnorm", activation="swiglu", bias=False)


def task_checkpoint(
    tmp_path, task_class, net, facts: dict, callbacks: dict | None = None, spread: float = 0.0
) -> tuple[str, object]:
    """A run's checkpoint of ``task_class`` (facts, weights, a ModelCheckpoint's state), as ``fit`` writes one;
    ``spread``: noise of that scale added to every weight but the embeddings'."""
    torch.manual_seed(1)
    task = task_class(net=net, data_facts=facts).eval()
    with torch.no_grad():
        for name, parameter in task.model.named_parameters():
            parameter.add_(torch.randn_like(parameter) * (0.0 if "embed" in name else spread))
    path = tmp_path / "run.ckpt"
    checkpoint = {"state_dict": task.state_dict(), "hyper_parameters": dict(task.hparams), "global_step": 120,
                  "epoch": 3, "pytorch-lightning_version": "2.6.6", "callbacks": callbacks or {}}  # fmt: skip
    torch.save(checkpoint, path)
    return str(path), task


def lm_checkpoint(tmp_path, **net) -> tuple[str, LanguageModelTask]:
    facts = {"tokenizer": CHARS.to_str(), "vocab_size": CHARS.vocab_size, "pad_id": CHARS.pad_id}
    callbacks = {"ModelCheckpoint{'monitor': 'val/loss'}": {"monitor": "val/loss", "best_model_score": torch.tensor(
        1.234), "best_model_path": "runs/austen/best.ckpt", "current_score": torch.tensor(1.3)}}  # fmt: skip
    shape = dict(block_size=32, n_layers=2, n_heads=2, d_model=32) | net
    return task_checkpoint(tmp_path, LanguageModelTask, GPTConfig(**shape), facts, callbacks)


def load_quietly(auto_class, folder):
    """``auto_class.from_pretrained(folder)``, asserting it reports no missing, unexpected or resized weight."""
    model, info = auto_class.from_pretrained(folder, output_loading_info=True)
    assert not any(info[key] for key in ("missing_keys", "unexpected_keys", "mismatched_keys", "error_msgs")), info
    return model.eval()


GPT_SHAPES = {
    "gpt2-exact-gelu": GPT2 | dict(activation="gelu"),
    "gpt2-tanh-untied": GPT2 | dict(activation="gelu_tanh", tie_weights=False, d_ff=48),
    "llama": LLAMA,
    "llama-bias-untied": LLAMA | dict(bias=True, tie_weights=False, d_ff=40, norm_eps=1e-6),
}


@pytest.mark.parametrize("shape", GPT_SHAPES.values(), ids=GPT_SHAPES)
def test_a_gpt_exported_to_hf_gives_the_same_logits_and_greedy_tokens(tmp_path, shape):
    path, task = lm_checkpoint(tmp_path, **shape)
    export(ckpt_path=path, output=str(tmp_path / "hf"), layout="hf")
    model = load_quietly(transformers.AutoModelForCausalLM, tmp_path / "hf")
    expected = "LlamaForCausalLM" if shape["position"] == "rope" else "GPT2LMHeadModel"
    assert type(model).__name__ == expected
    ids = torch.tensor([CHARS.encode("It is a truth univ"), CHARS.encode("a single man in p")[:18] + [5]])
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, task.model(ids), atol=1e-5, rtol=0)
        prompt = ids[:1, :6]
        ours = generate(task.model, prompt, 20, temperature=0)
        theirs = model.generate(prompt, do_sample=False, max_new_tokens=20, eos_token_id=None)
    assert theirs.tolist() == ours.tolist()
    tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    assert tokenizer("It is a truth")["input_ids"] == CHARS.encode("It is a truth")
    assert tokenizer.decode(ours[0, 6:], skip_special_tokens=True) == CHARS.decode(ours[0, 6:])
    assert (tokenizer.bos_token, tokenizer.eos_token, tokenizer.pad_token) == ("<bos>", "<eos>", "<pad>")


def test_the_char_language_model_exported_generates_text_in_a_pipeline(tmp_path):
    path, _ = lm_checkpoint(tmp_path)
    export(ckpt_path=path, output=str(tmp_path / "hf"), layout="hf")
    generator = transformers.pipeline("text-generation", model=str(tmp_path / "hf"))
    text = generator("It is a", max_new_tokens=12, do_sample=False)[0]["generated_text"]
    assert text.startswith("It is a") and len(text) > len("It is a")
    card = (tmp_path / "hf" / "README.md").read_text()
    assert "LanguageModelTask" in card and "global step 120" in card and "best val/loss: 1.234" in card
    assert "from_pretrained" in card and '"n_layers": 2' in card
    generation = json.loads((tmp_path / "hf" / "generation_config.json").read_text())
    assert (generation["eos_token_id"], generation["temperature"]) == (CHARS.eos_id, 0.8)
    block_size = json.loads((tmp_path / "hf" / "config.json").read_text())["n_positions"]
    assert generation["max_length"] == block_size  # HF's GPT-2 cannot go past its positions: stop there by default
    longest = generator("It is a", do_sample=False, return_tensors=True)[0]["generated_token_ids"]
    assert len(longest) <= block_size


@pytest.mark.parametrize(
    ("shape", "field"),
    [(dict(norm="rmsnorm"), "model.net.norm"), (dict(position="sinusoidal"), "model.net.position"),
     (LLAMA | dict(activation="gelu"), "model.net.activation"), (GPT2 | dict(bias=False), "model.net.bias")],
)  # fmt: skip
def test_a_gpt_shape_no_layout_fits_is_refused_naming_the_field_and_the_layouts(tmp_path, shape, field):
    path, _ = lm_checkpoint(tmp_path, **shape)
    with pytest.raises(ConfigError) as refused:
        export(ckpt_path=path, output=str(tmp_path / "hf"), layout="hf")
    message = str(refused.value)
    assert field in message and "GPT2LMHeadModel" in message and "LlamaForCausalLM" in message, message
    assert not (tmp_path / "hf").exists()


def hf_causal_lm(kind: str) -> transformers.PreTrainedModel:
    torch.manual_seed(0)
    if kind == "gpt2":
        config = transformers.GPT2Config(vocab_size=50, n_positions=24, n_embd=32, n_layer=2, n_head=4,
                                         activation_function="gelu_new", bos_token_id=1, eos_token_id=2)  # fmt: skip
        return transformers.GPT2LMHeadModel(config).eval()
    config = transformers.LlamaConfig(vocab_size=50, hidden_size=32, intermediate_size=40, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=24,
                                      rms_norm_eps=1e-6, tie_word_embeddings=False, bos_token_id=1,
                                      eos_token_id=2)  # fmt: skip
    return transformers.LlamaForCausalLM(config).eval()


@pytest.mark.parametrize("kind", ["gpt2", "llama"])
def test_a_hf_causal_lm_folder_starts_a_lightformer_gpt_with_the_same_logits(tmp_path, kind):
    hf = hf_causal_lm(kind)
    hf.save_pretrained(tmp_path / "hf")
    net = Namespace(GPTConfig().__dict__)  # a fine-tuning config's model.net: the defaults, no field given
    model = Namespace(class_path="lightformer.tasks.LanguageModelTask",
                      init_args=Namespace(net=net, init=Namespace(checkpoint=str(tmp_path / "hf"))))  # fmt: skip
    take_shape_from_init_checkpoint(model, given=set())
    shape = {**net.as_dict(), "vocab_size": 50, "block_size": 24}
    assert (shape["n_heads"], shape["position"]) == (4, "learned" if kind == "gpt2" else "rope")
    ours = GPT(GPTConfig(**shape)).eval()
    ours.load_state_dict(pretrained_weights(str(tmp_path / "hf")), strict=True)
    ids = torch.randint(0, 50, (2, 24))
    with torch.no_grad():
        torch.testing.assert_close(ours(ids), hf(ids).logits, atol=1e-5, rtol=0)


def test_a_llama_folder_of_another_shape_is_refused_by_name(tmp_path):
    config = transformers.LlamaConfig(vocab_size=50, hidden_size=32, intermediate_size=40, num_hidden_layers=1,
                                      num_attention_heads=4, head_dim=16)  # fmt: skip
    transformers.LlamaForCausalLM(config).save_pretrained(tmp_path / "hf")
    with pytest.raises(ConfigError, match="head_dim=16"):
        pretrained_weights(str(tmp_path / "hf"))


MLM_CHARS = Tokenizer.train_char([TEXT], extra_special_tokens=[MASK])
BERT = dict(max_len=24, n_layers=2, n_heads=2, d_model=32, d_ff=48, dropout=0.0, attn_dropout=0.0)
TEXT_FACTS = {"tokenizer": MLM_CHARS.to_str(), "vocab_size": MLM_CHARS.vocab_size, "pad_id": MLM_CHARS.pad_id}


def bert_ids() -> tuple[torch.Tensor, torch.Tensor]:
    """A batch of two framed texts (the second padded) and their segment ids (a pair in the first)."""
    first = MLM_CHARS.encode("It is a", add_bos=True, add_eos=True) + MLM_CHARS.encode("truth", add_eos=True)
    second = MLM_CHARS.encode("a single man", add_bos=True, add_eos=True)
    ids = torch.full((2, len(first)), MLM_CHARS.pad_id)
    ids[0], ids[1, : len(second)] = torch.tensor(first), torch.tensor(second)
    segments = torch.zeros_like(ids)
    segments[0, 9:] = 1
    return ids, segments


@pytest.mark.parametrize("activation", ["gelu", "gelu_tanh"])
def test_a_bert_pretraining_run_exported_to_hf_gives_the_same_logits(tmp_path, activation):
    net = BertConfig(**BERT, activation=activation)
    path, task = task_checkpoint(tmp_path, MaskedLanguageModelTask, net, TEXT_FACTS)
    export(ckpt_path=path, output=str(tmp_path / "hf"), layout="hf")
    model = load_quietly(transformers.AutoModelForPreTraining, tmp_path / "hf")
    assert type(model).__name__ == "BertForPreTraining"
    ids, segments = bert_ids()
    with torch.no_grad():
        mlm, nsp = task.model(ids, segments)
        theirs = model(ids, token_type_ids=segments, attention_mask=ids != MLM_CHARS.pad_id)
    torch.testing.assert_close(theirs.prediction_logits, mlm, atol=1e-5, rtol=0)
    torch.testing.assert_close(theirs.seq_relationship_logits, nsp, atol=1e-5, rtol=0)
    tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    assert tokenizer("It is a", "truth")["input_ids"] == ids[0].tolist()
    assert tokenizer("It is a", "truth")["token_type_ids"] == segments[0].tolist()
    assert tokenizer.mask_token == MASK
    fill = transformers.pipeline("fill-mask", model=str(tmp_path / "hf"))
    assert len(fill(f"It is {MASK} truth")) == 5  # the mask found in the text, its five likeliest fillings


def test_a_text_classifier_exported_to_hf_keeps_its_labels_and_logits(tmp_path):
    facts = TEXT_FACTS | {"class_names": ["negative", "neutral", "positive"]}
    path, task = task_checkpoint(tmp_path, TextClassificationTask, BertConfig(**BERT), facts)
    export(ckpt_path=path, output=str(tmp_path / "hf"), layout="hf")
    model = load_quietly(transformers.AutoModelForSequenceClassification, tmp_path / "hf")
    assert model.config.id2label == {0: "negative", 1: "neutral", 2: "positive"}
    ids, segments = bert_ids()
    with torch.no_grad():
        theirs = model(ids, token_type_ids=segments, attention_mask=ids != MLM_CHARS.pad_id).logits
        torch.testing.assert_close(theirs, task.model(ids, segments), atol=1e-5, rtol=0)
    label = transformers.pipeline("text-classification", model=str(tmp_path / "hf"))("It is a truth")[0]["label"]
    assert label in ("negative", "neutral", "positive")


def test_a_bert_shape_hf_lacks_is_refused_by_name(tmp_path):
    path, _ = task_checkpoint(tmp_path, MaskedLanguageModelTask, BertConfig(**BERT, norm_first=True), TEXT_FACTS)
    with pytest.raises(ConfigError, match=r"model\.net\.norm_first.*BertForPreTraining"):
        export(ckpt_path=path, output=str(tmp_path / "hf"), layout="hf")


IMAGE_FACTS = {"class_names": ["shirt", "shoe", "bag"], "image_size": 16, "in_channels": 3,
               "normalize_mean": [0.5, 0.4, 0.3], "normalize_std": [0.2, 0.25, 0.3]}  # fmt: skip
VIT = dict(patch_size=4, d_model=32, n_layers=2, n_heads=2, d_ff=48)


@pytest.mark.parametrize("shape", [{}, dict(position="sincos", activation="gelu_tanh", qkv_bias=False)])
def test_a_vit_exported_to_hf_gives_the_same_logits_and_labels(tmp_path, shape):
    path, task = task_checkpoint(tmp_path, ImageClassificationTask, ViTConfig(**VIT, **shape), IMAGE_FACTS)
    export(ckpt_path=path, output=str(tmp_path / "hf"), layout="hf")
    model = load_quietly(transformers.AutoModelForImageClassification, tmp_path / "hf")
    assert model.config.id2label == {0: "shirt", 1: "shoe", 2: "bag"}
    images = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        torch.testing.assert_close(model(images).logits, task.model(images), atol=1e-5, rtol=0)
    processor = transformers.AutoImageProcessor.from_pretrained(tmp_path / "hf")
    assert list(processor.image_mean) == IMAGE_FACTS["normalize_mean"]


def test_a_grey_image_classifier_exported_to_hf_reads_rgb_as_luma_and_classifies_in_a_pipeline(tmp_path):
    """A grey model (Fashion-MNIST's) becomes an RGB ViT whose patch weights see the luma: on a grey image in RGB, the
    logits of the grey model; and the image-classification pipeline (which reads every image as RGB) runs."""
    facts = IMAGE_FACTS | {"in_channels": 1, "normalize_mean": [0.5], "normalize_std": [0.25]}
    path, task = task_checkpoint(tmp_path, ImageClassificationTask, ViTConfig(**VIT), facts)
    export(ckpt_path=path, output=str(tmp_path / "hf"), layout="hf")
    model = load_quietly(transformers.AutoModelForImageClassification, tmp_path / "hf")
    grey = torch.randn(2, 1, 16, 16)
    with torch.no_grad():
        torch.testing.assert_close(model(grey.expand(-1, 3, -1, -1)).logits, task.model(grey), atol=1e-5, rtol=0)
    Image.fromarray(np.arange(256, dtype=np.uint8).reshape(16, 16)).save(tmp_path / "grey.png")
    found = transformers.pipeline("image-classification", model=str(tmp_path / "hf"))(str(tmp_path / "grey.png"))
    assert {guess["label"] for guess in found} == {"shirt", "shoe", "bag"}


def test_a_vit_shape_hf_lacks_is_refused_by_name(tmp_path):
    path, _ = task_checkpoint(tmp_path, ImageClassificationTask, ViTConfig(**VIT, pool="mean"), IMAGE_FACTS)
    with pytest.raises(ConfigError, match=r"model\.net\.pool.*ViTForImageClassification"):
        export(ckpt_path=path, output=str(tmp_path / "hf"), layout="hf")


def hf_encoder(kind: str) -> transformers.PreTrainedModel:
    torch.manual_seed(0)
    if kind == "vit":
        config = transformers.ViTConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                        intermediate_size=48, image_size=16, patch_size=4, num_labels=3)  # fmt: skip
        return transformers.ViTForImageClassification(config).eval()
    config = transformers.BertConfig(vocab_size=MLM_CHARS.vocab_size, hidden_size=32, num_hidden_layers=2,
                                     num_attention_heads=2, intermediate_size=48, max_position_embeddings=24,
                                     num_labels=3)  # fmt: skip
    return (transformers.BertForPreTraining if kind == "bert" else transformers.BertForSequenceClassification)(
        config
    ).eval()


@pytest.mark.parametrize("kind", ["bert", "bert-classifier", "vit"])
def test_a_hf_encoder_folder_starts_a_lightformer_model_with_the_same_logits(tmp_path, kind):
    hf = hf_encoder(kind)
    hf.save_pretrained(tmp_path / "hf")
    task_class = {"bert": MaskedLanguageModelTask, "bert-classifier": TextClassificationTask,
                  "vit": ImageClassificationTask}[kind]  # fmt: skip
    net_class = ViTConfig if kind == "vit" else BertConfig
    net = Namespace({f.name: f.default for f in fields(net_class)})
    model = Namespace(class_path=f"{task_class.__module__}.{task_class.__name__}",
                      init_args=Namespace(net=net, init=Namespace(checkpoint=str(tmp_path / "hf"))))  # fmt: skip
    take_shape_from_init_checkpoint(model, given=set())
    facts = IMAGE_FACTS if kind == "vit" else TEXT_FACTS | {"class_names": ["a", "b", "c"]}
    torch.manual_seed(3)
    task = task_class(net=net.as_dict(), init=InitConfig(checkpoint=str(tmp_path / "hf")), data_facts=facts)
    weights = task.initial_weights(check=True)
    task.model.load_state_dict(weights, strict=True)
    task.eval()
    with torch.no_grad():
        if kind == "vit":
            images = torch.randn(2, 3, 16, 16)
            torch.testing.assert_close(task.model(images), hf(images).logits, atol=1e-5, rtol=0)
            return
        ids, segments = bert_ids()
        theirs = hf(ids, token_type_ids=segments, attention_mask=ids != MLM_CHARS.pad_id)
        if kind == "bert":
            mlm, nsp = task.model(ids, segments)
            torch.testing.assert_close(mlm, theirs.prediction_logits, atol=1e-5, rtol=0)
            torch.testing.assert_close(nsp, theirs.seq_relationship_logits, atol=1e-5, rtol=0)
        else:
            torch.testing.assert_close(task.model(ids, segments), theirs.logits, atol=1e-5, rtol=0)


TRANSLATOR = dict(max_len=24, n_encoder_layers=2, n_decoder_layers=2, d_model=32, n_heads=2, d_ff=48, dropout=0.0)
JOINT_FACTS = {"src_tokenizer": CHARS.to_str(), "tgt_tokenizer": CHARS.to_str(), "src_vocab_size": CHARS.vocab_size,
               "tgt_vocab_size": CHARS.vocab_size, "pad_id": CHARS.pad_id}  # fmt: skip


@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_a_translator_exported_to_marian_gives_the_same_logits_and_greedy_translations(tmp_path, activation):
    net = EncoderDecoderConfig(**TRANSLATOR, activation=activation)
    path, task = task_checkpoint(tmp_path, TranslationTask, net, JOINT_FACTS, spread=0.1)
    export(ckpt_path=path, output=str(tmp_path / "hf"), layout="hf")
    model = load_quietly(transformers.AutoModelForSeq2SeqLM, tmp_path / "hf")
    assert type(model).__name__ == "MarianMTModel"
    tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    batch = tokenizer(["It is a truth", "a man"], return_tensors="pt", padding=True)
    assert batch["input_ids"][1].tolist() == CHARS.encode("a man") + [CHARS.eos_id] + [CHARS.pad_id] * 8
    target = torch.tensor([[CHARS.bos_id, *CHARS.encode("a single")]] * 2)
    with torch.no_grad():
        theirs = model(**batch, decoder_input_ids=target).logits
        torch.testing.assert_close(theirs, task.model(batch["input_ids"], target), atol=1e-5, rtol=0)
        ours = task.decode_ids(batch["input_ids"], beam_size=1)  # up to max_len - 1 new tokens, without EOS
        generated = model.generate(**batch, num_beams=1, do_sample=False, max_length=TRANSLATOR["max_len"])
    assert tokenizer.batch_decode(generated, skip_special_tokens=True) == CHARS.decode_batch(ours)


def test_a_translator_shape_marian_lacks_is_refused_by_name(tmp_path):
    net = EncoderDecoderConfig(**TRANSLATOR, position="rope")
    path, _ = task_checkpoint(tmp_path, TranslationTask, net, JOINT_FACTS)
    with pytest.raises(ConfigError, match=r"model\.net\.position.*MarianMTModel"):
        export(ckpt_path=path, output=str(tmp_path / "hf"), layout="hf")


def test_a_trained_char_lm_exported_by_the_command_line_generates_in_a_pipeline(tmp_path):
    """The main job's kind of run (a char-level GPT on Austen): its checkpoint exported by ``lightformer export``, read
    by ``pipeline("text-generation")`` (the same greedy text as ``generate_text``), with its model card and config."""
    cli = build([*task_args("lm", tmp_path / "first"), "--trainer.max_steps=3", "--trainer.val_check_interval=3"])
    cli.trainer.fit(cli.model, cli.datamodule)
    folder = tmp_path / "austen_hf"
    main(["export", f"--ckpt_path={last_checkpoint(tmp_path / 'first')}", "--layout=hf", f"--output={folder}"])
    generator = transformers.pipeline("text-generation", model=str(folder))
    text = generator("It is a", max_new_tokens=8, do_sample=False)[0]["generated_text"]
    assert text == "It is a" + cli.model.eval().generate_text("It is a", max_new_tokens=8, temperature=0)[0]
    card = (folder / "README.md").read_text()
    assert "best val/loss: " in card and "global step 3" in card and "lightformer_config.yaml" in card
    assert "class_path: lightformer.tasks.LanguageModelTask" in (folder / "lightformer_config.yaml").read_text()


def test_a_fit_of_a_fine_tuning_config_starts_from_an_exported_folder_in_its_shape(tmp_path):
    """``fit`` with ``model.init.checkpoint=DIR`` (a folder ``export --layout hf`` wrote) and a config without
    ``model.net``: the model takes the folder's shape and every weight of it."""
    first = build([*task_args("lm", tmp_path / "first"), "--trainer.max_steps=2"])
    first.trainer.fit(first.model, first.datamodule)
    folder = tmp_path / "austen_hf"
    export(ckpt_path=last_checkpoint(tmp_path / "first"), output=str(folder), layout="hf")
    fine_tuning = yaml.safe_load(Path("configs/lm/austen_char.yaml").read_text())
    del fine_tuning["model"]["init_args"]["net"]  # a fine-tuning config: the shape is the start's
    (tmp_path / "fine_tuning.yaml").write_text(yaml.safe_dump(fine_tuning))
    args = [f"--config={tmp_path / 'fine_tuning.yaml'}" if arg.startswith("--config=") else arg
            for arg in task_args("lm", tmp_path / "second") if not arg.startswith("--model.net.")]  # fmt: skip
    started = cli_main(["fit", *args, f"--model.init.checkpoint={folder}", "--trainer.max_steps=1"])
    shape = ("n_layers", "d_model", "n_heads", "block_size", "vocab_size")
    shapes = [[getattr(run.model.model.config, name) for name in shape] for run in (started, first)]
    assert shapes[0] == shapes[1]
    assert started.model.pretrained == set(first.model.model.state_dict())


def test_a_marian_folder_starts_a_lightformer_translator_with_the_same_logits(tmp_path):
    torch.manual_seed(0)
    config = transformers.MarianConfig(vocab_size=CHARS.vocab_size, decoder_vocab_size=CHARS.vocab_size, d_model=32,
                                       encoder_layers=2, decoder_layers=1, encoder_attention_heads=2,
                                       decoder_attention_heads=2, encoder_ffn_dim=48, decoder_ffn_dim=48,
                                       activation_function="gelu", max_position_embeddings=24, scale_embedding=True,
                                       pad_token_id=CHARS.pad_id, decoder_start_token_id=CHARS.bos_id)  # fmt: skip
    hf = transformers.MarianMTModel(config).eval()
    hf.save_pretrained(tmp_path / "hf")
    net = Namespace({f.name: f.default for f in fields(EncoderDecoderConfig) if f.name != "tie_output"})
    model = Namespace(class_path="lightformer.tasks.TranslationTask",
                      init_args=Namespace(net=net, init=Namespace(checkpoint=str(tmp_path / "hf"))))  # fmt: skip
    take_shape_from_init_checkpoint(model, given=set())
    task = TranslationTask(net=net.as_dict(), init=InitConfig(checkpoint=str(tmp_path / "hf")), data_facts=JOINT_FACTS)
    task.model.load_state_dict(task.initial_weights(check=True), strict=True)
    task.eval()
    src = torch.tensor([CHARS.encode("It is a truth") + [CHARS.eos_id], CHARS.encode("a single man ") + [0]])
    tgt = torch.tensor([[CHARS.bos_id, *CHARS.encode("a man")]] * 2)
    with torch.no_grad():
        theirs = hf(src, attention_mask=src != CHARS.pad_id, decoder_input_ids=tgt).logits
        torch.testing.assert_close(task.model(src, tgt), theirs, atol=1e-5, rtol=0)


def test_an_hf_export_writes_only_a_new_or_empty_folder(tmp_path):
    path, _ = lm_checkpoint(tmp_path)
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "notes.txt").write_text("mine")
    with pytest.raises(ConfigError, match="not empty"):
        export(ckpt_path=path, output=str(tmp_path / "taken"), layout="hf")
    with pytest.raises(ConfigError, match="is a file"):
        export(ckpt_path=path, output=str(tmp_path / "taken" / "notes.txt"), layout="hf")
    (tmp_path / "empty").mkdir()
    export(ckpt_path=path, output=str(tmp_path / "empty"), layout="hf")
    assert (tmp_path / "empty" / "model.safetensors").is_file() and not (tmp_path / "empty.partial").exists()


def test_exported_weights_have_the_mode_of_the_folders_other_files(tmp_path):
    """``safetensors`` writes its files 0600 whatever the umask: the weights of an export (an HF folder's and a plain
    file) take the mode every other file gets under the process's umask, so whoever reads the folder reads them."""
    import os

    path, _ = lm_checkpoint(tmp_path)
    previous = os.umask(0o022)
    try:
        export(ckpt_path=path, output=str(tmp_path / "hf"), layout="hf")
        export(ckpt_path=path, output=str(tmp_path / "plain" / "model.safetensors"))
    finally:
        os.umask(previous)
    modes = {file.name: oct(file.stat().st_mode & 0o777) for file in (tmp_path / "hf").iterdir()}
    assert modes["model.safetensors"] == modes["config.json"] == "0o644", modes
    assert set(modes.values()) == {"0o644"}, modes
    assert oct((tmp_path / "plain" / "model.safetensors").stat().st_mode & 0o777) == "0o644"


def test_the_layouts_and_the_checkpoints_sit_below_the_tasks():
    """The tasks import the layouts they declare; no layout, nor the checkpoint code that reads a Hugging Face folder,
    reaches a task by any import, ``TYPE_CHECKING`` ones included (the circle checkpoints → hf_layouts → tasks.base →
    … → checkpoints is gone)."""
    import test_imports

    graph = test_imports.import_graph(test_imports.PACKAGE)
    layouts = [name for name in graph if name.startswith("lightformer.io.layouts.")]
    assert len(layouts) == 6  # gpt, bert, vit, marian, clip, llava
    for start in ["lightformer.io.hf_layouts", "lightformer.io.checkpoints", "lightformer.registry", *layouts]:
        reached, stack = set(), [start]
        while stack:
            for target in graph[stack.pop()] - reached:
                reached.add(target)
                stack.append(target)
        assert not {name for name in reached if name.startswith("lightformer.tasks")}, start
