"""Video classification (t10): a tiny VideoMAE over 4 frames of 32 x 32.

Only an *image* processor is saved: VideoMAE's video processor needs torchvision, which is not installed,
so the pipeline decodes the file with PyAV and samples `num_frames` frames itself.
"""

from __future__ import annotations

from pathlib import Path

from transformers import VideoMAEConfig, VideoMAEForVideoClassification, VideoMAEImageProcessorPil

from tests.tiny_models.common import label_maps, reseed, save

ACTION_LABELS: tuple[str, ...] = ("walking", "running", "jumping")
FRAMES = 4  # a clip is 4 frames, in tubelets of 2: any other frame count is refused


def build_video_classification(folder: Path) -> None:
    """t10: mean-pooled VideoMAE over `ACTION_LABELS`; frames resized to 32 and centre-cropped."""
    reseed()
    config = VideoMAEConfig(
        image_size=32,
        patch_size=8,
        num_channels=3,
        num_frames=FRAMES,
        tubelet_size=2,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=37,
        use_mean_pooling=True,
        **label_maps(ACTION_LABELS),
    )
    frames = VideoMAEImageProcessorPil(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32})
    save(folder, VideoMAEForVideoClassification(config), frames)
