"""Bad config and bad data fail early, with a message that names the offending field, file or value and says
what would be valid. One test per kind of error (issue "Reliability"); each runs in a few seconds on tiny data."""

import numpy as np
import pytest
import torch
from PIL import Image

from lightformer.cli.main import cli_main, main
from lightformer.data import ImageDataModule, TextDataModule, TranslationDataModule
from lightformer.data.families.pairs import PairBatches
from lightformer.data.preparation.prepare import PrepareConfig, TokenizerConfig
from lightformer.data.sources.image_files import load_image
from lightformer.data.sources.images import ImageSource
from lightformer.data.sources.pairs import PairSource
from lightformer.data.sources.text import TextSource
from lightformer.models import GPT, EncoderDecoderConfig, GPTConfig, VisionTransformer, ViTConfig
from lightformer.nn import MultiHeadAttention
from lightformer.tasks import LanguageModelTask, TranslationTask
from lightformer.tokenization.text import MIN_BPE_VOCAB_SIZE, Tokenizer
from tiny_runs import FactsOnly, with_data

TINY_LM = dict(n_layers=1, n_heads=2, d_model=16)
TINY_TRANSLATOR = dict(n_encoder_layers=1, n_decoder_layers=1, d_model=16, n_heads=2, d_ff=32)
TINY_VIT = dict(num_classes=10, image_size=8, in_channels=1, patch_size=2, d_model=16, n_layers=1, n_heads=2)


def lm(**net) -> LanguageModelTask:
    return LanguageModelTask(net=GPTConfig(**(TINY_LM | net)))


def translator(**net) -> TranslationTask:
    return TranslationTask(net=EncoderDecoderConfig(**(TINY_TRANSLATOR | net)))


def write_pairs(path, n: int = 30, words: int = 3):
    lines = []
    for i in range(n):
        lines.append(" ".join(f"w{i}x{j}" for j in range(words)) + "\t" + " ".join(f"v{i}y{j}" for j in range(words)))
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def translation_data(tmp_path, tsv=None, batches: PairBatches = PairBatches(), **source) -> TranslationDataModule:
    """A translation module of the TSV file ``tsv`` (or of the ``source`` fields) with the smallest BPE."""
    return TranslationDataModule(
        PairSource(**({"tsv_files": [str(tsv)]} if tsv is not None else source)),
        TokenizerConfig(kind="bpe", vocab_size=MIN_BPE_VOCAB_SIZE),
        batches,
        PrepareConfig(dir=str(tmp_path / "prepared")),
    )


# --- config errors: before training starts -------------------------------------------------------------------


def refused_override(tmp_path, capsys, name: str, override: str) -> str:
    """Standard error of ``fit`` with the digits config plus the YAML ``override``, which must be refused."""
    path = tmp_path / f"{name}.yaml"
    path.write_text(override, encoding="utf-8")
    with pytest.raises(SystemExit) as exit_info:
        cli_main(["fit", "--config=configs/vision/vit_digits.yaml", f"--config={path}"], run=False)
    assert exit_info.value.code != 0
    return capsys.readouterr().err


def test_1_unknown_config_key_and_wrong_type_are_named(tmp_path, capsys):
    err = refused_override(tmp_path, capsys, "typo", "model:\n  init_args:\n    net:\n      d_modle: 64\n")
    assert "Group 'net' does not accept option 'd_modle'" in err

    err = refused_override(tmp_path, capsys, "wrong_type", "model:\n  init_args:\n    net:\n      d_model: big\n")
    assert "d_model" in err and "Expected a <class 'int'>" in err and "big" in err


@pytest.mark.parametrize(
    "build",
    [
        lambda: GPTConfig(vocab_size=10, n_layers=1, d_model=30, n_heads=4),
        lambda: EncoderDecoderConfig(src_vocab_size=10, tgt_vocab_size=10, n_encoder_layers=1, d_model=30, n_heads=4),
        lambda: ViTConfig(image_size=8, patch_size=2, n_layers=1, d_model=30, n_heads=4),
    ],
    ids=["lm", "translation", "vision"],
)
def test_2_heads_must_divide_d_model(build):
    with pytest.raises(ValueError, match="d_model=30 is not divisible by n_heads=4") as error:
        MultiHeadAttention(30, 4)
    assert "n_heads to a divisor of 30 such as 3 or 5, or d_model to a multiple of 4 such as 28 or 32" in str(
        error.value
    )
    with pytest.raises(ValueError, match=r"d_model=30 is not divisible by n_heads=4"):
        build()


