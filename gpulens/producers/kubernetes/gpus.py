"""Which extended resources are GPUs, and how many GPUs an amount of one of them is."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Any

from gpulens.producers.kubernetes.quantities import parse_quantity
from gpulens.producers.kubernetes.settings import WatcherSettings


@dataclass(frozen=True, slots=True)
class GpuCatalog:
    """The configured GPU resources; the one place that turns a resource amount into GPUs."""

    whole: frozenset[str]
    patterns: tuple[str, ...]
    milli: frozenset[str]
    vendors: Mapping[str, str]
    model_labels: tuple[str, ...]

    @classmethod
    def from_settings(cls, settings: WatcherSettings) -> GpuCatalog:
        """The catalog the settings describe."""
        return cls(
            whole=frozenset(settings.gpu_resources),
            patterns=settings.gpu_resource_patterns,
            milli=frozenset(settings.gpu_milli_resources),
            vendors=dict(settings.gpu_vendors),
            model_labels=settings.gpu_model_labels,
        )

    def gpus(self, resource: str, quantity: str | int | float) -> float | None:
        """GPUs that ``quantity`` of ``resource`` is (shares as fractions); None: not a GPU resource."""
        if resource in self.milli:
            return float(parse_quantity(quantity) / 1000)
        if resource in self.whole or any(fnmatchcase(resource, p) for p in self.patterns):
            return float(parse_quantity(quantity))
        return None

    def amounts(self, resources: Mapping[str, Any] | None) -> dict[str, float]:
        """The GPU resources among ``resources`` (a requests/capacity map), in GPUs."""
        found: dict[str, float] = {}
        for name, quantity in (resources or {}).items():
            amount = self.gpus(name, quantity)
            if amount is not None:
                found[name] = amount
        return found

    def container_amounts(self, resources: Mapping[str, Any] | None) -> dict[str, float]:
        """A container's GPU amounts: per resource its request, else its limit."""
        resources = resources or {}
        return self.amounts({**(resources.get("limits") or {}), **(resources.get("requests") or {})})

    def vendor(self, resources: Iterable[str]) -> str | None:
        """The vendor of the first GPU resource with a known prefix."""
        for name in resources:
            for prefix, vendor in self.vendors.items():
                if name.startswith(prefix):
                    return vendor
        return None
