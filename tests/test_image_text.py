"""Image to text from the command line: fit a tiny model on rendered lines, test it (CER, WER, exact lines), and
`read` line images of any size in order, a blank or unreadable one as an empty line without losing the others."""

from __future__ import annotations

import csv
from types import SimpleNamespace

import numpy as np
import pytest
from PIL import Image

from lightformer.cli.main import cli_main, main
from lightformer.data.sources.image_files import fit_line
from lightformer.data.sources.rendering import missing_typefaces
from lightformer.facts import DataFacts
from lightformer.tasks.image_text import (
    ImageToTextTask,
    ink_columns,
    join_readings,
    line_canvases,
    window_spans,
)
from tiny_runs import last_checkpoint, run_cli, task_args

pytestmark = pytest.mark.skipif(bool(missing_typefaces()), reason="the declared typefaces are not all installed")


def test_a_line_of_any_size_is_fitted_to_the_canvas_as_lines_are_rendered():
    line = Image.new("L", (100, 20), 230)
    line.paste(20, (10, 5, 90, 15))  # dark ink in the middle
    fitted = np.asarray(fit_line(line, 32, 384))
    assert fitted.shape == (32, 384)
    ink_columns = np.flatnonzero((fitted < 128).any(axis=0))
    assert 14 <= ink_columns[0] <= 18 and 142 <= ink_columns[-1] <= 146  # scaled by 32 / 20, at the left
    assert (fitted[:, 170:] == 230).all()  # the rest: the line's own background
    wide = np.asarray(fit_line(Image.new("L", (2000, 40), 200), 32, 384))  # scaled to the width, centred
    assert wide.shape == (32, 384) and (wide == 200).all()


@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("image_text")
    run_cli(["fit", *task_args("image_text", tmp_path), "--trainer.max_epochs=2"], tmp_path / "fit.log")
    return tmp_path, last_checkpoint(tmp_path)


def test_test_reports_the_error_rates_and_exact_lines_of_the_held_out_typefaces(fitted, capsys):
    tmp_path, checkpoint = fitted
    capsys.readouterr()
    main(["test", *task_args("image_text", tmp_path / "test"), f"--ckpt_path={checkpoint}"])
    out = capsys.readouterr().out
    for metric in ("test/cer", "test/wer", "test/exact", "test/bleu", "test/loss"):
        assert metric in out


def test_read_prints_one_line_per_image_in_order_and_an_empty_line_for_a_blank_or_unreadable_one(
    fitted, tmp_path, capsys
):
    _, checkpoint = fitted
    rng = np.random.default_rng(0)
    paths = []
    for i in range(200):  # lines of every size and aspect, grey and colour
        height, width = int(rng.integers(8, 80)), int(rng.integers(8, 900))
        pixels = rng.integers(0, 256, (height, width, 3) if i % 3 == 0 else (height, width), dtype=np.uint8)
        path = tmp_path / f"line_{i:03d}.png"
        Image.fromarray(pixels).save(path)
        paths.append(path)
    Image.new("L", (300, 32), 255).save(paths[17])  # blank
    paths[42].write_text("not an image")
    paths[199].write_bytes(b"")

    task = ImageToTextTask.load_from_checkpoint(checkpoint, map_location="cpu")
    expected = task.read_files([str(p) for p in paths])
    assert [i for i, reading in enumerate(expected) if isinstance(reading, Exception)] == [17, 42, 199]
    for batch_size in (256, 7):
        capsys.readouterr()
        main(["read", f"--ckpt_path={checkpoint}", f"--images={tmp_path}/line_*.png", f"--batch_size={batch_size}"])
        captured = capsys.readouterr()
        lines = captured.out.split("\n")[:-1]
        assert len(lines) == 200
        assert lines[17] == lines[42] == lines[199] == ""
        if batch_size == 256:  # the same batch as read_files's: the same readings, in the order given
            assert lines == [reading if isinstance(reading, str) else "" for reading in expected]
        for i, reason in ((17, "is blank"), (42, "not a readable image"), (199, "not a readable image")):
            assert f"read: {paths[i]}: " in captured.err and reason in captured.err


