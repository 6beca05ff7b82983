"""benchmarks/peers.py, dropout.py, image_text_vs_hf.py, record_reads.py and clip_vs_openclip.py end to end on a tiny
budget (or their models checked against each other), and vlm_reading_variants.py's two changes: the real code path, no
timing assertions."""

import importlib
import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

PEERS = Path(__file__).resolve().parents[1] / "benchmarks" / "peers.py"


def run_peers(*args: str) -> str:
    return subprocess.run([sys.executable, str(PEERS), *args], stdout=subprocess.PIPE, text=True, check=True).stdout


def test_peers_prints_ratio_table_and_probes_memory():
    cell = ["--tasks", "lm", "--precisions", "fp32", "--compile", "off"]
    budget = ["--steps", "2", "--round-seconds", "0", "--rounds", "1", "--warmup", "1", "--threads", "1", "--no-memory"]
    lines = run_peers(*cell, *budget).splitlines()
    header = next(i for i, line in enumerate(lines) if "speed ours/peer" in line)
    columns = [c.strip() for c in lines[header].strip("|").split("|")]
    row = [c.strip() for c in lines[header + 2].strip("|").split("|")]
    assert row[:3] == ["lm", "fp32", "off"]
    speed = float(row[columns.index("speed ours/peer")])
    assert math.isfinite(speed) and speed > 0

    probe = run_peers("--memory-probe", "lm", "ours", "fp32", "--threads", "1")  # what the CPU run does per model
    mib = json.loads(probe.splitlines()[-1])["mib"]
    assert math.isfinite(mib) and mib > 0


def test_every_peers_task_reads_its_config_and_both_models_compute_its_loss():
    """The shapes come from the shipped configs: a renamed config key must fail here, not in a benchmark run."""
    sys.path.insert(0, str(PEERS.parent))
    try:
        peers = importlib.import_module("peers")
        for name in peers.TASKS:
            task = peers.make_task(name, "config")
            (inputs, targets), *_ = task.batches(1, torch.device("cpu"))
            for role in peers.ROLES:
                with torch.no_grad():
                    loss = peers.training_loss(task.build(role), inputs, targets, task.ignore_index)
                assert math.isfinite(loss.item()), (name, role)
    finally:
        sys.path.remove(str(PEERS.parent))


def test_dropout_benchmark_prints_a_ratio_for_each_shape_and_dtype():
    script = PEERS.parent / "dropout.py"
    out = subprocess.run(
        [sys.executable, str(script), "--rounds", "1", "--repeats", "1"], stdout=subprocess.PIPE, text=True, check=True
    ).stdout
    rows = [line for line in out.splitlines() if line.startswith("| ") and "µs" not in line]
    assert len(rows) == 4
    assert all(float(row.strip("| ").split("|")[-1]) > 0 for row in rows)


def test_image_text_benchmark_prints_both_models_speed_and_cer(tmp_path):
    """benchmarks/image_text_vs_hf.py --quick: a few lines rendered, tiny shapes, both models trained (with the CTC
    loss on their encoders) and read."""
    script = PEERS.parent / "image_text_vs_hf.py"
    command = [
        sys.executable,
        str(script),
        "--quick",
        "--threads",
        "1",
        "--prepare-dir",
        str(tmp_path),
        "--ctc-weight",
        "0.5",
    ]
    out = subprocess.run(command, stdout=subprocess.PIPE, text=True, check=True).stdout
    lines = out.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("| model |"))
    columns = [c.strip() for c in lines[header].strip("|").split("|")]
    rows = {row[0]: row for row in ([c.strip() for c in line.strip("|").split("|")] for line in lines[header + 2 :])}
    assert set(rows) >= {"lightformer", "HF VisionEncoderDecoderModel", "ours/HF"}
    for precision in ("fp32", "bf16"):
        ratio = float(rows["ours/HF"][columns.index(f"{precision} steps/s")].rstrip("×"))
        assert math.isfinite(ratio) and ratio > 0
    cer = next(i for i, name in enumerate(columns) if name.startswith("val CER"))
    for name in ("lightformer", "HF VisionEncoderDecoderModel"):
        assert float(rows[name][cer].rstrip("%")) >= 0


def test_record_reads_benchmark_prints_both_layouts_and_their_ratio():
    """benchmarks/record_reads.py on a few rendered lines: both layouts written, read at random, the ratio printed."""
    script = PEERS.parent / "record_reads.py"
    command = [sys.executable, str(script), "--lines", "600", "--reads", "100", "--rounds", "1", "--workers", "1"]
    out = subprocess.run(command, stdout=subprocess.PIPE, text=True, check=True).stdout
    rows = [line for line in out.splitlines() if line.startswith("| lightformer") or line.startswith("| LitData")]
    assert len(rows) == 2 and all(float(row.split("|")[4].replace(",", "")) > 0 for row in rows)
    ratio = float(out.split("ratio lightformer/default reads/s: ")[1].split()[0])
    assert math.isfinite(ratio) and ratio > 0


