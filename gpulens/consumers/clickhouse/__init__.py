"""ClickHouse: client, embedded engine and its HTTP endpoint."""
