"""Vision models: CLIP for zero-shot image classification (t04), ViT for image feature extraction (t05),
and three segmenters (t06): SegFormer (semantic), Mask2Former and DETR (panoptic / instance / semantic).

Images are 32 px for the classifiers and 64-96 px for the segmenters (their backbones downsample 32x).
torchvision is not installed (its wheels do not import beside torch 2.13+cpu), so every processor is the
PIL-backed ``*ImageProcessorPil`` class, which transformers would fall back to anyway.
"""

from __future__ import annotations

from pathlib import Path

from transformers import (
    CLIPConfig,
    CLIPImageProcessorPil,
    CLIPModel,
    CLIPProcessor,
    DetrConfig,
    DetrForObjectDetection,
    DetrForSegmentation,
    DetrImageProcessorPil,
    DPTConfig,
    DPTForDepthEstimation,
    DPTImageProcessorPil,
    Mask2FormerConfig,
    Mask2FormerForUniversalSegmentation,
    Mask2FormerImageProcessorPil,
    ResNetConfig,
    SegformerConfig,
    SegformerForSemanticSegmentation,
    SegformerImageProcessorPil,
    SwinConfig,
    ViTConfig,
    ViTForImageClassification,
    ViTImageProcessorPil,
    ViTModel,
)

from tests.tiny_models.common import label_maps, reseed, save
from tests.tiny_models.vocab import clip_tokenizer

SEGMENT_LABELS: tuple[str, ...] = ("background", "cat", "dog")
IMAGE_LABELS: tuple[str, ...] = ("cat", "dog", "bird")
# Segmentation processors resize the shorter edge to 64 (the longer one at most to 96).
SEGMENT_SIZE = {"shortest_edge": 64, "longest_edge": 96}
FOUR_STAGES = ["stage1", "stage2", "stage3", "stage4"]


def clip_image_processor() -> CLIPImageProcessorPil:
    """Resize the short edge to 32, then centre-crop 32 x 32 (CLIP's recipe, at 32 px)."""
    return CLIPImageProcessorPil(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32})


def vit_config() -> ViTConfig:
    """32 px images in 8 px patches (16 patches + CLS), width 32: also the ViT-GPT2 captioner's encoder."""
    return ViTConfig(
        image_size=32,
        patch_size=8,
        num_channels=3,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=37,
    )


def detr_config(labels: dict[str, object]) -> DetrConfig:
    """DETR on transformers' own ResNet (no timm), its stem at the default width (64); the mask head
    needs (d_model + heads) % 8 == 0: 32 + 8. Five queries: at most five segments or boxes."""
    resnet = ResNetConfig(
        num_channels=3,
        hidden_sizes=[8, 16, 24, 32],
        depths=[1, 1, 1, 1],
        hidden_act="relu",
        out_features=FOUR_STAGES,
    )
    return DetrConfig(
        backbone_config=resnet,
        d_model=32,
        encoder_layers=1,
        decoder_layers=1,
        encoder_attention_heads=8,
        decoder_attention_heads=8,
        encoder_ffn_dim=32,
        decoder_ffn_dim=32,
        num_queries=5,
        **labels,
    )


def build_zero_shot_image_classification(folder: Path) -> None:
    """t04: CLIP with 32-wide text and vision towers projected to 16, and its processor (image processor
    + the offline CLIP tokenizer)."""
    reseed()
    tokenizer = clip_tokenizer(32)
    text_tower = {
        "vocab_size": len(tokenizer),
        "hidden_size": 32,
        "intermediate_size": 37,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "max_position_embeddings": 32,
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
    }
    vision_tower = {
        "image_size": 32,
        "patch_size": 8,
        "hidden_size": 32,
        "intermediate_size": 37,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
    }
    model = CLIPModel(CLIPConfig(text_config=text_tower, vision_config=vision_tower, projection_dim=16))
    save(folder, model, CLIPProcessor(image_processor=clip_image_processor(), tokenizer=tokenizer))


