"""containerd.services.events.v1: Subscribe to the event stream."""
