"""Where the public traces are: ``GPULENS_TRACES_DIR``, else the repository's own ``traces/``."""

from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]


def traces_dir() -> Path:
    """The folder holding ``alibaba-gpu-v2023/`` and ``alibaba-genai-2026/``."""
    configured = os.environ.get("GPULENS_TRACES_DIR")
    return Path(configured) if configured else REPO / "traces"
