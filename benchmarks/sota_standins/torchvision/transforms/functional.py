"""``resize`` and ``InterpolationMode`` as TorchRL's ``Resize`` uses them (see the package docstring)."""
from enum import Enum

import torch
from torch.nn import functional


class InterpolationMode(Enum):
    NEAREST = "nearest"
    BILINEAR = "bilinear"
    BICUBIC = "bicubic"


def resize(image: torch.Tensor, size, interpolation=InterpolationMode.BILINEAR, antialias=True) -> torch.Tensor:
    """``image`` ``[..., C, H, W]`` resized to ``size`` ``[h, w]``."""
    mode = InterpolationMode(interpolation).value
    batch = image.shape[:-3]
    flat = image.reshape(-1, *image.shape[-3:])
    dtype = flat.dtype
    out = functional.interpolate(flat.float(), size=list(size), mode=mode,
                                 antialias=bool(antialias) and mode != "nearest",
                                 align_corners=False if mode != "nearest" else None)
    return out.to(dtype).reshape(*batch, *out.shape[-3:])
