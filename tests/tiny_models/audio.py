"""Audio models, all at 16 kHz: Wav2Vec2 audio classification (t09), and speech (t12): Whisper and
Wav2Vec2 CTC for speech recognition, VITS for text-to-speech.

Whisper here listens to 1 s windows (100 mel frames, 50 encoder positions) instead of 30 s, which keeps
it tiny; its tokenizer still holds Whisper's special tokens and the 1501 timestamp tokens
<|0.00|> ... <|30.00|>, which `return_timestamps` indexes into right after <|notimestamps|>.
"""

from __future__ import annotations

import string
from pathlib import Path
from typing import Any

from tokenizers import AddedToken
from transformers import (
    GenerationConfig,
    VitsConfig,
    VitsModel,
    VitsTokenizer,
    Wav2Vec2Config,
    Wav2Vec2CTCTokenizer,
    Wav2Vec2FeatureExtractor,
    Wav2Vec2ForCTC,
    Wav2Vec2ForSequenceClassification,
    Wav2Vec2Processor,
    WhisperConfig,
    WhisperFeatureExtractor,
    WhisperForConditionalGeneration,
    WhisperProcessor,
    WhisperTokenizer,
)

from tests.tiny_models.common import label_maps, reseed, save
from tests.tiny_models.vocab import bpe_vocab_and_merges, write_vocab_json

SAMPLING_RATE = 16_000
KEYWORD_LABELS: tuple[str, ...] = ("yes", "no", "up", "down")

WHISPER_END = "<|endoftext|>"
# Whisper's control tokens after <|endoftext|>, in ID order; <|notimestamps|> must be the last of them,
# since the timestamp tokens are found by counting on from it.
WHISPER_CONTROL: tuple[str, ...] = (
    "<|startoftranscript|>",
    "<|en|>",
    "<|de|>",
    "<|translate|>",
    "<|transcribe|>",
    "<|startoflm|>",
    "<|startofprev|>",
    "<|nocaptions|>",
    "<|notimestamps|>",
)
TIMESTAMPS = 1501  # 0.00 s to 30.00 s in steps of 0.02 s

CTC_TOKENS: tuple[str, ...] = (
    "<pad>",
    "<s>",
    "</s>",
    "<unk>",
    "|",
    *string.ascii_lowercase,
    *string.digits,
    "'",
)
VITS_TOKENS: tuple[str, ...] = ("<pad>", "<unk>", " ", *string.ascii_lowercase, *"'.,?!")


def wav2vec2_config(**extra: Any) -> Wav2Vec2Config:
    """Two layers of width 32 after three 16-channel convolutions that downsample 80x (5 * 4 * 4)."""
    return Wav2Vec2Config(
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=37,
        conv_dim=(16, 16, 16),
        conv_stride=(5, 4, 4),
        conv_kernel=(10, 4, 4),
        num_conv_pos_embeddings=16,
        num_conv_pos_embedding_groups=2,
        **extra,
    )


def build_audio_classification(folder: Path) -> None:
    """t09: keyword spotting over `KEYWORD_LABELS` with a normalising 16 kHz feature extractor."""
    reseed()
    config = wav2vec2_config(vocab_size=32, classifier_proj_size=16, **label_maps(KEYWORD_LABELS))
    features = Wav2Vec2FeatureExtractor(
        feature_size=1,
        sampling_rate=SAMPLING_RATE,
        padding_value=0.0,
        do_normalize=True,
        return_attention_mask=True,
    )
    save(folder, Wav2Vec2ForSequenceClassification(config), features)


def build_speech(folder: Path) -> None:
    """t12: ``whisper``, ``wav2vec2_ctc`` and ``vits``, each seeded on its own."""
    _build_whisper(folder / "whisper")
    _build_ctc(folder / "wav2vec2_ctc")
    _build_vits(folder / "vits")


