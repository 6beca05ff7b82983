"""Docs cannot rot: every command in the README's and docs' code blocks still parses, every path and link they name
exists, the README's example runs, and the front door stays short."""

from __future__ import annotations

import functools
import glob
import re
import shlex
from pathlib import Path

import pytest

from lightformer.cli import main as cli

REPO = Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
CONFIGS = sorted((REPO / "configs").rglob("*.yaml"))
FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```", re.MULTILINE | re.DOTALL)
COMMAND = re.compile(r"(?:^|\s)(?:python3?\s+-m\s+|-m\s+)?lightformer\s+([a-z][\w-]*)(.*)$")
REPO_PATH = re.compile(r"(?<![\w./-])((?:configs|benchmarks|docs|tests)/[\w./*=-]*\w)")
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
SHELL = {"", "bash", "sh", "shell", "console"}  # diagrams are ```text
ISSUE_REFERENCE = re.compile(r"(?<![\w&/])#\d+\b|\bissues?\s+#?\d+\b", re.IGNORECASE)


def code_blocks(path: Path) -> list[tuple[str, str]]:
    """The fenced code blocks of a markdown file: (language, text)."""
    return FENCE.findall(path.read_text(encoding="utf-8"))


def documented_commands() -> list[tuple[str, str, list[str]]]:
    """Every ``lightformer <command> ...`` line of the docs' shell code blocks, once: (where, command, arguments)."""
    found = {}
    for path in DOCS:
        for language, block in code_blocks(path):
            if language not in SHELL:
                continue
            for line in block.replace("\\\n", " ").splitlines():
                match = COMMAND.search(line.strip().removeprefix("$ "))
                if match:
                    where = f"{path.relative_to(REPO)}: lightformer {match[1]}{match[2]}"
                    args = shlex.split(match[2], comments=True)
                    found.setdefault((match[1], *args), (where, match[1], args))
    return list(found.values())


COMMANDS = documented_commands()


def test_the_docs_show_commands_to_check():
    assert len(COMMANDS) >= 20
    assert {"fit", "prepare", "generate", "average", "test"} <= {command for _, command, _ in COMMANDS}


@pytest.mark.parametrize(("command", "args"), [c[1:] for c in COMMANDS], ids=[c[0] for c in COMMANDS])
def test_each_documented_command_still_parses(command, args, monkeypatch, capsys):
    """Trainer commands parse their config and options (``--print_config``; ``prepare`` takes ``fit``'s command line);
    the checkpoint commands parse their options through the real dispatch, with the command itself not run."""
    assert command in {*cli.TRAINER_COMMANDS, *cli.checkpoint_commands()}, f"lightformer {command}: no such command"
    if command in cli.checkpoint_commands():
        from lightformer.cli.commands import COMMANDS
        from lightformer.registry import built_in

        functions = next((spec.commands for spec in built_in().values() if command in spec.commands), COMMANDS)
        calls = []
        real = functions[command]
        monkeypatch.setitem(functions, command, functools.wraps(real)(lambda **kwargs: calls.append(kwargs)))
        cli.main([command, *args])
        assert len(calls) == 1
        return
    if {"--help", "-h"} & set(args) or any(arg.endswith(".help") for arg in args):
        with pytest.raises(SystemExit) as exit_info:
            cli.main([command, *args])
            raise SystemExit(0)  # task_help prints and returns
    else:
        parsed_as = "fit" if command == "prepare" else command
        with pytest.raises(SystemExit) as exit_info:
            cli.main([parsed_as, *args, "--print_config"])
    assert exit_info.value.code in (0, None), capsys.readouterr().err[-2000:]


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_every_path_in_a_code_block_exists(doc):
    named = {path for _, block in code_blocks(doc) for path in REPO_PATH.findall(block)}
    missing = sorted(path for path in named if not glob.glob(str(REPO / path)))
    assert not missing, f"{doc.name} names paths that do not exist: {missing}"


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_points_to_a_file(doc):
    text = FENCE.sub("", doc.read_text(encoding="utf-8"))
    targets = {link.split("#")[0] for link in LINK.findall(text) if not re.match(r"[a-z]+:|#", link)}
    missing = sorted(target for target in targets if not (doc.parent / target).exists())
    assert not missing, f"{doc.name} links to files that do not exist: {missing}"


def test_the_readme_is_a_front_door_of_at_most_250_lines():
    assert len((REPO / "README.md").read_text(encoding="utf-8").splitlines()) <= 250


def test_the_readme_keeps_the_test_command_that_ci_runs():
    commands = [block for language, block in code_blocks(REPO / "README.md") if language == "bash"]
    assert any("python -m pytest -q" in block for block in commands)


@pytest.mark.parametrize("config", CONFIGS, ids=lambda p: str(p.relative_to(REPO)))
def test_no_config_header_is_over_10_lines(config):
    lines = config.read_text(encoding="utf-8").splitlines()
    header = next((i for i, line in enumerate(lines) if not line.startswith("#")), len(lines))
    assert header <= 10, f"{config.relative_to(REPO)} opens with {header} comment lines; history goes to docs/"


def test_no_issue_numbers_in_the_docs_or_configs():
    found = []
    for path in [*DOCS, *CONFIGS]:
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            found += [f"{path.relative_to(REPO)}:{number}: {m[0]}" for m in ISSUE_REFERENCE.finditer(line)]
    assert not found, "issue references belong in git history, not in user-facing docs:\n" + "\n".join(found)


def test_the_architecture_page_names_every_module():
    page = (REPO / "docs" / "architecture.md").read_text(encoding="utf-8")
    package = REPO / "src" / "lightformer"
    modules = sorted(str(path.relative_to(package)) for path in package.rglob("*.py"))
    assert not [module for module in modules if f"`{module}`" not in page]


def test_the_readmes_python_example_runs(capsys):
    import torch

    (example,) = [block for language, block in code_blocks(REPO / "README.md") if language == "python"]
    torch.manual_seed(0)
    exec(compile(example, "README.md", "exec"), {"__name__": "readme_example"})
    assert "tensor(" in capsys.readouterr().out