@pytest.mark.slow
def test_long_lines_benchmark_prints_the_cer_of_the_whole_line_and_of_its_pieces(tmp_path):
    """benchmarks/long_lines.py on a tiny image-to-text run (one step: its readings are noise): both ways read."""
    from tiny_runs import build, last_checkpoint, task_args

    cli = build([*task_args("image_text", tmp_path), "--trainer.max_steps=1", "--trainer.limit_val_batches=1"])
    cli.trainer.fit(cli.model, cli.datamodule)
    script = PEERS.parent / "long_lines.py"
    command = [sys.executable, str(script), f"--ckpt_path={last_checkpoint(tmp_path)}", "--lines=2", "--chars=30"]
    out = subprocess.run(command, stdout=subprocess.PIPE, text=True, check=True).stdout
    rows = dict(re.findall(r"^\| (the whole line \(windows\)|canvas-sized pieces) \| ([\d.]+)% \|$", out, re.M))
    assert len(rows) == 2 and all(math.isfinite(float(cer)) for cer in rows.values())
    assert re.search(r"^difference: [+-][\d.]+ points \((within|NOT within) the bar of 2 points\)$", out, re.M)


def test_openclip_built_from_our_weights_gives_our_embeddings():
    """benchmarks/clip_vs_openclip.py compares like with like: OpenCLIP's CLIP at our shape, loaded with our weights,
    embeds images and captions (padded to its context) as ours does."""
    sys.path.insert(0, str(PEERS.parent))
    try:
        bench = importlib.import_module("clip_vs_openclip")
    finally:
        sys.path.remove(str(PEERS.parent))
    from lightformer.facts import DataFacts

    facts = DataFacts(vocab_size=50, pad_id=0, image_size=16, in_channels=3)
    torch.manual_seed(0)
    tiny = dict(d_model=32, n_heads=4, n_layers=2)
    ours = bench.our_model({"image": {**tiny, "norm_eps": 1e-5}, "text": {**tiny, "block_size": 12}}, facts).eval()
    bench.check_shape(ours.config)  # a CLIP shape: accepted
    theirs = bench.openclip_model(ours.config, eos_id=2).eval()
    missing, unexpected = theirs.load_state_dict(bench.lightformer_to_openclip(ours.state_dict()), strict=False)
    assert not unexpected and set(missing) <= {"attn_mask"}
    images = torch.randn(3, 3, 16, 16)
    ids = torch.tensor([[1, 5, 6, 2, 0, 0, 0], [1, 7, 8, 9, 10, 11, 2], [1, 4, 2, 0, 0, 0, 0]])
    encode_image, encode_text = bench.openclip_encoders(theirs, 0)
    with torch.no_grad():
        mine_images, mine_texts = ours(images, ids)
        torch.testing.assert_close(encode_image(images), mine_images, atol=1e-5, rtol=0)
        torch.testing.assert_close(encode_text(ids), mine_texts, atol=1e-5, rtol=0)


def test_the_reading_variants_scramble_only_lowercase_letters_and_join_columns_of_patches():
    """benchmarks/vlm_reading_variants.py: the scrambled text keeps every character but the lowercase letters; the
    strips join each column of 4 patches, top first, into one token of the width a 2 × 2 block had."""
    sys.path.insert(0, str(PEERS.parent))
    try:
        variants = importlib.import_module("vlm_reading_variants")
    finally:
        sys.path.remove(str(PEERS.parent))
    text = "Emma Woodhouse, handsome, clever, and rich.\n" * 3
    scrambled = variants.scrambled(text)
    assert len(scrambled) == len(text) and scrambled != text
    assert re.sub("[a-z]", "x", scrambled) == re.sub("[a-z]", "x", text)
    assert variants.scrambled(text) == scrambled  # seeded
    rows, columns = 4, 3
    patches = torch.arange(rows * columns, dtype=torch.float32).reshape(1, rows * columns, 1) * torch.tensor([1, -1])
    tokens = variants.strips(patches, (rows, columns), 2)
    assert tokens.shape == (1, columns, 4 * 2)
    for column in range(columns):  # channels (row in the strip, channel): patch (row, column) is row * columns + column
        assert tokens[0, column, 0::2].tolist() == [row * columns + column for row in range(rows)]
    with pytest.raises(ValueError, match="strips join 4 patches a token: run it with pixel_shuffle=2, not 3"):
        variants.strips(patches, (rows, columns), 3)
