"""A decode store whose configurations differ only by their KV cache's format, through `Store.record`.

Why: the views must tell an fp8-cache row from one in the decoder's own dtype (same model, engine,
precision, batch and lengths); each row's TPOT is constant (`fixtures_decode.decode_result`), the fp8
cache's faster, so a view that pooled the two would show a number neither row has.
"""

from __future__ import annotations

from fixtures_decode import GPU, decode_result

from deepgap.core.records import ConfigSpec
from deepgap.store import Store

MODEL = "llama-3.1-8b"
# (engine, precision, batch, KV cache, TPOT ms)
KV_ROWS = [
    ("eager", "bf16", 8, None, 4.0),
    ("eager", "bf16", 8, "fp8", 3.2),
]


def kv_spec(engine: str, prec: str, bs: int, kv: str | None, sweep: int = 0) -> ConfigSpec:
    """A decode configuration of `MODEL` on the GPU at 128/128 tokens, its cache in ``kv``'s format."""
    return ConfigSpec(MODEL, engine, prec, bs, "cuda:0", resolution=128, sweep=sweep, input_len=128,
                      output_len=128, kv_cache=kv)  # fmt: skip


def write_kv_store(path: str, rows=KV_ROWS, slower: float = 1.0, sweeps: int = 1) -> str:
    """The store of ``rows`` at ``path`` (each TPOT × ``slower``, measured in ``sweeps`` passes); its run id."""
    store = Store(path)
    try:
        env = {"device_name": GPU, "device": "cuda", "gpu_name": GPU, "host": "fixture-host"}
        run = store.begin_run({"workload": "decode", "device": "cuda"}, "deepgap run (fixture)", env, "0.1.0")
        for sweep in range(sweeps):
            for engine, prec, bs, kv, tpot in rows:
                store.record(run, decode_result(kv_spec(engine, prec, bs, kv, sweep), tpot * slower, 0.1))
        store.finish_run(run)
        return run
    finally:
        store.close()
