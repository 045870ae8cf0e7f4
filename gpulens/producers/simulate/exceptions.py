"""Errors of the cluster simulator.

GPULensError
└── SimulationError    a simulation cannot be set up as asked (the message says which value and why)
"""

from __future__ import annotations

from gpulens.schemas.model.exceptions import GPULensError


class SimulationError(GPULensError):
    """The simulation's settings are inconsistent or out of range."""
