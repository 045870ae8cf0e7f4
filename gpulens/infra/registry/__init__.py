"""The embedded schema registry: the REST surface of Confluent's that clients call, stored in Kafka."""

from gpulens.infra.registry.server import build_app, serve
from gpulens.infra.registry.store import SchemaStore, SchemaVersion

__all__ = ["SchemaStore", "SchemaVersion", "build_app", "serve"]
