"""A labelled image set and trained weights made on the spot, for accuracy mode where no ImageNet is at hand.

Why: the correctness check's top-1 agreement on 8 noise inputs with random weights is ill-posed (deep
random ResNets give near-tied logits, so a 2% perturbation reorders them). The question "does int8/fp8
change the model's answers?" needs a model that has learnt something and images it is sure about, and
enough of them (the issue asks for ≥ 1,024). The machines that run deepgap's GPU jobs have no network,
so this script makes both: ``classes`` classes of oriented gratings (class = orientation × spatial
frequency; colour, phase, offset and noise vary per image, so colour is no cue), a training set and a
disjoint evaluation set written as an ImageFolder tree, and a torchvision ResNet trained on the training
set from scratch (a few epochs on one GPU). Then accuracy mode scores every configuration on it::

    python benchmarks/accuracy_synthetic.py --model resnet50 --out /tmp/acc
    deepgap run --models resnet50 --engines eager,quant --precisions fp32,int8,fp8 --batch-sizes 256 \\
        --weights /tmp/acc/resnet50.pt --dataset /tmp/acc/eval --store acc.sqlite

It prints one JSON line: the fp32 model's accuracy on the training set and on the evaluation set, and
where the files are. The evaluation split that accuracy mode scores is disjoint from the training set,
and deepgap calibrates int8/fp8 on a disjoint part of it (``--dataset``'s seeded split).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import numpy as np

ORIENTATIONS = 10
SIZE = 64  # pixels on disk; accuracy mode resizes to the model's resolution like torchvision's eval transform


def grating(cls: int, rng: np.random.Generator, classes: int) -> np.ndarray:
    """One uint8 (SIZE, SIZE, 3) image of class ``cls``: orientation and frequency name the class."""
    freqs = max(1, math.ceil(classes / ORIENTATIONS))
    theta = math.pi * (cls % ORIENTATIONS) / ORIENTATIONS + rng.normal(0, 0.03)
    cycles = 2.0 + 6.0 * (cls // ORIENTATIONS) / max(1, freqs - 1)  # 2..8 cycles across the image
    yy, xx = np.mgrid[0:SIZE, 0:SIZE] / SIZE
    phase = rng.uniform(0, 2 * math.pi)
    wave = np.sin(2 * math.pi * cycles * (xx * math.cos(theta) + yy * math.sin(theta)) + phase)
    lo, hi = rng.integers(0, 256, 3), rng.integers(0, 256, 3)  # two random colours: colour is no cue
    img = lo[None, None, :] + (hi - lo)[None, None, :] * (0.5 + 0.5 * wave[..., None])
    img = img + rng.normal(0, 20, img.shape)
    return np.clip(img, 0, 255).astype(np.uint8)


def write_set(root: Path, classes: int, per_class: int, seed: int) -> None:
    """An ImageFolder tree ``root/cNNN/NNNN.png`` with ``per_class`` images of each class."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    for c in range(classes):
        d = root / f"c{c:03d}"
        d.mkdir(parents=True, exist_ok=True)
        for j in range(per_class):
            Image.fromarray(grating(c, rng, classes)).save(d / f"{j:04d}.png")


def train(model: str, train_root: Path, epochs: int, device: str, batch: int = 64) -> tuple[object, float]:
    """A torchvision ResNet trained from scratch on ``train_root``: (model in eval mode, train top-1)."""
    import torch

    from deepgap.measure.accuracy.dataset import load
    from deepgap.measure.accuracy.evaluate import decode, normalise
    from deepgap.measure.models.build import build_model

    x, y = decode(list(load(str(train_root)).items), 224)
    x, y = normalise(x), y
    torch.manual_seed(0)
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    m = build_model(model, 224).to(device).train()
    opt = torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-5, nesterov=True)
    steps = epochs * math.ceil(len(x) / batch)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.05, total_steps=steps, pct_start=0.2)
    for _ in range(epochs):
        perm = torch.randperm(len(x))
        for i in range(0, len(x), batch):
            idx = perm[i : i + batch]
            xb, yb = x[idx].to(device, non_blocking=True), y[idx].to(device)
            opt.zero_grad(set_to_none=True)
            amp = device != "cpu"
            with torch.autocast(device_type=device.split(":")[0], dtype=torch.bfloat16, enabled=amp):
                loss = torch.nn.functional.cross_entropy(m(xb), yb)
            loss.backward()
            opt.step()
            sched.step()
    m.eval()
    return m, accuracy(m, x, y, device)


def accuracy(m, x, y, device: str) -> float:
    """Top-1 of ``m`` (fp32, TF32 off) on (x, y)."""
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    hits = 0
    with torch.no_grad():
        for i in range(0, len(x), 256):
            hits += int((m(x[i : i + 256].to(device)).argmax(1).cpu() == y[i : i + 256]).sum())
    return hits / max(1, len(x))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="resnet50", help="resnet18 | resnet50 | resnet101 (torchvision)")
    p.add_argument("--out", required=True, help="folder for train/, eval/ and MODEL.pt (created)")
    p.add_argument("--classes", type=int, default=100)
    p.add_argument("--train-per-class", type=int, default=24)
    p.add_argument("--eval-per-class", type=int, default=12, help="≥ 1,024 scored after 64 calibrate")
    p.add_argument("--epochs", type=int, default=30)
    p.add_argument("--device", default="cuda")
    a = p.parse_args(argv)
    out = Path(a.out)
    if out.exists() and any(out.iterdir()):
        print(f"error: --out {a.out!r} is not empty; give a new folder", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    write_set(out / "train", a.classes, a.train_per_class, seed=1)
    write_set(out / "eval", a.classes, a.eval_per_class, seed=2)
    t_data = time.perf_counter() - t0
    import torch

    from deepgap.measure.accuracy.dataset import load
    from deepgap.measure.accuracy.evaluate import decode, normalise

    m, train_acc = train(a.model, out / "train", a.epochs, a.device)
    weights = out / f"{a.model}.pt"
    torch.save({k: v.detach().cpu() for k, v in m.state_dict().items()}, weights)
    xe, ye = decode(list(load(str(out / "eval")).items), 224)
    eval_acc = accuracy(m, normalise(xe), ye, a.device)
    print(
        json.dumps(
            {
                "model": a.model,
                "classes": a.classes,
                "train_images": a.classes * a.train_per_class,
                "eval_images": a.classes * a.eval_per_class,
                "epochs": a.epochs,
                "train_top1_fp32": round(train_acc, 4),
                "eval_top1_fp32": round(eval_acc, 4),
                "weights": str(weights),
                "dataset": str(out / "eval"),
                "seconds": {"data": round(t_data, 1), "total": round(time.perf_counter() - t0, 1)},
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
