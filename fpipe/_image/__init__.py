"""The fused image recipes that :mod:`fpipe.image` exports: crop boxes drawn as torchvision
draws them, JPEG decoding at the scale a box needs, antialiased resizing with torch's kernel or
Pillow's, and batch normalisation. Nothing here imports Pillow or torch at module level."""

__all__: list[str] = []
