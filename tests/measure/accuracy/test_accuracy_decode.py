"""Accuracy mode's decoding: threads give the serial result, also inside a daemonic worker process.

The measuring worker is daemonic; a DataLoader with worker processes there fails ("daemonic processes
are not allowed to have children"), which lost every accuracy figure of a 1,200-image run on the GPU.
"""

from __future__ import annotations

import multiprocessing

import numpy as np
import torch


def decode(*args, **kwargs):
    """`deepgap.measure.accuracy.evaluate.decode`, imported on use: the module imports torchvision's
    transforms (~3 CPU-s), which every xdist worker paid at collection although one runs this file."""
    from deepgap.measure.accuracy.evaluate import decode

    return decode(*args, **kwargs)


def workers(*args, **kwargs):
    """`deepgap.measure.accuracy.evaluate.workers`, imported on use (see `decode`)."""
    from deepgap.measure.accuracy.evaluate import workers

    return workers(*args, **kwargs)


def _images(root, n=6):
    from PIL import Image

    rng = np.random.default_rng(0)
    items = []
    for i in range(n):
        path = root / f"{i}.png"
        Image.fromarray(rng.integers(0, 256, (40, 50, 3), dtype=np.uint8)).save(path)
        items.append((str(path), i % 3))
    return items


def _in_daemon(items, q):
    x, y = decode(items, 32, num_workers=2)
    q.put((x.numpy(), y.numpy()))


def test_threads_decode_what_serial_decoding_does_in_order(tmp_path):
    items = _images(tmp_path)
    x0, y0 = decode(items, 32)
    x2, y2 = decode(items, 32, num_workers=3)
    assert x0.shape == (6, 3, 32, 32) and x0.dtype == torch.uint8 and y0.tolist() == [0, 1, 2, 0, 1, 2]
    assert torch.equal(x0, x2) and torch.equal(y0, y2)
    xe, ye = decode([], 32, num_workers=2)
    assert xe.shape == (0, 3, 32, 32) and ye.shape == (0,)


def test_decoding_with_workers_works_inside_a_daemonic_process(tmp_path):
    items = _images(tmp_path)
    ctx = multiprocessing.get_context("fork")
    q = ctx.Queue()
    p = ctx.Process(target=_in_daemon, args=(items, q), daemon=True)
    p.start()
    x, y = q.get(timeout=60)
    p.join(30)
    assert p.exitcode == 0
    assert np.array_equal(x, decode(items, 32)[0].numpy()) and y.tolist() == [0, 1, 2, 0, 1, 2]


def test_default_thread_count():
    assert workers({"dataset_workers": 3}, 10) == 3
    assert workers({}, 999) == 0
    big = workers({}, 50_000)
    assert big == 0 or 2 <= big <= 8  # 0 only on a host of ≤ 4 cores
