"""Stream processors: the transactional worker on confluent-kafka (windowed aggregations,
alerts, device changelog, state rows; its state checkpointed with its outputs, its event time
from the sources' watermarks) and the faust-streaming entity tables app (`entity_tables`:
tables whose changelogs are the public state topics and the device changelog)."""
