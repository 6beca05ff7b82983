"""Hugging Face layouts (``lightformer.hf_layouts``): a checkpoint exported with ``export --layout hf`` loads with
``from_pretrained`` (nothing missing or unexpected) and gives the same logits and greedy tokens as lightformer's
model; a folder written by ``transformers`` starts a lightformer model with the same logits; a shape no layout fits is
refused by the field to change. Tiny models built from configs, no download."""

from __future__ import annotations

import json

import pytest
import torch
import transformers
from jsonargparse import Namespace

from lightformer.checkpoints import pretrained_weights
from lightformer.commands import export
from lightformer.config_checks import take_shape_from_init_checkpoint
from lightformer.data.preparation.tokenizers import Tokenizer
from lightformer.errors import ConfigError
from lightformer.generation import generate
from lightformer.models.gpt import GPT, GPTConfig
from lightformer.tasks import LanguageModelTask

transformers.utils.logging.disable_progress_bar()
TEXT = "It is a truth universally acknowledged, that a single man in possession of a good fortune\n"
CHARS = Tokenizer.train_char([TEXT])
GPT2 = dict(position="learned", norm="layernorm", bias=True)
LLAMA = dict(position="rope", norm="rmsnorm", activation="swiglu", bias=False)


def task_checkpoint(tmp_path, task_class, net, facts: dict, callbacks: dict | None = None) -> tuple[str, object]:
    """A run's checkpoint of ``task_class`` (facts, weights, a ModelCheckpoint's state), as ``fit`` writes one."""
    torch.manual_seed(1)
    task = task_class(net=net, data_facts=facts).eval()
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
                                      num_attention_heads=4, num_key_value_heads=2)  # fmt: skip
    transformers.LlamaForCausalLM(config).save_pretrained(tmp_path / "hf")
    with pytest.raises(ConfigError, match="num_key_value_heads=2"):
        pretrained_weights(str(tmp_path / "hf"))
