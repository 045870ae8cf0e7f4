"""containerd.services: the gRPC services the node agent calls."""
