"""Errors of idle reclaim.

    GPULensError
    └── ReclaimError
        ├── PolicyError        the policy file is missing, unreadable or invalid (says what to fix)
        └── UsageReadError     the workload usage topic could not be read back

Kubernetes API errors keep their own tree (:mod:`gpulens.producers.kubernetes.exceptions`): a
failed action is audited as FAILED with the error, not raised.
"""

from __future__ import annotations

from gpulens.schemas.model.exceptions import GPULensError


class ReclaimError(GPULensError):
    """Root of idle reclaim's errors."""


class PolicyError(ReclaimError):
    """The policy file cannot be used; the message names the field and what to change."""


class UsageReadError(ReclaimError):
    """The workload usage topic could not be read to its end."""
