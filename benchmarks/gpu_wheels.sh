#!/usr/bin/env bash
# What the GPU machines lack for the GPU check, into .whl/ (59 MB, 49 MB with --fonts; the device tool carries at most
# 64 MiB): the wheels of lightformer's dependencies that their image has not, and the offline data of the check's
# configs, compressed.
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
# image-text configs render their lines in (the font files under /usr/share/fonts that lightformer's rendering uses,
# from the packages of debian-packages.txt: 19 MB packed) instead of Fashion-MNIST (26 MB), so that the GPU machine
# renders in the same 47 families as this one and .whl/ stays under the device tool's 64 MiB:
# `bash benchmarks/gpu_wheels.sh --fonts`, then `gpu_check.py --parts image-text ...`.
set -euo pipefail

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

mkdir -p .whl/data
gzip -9 -c data/austen/austen.txt > .whl/data/austen.txt.gz
xz -T0 -9 -c /usr/share/trans/de-en > .whl/data/de-en.xz
if [ "${1:-}" = --fonts ]; then
    rm -f .whl/data/*-ubyte.xz
    .venv/bin/python -c "from lightformer.data.raw.rendering import discover_fonts
print('\\n'.join(p.removeprefix('/usr/share/fonts/') for paths in discover_fonts().values() for p in paths))" |
        tar -C /usr/share/fonts -cJf .whl/data/fonts.tar.xz -T -
else
    rm -f .whl/data/fonts.tar.xz
    for file in data/FashionMNIST/raw/*-ubyte; do xz -T0 -6 -c "${file}" > ".whl/data/$(basename "${file}").xz"; done
fi
echo "$(ls .whl/*.whl | wc -l) wheels and $(ls .whl/data | wc -l) data files in .whl/ ($(du -sh .whl | cut -f1))"
