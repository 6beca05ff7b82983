"""TensorBoard as a person sees it: finished runs served on loopback, read through TensorBoard's HTTP data API."""

import json
import urllib.request
from pathlib import Path

import pytest

from lightformer.cli.main import main
from tiny_runs import task_args


def serve(logdir) -> str:
    from tensorboard import program

    board = program.TensorBoard()
    board.configure(argv=[None, "--logdir", str(logdir), "--host", "127.0.0.1", "--port", "0", "--load_fast", "false"])
    return board.launch().rstrip("/")


def query(url: str, path: str, body: dict | None = None):
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url + path, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.loads(response.read())


@pytest.fixture(scope="module")
def board(tmp_path_factory):
    """Two digits runs that differ in d_model, the first one also tested; TensorBoard serving them."""
    root = tmp_path_factory.mktemp("tensorboard")
    for d_model in (16, 32):
        args = [*task_args("vision", root / f"d{d_model}"), "--trainer.max_epochs=2", f"--model.net.d_model={d_model}"]
        args += [f"--trainer.logger.init_args.save_dir={root / 'runs'}", "--trainer.log_every_n_steps=5"]
        args += ["--trainer.logger.init_args.hparam_columns=[model/net/d_model, model/optimizer/lr]"]
        main(["fit", *args])
    tested = sorted((root / "runs").glob("*/version_0/checkpoints/last.ckpt"))[0]
    main(["test", *task_args("vision", root / "test"), f"--trainer.logger.init_args.save_dir={root / 'runs'}",
          f"--ckpt_path={tested}"])  # fmt: skip
    return serve(root / "runs"), "vit_digits/version_0"


@pytest.mark.slow
def test_scalars_open_on_the_task_curves_and_test_joins_its_run(board):
    url, run = board
    tags = query(url, "/data/plugin/scalars/tags")
    assert set(tags) == {f"vit_digits/version_{i}" for i in range(2)}  # the test did not start a third run
    scalars = set(tags[run])
    assert {"train/loss", "train/acc", "val/loss", "val/acc", "test/acc", "test/loss", "train/lr/decayed"} <= scalars
    assert {"velocity/train/device/items_per_sec", "velocity/train/device/flops_per_sec"} <= scalars
    assert not scalars & {"hp_metric", "epoch", "train/time", "train/batches", "train/samples"}
    val = query(url, f"/data/plugin/scalars/scalars?run={run}&tag=val/acc")
    test = query(url, f"/data/plugin/scalars/scalars?run={run}&tag=test/acc")
    assert [point[1] for point in test] == [val[-1][1]]  # the test result stands at the tested step


@pytest.mark.slow
def test_pictures_stand_at_the_step_of_their_validation(board):
    url, run = board
    images = query(url, "/data/plugin/images/tags")[run]
    assert {"val/attention_rollout", "test/confusion_matrix"} <= set(images)
    rollouts = query(url, f"/data/plugin/images/images?run={run}&tag=val/attention_rollout&sample=0")
    val_steps = [point[1] for point in query(url, f"/data/plugin/scalars/scalars?run={run}&tag=val/acc")]
    assert [image["step"] for image in rollouts] == val_steps
    confusion = query(url, f"/data/plugin/images/images?run={run}&tag=test/confusion_matrix&sample=0")
    assert len(confusion) == 1


@pytest.mark.slow
def test_hparams_compare_the_runs_by_their_settings_and_results(board):
    url, _ = board
    experiment = query(url, "/data/plugin/hparams/experiment", {"experimentName": ""})
    names = [info["name"] for info in experiment["hparamInfos"]]
    assert names == ["model/net/d_model", "model/optimizer/lr"]  # the columns asked for; the metrics beside them
    metrics = [info["name"]["tag"] for info in experiment["metricInfos"]]
    assert metrics[:2] == ["val/acc", "val/loss"] and "test/acc" in metrics
    request = {
        "experimentName": "",
        "allowedStatuses": ["STATUS_UNKNOWN", "STATUS_SUCCESS", "STATUS_FAILURE", "STATUS_RUNNING"],
        "colParams": [],
        "startIndex": 0,
        "sliceSize": 100,
    }
    groups = query(url, "/data/plugin/hparams/session_groups", request)["sessionGroups"]
    rows = {group["hparams"]["model/net/d_model"]: group for group in groups}
    assert sorted(rows) == [16, 32]
    recorded = set(groups[0]["hparams"])  # every hyperparameter is recorded with the run
    assert {"model/net/d_model", "model/net/n_layers", "model/optimizer/lr", "data/loader/batch_size"} <= recorded
    assert not any(name.startswith("_") or "/_" in name for name in recorded)  # no _class_path, no _instantiator
    for group in rows.values():  # each run's validation accuracy, side by side
        values = {m["name"]["tag"]: m["value"] for m in group["metricValues"]}
        assert 0 <= values["val/acc"] <= 1


