"""All settings, from a TOML file and ``GPULENS_*`` environment variables (environment wins).

Nested groups use ``__`` in variable names: ``GPULENS_KAFKA__BOOTSTRAP_SERVERS=host:9092``
is ``[kafka] bootstrap_servers = "host:9092"`` in the file. Errors name the setting, both
ways of setting it, and what is wrong.
"""

from __future__ import annotations

import os
import tomllib
from contextvars import ContextVar
from pathlib import Path

from pydantic import Field, ValidationError
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    SettingsError,
    TomlConfigSettingsSource,
)

from gpulens.api.settings import ApiSettings
from gpulens.consumers.clickhouse.settings import ClickHouseSettings, SinkSettings
from gpulens.consumers.prometheus.settings import ExporterSettings
from gpulens.infra.settings import PlatformSettings, RetentionSettings
from gpulens.pipeline.settings import PipelineSettings
from gpulens.producers.agent.settings import AgentSettings
from gpulens.producers.gateway.settings import GatewaySettings
from gpulens.producers.kubernetes.settings import WatcherSettings
from gpulens.schemas.kafka.settings import KafkaSettings, RegistrySettings
from gpulens.schemas.model.exceptions import ConfigError

ENV_PREFIX = "GPULENS_"
_config_file: ContextVar[Path | None] = ContextVar("gpulens_config_file", default=None)


class GPULensSettings(BaseSettings):
    """Everything GPULens can be told."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX, env_nested_delimiter="__", extra="forbid", frozen=True
    )

    cluster: str = Field(default="default", min_length=1, description="Name of the cluster watched.")
    log_level: str = Field(default="INFO", pattern=r"^(DEBUG|INFO|WARNING|ERROR)$", description="Log level.")
    kafka: KafkaSettings = Field(default_factory=KafkaSettings)
    registry: RegistrySettings = Field(default_factory=RegistrySettings)
    clickhouse: ClickHouseSettings = Field(default_factory=ClickHouseSettings)
    sink: SinkSettings = Field(default_factory=SinkSettings)
    exporter: ExporterSettings = Field(default_factory=ExporterSettings)
    pipeline: PipelineSettings = Field(default_factory=PipelineSettings)
    platform: PlatformSettings = Field(default_factory=PlatformSettings)
    retention: RetentionSettings = Field(default_factory=RetentionSettings)
    watcher: WatcherSettings = Field(default_factory=WatcherSettings)
    agent: AgentSettings = Field(default_factory=AgentSettings)
    gateway: GatewaySettings = Field(default_factory=GatewaySettings)
    api: ApiSettings = Field(default_factory=ApiSettings)

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        path = _config_file.get()
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        if path is not None:
            sources.append(TomlConfigSettingsSource(settings_cls, toml_file=path))
        return tuple(sources)

    @property
    def chdb_path(self) -> Path:
        """Data directory of the embedded ClickHouse engine."""
        return self.clickhouse.embedded_path or self.platform.state_dir / "clickhouse"


def load_settings(config_file: Path | None = None) -> GPULensSettings:
    """Settings from ``config_file`` (if any) and the environment; :class:`ConfigError` if invalid."""
    if config_file is not None:
        if not config_file.is_file():
            raise ConfigError(f"config file {config_file} does not exist")
        try:
            tomllib.loads(config_file.read_text())
        except tomllib.TOMLDecodeError as err:
            raise ConfigError(f"config file {config_file} is not valid TOML: {err}") from err
    token = _config_file.set(config_file)
    try:
        return GPULensSettings()
    except ValidationError as err:
        raise ConfigError(_explain(err, config_file)) from err
    except SettingsError as err:  # a variable pydantic-settings could not even parse (JSON)
        raise ConfigError(_unparsable(err)) from err
    finally:
        _config_file.reset(token)


def _explain(err: ValidationError, config_file: Path | None) -> str:
    lines = ["invalid settings:"]
    for problem in err.errors():
        loc = problem["loc"]
        # a setting ends where a list begins: pipeline.processors[1] is set as pipeline.processors
        end = next((i for i, part in enumerate(loc) if isinstance(part, int)), len(loc))
        path = [str(p) for p in loc[:end]]
        dotted = ".".join(path) + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc[end:])
        env = ENV_PREFIX + "__".join(path).upper()
        where = f"{env}" + (f" or {_toml_name(path)} in {config_file}" if config_file else "")
        value = problem.get("input")
        shown = "" if isinstance(value, dict) else f" (got {value!r})"
        lines.append(f"  {dotted}: {problem['msg']}{shown}; set {where}")
    return "\n".join(lines)


def _unparsable(err: SettingsError) -> str:
    """The variables of the section pydantic-settings names, and what their value must be."""
    section = str(err).split('"')[1] if str(err).count('"') >= 2 else ""
    prefix = f"{ENV_PREFIX}{section.upper()}__"
    named = sorted(name for name in os.environ if name.startswith(prefix)) or [f"{prefix}*"]
    return (
        f"invalid settings: {', '.join(named)}: a list or table value must be JSON, "
        f'e.g. {prefix}NAME=\'["a", "b"]\' ({err.__cause__ or err})'
    )


def _toml_name(path: list[str]) -> str:
    return f"[{'.'.join(path[:-1])}] {path[-1]}" if len(path) > 1 else path[0]
