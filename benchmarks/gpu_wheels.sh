#!/usr/bin/env bash
# What the GPU machines lack for the GPU check, into .whl/ (59 MB, 49 MB with --fonts, 57 MB with --clipart; the device
# tool carries at most 64 MiB with the repository's 5 MB): the wheels of lightformer's dependencies that their image
# has not, and the offline data of the check's configs, compressed.
#
#   bash benchmarks/gpu_wheels.sh            # here, from the repository root, with access to a package index
#   python3 benchmarks/gpu_check.py          # there: installs .whl/*.whl into /tmp/site if jsonargparse or litdata is
#                                            # missing, and unpacks .whl/data/ where the configs read their data
#
# The GPU image (Python 3.12, torch 2.11.0+cu130) has torch, lightning, timm, tokenizers, tensorboard, torchmetrics,
# transformers, sacrebleu, scikit-learn, xarray, tifffile, pandas, scipy, pyarrow, pytest and their usual needs
# (/work/.library/device/KINDS.md lists them), and cannot reach a package index. It lacks these dependencies of
# pyproject.toml, listed with what they need in turn:
#   jsonargparse[signatures]: jsonargparse, docstring_parser, typeshed_client
#   litdata: litdata, boto3 (botocore, jmespath, s3transfer), obstore
#   rdata (reads Austen's novels from Debian's package): rdata
# The versions are constraints.txt's (the tested stack); a pure-Python wheel (py3-none-any) matches any platform.
# The data: Austen's novels (data/austen/austen.txt, which any Austen run here writes), Ding (Debian's trans-de-en)
# and Fashion-MNIST (data/FashionMNIST/raw/, which any Fashion-MNIST run here writes). With --fonts, the typefaces the
# image-text configs render their lines in (the font files under /usr/share/fonts that rendering.TYPEFACES declares,
# from the packages of debian-packages.txt: 19 MB packed) instead of Fashion-MNIST (26 MB), so that the GPU machine
# renders in the same 47 families as this one and .whl/ stays under the device tool's 64 MiB:
# `bash benchmarks/gpu_wheels.sh --fonts`, then `gpu_check.py --parts image-text ...`. With --clipart, the typefaces
# and a sixth of the Open Clip Art Library (1,354 drawings fitted to the GPU configs' 128 pixels and the metadata of
# their SVGs: 12 MB packed) instead of Ding and Fashion-MNIST, for the contrastive and vision-language parts:
# `bash benchmarks/gpu_wheels.sh --clipart`, then `gpu_check.py --parts clip vlm`.
set -euo pipefail
case "${1:-}" in
    "" | --fonts | --clipart) ;;
    *) echo "usage: bash benchmarks/gpu_wheels.sh [--fonts | --clipart]" >&2; exit 2 ;;
esac

PACKAGES=(
    jsonargparse docstring_parser typeshed_client
    litdata boto3 botocore jmespath s3transfer obstore
    rdata
)

pins=()
for name in "${PACKAGES[@]}"; do
    pin=$(grep -i -m 1 "^${name}==" constraints.txt) || { echo "constraints.txt pins no ${name}" >&2; exit 1; }
    pins+=("${pin}")
done

python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .whl "${pins[@]}"

fonts() {  # the declared typefaces (rendering.TYPEFACES), by their paths under /usr/share/fonts
    .venv/bin/python -c "from lightformer.data.sources.rendering import TYPEFACES
print('\\n'.join(f for packages in TYPEFACES.values() for files in packages.values() for f in files))" |
        tar -C /usr/share/fonts -cJf .whl/data/fonts.tar.xz -T -
}

clipart() {  # every 6th drawing of the Open Clip Art Library (1,354): its PNG on white, fitted to the GPU configs'
    # 128-pixel square, and its SVG's prolog, root element and metadata (all that openclipart.svg_metadata reads)
    .venv/bin/python - <<'PY'
import io
import re
import tarfile
from pathlib import Path

from lightformer.data.sources.openclipart import OPENCLIPART_ROOT, drawing_image

root = Path(OPENCLIPART_ROOT)


def add(archive: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    archive.addfile(info, io.BytesIO(data))


with tarfile.open(".whl/data/openclipart.tar.xz", "w:xz") as archive:
    for png in sorted((root / "png").rglob("*.png"))[::6]:
        name = png.relative_to(root / "png").with_suffix("")
        buffer = io.BytesIO()
        drawing_image(png, 128).save(buffer, "PNG", optimize=True)
        add(archive, f"png/{name}.png", buffer.getvalue())
        svg = (root / "svg" / f"{name}.svg").read_bytes()
        root_tag = re.search(rb"<svg[^>]*>", svg)  # with the prolog before it (its entities, its namespaces)
        metadata = re.search(rb"<(\w+:)?metadata[\s>].*?</(\w+:)?metadata>", svg, re.S)
        if root_tag and metadata and metadata.start() > root_tag.end():
            svg = svg[: root_tag.end()] + metadata[0] + b"</svg>\n"
        add(archive, f"svg/{name}.svg", svg)
PY
}

rm -rf .whl/data
mkdir -p .whl/data
gzip -9 -c data/austen/austen.txt > .whl/data/austen.txt.gz
case "${1:-}" in
    --fonts) xz -T0 -9 -c /usr/share/trans/de-en > .whl/data/de-en.xz; fonts ;;
    --clipart) fonts; clipart ;;
    "")
        xz -T0 -9 -c /usr/share/trans/de-en > .whl/data/de-en.xz
        for file in data/FashionMNIST/raw/*-ubyte; do xz -T0 -6 -c "${file}" > ".whl/data/$(basename "${file}").xz"; done
        ;;
esac
echo "$(ls .whl/*.whl | wc -l) wheels and $(ls .whl/data | wc -l) data files in .whl/ ($(du -sh .whl | cut -f1))"
