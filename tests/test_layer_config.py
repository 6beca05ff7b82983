"""The layer's fields are declared once (``nn.LayerConfig``): every model config extends it with its own defaults and
declares none of them again, the joined model holds its towers' configs whole, and ``nn/`` wires no field by name."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import re
from pathlib import Path

import pytest

from lightformer.models.bert import BertConfig
from lightformer.models.gpt import GPTConfig
from lightformer.models.seq2seq import EncoderDecoderConfig
from lightformer.models.vision_text import VisionEncoderDecoderConfig
from lightformer.models.vit import ViTConfig
from lightformer.nn import EncoderLayer, LayerConfig

LAYER_FIELDS = {field.name for field in dataclasses.fields(LayerConfig)}
MODEL_CONFIGS = (GPTConfig, ViTConfig, BertConfig, EncoderDecoderConfig)
SRC = Path(__file__).resolve().parents[1] / "src" / "lightformer"

# Each model's layer defaults as they were at commit b1bd12e, when each config declared its own (GPT's attention
# dropout was its dropout: None takes dropout's rate; the fields a config lacked took the layer's defaults); the
# fields the layer gained since (``GAINED``: grouped-query attention, Mistral's window) keep every model as it was.
DEFAULTS = {
    GPTConfig: dict(d_model=384, n_heads=6, d_ff=None, dropout=0.0, attn_dropout=None, activation="gelu",
                    norm="layernorm", norm_first=True, norm_eps=1e-5, bias=True, qkv_bias=None),
    ViTConfig: dict(d_model=192, n_heads=3, d_ff=None, dropout=0.0, attn_dropout=0.0, activation="gelu",
                    norm="layernorm", norm_first=True, norm_eps=1e-6, bias=True, qkv_bias=True),
    BertConfig: dict(d_model=768, n_heads=12, d_ff=3072, dropout=0.1, attn_dropout=0.1, activation="gelu",
                     norm="layernorm", norm_first=False, norm_eps=1e-12, bias=True, qkv_bias=None),
    EncoderDecoderConfig: dict(d_model=512, n_heads=8, d_ff=2048, dropout=0.1, attn_dropout=0.0, activation="relu",
                               norm="layernorm", norm_first=False, norm_eps=1e-5, bias=True, qkv_bias=None),
}  # fmt: skip
GAINED = dict(n_kv_heads=None, sliding_window=None)
DEFAULTS = {config: defaults | GAINED for config, defaults in DEFAULTS.items()}


@pytest.mark.parametrize("config_class", MODEL_CONFIGS, ids=lambda c: c.__name__)
def test_no_model_config_declares_a_field_of_the_layer_again(config_class):
    assert issubclass(config_class, LayerConfig)
    own = set(config_class.__dict__.get("__annotations__", {}))
    assert not own & LAYER_FIELDS
    body = ast.parse(inspect.getsource(config_class)).body[0]
    declared = {node.target.id for node in body.body if isinstance(node, ast.AnnAssign)}
    assert declared == own and not declared & LAYER_FIELDS


@pytest.mark.parametrize("config_class", MODEL_CONFIGS, ids=lambda c: c.__name__)
def test_each_model_keeps_its_own_layer_defaults(config_class):
    config = config_class()
    assert {name: getattr(config, name) for name in LAYER_FIELDS} == DEFAULTS[config_class]


def test_the_joined_model_holds_its_towers_configs_whole_and_no_layer_field_of_its_own():
    hints = {field.name: field.type for field in dataclasses.fields(VisionEncoderDecoderConfig)}
    assert hints == {"encoder": "ViTConfig", "decoder": "GPTConfig", "ctc_head": "bool"}
    config = VisionEncoderDecoderConfig()
    assert isinstance(config.encoder, ViTConfig) and isinstance(config.decoder, GPTConfig)


def test_nn_wires_no_config_field_by_name():
    sources = {path.name: path.read_text(encoding="utf-8") for path in (SRC / "nn").glob("*.py")}
    assert sources
    for name, text in sources.items():
        assert not re.search(r"hasattr\((self\.)?(config|c)\b", text), name


def test_a_layer_takes_every_field_of_its_models_config():
    config = ViTConfig(d_model=24, n_heads=3, d_ff=40, dropout=0.2, attn_dropout=0.05, norm="rmsnorm", qkv_bias=False,
                       bias=True, norm_eps=1e-3)  # fmt: skip
    assert set(config.layer_args()) == LAYER_FIELDS
    layer = EncoderLayer(**config.layer_args())
    assert layer.self_attn.qkv.bias is None and layer.self_attn.proj.bias is not None
    assert (layer.dropout.p, layer.self_attn.dropout, layer.norm1.eps, layer.ffn.fc1.out_features) == (
        0.2,
        0.05,
        1e-3,
        40,
    )
    assert GPTConfig(dropout=0.3).layer_args()["attn_dropout"] == 0.3  # None: dropout's rate


def test_with_defaults_takes_only_the_layers_fields_and_leaves_layerconfig_as_it_is():
    with pytest.raises(TypeError, match=r"\['n_layers'\] are not fields of LayerConfig"):
        LayerConfig.with_defaults(n_layers=3)
    defaulted = LayerConfig.with_defaults(d_model=64, n_heads=4, dropout=0.0)
    assert defaulted().dropout == 0.0 and LayerConfig(d_model=64, n_heads=4).dropout == 0.1
    with pytest.raises(ValueError, match="d_model=64 is not divisible by n_heads=5"):
        defaulted(n_heads=5)
