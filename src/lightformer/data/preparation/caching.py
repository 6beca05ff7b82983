"""What names and identifies a prepared folder, and the check that a resumed run trains on its checkpoint's data."""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from lightning.pytorch.utilities import rank_zero_info

from lightformer.errors import DataError


def file_stamp(path: Path) -> list:
    """What identifies a user's file without reading it: its absolute path, size and modification time."""
    stat = path.stat()
    return [str(path.resolve()), stat.st_size, stat.st_mtime_ns]


def content_hash(value: object) -> str:
    """Short stable hash of a JSON-serializable value (or a string), for cache file names."""
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


@contextmanager
def preparing(what: str) -> Iterator[None]:
    """Say what slow preparation runs (training, encoding, fetching) and how long it took: no silent minutes."""
    rank_zero_info(f"preparing data: {what} ...")
    start = time.monotonic()
    yield
    rank_zero_info(f"preparing data: {what}: done in {time.monotonic() - start:.1f} s")


MANIFEST = "prepared.json"  # a prepared folder's fingerprint and what its preparation counted


def read_manifest(folder: str | Path) -> dict:
    return json.loads((Path(folder) / MANIFEST).read_text(encoding="utf-8"))


class SameDataOnResume:
    """A data module (first base) whose ``prepared`` data goes in each checkpoint (docs/data.md, "The data module")."""

    def state_dict(self) -> dict:
        identity = prepared_identity(self.prepared)
        return {} if identity is None else {"prepared": identity}

    def load_state_dict(self, state: dict) -> None:
        trainer = getattr(self, "trainer", None)
        if trainer is not None and trainer.state.fn == "fit" and "prepared" in state:
            check_same_data(state["prepared"], prepared_identity(self.prepared))


def prepared_identity(prepared: object) -> dict | None:
    """A prepared folder's name and the fingerprint it was prepared from; None when nothing is prepared."""
    folder = getattr(prepared, "folder", prepared)
    if folder is None:
        return None
    manifest = read_manifest(folder)
    return {"folder": Path(folder).name, "fingerprint": {k: v for k, v in manifest.items() if k != "created"}}


def check_same_data(trained: dict, now: dict | None) -> None:
    """Refuse resuming on other data than trained on, naming the files changed, new or gone (or the settings)."""
    if now is None or trained.get("folder") == now["folder"]:
        return
    before, after = _file_stamps(trained.get("fingerprint")), _file_stamps(now["fingerprint"])
    changes = [f"{path} changed (size or modification time)" for path in before.keys() & after.keys()
               if before[path] != after[path]]  # fmt: skip
    changes += [f"{path} is no longer among the sources" for path in sorted(before.keys() - after.keys())]
    changes += [f"{path} is a new source" for path in sorted(after.keys() - before.keys())]
    if not changes:
        keys = sorted(key for key in {*trained.get("fingerprint", {}), *now["fingerprint"]}
                      if trained.get("fingerprint", {}).get(key) != now["fingerprint"].get(key))  # fmt: skip
        changes = [f"its {', '.join(keys) or 'preparation'} differ"]
    raise DataError(
        f"data: the data changed since the checkpoint was written ({'; '.join(changes[:5])}): it trained on the data "
        f"prepared into {trained.get('folder')}, this config prepares {now['folder']}. Resume on the data it trained "
        "on (restore those files and settings), or start a new run from its weights: give the checkpoint as "
        "--model.init.checkpoint instead of --ckpt_path"
    )


def _file_stamps(fingerprint: object) -> dict[str, list]:
    if not isinstance(fingerprint, dict | list):
        return {}
    if isinstance(fingerprint, list) and len(fingerprint) == 3 and isinstance(fingerprint[0], str):
        return {fingerprint[0]: fingerprint[1:]}
    values = fingerprint.values() if isinstance(fingerprint, dict) else fingerprint
    return {path: stamp for value in values for path, stamp in _file_stamps(value).items()}
