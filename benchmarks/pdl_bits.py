"""Where a quant network's PDL graph gives other bits than its plain graph, and whether the plain one repeats itself.

Why: session 55's ResNet-50 fp8 at batch 1024 on one H100 kept the plain graph because "the PDL graph's logits
differ from the plain graph's" (`quant.pdl_choice`), where batch 1 gave the same bits. Either the plain graph is not
deterministic at that batch (then PDL is not to blame), or a kernel under PDL reads before its predecessor's
writes are done (a race the trigger's place can expose). This prints, as JSON lines:

- ``graph``: the plain graph replayed three times (same bits?), then a PDL capture per trigger (`gdc`), each
  replayed three times against the plain one;
- ``eager``: the network's steps run eagerly (every tensor kept), plain twice, then under `launch.pdl` per
  trigger, and the first step whose output differs (its name, the differing elements, the largest difference).

Usage (a GPU): ``python benchmarks/pdl_bits.py --model resnet50 --precision fp8 --batch 1024 --triggers early,late``
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os

import torch


def _diff(a: torch.Tensor, b: torch.Tensor) -> dict:
    from deepgap.measure.quant.repeats import changed

    bad = changed(a, b)
    n = int(bad.sum())
    return {
        "differ": n,
        "of": a.numel(),
        "max_abs": float((a.float() - b.float()).abs()[bad].max()) if n else 0.0,
    }


def _eager(net, x: torch.Tensor, pdl: bool) -> dict[str, torch.Tensor]:
    """Every step's output, none dropped, the steps launched as the graph launches them (PDL or not)."""
    from deepgap.measure.quant import launch

    env = {net.graph.input: x}
    with torch.inference_mode(), launch.pdl() if pdl else contextlib.nullcontext():
        for _, step in net.steps(x.shape[0]):
            step(env)
    torch.cuda.synchronize()
    return env


def _where(a: torch.Tensor, b: torch.Tensor, batch: int) -> dict:
    """Where two NHWC activation matrices ``[batch·H·W, C]`` differ: counts by image row, column and channel.

    Why: a race's footprint names its cause (a tile's edge, a block of channels, the last images); the five
    commonest of each, and how many images hold a difference. Square images assumed (H = W); else nothing.
    """
    from deepgap.measure.quant.repeats import changed

    bad = changed(a, b)
    if a.dim() != 2 or a.shape[0] % batch:
        return {}
    side = int(round((a.shape[0] // batch) ** 0.5))
    if side * side * batch != a.shape[0]:
        return {}
    grid = bad.reshape(batch, side, side, a.shape[1])

    def top(counts: torch.Tensor) -> list[list[int]]:
        n = min(5, counts.numel())
        v, i = counts.topk(n)
        return [[int(k), int(c)] for k, c in zip(i, v, strict=True) if c]

    return {
        "images": int(grid.flatten(1).any(1).sum()),
        "rows": top(grid.sum((0, 2, 3))),
        "columns": top(grid.sum((0, 1, 3))),
        "channels": top(grid.sum((0, 1, 2))),
    }


def _first_difference(names: list[str], base: dict, other: dict, batch: int = 1) -> dict:
    for name in names:
        a, b = base.get(name), other.get(name)
        if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.shape == b.shape:
            d = _diff(a, b)
            if d["differ"]:
                return {"first_differing": name, **d, "where": _where(a, b, batch)}
    return {"first_differing": None}


def _keep_scratch() -> None:
    from deepgap.measure.quant import persistent

    kept, made = [], persistent._scratch

    def scratch(size, alignment, stream):
        kept.append(made(size, alignment, stream))
        return kept[-1]

    persistent._scratch = scratch


def main() -> None:  # noqa: D103
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="resnet50")
    ap.add_argument("--precision", default="fp8")
    ap.add_argument("--batch", type=int, default=1024)
    ap.add_argument("--triggers", default="early,late", help="PDL's triggers to capture ('' for none)")
    ap.add_argument(
        "--keep-scratch",
        action="store_true",
        help="never free the TMA descriptors' scratch (`persistent._scratch`): each launch's descriptors at "
        "their own address, none rewritten where an earlier kernel's were",
    )
    args = ap.parse_args()
    triggers = [t for t in args.triggers.split(",") if t]
    if args.keep_scratch:
        _keep_scratch()
    from deepgap.core import switches
    from deepgap.measure import graph_runner
    from deepgap.measure.models.build import build_model
    from deepgap.measure.quant import launch
    from deepgap.measure.quant.prepare import QuantOptions, prepare_quant

    model = build_model(args.model, 224, None, 0)
    res = prepare_quant(model, args.precision, args.batch, 224, args.model, opts=QuantOptions(pdl="off"))
    net, run = res.net, res.run
    x = (
        torch.randn(args.batch, 3, 224, 224, device="cuda")
        .half()
        .contiguous(memory_format=torch.channels_last)
    )
    x = graph_runner.bound_input(run, x)
    head = {
        "model": args.model,
        "precision": args.precision,
        "batch": args.batch,
        "keep_scratch": args.keep_scratch,
    }
    head["conv_tma"] = switches.read("DEEPGAP_QUANT_CONV_TMA")  # the 3×3 TMA tiles offered (off by default)
    head["conv_tma_desc"] = switches.read("DEEPGAP_QUANT_CONV_TMA_DESC")  # where their descriptors are made
    with torch.inference_mode():
        plain = run(x).clone()
        again = [_diff(plain, run(x)) for _ in range(3)]
    print(json.dumps({**head, "what": "graph", "turn": "plain", "replays": again}), flush=True)
    for trigger in triggers:
        os.environ["DEEPGAP_PDL_TRIGGER"] = trigger
        with launch.pdl():
            graph, out = graph_runner.capture(net.forward, x, "cuda", warmup=2)
        with torch.inference_mode():
            reps = []
            for _ in range(3):
                graph.replay()
                torch.cuda.synchronize()
                reps.append(_diff(plain, out))
        print(json.dumps({**head, "what": "graph", "turn": f"pdl {trigger}", "replays": reps}), flush=True)
    tiles = {t["name"]: f"{t['mode']} {t['config']}" for t in res.info.get("layers", [])}
    base = _eager(net, x, pdl=False)
    names = list(base)  # the tensors in the order the steps made them
    turns = [("plain", False)] + [(f"pdl {t}", True) for t in triggers]
    for label, pdl in turns:
        if pdl:
            os.environ["DEEPGAP_PDL_TRIGGER"] = label.split()[1]
        found = _first_difference(names, base, _eager(net, x, pdl), args.batch)
        found["its_tile"] = tiles.get(found["first_differing"])
        print(json.dumps({**head, "what": "eager", "turn": label, **found}), flush=True)


if __name__ == "__main__":
    main()
