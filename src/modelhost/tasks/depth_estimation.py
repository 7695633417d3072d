"""Depth estimation on transformers' `depth-estimation` pipeline: per image, the depth map as a grey PNG
of the image's size and, unless left out, the model's depth values resized to it. One call per batch."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from modelhost.engines import loader
from modelhost.tasks.image_batches import every_picture, image_warmup_item, spread_results
from modelhost.tasks.outputs import png_base64


class DepthEstimation:
    def load(self, model_dir: Path, device: str) -> Any:
        return loader.load_pipeline("depth-estimation", model_dir, device)

    def warmup_item(self) -> dict[str, Any]:
        return image_warmup_item(return_predicted_depth=False)

    def run(self, model: Any, batch: list[dict[str, Any]]) -> list[dict[str, Any]]:
        outputs, decoded, pictures = every_picture(batch)
        if not pictures:
            return outputs
        ready = list(decoded)
        results = model(pictures, batch_size=len(pictures))
        results = results if isinstance(results, list) else [results]
        wanted = [batch[i].get("return_predicted_depth", True) for i in ready for _ in decoded[i]]
        shaped = [
            {
                "depth": png_base64(result["depth"]),
                "predicted_depth": result["predicted_depth"].float().cpu().tolist() if want else None,
            }
            for result, want in zip(results, wanted, strict=True)
        ]
        spread_results(shaped, ready, decoded, outputs)
        return outputs
