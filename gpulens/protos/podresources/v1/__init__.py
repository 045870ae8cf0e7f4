"""pod-resources v1: generated from api.proto with grpcio-tools (see api.proto for the command)."""
