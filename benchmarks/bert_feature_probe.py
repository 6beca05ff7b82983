"""What a masked-LM pretraining put into each layer of its encoder, for a text-classification task: linear probes.

For the embeddings (layer 0) and the output of each encoder layer, the features of a text are the mean of its
tokens' states; scikit-learn's LogisticRegression on standardised features is fitted on the classification
data's training split and scored on its validation split. The same is done for an encoder of the same shape with
freshly initialised weights: features a probe reads better from the pretrained encoder than from the random one
are what the pretraining added (a random encoder keeps which tokens a text holds, a bag of words).

python benchmarks/bert_feature_probe.py --ckpt_path runs/mlm_austen/version_0/checkpoints/last.ckpt \
    --config configs/classify/austen_scratch.yaml

The data comes from the config's data section (a TextClassificationDataModule), encoded with the checkpoint's own
tokenizer (its tokenizer.file, if any, is replaced).
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import torch
import yaml
from torch import Tensor

from lightformer.data import TextClassificationDataModule
from lightformer.models.bert import BertEncoder
from lightformer.tasks import MaskedLanguageModelTask
from lightformer.tasks.command_support import load_task


def layer_features(encoder: BertEncoder, loader) -> tuple[list[Tensor], Tensor]:
    """Mean-pooled states of the embeddings and of each encoder layer, ``[(texts, d_model)] * (n_layers + 1)``, and
    the labels."""
    states: dict[int, Tensor] = {}
    hooks = [encoder.embed_norm.register_forward_hook(lambda module, args, out: states.__setitem__(0, out))]
    for index, layer in enumerate(encoder.encoder.layers, start=1):
        hooks.append(layer.register_forward_hook(lambda module, args, out, i=index: states.__setitem__(i, out)))
    pooled: list[list[Tensor]] = [[] for _ in range(len(encoder.encoder.layers) + 1)]
    labels = []
    try:
        with torch.no_grad():
            for batch in loader:
                ids = batch["ids"]
                encoder(ids)
                keep = (ids != encoder.pad_id).unsqueeze(-1).float()
                for index, features in enumerate(pooled):
                    features.append((states[index].float() * keep).sum(1) / keep.sum(1))
                labels.append(batch["labels"])
    finally:
        for hook in hooks:
            hook.remove()
    return [torch.cat(features) for features in pooled], torch.cat(labels)


def probe_accuracies(encoder: BertEncoder, data: TextClassificationDataModule) -> list[float]:
    """Validation accuracy of a linear probe on each layer's features (layer 0: the embeddings)."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    encoder.eval()
    train, train_labels = layer_features(encoder, data.train_dataloader())
    val, val_labels = layer_features(encoder, data.val_dataloader())
    accuracies = []
    for train_x, val_x in zip(train, val, strict=True):
        classifier = make_pipeline(StandardScaler(), LogisticRegression(max_iter=2000))
        classifier.fit(train_x.numpy(), train_labels.numpy())
        accuracies.append(float(classifier.score(val_x.numpy(), val_labels.numpy())))
    return accuracies


def measure(ckpt_path: str, data_args: dict, seed: int = 0) -> dict[str, list[float]]:
    """``{"pretrained": [...], "random": [...]}``: probe accuracy per layer of the checkpoint's encoder and of a
    freshly initialised one of the same shape. ``data_args`` are TextClassificationDataModule arguments (its groups as
    plain dicts, as a config's data section holds them)."""
    task = load_task(ckpt_path, MaskedLanguageModelTask, "bert_feature_probe")
    with tempfile.TemporaryDirectory() as folder:
        tokenizer_file = str(Path(folder) / "tokenizer.json")
        task.tokenizer.save(tokenizer_file)
        tokenizer = {**(data_args.get("tokenizer") or {}), "file": tokenizer_file}
        data = TextClassificationDataModule(**{**data_args, "tokenizer": tokenizer})
        data.prepare_data()
        data.setup("fit")
    torch.manual_seed(seed)
    random_encoder = BertEncoder(task.model.config)
    return {"pretrained": probe_accuracies(task.model.bert, data), "random": probe_accuracies(random_encoder, data)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ckpt_path", required=True, help="a MaskedLanguageModelTask checkpoint")
    parser.add_argument("--config", required=True, help="a config whose data section is a TextClassificationDataModule")
    args = parser.parse_args()
    section = yaml.safe_load(Path(args.config).read_text(encoding="utf-8"))["data"]
    if not section.get("class_path", "").endswith("TextClassificationDataModule"):
        parser.error(f"--config: {args.config}'s data is {section.get('class_path')}, not TextClassificationDataModule")
    accuracies = measure(args.ckpt_path, dict(section.get("init_args") or {}))
    print(f"{args.ckpt_path}: validation accuracy of a linear probe on mean-pooled features")
    print("layer        pretrained   random init")
    for layer, (pretrained, random) in enumerate(zip(accuracies["pretrained"], accuracies["random"], strict=True)):
        name = "embeddings" if layer == 0 else f"layer {layer}"
        print(f"{name:<12} {pretrained:>9.1%}   {random:>9.1%}")


if __name__ == "__main__":
    main()
