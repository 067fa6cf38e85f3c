"""The decoders and fused image recipes that :mod:`fpipe.image` exports: decoding whole or at
the scale a box needs (with the error for bytes that are not an image), crop boxes drawn as
torchvision draws them, antialiased resizing with torch's kernel or Pillow's, and batch
normalisation. Nothing here imports Pillow or torch at module level."""

__all__: list[str] = []
