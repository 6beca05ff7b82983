"""The contrastive image-text task: its losses against a plain computation, retrieval's recall with duplicate captions,
CLIP's averaged prompts, a short fit on drawn shapes that learns to pair them (zero-shot and recall far above
chance), the ``zero-shot`` and ``embed`` commands on its checkpoint, warm starts of both towers from a ViT classifier
and a GPT language model, and the refusals."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import lightning as L
import pytest
import torch
import torch.nn.functional as F
from PIL import Image, ImageDraw

from lightformer.data.families.image_text import ImageTextFilesDataModule
from lightformer.errors import ConfigError
from lightformer.facts import DataFacts
from lightformer.io.checkpoints import InitConfig
from lightformer.tasks.contrastive import (
    ContrastiveTask,
    contrastive_loss,
    embed,
    recalls,
    zero_shot,
)
from lightformer.tokenization.text import Tokenizer
from lightformer.training.tensorboard import TensorBoardLogger

SHAPES = ("circle", "square", "triangle")
COLOURS = {"red": (220, 30, 30), "blue": (30, 60, 220), "green": (30, 170, 60), "yellow": (230, 200, 20)}
SIDE = 16  # the canvas
TINY = dict(d_model=32, n_layers=1, n_heads=2, d_ff=64)


def losses_by_hand(images: torch.Tensor, texts: torch.Tensor, scale: float, bias: float) -> tuple[float, float]:
    """InfoNCE and the sigmoid loss of unit rows, pair by pair in Python."""
    n = len(images)
    logits = [[scale * float(images[i] @ texts[j]) for j in range(n)] for i in range(n)]
    i2t = sum(-logits[i][i] + math.log(sum(math.exp(v) for v in logits[i])) for i in range(n)) / n
    t2i = sum(-logits[j][j] + math.log(sum(math.exp(logits[i][j]) for i in range(n))) for j in range(n)) / n
    sigmoid = 0.0
    for i in range(n):
        for j in range(n):
            z = 1.0 if i == j else -1.0
            sigmoid -= math.log(1 / (1 + math.exp(-z * (logits[i][j] + bias))))
    return (i2t + t2i) / 2, sigmoid / n


def test_the_losses_are_clips_and_siglips_on_one_process():
    torch.manual_seed(0)
    images, texts = F.normalize(torch.randn(5, 8), dim=-1), F.normalize(torch.randn(5, 8), dim=-1)
    infonce, sigmoid = losses_by_hand(images.double(), texts.double(), 7.0, -3.0)
    loss, n = contrastive_loss(images, texts, torch.tensor(7.0), None, "infonce")
    assert n == 5 and float(loss) == pytest.approx(infonce, rel=1e-5)
    loss, n = contrastive_loss(images, texts, torch.tensor(7.0), torch.tensor(-3.0), "sigmoid")
    assert n == 5 and float(loss) == pytest.approx(sigmoid, rel=1e-5)


def test_recall_counts_a_caption_equal_to_any_of_an_images_references():
    # image 0's captions are 0 and 1 (a duplicate caption: image 2 has caption 1 too); image 1's is 2
    relevant = torch.tensor([[True, True, False], [False, False, True], [False, True, False]])
    similarities = torch.tensor([[0.1, 0.9, 0.0], [0.8, 0.1, 0.2], [0.0, 0.5, 0.9]])
    found = recalls(similarities, relevant, ks=(1, 2))
    assert found["i2t_r1"] == pytest.approx(1 / 3)  # image 0 hits (its caption 1); 1 and 2 miss
    assert found["i2t_r2"] == pytest.approx(1.0)  # image 1's caption is its second likeliest, image 2's too
    # text→image: caption 0 → image 1 (miss), caption 1 → image 0 (hit), caption 2 → image 2 (miss)
    assert found["t2i_r1"] == pytest.approx(1 / 3)
    assert found["t2i_r2"] == pytest.approx(1.0)  # each caption's second likeliest image is one of its own


# --- a tiny captioned set of coloured shapes -------------------------------------------------------------------


def draw_shape(path: Path, shape: str, colour: str, index: int) -> None:
    """A coloured shape of a size and place drawn from ``index`` on white."""
    image = Image.new("RGB", (SIDE * 2, SIDE * 2), "white")
    draw, size, x, y = ImageDraw.Draw(image), 14 + index % 4 * 2, 1 + index % 3 * 3, 2 + index % 4 * 2
    box = (x, y, x + size, y + size)
    fill = COLOURS[colour]
    if shape == "circle":
        draw.ellipse(box, fill=fill)
    elif shape == "square":
        draw.rectangle(box, fill=fill)
    else:
        draw.polygon([(x, y + size), (x + size, y + size), (x + size // 2, y)], fill=fill)
    path.parent.mkdir(parents=True, exist_ok=True)
    image.save(path)


def write_shapes(root: Path, per_pair: int = 10) -> Path:
    """``per_pair`` drawings of each colour and shape, each captioned "a <colour> <shape>" and "a <shape>"; the JSONL
    file."""
    rows = []
    for shape in SHAPES:
        for colour in COLOURS:
            for k in range(per_pair):
                name = f"img/{shape}-{colour}-{k}.png"
                draw_shape(root / name, shape, colour, k)
                rows += [{"file": name, "text": f"a {colour} {shape}"}, {"file": name, "text": f"a {shape}"}]
    path = root / "train.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


class LabelledShapes(ImageTextFilesDataModule):
    """The shapes with classes (the shape of each drawing), as the contrastive data modules give them: "labels" in
    each batch, the class names in the facts."""

    def data_facts(self) -> DataFacts:
        return dataclasses.replace(super().data_facts(), class_names=SHAPES)

    def _dataloader(self, split: str, shuffle: bool = False):
        loader = super()._dataloader(split, shuffle)
        collate = loader.collate_fn

        def labelled(items):
            batch = collate(items)
            batch["labels"] = torch.tensor([SHAPES.index(refs[0].split()[-1]) for refs in batch["references"]])
            return batch

        loader.collate_fn = labelled
        return loader


def shapes_module(root: Path, **options) -> ImageTextFilesDataModule:
    kind = options.pop("kind", LabelledShapes)
    # plain dicts, as the command line gives them: the checkpoint stores them (loaded with weights_only)
    train = str(write_shapes(root))
    source = dict(train=train, height=SIDE, width=SIDE, channels=3, fit="resize", val_fraction=0.25)
    source |= {"test": train} if options.pop("test", False) else {}
    data = kind(source, tokenizer=dict(kind="char"), loader=dict(batch_size=24),
                prepare=dict(dir=str(root / "prepared"), num_workers=1), **options)  # fmt: skip
    data.prepare_data()
    return data


def shapes_task(facts: DataFacts, loss: str = "infonce", **options) -> ContrastiveTask:
    net = dict(image=dict(patch_size=4, **TINY), text=dict(block_size=24, **TINY), embed_dim=32, loss=loss)
    templates = ("a {}", "{}")
    optimizer = dict(lr=3e-3, warmup_steps=10, weight_decay=0.0)
    return ContrastiveTask(net=net, templates=templates, data_facts=facts, optimizer=optimizer,
                           num_logged_samples=2, **options)  # fmt: skip


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> dict:
    """A short fit on the shapes (infonce), its metrics, checkpoint and run folder."""
    root = tmp_path_factory.mktemp("shapes")
    torch.manual_seed(0)
    data = shapes_module(root)
    task = shapes_task(data.data_facts())
    logger = TensorBoardLogger(str(root / "runs"), name="shapes", version=0)
    trainer = L.Trainer(accelerator="cpu", max_steps=200, val_check_interval=100, check_val_every_n_epoch=None,
                        logger=logger, enable_progress_bar=False, enable_model_summary=False,
                        num_sanity_val_steps=0, log_every_n_steps=4, default_root_dir=str(root))  # fmt: skip
    trainer.fit(task, datamodule=data)
    metrics = {name: float(value) for name, value in trainer.callback_metrics.items()}
    checkpoint = root / "shapes.ckpt"
    trainer.save_checkpoint(checkpoint)
    return {"root": root, "metrics": metrics, "checkpoint": str(checkpoint), "task": task, "data": data}


def test_a_short_fit_pairs_drawn_shapes_with_their_captions_far_above_chance(trained):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    m = trained["metrics"]
    # 15 distinct captions, two of each image's (chance 2/15 for image→text recall@1), 3 classes (chance 1/3)
    assert m["val/i2t_r1"] > 0.5, m
    assert m["val/t2i_r1"] > 0.5, m
    assert m["val/zero_shot_top1"] > 0.7, m
    assert "val/zero_shot_top5" not in m  # 3 classes: no top-5
    assert m["train/temperature"] != pytest.approx(0.07, abs=1e-4)  # learnt, from CLIP's start
    events = EventAccumulator(str(trained["root"] / "runs" / "shapes" / "version_0"))
    events.Reload()
    tags = events.Tags()
    assert {"train/temperature", "train/contrasted_batch", "val/i2t_r10", "val/t2i_r5"} <= set(tags["scalars"])
    assert [event.value for event in events.Scalars("train/contrasted_batch")] == [24]  # once
    assert {"val/similarity", "val/sample_0", "val/sample_1"} <= set(tags["images"])
    assert "val/top_texts/text_summary" in set(tags["tensors"])


def test_a_sigmoid_task_on_data_without_classes_logs_its_bias_and_retrieval_and_skips_zero_shot(tmp_path):
    torch.manual_seed(0)
    data = shapes_module(tmp_path, kind=ImageTextFilesDataModule, test=True)  # no classes: zero-shot is skipped
    task = shapes_task(data.data_facts(), loss="sigmoid")
    trainer = L.Trainer(accelerator="cpu", max_steps=12, logger=False, enable_progress_bar=False,
                        enable_model_summary=False, enable_checkpointing=False, num_sanity_val_steps=0,
                        log_every_n_steps=1, limit_val_batches=1, val_check_interval=12,
                        check_val_every_n_epoch=None)  # fmt: skip
    trainer.fit(task, datamodule=data)
    m = trainer.callback_metrics
    assert "train/bias" in m and float(m["train/bias"]) != -10.0
    assert "val/i2t_r1" in m and "val/zero_shot_top1" not in m
    assert task.contrasted == 24
    (tested,) = trainer.test(task, datamodule=data)
    assert {"test/loss", "test/i2t_r10", "test/t2i_r1"} <= tested.keys() and "test/zero_shot_top1" not in tested


def test_class_embeddings_average_each_templates_unit_embedding(trained):
    task = trained["task"]
    templates = ["a red {}", "a blue {}"]
    each = task.encode_texts([t.replace("{}", "circle") for t in templates])
    assert torch.allclose(each.norm(dim=-1), torch.ones(2), atol=1e-5)
    expected = F.normalize(each.mean(0), dim=-1)
    assert torch.allclose(task.class_embeddings(["circle"], templates)[0], expected, atol=1e-5)


# --- the commands --------------------------------------------------------------------------------------------


def test_zero_shot_prints_each_images_likeliest_labels_in_order(trained, tmp_path, capsys):
    root = trained["root"]
    paths = [root / "img/triangle-red-1.png", root / "img/circle-blue-2.png", tmp_path / "broken.png",
             root / "img/square-green-3.png"]  # fmt: skip
    paths[2].write_bytes(b"not an image")
    zero_shot(ckpt_path=trained["checkpoint"], labels="circle,square,triangle", images=[str(p) for p in paths],
              top=2)  # fmt: skip
    captured = capsys.readouterr()
    lines = captured.out.splitlines()
    assert len(lines) == 4 and lines[2] == ""
    for line, path, shape in zip(lines, paths, ["triangle", None, None, "square"], strict=True):
        if shape is None:
            continue
        assert line.startswith(f"{path}: {shape} (")
        assert line.count("%)") == 2
    assert lines[1].startswith(f"{paths[1]}: circle (")
    assert f"zero-shot: {paths[2]}:" in captured.err
    probabilities = [float(part.split("(")[1].rstrip("%)")) for part in lines[0].split(": ", 1)[1].split(", ")]
    assert probabilities[0] >= probabilities[1] and sum(probabilities) <= 100.05

    labels = tmp_path / "labels.txt"
    labels.write_text("circle\nsquare\n\ntriangle\n")
    zero_shot(ckpt_path=trained["checkpoint"], labels=str(labels), images=str(paths[0]), top=1, prompts="a {}")
    assert capsys.readouterr().out.startswith(f"{paths[0]}: triangle (")


def test_embed_writes_unit_embeddings_of_images_and_texts_with_their_names_in_order(trained, tmp_path):
    from safetensors import safe_open

    root, task = trained["root"], trained["task"]
    images = [str(root / "img/circle-red-0.png"), str(root / "img/square-blue-1.png")]
    out = tmp_path / "deep" / "images.safetensors"
    embed(ckpt_path=trained["checkpoint"], images=images, output=str(out))
    with safe_open(str(out), "pt") as f:
        rows, names = f.get_tensor("embeddings"), json.loads(f.metadata()["images"])
    assert names == images and rows.shape == (2, 32)
    assert torch.allclose(rows.norm(dim=-1), torch.ones(2), atol=1e-5)
    texts = tmp_path / "texts.txt"
    texts.write_text("a red circle\na blue square\n")
    embed(ckpt_path=trained["checkpoint"], texts=str(texts), output=str(tmp_path / "texts.safetensors"))
    with safe_open(str(tmp_path / "texts.safetensors"), "pt") as f:
        text_rows, captions = f.get_tensor("embeddings"), json.loads(f.metadata()["texts"])
    assert captions == ["a red circle", "a blue square"]
    assert torch.allclose(text_rows, task.encode_texts(captions).cpu(), atol=1e-5)
    similarities = rows @ text_rows.T  # the images pair with their own captions
    assert similarities.argmax(1).tolist() == [0, 1]


def test_a_text_tower_shorter_than_the_longest_caption_is_refused_naming_the_field(tmp_path):
    data = shapes_module(tmp_path)
    facts = data.data_facts()
    task = ContrastiveTask(net=dict(image=dict(patch_size=4, **TINY), text=dict(block_size=8, **TINY)),
                           data_facts=facts)  # fmt: skip
    message = (
        r"^model.net.text.block_size=8 is shorter than the data's captions: the data has captions of up to 19 "
        r"positions \(BOS and EOS included\).*; set model.net.text.block_size >= 19 or give the data shorter captions$"
    )
    with pytest.raises(ConfigError, match=message):
        task.check_data(facts, "validate")


# --- warm starts ---------------------------------------------------------------------------------------------


def test_both_towers_start_from_a_vit_classifier_and_a_gpt_language_model(tmp_path):
    from lightformer.tasks import ImageClassificationTask, LanguageModelTask

    tokenizer = Tokenizer.train_char(["a red blue circle square"])
    text_facts = DataFacts(tokenizer=tokenizer.to_str(), vocab_size=tokenizer.vocab_size, pad_id=tokenizer.pad_id)
    lm = LanguageModelTask(net=dict(block_size=16, **TINY), data_facts=text_facts)
    image_facts = DataFacts(class_names=("a", "b", "c"), image_size=8, in_channels=3, normalize_mean=(0.5,) * 3,
                            normalize_std=(0.5,) * 3)  # fmt: skip
    vit = ImageClassificationTask(net=dict(patch_size=4, **TINY), data_facts=image_facts)  # a 2×2 grid
    files = {}
    for name, task in (("vit", vit), ("gpt", lm)):
        files[name] = str(tmp_path / f"{name}.ckpt")
        torch.save({"state_dict": task.state_dict(), "hyper_parameters": dict(task.hparams)}, files[name])
    facts = DataFacts(tokenizer=tokenizer.to_str(), vocab_size=tokenizer.vocab_size, pad_id=tokenizer.pad_id,
                      image_size=16, in_channels=3, normalize_mean=(0.5,) * 3, normalize_std=(0.5,) * 3,
                      image_fit="resize", max_length=16)  # fmt: skip
    init = InitConfig(modules={"image": files["vit"], "text": files["gpt"]})  # by their names alone
    # a classifier ViT has a patch bias and no pre-norm: the tower takes its shape (pre_norm false)
    clip = ContrastiveTask(net=dict(image=dict(patch_size=4, pre_norm=False, **TINY), text=dict(block_size=16, **TINY)),
                           data_facts=facts, init=init)  # fmt: skip
    weights = clip.initial_weights(check=True)  # the grid 2×2 → 4×4: the position table resampled
    from lightformer.io.checkpoints import load_matching

    report = load_matching(clip.model, weights)
    state = clip.model.state_dict()
    for name, value in vit.model.state_dict().items():
        if name.startswith("head.") or "pos" in name:
            continue
        assert torch.equal(state[f"image.{name}"], value), name
    for name, value in lm.model.state_dict().items():
        assert torch.equal(state[f"text.{name}"], value), name
    assert {"image.head.weight", "image.head.bias"} <= set(report["dropped"])  # the classifier's head: no place
    assert not [name for name in report["new"] if name.startswith(("image.", "text."))], report["new"]
