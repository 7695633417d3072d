"""modelhost: serve customers' own Hugging Face models over HTTP."""

__version__ = "0.1.0"