def tensorboard_sorted(tags: list[str]) -> list[str]:
    """``tags`` in the order TensorBoard's dashboards list them (its ``compareTagNames``: runs of digits compare as
    numbers, and the separators "/" and "_" and digits come before every other character)."""
    import functools
    import re

    def compare(a: str, b: str) -> int:
        i = j = 0
        while True:
            if i == len(a):
                return 0 if j == len(b) else -1
            if j == len(b):
                return 1
            if a[i].isdigit() and b[j].isdigit():
                x, y = re.match(r"\d+(\.\d*)?", a[i:]).group(), re.match(r"\d+(\.\d*)?", b[j:]).group()
                if float(x) != float(y):
                    return -1 if float(x) < float(y) else 1
                i, j = i + len(x), j + len(y)
                continue
            first, second = a[i] in "/_" or a[i].isdigit(), b[j] in "/_" or b[j].isdigit()
            if first != second:
                return -1 if first else 1
            if not first and a[i] != b[j]:
                return -1 if a[i] < b[j] else 1
            i, j = i + 1, j + 1

    return sorted(tags, key=functools.cmp_to_key(compare))


def tensorboard_groups(tags: list[str]) -> dict[str, list[str]]:
    """The sections of TensorBoard's Scalars tab, in their order: tags grouped by the part before the first "/"."""
    groups: dict[str, list[str]] = {}
    for tag in tensorboard_sorted(tags):
        groups.setdefault(tag.split("/", 1)[0], []).append(tag)
    return groups


def test_tensorboard_sorts_like_its_dashboards():
    tags = ["val/loss", "train/loss", "train/device/mfu", "train_x/a", "train/ppl", "step10", "step9", "Zeta/a"]
    assert tensorboard_sorted(tags) == [
        "Zeta/a", "step9", "step10", "train/device/mfu", "train/loss", "train/ppl", "train_x/a", "val/loss",
    ]  # fmt: skip


def test_tensorboard_opens_on_the_loss_shows_metrics_first_and_one_sample_per_step(tmp_path):
    """A language-model run that validates on a subset and ends with a validation on the whole split."""
    from tensorboard.plugins.hparams import metadata

    from tiny_runs import events_of

    throughput = {"class_path": "lightformer.training.callbacks.Throughput", "init_args": {"window_size": 2}}
    args = [*task_args("lm", tmp_path), "--trainer.max_steps=6", "--trainer.val_check_interval=3"]
    args += [
        "--data.loader.val_windows=4",
        "--trainer.log_every_n_steps=1",
        f"--trainer.callbacks+={json.dumps(throughput)}",
    ]
    main(["fit", *args])
    run, events = events_of(tmp_path, "austen_char")
    groups = tensorboard_groups(events.Tags()["scalars"])
    assert list(groups)[:2] == ["train", "val"] and list(groups)[-1] == "velocity", groups
    assert groups["train"][0] == "train/loss" and groups["val"][0] == "val/loss"
    assert "velocity/train/device/items_per_sec" in groups["velocity"]
    assert not any("per_sec" in tag or "mfu" in tag for group in ("train", "val") for tag in groups[group])
    assert [e.step for e in events.Scalars("val/loss")] == [2, 5, 6]  # on 4 windows, then on the whole split
    for tag in events.Tags()["tensors"]:
        if tag.startswith("val/"):  # text samples: one per validation of new weights
            assert [e.step for e in events.Tensors(tag)] == [2, 5], tag

    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

    hparams = {}  # the HParams plugin's records, as TensorBoard reads them from the run's event files
    for path in sorted(Path(run).glob("events.out.tfevents.*")):
        for event in EventFileLoader(str(path)).Load():
            for value in event.summary.value:
                if value.metadata.plugin_data.plugin_name == metadata.PLUGIN_NAME:
                    hparams[value.tag] = value.metadata.plugin_data.content
    experiment = metadata.parse_experiment_plugin_data(hparams[metadata.EXPERIMENT_TAG])
    assert [info.name for info in experiment.hparam_infos] == ["model/optimizer/lr"]
    assert [info.name.tag for info in experiment.metric_infos] == ["val/loss", "val/ppl", "test/loss", "test/ppl"]
    session = metadata.parse_session_start_info_plugin_data(hparams[metadata.SESSION_START_INFO_TAG])
    assert {"model/net/d_model", "model/optimizer/lr", "data/block_size"} <= set(session.hparams)


def test_a_writer_reopened_after_finalize_is_read_after_the_first(tmp_path, monkeypatch):
    """fit then validate in one process writes two events files in one second; TensorBoard must read them in order
    even when the counter in their names goes from 9 to 10 (compared as text, "10" sorts first)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.summary.writer import event_file_writer

    from lightformer.training.tensorboard import TensorBoardLogger

    monkeypatch.setattr(event_file_writer, "_global_uid", event_file_writer.AtomicCounter(9))
    logger = TensorBoardLogger(str(tmp_path), name="run", version=0)
    logger.log_metrics({"val/loss": 2.0}, step=5)
    logger.finalize("success")
    logger.log_metrics({"val/loss": 1.0}, step=6)
    logger.finalize("success")
    assert len(list((tmp_path / "run" / "version_0").glob("events.out.tfevents.*"))) == 2
    events = EventAccumulator(str(tmp_path / "run" / "version_0"))
    events.Reload()
    assert [e.step for e in events.Scalars("val/loss")] == [5, 6]
