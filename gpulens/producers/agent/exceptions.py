"""Errors of the node agent.

    GPULensError
    └── AgentError
        ├── CollectorUnavailable   a collector's library, driver, socket or sysfs tree is missing:
        │                          the collector is switched off, the rest keeps working
        ├── CollectionError        one collection round of a collector failed (retried next round)
        └── SpoolError             the on-disk spool could not be read or written

Library errors (amdsmi, NVML, grpc, sqlite3) are translated into this tree where they enter:
in the collector that called the library, and in :mod:`gpulens.producers.agent.spooling`.
"""

from __future__ import annotations

from gpulens.schemas.model.exceptions import GPULensError


class AgentError(GPULensError):
    """Root of the node agent's errors."""


class CollectorUnavailable(AgentError):
    """The collector cannot work on this node; the message says why and what would fix it."""


class CollectionError(AgentError):
    """One round of collection failed; the collector stays on and tries again next round."""


class SpoolError(AgentError):
    """The on-disk spool could not be opened, read or written."""
