"""Launching the embedded platform (broker, registry, ClickHouse holder); manifests beside it."""
