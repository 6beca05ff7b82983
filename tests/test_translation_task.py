"""The translation task end to end through the CLI, on a toy task that only correct masks can learn."""

import math
import random

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from lightformer.cli.main import cli_main, main

SYMBOLS = "abcdefghij"


def reversal_pairs(n: int, seed: int) -> list[tuple[str, str]]:
    """Random words of 3–7 symbols and their reversal: "c a f" → "f a c"."""
    rng = random.Random(seed)
    pairs = []
    for _ in range(n):
        words = [rng.choice(SYMBOLS) for _ in range(rng.randint(3, 7))]
        pairs.append((" ".join(words), " ".join(reversed(words))))
    return pairs


def write_tsv(path, pairs):
    path.write_text("".join(f"{s}\t{t}\n" for s, t in pairs), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """Fit the Ding config's task on the reversal toy task (a few hundred steps), then test it."""
    tmp = tmp_path_factory.mktemp("reverse")
    train = write_tsv(tmp / "train.tsv", reversal_pairs(6000, seed=0))
    val = write_tsv(tmp / "val.tsv", reversal_pairs(200, seed=1))
    test = write_tsv(tmp / "test.tsv", reversal_pairs(200, seed=2))
    args = [
        "--config=configs/translation/ding_de_en.yaml",
        "--data.source.corpus=null",
        "--data.source.ding_phrases=false",
        f"--data.source.tsv_files=[{train}]",
        f"--data.source.val_tsv_files=[{val}]",
        f"--data.source.test_tsv_files=[{test}]",
        "--data.tokenizer.vocab_size=300",
        "--data.batches.max_tokens=1024",
        f"--data.prepare.dir={tmp / 'prepared'}",
        "--model.net.n_encoder_layers=2",
        "--model.net.n_decoder_layers=2",
        "--model.net.d_model=64",
        "--model.net.n_heads=4",
        "--model.net.d_ff=128",
        "--model.net.dropout=0.0",
        "--model.net.max_len=32",
        "--model.optimizer.lr=2e-3",
        "--model.optimizer.warmup_steps=50",
        "--model.optimizer.schedule=cosine",
        "--model.optimizer.fit_to_max_time=false",  # no max_time to fit to
        "--trainer.precision=32-true",
        "--trainer.max_time=null",
        "--trainer.max_steps=500",
        "--trainer.val_check_interval=250",
        "--trainer.check_val_every_n_epoch=null",
        f"--trainer.logger.init_args.save_dir={tmp / 'runs'}",
        "--trainer.enable_progress_bar=false",
    ]
    cli = cli_main(["fit", *args, "--trainer.logger.init_args.version=fit"])
    log_dir = tmp / "runs" / "ding_de_en"
    ckpt = log_dir / "fit" / "checkpoints" / "last.ckpt"
    cli_main(["test", *args, "--trainer.logger.init_args.version=test", f"--ckpt_path={ckpt}"])
    return cli.model, log_dir, ckpt, tmp


@pytest.mark.slow
def test_reversal_is_learned_to_99_percent_exact_match(trained):
    task, *_ = trained
    pairs = reversal_pairs(300, seed=3)
    for beam_size in (1, 4):
        translations = task.translate([s for s, _ in pairs], beam_size=beam_size)
        exact = sum(t == ref for t, (_, ref) in zip(translations, pairs, strict=True)) / len(pairs)
        assert exact >= 0.99, f"beam {beam_size}: exact match {exact:.3f}"


@pytest.mark.slow
def test_fit_and_test_write_bleu_loss_samples_and_attention(trained):
    _, log_dir, _, _ = trained
    test_events = EventAccumulator(str(log_dir / "test"))
    test_events.Reload()
    assert {"test/bleu", "test/loss"} <= set(test_events.Tags()["scalars"])
    assert test_events.Scalars("test/bleu")[-1].value > 90
    events = EventAccumulator(str(log_dir / "fit"))
    events.Reload()
    assert {"train/loss", "val/loss", "val/bleu"} <= set(events.Tags()["scalars"])
    assert events.Scalars("val/bleu")[-1].value > 90
    assert all(math.isfinite(e.value) for e in events.Scalars("train/loss"))
    assert any(t.startswith("val/translations") for t in events.Tags()["tensors"])
    assert "val/cross_attention" in events.Tags()["images"]
    image = events.Images("val/cross_attention")[-1]
    assert image.width > 0 and image.height > 0


@pytest.mark.slow
def test_checkpoint_alone_translates_a_file(trained, capsys):
    _, _, ckpt, tmp = trained
    pairs = reversal_pairs(5, seed=4)
    source = tmp / "input.txt"
    source.write_text("".join(s + "\n" for s, _ in pairs), encoding="utf-8")
    (tmp / "train.tsv").unlink()  # no data, no config: the checkpoint carries the tokenizers
    capsys.readouterr()
    main(["translate", f"--ckpt_path={ckpt}", f"--input={source}", "--beam_size=2"])
    assert capsys.readouterr().out.splitlines() == [t for _, t in pairs]
