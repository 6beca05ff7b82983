"""Image to text from the command line: fit a tiny model on rendered lines, test it (CER, WER, exact lines), and
`read` line images of any size in order, a blank or unreadable one as an empty line without losing the others."""

from __future__ import annotations

import csv

import numpy as np
import pytest
from PIL import Image

from lightformer.cli import cli_main, main
from lightformer.data.raw.image_files import fit_line
from lightformer.data.raw.rendering import discover_fonts
from lightformer.tasks.image_text import ImageToTextTask
from tiny_runs import last_checkpoint, run_cli, task_args

pytestmark = pytest.mark.skipif(not discover_fonts(), reason="no fonts under /usr/share/fonts")


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
