"""BERT (Devlin et al. 2018): an encoder-only text model assembled from the shared blocks, with its pre-training
heads (masked-LM and next-sentence prediction), a sequence classifier for fine-tuning, and an import of Hugging
Face ``BertForPreTraining`` / ``BertForMaskedLM`` weights. Token, position and segment embeddings are summed and
normalised, then a post-norm encoder stack (pre-norm as an option) reads them with padding masked out of attention.
Parameter names are shared by the wrappers (``bert.*`` for the encoder, ``pooler.*`` for the pooler), so a
classifier fine-tunes from a pre-training checkpoint by loading the names that match.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar, Literal, get_args

import torch
from torch import Tensor, nn

from lightformer.nn import (
    Dropout,
    Encoder,
    EncoderLayer,
    LayerConfig,
    LearnedPositionalEmbedding,
    PointwiseActivation,
    RotaryEmbedding,
    TokenEmbedding,
    pointwise_activation,
)
from lightformer.nn.checks import check_at_least, check_choice, check_fraction, check_set

# BERT's activations are the pointwise ones (``nn.PointwiseActivation``): each serves the feed-forward networks and
# the masked-LM head's transform, which needs a pointwise function (so not SwiGLU). HF's "gelu" is the exact erf
# GELU, its "gelu_new" our "gelu_tanh".
BertPosition = Literal["learned", "rope"]  # the positions BERT offers, a subset of ``nn.PositionKind``


@dataclass(frozen=True)
class BertConfig(
    LayerConfig.with_defaults(
        d_model=768,
        n_heads=12,
        d_ff=3072,
        dropout=0.1,
        attn_dropout=0.1,
        activation="gelu",
        norm_first=False,
        norm_eps=1e-12,
    )  # fmt: skip
):
    """The shape of a BERT encoder: every hyperparameter and its default, declared once.

    Defaults are BERT-base: 12 post-norm layers, d_model 768, 12 heads, d_ff 3072, exact GELU, dropout 0.1,
    LayerNorm epsilon 1e-12, 512 learned positions, 2 segments.

    The layer's fields are ``nn.LayerConfig``'s, with these defaults; in HF's names ``d_model`` is hidden_size,
    ``d_ff`` intermediate_size, ``dropout`` hidden_dropout_prob (also on the normalised embeddings),
    ``attn_dropout`` attention_probs_dropout_prob, ``norm_eps`` layer_norm_eps. ``activation`` is one of the
    pointwise ones (``nn.PointwiseActivation``: "gelu" exact, HF's "gelu"; "gelu_tanh", HF's "gelu_new"; "relu"),
    used by the feed-forward networks and by the masked-LM head's transform. ``norm_first`` true is pre-norm with a
    final norm after the stack (the embedding sum is normalised either way). BERT's norms are LayerNorms and its
    linear layers have biases (``norm``, ``bias`` and ``qkv_bias`` stay as they are).

    Args:
        vocab_size: token ids 0..vocab_size-1 (a task fills it from the data's tokenizer).
        max_len: the longest sequence, the size of the learned position table (HF's max_position_embeddings).
        type_vocab_size: segment ids 0..type_vocab_size-1 (0 = sentence A, 1 = sentence B; HF's type_vocab_size).
        n_layers: encoder layers.
        position: "learned" absolute positions (BERT's table, HF's position_embeddings) or "rope" (rotary
            embeddings in every attention layer, RoFormer's: the score of two tokens depends on their distance,
            which a small model trained briefly learns much sooner than from a table).
        pad_id: the padding id: masked out of attention as a key, and its embedding row starts at zero and gets no
            gradient from the input side (as HF's padding_idx); filled from the data's facts.
        num_classes: outputs of ``BertForSequenceClassification``'s classifier (HF's num_labels); filled from the
            data's facts of a classification run, unused by pre-training.
        classifier_dropout: dropout on the pooled state before that classifier; None: ``dropout`` (as HF).
    """

    vocab_size: int | None = None
    max_len: int = 512
    type_vocab_size: int = 2
    n_layers: int = 12
    position: BertPosition = "learned"
    pad_id: int = 0
    num_classes: int = 2
    classifier_dropout: float | None = None
    supported: ClassVar[Mapping[str, tuple]] = {
        "activation": get_args(PointwiseActivation),
        "norm": ("layernorm",),
        "bias": (True,),
        "qkv_bias": (None,),
        "n_kv_heads": (None,),
        "sliding_window": (None,),
    }

    def __post_init__(self) -> None:
        super().__post_init__()
        check_at_least("vocab_size", self.vocab_size, 1)
        check_at_least("max_len", self.max_len, 1)
        check_at_least("type_vocab_size", self.type_vocab_size, 1)
        check_at_least("n_layers", self.n_layers, 1)
        check_choice("position", self.position, get_args(BertPosition))
        check_at_least("pad_id", self.pad_id, 0)
        check_at_least("num_classes", self.num_classes, 1)
        if self.classifier_dropout is not None:
            check_fraction("classifier_dropout", self.classifier_dropout)
        if self.vocab_size is not None and self.pad_id >= self.vocab_size:
            raise ValueError(
                f"pad_id={self.pad_id} is not a token id of vocab_size={self.vocab_size}: "
                f"use the tokenizer's padding id, below {self.vocab_size}"
            )


def _init_linear(module: nn.Linear) -> None:
    """BERT's init of a dense layer: weight N(0, 0.02), bias zero."""
    nn.init.normal_(module.weight, std=0.02)
    if module.bias is not None:
        nn.init.zeros_(module.bias)


class BertEncoder(nn.Module):
    """BERT's body: token + segment (+ learned position) embeddings → LayerNorm → dropout → encoder stack.

    Returns the hidden states ``(batch, seq, d_model)``; the heads (``MaskedLMHead``, ``Pooler``) are separate
    modules so each task picks its own. Parameters: ``embed`` (tokens, the weight a masked-LM head ties to),
    ``position``, ``segment``, ``embed_norm``, ``encoder.layers.{i}`` (and ``encoder.norm`` when pre-norm).
    Initialisation follows BERT / HF: N(0, 0.02) for dense and embedding weights, zero biases, LayerNorms at
    ones/zeros, and the padding row of the token embedding at zero.
    """

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        c = config
        check_set(c, "vocab_size")
        self.config = config
        self.pad_id = c.pad_id
        self.embed = TokenEmbedding(c.vocab_size, c.d_model, padding_idx=c.pad_id)
        self.position = LearnedPositionalEmbedding(c.d_model, c.max_len) if c.position == "learned" else None
        rotary = RotaryEmbedding(c.d_model // c.n_heads, c.max_len) if c.position == "rope" else None
        self.segment = nn.Embedding(c.type_vocab_size, c.d_model)
        self.embed_norm = nn.LayerNorm(c.d_model, eps=c.norm_eps)
        self.dropout = Dropout(c.dropout)
        layers = [EncoderLayer(**c.layer_args(), rotary=rotary) for _ in range(c.n_layers)]
        self.encoder = Encoder(layers, nn.LayerNorm(c.d_model, eps=c.norm_eps) if c.norm_first else None)
        for module in self.modules():
            if isinstance(module, nn.Linear):
                _init_linear(module)
        for table in (self.embed, self.segment):
            nn.init.normal_(table.weight, std=0.02)
        with torch.no_grad():
            self.embed.weight[c.pad_id].zero_()
        if self.position is not None:
            nn.init.normal_(self.position.weight, std=0.02)

    def forward(self, ids: Tensor, segment_ids: Tensor | None = None, key_mask: Tensor | None = None) -> Tensor:
        """Token ids ``(batch, seq)`` → hidden states ``(batch, seq, d_model)``.

        ``segment_ids`` ``(batch, seq)``: 0 for sentence A, 1 for sentence B (default: all 0). ``key_mask``
        ``(batch, seq)``: True at real tokens (default: ``ids != pad_id``); padding is never attended to, but its
        own positions still get (meaningless) hidden states.
        """
        if key_mask is None:
            key_mask = ids != self.pad_id
        x = self.embed(ids)
        x = x + (self.segment(segment_ids) if segment_ids is not None else self.segment.weight[0])
        if self.position is not None:
            x = self.position(x)
        x = self.dropout(self.embed_norm(x))
        return self.encoder(x, key_mask=key_mask)


class MaskedLMHead(nn.Module):
    """Hidden states ``(..., d_model)`` → vocabulary logits ``(..., vocab_size)``: dense → activation → LayerNorm →
    output projection (tied to the token embedding when ``tied_weight`` is given) plus its own bias.

    HF names: ``cls.predictions.transform.dense`` = ``dense``, ``transform.LayerNorm`` = ``norm``,
    ``decoder`` = ``decoder`` (tied), ``cls.predictions.bias`` = ``bias``. It works on any leading shape, so a
    task may pass only the hidden states of the masked positions (``hidden[labels != -100]``) and save the
    vocabulary projection of the others.
    """

    def __init__(
        self,
        d_model: int,
        vocab_size: int,
        activation: PointwiseActivation = "gelu",
        norm_eps: float = 1e-12,
        tied_weight: nn.Parameter | None = None,
    ) -> None:
        super().__init__()
        self.dense = nn.Linear(d_model, d_model)
        self.activation = pointwise_activation(activation)
        self.norm = nn.LayerNorm(d_model, eps=norm_eps)
        self.decoder = nn.Linear(d_model, vocab_size, bias=False)
        self.bias = nn.Parameter(torch.zeros(vocab_size))
        _init_linear(self.dense)
        if tied_weight is not None:
            if tied_weight.shape != self.decoder.weight.shape:
                raise ValueError(
                    f"tied_weight has shape {tuple(tied_weight.shape)}, expected (vocab_size, d_model) = "
                    f"{tuple(self.decoder.weight.shape)}"
                )
            self.decoder.weight = tied_weight
        else:
            nn.init.normal_(self.decoder.weight, std=0.02)

    def forward(self, hidden: Tensor) -> Tensor:
        return self.decoder(self.norm(self.activation(self.dense(hidden)))) + self.bias


class Pooler(nn.Module):
    """Hidden states ``(batch, seq, d_model)`` → pooled ``(batch, d_model)``: tanh(dense(first token)).

    The first token is the ``[CLS]`` token; HF name ``bert.pooler.dense`` = ``dense``.
    """

    def __init__(self, d_model: int) -> None:
        super().__init__()
        self.dense = nn.Linear(d_model, d_model)
        _init_linear(self.dense)

    def forward(self, hidden: Tensor) -> Tensor:
        return torch.tanh(self.dense(hidden[:, 0]))


class BertForPreTraining(nn.Module):
    """BERT with its two pre-training heads: masked-LM over every position and next-sentence prediction.

    Parameters: ``bert.*`` (``BertEncoder``), ``mlm_head.*`` (``MaskedLMHead``, its ``decoder.weight`` the same
    tensor as ``bert.embed.weight``), ``pooler.*`` (``Pooler``), ``nsp_head.*`` (``Linear(d_model, 2)``: 0 = B
    follows A, 1 = B is random, HF's ``cls.seq_relationship``). ``BertForSequenceClassification`` uses the same
    ``bert.*`` and ``pooler.*`` names, so it loads a pre-training checkpoint with ``load_state_dict(state,
    strict=False)`` (the heads it lacks come back as unexpected keys, its new classifier as missing keys).
    """

    layer_stacks = ("bert.encoder",)  # its units' stacks: lightformer.training.distributed

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.config = config
        self.bert = BertEncoder(config)
        self.mlm_head = MaskedLMHead(
            config.d_model, config.vocab_size, config.activation, config.norm_eps, tied_weight=self.bert.embed.weight
        )
        self.pooler = Pooler(config.d_model)
        self.nsp_head = nn.Linear(config.d_model, 2)
        _init_linear(self.nsp_head)

    def forward(
        self,
        ids: Tensor,
        segment_ids: Tensor | None = None,
        key_mask: Tensor | None = None,
        mlm_positions: Tensor | None = None,
    ) -> tuple[Tensor, Tensor]:
        """Token ids ``(batch, seq)`` → (masked-LM logits ``(batch, seq, vocab_size)``, NSP logits ``(batch, 2)``).

        ``segment_ids`` and ``key_mask`` as in ``BertEncoder.forward``. ``mlm_positions`` (boolean, ``(batch,
        seq)``): compute the masked-LM logits at those positions only, returned as ``(selected, vocab_size)`` in
        row-major order (BERT's ``masked_lm_positions``): in training only the ~15% selected tokens have a loss,
        and the vocabulary projection of the others is most of the head's cost.
        """
        hidden = self.bert(ids, segment_ids, key_mask)
        selected = hidden if mlm_positions is None else hidden[mlm_positions]
        return self.mlm_head(selected), self.nsp_head(self.pooler(hidden))


class BertForSequenceClassification(nn.Module):
    """BERT fine-tuned to classify a sequence (or a sentence pair): pooled ``[CLS]`` → dropout → linear classifier.

    Parameters: ``bert.*`` and ``pooler.*`` as in ``BertForPreTraining`` (load them from a pre-training
    checkpoint by name: ``model.load_state_dict(pretrained, strict=False)``), then ``classifier.*`` (new), with
    ``config.num_classes`` outputs.
    """

    layer_stacks = ("bert.encoder",)  # its units' stacks: lightformer.training.distributed

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.config = config
        self.bert = BertEncoder(config)
        self.pooler = Pooler(config.d_model)
        dropout = config.dropout if config.classifier_dropout is None else config.classifier_dropout
        self.dropout = Dropout(dropout)
        self.classifier = nn.Linear(config.d_model, config.num_classes)
        _init_linear(self.classifier)

    def forward(self, ids: Tensor, segment_ids: Tensor | None = None, key_mask: Tensor | None = None) -> Tensor:
        """Token ids ``(batch, seq)`` → logits ``(batch, num_classes)``; arguments as in ``BertEncoder.forward``."""
        return self.classifier(self.dropout(self.pooler(self.bert(ids, segment_ids, key_mask))))


# --- Hugging Face interoperability ------------------------------------------------------------------------

# HF ``bert.encoder.layer.{i}.<left>`` → our ``bert.encoder.layers.{i}.<right>`` (query/key/value are packed apart).
_HF_LAYER_NAMES = {
    "attention.output.dense": "self_attn.proj",
    "attention.output.LayerNorm": "norm1",  # post-norm: the norm after the attention residual
    "intermediate.dense": "ffn.fc1",
    "output.dense": "ffn.fc2",
    "output.LayerNorm": "norm2",
}
_HF_TOP_NAMES = {
    "bert.embeddings.word_embeddings": "bert.embed",
    "bert.embeddings.position_embeddings": "bert.position",
    "bert.embeddings.token_type_embeddings": "bert.segment",
    "bert.embeddings.LayerNorm": "bert.embed_norm",
    "bert.pooler.dense": "pooler.dense",
    "cls.predictions.transform.dense": "mlm_head.dense",
    "cls.predictions.transform.LayerNorm": "mlm_head.norm",
    "cls.seq_relationship": "nsp_head",
}
# Buffers HF keeps in some versions' state dicts: the arange of positions and the default zero segment ids.
_HF_BUFFERS = ("bert.embeddings.position_ids", "bert.embeddings.token_type_ids")
# What a masked-LM-only checkpoint (HF's BertForMaskedLM) lacks.
_OPTIONAL_PREFIXES = ("pooler.", "nsp_head.")


def _hf_key(key: str) -> str:
    """Normalise a HF key: ``BertModel`` dicts lack the ``bert.`` prefix; old checkpoints name norms gamma/beta."""
    if key.startswith(("embeddings.", "encoder.", "pooler.")):
        key = f"bert.{key}"
    if ".LayerNorm." in key:
        key = key.replace("LayerNorm.gamma", "LayerNorm.weight").replace("LayerNorm.beta", "LayerNorm.bias")
    return key


def bert_state_dict_to_lightformer(state_dict: dict[str, Tensor]) -> dict[str, Tensor]:
    """Map a Hugging Face ``BertForPreTraining`` or ``BertForMaskedLM`` (or ``BertModel``) state dict to the names
    of our ``BertForPreTraining``.

    Query, key and value are packed into one ``qkv`` (rows [W^Q; W^K; W^V]); the output projection stays tied to
    the word embeddings (an untied HF decoder raises ValueError). Parts missing from the input (a masked-LM
    model's pooler and NSP classifier) are missing from the output; ``position_ids`` / ``token_type_ids`` buffers
    are dropped; any other key raises ValueError. Build ours with the HF config's shape, ``norm_eps`` =
    ``layer_norm_eps``, ``pad_id`` = ``pad_token_id``, activation "gelu" for HF's "gelu" ("gelu_tanh" for
    "gelu_new"), and ``norm_first=False``.
    """
    sd = {_hf_key(k): v for k, v in state_dict.items() if _hf_key(k) not in _HF_BUFFERS}
    out: dict[str, Tensor] = {}
    qkv: dict[tuple[str, str], dict[str, Tensor]] = {}  # (layer, weight|bias) → {query, key, value}
    unknown = []
    for key, value in sd.items():
        module, _, leaf = key.rpartition(".")
        if module.startswith("bert.encoder.layer."):
            index, _, rest = module.removeprefix("bert.encoder.layer.").partition(".")
            if rest in ("attention.self.query", "attention.self.key", "attention.self.value"):
                qkv.setdefault((index, leaf), {})[rest.rpartition(".")[2]] = value
            elif rest in _HF_LAYER_NAMES:
                out[f"bert.encoder.layers.{index}.{_HF_LAYER_NAMES[rest]}.{leaf}"] = value
            else:
                unknown.append(key)
        elif module in _HF_TOP_NAMES:
            out[f"{_HF_TOP_NAMES[module]}.{leaf}"] = value
        elif key not in ("cls.predictions.bias", "cls.predictions.decoder.weight", "cls.predictions.decoder.bias"):
            unknown.append(key)
    if unknown:
        raise ValueError(f"Hugging Face BERT keys without a lightformer counterpart: {sorted(unknown)}")

    for (index, leaf), parts in qkv.items():
        if set(parts) != {"query", "key", "value"}:
            raise ValueError(f"layer {index} has attention {leaf}s for {sorted(parts)} only; need query, key, value")
        out[f"bert.encoder.layers.{index}.self_attn.qkv.{leaf}"] = torch.cat(
            [parts["query"], parts["key"], parts["value"]]
        )

    embed = sd.get("bert.embeddings.word_embeddings.weight")
    decoder = sd.get("cls.predictions.decoder.weight")
    if decoder is not None and (embed is None or not torch.equal(decoder, embed)):
        raise ValueError(
            "cls.predictions.decoder.weight differs from bert.embeddings.word_embeddings.weight: lightformer's "
            "masked-LM head is tied to the token embedding (HF's tie_word_embeddings=True)"
        )
    bias, decoder_bias = sd.get("cls.predictions.bias"), sd.get("cls.predictions.decoder.bias")
    if bias is not None and decoder_bias is not None and not torch.equal(bias, decoder_bias):
        raise ValueError("cls.predictions.bias differs from cls.predictions.decoder.bias: they should be one tensor")
    bias = bias if bias is not None else decoder_bias
    if bias is not None:
        out["mlm_head.bias"] = bias
    if embed is not None and any(k.startswith("cls.predictions.") for k in sd):
        out["mlm_head.decoder.weight"] = embed  # the same tensor as bert.embed.weight in our model
    return out


@torch.no_grad()
def load_bert_weights(model: BertForPreTraining, state_dict: dict[str, Tensor], strict: bool = True) -> list[str]:
    """Load a Hugging Face BERT state dict (e.g. ``safetensors.torch.load_file``) into ``model``.

    With ``strict`` every parameter must come from the checkpoint. ``strict=False`` allows the pooler and the NSP
    classifier to be absent (a ``BertForMaskedLM`` checkpoint): they keep their initial values. Anything else
    missing, extra or of another shape raises ValueError before any weight is copied. Returns the names of the
    parameters left at their initial values (empty when strict).
    """
    if model.config.norm_first:
        raise ValueError("Hugging Face BERT is post-norm: build the model with norm_first=False to load its weights")
    converted = bert_state_dict_to_lightformer(state_dict)
    expected = model.state_dict()
    unexpected = sorted(set(converted) - set(expected))
    if unexpected:
        raise ValueError(f"checkpoint parameters this model does not have (more layers?): {unexpected}")
    mismatched = [
        f"{k}: checkpoint {tuple(v.shape)}, model {tuple(expected[k].shape)}"
        for k, v in converted.items()
        if v.shape != expected[k].shape
    ]
    if mismatched:
        raise ValueError(
            f"checkpoint shapes differ from the model's (build it with the checkpoint's config): {mismatched}"
        )
    missing = sorted(set(expected) - set(converted))
    optional = [k for k in missing if k.startswith(_OPTIONAL_PREFIXES)]
    required = [k for k in missing if not k.startswith(_OPTIONAL_PREFIXES)]
    if required:
        raise ValueError(f"the checkpoint lacks these parameters (fewer layers?): {required}")
    if optional and strict:
        raise ValueError(
            f"the checkpoint has no pooler / next-sentence weights (a BertForMaskedLM checkpoint?): {optional}; "
            "pass strict=False to load the rest and keep these at their initial values"
        )
    model.load_state_dict(converted, strict=False)
    return optional
