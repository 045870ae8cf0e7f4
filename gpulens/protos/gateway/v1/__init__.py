"""gateway v1: generated from ingest.proto with grpcio-tools (see ingest.proto for the command)."""
