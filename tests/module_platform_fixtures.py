"""``platform`` and ``config_file`` of a test module's own platform (conftest's
``module_platform``), for the modules whose tests start workers of new groups: a new group reads
its inputs from the beginning, and on the session's platform that is everything every earlier
test published. Such a module takes them with
``platform, config_file = module_platform_fixtures()``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gpulens.config import GPULensSettings


def module_platform_fixtures() -> tuple[Any, Any]:
    """The two fixtures, overriding the session's for the module that holds them."""

    @pytest.fixture(scope="module")
    def platform(module_platform: tuple[GPULensSettings, Path]) -> GPULensSettings:
        return module_platform[0]

    @pytest.fixture(scope="module")
    def config_file(module_platform: tuple[GPULensSettings, Path]) -> Path:
        return module_platform[1]

    return platform, config_file