def test_predict_writes_a_tsv_of_every_test_lines_reading_and_reference_in_order(fitted, caplog):
    tmp_path, checkpoint = fitted
    args = task_args("image_text", tmp_path / "predict")
    main(["predict", *args, f"--ckpt_path={checkpoint}"])
    (path,) = (tmp_path / "predict").glob("**/predictions.tsv")
    with path.open(newline="") as f:
        rows = list(csv.reader(f, dialect="excel-tab"))
    assert rows[0] == ["index", "reading", "reference"]
    task = ImageToTextTask.load_from_checkpoint(checkpoint, map_location="cpu")
    data = cli_main(args, run=False, data_only=True).datamodule
    data.prepare_data()
    (batch,) = data.test_dataloader()  # the 8 test lines
    assert rows[1:] == [[str(i), reading, text] for i, (reading, text) in
                        enumerate(zip(task.read_images(batch["images"]), batch["text"], strict=True))]  # fmt: skip
    assert f"wrote {path}: 8 readings" in caplog.text


# --- a line longer than the canvas: read in overlapping windows at the trained height ----------------------------

GREYS = {letter: 10 * (k + 1) for k, letter in enumerate("abcdefghij")}  # a synthetic typeface: one grey per letter


def synthetic_line(text: str, height: int = 16) -> Image.Image:
    """``text`` (letters a-j and spaces) as a line image of ``height``: each letter a 5-pixel block of its own grey,
    2 pixels between letters, 8 for a space, on white."""
    width = 4 + sum(8 if char == " " else 7 for char in text)
    pixels = np.full((height, width), 255, dtype=np.uint8)
    x = 2
    for char in text:
        if char != " ":
            pixels[3 : height - 3, x : x + 5] = GREYS[char]
        x += 8 if char == " " else 7
    return Image.fromarray(pixels)


