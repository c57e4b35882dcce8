"""A bare decode loop, apart from deepgap's sweep: the check on its decode tokens/s (issue 51).

It shares only the decoder's modules (`deepgap.measure.models.llama_net`) and, for fp8/int8, the Linear
swap (`deepgap.measure.quant.transformer.quantize_linears`, then `deepgap.measure.llm_fused`'s batch-1 layer
unless DEEPGAP_DECODE_FUSED=0; with DEEPGAP_DECODE_ROPE=fused its qkv GEMV does RoPE and the K/V cache write too)
and the static step's attention kernel (`deepgap.measure.llm_attention`, unless DEEPGAP_DECODE_ATTENTION=sdpa;
``--attention`` times several; split over the cache as DEEPGAP_DECODE_SPLIT_KV says, ``--split-kv`` times
several, its chunks merged as DEEPGAP_DECODE_COMBINE says, ``--combine`` times several; the RMSNorm folded or
handed over as DEEPGAP_DECODE_NORM says, ``--norm`` times several; ``--tiles`` forces a fused GEMV's tile by
shape, turn by turn, where the tuner would time its own); the timing is its own.
Per batch: seeded prompts of ``--input-len`` tokens are prefilled; the decode step (positions as a device
tensor, the whole cache masked) is compiled and captured as one CUDA graph; then ``--steps`` greedy steps are
replayed back to back (each step's greedy token, `llm_timing.greedy` as deepgap picks it, is the next step's
input, on the device) between two CUDA events,
after a timed prefill, five times. decode tokens/s = batch × steps / median window, which is what deepgap's
pipelined decode figure measures; ``decode_tok_s_sync`` = batch / the median of one more generation's steps,
each timed alone from an idle, synchronized GPU, which is how `deepgap run` times its TPOT samples and its
decode tokens/s (this loop's step also copies its token into the input buffer: one small kernel more);
output tokens/s = batch × (steps + 1) / (median prefill + median window),
as deepgap's output figure counts a generation; ``--prefill compiled`` times a prefill compiled by Inductor
(deepgap's compiling engines run theirs so, `llm_steps.make_prefill`), ``eager-row-kernel`` an eager one whose
8-bit Linears quantize their inputs in one kernel (DEEPGAP_QUANT_ROW_QUANT=triton, `quant.row_quant`), eager by
default. ``--profile`` adds the top kernels of ten replayed steps (torch.profiler), where a step's time goes;
``--timeline`` each kernel's share of the step's critical path over ten replays (`deepgap.roofline.timeline`:
with PDL the kernels overlap), its trace saved beside. One JSON line per batch goes to
``--out``/llm_decode_loop.jsonl.

    python benchmarks/llm_decode_loop.py --model llama-3.1-8b --precision fp8 --batches 1 --profile --out OUT
    python benchmarks/llm_decode_loop.py --batches 1,4 --pdl on --split-kv off,auto --out OUT  # the split KV
    python benchmarks/llm_decode_loop.py --pdl on --split-kv auto --norm fold,handoff --harness deepgap --out OUT
    python benchmarks/llm_decode_loop.py --batches 512 --kv-cache fp8 --harness deepgap --out OUT  # fp8 codes
    python benchmarks/llm_decode_loop.py --batches 512 --kv-cache fp8 --prefill compiled --harness deepgap --out OUT
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import re
import statistics
from pathlib import Path
from unittest import mock

import torch

from deepgap.core import switches
from deepgap.measure.llm_timing import greedy


def build(model: str, precision: str):
    """The decoder on the GPU: bf16, or fp8/int8 Linears (weight-only GEMV at ≤ 16 rows) with a bf16 rest."""
    from deepgap.measure.models.llama_net import build_llama

    m = build_llama(model, seed=0, device="cuda")
    if precision == "bf16":
        return m.to(torch.bfloat16)
    from deepgap.measure.quant.linear import LinearQuant
    from deepgap.measure.quant.transformer import quantize_linears

    quantize_linears(m, LinearQuant(precision, "row", weight_only_rows=16), out_dtype=torch.bfloat16)
    if switches.read("DEEPGAP_DECODE_FUSED") == "1":  # as deepgap's quant decode does at batch 1
        from deepgap.measure import llm_fused

        llm_fused.fuse(m)
    return m


def _own_step(m, tok, input_len: int):
    """This loop's own graph: the compiled static step and its argmax captured once; ``one(i)`` replays it."""
    step = torch.compile(m.decode_step, dynamic=False)
    pos = torch.full((1,), input_len, dtype=torch.int64, device="cuda")
    from deepgap.measure.quant import launch

    # DEEPGAP_DECODE_PDL=on: the Triton kernels with programmatic dependent launch (deepgap times auto; this
    # graph launches without it at auto or off, and says so in the row's ``harness``)
    pdl_on = os.environ.get("DEEPGAP_DECODE_PDL") == "on"

    def pdl():
        return launch.pdl() if pdl_on else contextlib.nullcontext()

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side), pdl():
        for _ in range(3):
            step(tok, pos)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with pdl(), torch.cuda.graph(graph):
        nxt = greedy(step(tok, pos))

    def one(i: int) -> None:
        pos.fill_(input_len + i)
        graph.replay()
        tok.copy_(nxt)

    return one, f"own graph, PDL {'on' if pdl_on else 'off'}"


