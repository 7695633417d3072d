"""Image + text models: visual question answering (t07) and image captioning (t08).

transformers 5 has no ``visual-question-answering`` pipeline and sends ``image-to-text`` to
``image-text-to-text``, so the server drives these models itself; each task therefore has one model of
each kind it must handle:

* t07 ``llava``: a generative VLM (CLIP vision tower + the chat model's Qwen2 and tokenizer) answering
  in words; ``vilt``: an answer classifier (ViLT) giving labelled scores.
* t08 ``blip``: BLIP, which has a processor; ``vit_gpt2``: a VisionEncoderDecoder (ViT + GPT-2 with
  cross-attention) with only an image processor and a tokenizer, run through `generate`.

`build_vlm_for_vllm` is tests/test_vllm.py's vision-language model: Idefics3 (SmolVLM's architecture),
whose vLLM implementation imports without torchvision (LLaVA's needs it, and PyPI has no torchvision
for the CPU torch vLLM runs on here).
"""

from __future__ import annotations

from pathlib import Path

from transformers import (
    BlipConfig,
    BlipForConditionalGeneration,
    BlipImageProcessorPil,
    BlipProcessor,
    CLIPVisionConfig,
    GPT2Config,
    GPT2LMHeadModel,
    GPT2Tokenizer,
    Idefics3Config,
    Idefics3ForConditionalGeneration,
    Idefics3ImageProcessorPil,
    Idefics3Processor,
    LlamaConfig,
    LlavaConfig,
    LlavaForConditionalGeneration,
    LlavaProcessor,
    ViltConfig,
    ViltForQuestionAnswering,
    ViltImageProcessorPil,
    ViltProcessor,
    VisionEncoderDecoderModel,
    ViTImageProcessorPil,
    ViTModel,
)
from transformers.models.idefics3.configuration_idefics3 import Idefics3VisionConfig

from tests.tiny_models.chat import CHAT_TEMPLATE, IMAGE_TOKEN, chat_tokenizer, greedy_generation, qwen2_config
from tests.tiny_models.common import label_maps, reseed, save
from tests.tiny_models.vision import clip_image_processor, vit_config
from tests.tiny_models.vocab import bert_tokenizer, bpe_vocab_and_merges

VQA_ANSWERS: tuple[str, ...] = ("yes", "no", "cat", "dog", "2")
CAPTION_TOKENS = 8  # the captioners' default max_new_tokens


def build_visual_question_answering(folder: Path) -> None:
    """t07: ``llava`` then ``vilt``, after one seed."""
    reseed()
    _build_llava(folder / "llava")
    _build_vilt(folder / "vilt")


def _build_llava(folder: Path) -> None:
    """Llava: 32 px images in 8 px patches give 16 image features (the CLS one dropped: "default"
    selection), which replace the 16 copies of <image> the processor expands one placeholder into."""
    tokenizer = chat_tokenizer()
    vision = CLIPVisionConfig(
        image_size=32,
        patch_size=8,
        hidden_size=32,
        intermediate_size=37,
        num_hidden_layers=2,
        num_attention_heads=2,
    )
    config = LlavaConfig(
        vision_config=vision,
        text_config=qwen2_config(tokenizer),
        image_token_index=tokenizer.convert_tokens_to_ids(IMAGE_TOKEN),
        image_seq_length=16,
        vision_feature_layer=-1,
        vision_feature_select_strategy="default",
    )
    model = LlavaForConditionalGeneration(config)
    model.generation_config = greedy_generation(tokenizer)
    processor = LlavaProcessor(
        image_processor=clip_image_processor(),
        tokenizer=tokenizer,
        patch_size=8,
        vision_feature_select_strategy="default",
        num_additional_image_tokens=1,
        image_token=IMAGE_TOKEN,
        chat_template=CHAT_TEMPLATE,
    )
    save(folder, model, processor)


def _build_vilt(folder: Path) -> None:
    """ViLT: a multi-label answer classifier over `VQA_ANSWERS` (sigmoid scores), text up to 40 tokens."""
    tokenizer = bert_tokenizer(40)
    config = ViltConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=37,
        image_size=32,
        patch_size=8,
        max_position_embeddings=40,
        num_labels=len(VQA_ANSWERS),
        **label_maps(VQA_ANSWERS),
    )
    image_processor = ViltImageProcessorPil(size={"shortest_edge": 32}, size_divisor=32)
    save(
        folder,
        ViltForQuestionAnswering(config),
        ViltProcessor(image_processor=image_processor, tokenizer=tokenizer),
    )


