"""Keeping services running: a service that exits is started again, and the restart reported.

A supervisor starts its services through a :class:`ServiceManager` (so pid files, logs and
`gpulens status` see them as usual), checks them every ``interval_s``, and restarts one that
is gone after a backoff that doubles while it keeps crashing (1 s, 2 s, ... 30 s) and resets
once it has stayed up for ``stable_s``. Every restart is logged with the exit status and kept
in ``run/restarts.json`` for `gpulens status`. A state file it cannot write (a full disk, a
read-only directory) never ends it: the first failure is logged, every one counted in
``state_write_failures``, and supervising goes on (a service whose pid file cannot be written
is not left running unrecorded: its start fails and is retried with the backoff). Each
service's log is rotated once it passes ``log_max_bytes``. On stop it stops its services in
reverse order, each with SIGTERM first so that it writes what it buffers.
"""

from __future__ import annotations

import json
import logging
import signal
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from gpulens.infra.launching import LaunchError, ServiceManager, ServiceSpec, State

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Restart:
    """One restart of a service."""

    name: str
    count: int
    """Restarts of this service since the supervisor started."""
    exit_status: str
    at: float
    """Wall-clock time (epoch seconds)."""


def describe_exit(code: int | None) -> str:
    """'exit code 1', 'killed by SIGKILL', or 'exited' when the status is unknown."""
    if code is None:
        return "exited"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


class Supervisor:
    """Starts ``specs`` and restarts any that exits, until stopped."""

    def __init__(
        self,
        services: ServiceManager,
        specs: Sequence[ServiceSpec],
        *,
        backoff_s: float = 1.0,
        max_backoff_s: float = 30.0,
        stable_s: float = 60.0,
        start_timeout_s: float = 120.0,
        log_max_bytes: int = 50_000_000,
        log_backups: int = 2,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._services = services
        self._specs = list(specs)
        self._backoff_s, self._max_backoff_s, self._stable_s = backoff_s, max_backoff_s, stable_s
        self._start_timeout_s = start_timeout_s
        self._log_max_bytes, self._log_backups = log_max_bytes, log_backups
        self._clock = clock
        self._started: dict[str, float] = {}
        self._down_since: dict[str, float] = {}
        self._delay: dict[str, float] = {}
        self._exits: dict[str, str] = {}
        self.restarts: list[Restart] = []
        self.state_write_failures = 0
        """State files (restarts, pid files, log rotations) that could not be written."""

    @property
    def restarts_file(self) -> Path:
        return self._services.state_dir / "run" / "restarts.json"

    def start_all(self) -> None:
        """Start every service that does not run yet, all at once (a running one is adopted as
        it is)."""
        self._services.start_many(self._specs, timeout=self._start_timeout_s)
        now = self._clock()
        for spec in self._specs:
            self._started[spec.name] = now

    def check(self) -> list[Restart]:
        """Restart the services that are gone and whose backoff has passed; returns them."""
        done: list[Restart] = []
        now = self._clock()
        for spec in self._specs:
            self._rotate_log(spec.name)
            if self._services.status(spec.name).state is State.RUNNING:
                if now - self._started.get(spec.name, now) >= self._stable_s:
                    self._delay.pop(spec.name, None)  # up long enough: the next crash restarts at once
                continue
            if spec.name not in self._down_since:
                code = self._reap(spec.name)
                self._down_since[spec.name] = now
                self._exits[spec.name] = describe_exit(code)
                log.warning("%s %s; restarting it", spec.name, self._exits[spec.name])
            if now - self._down_since[spec.name] < self._delay.get(spec.name, 0.0):
                continue
            restart = self._restart(spec, now)
            if restart is not None:
                done.append(restart)
        return done

    def _restart(self, spec: ServiceSpec, now: float) -> Restart | None:
        self._delay[spec.name] = min(
            max(self._delay.get(spec.name, 0.0) * 2, self._backoff_s), self._max_backoff_s
        )
        try:
            status, _ = self._services.start(spec, timeout=self._start_timeout_s)
        except LaunchError as err:
            log.error(
                "%s could not be restarted (next try in %.0f s): %s", spec.name, self._delay[spec.name], err
            )
            self._down_since[spec.name] = self._clock()
            return None
        del self._down_since[spec.name]
        self._started[spec.name] = self._clock()
        count = 1 + sum(1 for r in self.restarts if r.name == spec.name)
        restart = Restart(spec.name, count, self._exits.pop(spec.name, "exited"), time.time())
        self.restarts.append(restart)
        self._record()
        log.warning("%s restarted (pid %s, restart %d)", spec.name, status.pid, count)
        return restart

    def _record(self) -> None:
        try:
            self.restarts_file.parent.mkdir(parents=True, exist_ok=True)
            self.restarts_file.write_text(json.dumps([asdict(r) for r in self.restarts], indent=1))
        except OSError as err:
            self._state_unwritable(err)

    def _reap(self, name: str) -> int | None:
        try:
            return self._services.reap(name)
        except OSError as err:  # the stale pid file could not be removed
            self._state_unwritable(err)
            return None

    def _rotate_log(self, name: str) -> None:
        try:
            if self._services.rotate_log(name, max_bytes=self._log_max_bytes, backups=self._log_backups):
                log.info("%s's log passed %d bytes: rotated", name, self._log_max_bytes)
        except OSError as err:
            self._state_unwritable(err)

    def _state_unwritable(self, err: OSError) -> None:
        self.state_write_failures += 1
        if self.state_write_failures == 1:
            log.error(
                "cannot write supervisor state (%s); supervising goes on, further failures are counted", err
            )

    def run(self, stop: threading.Event, *, interval_s: float = 0.5) -> None:
        """Start everything, keep it running until ``stop`` is set, then stop it all."""
        try:
            self.start_all()
            while not stop.wait(interval_s):
                self.check()
        finally:
            self.stop_all()

    def stop_all(self, stall_s: float = 60.0) -> None:
        """Stop the services, last started first (each killed only after ``stall_s`` idle)."""
        for spec in reversed(self._specs):
            if self._services.stop(spec.name, stall_s=stall_s):
                log.info("%s stopped", spec.name)


def read_restarts(services: ServiceManager) -> list[Restart]:
    """The restarts a supervisor recorded under ``services``' state directory."""
    path = services.state_dir / "run" / "restarts.json"
    try:
        return [Restart(**r) for r in json.loads(path.read_text())]
    except (OSError, ValueError, TypeError):
        return []