def test_3_sequences_longer_than_the_position_table(tmp_path):
    gpt = GPT(GPTConfig(vocab_size=10, block_size=8, **TINY_LM))
    with pytest.raises(ValueError, match="sequence of 9 tokens is longer than block_size=8"):
        gpt(torch.zeros(1, 9, dtype=torch.long))

    task = with_data(lm(vocab_size=10, block_size=8), FactsOnly(max_length=16))
    with pytest.raises(ValueError, match=r"the data gives block_size=16 but the model has model\.net\.block_size=8"):
        task.setup("fit")

    # Byte-level BPE without merges: "w0x0 w0x1 w0x2 w0x3" + EOS is 20 source tokens.
    datamodule = translation_data(
        tmp_path, write_pairs(tmp_path / "long.tsv", words=4), PairBatches(max_sentence_tokens=32)
    )
    datamodule.setup("fit")
    facts = datamodule.data_facts()
    sizes = dict(src_vocab_size=facts.src_vocab_size, tgt_vocab_size=facts.tgt_vocab_size)
    task = with_data(translator(**sizes, max_len=8), datamodule)
    with pytest.raises(ValueError, match=r"model\.net\.max_len=8 is shorter than the data's sentences: .* \(at most "
                                         r"data.batches.max_sentence_tokens\)") as error:  # fmt: skip
        task.setup("fit")
    assert f"set model.net.max_len >= {facts.max_length} or data.batches.max_sentence_tokens <= 8" in str(error.value)
    with_data(translator(**sizes, max_len=32), datamodule).setup("fit")  # fits: no error


def test_4_image_size_must_be_a_multiple_of_the_patch_size():
    with pytest.raises(ValueError) as error:
        ViTConfig(image_size=28, patch_size=5, n_layers=1, d_model=16, n_heads=2)
    message = str(error.value)
    assert "image_size=28 is not a multiple of patch_size=5" in message
    assert "a divisor of 28 such as 4 or 7" in message
    assert "(the data's image_size) to a multiple of 5 such as 25 or 30" in message


def test_5_vocabulary_smaller_than_the_tokenizer():
    tokenizer = Tokenizer.train_char(["abcdefghijklmnop"])  # 4 special + 16 characters
    task = with_data(lm(vocab_size=5, block_size=8), FactsOnly(tokenizer=tokenizer.to_str(), vocab_size=20))
    with pytest.raises(ValueError, match=r"the data gives vocab_size=20 but the model has model\.net\.vocab_size=5"):
        task.setup("fit")

    text = tokenizer.to_str()
    data = FactsOnly(src_tokenizer=text, tgt_tokenizer=text, src_vocab_size=20, tgt_vocab_size=20)
    task = with_data(translator(src_vocab_size=10, tgt_vocab_size=10), data)
    with pytest.raises(ValueError, match=r"gives src_vocab_size=20 but the model has model\.net\.src_vocab_size=10"):
        task.setup("fit")


# --- data errors ------------------------------------------------------------------------------------------------


def text_data(tmp_path, path) -> TextDataModule:
    source = TextSource(train_files=[str(path)])
    return TextDataModule(source=source, prepare=PrepareConfig(dir=str(tmp_path / "prepared")))