def build_image_to_text(folder: Path) -> None:
    """t08: ``blip`` then ``vit_gpt2``, after one seed."""
    reseed()
    _build_blip(folder / "blip")
    _build_vit_gpt2(folder / "vit_gpt2")


def _build_blip(folder: Path) -> None:
    """BLIP captioner on the WordPiece tokenizer: a caption starts at [CLS] and ends at [SEP]."""
    tokenizer = bert_tokenizer(32)
    text = {
        "vocab_size": len(tokenizer),
        "hidden_size": 32,
        "encoder_hidden_size": 32,
        "intermediate_size": 37,
        "projection_dim": 16,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "max_position_embeddings": 64,
        "bos_token_id": tokenizer.cls_token_id,
        "eos_token_id": tokenizer.sep_token_id,
        "sep_token_id": tokenizer.sep_token_id,
        "pad_token_id": tokenizer.pad_token_id,
    }
    vision = {
        "hidden_size": 32,
        "intermediate_size": 37,
        "projection_dim": 16,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "image_size": 32,
        "patch_size": 8,
    }
    config = BlipConfig(text_config=text, vision_config=vision, projection_dim=16, image_text_hidden_size=16)
    model = BlipForConditionalGeneration(config)
    model.generation_config.max_new_tokens = CAPTION_TOKENS
    image_processor = BlipImageProcessorPil(size={"height": 32, "width": 32})
    save(folder, model, BlipProcessor(image_processor=image_processor, tokenizer=tokenizer))


def _build_vit_gpt2(folder: Path) -> None:
    """ViT encoder + GPT-2 decoder; <|endoftext|> starts, pads and ends a caption, as in GPT-2 captioners."""
    vocabulary, merges = bpe_vocab_and_merges(300, ["<|endoftext|>"])
    tokenizer = GPT2Tokenizer(vocab=vocabulary, merges=merges)
    tokenizer.pad_token = tokenizer.eos_token
    boundary = tokenizer.eos_token_id
    encoder = ViTModel(vit_config())
    decoder_config = GPT2Config(
        vocab_size=len(tokenizer),
        n_embd=32,
        n_layer=2,
        n_head=2,
        n_positions=64,
        add_cross_attention=True,
        is_decoder=True,
        bos_token_id=boundary,
        eos_token_id=boundary,
    )
    model = VisionEncoderDecoderModel(encoder=encoder, decoder=GPT2LMHeadModel(decoder_config))
    model.config.decoder_start_token_id = boundary
    model.config.pad_token_id = tokenizer.pad_token_id
    generation = model.generation_config
    generation.decoder_start_token_id = boundary
    generation.pad_token_id = tokenizer.pad_token_id
    generation.eos_token_id = boundary
    generation.max_new_tokens = CAPTION_TOKENS
    save(folder, model, tokenizer, ViTImageProcessorPil(size={"height": 32, "width": 32}))


def build_vlm_for_vllm(folder: Path) -> None:
    """Idefics3 at the smallest shape vLLM's CPU attention runs (text heads of 64), with t11's tokenizer
    and template: a SigLIP-style tower over 32 px images in 8 px patches, pixel-shuffled by 2 into 4
    image tokens per image (no tiling: every image is resized to 32 px). Weights drawn wider than the
    default (`initializer_range` 0.2), so that this random model's answer depends on the image."""
    reseed()
    tokenizer = chat_tokenizer()
    tokenizer.add_tokens(
        ["<fake_token_around_image>", "<global-img>", "<end_of_utterance>"], special_tokens=True
    )
    text = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=64,
        max_position_embeddings=2048,
        initializer_range=0.2,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
        tie_word_embeddings=True,
    )
    vision = Idefics3VisionConfig(
        hidden_size=32,
        intermediate_size=37,
        num_hidden_layers=2,
        num_attention_heads=2,
        image_size=32,
        patch_size=8,
        initializer_range=0.2,
    )
    config = Idefics3Config(
        vision_config=vision,
        text_config=text,
        scale_factor=2,
        image_token_id=tokenizer.convert_tokens_to_ids(IMAGE_TOKEN),
        tie_word_embeddings=True,
    )
    model = Idefics3ForConditionalGeneration(config)
    model.generation_config = greedy_generation(tokenizer)
    image_processor = Idefics3ImageProcessorPil(
        size={"longest_edge": 32}, max_image_size={"longest_edge": 32}, do_image_splitting=False
    )
    processor = Idefics3Processor(
        image_processor=image_processor, tokenizer=tokenizer, image_seq_len=4, chat_template=CHAT_TEMPLATE
    )
    save(folder, model, processor)
