"""Captioned pictures of a user's own: a folder of images, each beside a text file of its captions, one a line."""

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from lightformer.data.sources import Source, file_stamps, hashed

IMAGES = (".png", ".jpg", ".jpeg")


@dataclass(frozen=True)
class CaptionedFolder(Source):
    """The images of ``folder`` and their captions (``<name>.txt`` beside ``<name>.png``); ``val_fraction`` of them,
    by a hash of the file name, held out for validation."""

    folder: str
    val_fraction: float = 0.2
    splits = ("train", "val")

    def images(self) -> list[Path]:
        return sorted(path for path in Path(self.folder).iterdir() if path.suffix.lower() in IMAGES)

    def fingerprint(self) -> dict:
        files = [file for image in self.images() for file in (image, image.with_suffix(".txt"))]
        return {"files": file_stamps(files), "val": self.val_fraction}

    def records(self, split: str) -> Iterator[dict]:
        for image in self.images():
            if ("val" if hashed(image.name, self.val_fraction) else "train") == split:
                captions = image.with_suffix(".txt").read_text(encoding="utf-8").splitlines()
                yield {"image": str(image), "texts": [caption for caption in captions if caption.strip()]}
