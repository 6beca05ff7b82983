"""Question-answer records about images for the vision-language model: answers read from the sources (clip art's
titles, categories and keywords; printed lines' text and words), the groups, batches of one canvas with the contract's
keys, dtypes and shapes, labels on answers only, the facts, and the canvas batch sampler (deterministic, resumable,
the same number of batches on every rank)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from lightformer.data import ConversationFilesDataModule, VisualQADataModule
from lightformer.data.loading.sampling import CanvasBatchSampler, ResumableDataLoader
from lightformer.data.loading.streaming import LoaderConfig, Records
from lightformer.data.objectives.chat import IGNORE, ChatTemplate
from lightformer.data.preparation.prepare import PrepareConfig, TokenizerConfig
from lightformer.data.sources import openclipart
from lightformer.data.sources.conversations import ConversationFiles
from lightformer.data.sources.questions import QUESTIONS, VisualQASource
from lightformer.data.sources.rendering import missing_typefaces
from lightformer.errors import DataError

REPO = Path(__file__).resolve().parents[1]
ROOT = Path(openclipart.OPENCLIPART_ROOT)
SHEEP = "animals/mammals/dall_sheep_ram_ganson"
PICKED = [SHEEP, "animals/crawfish1_ganson", "animals/crawfish1_bw_ganson", "food/apple_bitten_dan_gerhard_01",
          "food/burrito_ganson", "computer/floppy", "computer/reload", "unsorted/Anatra"]  # fmt: skip


@pytest.fixture(scope="module")
def qa(tmp_path_factory) -> VisualQADataModule:
    if not (ROOT / "svg").is_dir() or not (ROOT / "png").is_dir() or missing_typefaces():
        pytest.skip("apt-get install openclipart-png openclipart-svg, and fonts")
    root = tmp_path_factory.mktemp("qa")
    for name in PICKED:
        for kind in ("png", "svg"):
            (root / "library" / kind / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(ROOT / kind / f"{name}.{kind}", root / "library" / kind / f"{name}.{kind}")
    source = VisualQASource(clipart_root=str(root / "library"), drawing_size=32, line_width=128, train_lines=12,
                            val_lines=4, test_lines=4, seen=2, val_fraction=0.3, test_fraction=0.3,
                            data_root=str(REPO / "data"))  # fmt: skip
    data = VisualQADataModule(source, loader=LoaderConfig(batch_size=4), seed=1,
                              prepare=PrepareConfig(dir=str(root / "prepared"), num_workers=2))  # fmt: skip
    data.prepare_data()
    data.setup()
    return data


def records(data: VisualQADataModule, split: str) -> list[dict]:
    found = Records(str(data.prepared / split))
    return [found[i] for i in range(len(found))]


def test_clip_art_answers_are_what_the_library_says(qa):
    groups = qa.data_facts().groups
    every = [r for split in ("train", "val", "test") for r in records(qa, split)]
    by_question: dict[str, set[str]] = {}
    for record in every:
        by_question.setdefault(record["question"], set()).add(record["answer"])
    title, _, keywords = openclipart.svg_metadata(ROOT / "svg" / f"{SHEEP}.svg")
    assert title in by_question[QUESTIONS["clipart"]["name"]]
    assert ", ".join(keywords[:3]) in by_question[QUESTIONS["clipart"]["keywords"]]
    # categories as ClipArtDataModule names its classes: never "unsorted"
    assert by_question[QUESTIONS["clipart"]["category"]] <= {"animals", "computer", "food"}
    clipart = [r for r in every if groups[r["group"]].startswith("clipart/")]
    assert {groups[r["group"]].split("/")[1] for r in clipart} == {"name", "category", "keywords"}


def test_lines_are_read_and_their_nth_word_asked(qa):
    groups = qa.data_facts().groups
    for split in ("train", "val", "test"):
        lines = [r for r in records(qa, split) if groups[r["group"]].startswith("lines/")]
        reads = [r for r in lines if r["question"] == QUESTIONS["lines"]["read"]]
        words = [r for r in lines if r["question"] != QUESTIONS["lines"]["read"]]
        assert len(reads) == len(words) > 0
        for read, word in zip(reads, words, strict=True):  # each line's two records come together
            n = int(word["question"].removeprefix("What is word ").removesuffix("?"))
            assert 1 <= len(read["answer"].split()) <= 4 and read["answer"].split()[n - 1] == word["answer"]
            assert read["image"] == word["image"]
            assert read["text"] == word["text"] == read["answer"]  # the text the image shows: the CTC loss's target
    assert {r["text"] for r in records(qa, "train") if groups[r["group"]].startswith("clipart/")} == {""}


def test_val_and_test_hold_held_out_and_seen_groups_training_only_seen(qa):
    groups = qa.data_facts().groups
    assert groups == tuple(f"{s}/{k}/{w}" for s in ("clipart", "lines") for k in QUESTIONS[s]
                           for w in ("held-out", "seen"))  # fmt: skip
    assert {groups[r["group"]].split("/")[2] for r in records(qa, "train")} == {"seen"}
    for split in ("val", "test"):
        found = {groups[r["group"]] for r in records(qa, split)}
        assert "lines/read/held-out" in found and "lines/read/seen" in found
    seen_lines = [r["answer"] for r in records(qa, "val") if groups[r["group"]] == "lines/read/seen"]
    train_lines = [r["answer"] for r in records(qa, "train") if groups[r["group"]] == "lines/read/seen"]
    assert seen_lines == train_lines[:2]  # the first `seen` training lines, drawn again


def test_the_facts(qa):
    facts = qa.data_facts()
    tokenizer = qa.tokenizer
    assert facts.chat_template == ChatTemplate().as_dict()
    assert facts.canvases == {"drawing": [32, 32], "line": [32, 128]}
    assert facts.image_size == (32, 32) and facts.image_fit == "drawing" and facts.in_channels == 3
    assert facts.vocab_size == tokenizer.vocab_size and facts.pad_id == tokenizer.pad_id
    assert len(facts.normalize_mean) == 3 and all(s > 0 for s in facts.normalize_std)
    assert facts.max_length >= max(len(batch["ids"][0]) for batch in qa.val_dataloader())


def test_batches_hold_one_canvas_and_the_contracts_keys(qa):
    facts = qa.data_facts()
    shapes = set()
    for loader in (qa.train_dataloader(), qa.val_dataloader(), qa.test_dataloader()):
        for batch in loader:
            images, ids, labels = batch["images"], batch["ids"], batch["labels"]
            assert images.dtype == torch.float32 and images.shape[1] == 3
            shapes.add(tuple(images.shape[2:]))
            assert ids.dtype == labels.dtype == batch["prompt_length"].dtype == batch["group"].dtype == torch.int64
            assert ids.shape == labels.shape and ids.shape[0] == images.shape[0] == len(batch["answer"])
            assert ((ids == facts.vocab_size).sum(1) == 1).all()  # one placeholder per row
            for row in range(len(ids)):
                prompt = ChatTemplate().prompt(qa.tokenizer, batch["question"][row], facts.vocab_size)
                length = int(batch["prompt_length"][row])
                assert ids[row, :length].tolist() == prompt
                answer = [t for t in labels[row].tolist() if t != IGNORE]
                assert qa.tokenizer.decode(answer) == batch["answer"][row]  # labels on the answer (and its EOS) only
                assert (labels[row, : length - 1] == IGNORE).all()
                transcript = batch["transcript"][row, : int(batch["transcript_length"][row])].tolist()
                if batch["question"][row] == QUESTIONS["lines"]["read"]:
                    assert transcript == qa.tokenizer.encode(batch["answer"][row])
                assert (batch["transcript_length"][row] > 0) == (images.shape[-1] == 128)  # lines only
    assert shapes == {(32, 32), (32, 128)}


def test_training_resumed_mid_epoch_gets_the_rest_of_that_epochs_batches(qa):
    def epoch(state: dict | None = None) -> list[dict]:
        loader = qa.train_dataloader()
        loader.batch_sampler.set_epoch(1)
        if state:
            loader.load_state_dict(state)
        return list(loader)

    whole, resumed = epoch(), epoch({"epoch": 1, "batches": 2})
    assert len(resumed) == len(whole) - 2
    for a, b in zip(whole[2:], resumed, strict=True):  # the same records, jittered the same way
        assert a["answer"] == b["answer"] and torch.equal(a["images"], b["images"])
        assert torch.equal(a["ids"], b["ids"])
    other = qa.train_dataloader()
    other.batch_sampler.set_epoch(2)
    assert [b["answer"] for b in other] != [b["answer"] for b in whole]


def test_every_evaluation_record_is_read_once(qa):
    count = sum(len(batch["answer"]) for batch in qa.val_dataloader())
    assert count == qa.manifest["records"]["val"]


def test_the_canvas_sampler_is_deterministic_resumable_and_even_across_ranks():
    canvases = np.array([0, 1, 0, 2, 1, 1, 0, 0, 2, 1, 0], np.uint8)
    sampler = CanvasBatchSampler(canvases, 2, shuffle=True, seed=3)
    sampler.set_epoch(1)
    batches = list(sampler)
    assert batches == list(sampler) and sorted(i for b in batches for i in b) == list(range(len(canvases)))
    assert all(len({canvases[i] for i in batch}) == 1 for batch in batches)
    sampler.set_epoch(2)
    assert list(sampler) != batches
    ranks = [list(CanvasBatchSampler(canvases, 2, shuffle=True, seed=3, num_replicas=3, rank=r)) for r in range(3)]
    assert len({len(r) for r in ranks}) == 1
    assert sorted(i for r in ranks for b in r for i in b) == list(range(len(canvases)))
    # resumed after 3 batches of epoch 1, the loader hands out the rest of that epoch's batches
    loader = ResumableDataLoader(list(range(len(canvases))), batch_sampler=CanvasBatchSampler(canvases, 2, True, 3))
    loader.batch_sampler.set_epoch(1)
    loader.load_state_dict({"epoch": 1, "batches": 3})
    assert [b.tolist() for b in loader] == batches[3:]


def test_a_library_folder_that_is_not_one_is_refused(tmp_path):
    with pytest.raises(DataError, match="data.source.clipart_root"):
        VisualQADataModule(VisualQASource(clipart_root=str(tmp_path), sources=("clipart",)))


@pytest.mark.parametrize("options, field", [(dict(sources=("maps",)), "data.source.sources"),
                                            (dict(line_width=200), "data.source.line_width"),
                                            (dict(words=(3, 1)), "data.source.words")])  # fmt: skip
def test_bad_options_are_refused_naming_the_field(options, field):
    with pytest.raises(ValueError, match=field):
        VisualQASource(**options)


def test_garments_are_named_as_torchvision_names_them_on_a_32_pixel_rgb_canvas(tmp_path):
    from lightformer.data.sources.corpora import install_debian_fashion_mnist

    if not install_debian_fashion_mnist(REPO / "data"):
        pytest.skip("apt-get install dataset-fashion-mnist")
    import torchvision

    source = VisualQASource(sources=("fashion_mnist",), max_images=6, seen=2, data_root=str(REPO / "data"))
    # the Austen LM's characters lack "/" ("T-shirt/top"): refused beyond max_unknown, warned within it
    tokenizer = TokenizerConfig(max_unknown=0.05)
    data = VisualQADataModule(source, tokenizer, loader=LoaderConfig(batch_size=4), augment=False,
                              prepare=PrepareConfig(dir=str(tmp_path), num_workers=1))  # fmt: skip
    with pytest.warns(UserWarning, match="'/'"):
        data.prepare_data()
    official = torchvision.datasets.FashionMNIST(str(REPO / "data"), train=True)
    train = records(data, "train")
    assert [r["answer"] for r in train] == [official.classes[int(t)] for t in official.targets[:6]]
    assert {r["question"] for r in train} == {"What kind of garment is this?"}
    facts = data.data_facts()
    assert facts.canvases == {"resize": [32, 32]} and facts.image_fit == "resize"
    assert facts.groups == ("fashion_mnist/garment/held-out", "fashion_mnist/garment/seen")
    batch = next(iter(data.val_dataloader()))
    assert batch["images"].shape[1:] == (3, 32, 32)
    mean, std = (torch.tensor(v).view(1, 3, 1, 1) for v in (facts.normalize_mean, facts.normalize_std))
    pixels = batch["images"] * std + mean  # grey made RGB: three equal channels
    for channel in (1, 2):
        assert torch.allclose(pixels[:, 0], pixels[:, channel], atol=1e-5)
    assert len(records(data, "val")) == 6 + 2 and len(records(data, "test")) == 6 + 2


def test_emoji_are_asked_their_unicode_name_held_out_in_the_other_style(tmp_path):
    from lightformer.data.sources import emoji

    if not (Path(emoji.NOTO_EMOJI).is_file() and Path(emoji.SYMBOLA).is_file()):
        pytest.skip("apt-get install fonts-noto-color-emoji fonts-symbola")
    source = VisualQASource(sources=("emoji",), max_images=3, seen=1, drawing_size=32)
    data = VisualQADataModule(source, loader=LoaderConfig(batch_size=4), augment=False,
                              prepare=PrepareConfig(dir=str(tmp_path), num_workers=1))  # fmt: skip
    data.prepare_data()
    names = [r["answer"] for r in records(data, "train")]
    assert names == [emoji.caption(c) for c in emoji.emoji_characters()][: len(names)] and len(names) == 3
    assert {r["question"] for r in records(data, "train")} == {"What is this emoji?"}
    groups = data.data_facts().groups
    val = records(data, "val")
    assert [groups[r["group"]] for r in val] == ["emoji/name/held-out"] * (len(val) - 1) + ["emoji/name/seen"]
    assert val[-1]["answer"] == names[0] and val[-1]["image"] == records(data, "train")[0]["image"]


# --- a user's conversations (LLaVA's layout) -------------------------------------------------------------------


def write_conversations(folder: Path, records: list, name: str = "train.jsonl") -> Path:
    """Images a.png, b.png, c.png (red, green, blue, 40×24) and ``records`` as JSONL in ``folder``."""
    from PIL import Image

    for stem, colour in (("a", "red"), ("b", "green"), ("c", "blue")):
        Image.new("RGB", (40, 24), colour).save(folder / f"{stem}.png")
    path = folder / name
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


def chat(image: str, *turns: str) -> dict:
    roles = ("human", "gpt")
    turns = [{"from": roles[i % 2], "value": text} for i, text in enumerate(turns)]
    return {"id": image, "image": image, "conversations": turns}


def conversations(tmp_path: Path, records: list, **options) -> ConversationFilesDataModule:
    path = write_conversations(tmp_path, records)
    source = ConversationFiles(train=str(path), **{"val_fraction": 0.0, "image_size": 32, **options})
    prepare = PrepareConfig(dir=str(tmp_path / "prepared"), num_workers=1)
    return ConversationFilesDataModule(source, loader=LoaderConfig(batch_size=2), prepare=prepare)


def test_conversations_train_every_answer_of_several_turns(tmp_path):
    records = [chat("a.png", "<image>\nWhat colour?", "red", "Is it dark?", "no"), chat("b.png", "Colour?", "green"),
               chat("c.png", "What colour is <image> this?", "blue")]  # fmt: skip
    data = conversations(tmp_path, records, fit="pad")
    data.prepare_data()
    facts = data.data_facts()
    assert facts.groups == ("files/answer/held-out",) and facts.canvases == {"pad": [32, 32]}
    assert facts.chat_template == ChatTemplate().as_dict() and facts.image_fit == "pad"
    batches = list(data.train_dataloader())
    rows = {answer: (ids, labels) for batch in batches
            for answer, ids, labels in zip(batch["answer"], batch["ids"], batch["labels"], strict=True)}  # fmt: skip
    assert sorted(rows) == ["blue", "green", "red"]
    ids, labels = rows["red"]
    tokenizer = data.tokenizer
    expected, expected_labels = ChatTemplate().encode(
        tokenizer, [("<image>\nWhat colour?", "red"), ("Is it dark?", "no")], tokenizer.vocab_size
    )
    assert ids[: len(expected)].tolist() == expected and labels[: len(expected)].tolist() == expected_labels
    assert tokenizer.decode([t for t in labels.tolist() if t != IGNORE]) == "redno"  # both answers trained on
    assert facts.max_length == max(len(ChatTemplate().encode(tokenizer, turns, 0)[0]) for turns in
                                   [[("<image>\nWhat colour?", "red"), ("Is it dark?", "no")]])  # fmt: skip
    # LLaVA-1.5's pad: the 40×24 image on a square of CLIP's mean colour, then resized
    mean, std = (torch.tensor(v).view(3, 1, 1) for v in (facts.normalize_mean, facts.normalize_std))
    first = next(b for b in batches if "red" in b["answer"])
    image = first["images"][first["answer"].index("red")] * std + mean
    stored_as_jpeg = 8  # grey levels
    assert torch.allclose(image[:, 0, 16] * 255, torch.tensor([122.0, 116, 104]), atol=stored_as_jpeg)  # the band
    assert torch.allclose(image[:, 16, 16] * 255, torch.tensor([255.0, 0, 0]), atol=stored_as_jpeg)  # the picture


def test_a_carved_validation_split_takes_records_by_the_images_hash(tmp_path):
    records = [chat(f"{stem}.png", "Colour?", stem) for stem in "abc"] * 4
    data = conversations(tmp_path, records, val_fraction=0.4)  # the hashes of a, b, c: 0.50, 0.37, 0.35
    data.prepare_data()
    assert data.manifest["records"] == {"train": 4, "val": 8, "test": 0}
    assert {b for batch in data.val_dataloader() for b in batch["answer"]} == {"b", "c"}


@pytest.mark.parametrize(
    "record, message",
    [({"id": 1, "conversations": [{"from": "human", "value": "Q"}, {"from": "gpt", "value": "A"}]},
      r"line 2: field 'image' is missing"),
     (chat("a.png", "Q", "A", "Q2"), r"line 2: field conversations\[2\] is a question with no answer"),
     ({"image": "a.png", "conversations": [{"from": "gpt", "value": "A"}, {"from": "human", "value": "Q"}]},
      r"line 2: field conversations\[0\].from is 'gpt', expected 'human'"),
     (chat("missing.png", "Q", "A"), r"line 2: field 'image' 'missing.png' does not load"),
     (chat("a.png", "<image> a <image>", "A"), r"line 2: field conversations: .*image marker")],
)  # fmt: skip
def test_a_bad_conversation_record_is_refused_naming_the_file_line_and_field(tmp_path, record, message):
    data = conversations(tmp_path, [chat("a.png", "Q", "A"), record])
    with pytest.raises(DataError, match=message) as error:
        data.prepare_data()
    assert "train.jsonl" in str(error.value)


def test_the_new_facts_compare_as_the_contract_says_and_survive_a_checkpoints_dict():
    from lightformer.facts import DataFacts

    facts = DataFacts(chat_template=ChatTemplate().as_dict(), groups=("lines/read/held-out",),
                      canvases={"line": [32, 192]})  # fmt: skip
    back = DataFacts.of(facts.as_dict())
    assert back == facts and back.groups == ("lines/read/held-out",) and back.canvases == {"line": [32, 192]}
    assert DataFacts.of({**facts.as_dict(), "groups": ["lines/word/held-out"]}).differences(facts) == []
    assert [d.split(":")[0] for d in facts.differences(DataFacts(chat_template=ChatTemplate(user="U: ").as_dict(),
                                                                 canvases={"line": [32, 256]}))] == [
        "chat_template", "canvases"]  # fmt: skip
