"""Every shipped config parses: class paths resolve, keys and types are valid."""

import glob

import pytest

from lightformer.cli.main import cli_main
from tiny_runs import resolved_config

CONFIGS = sorted(glob.glob("configs/*/*.yaml"))


def test_there_is_a_config_per_task():
    assert {"configs/lm/austen_char.yaml", "configs/translation/ding_de_en.yaml"} <= set(CONFIGS)


@pytest.mark.parametrize("config", [c for c in CONFIGS if "trainer/" not in c])
def test_config_parses(config, capsys):
    resolved = resolved_config(capsys, config)
    assert resolved["model"]["class_path"].startswith("lightformer.tasks.")
    assert resolved["data"]["class_path"].startswith("lightformer.data.")


def test_unknown_key_is_refused_with_its_name(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli_main(["fit", "--config=configs/lm/austen_char.yaml", "--model.net.n_layerz=4"])
    assert exit_info.value.code != 0
    assert "n_layerz" in capsys.readouterr().err
