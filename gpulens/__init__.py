"""GPULens: the composition root (CLI and process supervision) over producers, pipeline and sinks."""
