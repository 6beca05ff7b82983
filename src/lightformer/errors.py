"""The errors a person fixes by changing what they gave: the command line prints their message alone; and how it
reports the others, as bugs of ours."""

from __future__ import annotations

import traceback


class ConfigError(ValueError):
    """A value in the config files or on the command line is invalid; the message names it and what is valid."""


class CheckpointError(ValueError):
    """A checkpoint is missing, unreadable, or of another task than the command needs; the message says which."""


class DataError(ConfigError):
    """The data a config names cannot be used as it is (a file, a folder, a column, a prepared shard, a bucket); the
    message names it and what would fix it."""


def user_error(error: BaseException, section: str) -> str:
    """What to tell a user of ``error``, raised while building ``section`` ("data", "model", "trainer"): the first
    ``ConfigError`` of its chain as it is (it names its field), else the error the class raised (the outermost one that
    is not jsonargparse's report of it: ``raised_by_jsonargparse``) after the section. A context suppressed with
    ``from None`` is not followed."""
    chain, seen = [], set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        chain.append(error)
        error = error.__cause__ or (None if error.__suppress_context__ else error.__context__)
    named = next((e for e in chain if isinstance(e, ConfigError)), None)
    if named is not None:
        return str(named)
    raised = next((e for e in chain if not raised_by_jsonargparse(e)), chain[-1])
    return f"{section}: {raised}"


def raised_by_jsonargparse(error: BaseException) -> bool:
    """Whether jsonargparse raised ``error`` itself: its report of what a class raised when it was built, a plain
    ``ValueError`` ("Does not validate against any of the Union subtypes", "Problem with given class_path") whose cause
    is the class's error. jsonargparse 4.53 has no error type of its own for it, so it is told by where it was raised
    (the module of its innermost frame), not by its words; ``tests/test_cli_mechanisms.py`` pins this."""
    frame = error.__traceback__
    while frame is not None and frame.tb_next is not None:
        frame = frame.tb_next
    return frame is not None and frame.tb_frame.f_globals.get("__name__", "").startswith("jsonargparse.")


def raise_as_bug() -> None:
    """Show the exception being handled with its traceback, and exit saying that it is lightformer's fault."""
    traceback.print_exc()
    raise SystemExit(
        "lightformer: the error above is a bug in lightformer, not in your config or data: please report it with the "
        "command line and this output"
    ) from None
