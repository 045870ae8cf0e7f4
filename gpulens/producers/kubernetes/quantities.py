"""Kubernetes resource quantities ("250m", "16Gi", "1.5", "100M", "1e3") as exact decimals."""

from __future__ import annotations

import math
import re
from decimal import Decimal

_SUFFIXES: dict[str, Decimal] = {
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "": Decimal(1),
    "k": Decimal("1e3"),
    "M": Decimal("1e6"),
    "G": Decimal("1e9"),
    "T": Decimal("1e12"),
    "P": Decimal("1e15"),
    "E": Decimal("1e18"),
    **{s: Decimal(1024**i) for i, s in enumerate(("Ki", "Mi", "Gi", "Ti", "Pi", "Ei"), start=1)},
}
# The exponent form needs digits ("1e3"); a bare trailing "E" is the exa suffix ("1E").
_QUANTITY = re.compile(
    r"^([+-]?(?:\d+\.?\d*|\.\d+))(?:[eE]([+-]?\d+)|(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E))?$"
)


def parse_quantity(text: str | int | float) -> Decimal:
    """The value of a quantity; :class:`ValueError` when it is not one."""
    if isinstance(text, int | float):
        return Decimal(str(text))
    match = _QUANTITY.match(text.strip())
    if match is None:
        raise ValueError(f"not a Kubernetes quantity: {text!r}")
    number, exponent, suffix = match.groups()
    value = Decimal(number)
    if exponent is not None:
        return value.scaleb(int(exponent))
    return value * _SUFFIXES[suffix or ""]


def milli(text: str | int | float) -> int:
    """The quantity in thousandths, rounded up as Kubernetes' MilliValue does (CPU millicores)."""
    return math.ceil(parse_quantity(text) * 1000)


def whole(text: str | int | float) -> int:
    """The quantity rounded up to an integer (memory bytes)."""
    return math.ceil(parse_quantity(text))