def _deepgap_step(m, tok, input_len: int, inside: bool = True):
    """deepgap's own graph step (`llm_steps.make_step`, as the quant engine builds it), timed by this loop.

    Why: where deepgap's figure and this loop's differ, this tells the step's construction (its warm-up,
    its captures and PDL choice) from the harness's timing apart. ``inside``: the greedy token taken and fed
    in the step's graph, as `deepgap run` takes it (`llm_timing.token_step`); else by torch outside it, as
    before session 52 (the harness ``deepgap-outside``).
    """
    from deepgap.measure.llm_steps import make_step
    from deepgap.measure.llm_timing import token_step

    step = make_step(m, "cuda-graph", "default", True)
    step(tok, input_len)  # warm-up, both captures and the PDL choice
    nxt, last = token_step(step), {}

    def one(i: int) -> None:
        if not inside:
            tok.copy_(greedy(step(tok, input_len + i)))
            return
        # step 0 takes the prefill's token (the window's own); later steps the token the step returned
        last["tok"] = nxt(tok if i == 0 else last["tok"], input_len + i)

    where = "in the graph" if inside else "outside the graph"
    return one, f"deepgap step, PDL {step.pdl}, greedy {where}"


def measure(  # noqa: D103
    m,
    batch: int,
    input_len: int,
    steps: int,
    profile: bool,
    harness: str = "own",
    timeline: str = "",
    prefill: str = "eager",
) -> dict:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, m.shape.vocab, (batch, input_len), generator=g).cuda()
    m.setup_cache(batch, input_len + steps + 1)  # as deepgap sizes it: the step attends over the whole cache
    from deepgap.measure import llm_attention

    llm_attention.plug(m)
    fill = torch.compile(m.prefill, dynamic=False) if prefill == "compiled" else m.prefill
    # the row kernel for this turn only (`QuantLinear` reads the switch at each call); restored after it
    row_quant = {"DEEPGAP_QUANT_ROW_QUANT": "triton" if prefill == "eager-row-kernel" else "torch"}
    with mock.patch.dict(os.environ, row_quant), torch.inference_mode():
        tok = greedy(fill(ids))  # a compiled prefill compiles here, untimed
        if harness.startswith("deepgap"):
            one, how = _deepgap_step(m, tok, input_len, inside=harness != "deepgap-outside")
        else:
            one, how = _own_step(m, tok, input_len)

        windows, prefills = [], []
        for _ in range(5):
            a, b, c = (torch.cuda.Event(enable_timing=True) for _ in range(3))
            a.record()
            tok.copy_(greedy(fill(ids)))
            b.record()
            for i in range(steps):
                one(i)
            c.record()
            c.synchronize()
            prefills.append(a.elapsed_time(b) / 1e3)
            windows.append(b.elapsed_time(c) / 1e3)
        # each step alone from an idle, synchronized GPU, as `deepgap run` times its TPOT samples
        # (`measure.timing`; its decode tokens/s is batch / their median): like against like with the harness
        tok.copy_(greedy(fill(ids)))
        alone = []
        for i in range(steps):
            torch.cuda.synchronize()
            a, b = (torch.cuda.Event(enable_timing=True) for _ in range(2))
            a.record()
            one(i)
            b.record()
            b.synchronize()
            alone.append(a.elapsed_time(b))
        row = {"batch": batch, "steps": steps, "harness": how, "prefill": prefill}
        sync_ms = statistics.median(alone)
        row |= {"tpot_sync_ms": round(sync_ms, 4), "decode_tok_s_sync": round(batch * 1e3 / sync_ms, 1)}
        row["windows_s"] = [round(w, 6) for w in windows]
        row["prefills_s"] = [round(p, 6) for p in prefills]  # each timed prefill: TTFT's spread
        w, p = statistics.median(windows), statistics.median(prefills)
        row |= {"tpot_ms": round(w / steps * 1e3, 4), "decode_tok_s": round(batch * steps / w, 1)}
        # a generation's output tokens (the prefill's one and a step's each) over its prefill and decode time
        row |= {"ttft_ms": round(p * 1e3, 3), "output_tok_s": round(batch * (steps + 1) / (p + w), 1)}
        if profile:
            from torch.profiler import ProfilerActivity
            from torch.profiler import profile as prof

            with prof(activities=[ProfilerActivity.CUDA]) as p:
                for i in range(10):
                    one(i)
                torch.cuda.synchronize()
            row["top_kernels"] = p.key_averages().table(
                sort_by="cuda_time_total", row_limit=18, max_name_column_width=70
            )
        if timeline:
            row |= _timeline(one, m.shape.layers, timeline)
    return row


