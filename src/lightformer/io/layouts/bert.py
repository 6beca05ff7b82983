"""BERT's Hugging Face layouts: pre-training (masked LM + NSP) → ``BertForPreTraining``, the text classifier →
``BertForSequenceClassification`` (post-norm, learned positions); BERT folders read back (``BERT_READERS``, the
classifier's head too). The tokenizer frames a text (or a pair) as the data does: [BOS] A [EOS] (B [EOS]), BERT's
[CLS] and [SEP] being BOS and EOS.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor

from lightformer.errors import ConfigError
from lightformer.io.hf_layouts import (
    FROM_HF_ACTIVATIONS,
    HF_ACTIVATIONS,
    HFModel,
    fast_tokenizer,
    hf_activation,
    hf_layout,
    misfits,
    refuse_shape,
)
from lightformer.models.bert import BertConfig, bert_state_dict_to_lightformer
from lightformer.registry import HFReader

HF_CLASSES = {"bert": "BertForPreTraining / BertForSequenceClassification"}

BERT_LAYOUTS = {"bert": {"position": ("learned",), "norm_first": (False,), "activation": tuple(HF_ACTIVATIONS)}}
_BERT_TOP = {"bert.embed": "bert.embeddings.word_embeddings", "bert.position": "bert.embeddings.position_embeddings",
             "bert.segment": "bert.embeddings.token_type_embeddings", "bert.embed_norm": "bert.embeddings.LayerNorm",
             "pooler.dense": "bert.pooler.dense", "mlm_head.dense": "cls.predictions.transform.dense",
             "mlm_head.norm": "cls.predictions.transform.LayerNorm", "mlm_head.decoder": "cls.predictions.decoder",
             "nsp_head": "cls.seq_relationship", "classifier": "classifier"}  # fmt: skip
_BERT_LAYER = {"self_attn.proj": "attention.output.dense", "norm1": "attention.output.LayerNorm",
               "ffn.fc1": "intermediate.dense", "ffn.fc2": "output.dense", "norm2": "output.LayerNorm"}  # fmt: skip


def bert_hf_config(config: Any, num_labels: int | None = None, class_names: list[str] | None = None) -> Any:
    """The ``transformers.BertConfig`` of our ``BertConfig`` (post-norm, learned positions only)."""
    from transformers import BertConfig as HFBertConfig

    c = config
    for name, needs in BERT_LAYOUTS.items():
        if misfits(c, needs):
            refuse_shape("BERT", c, {name: needs}, HF_CLASSES)
    names = list(class_names or [])
    labels = {"id2label": dict(enumerate(names)), "label2id": {n: i for i, n in enumerate(names)}}
    return HFBertConfig(
        vocab_size=c.vocab_size, hidden_size=c.d_model, num_hidden_layers=c.n_layers, num_attention_heads=c.n_heads,
        intermediate_size=c.d_ff or 4 * c.d_model, hidden_act=HF_ACTIVATIONS[c.activation],
        hidden_dropout_prob=c.dropout, attention_probs_dropout_prob=c.attention_dropout,
        max_position_embeddings=c.max_len,
        type_vocab_size=c.type_vocab_size, layer_norm_eps=c.norm_eps, pad_token_id=c.pad_id,
        classifier_dropout=c.classifier_dropout, tie_word_embeddings=True,
        **(labels if class_names else {"num_labels": num_labels or 2}),
    )  # fmt: skip


def bert_to_hf(state: dict[str, Tensor]) -> dict[str, Tensor]:
    """Our ``BertForPreTraining`` / ``BertForSequenceClassification`` state dict → HF's names (q, k, v apart)."""
    out = {}
    for name, value in state.items():
        module, _, leaf = name.rpartition(".")
        if module.startswith("bert.encoder.layers."):
            index, _, rest = module.removeprefix("bert.encoder.layers.").partition(".")
            prefix = f"bert.encoder.layer.{index}"
            if rest == "self_attn.qkv":
                for part, tensor in zip(("query", "key", "value"), value.chunk(3), strict=True):
                    out[f"{prefix}.attention.self.{part}.{leaf}"] = tensor.contiguous()
            else:
                out[f"{prefix}.{_BERT_LAYER[rest]}.{leaf}"] = value
        elif name == "mlm_head.bias":  # HF keeps the decoder's bias twice: the head's and the decoder's
            out["cls.predictions.bias"] = out["cls.predictions.decoder.bias"] = value
        else:
            out[f"{_BERT_TOP[module]}.{leaf}"] = value
    return out