def test_6_missing_paths_are_named(tmp_path, capsys):
    missing = tmp_path / "missing.txt"
    with pytest.raises(FileNotFoundError, match=r"train_files: the file '.*missing\.txt' does not exist"):
        text_data(tmp_path, missing).prepare_data()
    with pytest.raises(FileNotFoundError, match=r"tsv_files: the file '.*missing\.tsv' does not exist"):
        translation_data(tmp_path, tmp_path / "missing.tsv").prepare_data()
    present = write_pairs(tmp_path / "present.de")
    absent = tmp_path / "absent.en"
    parallel = translation_data(tmp_path, src_file=str(present), tgt_file=str(absent))
    with pytest.raises(FileNotFoundError, match=r"tgt_file: the file '.*absent\.en' does not exist"):
        parallel.prepare_data()
    with pytest.raises(FileNotFoundError, match=r"image_folder .*no-such-folder is not an existing directory"):
        ImageDataModule(source=ImageSource(dataset="image_folder", image_folder=str(tmp_path / "no-such-folder")))

    nope = str(tmp_path / "nope.ckpt")
    for command in (["generate"], ["translate"], ["classify", f"--images={present}"]):
        with pytest.raises(SystemExit) as exit_info:
            main([*command, f"--ckpt_path={nope}"])
        assert exit_info.value.code == f"lightformer: --ckpt_path: the checkpoint file {nope!r} does not exist"


