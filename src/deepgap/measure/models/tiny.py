"""A tiny CNN (conv-BN-ReLU, residual add, pooling, linear) for tests and CI-sized sweeps."""

from __future__ import annotations

from deepgap.measure.models.registry import MODELS, ModelEntry


def build_tinycnn(resolution: int):
    """Five layers, ~20k parameters: milliseconds per batch on a CPU, same op mix as a ResNet."""
    from torch import nn

    class TinyCNN(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.stem = nn.Sequential(
                nn.Conv2d(3, 16, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(16)
            )
            self.body = nn.Sequential(
                nn.Conv2d(16, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU(inplace=True)
            )
            self.head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 10))
            self.relu = nn.ReLU(inplace=True)

        def forward(self, x):
            y = self.relu(self.stem(x))
            return self.head(self.relu(y + self.body(y)))

    return TinyCNN()


MODELS.add(
    "tinycnn",
    ModelEntry(
        build=build_tinycnn,
        family="test",
        default_resolution=32,
        description="tiny CNN for tests",
        num_classes=10,
    ),
)
