"""Today's open decoders, both ways, against transformers' own implementation (random weights: no download): folders in
the shapes of SmolLM2 (grouped-query attention, tied, rotary base 1e5), Qwen2 (grouped-query, biases on q/k/v alone,
tied, 1e6), Llama 3.2 (grouped-query, Llama 3's rotary scaling, 5e5) and Mistral (multi-query, a sliding window of 8
positions, shorter than the 40 compared) start a lightformer GPT with the same logits and the same greedy tokens
through the KV cache; our GPTs of those shapes export to the class of their shape and read back in transformers; what
we cannot honour is refused by name."""

from __future__ import annotations

import pytest
import torch
import transformers
from jsonargparse import Namespace

from lightformer.cli.checks import take_shape_from_init_checkpoint
from lightformer.cli.commands import export
from lightformer.errors import ConfigError
from lightformer.generation import generate
from lightformer.io.checkpoints import pretrained_weights
from lightformer.models.gpt import GPT, GPTConfig
from lightformer.nn import RopeScaling
from test_hf_layouts import CHARS, LLAMA, lm_checkpoint, load_quietly

SMALL = dict(vocab_size=64, hidden_size=48, intermediate_size=64, num_hidden_layers=2, num_attention_heads=6,
             max_position_embeddings=40, rms_norm_eps=1e-5, bos_token_id=1, eos_token_id=2)  # fmt: skip
LLAMA3_ROPE = {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 16}  # fmt: skip
FOLDERS = {
    "smollm2": (transformers.LlamaConfig, dict(num_key_value_heads=2, tie_word_embeddings=True,
                                               rope_parameters={"rope_type": "default", "rope_theta": 1e5})),
    "qwen2": (transformers.Qwen2Config, dict(num_key_value_heads=2, tie_word_embeddings=True,
                                             rope_parameters={"rope_type": "default", "rope_theta": 1e6})),
    "llama3.2": (transformers.LlamaConfig, dict(num_key_value_heads=3, tie_word_embeddings=False,
                                                rope_parameters=LLAMA3_ROPE | {"rope_theta": 5e5})),
    "mistral": (transformers.MistralConfig, dict(num_key_value_heads=1, tie_word_embeddings=False, sliding_window=8,
                                                 rope_parameters={"rope_type": "default", "rope_theta": 1e6})),
}  # fmt: skip
CLASSES = {"smollm2": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "llama3.2": "LlamaForCausalLM",
           "mistral": "MistralForCausalLM"}  # fmt: skip


def hf_folder(tmp_path, name: str):
    """A transformers model of ``name``'s shape with random weights, saved as a folder; the model."""
    config_class, shape = FOLDERS[name]
    torch.manual_seed(0)
    model = getattr(transformers, CLASSES[name])(config_class(**SMALL, **shape)).eval()
    with torch.no_grad():  # biases of N(0, 0.02), not zeros: a bias copied to the wrong place shows
        for parameter_name, parameter in model.named_parameters():
            if parameter_name.endswith("bias"):
                parameter.normal_(0, 0.02)
    model.save_pretrained(tmp_path / "hf")
    return model


def lightformer_gpt(folder) -> GPT:
    """Our GPT as ``model.init.checkpoint=FOLDER`` starts it: its shape from the folder's config, its weights."""
    net = Namespace(GPTConfig().__dict__)  # a fine-tuning config's model.net: the defaults, no field given
    model = Namespace(class_path="lightformer.tasks.LanguageModelTask",
                      init_args=Namespace(net=net, init=Namespace(checkpoint=str(folder))))  # fmt: skip
    take_shape_from_init_checkpoint(model, given=set())
    shape = {**net.as_dict(), "vocab_size": SMALL["vocab_size"], "block_size": SMALL["max_position_embeddings"]}
    gpt = GPT(GPTConfig(**shape)).eval()
    gpt.load_state_dict(pretrained_weights(str(folder)), strict=True)
    return gpt


