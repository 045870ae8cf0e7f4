"""What every command gets: the settings, loaded lazily so that --help never needs them."""

from __future__ import annotations

import logging
from pathlib import Path

import click

from gpulens.config import GPULensSettings, load_settings
from gpulens.schemas.kafka.sharding import Shard

__all__ = ["Context", "ShardType", "pass_context"]


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
