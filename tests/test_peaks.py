"""A device's peak FLOP/s for MFU, on any card (a table of our own before Lightning's, a measurement last), and
``precision: auto``: the precision the device trains fastest in, decided once, stored with the run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml

from lightformer.cli.main import main
from lightformer.training import peaks
from tiny_runs import events_of, task_args

TF = 1e12


@pytest.fixture(autouse=True)
def no_earlier_choice(monkeypatch):
    """Each test decides ``precision: auto`` afresh (the choice is passed to launched processes by a variable)."""
    monkeypatch.delenv(peaks.AUTO_PRECISION_VARIABLE, raising=False)


def fake_rates(monkeypatch, bf16: float, fp32: float) -> list:
    """Replace the matrix-multiply measurement by fixed rates; returns the list of dtypes measured."""
    measured = []

    def measured_flops(device, dtype, seconds=0.25):
        measured.append(dtype)
        return {torch.bfloat16: bf16, torch.float32: fp32}[dtype]

    monkeypatch.setattr(peaks, "measured_flops", measured_flops)
    return measured


@pytest.mark.parametrize(
    ("name", "precision", "tflops"),
    [
        ("NVIDIA H200", "bf16-mixed", 989.4),  # Lightning has no entry for this name (and lists the sparse peak)
        ("NVIDIA H200 NVL", "bf16-mixed", 835.5),
        ("NVIDIA GH200 480GB", "bf16-mixed", 989.4),
        ("NVIDIA H100 80GB HBM3", "bf16-mixed", 989.4),
        ("NVIDIA H100 PCIe", "16-mixed", 756),
        ("NVIDIA H100 NVL", "bf16-true", 835.5),
        ("NVIDIA A100-SXM4-80GB", "bf16-mixed", 312),
        ("NVIDIA A10G", "bf16-mixed", 70),
        ("NVIDIA A10", "bf16-mixed", 125),
        ("NVIDIA L40S", "bf16-mixed", 362),
        ("NVIDIA L40", "bf16-mixed", 181),
        ("NVIDIA L4", "bf16-mixed", 121),
        ("NVIDIA GeForce RTX 4090", "bf16-mixed", 165.2),
        ("Tesla T4", "16-mixed", 65),
        ("NVIDIA H100 80GB HBM3", "32-true", 66.9),
    ],
)
def test_mfu_peak_of_a_card_comes_from_the_dense_datasheet_table(monkeypatch, name, precision, tflops):
    monkeypatch.setattr(peaks, "device_name", lambda device: name)
    monkeypatch.setattr(torch, "get_float32_matmul_precision", lambda: "highest")
    fake_rates(monkeypatch, bf16=1.0, fp32=1.0)
    peak, source = peaks.peak_flops(torch.device("cuda", 0), precision)
    assert peak == pytest.approx(tflops * TF)
    assert name in source and "datasheet" in source


def test_a_float32_run_on_tensor_cores_is_measured_against_the_tf32_peak(monkeypatch):
    monkeypatch.setattr(peaks, "device_name", lambda device: "NVIDIA H200")
    monkeypatch.setattr(torch, "get_float32_matmul_precision", lambda: "high")
    peak, source = peaks.peak_flops(torch.device("cuda", 0), "32-true")
    assert peak == pytest.approx(494.7 * TF) and "tf32" in source


def test_a_card_in_no_table_is_measured_once_and_said(monkeypatch):
    monkeypatch.setattr(peaks, "device_name", lambda device: "NVIDIA Imaginary X1")
    monkeypatch.setattr(peaks, "get_available_flops", lambda device, dtype: None)  # Lightning's table lacks it too
    measured = fake_rates(monkeypatch, bf16=300 * TF, fp32=40 * TF)
    peak, source = peaks.peak_flops(torch.device("cuda", 0), "bf16-mixed")
    assert peak == 300 * TF and measured == [torch.bfloat16]
    assert "measured" in source and "Imaginary X1" in source


def test_a_card_only_lightning_lists_takes_lightnings_peak(monkeypatch):
    monkeypatch.setattr(peaks, "device_name", lambda device: "Quadro RTX 5000")
    monkeypatch.setattr(peaks, "get_available_flops", lambda device, dtype: 89.2 * TF)
    peak, source = peaks.peak_flops(torch.device("cuda", 0), "16-mixed")
    assert peak == 89.2 * TF and "Lightning" in source


def test_the_cpu_peak_is_a_real_matrix_multiply_measurement():
    peak, source = peaks.peak_flops(torch.device("cpu"), "32-true")
    assert 1e8 < peak < 1e15 and "measured on this CPU" in source
    assert peaks.measured_flops(torch.device("cpu"), torch.float32) == peak  # once per process


@pytest.mark.parametrize(
    ("bf16", "fp32", "chosen"), [(0.5, 1.0, "32-true"), (1.05, 1.0, "32-true"), (2, 1, "bf16-mixed")]
)
def test_auto_precision_on_a_cpu_is_bf16_only_where_it_is_faster(monkeypatch, bf16, fp32, chosen):
    fake_rates(monkeypatch, bf16=bf16 * TF, fp32=fp32 * TF)
    assert peaks.resolve_precision("auto", "cpu") == chosen
    assert peaks.resolve_precision("bf16-mixed", "cpu") == "bf16-mixed"  # anything but auto is kept


def test_auto_precision_on_a_gpu_is_bf16_else_fp16(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *args, **kwargs: True)
    assert peaks.auto_precision("cuda")[0] == "bf16-mixed"
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *args, **kwargs: False)
    assert peaks.auto_precision("cuda")[0] == "16-mixed"


def test_processes_a_run_launches_keep_its_choice_whatever_they_would_measure(monkeypatch):
    fake_rates(monkeypatch, bf16=2 * TF, fp32=1 * TF)
    assert peaks.resolve_precision("auto", "cpu") == "bf16-mixed"
    fake_rates(monkeypatch, bf16=0.5 * TF, fp32=1 * TF)  # a launched process, measuring while its sibling runs
    assert peaks.resolve_precision("auto", "cpu") == "bf16-mixed"


@pytest.mark.slow
def test_precision_auto_in_fit_is_said_stored_in_the_run_and_kept_on_resume(tmp_path, monkeypatch, caplog):
    """A CPU whose bf16 is slower trains in 32-true; the run's config.yaml and checkpoint say so; a resume on a host
    that would choose otherwise resumes in the checkpoint's precision; MFU is logged against the measured peak."""
    fake_rates(monkeypatch, bf16=0.5 * TF, fp32=1 * TF)
    throughput = {"class_path": "lightformer.training.callbacks.Throughput", "init_args": {"window_size": 2}}
    args = [*task_args("lm", tmp_path), "--trainer.precision=auto", "--trainer.log_every_n_steps=1"]
    args += [f"--trainer.callbacks+={json.dumps(throughput)}", "--trainer.limit_val_batches=0"]
    with caplog.at_level("INFO"):
        main(["fit", *args, "--trainer.max_steps=3"])
    assert "precision: auto → 32-true (bf16 matrix multiplies 0.50 TFLOP/s, fp32 1.00" in caplog.text
    assert "MFU is against 1.00 TFLOP/s per device: fp32 matrix multiplies measured on this CPU" in caplog.text
    run, events = events_of(tmp_path, "austen_char")
    run = Path(run)
    assert yaml.safe_load((run / "config.yaml").read_text())["trainer"]["precision"] == "32-true"
    last = run / "checkpoints" / "last.ckpt"
    assert torch.load(last, weights_only=True)["precision"] == "32-true"
    mfu = events.Scalars("velocity/train/device/mfu")[-1].value
    flops = events.Scalars("velocity/train/device/flops_per_sec")[-1].value
    assert mfu == pytest.approx(flops / TF, rel=1e-4)

    monkeypatch.delenv(peaks.AUTO_PRECISION_VARIABLE)
    fake_rates(monkeypatch, bf16=4 * TF, fp32=1 * TF)  # this host would choose bf16-mixed
    caplog.clear()
    with caplog.at_level("INFO"):
        main(["fit", *args, "--trainer.max_steps=4", f"--ckpt_path={last}"])
    assert "precision: auto → 32-true (the precision the resumed run trained in)" in caplog.text
    assert torch.load(last, weights_only=True)["global_step"] == 4


def test_measuring_a_peak_leaves_the_global_random_state_alone():
    torch.manual_seed(0)
    expected = torch.rand(3)
    torch.manual_seed(0)
    peaks.matmul_rate(64, torch.float32, torch.device("cpu"), seconds=0.01)
    assert torch.equal(torch.rand(3), expected)  # a run's initialisation and dropout draw what they would have
