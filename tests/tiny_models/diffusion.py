"""diffusers pipelines: Stable Diffusion (t13: one folder serves text-to-image, image-to-image and
inpainting) and text-to-video (t14: ``text_to_video_sd``, a UNet3D pipeline, and ``wan``, Wan 2.1).

Component sizes follow diffusers' own fast tests (the smallest that run); the text encoders' tokenizers
are built offline (`vocab`) instead of being downloaded from ``hf-internal-testing``. Within a pipeline
the components are created in a fixed order after the seed (the order fixes which random numbers each
one gets).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from diffusers import (
    AutoencoderKL,
    AutoencoderKLWan,
    DDIMScheduler,
    FlowMatchEulerDiscreteScheduler,
    StableDiffusionPipeline,
    TextToVideoSDPipeline,
    UNet2DConditionModel,
    UNet3DConditionModel,
    WanPipeline,
    WanTransformer3DModel,
)
from transformers import CLIPTextConfig, CLIPTextModel, CLIPTokenizer, UMT5Config, UMT5EncoderModel

from tests.tiny_models.common import reseed
from tests.tiny_models.vocab import clip_tokenizer, t5_tokenizer

PROMPT_TOKENS = 16  # the CLIP text encoders' context


def ddim_scheduler() -> DDIMScheduler:
    """Stable Diffusion's scaled-linear DDIM schedule."""
    return DDIMScheduler(
        beta_start=0.00085,
        beta_end=0.012,
        beta_schedule="scaled_linear",
        clip_sample=False,
        set_alpha_to_one=False,
        steps_offset=1,
    )


def clip_text_encoder(
    tokenizer: CLIPTokenizer, width: int, mlp: int, heads: int, **extra: Any
) -> CLIPTextModel:
    """A two-layer CLIP text encoder over `tokenizer`, `PROMPT_TOKENS` positions."""
    config = CLIPTextConfig(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        hidden_size=width,
        intermediate_size=mlp,
        layer_norm_eps=1e-05,
        num_attention_heads=heads,
        num_hidden_layers=2,
        max_position_embeddings=PROMPT_TOKENS,
        vocab_size=len(tokenizer),
        **extra,
    )
    return CLIPTextModel(config)


def build_stable_diffusion(folder: Path) -> None:
    """t13: a UNet on 4 latent channels (so the inpainting pipeline runs it in its 4-channel mode), a
    two-block VAE (latents at half the image size) and a 32-wide text encoder; no safety checker. The
    same folder loads as the Img2Img, Inpaint and AutoPipeline* classes."""
    reseed()
    tokenizer = clip_tokenizer(PROMPT_TOKENS)
    unet = UNet2DConditionModel(
        block_out_channels=(4, 8),
        layers_per_block=1,
        sample_size=16,
        in_channels=4,
        out_channels=4,
        down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
        up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
        cross_attention_dim=32,
        norm_num_groups=2,
    )
    vae = AutoencoderKL(
        block_out_channels=[4, 8],
        in_channels=3,
        out_channels=3,
        down_block_types=["DownEncoderBlock2D", "DownEncoderBlock2D"],
        up_block_types=["UpDecoderBlock2D", "UpDecoderBlock2D"],
        latent_channels=4,
        norm_num_groups=2,
        sample_size=32,
    )
    text_encoder = clip_text_encoder(tokenizer, width=32, mlp=64, heads=4)
    pipeline = StableDiffusionPipeline(
        vae=vae,
        text_encoder=text_encoder,
        tokenizer=tokenizer,
        unet=unet,
        scheduler=ddim_scheduler(),
        safety_checker=None,
        feature_extractor=None,
        image_encoder=None,
        requires_safety_checker=False,
    )
    pipeline.save_pretrained(folder)


def build_text_to_video(folder: Path) -> None:
    """t14: ``text_to_video_sd`` and ``wan``, each seeded on its own."""
    _build_text_to_video_sd(folder / "text_to_video_sd")
    _build_wan(folder / "wan")


def _build_text_to_video_sd(folder: Path) -> None:
    """TextToVideoSDPipeline: a UNet3D with 4-wide cross-attention over a 4-wide text encoder."""
    reseed()
    tokenizer = clip_tokenizer(PROMPT_TOKENS)
    unet = UNet3DConditionModel(
        block_out_channels=(4, 8),
        layers_per_block=1,
        sample_size=16,
        in_channels=4,
        out_channels=4,
        down_block_types=("CrossAttnDownBlock3D", "DownBlock3D"),
        up_block_types=("UpBlock3D", "CrossAttnUpBlock3D"),
        cross_attention_dim=4,
        attention_head_dim=4,
        norm_num_groups=2,
    )
    vae = AutoencoderKL(
        block_out_channels=(8,),
        in_channels=3,
        out_channels=3,
        down_block_types=["DownEncoderBlock2D"],
        up_block_types=["UpDecoderBlock2D"],
        latent_channels=4,
        sample_size=32,
        norm_num_groups=2,
    )
    text_encoder = clip_text_encoder(
        tokenizer, width=4, mlp=16, heads=2, hidden_act="gelu", projection_dim=32
    )
    pipeline = TextToVideoSDPipeline(
        vae=vae, text_encoder=text_encoder, tokenizer=tokenizer, unet=unet, scheduler=ddim_scheduler()
    )
    pipeline.save_pretrained(folder)


def _build_wan(folder: Path) -> None:
    """Wan 2.1 text-to-video: a UMT5 encoder (32 wide), Wan's causal 3D VAE (16 latent channels, time
    downsampled 4x: 4k + 1 frames) and a two-layer transformer, with a flow-matching scheduler."""
    reseed()
    tokenizer = t5_tokenizer(32)
    text_config = UMT5Config(
        vocab_size=len(tokenizer),
        d_model=32,
        d_kv=8,
        d_ff=37,
        num_layers=2,
        num_heads=4,
        relative_attention_num_buckets=8,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        decoder_start_token_id=tokenizer.pad_token_id,
    )
    text_encoder = UMT5EncoderModel(text_config)
    vae = AutoencoderKLWan(
        base_dim=3,
        z_dim=16,
        dim_mult=[1, 1, 1, 1],
        num_res_blocks=1,
        temperal_downsample=[False, True, True],
    )
    transformer = WanTransformer3DModel(
        patch_size=(1, 2, 2),
        num_attention_heads=2,
        attention_head_dim=12,
        in_channels=16,
        out_channels=16,
        text_dim=32,
        freq_dim=256,
        ffn_dim=32,
        num_layers=2,
        cross_attn_norm=True,
        qk_norm="rms_norm_across_heads",
        rope_max_seq_len=32,
    )
    pipeline = WanPipeline(
        tokenizer=tokenizer,
        text_encoder=text_encoder,
        vae=vae,
        scheduler=FlowMatchEulerDiscreteScheduler(shift=7.0),
        transformer=transformer,
    )
    pipeline.save_pretrained(folder)
