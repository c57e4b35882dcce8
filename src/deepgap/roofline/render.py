"""Write a store's roofline figures (PNG) and tables (CSV): ``python -m deepgap.roofline.render STORE DIR``.

For looking at a GPU run's roofline output without the HTML report; the report calls the functions of
`deepgap.roofline.figures` itself.
"""

from __future__ import annotations

import os
import sys

from deepgap.roofline import model as rm
from deepgap.roofline.figures import Frames, cluster_roofline_figure, roofline_figure
from deepgap.roofline.figures_paper import (
    paper_reference_table,
    paper_roofline_figure,
    theoretical_vs_measured,
)


def render_all(store_path: str, out_dir: str) -> list[str]:
    """Write every roofline figure (PNG) and table (CSV) of a store into ``out_dir``; returns the paths."""
    from deepgap.roofline import storage
    from deepgap.roofline.trace import cluster_table
    from deepgap.store import Store

    os.makedirs(out_dir, exist_ok=True)
    store = Store(store_path, readonly=True)
    try:
        results = store.results_frame()
        peaks = storage.peaks_frame(store)
        profiles = storage.profiles_frame(store)
        kernels = storage.kernels_frame(store)
    finally:
        store.close()
    paths = []

    def save_fig(fig, name):
        p = os.path.join(out_dir, name)
        fig.savefig(p, dpi=130)
        paths.append(p)

    def save_csv(df, name):
        p = os.path.join(out_dir, name)
        df.to_csv(p, index=False)
        paths.append(p)

    clusters = Frames(peaks=peaks, profiles=profiles, kernels=kernels)
    infer_profiles = profiles[profiles["mode"] == "infer"] if len(profiles) else profiles
    train_profiles = profiles[profiles["mode"] == "train"] if len(profiles) else profiles
    save_fig(
        roofline_figure(Frames(results, peaks, infer_profiles), title="Inference roofline"),
        "roofline_inference.png",
    )
    save_fig(
        roofline_figure(Frames(None, peaks, train_profiles), title="Training-step roofline"),
        "roofline_train.png",
    )
    save_fig(cluster_roofline_figure(clusters, source="torch"), "clusters_torch.png")
    save_fig(cluster_roofline_figure(clusters, source="ncu"), "clusters_ncu.png")
    save_fig(paper_roofline_figure(), "paper_roofline.png")
    save_csv(theoretical_vs_measured(profiles, results, peaks), "theoretical_vs_measured.csv")
    save_csv(peaks.drop(columns=["details"], errors="ignore"), "peaks.csv")
    save_csv(profiles.drop(columns=["step_times", "cost", "ncu", "extra"], errors="ignore"), "profiles.csv")
    save_csv(kernels.drop(columns=["metrics"], errors="ignore"), "kernels.csv")
    if len(kernels):
        parts = [
            cluster_table(g).assign(profile_id=pid, source=src)
            for (pid, src), g in kernels.groupby(["profile_id", "source"])
        ]
        import pandas as pd

        save_csv(pd.concat(parts, ignore_index=True), "clusters.csv")
    save_csv(paper_reference_table(), "paper_reference.csv")
    if len(results):
        save_csv(
            rm.add_roofline_columns(results[results["status"] == "ok"], peaks).drop(columns=["extra"]),
            "results_roofline.csv",
        )
    return paths


if __name__ == "__main__":
    if len(sys.argv) != 3:
        print("usage: python -m deepgap.roofline.render STORE OUT_DIR", file=sys.stderr)
        sys.exit(2)
    for path in render_all(sys.argv[1], sys.argv[2]):
        print(path)
