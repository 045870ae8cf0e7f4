"""containerd.services.containers.v1: a container's labels (Get)."""
