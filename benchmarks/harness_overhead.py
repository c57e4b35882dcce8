"""Does deepgap's harness cost anything? Its throughput vs a minimal standalone CUDA-event loop.

Same model (built by deepgap's registry: identical weights), batch, precision (fp16; fp32 on a CPU),
layout and host settings (``torch.set_num_interop_threads(1)``, as deepgap's worker) on the same
device. The comparison is made in ``--rounds`` interleaved rounds, each a fresh standalone process
and a fresh deepgap run, their order alternating (ABBA) so that drift cancels; per batch size the
result is the median of the per-round ratios deepgap / standalone with a 95% bootstrap CI. Why
rounds: at batches where eager execution is bound by Python's kernel launches, one process's
throughput differs from the next one's by more than the 2% goal (measured on the H100: ResNet-50
batch 1, 240.6 vs 187.4 img/s in two fresh processes), so a single pair of runs cannot decide.

Verdict per batch: ``agree`` when the CI lies within ±2%, ``differ`` when it lies outside, else
``undecided`` (more rounds needed). For information, one standalone run with the default host
threads (not deepgap's interop=1) is also reported.

``--mode paired`` takes the process out of the comparison. On the H100 the spread between fresh
processes did not shrink with more rounds (about one process in four, deepgap's or the bare loop's
alike, ran launch-bound ResNet-50 15-40% slower for its whole life), so each round is instead one
fresh process, started as deepgap starts its workers, that builds deepgap's worker state and then
alternates ``--blocks`` times (ABBA) between deepgap's own measurement of the configuration
(`deepgap.measure.configuration.measure` with the request `SweepRunner` sends: engine set-up, correctness check,
telemetry thread, timing protocol, statistics) and the bare loop. Both arms share the process, so
its speed cancels in each block's ratio; what is left out is only the parent's side of the pipe,
which is outside deepgap's timed window. Result per batch: the median of all block ratios, with a
95% bootstrap CI that resamples rounds and then blocks within them (blocks of one process are not
independent). Written to ``harness_overhead_paired.json``.

``--engine cudagraph`` (GPU) measures deepgap's cudagraph engine against a bare loop that copies the
batch into a captured graph's input and replays it: one launch per iteration, so the GPU sets the
pace and the host's launch speed drops out. On the H100, eager at batches 1 and 32 stayed undecided
in both designs (the host's launch pace wandered by more than 2% from block to block, for the bare
loop alone too); paired with CUDA graphs, all three batches agreed within ±1%. Files get the
suffix ``_cudagraph``.

``--engine compile-freeze`` (paired only; fp16, channels_last) compares with a bare
``torch.compile(mode="reduce-overhead")`` under Inductor freezing, called on the same input every time;
``--engine quant --precision int8|fp8`` (GPU) with the quant engine's captured runner called directly.
Each deepgap measurement of compile-freeze starts with ``torch._dynamo.reset()``, which frees the bare
loop's CUDA graphs, so the bare loop compiles afresh after it (blocks run deepgap-first, BAAB, to
compile it once per two of its blocks). In the paired design every block also times both arms
*pipelined* (CUDA events around ``--iterations`` back-to-back calls; deepgap's
``throughput_pipelined_ips``), a second ratio under ``rows[*]["pipelined"]``: deepgap's headline
``throughput_ips`` comes from synchronized latencies, which include the host's dispatch of each call,
and a loop timed around N calls hides that dispatch, so only like may be compared with like. Files get
the suffix ``_compile-freeze`` or ``_quant-int8`` / ``_quant-fp8``.

The JSON is rewritten after every round (``"complete": false`` until the last), so a run stopped
by a time limit keeps the rounds it finished; ``--continue`` adds rounds to the file's earlier ones
(same model, precision, iterations and batch sizes) until the verdict is decided.

    python benchmarks/harness_overhead.py [--batch-sizes 1,32,256] [--rounds 6] [--iterations 100] [--out DIR]
                                          [--continue] [--mode processes|paired] [--blocks 6]
                                          [--engine eager|cudagraph|compile-freeze|quant]
                                          [--precision int8|fp8]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile

import numpy as np

import deepgap
from deepgap.core.stats import bootstrap_ci
from deepgap.drive.config import SweepSpec

TOLERANCE = 0.02


class BareLoop:
    """The minimal loop: the registry's model on the device, a random input, CUDA events (CPU: clock).

    ``engine="cudagraph"`` captures the model once and, per iteration, copies the batch into the
    graph's input and replays it: the same work as deepgap's cudagraph engine, with nothing around it.
    """

    def __init__(
        self,
        model_name: str,
        bs: int,
        device: str = "cuda",
        engine: str = "eager",
        precision: str | None = None,
    ) -> None:
        import torch

        from deepgap.measure.models import resolve_model
        from deepgap.measure.models.build import build_model

        res = resolve_model(model_name).default_resolution
        model, x = build_model(model_name, res), torch.randn(bs, 3, res, res)
        self.bs, self.cuda = bs, device != "cpu"
        if engine in ("compile-freeze", "quant"):  # as deepgap's sweeps run them: channels_last
            x = x.contiguous(memory_format=torch.channels_last)
        if engine == "quant":  # the engine's own captured runner, called directly on a device batch
            from deepgap.measure.quant.prepare import QuantOptions, prepare_quant

            run = prepare_quant(
                model, precision or "int8", bs, res, model_name, device=device, opts=QuantOptions()
            ).run
            x = x.to(device).half()
            self.model, self.step = run, lambda: run(x)
            return
        if self.cuda:  # fp16 on the GPU; fp32 on a CPU: a smoke path for machines without a GPU
            torch.backends.cudnn.benchmark = True
            model, x = model.to(device).half(), x.to(device).half()
        if engine == "compile-freeze":
            model = model.to(memory_format=torch.channels_last)
        self.model, self.step = model, lambda: model(x)  # the graph reads the weights: keep them alive
        if engine == "compile-freeze":
            self._compile_freeze(model, x)
        if engine == "cudagraph":
            static, side = x.clone(), torch.cuda.Stream(device)
            side.wait_stream(torch.cuda.current_stream(device))
            with torch.inference_mode():
                with torch.cuda.stream(side):
                    for _ in range(3):
                        model(static)
                torch.cuda.current_stream(device).wait_stream(side)
                self.graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(self.graph):
                    model(static)

            def step() -> None:
                static.copy_(x)
                self.graph.replay()

            self.step = step

    def _compile_freeze(self, model, x) -> None:
        """torch.compile reduce-overhead with Inductor freezing, compiled (and graphs recorded) here.

        ``torch._dynamo.reset()`` first, as deepgap's engine does per configuration: the bare loop is
        built after deepgap's measurement in the same process and must not share its caches.
        """
        import torch
        import torch._dynamo
        import torch._inductor.config as inductor_config

        torch._dynamo.reset()
        mode = "reduce-overhead" if self.cuda else None  # CUDA graphs need a GPU
        compiled = torch.compile(model, mode=mode, dynamic=False)
        with inductor_config.patch(freezing=True), torch.inference_mode():
            for _ in range(3):  # compile, then CUDA-graph trees warm up and record
                compiled(x)
        self.model, self.step = compiled, lambda: compiled(x)

    def window(self, iterations: int) -> float:
        """Images/s of ``iterations`` back-to-back calls with events (CPU: clock) around them all."""
        import time

        import torch

        step = self.step
        with torch.inference_mode():
            if not self.cuda:
                t0 = time.perf_counter()
                for _ in range(iterations):
                    step()
                return self.bs * iterations / (time.perf_counter() - t0)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            start.record()
            for _ in range(iterations):
                step()
            end.record()
            end.synchronize()
            return self.bs * iterations / (start.elapsed_time(end) * 1e-3)

    def __call__(self, iterations: int, warmup: int) -> float:
        """Images/s = batch / median latency of ``iterations`` synchronized iterations after ``warmup``."""
        import time

        import torch

        times, step = [], self.step
        with torch.inference_mode():
            for _ in range(warmup):
                step()
            if not self.cuda:
                for _ in range(iterations):
                    t0 = time.perf_counter()
                    step()
                    times.append(time.perf_counter() - t0)
                return self.bs / statistics.median(times)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            for _ in range(iterations):
                start.record()
                step()
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end) * 1e-3)
        return self.bs / statistics.median(times)


def _child(conn, model_name, sizes, iterations, interop1, device, warmup, engine):
    try:
        if interop1:  # once per process, before any parallel work (torch refuses it later)
            import torch

            torch.set_num_interop_threads(1)
        got = {bs: BareLoop(model_name, bs, device, engine)(iterations, warmup) for bs in sizes}
        conn.send(("ready", got))
    except BaseException as exc:  # report, never leave the parent waiting
        conn.send(("failed", f"{type(exc).__name__}: {exc}"))


def _paired_child(conn, spec, blocks):
    try:
        from deepgap.core.records import Status
        from deepgap.drive.plan import expand
        from deepgap.drive.runner import SweepRunner
        from deepgap.measure.configuration import measure
        from deepgap.measure.worker import WorkerState

        state = WorkerState(spec.device)  # deepgap's worker set-up (interop threads 1, CUDA context)
        runner = SweepRunner(spec, spec.device)  # for its requests only; its worker is never started
        arms = ("deepgap", "standalone", "deepgap_window", "standalone_window")
        out: dict = {arm: {} for arm in arms}
        for cfg in expand(spec, spec.device):

            def build(cfg=cfg):
                return BareLoop(cfg.model, cfg.batch_size, spec.device, cfg.engine, cfg.precision)

            # compile-freeze: deepgap first (ABBA as BAAB), so the bare loop compiles once per pair of
            # its blocks (each deepgap measurement resets Dynamo, which frees the bare loop's graphs)
            recompiles = cfg.engine == "compile-freeze"
            bare = None if recompiles else build()
            got: dict = {arm: [] for arm in arms}
            for b in range(blocks):
                first = ("deepgap", "standalone") if recompiles else ("standalone", "deepgap")
                for arm in first if b % 2 == 0 else first[::-1]:
                    if arm == "standalone":
                        if bare is None:  # deepgap's compile reset Dynamo's caches: compile afresh
                            bare = build()
                        got[arm].append(bare(spec.iterations, spec.warmup))
                        got["standalone_window"].append(bare.window(spec.iterations))
                        continue
                    if recompiles:
                        bare = None  # deepgap's prepare calls torch._dynamo.reset(): the bare graphs go
                    res = measure(state, runner.request(cfg))
                    if res.status != Status.OK:
                        raise RuntimeError(f"deepgap at bs{cfg.batch_size}: {res.status.value} {res.reason}")
                    got[arm].append(res.throughput_ips)
                    got["deepgap_window"].append(res.throughput_pipelined_ips)
            for arm, values in got.items():
                out[arm][cfg.batch_size] = values
            del bare
        conn.send(("ready", {**out, "device": state.caps.name}))
    except BaseException as exc:  # report, never leave the parent waiting
        conn.send(("failed", f"{type(exc).__name__}: {exc}"))


def in_fresh_process(target, args: tuple, device: str, name: str) -> dict:
    """``target(conn, *args)`` in a fresh spawned process, started as deepgap starts its workers."""
    from deepgap.drive.handle import WorkerHandle

    handle = WorkerHandle(device)
    try:  # a child that dies or hangs raises WorkerLost
        kind, out = handle.spawn(target, args, name, 900)
    finally:
        handle.stop()
    if kind != "ready":
        raise RuntimeError(f"{name} failed: {out}")
    return out


def verdict(low: float, high: float, tol: float = TOLERANCE) -> str:
    """``agree`` (CI inside ±tol), ``differ`` (CI outside), else ``undecided``."""
    if 1 - tol <= low and high <= 1 + tol:
        return "agree"
    if high < 1 - tol or low > 1 + tol:
        return "differ"
    return "undecided"


def cluster_ci(groups: list[np.ndarray], n_resamples: int = 2000, seed: int = 0) -> tuple[float, float]:
    """95% bootstrap CI of the pooled median: resample the groups (rounds), then the values within each."""
    rng = np.random.default_rng(seed)
    meds = [
        np.median(
            np.concatenate(
                [
                    groups[i][rng.integers(len(groups[i]), size=len(groups[i]))]
                    for i in rng.integers(len(groups), size=len(groups))
                ]
            )
        )
        for _ in range(n_resamples)
    ]
    low, high = np.percentile(meds, [2.5, 97.5])
    return float(low), float(high)


def summarize(sizes: list[int], rounds: list[dict], paired: bool = False) -> list[dict]:
    """Per batch: the median ratio deepgap / standalone, its 95% CI and the verdict.

    One ratio per round (fresh processes), or with ``paired`` one per block, pooled over rounds.
    """
    rows = []
    for bs in sizes:
        if paired:
            groups = [np.array(r["deepgap"][bs]) / np.array(r["standalone"][bs]) for r in rounds]
            med, (low, high) = float(np.median(np.concatenate(groups))), cluster_ci(groups)
            arms = {arm: [statistics.median(r[arm][bs]) for r in rounds] for arm in ("standalone", "deepgap")}
        else:
            ratios = np.array([r["deepgap"][bs] / r["standalone"][bs] for r in rounds])
            med, (low, high) = float(np.median(ratios)), bootstrap_ci(ratios)
            arms = {arm: [r[arm][bs] for r in rounds] for arm in ("standalone", "deepgap")}
        rows.append(
            {
                "batch_size": bs,
                "rounds": len(rounds),
                "ratio_median": med,
                "ratio_ci": [low, high],
                "difference_pct": 100 * (med - 1),
                "verdict": verdict(low, high),
                "standalone_ips": arms["standalone"],
                "deepgap_ips": arms["deepgap"],
            }
        )
        if paired:
            rows[-1].update(
                blocks=sum(len(g) for g in groups), round_ratios=[float(np.median(g)) for g in groups]
            )
        if paired and all(r.get("deepgap_window") for r in rounds):  # pipelined: events around N calls
            wg = [np.array(r["deepgap_window"][bs]) / np.array(r["standalone_window"][bs]) for r in rounds]
            wmed, (wlo, whi) = float(np.median(np.concatenate(wg))), cluster_ci(wg)
            rows[-1]["pipelined"] = {
                "ratio_median": wmed,
                "ratio_ci": [wlo, whi],
                "difference_pct": 100 * (wmed - 1),
                "verdict": verdict(wlo, whi),
                **{
                    f"{arm}_ips": [statistics.median(r[f"{arm}_window"][bs]) for r in rounds]
                    for arm in ("standalone", "deepgap")
                },
            }
    return rows


def load_rounds(path: str, settings: dict) -> list[dict]:
    """The rounds of an earlier run in ``path`` (JSON keys back to ints); its settings must match."""
    with open(path) as fh:
        old = json.load(fh)
    differ = {k: (old.get(k), v) for k, v in settings.items() if old.get(k) != v}
    if differ:
        raise SystemExit(
            f"error: {path} was measured with other settings {differ}; use another --out or the same settings"
        )
    return [
        {k: ({int(b): v for b, v in r[k].items()} if isinstance(r[k], dict) else r[k]) for k in r}
        for r in old.get("round_data", [])
    ]


def save(
    path: str,
    settings: dict,
    rounds: list[dict],
    sizes: list[int],
    complete: bool,
    default_threads: dict | None,
    device_name: str,
) -> None:
    """Write everything measured so far (atomically: a kill mid-write leaves the previous file)."""
    tmp = path + ".tmp"
    with open(tmp, "w") as fh:
        json.dump(
            {
                **settings,
                "rounds": len(rounds),
                "complete": complete,
                "tolerance": TOLERANCE,
                "rows": summarize(sizes, rounds, "blocks" in settings) if rounds else [],
                "round_data": rounds,
                "default_threads_loop_ips": default_threads,
                "env": device_name,
            },
            fh,
            indent=1,
        )
    os.replace(tmp, path)


def print_table(rows: list[dict], default_threads: dict | None) -> None:
    """The summary: per batch the arms' median images/s, the ratio, its CI and the verdict."""
    extra = f" {'default-threads loop':>21}" if default_threads else ""
    print(
        f"{'batch':>6} {'standalone img/s':>17} {'deepgap img/s':>14} {'ratio':>7} {'95% CI':>17} "
        f"{'verdict (±2%)':>14}{extra}"
    )
    for row in rows:
        lo, hi = row["ratio_ci"]
        extra = f" {default_threads[row['batch_size']]:>21,.1f}" if default_threads else ""
        print(
            f"{row['batch_size']:>6} {statistics.median(row['standalone_ips']):>17,.1f} "
            f"{statistics.median(row['deepgap_ips']):>14,.1f} {row['ratio_median']:>7.4f} "
            f"{f'[{lo:.4f}, {hi:.4f}]':>17} {row['verdict']:>14}{extra}"
        )
    for row in rows:
        if "pipelined" in row:  # events around N back-to-back calls (deepgap's throughput_pipelined_ips)
            w = row["pipelined"]
            lo, hi = w["ratio_ci"]
            print(
                f"{row['batch_size']:>6} {statistics.median(w['standalone_ips']):>17,.1f} "
                f"{statistics.median(w['deepgap_ips']):>14,.1f} {w['ratio_median']:>7.4f} "
                f"{f'[{lo:.4f}, {hi:.4f}]':>17} {w['verdict']:>14}  pipelined"
            )