@pytest.mark.parametrize("name", FOLDERS)
def test_a_folder_of_todays_decoders_starts_a_gpt_with_its_logits_and_greedy_tokens(tmp_path, name):
    hf = hf_folder(tmp_path, name)
    ours = lightformer_gpt(tmp_path / "hf")
    expected = FOLDERS[name][1]
    assert ours.config.n_kv_heads == expected["num_key_value_heads"]
    assert ours.config.rope_theta == expected["rope_parameters"]["rope_theta"]
    assert ours.config.tie_weights == expected["tie_word_embeddings"]
    assert ours.config.sliding_window == expected.get("sliding_window")
    ids = torch.randint(3, SMALL["vocab_size"], (2, 40), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(ours(ids), hf(ids).logits, atol=1e-4, rtol=0)
        prompt = ids[:1, :5]
        mine = generate(ours, prompt, 30, temperature=0)  # through the KV cache, past original_max_positions
        theirs = hf.generate(prompt, do_sample=False, max_new_tokens=30, eos_token_id=None, pad_token_id=0)
    assert mine.tolist() == theirs.tolist()


QWEN2 = LLAMA | dict(qkv_bias=True, n_kv_heads=2, rope_theta=1e6)
GPT_SHAPES = {
    "llama-gqa-llama3-rope": (LLAMA | dict(n_kv_heads=2, rope_theta=5e5, tie_weights=False,
                                           rope_scaling=RopeScaling("llama3", 8.0, 1.0, 4.0, 8)), "LlamaForCausalLM"),
    "llama-mqa-linear-rope": (LLAMA | dict(n_kv_heads=1, rope_scaling=RopeScaling("linear", 2.0)), "LlamaForCausalLM"),
    "qwen2": (QWEN2, "Qwen2ForCausalLM"),
    "mistral": (LLAMA | dict(n_kv_heads=2, sliding_window=6, tie_weights=False), "MistralForCausalLM"),
}  # fmt: skip


@pytest.mark.parametrize("shape", GPT_SHAPES, ids=GPT_SHAPES)
def test_a_gpt_of_todays_shapes_exports_to_its_class_and_reads_back(tmp_path, shape):
    net, expected = GPT_SHAPES[shape]
    path, task = lm_checkpoint(tmp_path, **net | dict(n_heads=4))
    export(ckpt_path=path, output=str(tmp_path / "hf"), layout="hf")
    model = load_quietly(transformers.AutoModelForCausalLM, tmp_path / "hf")
    assert type(model).__name__ == expected
    ids = torch.tensor([CHARS.encode("It is a truth univ"), CHARS.encode("a single man in p")[:18] + [5]])
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, task.model(ids), atol=1e-4, rtol=0)
    back = GPT(task.model.config).eval()
    back.load_state_dict(pretrained_weights(str(tmp_path / "hf")), strict=True)  # the folder reads back
    with torch.no_grad():
        torch.testing.assert_close(back(ids), task.model(ids), atol=1e-5, rtol=0)


@pytest.mark.parametrize(
    ("config_class", "shape", "field"),
    [(transformers.Qwen2Config, dict(use_sliding_window=True, sliding_window=8), "use_sliding_window=true"),
     (transformers.LlamaConfig, dict(rope_parameters={"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e4}),
      "rope_type='yarn'"),
     (transformers.LlamaConfig, dict(head_dim=16), "head_dim=16"),
     (transformers.LlamaConfig, dict(num_key_value_heads=4), "num_key_value_heads=4")],
)  # fmt: skip
def test_a_decoder_folder_we_cannot_honour_is_refused_naming_the_field(tmp_path, config_class, shape, field):
    config = config_class(**SMALL | shape)
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path / "hf")
    with pytest.raises(ConfigError, match=field.replace("[", r"\[")):
        pretrained_weights(str(tmp_path / "hf"))


def test_grouped_query_attention_refuses_heads_it_cannot_share_and_rotary_options_off_rotary_positions():
    with pytest.raises(ValueError, match="n_kv_heads=4 must divide n_heads=6"):
        GPTConfig(vocab_size=8, n_heads=6, d_model=48, n_kv_heads=4)
    with pytest.raises(ValueError, match="rope_theta and rope_scaling are for rotary positions; position='learned'"):
        GPTConfig(vocab_size=8, rope_theta=5e5)
    with pytest.raises(ValueError, match="sliding_window=4 is for causal attention; this GPT attends both ways"):
        GPT(GPTConfig(vocab_size=8, n_heads=2, d_model=16, sliding_window=4), causal=False)
    from lightformer.models.bert import BertConfig

    with pytest.raises(ValueError, match="n_kv_heads=2 is not valid for BertConfig; valid: None"):
        BertConfig(vocab_size=8, n_heads=4, d_model=32, n_kv_heads=2)
