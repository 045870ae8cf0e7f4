"""The alert rules of infra/prometheus pass `promtool check rules` and their unit tests.

promtool comes from Debian's prometheus package, unpacked into .tools/ by
infra/prometheus/install_promtool.sh (no server is installed or started).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
RULES = ROOT / "infra" / "prometheus"


@pytest.fixture(scope="module")
def promtool() -> Path:
    install = subprocess.run(
        [str(RULES / "install_promtool.sh")], capture_output=True, text=True, timeout=300, check=False
    )
    if install.returncode != 0:
        pytest.skip(
            "promtool cannot be installed here (apt-get download prometheus failed): "
            f"{install.stderr.strip()[-500:]}"
        )
    return Path(install.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize(
    ("command", "file"), [("check", "rules.yml"), ("test", "rules_test.yml")], ids=["check", "test"]
)
def test_promtool_rules(promtool: Path, command: str, file: str) -> None:
    result = subprocess.run(
        [str(promtool), command, "rules", file],
        cwd=RULES,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout
