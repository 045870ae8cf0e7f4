"""Errors of the stream processors.

GPULensError
└── PipelineError
    ├── LateEvent     an event older than what its operator already applied (to the DLQ)
    └── CycleAborted  the broker failed the cycle's transaction; it was aborted, to be redone
"""

from __future__ import annotations

from gpulens.schemas.model.exceptions import GPULensError


class PipelineError(GPULensError):
    """A stream processor cannot go on."""


class LateEvent(PipelineError):
    """An event arrived after event time had passed it: counted and sent to the DLQ."""


class CycleAborted(PipelineError):
    """librdkafka failed the cycle's transaction (``txn_requires_abort``): it was aborted, and the
    operators' state in memory is ahead of the last checkpoint. Or the producer hit a fatal
    error that a broker's restart can cause (a lost sequence): the transaction never commits.
    Either way the worker starts again from that checkpoint (restored state, checkpointed
    offsets, a fresh producer), which redoes the cycle."""
