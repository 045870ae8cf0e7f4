"""containerd's API (github.com/containerd/containerd/api, Apache-2.0), the part the node agent reads:
its event stream and container labels. Vendored .proto files with their generated modules
(see services/events/v1/events.proto for the command)."""
