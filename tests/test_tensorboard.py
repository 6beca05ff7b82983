"""TensorBoard as a person sees it: finished runs served on loopback, read through TensorBoard's HTTP data API."""

import json
import urllib.request

import pytest

from lightformer.cli import main
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
    """Three digits runs that differ in d_model, the first one also tested; TensorBoard serving them."""
    root = tmp_path_factory.mktemp("tensorboard")
    for d_model in (16, 32, 48):
        args = [*task_args("vision", root / f"d{d_model}"), "--trainer.max_epochs=2", f"--model.net.d_model={d_model}"]
        args += [f"--trainer.logger.init_args.save_dir={root / 'runs'}", "--trainer.log_every_n_steps=5"]
        main(["fit", *args])
    tested = sorted((root / "runs").glob("*/version_0/checkpoints/last.ckpt"))[0]
    main(["test", *task_args("vision", root / "test"), f"--trainer.logger.init_args.save_dir={root / 'runs'}",
          f"--ckpt_path={tested}"])  # fmt: skip
    return serve(root / "runs"), "vit_digits/version_0"


@pytest.mark.slow
def test_scalars_open_on_the_task_curves_and_test_joins_its_run(board):
    url, run = board
    tags = query(url, "/data/plugin/scalars/tags")
    assert set(tags) == {f"vit_digits/version_{i}" for i in range(3)}  # the test did not start a fourth run
    scalars = set(tags[run])
    assert {"train/loss", "train/acc", "val/loss", "val/acc", "test/acc", "test/loss", "train/lr/decayed"} <= scalars
    assert {"train/device/items_per_sec", "train/device/flops_per_sec"} <= scalars
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
    names = {info["name"] for info in experiment["hparamInfos"]}
    assert {"model/net/d_model", "model/net/n_layers", "model/optimizer/lr", "data/batch_size"} <= names
    assert not any(name.startswith("_") or "/_" in name for name in names)  # no _class_path, no _instantiator
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
    assert sorted(rows) == [16, 32, 48]
    for group in rows.values():  # each run's validation accuracy, side by side
        values = {m["name"]["tag"]: m["value"] for m in group["metricValues"]}
        assert 0 <= values["val/acc"] <= 1