def read_synthetic(canvas: np.ndarray) -> str:
    """What a perfect reader of the synthetic typeface reads on one canvas (its pixels, 0-255): every block whole or
    cut, in order; a gap of 6 pixels or more is a space."""
    row = canvas[canvas.shape[0] // 2]
    text, last_end = "", None
    for start in np.flatnonzero((row < 200) & ~np.r_[False, row[:-1] < 200]):
        end = start + int(np.argmax(np.r_[row[start:], 255] >= 200))
        text += " " * bool(last_end is not None and start - last_end >= 6)
        text += {v: k for k, v in GREYS.items()}[int(round(np.median(row[start:end]) / 10) * 10)]
        last_end = end
    return text


def synthetic_reader(canvases: list[tuple[int, int]]):
    """A stand-in for ``ImageToTextTask.read_images`` that reads the synthetic typeface, recording each batch's
    canvas shape."""

    def read_images(images, beam_size=None):
        canvases.append(tuple(images.shape[1:]))
        return [read_synthetic(np.rint((image[0].numpy() * 0.5 + 0.5) * 255)) for image in images]

    return read_images


def synthetic_task(height: int, width: int, canvases: list) -> SimpleNamespace:
    """The parts of an image-to-text task that ``read_files`` uses: a grey ``height`` × ``width`` canvas fitted as a
    line, and the synthetic reader."""
    config = SimpleNamespace(encoder=SimpleNamespace(in_channels=1, image_size=(height, width)))
    facts = DataFacts(normalize_mean=(0.5,), normalize_std=(0.5,), image_fit="line")
    task = SimpleNamespace(model=SimpleNamespace(config=config), data_facts=facts, device="cpu",
                           read_images=synthetic_reader(canvases))  # fmt: skip
    task.read_files = lambda *args, **kwargs: ImageToTextTask.read_files(task, *args, **kwargs)
    return task


def test_windows_of_a_long_line_overlap_and_are_cut_between_letters():
    line = synthetic_line("abc defg hij abcd efghij abc defgh ij abcdef ghij")
    ink = ink_columns(line)
    spans = window_spans(ink, 128, 32)
    assert spans[0][0] == 0 and spans[-1][1] == line.width and len(spans) >= 3
    for (start, end), (next_start, _) in zip(spans, spans[1:], strict=False):
        assert end - start <= 128 and 16 <= end - next_start <= 48  # about the overlap asked for
        assert not ink[end - 1] and not ink[next_start]  # no window starts or ends inside a letter


def test_windows_are_cut_between_words_where_a_space_is_near():
    """A cut in the widest stretch without ink near it: a space between words rather than a gap between letters (the
    model was trained on lines of whole words). At 2026-11-28's printed-lines checkpoint this took the CER of 50
    lines of 58 characters read in windows from 10.88% to 9.74% (8.70% read in canvas-sized pieces of whole words:
    ``benchmarks/long_lines.py``)."""
    ink = np.ones(300, dtype=bool)
    ink[[20, 40, 60, 80, 100, 110, 170, 180, 190, 215, 230]] = False  # gaps between letters, one column each
    ink[120:126] = False  # a space between words, inside the reach of the first cut (100..128)
    ink[196:202] = False  # and one inside the reach of the second window's start
    spans = window_spans(ink, 128, 32)
    assert spans[0] == (0, 123)  # the middle of the space, not the letter gap at 110 nearer the canvas's edge
    assert spans[1][0] == 100  # ... and the second window starts at the widest gap in its reach (all one wide)
    ink[84:90] = False
    assert window_spans(ink, 128, 32)[1][0] == 87  # a space there: the window starts in it


def test_join_readings_writes_what_both_windows_read_once():
    assert join_readings("the quick brown fo", "brown fox jumps", 6) == "the quick brown fox jumps"
    assert join_readings("aaa bbb", "bbb ccc", 3) == "aaa bbb ccc"
    assert join_readings("abc", "xyzdef", 3) == "abcdef"  # no agreement: the shared characters of the right go


@pytest.mark.parametrize("scale", [1, 3])
def test_read_reads_a_line_longer_than_the_canvas_in_windows_at_the_trained_height_without_repeats(tmp_path, scale):
    """Before: a line 10× the canvas's width was squeezed into it (and read as `memmmmm`)."""
    text = "abc defg hij abcd efghij abc defgh ij abcdef ghij jihgf edcba"
    line = synthetic_line(text)
    line.resize((line.width * scale, line.height * scale), Image.Resampling.NEAREST).save(tmp_path / "line.png")
    canvases: list = []
    task = synthetic_task(16, 128, canvases)
    warnings_: list[str] = []
    (reading,) = ImageToTextTask.read_files(task, [str(tmp_path / "line.png")], warn=warnings_.append)
    assert canvases == [(1, 16, 128)] and warnings_ == []  # windows on the trained canvas, its height kept
    n_windows = len(window_spans(ink_columns(line), 128, 32))
    assert n_windows >= 4
    assert reading == text


def test_read_warns_of_an_image_distorted_beyond_what_training_saw(tmp_path):
    """Before: a 60×2000 image read as `I own` with no word that it shrank 62×."""
    column = Image.new("L", (60, 2000), 255)
    column.paste(0, (10, 100, 50, 1900))
    column.save(tmp_path / "column.png")
    synthetic_line("abc").save(tmp_path / "line.png")
    canvases: list = []
    told: list[str] = []
    task = synthetic_task(16, 128, canvases)
    ImageToTextTask.read_files(task, [str(tmp_path / "column.png"), str(tmp_path / "line.png")], warn=told.append)
    assert told == [
        f"{tmp_path / 'column.png'}: 60×2000 pixels is taller than a line of text: it shrinks 125× to the model's "
        "line height of 16 pixels (and a page or column of lines is not read as such): give one line per image, "
        "cropped to its height"
    ]
    stretched = line_canvases(Image.new("L", (800, 20)), 32, 384, "resize")[2]
    assert (
        stretched == "800×20 pixels is narrowed 3× to the model's 384×32 canvas: crop it nearer to that shape "
        "for a reading the model was trained for"
    )
    assert line_canvases(Image.new("L", (300, 20)), 32, 384, "resize")[2] is None


def test_the_blank_margins_of_a_long_line_are_not_read(tmp_path):
    """A printed line at the left of a wide page strip: no window of blank paper (which a model reads as something)."""
    text = "abc defg hij abcd efghij abc defgh"
    line = synthetic_line(text)
    strip = Image.new("L", (2000, line.height), 255)
    strip.paste(line, (700, 0))
    strip.save(tmp_path / "strip.png")
    canvases, read = [], []
    task = synthetic_task(16, 128, canvases)
    task.read_images = lambda images, beam_size=None: read.extend(images) or synthetic_reader(canvases)(images)
    assert task.read_files([str(tmp_path / "strip.png")]) == [text]
    assert all((image < 1).any() for image in read)  # every window holds ink
    assert len(read) == len(window_spans(ink_columns(line), 128, 32))
