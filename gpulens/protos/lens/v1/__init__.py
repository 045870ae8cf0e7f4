"""lens v1: generated from exporter.proto with grpcio-tools (see exporter.proto for the command)."""
