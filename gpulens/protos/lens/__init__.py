"""Primus-Lens's node-exporter API (the gateway serves its StreamContainerEvents)."""
