"""gRPC protocol definitions and their generated modules."""
