"""What a model asks of its values beyond their Avro types, as the wire's two compilers read it.

The generated reader (:mod:`gpulens.schemas.wire.compiled_reader`) and the shapes of
:mod:`gpulens.schemas.wire.publishable` both stand in for ``model_validate``, so both must see
the same rules: a field's constraints however they are written (on the field, in ``Annotated``
layers, repeated), the model's refusal of NaN and infinities, and whether custom validators
make the model something neither can check (they then give up on it, and the exact path
decides).
"""

from __future__ import annotations

import typing
from collections.abc import Sequence
from typing import Any

from pydantic import AfterValidator, BaseModel

from gpulens.schemas.model.models import Timestamp

__all__ = ["has_validators", "refuses_nan", "split"]

_TIMESTAMP_NORMALISER = next(m for m in typing.get_args(Timestamp)[1:] if isinstance(m, AfterValidator))
"""The AfterValidator of Timestamp: UTC, whole milliseconds, which an Avro timestamp-millis read
as such already is (its bounds are ``Ge``/``Lt`` constraints, checked as any other)."""


def split(hint: Any, checks: Sequence[Any] = ()) -> tuple[Any, list[Any]]:
    """``hint`` without its ``Annotated`` layers, and the constraints of those layers and
    ``checks``, each once (a field's own can repeat those of its Annotated type: pydantic merges
    both), without Timestamp's normaliser, which is no constraint; any other validator stays,
    for the compilers to give up on."""
    found = list(checks)
    while typing.get_origin(hint) is typing.Annotated:
        found += hint.__metadata__
        hint = typing.get_args(hint)[0]
    unique: list[Any] = []
    for check in found:
        if check not in unique and check is not _TIMESTAMP_NORMALISER:
            unique.append(check)
    return hint, unique


def has_validators(model: type[BaseModel]) -> bool:
    """Whether ``model`` runs validators of its own (on fields or on the whole)."""
    decorators = model.__pydantic_decorators__
    return bool(
        decorators.validators
        or decorators.field_validators
        or decorators.root_validators
        or decorators.model_validators
    )


def refuses_nan(model: type[BaseModel]) -> bool:
    """Whether ``model`` refuses NaN and infinities in its float fields (its config says so)."""
    return model.model_config.get("allow_inf_nan") is False
