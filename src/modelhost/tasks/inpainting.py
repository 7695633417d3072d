"""Inpainting (OpenAI's `/v1/images/edits` with a mask): the image-to-image handler with the inpainting
pipeline of the same diffusers family."""

from __future__ import annotations

from modelhost.tasks.image_to_image import ImageToImage


class Inpainting(ImageToImage):
    """`inpainting` deployments: the gateway refuses an edit without a mask before it comes here."""

    task = "inpainting"
