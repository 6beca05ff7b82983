"""How fast an image tower learns to read printed lines on its own: the vision-language model's tower and its CTC head
(``VisionLanguageConfig.ctc_head``) trained with the CTC loss alone, no language model, on the printed lines of
``configs/vlm/clipart_qa.yaml``'s data (1-4 words on 32 × 192, seen typefaces), and read greedily by the head (the
likeliest token per patch, repeats merged, blanks dropped) on 500 validation lines in the held-out typefaces.

It separates the two halves of a vision-language model that does not read: whether the tower can tell the
characters apart at all in the steps it gets, and whether the language model looks at them.

    python benchmarks/tower_reading.py --init runs/clipart/version_0/checkpoints/last.ckpt  # the contrastive tower
    python benchmarks/tower_reading.py --patch 32,4                                        # the reader's patches
"""

from __future__ import annotations

import argparse
import time

import torch
from torchmetrics.functional.text import char_error_rate

from lightformer.data import VisualQADataModule
from lightformer.tasks.image_text import ctc_per_character
from lightformer.tasks.vision_language import VisionLanguageTask
from lightformer.tasks.warm_start import load_matching

LINE = (32, 192)  # the lines' canvas of configs/vlm/clipart_qa.yaml


def line_batches(loader):
    """The batches of printed lines (one canvas a batch) of ``loader``."""
    for batch in loader:
        if tuple(batch["images"].shape[-2:]) == LINE:
            yield batch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--init", default=None, help="a checkpoint whose image tower starts ours (default: scratch)")
    parser.add_argument("--patch", default="8", help="patch height,width in pixels (or one side)")
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--eval-every", type=int, default=500)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--prepare-dir", default="data/prepared")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    source = dict(sources=["clipart", "lines"], words=[1, 4], line_width=LINE[1])
    loader = dict(batch_size=64, num_workers=0)
    data = VisualQADataModule(source=source, loader=loader, prepare=dict(dir=args.prepare_dir))
    data.prepare_data()
    data.setup("fit")
    facts = data.data_facts()
    patch = [int(side) for side in args.patch.split(",")]
    image = dict(patch_size=patch if len(patch) == 2 else patch[0], d_model=128, n_layers=4, n_heads=4, dropout=0.1,
                 norm_eps=1e-5)  # fmt: skip
    text = dict(block_size=128, d_model=128, n_layers=4, n_heads=4, dropout=0.1, position="learned")  # unused
    shuffle = 2 if patch == [8] else 1  # the model clipart_qa.yaml builds (the head reads the patches before it)
    net = dict(image=image, text=text, pixel_shuffle=shuffle, ctc_head=True)
    init = dict(checkpoint=args.init) if args.init else {}
    task = VisionLanguageTask(net=net, data_facts=facts, ctc_weight=1.0, init=init)
    model, pad, tokenizer = task.model, facts.pad_id, data.tokenizer
    if args.init:
        loaded = load_matching(model, task.initial_weights(check=False))["loaded"]
        print(f"the image tower from {args.init}: {len(loaded)} tensors")
    trained = [p for p in [*model.image.parameters(), *model.ctc_head.parameters()] if p.requires_grad]
    optimizer = torch.optim.AdamW(trained, lr=args.lr, weight_decay=0.05)

    def reading(batch: dict) -> torch.Tensor:
        """The CTC head's logits of ``batch``'s patches in reading order (batch, patches, vocab)."""
        return model.reading_logits(batch["images"], model.patch_tokens(batch["images"]))

    @torch.no_grad()
    def validation_cer() -> float:
        model.eval()
        said, meant = [], []
        for batch in line_batches(data.val_dataloader()):
            best = reading(batch).argmax(-1).tolist()
            for row, path in enumerate(best):
                tokens = [t for i, t in enumerate(path) if t != pad and (i == 0 or t != path[i - 1])]
                said.append(tokenizer.decode(tokens))
                meant.append(tokenizer.decode(batch["transcript"][row, : batch["transcript_length"][row]].tolist()))
            if len(said) >= 500:
                break
        model.train()
        return float(char_error_rate(said, meant))

    step, epoch, start = 0, 0, time.perf_counter()
    model.train()
    while step < args.steps:
        loader = data.train_dataloader()
        loader.batch_sampler.set_epoch(epoch)
        epoch += 1
        for batch in line_batches(loader):
            for group in optimizer.param_groups:
                group["lr"] = args.lr * min(1.0, (step + 1) / 100)  # warm-up, then constant
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = ctc_per_character(reading(batch), batch["transcript"], batch["transcript_length"], pad).mean()
            optimizer.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(trained, 1.0)
            optimizer.step()
            step += 1
            if step % args.eval_every == 0 or step == args.steps:
                print(f"step {step}: CTC loss {loss.item():.3f} per character, validation CER (held-out typefaces) "
                      f"{validation_cer():.3f}, {time.perf_counter() - start:.0f} s", flush=True)  # fmt: skip
            if step >= args.steps:
                break


if __name__ == "__main__":
    main()
