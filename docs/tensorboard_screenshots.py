"""Screenshots of TensorBoard's tabs for the README, from a headless Chromium.

    python docs/tensorboard_screenshots.py --logdir runs --out docs/tensorboard

Serves ``--logdir`` with TensorBoard on loopback and saves one PNG per tab (scalars, images, text, hparams). Needs
Debian's ``chromium`` (``apt-get install chromium``).
"""

from __future__ import annotations

import argparse
import subprocess
import tempfile
from pathlib import Path

TABS = ("scalars", "images", "text", "hparams")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--logdir", default="runs")
    parser.add_argument("--out", default="docs/tensorboard")
    parser.add_argument("--size", default="1400,1000", help="window width,height in pixels")
    parser.add_argument("--tabs", nargs="*", default=list(TABS))
    parser.add_argument("--query", default="", help="added to each tab's URL, e.g. 'tagFilter=val'")
    args = parser.parse_args()

    from tensorboard import program

    board = program.TensorBoard()
    board.configure(argv=[None, "--logdir", args.logdir, "--host", "127.0.0.1", "--port", "0", "--load_fast", "false"])
    url = board.launch().rstrip("/")
    Path(args.out).mkdir(parents=True, exist_ok=True)
    for tab in args.tabs:
        target = Path(args.out) / f"{tab}.png"
        with tempfile.TemporaryDirectory() as profile:
            subprocess.run(
                [
                    "chromium", "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                    "--disable-background-networking", "--disable-component-update", "--disable-sync",
                    f"--user-data-dir={profile}", f"--window-size={args.size}", "--hide-scrollbars",
                    "--virtual-time-budget=20000", f"--screenshot={target.resolve()}",
                    f"{url}/?{args.query}#{tab}",
                ],
                check=True, capture_output=True, timeout=120,
            )  # fmt: skip
        print(f"wrote {target}")


if __name__ == "__main__":
    main()
