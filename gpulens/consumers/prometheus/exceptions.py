"""Errors of the Prometheus exporter.

    GPULensError
    └── ExporterError    the exporter cannot start: its address cannot be bound, its topics are missing

Consuming errors are the shared core's (:class:`gpulens.schemas.kafka.consuming.ConsumeError`).
"""

from __future__ import annotations

from gpulens.schemas.model.exceptions import GPULensError


class ExporterError(GPULensError):
    """The exporter cannot start; the message says what and where."""
