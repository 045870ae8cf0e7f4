"""Type aliases of wire payloads: Kubernetes objects and watch events as the API server sends them."""

from __future__ import annotations

from typing import Any, TypedDict

RawObject = dict[str, Any]
"""A Kubernetes object as JSON: apiVersion, kind, metadata, spec, status."""


class RawWatchEvent(TypedDict):
    """One line of a watch stream."""

    type: str
    """ADDED, MODIFIED, DELETED, BOOKMARK or ERROR."""
    object: RawObject
    """The object; a Status for ERROR; only metadata.resourceVersion for BOOKMARK."""
