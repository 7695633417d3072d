"""A chat with images made ready for an engine: the prompt's text and its decoded images.

Both engines start a vision-language request here, so that the same messages give the same prompt and
the same 400 on each: the artifact's processor renders the chat template (every image part a
placeholder the model's processor expands), and each image is decoded under the operator's pixel
limit. What follows differs: modelhost's engine runs the processor itself (image tokens and tensors,
`tasks.text_generation`); vLLM takes the prompt's token IDs and the images and runs its own copy of the
processor (`engines.vllm`). PIL is all this imports, so vLLM's environment runs it too.
"""

from __future__ import annotations

from typing import Any

from PIL import Image

from modelhost.config import get_settings
from modelhost.errors import InvalidRequest, ModelhostError
from modelhost.generation import chat_templates
from modelhost.generation.contract import GenerationRequest
from modelhost.media.image import decode_image


def chat_with_images(
    processor: Any | None,
    request: GenerationRequest,
    template_kwargs: dict[str, Any],
    max_chars: int | None = None,
) -> tuple[str, list[Image.Image]]:
    """The chat's text (the processor's template, with an image placeholder per image, and
    `template_kwargs`: `generation.requests.template_kwargs`, rendered in the budgeted sandbox with
    `max_chars`: `chat_templates.output_cap`) and its images, in order. InvalidRequest (400) for a
    text-only model, an unreadable or too large image, messages the template refuses, or a render past
    its bounds (naming `chat_template`)."""
    if processor is None:
        raise InvalidRequest(
            "This model reads text only: image_url parts need a deployment of an image-text-to-text "
            "(vision-language) model.",
            param="messages",
        )
    max_pixels = get_settings().media_max_pixels
    params = request.image_params or ["messages"] * len(request.images)
    pictures = [
        decode_image(data, max_pixels=max_pixels, param=param)
        for data, param in zip(request.images, params, strict=True)
    ]
    chat_templates.install()
    try:
        with chat_templates.limits(max_chars=max_chars):
            text = processor.apply_chat_template(
                request.messages,
                tools=request.tools,
                add_generation_prompt=True,
                tokenize=False,
                **template_kwargs,
            )
    except ModelhostError:  # a bound of the render, or its caller gone
        raise
    except Exception as exc:  # the template's own checks (roles, alternation) raise here
        raise InvalidRequest(f"The model's processor refused the messages: {exc}", param="messages") from None
    return str(text), pictures
