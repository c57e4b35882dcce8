"""torchvision models of the paper (ResNets) and the families its referees asked for."""

from __future__ import annotations

from deepgap.measure.models.registry import MODELS, ModelEntry

_TORCHVISION = {
    "resnet18": ("resnet", "ResNet-18, 1.8 GMAC at 224² (as in the paper)"),
    "resnet50": ("resnet", "ResNet-50, 4.1 GMAC at 224² (as in the paper)"),
    "resnet101": ("resnet", "ResNet-101, 7.8 GMAC at 224² (as in the paper)"),
    "resnet152": ("resnet", "ResNet-152, 11.5 GMAC at 224²"),
    "mobilenet_v3_large": ("mobilenet", "MobileNetV3-Large, depthwise convolutions, 0.22 GMAC"),
    "efficientnet_b0": ("efficientnet", "EfficientNet-B0, depthwise + squeeze-excite, 0.39 GMAC"),
    "convnext_tiny": ("convnext", "ConvNeXt-Tiny, 7×7 depthwise + LayerNorm, 4.5 GMAC"),
    "vit_b_16": ("vit", "ViT-B/16 vision transformer, 17.6 GMAC at 224²"),
    "regnet_y_400mf": ("regnet", "RegNetY-400MF, grouped convolutions"),
}


def _builder(name: str):
    def build(resolution: int):
        from torchvision import models

        kwargs = {"image_size": resolution} if name.startswith("vit") else {}
        return models.get_model(name, weights=None, **kwargs)

    return build


for _name, (_family, _desc) in _TORCHVISION.items():
    MODELS.add(_name, ModelEntry(build=_builder(_name), family=_family, description=_desc))