def bert_net_from_hf(config: dict) -> dict[str, Any]:
    """Our ``BertConfig`` fields of a BERT ``config.json``."""
    activation = hf_activation(config, "BERT")
    if config.get("position_embedding_type", "absolute") != "absolute":
        raise ConfigError(f"BERT position_embedding_type={config['position_embedding_type']!r} has no lightformer "
                          "counterpart (lightformer's BERT has absolute learned positions or rope)")  # fmt: skip
    return dict(vocab_size=config["vocab_size"], max_len=config.get("max_position_embeddings", 512),
                type_vocab_size=config.get("type_vocab_size", 2), n_layers=config["num_hidden_layers"],
                n_heads=config["num_attention_heads"], d_model=config["hidden_size"],
                d_ff=config.get("intermediate_size"), dropout=config.get("hidden_dropout_prob", 0.1),
                attn_dropout=config.get("attention_probs_dropout_prob", 0.1),
                activation=FROM_HF_ACTIVATIONS[activation], norm_first=False, position="learned",
                norm_eps=config.get("layer_norm_eps", 1e-12), pad_id=config.get("pad_token_id") or 0,
                num_classes=len(config.get("id2label") or {0: 0, 1: 1}),
                classifier_dropout=config.get("classifier_dropout"))  # fmt: skip


def _import_bert(weights: dict[str, Tensor], config: dict) -> dict[str, Tensor]:
    head = {name: weights.pop(name) for name in list(weights) if name.startswith("classifier.")}
    return bert_state_dict_to_lightformer(weights) | head


def bert_frame(raw: Any, tokenizer: Any) -> dict[str, Any]:
    """BERT's roles of our special tokens, and its framing of a text or a pair (``fast_tokenizer``'s ``frame``)."""
    from tokenizers import processors

    from lightformer.tokenization.text import BOS, EOS, MASK

    roles: dict[str, Any] = dict(cls_token=BOS, sep_token=EOS,
                                 model_input_names=["input_ids", "token_type_ids", "attention_mask"])  # fmt: skip
    if raw.token_to_id(MASK) is not None:
        roles["mask_token"] = MASK
    # As the data frames a text (or a pair): [BOS] A [EOS] (B [EOS]), B in segment 1.
    raw.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A {EOS}", pair=f"{BOS} $A {EOS} $B:1 {EOS}:1",
        special_tokens=[(BOS, tokenizer.bos_id), (EOS, tokenizer.eos_id)],
    )  # fmt: skip
    return roles


def pretraining(task: Any) -> HFModel:
    """A masked language model's ``BertForPreTraining``."""
    from transformers import BertForPreTraining

    model = BertForPreTraining(bert_hf_config(task.model.config))
    usage = (
        "from transformers import AutoModelForPreTraining, pipeline\n\n"
        'model = AutoModelForPreTraining.from_pretrained("DIR")  # masked LM + next sentence\n'
        'fill = pipeline("fill-mask", model="DIR")\n'
        'print(fill(f"Her {fill.tokenizer.mask_token} was very kind."))'
    )
    return HFModel(model, bert_to_hf(task.model.state_dict()), usage, fast_tokenizer(task.tokenizer, bert_frame))


def classifier(task: Any) -> HFModel:
    """A text classifier's ``BertForSequenceClassification``, its labels the data's class names."""
    from transformers import BertForSequenceClassification

    c = task.model.config
    model = BertForSequenceClassification(bert_hf_config(c, c.num_classes, task.class_names))
    usage = (
        "from transformers import AutoModelForSequenceClassification, pipeline\n\n"
        'model = AutoModelForSequenceClassification.from_pretrained("DIR")\n'
        'print(pipeline("text-classification", model="DIR")("A truth universally acknowledged."))'
    )
    return HFModel(model, bert_to_hf(task.model.state_dict()), usage, fast_tokenizer(task.tokenizer, bert_frame))


BERT_READERS = {"bert": HFReader(BertConfig, bert_net_from_hf, _import_bert)}
PRETRAINING_HF = hf_layout(pretraining, "masked language models (BERT)", BERT_READERS)
CLASSIFIER_HF = hf_layout(classifier, "text classification (BERT)", BERT_READERS)