def test_7_empty_corpus(tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_text("", encoding="utf-8")
    with pytest.raises(ValueError, match=r"the training text is empty \(.*empty\.txt\); give files that hold text"):
        text_data(tmp_path, empty).prepare_data()
    blank = tmp_path / "blank.tsv"
    blank.write_text("\n\n", encoding="utf-8")
    for tsv in (tmp_path / "empty.txt", blank):
        with pytest.raises(ValueError, match=rf"no sentence pairs in tsv .*{tsv.name}.*'source<TAB>target' lines"):
            translation_data(tmp_path, tsv).prepare_data()


def test_8_bytes_that_are_not_utf8_are_located(tmp_path):
    latin1 = "ok line\nna\xefve caf\xe9\n".encode("latin-1")  # first bad byte: 0xef at offset 10, line 2
    text = tmp_path / "latin1.txt"
    text.write_bytes(latin1)
    with pytest.raises(ValueError, match=r"latin1\.txt is not UTF-8 text: byte 0xef at byte offset 10"):
        text_data(tmp_path, text).prepare_data()
    tsv = tmp_path / "latin1.tsv"
    tsv.write_bytes(b"a b c\tx y z\n" + latin1.replace(b"\n", b"\tq\n"))
    with pytest.raises(ValueError, match=r"latin1\.tsv is not UTF-8 text: byte 0xef at byte offset 24"):
        translation_data(tmp_path, tsv).prepare_data()
    src = tmp_path / "latin1.de"
    src.write_bytes(latin1)
    tgt = tmp_path / "fine.en"
    tgt.write_text("one\ntwo\n", encoding="utf-8")
    parallel = translation_data(tmp_path, src_file=str(src), tgt_file=str(tgt))
    with pytest.raises(ValueError, match=r"latin1\.de is not UTF-8 text: byte 0xef at byte offset 10"):
        parallel.prepare_data()


def test_9_parallel_files_with_different_line_counts(tmp_path):
    src, tgt = tmp_path / "x.de", tmp_path / "x.en"
    src.write_text("eins\nzwei\ndrei\n", encoding="utf-8")
    tgt.write_text("one\ntwo\n", encoding="utf-8")
    parallel = translation_data(tmp_path, src_file=str(src), tgt_file=str(tgt))
    with pytest.raises(ValueError, match=r"x\.de has 3 lines, .*x\.en has 2; line i of one must translate line i"):
        parallel.prepare_data()


def test_10_images_of_the_wrong_mode_or_shape(tmp_path):
    # 8-bit modes are converted: alpha dropped, palette and CMYK mapped, grey <-> RGB.
    for mode in ("RGBA", "LA", "P", "CMYK", "1", "L", "RGB"):
        path = tmp_path / f"{mode}.{'jpg' if mode == 'CMYK' else 'png'}"
        Image.new(mode, (6, 4)).save(path)
        assert load_image(path, in_channels=3).mode == "RGB" and load_image(path, in_channels=1).mode == "L"
    # 16-bit grey keeps its most significant byte (PIL's convert would clip everything above 255 to white).
    grey16 = tmp_path / "grey16.png"
    Image.fromarray(np.array([[0, 256, 32768, 65535]], dtype=np.uint16)).save(grey16)
    assert Image.open(grey16).mode == "I;16"
    assert np.asarray(load_image(grey16, in_channels=1)).tolist() == [[0, 1, 128, 255]]
    assert np.asarray(load_image(grey16, in_channels=3))[0, 3].tolist() == [255, 255, 255]
    # 32-bit float pixels have no 8-bit range: refused, naming the file and its mode.
    floats = tmp_path / "floats.tiff"
    Image.fromarray(np.zeros((4, 4), dtype=np.float32)).save(floats)
    with pytest.raises(ValueError, match=r"floats\.tiff has 32-bit float pixels \(PIL mode 'F'\)"):
        load_image(floats, in_channels=3)
    notes = tmp_path / "notes.png"
    notes.write_text("not an image", encoding="utf-8")
    with pytest.raises(ValueError, match=r"notes\.png is not a readable image file"):
        load_image(notes)

    vit = VisionTransformer(ViTConfig(**TINY_VIT))
    for shape in ((2, 3, 8, 8), (2, 1, 16, 16), (1, 8, 8)):
        with pytest.raises(ValueError, match=rf"expected images of shape \(batch, 1, 8, 8\), got {re_tuple(shape)}"):
            vit(torch.zeros(shape))
    with pytest.raises(ValueError, match=r"add a batch dimension"):
        vit(torch.zeros(1, 8, 8))


def re_tuple(shape: tuple[int, ...]) -> str:
    return r"\(" + ", ".join(map(str, shape)) + r"\)"


def test_11_tokenizer_that_does_not_match_the_checkpoint(tmp_path):
    trained_with, other = Tokenizer.train_char(["abcdef"]), Tokenizer.train_char(["abcxyz"])  # same size, ids differ
    facts = {"tokenizer": trained_with.to_str(), "vocab_size": 10}
    task = LanguageModelTask(net=GPTConfig(block_size=8, **TINY_LM), data_facts=facts)
    checkpoint = {"state_dict": task.state_dict(), "hyper_parameters": dict(task.hparams)}
    path = tmp_path / "lm.ckpt"
    torch.save(checkpoint | {"pytorch-lightning_version": "2.6.6"}, path)
    other_data = FactsOnly(tokenizer=other.to_str(), vocab_size=10, max_length=8)

    # A checkpoint loaded, then trained or evaluated on other data.
    loaded = with_data(LanguageModelTask.load_from_checkpoint(path), other_data)
    with pytest.raises(ValueError, match="the data differs from what the checkpoint's model was trained with") as error:
        loaded.setup("fit")
    assert "id 7 is 'd' in the first, 'x' in the second" in str(error.value)
    assert "tokenizer.file" in str(error.value)
    # `Trainer.fit(task, ckpt_path=...)` of a task built without facts: the data's come first (setup), the
    # checkpoint's after.
    resumed = with_data(lm(vocab_size=12, block_size=8), other_data)
    resumed.setup("fit")
    with pytest.raises(ValueError, match="tokenizer: char tokenizer of 10 tokens vs char tokenizer of 10 tokens"):
        resumed.on_load_checkpoint(checkpoint)
    # The same tokenizer (rebuilt from the same text) is accepted.
    same = FactsOnly(tokenizer=Tokenizer.train_char(["abcdef"]).to_str(), vocab_size=10, max_length=8)
    with_data(LanguageModelTask.load_from_checkpoint(path), same).setup("fit")

    text, other_text = trained_with.to_str(), other.to_str()
    trained = translator(src_vocab_size=12, tgt_vocab_size=12)
    data = dict(src_vocab_size=10, tgt_vocab_size=10)
    with_data(trained, FactsOnly(src_tokenizer=text, tgt_tokenizer=text, **data)).setup("fit")
    checkpoint = {"hyper_parameters": dict(trained.hparams)}
    resumed = with_data(translator(src_vocab_size=12, tgt_vocab_size=12),
                        FactsOnly(src_tokenizer=text, tgt_tokenizer=other_text, **data))  # fmt: skip
    resumed.setup("fit")
    with pytest.raises(ValueError, match="tgt_tokenizer: char tokenizer of 10 tokens vs"):
        resumed.on_load_checkpoint(checkpoint)
    with_data(trained, FactsOnly(src_tokenizer=other_text, tgt_tokenizer=other_text, **data))
    with pytest.raises(ValueError, match=r"\(the checkpoint's model vs the data: src_tokenizer: .*; tgt_tokenizer: "):
        trained.setup("test")
