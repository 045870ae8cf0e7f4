"""`gpulens up` then `gpulens down` on a private platform: the README's first command, checked in CI."""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

from gpulens.platform import write_private_config


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        config = write_private_config(Path(tmp))
        command = [sys.executable, "-m", "gpulens", "--config", str(config)]
        try:
            return subprocess.run([*command, "up"], check=False).returncode
        finally:
            subprocess.run([*command, "down"], check=False)


if __name__ == "__main__":
    sys.exit(main())
