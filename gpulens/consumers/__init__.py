"""Sinks: ClickHouse (state, history, time series) with its SQL endpoint, and the Prometheus exporter."""
