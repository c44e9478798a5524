"""Describe the machine a benchmark ran on (printed with every benchmark result)."""

from __future__ import annotations

import os
import platform


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def machine_info() -> dict[str, str | int | bool]:
    """CPU model, core count, AES instructions and library versions, as a flat dict."""
    import cryptography
    import numpy
    from cryptography.hazmat.backends.openssl.backend import backend

    flags = _cpu_flags()
    return {
        "cpu": _cpu_model(),
        "cores": os.cpu_count() or 0,
        "aes_ni": "aes" in flags,
        "vaes": "vaes" in flags,
        "python": platform.python_version(),
        "numpy": numpy.__version__,
        "cryptography": cryptography.__version__,
        "openssl": backend.openssl_version_text(),
    }
