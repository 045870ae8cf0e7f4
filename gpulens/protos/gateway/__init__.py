"""The GPULens ingest gateway's gRPC API."""
