"""Stream processors: tables, changelogs, windowed aggregations and alerts (faust-streaming)."""
