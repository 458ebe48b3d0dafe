"""The whole configuration: every section, and where settings come from."""

from __future__ import annotations

from pydantic import Field, field_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from streamrec.config.consumer import ConsumerConfig
from streamrec.config.kafka import KafkaConfig
from streamrec.config.learner import LearnerConfig
from streamrec.config.model import ModelConfig
from streamrec.config.services import ServicesConfig
from streamrec.config.serving import ServingConfig
from streamrec.config.store import RedisStoreConfig, StoreConfig
from streamrec.features.schema import FeatureSchema, FeatureSpec


class StreamrecConfig(BaseSettings):
    """The whole configuration; every component takes its own section."""

    model_config = SettingsConfigDict(
        env_prefix="STREAMREC_",
        env_nested_delimiter="__",
        toml_file="streamrec.toml",
        frozen=True,
        extra="forbid",
        env_parse_none_str="null",  # STREAMREC_CONSUMER__ALLOWED_LATENESS_MS=null: off
    )

    log_level: str = Field("INFO", description="STREAMREC_LOG_LEVEL")
    kafka: KafkaConfig = KafkaConfig()
    store: StoreConfig = RedisStoreConfig()
    consumer: ConsumerConfig = ConsumerConfig()
    model: ModelConfig = ModelConfig()
    learner: LearnerConfig = LearnerConfig()
    services: ServicesConfig = ServicesConfig()
    serving: ServingConfig = ServingConfig()
    # The features beyond item and category, in order (streamrec.features): a JSON list in
    # STREAMREC_FEATURES, or [[features]] tables in streamrec.toml.
    features: tuple[FeatureSpec, ...] = Field((), description="STREAMREC_FEATURES")

    @field_validator("log_level")
    @classmethod
    def _a_level(cls, level: str) -> str:
        known = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
        if level.upper() not in known:
            raise ValueError(f"{level!r} is no log level: one of {', '.join(known)}")
        return level.upper()

    @field_validator("features")
    @classmethod
    def _schema_holds(cls, features: tuple[FeatureSpec, ...]) -> tuple[FeatureSpec, ...]:
        FeatureSchema.of(features)  # two features with one name or one field: refused here, named
        return features

    def feature_schema(self) -> FeatureSchema:
        """The deployment's feature schema: item and category, then ``features``."""
        return FeatureSchema.of(self.features)

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """Precedence: explicit arguments, then env vars, then ``streamrec.toml``."""
        return init_settings, env_settings, TomlConfigSettingsSource(settings_cls)
