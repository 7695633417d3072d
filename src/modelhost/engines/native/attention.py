"""The attention kernels the native engine's forward passes run under, eager and captured alike."""

from __future__ import annotations

import contextlib

import torch


def attention_kernels(device: torch.device) -> contextlib.AbstractContextManager[None]:
    """On CUDA, PyTorch's attention without its cuDNN kernel: cuDNN plans each new shape on first use
    (about 4 times a step's cost), which made a changing batch slower than a larger steady one. The
    memory-efficient kernel takes our masks at every shape; math is the fallback."""
    if device.type != "cuda":
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.MATH])