def _timeline(one, layers: int, path: str) -> dict:
    """Ten replayed steps under the profiler: the trace saved to ``path`` and each kernel's critical-path share.

    Why: with PDL the kernels overlap, so the profiler's per-kernel totals overstate each one; what a kernel
    costs is how far it moves the step's end (`deepgap.roofline.timeline`).
    """
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as prof

    from deepgap.roofline import timeline, trace

    with prof(activities=[ProfilerActivity.CUDA]) as p:
        for i in range(10):
            one(i)
        torch.cuda.synchronize()
    p.export_chrome_trace(path)
    t = timeline.critical_path(trace.gpu_kernels(trace.load_trace(path)), steps=10, layers=layers)
    return {
        "timeline_step_us": round(t.step_us, 2),
        "timeline_us": {s.label: [round(s.cost_us, 2), round(s.dur_us, 2), s.per_step] for s in t.shares},
        "timeline_table": timeline.table(t),
    }


def parser() -> argparse.ArgumentParser:
    """The loop's options (a function, so that a test reads the defaults the script runs with)."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="llama-3.1-8b")
    ap.add_argument("--precision", default="fp8", choices=["bf16", "fp8", "int8"])
    ap.add_argument("--batches", default="1")
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--steps", type=int, default=127)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument(
        "--prefill",
        default="eager",
        help="the prompt's prefill eager, eager with the one-kernel row quantization (eager-row-kernel) or "
        "compiled by Inductor (deepgap's compiling engines: make_prefill), in turn, e.g. eager,compiled",
    )
    ap.add_argument(
        "--kv-cache",
        default="auto",
        choices=["auto", "fp8"],
        help="the KV cache's format: the decoder's dtype, or fp8 codes (deepgap's --kv-caches, llama_cache)",
    )
    ap.add_argument(
        "--attention-block",
        type=int,
        default=None,
        help="cache positions a one-pass attention program loads a step (llm_attention.BLOCK, 64; and "
        "WIDE_BLOCK, 128, for --split-kv wide): over fp8 codes 32 takes 96 registers against 64's 168 at sm_90",
    )
    ap.add_argument(
        "--timeline",
        action="store_true",
        help="each kernel's share of the step's critical path (its trace saved to --out)",
    )
    ap.add_argument(
        "--pdl", default=None, help="launch modes to time in turn, e.g. off,on (DEEPGAP_DECODE_PDL)"
    )
    ap.add_argument(
        "--split-kv",
        default=None,
        help="attention splits to time in turn, e.g. off,auto (DEEPGAP_DECODE_SPLIT_KV)",
    )
    ap.add_argument(
        "--combine",
        default=None,
        help="split-KV merges to time in turn, e.g. kernel,last-block (DEEPGAP_DECODE_COMBINE)",
    )
    ap.add_argument(
        "--attention",
        default=None,
        help="static-step attentions to time in turn, e.g. triton,sdpa (DEEPGAP_DECODE_ATTENTION)",
    )
    ap.add_argument(
        "--norm",
        default=None,
        help="the RMSNorm folded into its reader or handed over by its writer, in turn, e.g. fold,handoff "
        "(DEEPGAP_DECODE_NORM)",
    )
    ap.add_argument(
        "--angles",
        default=None,
        help="RoPE's angles from Inductor's formula or one kernel, in turn, e.g. inductor,kernel "
        "(DEEPGAP_DECODE_ANGLES)",
    )
    ap.add_argument(
        "--constants",
        default=None,
        help="each kernel's epilogue constants loaded before PDL's wait or after its K loop, in turn, e.g. "
        "after,ahead,after,ahead (DEEPGAP_PDL_CONSTANTS, `quant.launch.constants_ahead`)",
    )
    ap.add_argument(
        "--tiles",
        default="tuned",
        help="the fused GEMVs' tiles, in turn (';' between turns): tuned, or KxN=BNxBKwW[sS][t|b][aA][rR],... "
        "forcing the tile of each fused GEMV of that shape (sS: S pipeline stages, 1 by default; reduce-each, or t: "
        "in-thread, b: a BN x BK block reduced once at the end, as the tuner's 8x512 st4; aA: A K steps' weights "
        "loaded before PDL's wait, 1 by default; rR: at most R registers a thread), "
        "e.g. 'tuned;14336x4096=8x2048w8t;4096x4096=8x2048w8ta2;4096x6144=8x512w4s4br128'",
    )
    ap.add_argument(
        "--harness",
        default="own",
        help="whose graph step to replay, e.g. own,deepgap (deepgap: llm_steps.make_step, as the engine builds it; "
        "deepgap-outside: the same with greedy's token taken outside its graph, as before session 52)",
    )
    ap.add_argument("--out", required=True)
    return ap


def main() -> None:  # noqa: D103
    args = parser().parse_args()
    prefills = _prefills(args.prefill)  # checked before the model is built
    m = build(args.model, args.precision)
    if args.attention_block:
        from deepgap.measure import llm_attention

        llm_attention.BLOCK = llm_attention.WIDE_BLOCK = args.attention_block
    from deepgap.measure.models.llama_cache import codes_of
    from deepgap.measure.quant import launch

    # before any setup_cache: with "fp8", every cache this loop makes holds codes
    m.kv_codes = codes_of(args.kv_cache)
    runs = _runs(args)
    for constants, mode, split, combine, attention, norm, angles, tiles, harness in runs:
        force_tiles(tiles)
        os.environ["DEEPGAP_PDL_CONSTANTS"] = constants
        for k, v in zip(TURNED, (mode, split, combine, attention, norm, angles), strict=True):
            os.environ[f"DEEPGAP_DECODE_{k.upper()}"] = v
        if args.precision != "bf16":  # the fused layers read the switch (`llm_fused.configure`)
            from deepgap.measure import llm_fused

            llm_fused.configure(m)
        for b, prefill in itertools.product((int(x) for x in args.batches.split(",")), prefills):
            row = {"model": args.model, "precision": args.precision, "input_len": args.input_len}
            # the switches an ablation turns (module docstring), as this process ran
            row |= {k: os.environ.get(f"DEEPGAP_DECODE_{k.upper()}", "") for k in SWITCHES}
            row["forced_tiles"], row["kv_cache"] = tiles, args.kv_cache
            row["pdl_trigger"] = launch.trigger()  # under PDL (`quant.gdc`)
            row["pdl_constants"] = constants  # the epilogue's constants before the wait or after the loop
            row["attention_block"] = args.attention_block or "default"
            tag = "-".join(
                x for x in (mode, split, attention, norm, angles, harness, prefill, constants) if x
            )
            tag += "" if tiles == "tuned" else "-" + tiles.replace("=", "_").replace(",", "+")
            trace_path = str(Path(args.out) / f"timeline-b{b}-{tag}.json.gz") if args.timeline else ""
            row |= measure(
                m, b, args.input_len, args.steps, args.profile and b == 1, harness, trace_path, prefill
            )
            if args.precision != "bf16":  # the tiles this process timed (deepgap's rows say theirs)
                from deepgap.measure.quant import gemv

                row["tiles"] = gemv.chosen()
            tables = [row.pop("top_kernels", None), row.pop("timeline_table", None)]
            print(json.dumps(row), flush=True)
            for table in filter(None, tables):
                print(table, flush=True)
            with (Path(args.out) / "llm_decode_loop.jsonl").open("a") as f:
                f.write(json.dumps(row) + "\n")


# the DEEPGAP_DECODE_* switches a row records, as its process ran (module docstring)
SWITCHES = ("fused", "rope", "attention", "pdl", "split_kv", "combine", "norm", "angles", "qkv_tile")
# those the options turn, in a turn's order: each option's name is its switch's (``--split-kv``: SPLIT_KV)
TURNED = ("pdl", "split_kv", "combine", "attention", "norm", "angles")


_FORCED: dict[tuple[int, int], object] = {}  # (K, N) → the fused GEMVs' tile this turn (`force_tiles`)


def force_tiles(spec: str) -> None:
    """This turn's tiles: ``tuned`` (the tuner's), or ``KxN=BNxBKwW[sS][t|b][aA][rR],...``: every fused GEMV of
    that shape takes the tile BN × BK with W warps (``sS``: S stages, one by default; reduce-each, or ``t``: summed
    in-thread each step, `gemv.IN_THREAD`, or ``b``: a block reduced once at the end; ``aA``: A steps' weights loaded
    before PDL's wait, `gemv.GemvTile.ahead`; ``rR``: ptxas's register cap), whatever the tuner would time."""
    from deepgap.measure.quant import gemv

    if not getattr(gemv.fastest, "forces_tiles", False):  # the tuner wrapped once a process
        untouched = gemv.fastest

        def fastest(key, device, cands, call, decode=False, weights=None):
            if key[0] == "fused" and (key[2], key[3]) in _FORCED:
                gemv._TUNED[key] = _FORCED[(key[2], key[3])]
                return gemv._TUNED[key]
            return untouched(key, device, cands, call, decode, weights=weights)

        fastest.forces_tiles = True
        gemv.fastest = fastest
    for key in [k for k in gemv._TUNED if k[0] == "fused" and (k[2], k[3]) in _FORCED]:
        del gemv._TUNED[key]  # the last turn's forced tiles: timed again, or forced again below
    _FORCED.clear()
    for part in spec.split(",") if spec != "tuned" else ():
        shape, tile = part.split("=")
        k, n = (int(v) for v in shape.split("x"))
        m = re.fullmatch(r"(\d+)x(\d+)w(\d+)(?:s(\d+))?([tb]?)(?:a(\d+))?(?:r(\d+))?", tile)
        if m is None:
            raise SystemExit(f"--tiles: {tile!r} is not BNxBKwW[sS][t|b][aA][rR], e.g. 8x2048w8ta2")
        bn, bk, warps = (int(v) for v in m.group(1, 2, 3))
        reduce_each = {"t": gemv.IN_THREAD.value, "b": 0}.get(m.group(5), 1)
        stages, ahead, cap = int(m.group(4) or 1), int(m.group(6) or 1), int(m.group(7) or 0)
        _FORCED[(k, n)] = gemv.GemvTile(bn, bk, 1, warps, stages, 0, reduce_each, maxnreg=cap, ahead=ahead)


def _runs(args: argparse.Namespace):
    """Each turn's (constants, PDL, split KV, combine, attention, norm, angles, tiles, harness): the lists' product.

    A switch not given keeps the environment's value, else deepgap's default (`core.switches`; ``auto`` for PDL
    is deepgap's choice, and the own harness launches with PDL only at ``on``). Until session 53 the loop kept
    its own defaults, split KV ``off`` and the angles ``inductor``, where deepgap runs ``auto`` and ``kernel``.
    Session 43's batch-512 loop stopped at once when an unset PDL was passed on as ``''``, which
    `core.switches` refuses.
    """
    turns = [_turns(getattr(args, k), k.upper()) for k in TURNED]
    env = os.environ.get("DEEPGAP_PDL_CONSTANTS") or switches.SWITCHES["DEEPGAP_PDL_CONSTANTS"].default
    constants = args.constants.split(",") if args.constants else [env]
    return itertools.product(constants, *turns, args.tiles.split(";"), args.harness.split(","))


PREFILLS = ("eager", "eager-row-kernel", "compiled")


def _prefills(value: str) -> list[str]:
    """``--prefill``'s turns, each one of `PREFILLS` (a typo stops the loop before the model is built)."""
    turns = value.split(",")
    bad = [t for t in turns if t not in PREFILLS]
    if bad:
        raise SystemExit(f"--prefill {value}: {', '.join(bad)} is not one of {', '.join(PREFILLS)}")
    return turns


def _turns(value: str | None, switch: str) -> list[str]:
    """The values of ``DEEPGAP_DECODE_<switch>`` to time in turn: the option's list, else the environment's one,
    else deepgap's own default (`core.switches`), so that an option left out times what `deepgap run` runs."""
    name = f"DEEPGAP_DECODE_{switch}"
    return value.split(",") if value else [os.environ.get(name) or switches.SWITCHES[name].default]


if __name__ == "__main__":
    main()
