"""The API's endpoints, one module per resource, under Lens's paths (``/api/...``)."""
