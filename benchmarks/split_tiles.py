"""Each batch-1 split-K tile the quant tuner times for a network's layers, with its time: spread or not.

Why: the tuner keeps only a layer's fastest tile (`tuning.time_layer`), so `deepgap run` shows what a kind of
tile gains the network, not what each tile costs. Session 41 added spread split-K tiles (`split_k.spread_sum`:
every slice's program sums a band of the tile, where `split_sum`'s last program summed all of it alone); this
times, for every layer where split-K is offered at batch 1, each candidate the tuner would time (the grouped
tiles, the split ones, the spread ones) on the same inputs, after the same exact self-check, so each spread
tile stands beside its split.

    python benchmarks/split_tiles.py --models resnet50 --precisions fp8,int8 --out $OUT/split-tiles.jsonl

One JSON line per (layer, tile); a table last: per layer the fastest unsplit, split and spread tile in µs.
"""

from __future__ import annotations

import argparse
import json

import torch


def measure(model_name: str, precision: str) -> list[dict]:
    """Every candidate tile of each layer of ``model_name`` at batch 1 where spread split-K tiles are offered."""
    from deepgap.measure.models.build import build_model
    from deepgap.measure.quant import layers, tuning
    from deepgap.measure.quant.prepare import QuantOptions, prepare_quant

    opts = QuantOptions()
    net = prepare_quant(build_model(model_name, 224, None, 0), precision, 1, 224, model_name, opts=opts).net
    rows = []
    with torch.inference_mode():
        for name, layer in net.convs.items():
            cands = tuning.candidates(net, name, 1, opts, True)
            if not any(cfg is not None and cfg.spread for _, cfg in cands):
                continue
            n = layer.node
            h, w, _ = net.shapes[n.inp]
            oh, ow, _ = net.shapes[n.out]
            dev = layer.w_q.device
            x = tuning.rand_act(h * w, n.cin, layer.in_fmt, dev)
            r = tuning.rand_act(oh * ow, n.cout, layer.res_fmt, dev) if n.residual else None
            ref = layers.conv_reference(layer, x, (1, h, w), r)
            kept = net.backend[name], net.configs[name]
            for backend, cfg in cands:
                best, errors = tuning._best_of(net, name, [(backend, cfg)], x, x, r, r, ref, 1, 1, opts)
                row = {"model": model_name, "precision": precision, "layer": name,
                       "tile": cfg.label if cfg else backend, "split": cfg.split_k if cfg else 0,
                       "spread": bool(cfg and cfg.spread), "us": best[0] * 1e6 if best else None,
                       "error": "; ".join(errors) or None, "kept": (backend, cfg) == kept}  # fmt: skip
                print(json.dumps(row), flush=True)
                rows.append(row)
            net.backend[name], net.configs[name] = kept
    return rows


def main() -> None:  # noqa: D103
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--models", default="resnet50")
    p.add_argument("--precisions", default="fp8,int8")
    p.add_argument("--out", default=None)
    a = p.parse_args()
    rows = [r for m in a.models.split(",") for q in a.precisions.split(",") for r in measure(m, q)]
    if a.out:
        with open(a.out, "a") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)
    print("\n".join(table(rows)))


def table(rows: list[dict]) -> list[str]:
    """Per (model, precision, layer): the fastest unsplit, split and spread tile in µs, and the fastest tile."""
    out = [f"{'model':9} {'prec':5} {'layer':22} {'unsplit µs':>10} {'split µs':>9} {'spread µs':>9}  best"]
    for key in dict.fromkeys((r["model"], r["precision"], r["layer"]) for r in rows):
        mine = [r for r in rows if (r["model"], r["precision"], r["layer"]) == key and r["us"] is not None]
        kinds = [[r for r in mine if r["split"] <= 1], [r for r in mine if r["split"] > 1 and not r["spread"]],
                 [r for r in mine if r["spread"]]]  # fmt: skip
        best = [min((r["us"] for r in k), default=float("nan")) for k in kinds]
        fastest = min(mine, key=lambda r: r["us"])["tile"] if mine else "-"
        out.append(
            f"{key[0]:9} {key[1]:5} {key[2]:22} {best[0]:10.2f} {best[1]:9.2f} {best[2]:9.2f}  {fastest}"
        )
    return out


if __name__ == "__main__":
    main()
