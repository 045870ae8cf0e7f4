"""Errors of the entity tables app.

GPULensError
└── PipelineError
    └── TablesError
        └── ForwardFailed   a pod could not be handed to its workloads' partitions (the app
                            stops before acknowledging the pod, so a restart forwards it again)
"""

from __future__ import annotations

from gpulens.pipeline.exceptions import PipelineError


class TablesError(PipelineError):
    """The entity tables cannot go on."""


class ForwardFailed(TablesError):
    """The broker did not take a forwarded pod event."""
