"""``python delayed_gpulens.py DELAY_S ARGS...``: say ready; DELAY_S after a line on stdin: ``gpulens ARGS``.

Everything is imported before the line comes, so that the delays a test chooses are the
delays between the producers, not the time their interpreters take to start on a busy machine.
"""

from __future__ import annotations

import os
import sys
import time

import gpulens.producers.publishing
import gpulens.producers.replay.alibaba_v2023
import gpulens.producers.replay.genai_duty
import gpulens.producers.replay.splitting
import gpulens.schemas.wire.codec
from gpulens.cli import main

assert (
    gpulens.producers.publishing
    and gpulens.producers.replay.alibaba_v2023
    and gpulens.producers.replay.genai_duty
)
assert gpulens.producers.replay.splitting and gpulens.schemas.wire.codec

if __name__ == "__main__":
    delay_s = float(sys.argv[1])
    print("ready", flush=True)
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # the test reads no more
    sys.stdin.readline()
    time.sleep(delay_s)
    sys.argv = ["gpulens", *sys.argv[2:]]
    main()
