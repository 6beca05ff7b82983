#!/usr/bin/env bash
# The wheels of what lightformer needs that the GPU machines' image lacks, downloaded into .whl/ for the GPU check.
#
#   bash benchmarks/gpu_wheels.sh            # here, from the repository root, with access to a package index
#   python3 benchmarks/gpu_check.py          # there: installs .whl/*.whl into /tmp/site if jsonargparse or litdata is missing
#
# The GPU image (Python 3.12, torch 2.11.0+cu130) has torch, lightning, timm, tokenizers, tensorboard, torchmetrics,
# transformers, sacrebleu, pandas, scipy, pyarrow, pytest and their usual needs, and cannot reach a package index.
# It lacks these dependencies of pyproject.toml, listed with what they need in turn:
#   jsonargparse[signatures]: jsonargparse, docstring_parser, typeshed_client
#   litdata: litdata, boto3 (botocore, jmespath, s3transfer), obstore, tifffile
#   rdata (reads Austen's novels from Debian's package): rdata, xarray
#   scikit-learn (the digits data set, the probes): scikit-learn, joblib, threadpoolctl, narwhals
# The versions are constraints.txt's (the tested stack); a pure-Python wheel (py3-none-any) matches any platform.
set -euo pipefail

PACKAGES=(
    jsonargparse docstring_parser typeshed_client
    litdata boto3 botocore jmespath s3transfer obstore tifffile
    rdata xarray
    scikit-learn joblib threadpoolctl narwhals
)

pins=()
for name in "${PACKAGES[@]}"; do
    pin=$(grep -i -m 1 "^${name}==" constraints.txt) || { echo "constraints.txt pins no ${name}" >&2; exit 1; }
    pins+=("${pin}")
done

python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .whl "${pins[@]}"
echo "$(ls .whl/*.whl | wc -l) wheels in .whl/ ($(du -sh .whl | cut -f1))"
