"""containerd.types: the shared messages the events use."""
