"""Errors of the trace replayers.

GPULensError
└── TraceError    a trace file is missing, unreadable or inconsistent (file:line says where)
"""

from __future__ import annotations

from gpulens.schemas.model.exceptions import GPULensError


class TraceError(GPULensError):
    """A trace file cannot be replayed; the message names the file and line."""
