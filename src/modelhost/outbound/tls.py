"""The TLS context of every outbound connection."""

from __future__ import annotations

import functools
import os
import ssl

import certifi


def tls_context() -> ssl.SSLContext:
    """The verifying context of every fetch. The CA bundle is `SSL_CERT_FILE`, else the folder
    `SSL_CERT_DIR`, when set (read at each fetch, as httpx 0.28's `create_ssl_context` reads them once):
    an operator's private CA, a test's CA. Otherwise certifi's bundle, as httpx uses by default: the
    same answer on every machine, whatever its system store holds."""
    return _tls_context_for(os.environ.get("SSL_CERT_FILE") or None, os.environ.get("SSL_CERT_DIR") or None)


@functools.cache
def _tls_context_for(cafile: str | None, capath: str | None) -> ssl.SSLContext:
    """Cached per bundle: building a context loads the bundle, which is slow."""
    if cafile:
        return ssl.create_default_context(cafile=cafile)
    if capath:
        return ssl.create_default_context(capath=capath)
    return ssl.create_default_context(cafile=certifi.where())
