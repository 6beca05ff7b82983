"""The vision-language task: its answer metrics, its warm start from a language model of fewer positions, and (slow)
a few-second fit whose checkpoint answers questions through ``ask``, in order, an unreadable image named."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from lightformer.errors import ConfigError
from lightformer.models.gpt import GPT, GPTConfig, extend_positions
from lightformer.tasks.vision_language import GroupMeans, normalise_answer, read_questions, token_f1


def test_answers_compare_as_squad_does():
    assert normalise_answer("  Stop   Sign. ") == normalise_answer("stop sign")
    assert normalise_answer("stop") != normalise_answer("stop sign")
    assert token_f1("the red apple", "red apple") == pytest.approx(2 * (2 / 3) * 1 / (2 / 3 + 1))
    assert token_f1("a cat", "dog") == 0.0
    assert token_f1("cat, cat", "cat") == pytest.approx(2 * 0.5 * 1 / 1.5)  # a word counts as often as both hold it
    assert token_f1("", "") == 1.0 and token_f1("", "x") == 0.0


def test_group_means_weigh_each_value_in_its_group():
    metric = GroupMeans(3)
    metric.update(torch.tensor([1.0, 0.0, 0.5]), torch.tensor([0, 0, 2]), torch.tensor([3.0, 1.0, 2.0]))
    metric.update(torch.tensor([1.0]), torch.tensor([2]))
    per_group, overall = metric.compute()
    assert per_group[0].item() == pytest.approx(0.75) and math.isnan(per_group[1].item())
    assert per_group[2].item() == pytest.approx((0.5 * 2 + 1) / 3)
    assert overall.item() == pytest.approx((3 + 1 + 1) / 7)


def test_questions_file_names_the_line_that_is_not_image_tab_question(tmp_path):
    good = tmp_path / "q.tsv"
    good.write_text("a.png\tWhat is this?\n\n/abs/b.png\tWhich category?\n", encoding="utf-8")
    assert read_questions(str(good)) == [(str(tmp_path / "a.png"), "What is this?"), ("/abs/b.png", "Which category?")]
    bad = tmp_path / "bad.tsv"
    bad.write_text("a.png\tWhat is this?\nb.png What is that?\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"bad.tsv line 2 is not 'image<TAB>question'"):
        read_questions(str(bad))


def test_a_shorter_position_table_starts_the_first_positions():
    small = GPT(GPTConfig(vocab_size=11, block_size=8, d_model=16, n_heads=2, n_layers=1))
    large = GPT(GPTConfig(vocab_size=11, block_size=16, d_model=16, n_heads=2, n_layers=1))
    fresh = large.position.weight.detach().clone()
    weights = extend_positions(large, small.state_dict())
    large.load_state_dict(weights)
    assert torch.equal(large.position.weight[:8], small.position.weight)
    assert torch.equal(large.position.weight[8:], fresh[8:])
    ids = torch.randint(0, 11, (2, 8))
    assert torch.allclose(large(ids), small(ids), atol=1e-6)  # the first 8 positions behave as the small model's


# --- a short fit on coloured squares, and its checkpoint's commands ------------------------------------------------

TINY = dict(n_layers=1, d_model=32, n_heads=2, d_ff=64)


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> dict:
    """A short fit on squares of three colours in four corners (two turns each: colour, corner), its metrics and
    checkpoint."""
    import lightning as L

    from lightformer.data import ConversationFilesDataModule
    from lightformer.tasks.vision_language import VisionLanguageTask
    from lightformer.training.tensorboard import TensorBoardLogger
    from tiny_runs import write_square_conversations

    root = tmp_path_factory.mktemp("squares")
    torch.manual_seed(0)
    source = dict(train=str(write_square_conversations(root, count=96)), val_fraction=0.25, image_size=16)
    # plain dicts, as the command line gives them: the checkpoint stores them (loaded with weights_only)
    data = ConversationFilesDataModule(source, tokenizer=dict(kind="char"), template=dict(), loader=dict(batch_size=16),
                                       prepare=dict(dir=str(root / "prepared"), num_workers=1))  # fmt: skip
    data.prepare_data()
    net = dict(image=dict(patch_size=4, **TINY), text=dict(block_size=96, **TINY), pixel_shuffle=2)
    task = VisionLanguageTask(net=net, data_facts=data.data_facts(), num_logged_samples=2,
                              optimizer=dict(lr=3e-3, warmup_steps=10, weight_decay=0.0))  # fmt: skip
    logger = TensorBoardLogger(str(root / "runs"), name="squares", version=0)
    trainer = L.Trainer(accelerator="cpu", max_steps=300, val_check_interval=150, check_val_every_n_epoch=None,
                        logger=logger, enable_progress_bar=False, enable_model_summary=False,
                        num_sanity_val_steps=0, log_every_n_steps=10, default_root_dir=str(root))  # fmt: skip
    trainer.fit(task, datamodule=data)
    checkpoint = root / "squares.ckpt"
    trainer.save_checkpoint(checkpoint)
    metrics = {name: float(value) for name, value in trainer.callback_metrics.items()}
    return {"root": root, "metrics": metrics, "checkpoint": str(checkpoint), "task": task}


@pytest.mark.slow
def test_a_short_fit_answers_what_colour_the_square_is(trained):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    m = trained["metrics"]
    assert m["val/exact"] > 0.8, m  # three colours: chance 1/3
    assert m["val/files/answer/held-out/cer"] < 0.2, m
    events = EventAccumulator(str(trained["root"] / "runs" / "squares" / "version_0"))
    events.Reload()
    tags = events.Tags()
    assert {"val/loss", "val/exact", "val/f1", "val/files/answer/held-out/bleu"} <= set(tags["scalars"])
    assert {"val/sample_0", "val/answer_attention", "val/image_attention"} <= set(tags["images"])
    assert "val/answers/text_summary" in set(tags["tensors"])


@pytest.mark.slow
def test_ask_answers_50_questions_on_20_images_in_order_and_names_an_unreadable_one(trained, tmp_path, capsys):
    from lightformer.tasks.vision_language import ask

    root = trained["root"]
    images = [root / f"squares/{i:03d}.png" for i in range(20)]
    broken = tmp_path / "broken.png"
    broken.write_bytes(b"not an image")
    asked = [(images[i % 20], "What colour is the square?") for i in range(50)]
    asked.insert(7, (broken, "What colour is the square?"))
    questions = tmp_path / "questions.tsv"
    questions.write_text("".join(f"{path}\t{q}\n" for path, q in asked), encoding="utf-8")
    ask(ckpt_path=trained["checkpoint"], questions=str(questions))
    captured = capsys.readouterr()
    lines = captured.out.splitlines()
    assert len(lines) == 51 and lines[7] == ""
    colours = ["red", "green", "blue"]
    expected = [colours[int(path.stem) % 3] if path != broken else "" for path, _ in asked]
    right = sum(line == want for line, want in zip(lines, expected, strict=True) if want)
    assert right >= 45, list(zip(lines, expected, strict=True))
    assert f"ask: {broken}:" in captured.err

    ask(ckpt_path=trained["checkpoint"], images=[str(images[0]), str(images[1])],
        question=["What colour is the square?", "Which corner is it in?"])  # fmt: skip
    assert len(capsys.readouterr().out.splitlines()) == 4  # each question of each image


def test_data_whose_text_and_image_outgrow_the_positions_is_refused_naming_the_block_size():
    from lightformer.facts import DataFacts
    from lightformer.tasks.vision_language import VisionLanguageTask

    facts = DataFacts(vocab_size=20, pad_id=0, image_size=(16, 16), in_channels=3, image_fit="resize", max_length=60,
                      canvases={"resize": [16, 16], "line": [16, 64]})  # fmt: skip
    net = dict(image=dict(patch_size=4, **TINY), text=dict(block_size=64, **TINY))
    task = VisionLanguageTask(net=net, data_facts=facts)
    message = (
        r"^model.net.text.block_size=64 is shorter than the data's texts: the data has texts of up to 75 positions "
        r"\(60 tokens and 16 image tokens of its line images of 16 × 64 pixels, the image placeholder counted once\)"
        r".*; set model.net.text.block_size >= 75 or give the data shorter texts$"
    )
    with pytest.raises(ConfigError, match=message):
        task.check_data(facts, "fit")
    shuffled = VisionLanguageTask(net=net | {"pixel_shuffle": 4}, data_facts=facts)  # 1 + 4 tokens: it fits
    shuffled.check_data(facts, "fit")
    with pytest.raises(ConfigError, match=r"model.beam_size=0 must be at least 1"):
        VisionLanguageTask(net=net, data_facts=facts, beam_size=0)


def test_the_ctc_loss_is_ctcs_per_character_over_the_rows_that_show_a_text():
    from lightformer.facts import DataFacts
    from lightformer.tasks.vision_language import VisionLanguageTask

    facts = DataFacts(vocab_size=20, pad_id=0, image_size=(16, 32), in_channels=3, image_fit="line", max_length=12)
    net = dict(image=dict(patch_size=4, **TINY), text=dict(block_size=64, **TINY), ctc_head=True)
    torch.manual_seed(0)
    task = VisionLanguageTask(net=net, data_facts=facts, ctc_weight=0.5)
    ids = torch.randint(3, 20, (3, 8))
    ids[:, 1] = 20  # the placeholder
    images, labels = torch.randn(3, 3, 16, 32), torch.randint(3, 20, (3, 8))
    transcript = torch.tensor([[5, 6, 6, 7], [0, 0, 0, 0], [9, 4, 0, 0]])
    lengths = torch.tensor([4, 0, 2])
    answers, ctc = task._joint_loss(ids, images, labels, transcript, lengths)
    torch.testing.assert_close(answers, task._answer_loss(ids, images, labels))
    reading = task.model(ids, images, ctc=True)[1].log_softmax(-1)
    by_row = [
        F.ctc_loss(reading[i].unsqueeze(1), transcript[i : i + 1, : lengths[i]], [32], [int(lengths[i])], blank=0)
        for i in (0, 2)
    ]  # each row's loss per character
    torch.testing.assert_close(ctc, (by_row[0] + by_row[1]) / 2)
    _, none = task._joint_loss(ids, images, labels, transcript, torch.zeros(3, dtype=torch.long))
    assert none == 0  # no row shows a text: nothing to spell
    with pytest.raises(ConfigError, match=r"model.ctc_weight=0.5 must be at least 0, and above 0 only with "
                                          r"model.net.ctc_head=true"):  # fmt: skip
        VisionLanguageTask(net=net | {"ctc_head": False}, data_facts=facts, ctc_weight=0.5)
    unused = VisionLanguageTask(net=net, data_facts=facts)  # a head the loss does not train: frozen, as DDP needs
    assert not any(p.requires_grad for p in unused.model.ctc_head.parameters())


def test_the_answers_attention_is_laid_out_on_the_grid_of_any_patch_shape():
    from lightformer.facts import DataFacts
    from lightformer.tasks.vision_language import VisionLanguageTask
    from lightformer.tokenization.text import Tokenizer

    tokenizer = Tokenizer.train_char(["Q: What does it say?\nA: a line"])
    facts = DataFacts(tokenizer=tokenizer.to_str(), vocab_size=tokenizer.vocab_size, pad_id=tokenizer.pad_id,
                      image_size=(32, 64), in_channels=3, image_fit="line", max_length=30)  # fmt: skip
    for patch, shuffle, grid in (([32, 4], 1, (1, 16)), ([8, 4], 2, (2, 8)), (8, 2, (2, 4))):
        net = dict(image=dict(patch_size=patch, **TINY), text=dict(block_size=64, **TINY), pixel_shuffle=shuffle)
        task = VisionLanguageTask(net=net, data_facts=facts)
        prompt = task.prompt_ids("What does it say?")
        tokens, maps = task.answer_attention(torch.tensor(prompt), len(prompt), torch.randn(3, 32, 64), "a line")
        assert len(tokens) == 7 and maps.shape == (7, *grid)  # "a line" and EOS, over the image's tokens
        assert (maps >= 0).all() and (maps.sum((1, 2)) <= 1 + 1e-5).all()  # a share of each token's attention


def test_ask_refuses_options_that_say_no_question_before_reading_a_checkpoint(tmp_path):
    from lightformer.tasks.vision_language import ask

    missing = str(tmp_path / "none.ckpt")
    with pytest.raises(ConfigError, match=r"ask takes --images FILE \.\.\. with --question"):
        ask(ckpt_path=missing, images=["a.png"], questions="q.tsv")
    with pytest.raises(ConfigError, match=r"ask needs both --images FILE \.\.\. and --question"):
        ask(ckpt_path=missing, images=["a.png"])
    with pytest.raises(
        ConfigError, match=r"--fit='crop' is not a way to fit an image; valid: drawing, line, resize, pad"
    ):
        ask(ckpt_path=missing, images=["a.png"], question="What is this?", fit="crop")
