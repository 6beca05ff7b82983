"""The command line as a person meets it: one entry listing every command, short help for a config's task, and
progress that shows in a log file."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from lightformer.cli.main import TRAINER_COMMANDS, checkpoint_commands, cli_main, main
from lightformer.training.callbacks import NonFiniteLossGuard
from lightformer.training.progress import ProgressBar
from tiny_runs import task_args

REPO = Path(__file__).resolve().parents[1]
NINE = ["fit", "validate", "test", "predict", "generate", "translate", "classify", "export", "average"]


def test_help_lists_every_command_with_a_line_each(capsys):
    main(["--help"])
    shown = capsys.readouterr().out
    assert shown.startswith("usage: lightformer <command>")
    for command in NINE:
        assert f"\n  {command} " in shown, command
    assert set(NINE) <= set(TRAINER_COMMANDS) | set(checkpoint_commands())
    main([])  # no command: the same help
    assert capsys.readouterr().out == shown


def test_an_unknown_command_names_the_commands():
    with pytest.raises(SystemExit) as exit_info:
        main(["trian"])
    assert exit_info.value.code.startswith(
        "lightformer: unknown command 'trian'; the commands are: prepare, fit, validate"
    )


def test_prepare_takes_fits_command_line_and_fit_then_prepares_nothing(tmp_path, capsys, monkeypatch):
    from lightformer.cli.main import cli_main
    from lightformer.data.preparation import prepare

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("It is a truth universally acknowledged.\n" * 50, encoding="utf-8")
    args = [
        "--config=configs/lm/austen_char.yaml",
        "--data.source.corpus=null",
        f"--data.source.train_files=[{corpus}]",
        f"--data.prepare.dir={tmp_path / 'prepared'}",
        "--data.block_size=16",
        "--model.net.n_layers", "1",  # fit's options are read and ignored
        "--trainer.max_steps=2",
        f"--trainer.default_root_dir={tmp_path}",
        "--trainer.logger=false",
    ]  # fmt: skip
    main(["prepare", *args])
    folder = Path(capsys.readouterr().out.strip().removeprefix("prepared: "))
    assert folder.parent == tmp_path / "prepared" and (folder / "prepared.json").is_file()
    assert (folder / "train" / "index.json").is_file() and (folder / "val" / "index.json").is_file()

    def no_work(*args, **kwargs):
        raise AssertionError("fit should have found the data prepared")

    monkeypatch.setattr(prepare, "_prepare_text", no_work)
    cli = cli_main(["fit", *args, "--trainer.enable_progress_bar=false"])
    assert cli.trainer.global_step == 2 and cli.datamodule.prepared.folder == folder
    with pytest.raises(SystemExit, match=r"lightformer: data: .*train_files: the file '.*nope\.txt' does not exist"):
        main(["prepare", *args, f"--data.source.train_files=[{tmp_path / 'nope.txt'}]"])


def test_fit_help_with_a_config_shows_its_task_model_and_data_options(capsys):
    main(["fit", "--config", "configs/lm/austen_char.yaml", "--help"])
    shown = capsys.readouterr().out
    assert "the options of lightformer.tasks.LanguageModelTask and lightformer.data.TextDataModule" in shown
    for option in ("--model.net.n_layers", "--model.optimizer.lr", "--model.sample_tokens", "--data.block_size"):
        assert option in shown, option
    assert "--trainer.max_steps" not in shown and len(shown.splitlines()) < 400  # not Lightning's 550 lines


def test_the_program_calls_itself_lightformer(capsys):
    with pytest.raises(SystemExit):
        main(["generate", "--help"])
    assert capsys.readouterr().out.startswith("usage: lightformer generate")


@pytest.mark.slow
def test_a_run_logged_to_a_file_says_where_it_is(tmp_path):
    """Output to a file (not a terminal): no progress bar, but lines with the step, loss, throughput and time."""
    args = [*task_args("vision", tmp_path), "--trainer.max_epochs=2", "--trainer.limit_train_batches=3",
            "--trainer.enable_progress_bar=null", "--trainer.max_time=00:01:00:00"]  # fmt: skip
    log = tmp_path / "run.log"
    with open(log, "w") as output:
        environment = {**os.environ, "PYTHONPATH": str(REPO / "tests")}
        subprocess.run([sys.executable, "-m", "lightformer", "fit", *args], cwd=REPO, stdout=output, stderr=output,
                       env=environment, check=True, timeout=300)  # fmt: skip
    lines = log.read_text().splitlines()
    (start,) = [line for line in lines if line.startswith("training from step 0 to")]
    assert start.endswith("or for 1h00m (max_time)")  # the limit that stops a time-bound run
    assert sum(line.startswith("validation at step") and "val/acc" in line for line in lines) == 2
    (finished,) = [line for line in lines if line.startswith("finished: step")]
    assert "images/s" in finished and "elapsed" in finished
    assert not any("v_num" in line or "Tip:" in line or "LeafSpec" in line for line in lines)


def test_the_progress_bar_counts_steps_of_step_bound_runs():
    bar = ProgressBar()
    bar._trainer = type("T", (), {"max_steps": 2000, "max_epochs": -1, "global_step": 500})()
    assert bar._get_train_description(0) == "Epoch 0 (step 500/2000)"


def test_lightning_puts_a_checkpoints_hyperparameters_into_the_config_between_parsing_and_instantiation(tmp_path):
    """LightformerCLI.keep_command_line_model_options relies on this LightningCLI behaviour (done by its private
    ``_parse_ckpt_path``): with --ckpt_path, the model config that ``before_instantiate_classes`` sees is the
    checkpoint's hyperparameters, over what ``parse_arguments`` read from the command line. A Lightning upgrade that
    changes it fails here."""
    import torch

    from lightformer.cli.main import LightformerCLI, quiet_library_noise

    class Seen(Exception):
        pass

    class Probe(LightformerCLI):
        def before_instantiate_classes(self) -> None:  # Lightning's result, without ours over it
            raise Seen(self.parsed_config["validate.model.init_args"], self.config["validate.model.init_args"])

    checkpoint = tmp_path / "hparams.ckpt"
    hyper_parameters = {"_class_path": "lightformer.tasks.LanguageModelTask", "sample_tokens": 7, "sample_top_k": 3}
    torch.save({"state_dict": {}, "hyper_parameters": hyper_parameters}, checkpoint)
    quiet_library_noise()
    args = ["validate", "--config=configs/lm/austen_char.yaml", "--model.sample_tokens=5", f"--ckpt_path={checkpoint}"]
    with pytest.raises(Seen) as seen:
        Probe(subclass_mode_model=True, subclass_mode_data=True, args=args, auto_configure_optimizers=False)
    parsed, after = seen.value.args
    assert parsed.sample_tokens == 5 and after.sample_tokens == 7 and after.sample_top_k == 3


def test_a_configured_non_finite_guard_replaces_the_default_one(tmp_path):
    default = cli_main([*task_args("lm", tmp_path / "default")], run=False)
    assert [c.check_every_n_steps for c in default.trainer.callbacks if isinstance(c, NonFiniteLossGuard)] == [None]
    configured = cli_main([*task_args("lm", tmp_path / "configured"),
                           "--trainer.callbacks+=lightformer.training.callbacks.NonFiniteLossGuard",
                           "--trainer.callbacks.check_every_n_steps=100"], run=False)  # fmt: skip
    assert [c.check_every_n_steps for c in configured.trainer.callbacks if isinstance(c, NonFiniteLossGuard)] == [100]
