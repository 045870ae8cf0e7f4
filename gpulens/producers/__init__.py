"""Producers: node agents, Kubernetes watchers, the gRPC ingest gateway and trace replayers."""