def whisper_tokenizer() -> WhisperTokenizer:
    """Byte-level BPE + Whisper's control tokens (special) + the timestamp tokens (ordinary added tokens,
    matched verbatim: not normalised)."""
    vocabulary, merges = bpe_vocab_and_merges(300, [WHISPER_END])
    tokenizer = WhisperTokenizer(vocab=vocabulary, merges=merges)
    tokenizer.add_special_tokens({"additional_special_tokens": list(WHISPER_CONTROL)})
    stamps = [f"<|{step * 0.02:.2f}|>" for step in range(TIMESTAMPS)]
    tokenizer.add_tokens([AddedToken(stamp, special=False, normalized=False) for stamp in stamps])
    return tokenizer


def _build_whisper(folder: Path) -> None:
    """Multilingual Whisper (English and German), one encoder and one decoder layer, 1 s windows."""
    reseed()
    tokenizer = whisper_tokenizer()
    ids = {token: tokenizer.convert_tokens_to_ids(token) for token in (WHISPER_END, *WHISPER_CONTROL)}
    end, start = ids[WHISPER_END], ids["<|startoftranscript|>"]
    config = WhisperConfig(
        vocab_size=len(tokenizer),
        num_mel_bins=80,
        d_model=32,
        encoder_layers=1,
        decoder_layers=1,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_ffn_dim=32,
        decoder_ffn_dim=32,
        max_source_positions=50,  # 100 mel frames of a 1 s window, halved by the encoder's stride-2 conv
        max_target_positions=64,
        decoder_start_token_id=start,
        pad_token_id=end,
        bos_token_id=end,
        eos_token_id=end,
        suppress_tokens=[],
        begin_suppress_tokens=[],
    )
    model = WhisperForConditionalGeneration(config)
    # What Whisper's generate needs to pick a language and a task and to find the timestamp tokens.
    model.generation_config = GenerationConfig(
        decoder_start_token_id=start,
        eos_token_id=end,
        pad_token_id=end,
        bos_token_id=end,
        no_timestamps_token_id=ids["<|notimestamps|>"],
        is_multilingual=True,
        lang_to_id={"<|en|>": ids["<|en|>"], "<|de|>": ids["<|de|>"]},
        task_to_id={"transcribe": ids["<|transcribe|>"], "translate": ids["<|translate|>"]},
    )
    features = WhisperFeatureExtractor(feature_size=80, chunk_length=1)
    save(folder, model, WhisperProcessor(feature_extractor=features, tokenizer=tokenizer))


def _build_ctc(folder: Path) -> None:
    """Character CTC: lower-case letters, digits and the apostrophe; "|" separates words, <pad> is blank."""
    reseed()
    tokenizer = Wav2Vec2CTCTokenizer(str(write_vocab_json(folder, CTC_TOKENS)))
    config = wav2vec2_config(
        vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id, ctc_loss_reduction="mean"
    )
    features = Wav2Vec2FeatureExtractor(sampling_rate=SAMPLING_RATE, return_attention_mask=True)
    save(folder, Wav2Vec2ForCTC(config), Wav2Vec2Processor(feature_extractor=features, tokenizer=tokenizer))


def _build_vits(folder: Path) -> None:
    """VITS reading characters (no phonemizer), with blanks between them; two 4x upsamplings per latent
    frame. Its duration predictor is stochastic: the tests seed before each call for a fixed length."""
    reseed()
    vocabulary = write_vocab_json(folder, VITS_TOKENS)
    tokenizer = VitsTokenizer(
        str(vocabulary), phonemize=False, add_blank=True, normalize=True, language="eng"
    )
    config = VitsConfig(
        vocab_size=len(VITS_TOKENS),
        hidden_size=16,
        num_hidden_layers=2,
        num_attention_heads=2,
        ffn_dim=32,
        flow_size=8,
        spectrogram_bins=8,
        upsample_initial_channel=16,
        upsample_rates=(4, 4),
        upsample_kernel_sizes=(8, 8),
        resblock_kernel_sizes=(3,),
        resblock_dilation_sizes=((1, 3),),
        duration_predictor_filter_channels=16,
        duration_predictor_num_flows=2,
        prior_encoder_num_flows=2,
        prior_encoder_num_wavenet_layers=1,
        posterior_encoder_num_wavenet_layers=1,
        depth_separable_num_layers=1,
        sampling_rate=SAMPLING_RATE,
        pad_token_id=0,
    )
    save(folder, VitsModel(config), tokenizer)