def build_image_feature_extraction(folder: Path) -> None:
    """t05: ViTModel (with its pooler); images are resized to 32 x 32, so one vector has 32 numbers."""
    reseed()
    save(folder, ViTModel(vit_config()), ViTImageProcessorPil(size={"height": 32, "width": 32}))


def build_image_segmentation(folder: Path) -> None:
    """t06: ``segformer``, ``mask2former`` and ``detr``, all labelled background / cat / dog.

    Built in that order after one seed. With random weights every segment scores low: the tests pass
    zero thresholds to get segments back.
    """
    reseed()
    labels = label_maps(SEGMENT_LABELS)

    segformer = SegformerConfig(
        num_channels=3,
        num_encoder_blocks=2,
        depths=[1, 1],
        sr_ratios=[2, 1],
        hidden_sizes=[8, 16],
        patch_sizes=[7, 3],
        strides=[4, 2],
        num_attention_heads=[1, 2],
        mlp_ratios=[2, 2],
        decoder_hidden_size=16,
        **labels,
    )
    save(
        folder / "segformer",
        SegformerForSemanticSegmentation(segformer),
        SegformerImageProcessorPil(size={"height": 32, "width": 32}),
    )

    # A four-stage Swin of width 16; the pixel decoder's GroupNorm(32) needs widths that are multiples of 32.
    swin = SwinConfig(
        image_size=64,
        patch_size=4,
        embed_dim=16,
        depths=[1, 1, 1, 1],
        num_heads=[1, 1, 1, 1],
        window_size=2,
        out_features=FOUR_STAGES,
    )
    mask2former = Mask2FormerConfig(
        backbone_config=swin,
        feature_size=32,
        mask_feature_size=32,
        hidden_dim=32,
        encoder_feedforward_dim=32,
        dim_feedforward=32,
        encoder_layers=1,
        decoder_layers=2,
        num_attention_heads=2,
        num_queries=5,
        **labels,
    )
    save(
        folder / "mask2former",
        Mask2FormerForUniversalSegmentation(mask2former),
        Mask2FormerImageProcessorPil(size=SEGMENT_SIZE, num_labels=len(SEGMENT_LABELS), ignore_index=255),
    )

    detr = detr_config(labels)
    save(
        folder / "detr",
        DetrForSegmentation(detr),
        DetrImageProcessorPil(format="coco_panoptic", size=SEGMENT_SIZE),
    )


def build_image_classification(folder: Path) -> None:
    """t18: a ViT classifier over cat / dog / bird at 32 x 32."""
    reseed()
    config = vit_config()
    for key, value in label_maps(IMAGE_LABELS).items():
        setattr(config, key, value)
    save(folder, ViTForImageClassification(config), ViTImageProcessorPil(size={"height": 32, "width": 32}))


def build_object_detection(folder: Path) -> None:
    """t19: the segmentation DETR's shape as a detector (boxes instead of masks), labelled cat / dog / bird.
    With random weights every box scores low: the tests pass `threshold: 0`."""
    reseed()
    model = DetrForObjectDetection(detr_config(label_maps(IMAGE_LABELS)))
    save(folder, model, DetrImageProcessorPil(format="coco_detection", size=SEGMENT_SIZE))


def build_depth_estimation(folder: Path) -> None:
    """t20: a DPT of width 32 over 32 x 32 images in 8 px patches, its four reassembled stages at widths
    8 to 32; the pipeline resizes its depth map to the image's size."""
    reseed()
    config = DPTConfig(
        hidden_size=32,
        num_hidden_layers=4,
        num_attention_heads=2,
        intermediate_size=37,
        image_size=32,
        patch_size=8,
        neck_hidden_sizes=[8, 16, 24, 32],
        fusion_hidden_size=16,
        backbone_out_indices=[0, 1, 2, 3],
    )
    processor = DPTImageProcessorPil(size={"height": 32, "width": 32}, keep_aspect_ratio=False)
    save(folder, DPTForDepthEstimation(config), processor)