ENGINES = ("eager", "cudagraph", "compile-freeze", "quant")
GPU_ONLY = ("cudagraph", "quant")


def resolve(engine: str, device: str, precision: str | None, paired: bool) -> tuple[str, str]:
    """(precision, file suffix) for the options; ValueError names a combination that cannot run."""
    cpu = not device.startswith("cuda")
    if engine in GPU_ONLY and cpu:
        raise ValueError(f"--engine {engine} needs a CUDA device (--device cuda)")
    if engine in ("compile-freeze", "quant") and not paired:
        raise ValueError(f"--engine {engine} runs in the paired design only (add --mode paired)")
    allowed = ("int8", "fp8") if engine == "quant" else ("fp32",) if cpu else ("fp16",)
    precision = precision or allowed[0]
    if precision not in allowed:
        raise ValueError(
            f"--engine {engine} on {device} takes --precision {' or '.join(allowed)}, not {precision}"
        )
    suffix = ("_paired" if paired else "") + ("" if engine == "eager" else f"_{engine}")
    return precision, suffix + (f"-{precision}" if engine == "quant" else "")


def main() -> None:  # noqa: D103
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="resnet50")
    ap.add_argument("--batch-sizes", default="1,32,256")
    ap.add_argument("--rounds", type=int, default=6, help="rounds to run now")
    ap.add_argument("--iterations", type=int, default=100)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--device", default="cuda", help="cuda (the real check) or cpu (a smoke test, fp32)")
    ap.add_argument(
        "--mode",
        choices=("processes", "paired"),
        default="processes",
        help="processes: each arm in its own fresh process per round; paired: both arms "
        "alternate inside one fresh process per round",
    )
    ap.add_argument("--blocks", type=int, default=6, help="paired: ABBA blocks per round")
    ap.add_argument(
        "--engine",
        choices=ENGINES,
        default="eager",
        help="cudagraph: deepgap's cudagraph engine vs a bare capture-and-replay loop (GPU); "
        "compile-freeze: vs torch.compile reduce-overhead + freezing; quant: vs the quant "
        "engine's captured runner (GPU only; --precision int8 or fp8)",
    )
    ap.add_argument(
        "--precision",
        default=None,
        help="default fp16 (fp32 on a CPU); int8 for --engine quant, which also takes fp8",
    )
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument(
        "--continue",
        dest="cont",
        action="store_true",
        help="add the rounds to those already in OUT/harness_overhead[_paired][_cudagraph].json",
    )
    args = ap.parse_args()
    try:
        precision, suffix = resolve(args.engine, args.device, args.precision, args.mode == "paired")
    except ValueError as exc:
        ap.error(str(exc))
    sizes = [int(b) for b in args.batch_sizes.split(",")]
    settings = {
        "model": args.model,
        "precision": precision,
        "iterations": args.iterations,
        "batch_sizes": sizes,
    }
    paired = args.mode == "paired"
    if paired:
        settings.update(mode="paired", blocks=args.blocks)
    if args.engine != "eager":  # absent means eager (the files measured before the option existed)
        settings["engine"] = args.engine
    if args.engine == "quant" or args.precision:
        settings["precision"] = precision
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, f"harness_overhead{suffix}.json")
    rounds = load_rounds(path, settings) if args.cont and os.path.exists(path) else []
    fmt = ("channels_last",) if args.engine in ("compile-freeze", "quant") else ("nchw",)
    spec = SweepSpec(
        models=(args.model,),
        precisions=(precision,),
        batch_sizes=tuple(sizes),
        memory_formats=fmt,
        engines=(args.engine,),
        device=args.device,
        warmup=args.warmup,
        iterations=args.iterations,
        repeats=1,
        idle_s=0.0,
    )
    store = "" if paired else os.path.join(tempfile.mkdtemp(), "overhead.sqlite")  # deepgap.run's, per round
    device_name = args.device

    def bare(interop1: bool = True) -> dict[int, float]:
        child_args = (args.model, sizes, args.iterations, interop1, args.device, args.warmup, args.engine)
        return in_fresh_process(_child, child_args, args.device, "deepgap-standalone-loop")

    def harness() -> dict[int, float]:
        nonlocal device_name
        res = deepgap.run(spec, store=store, on_event=lambda e: None)
        device_name = str(res.to_pandas()["device_name"].iloc[0])
        return {r.spec.batch_size: r.throughput_ips for r in res.results}

    total = len(rounds) + args.rounds
    for i in range(len(rounds), total):
        if paired:
            got = in_fresh_process(_paired_child, (spec, args.blocks), args.device, "deepgap-paired-round")
            device_name = got.pop("device")
            ratios = {bs: np.array(got["deepgap"][bs]) / np.array(got["standalone"][bs]) for bs in sizes}
            cells = ", ".join(
                f"bs{bs} {np.median(r):.3f} [{r.min():.3f}..{r.max():.3f}]" for bs, r in ratios.items()
            )
            label = f"{args.blocks} blocks, median ratio [range]"
        else:
            order = ("standalone", "deepgap") if i % 2 == 0 else ("deepgap", "standalone")
            got = {name: (bare() if name == "standalone" else harness()) for name in order}
            got["order"] = label = " then ".join(order)
            d, a = got["deepgap"], got["standalone"]
            cells = ", ".join(f"bs{bs} {d[bs]:,.1f}/{a[bs]:,.1f} = {d[bs] / a[bs]:.3f}" for bs in sizes)
        rounds.append(got)
        save(path, settings, rounds, sizes, False, None, device_name)
        print(f"round {i + 1}/{total} ({label}): {cells}", flush=True)
    default_threads = None if paired else bare(interop1=False)
    print_table(summarize(sizes, rounds, paired), default_threads)
    save(path, settings, rounds, sizes, True, default_threads, device_name)


if __name__ == "__main__":
    main()
