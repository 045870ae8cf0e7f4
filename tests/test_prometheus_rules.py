"""The alert rules of infra/prometheus pass `promtool check rules` and their unit tests.

promtool comes from Debian's prometheus package, unpacked into .tools/ by
infra/prometheus/install_promtool.sh (no server is installed or started): the ``promtool``
fixture of conftest.py.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
RULES = ROOT / "infra" / "prometheus"


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
