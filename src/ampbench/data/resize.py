"""Images to one square size (``data.image_size``), once, when the data set is prepared.

A user's ImageFolder may hold images of any size and aspect; training wants one tensor of
(N, 3, S, S) uint8 images. Each image is resized to S x S (bilinear, antialiased; the aspect is
not kept: a centre crop would drop what a class may be about at the edges). Done at download, so
no stage pays for it per epoch, and the prepared file's images are what the model sees.
"""

from __future__ import annotations

import torch


def square(images: torch.Tensor, size: int, chunk: int = 1024) -> torch.Tensor:
    """uint8 images (3, H, W) or (N, 3, H, W) resized to size x size; unchanged if already so."""
    if tuple(images.shape[-2:]) == (size, size):
        return images
    from torchvision.transforms.v2 import functional

    if images.dim() == 3:
        return functional.resize(images, [size, size], antialias=True)
    return torch.cat([functional.resize(p, [size, size], antialias=True) for p in images.split(chunk)])
