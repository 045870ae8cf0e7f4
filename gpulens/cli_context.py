"""What every command gets: the settings, loaded lazily so that --help never needs them, and
the flags given on its command line put over them."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TypeVar

import click
from click.core import ParameterSource
from pydantic import BaseModel

from gpulens.config import GPULensSettings, load_settings
from gpulens.schemas.kafka.sharding import Shard

__all__ = ["Context", "ShardType", "pass_context", "with_flags"]

Section = TypeVar("Section", bound=BaseModel)


class Context:
    """The command line's state: where the config file is, and the settings once loaded."""

    def __init__(self, config_file: Path | None) -> None:
        self.config_file = config_file
        self._settings: GPULensSettings | None = None

    @property
    def settings(self) -> GPULensSettings:
        if self._settings is None:
            self._settings = load_settings(self.config_file)
            logging.getLogger().setLevel(self._settings.log_level)
        return self._settings


pass_context = click.make_pass_decorator(Context)


class ShardType(click.ParamType):
    """``I/N``: which of N processes of one consumer group this is."""

    name = "I/N"

    def convert(self, value: object, param: click.Parameter | None, ctx: click.Context | None) -> Shard:
        if isinstance(value, Shard):
            return value
        try:
            return Shard.parse(str(value))
        except ValueError as err:
            self.fail(str(err), param, ctx)


def with_flags(section: Section, ctx: click.Context | None = None) -> Section:
    """``section`` of the settings with the flags given on the command line (of ``ctx``, the
    command running by default) put over it.

    A flag sets the field its parameter is named after; a flag left out keeps what the file or
    the environment says, so its default (shown in --help) never hides either of them.
    """
    ctx = ctx or click.get_current_context()
    given = {
        name: value
        for name, value in ctx.params.items()
        if name in type(section).model_fields
        and ctx.get_parameter_source(name) is ParameterSource.COMMANDLINE
    }
    return section.model_copy(update=given)
