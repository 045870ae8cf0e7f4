"""Replayers of real public GPU-cluster traces: the same records the live producers publish."""
