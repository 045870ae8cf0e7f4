"""The reclaim policy file (TOML, as the config file): who opted in, what idle means, what to do.

Opt-in is explicit: only objects in the listed namespaces whose labels include every
``match_labels`` pair are ever touched, and ``match_labels`` cannot be empty. Example (TOML)::

    name = "sandbox-idle-gpus"
    cluster = "prod-a"
    namespaces = ["ml-sandbox"]
    match_labels = { "gpulens.io/reclaim" = "enabled" }
    action = "scale-to-zero"        # annotate | scale-to-zero | delete

    [idle]
    checks = 5                      # idle at each of 5 checks ...
    interval_s = 10                 # ... 10 s apart, ending at the newest usage window
    gpu_utilization_below = 5.0     # the highest utilization a check may see, %
    max_age_s = 900                 # usage older than this (wall clock) decides nothing
    cpu_millicores_below = 100      # optional: and its pods' CPU under this at every check
"""

from __future__ import annotations

import tomllib
from enum import StrEnum
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from gpulens.producers.reclaim.exceptions import PolicyError


class Action(StrEnum):
    """What is done to an idle, opted-in workload."""

    ANNOTATE = "annotate"
    """Mark it (``gpulens.io/idle`` annotation) and change nothing else."""
    SCALE_TO_ZERO = "scale-to-zero"
    """Deployments and StatefulSets: replicas 0 through the scale subresource."""
    DELETE = "delete"
    """Jobs: delete the Job (its pods in the background) and the Services serving only its pods."""


KINDS_OF: dict[Action, tuple[str, ...]] = {
    Action.ANNOTATE: ("Deployment", "StatefulSet", "Job"),
    Action.SCALE_TO_ZERO: ("Deployment", "StatefulSet"),
    Action.DELETE: ("Job",),
}
"""The workload kinds each action applies to (the only kinds listed for it)."""


class IdleDefinition(BaseModel):
    """Idle means under the threshold at every one of ``checks`` checks ``interval_s`` apart."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    checks: int = Field(default=5, ge=1, le=1000, description="Consecutive idle checks needed.")
    interval_s: float = Field(default=10.0, gt=0, description="Event-time seconds between checks.")
    gpu_utilization_below: float = Field(
        default=5.0,
        gt=0,
        le=100,
        description="A check is idle when the GPUs' highest utilization is under this, %.",
    )
    max_age_s: float = Field(
        default=900.0, gt=0, description="Usage whose newest window ended longer ago (wall clock) is stale."
    )
    cpu_millicores_below: float | None = Field(
        default=None,
        gt=0,
        description="Also idle only if its pods' CPU (metrics.k8s.io) is under this at every check; "
        "these checks run live, ``interval_s`` apart. None: GPU utilization only.",
    )


class Policy(BaseModel):
    """One reclaim policy."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(min_length=1, description="Named on every audit record and annotation.")
    cluster: str = Field(
        min_length=1, description="The cluster whose usage is judged (as the watcher names it)."
    )
    namespaces: list[str] = Field(min_length=1, description="Namespaces that opted in.")
    match_labels: dict[str, str] = Field(
        min_length=1, description="Labels an object must carry to be touched."
    )
    action: Action = Field(description="annotate, scale-to-zero or delete.")
    idle: IdleDefinition = Field(default_factory=IdleDefinition)

    @field_validator("namespaces")
    @classmethod
    def _no_wildcards(cls, namespaces: list[str]) -> list[str]:
        if any(not ns or "*" in ns for ns in namespaces):
            raise ValueError("name each namespace that opted in; empty names and wildcards are refused")
        return namespaces

    @property
    def kinds(self) -> tuple[str, ...]:
        """The workload kinds this policy's action applies to."""
        return KINDS_OF[self.action]


def load_policy(path: Path) -> Policy:
    """The policy in the TOML file ``path``; :class:`PolicyError` saying what to fix."""
    try:
        text = path.read_text()
    except OSError as err:
        raise PolicyError(f"policy file {path}: cannot be read: {err}") from err
    try:
        data: dict[str, Any] = tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise PolicyError(f"policy file {path}: not valid TOML: {err}") from err
    try:
        return Policy.model_validate(data)
    except ValidationError as err:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or '(file)'}: {e['msg']}" for e in err.errors()
        )
        raise PolicyError(f"policy file {path}: {problems}") from err
