"""containerd.events: the task and container events of the event stream."""
