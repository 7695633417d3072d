"""What the image task handlers share: decode a batch's images (a bad image fails only its item),
the warm-up item, and handing each item its slice of a group's results."""

from __future__ import annotations

from typing import Any

from modelhost.tasks import media_items
from modelhost.tasks.media_items import ItemError
from modelhost.tasks.outputs import plain


def decoded_images(
    batch: list[dict[str, Any]], outputs: list[dict[str, Any]], name: str = "inputs"
) -> dict[int, Any]:
    """Index → decoded images, for the items whose images decode; the others get their error."""
    decoded: dict[int, Any] = {}
    for i, item in enumerate(batch):
        try:
            decoded[i] = media_items.images(item, name=name)
        except ItemError as exc:
            outputs[i] = exc.output
    return decoded


def image_warmup_item(**options: Any) -> dict[str, Any]:
    return {"images": [media_items.warmup_png()], "limits": media_items.WARMUP_LIMITS, **options}


def spread_results(
    results: list[Any], indices: list[int], decoded: dict[int, Any], outputs: list[dict[str, Any]]
) -> None:
    """Give each item its slice of a group's results (one result per image)."""
    start = 0
    for i in indices:
        count = len(decoded[i])
        outputs[i] = {"results": plain(results[start : start + count])}
        start += count


def every_picture(batch: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], dict[int, Any], list[Any]]:
    """For handlers that make one model call over the whole batch: the outputs (items whose images did
    not decode hold their error), index → decoded images, and every decoded picture in order."""
    outputs: list[dict[str, Any]] = [{} for _ in batch]
    decoded = decoded_images(batch, outputs)
    return outputs, decoded, [picture for pictures in decoded.values() for picture in pictures]
