"""The Kueue controller's configuration: a YAML file (`--config`, or $ALLMENDE_KUEUE_CONFIG), each
key overridable by an environment variable `ALLMENDE_KUEUE_<KEY>` (a ConfigMap and a Secret in a
Deployment: deploy/kubernetes/).

The mappings must give the lifecycle events the same project, cluster, GPU type and priority class
that admission was asked about: both come from one function (integrations/kueue/workloads.py).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

PriorityClassName = Literal["preemptible", "standard", "non-preemptible"]


class ConfigError(RuntimeError):
    pass


class Flavor(BaseModel):
    """What a Kueue ResourceFlavor is to the platform."""

    model_config = ConfigDict(extra="forbid")
    gpu_type: str
    cluster: str | None = None  # default: the controller's `cluster`


class KueueConfig(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="ALLMENDE_KUEUE_", extra="forbid")

    # the admission API
    api_url: str = "http://127.0.0.1:8000"
    token: str | None = None  # the scheduler's token (ALLMENDE_SCHEDULER_TOKENS)
    token_file: Path | None = None
    timeout_s: float = Field(default=5.0, gt=0)
    # the AdmissionCheck this controller serves (deploy/kubernetes/admission-check.yaml)
    controller_name: str = "allmende.io/budget"
    # where the Kubernetes API is: a kubeconfig file, else the in-cluster service account
    kubeconfig: Path | None = None
    # the platform's view of a workload (labels or annotations on the Workload, else its namespace)
    cluster: str = "kubernetes"
    flavors: dict[str, Flavor] = Field(default_factory=dict)  # ResourceFlavor name -> GPU type
    default_gpu_type: str = "H100"
    gpu_resources: tuple[str, ...] = ("nvidia.com/gpu",)
    project_key: str = "allmende.io/project"
    user_key: str = "allmende.io/user"
    priority_key: str = "allmende.io/priority-class"
    interactive_key: str = "allmende.io/interactive"
    hours_key: str = "allmende.io/requested-hours"
    # Kueue WorkloadPriorityClass name -> the platform's priority class
    priority_classes: dict[str, PriorityClassName] = Field(default_factory=dict)
    default_priority_class: PriorityClassName = "standard"
    project_from_namespace: bool = True  # no label anywhere: the namespace's name is the project
    default_hours: float | None = None  # no maximumExecutionTimeSeconds nor annotation: this, or rejected
    retry_after_s: int = Field(default=60, ge=0)  # a queued workload asks again after this long
    resync_s: float = Field(default=30.0, gt=0)  # every workload looked at again, events or not
    # lifecycle events (the durable spool, then Kafka)
    kafka_bootstrap_servers: str = "127.0.0.1:19092"
    topic_prefix: str = "allmende"
    producer: str = "allmende-kueue"
    spool_dir: Path = Path("/var/lib/allmende-kueue/spool")
    send_timeout_s: float = Field(default=5.0, gt=0)
    # carry out the preemptions the API names (Retry on the victims' workloads)
    preempt: bool = True
    metrics_port: int = Field(default=9105, ge=0, le=65535)  # Prometheus /metrics (0: off)

    @model_validator(mode="after")
    def _token(self) -> KueueConfig:
        if self.token is None and self.token_file is not None:
            try:
                self.token = self.token_file.read_text().strip()
            except OSError as exc:
                raise ValueError(f"token_file {self.token_file}: {exc}") from None
        return self

    def job_events_topic(self) -> str:
        from allmende.core.settings import Settings  # the platform's topic naming

        return Settings(topic_prefix=self.topic_prefix).job_events_topic

    @property
    def bootstrap(self) -> str:
        return os.environ.get("KAFKA_BOOTSTRAP_SERVERS") or self.kafka_bootstrap_servers


def load_config(path: str | os.PathLike[str] | None = None, **overrides: Any) -> KueueConfig:
    """The file's values (if any), the environment's over them, `overrides` over both."""
    explicit = path or os.environ.get("ALLMENDE_KUEUE_CONFIG")
    values: dict[str, Any] = {}
    if explicit:
        try:
            loaded = yaml.safe_load(Path(explicit).read_text())
        except (OSError, yaml.YAMLError) as exc:
            raise ConfigError(f"{explicit}: {exc}") from None
        if not isinstance(loaded, dict):
            raise ConfigError(f"{explicit}: not a mapping")
        values = loaded
    # pydantic-settings: init values win over the environment; the environment should win over the file
    env = KueueConfig.model_config.get("env_prefix", "")
    values = {k: v for k, v in values.items() if f"{env}{k}".upper() not in os.environ}
    try:
        return KueueConfig(**{**values, **{k: v for k, v in overrides.items() if v is not None}})
    except ValidationError as exc:
        raise ConfigError(f"{explicit or 'the environment'}: {exc}") from None
