"""Accuracy mode: top-1/top-5 on the user's labelled images, and quantization calibrated on them.

`dataset` reads and splits the labelled set (parent side, cheap checks only); `evaluate` decodes it
in the worker and scores each configuration. The flag logic lives in `deepgap.analysis.accuracy`.
"""
