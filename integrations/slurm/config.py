"""The integration's configuration: one JSON file shared by job_submit.lua and the hooks.

Found at the first of: $ALLMENDE_SLURM_CONFIG; allmende.json next to $SLURM_CONF;
/etc/slurm/allmende.json. The mappings here must give the hooks the same project, cluster, GPU
type and priority class that job_submit.lua asked the admission API about (same keys, same
defaults as DEFAULTS in job_submit.lua).
"""

from __future__ import annotations

import contextlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DEFAULT_PATH = Path("/etc/slurm/allmende.json")


class ConfigError(RuntimeError):
    pass


@dataclass(frozen=True)
class SlurmConfig:
    path: Path | None = None
    # admission (cli_filter.lua, job_submit.lua; listed here so one file describes all)
    api_url: str = "http://127.0.0.1:8000"
    api_urls: tuple[str, ...] = ()  # every admission instance (default: api_url)
    token: str | None = None
    submit_token: str | None = None  # cli_filter's: may only ask for admission
    ticket_key_file: Path | None = None  # job_submit.lua checks admission tickets with it
    timeout_s: float = 2.0
    fail_open: bool = False
    dry_run: bool = False
    id_field: str = "admin_comment"
    # mappings (shared with job_submit.lua)
    clusters: dict[str, str] = field(default_factory=dict)  # partition -> platform cluster
    projects: dict[str, str] = field(default_factory=dict)  # account -> project
    gpu_types: dict[str, str] = field(default_factory=dict)  # Slurm GRES type -> platform GPU type
    default_gpu_types: dict[str, str] = field(default_factory=dict)  # platform cluster -> GPU type
    default_gpu_type: str = "H100"
    priority_classes: dict[str, str] = field(
        default_factory=lambda: {
            "preemptible": "preemptible",
            "normal": "standard",
            "high": "non-preemptible",
        }
    )
    default_priority_class: str = "standard"
    default_qos: str = "normal"
    interactive_qos: tuple[str, ...] = ()
    default_hours: float = 1.0
    # lifecycle events (the hooks)
    kafka_bootstrap_servers: str = "127.0.0.1:19092"
    topic_prefix: str = "allmende"
    producer: str = "allmende-slurm"
    spool_dir: Path = Path("/var/spool/slurm/allmende")
    log_file: Path | None = None  # default: <spool_dir>/hooks.log
    send_timeout_s: float = 5.0
    scontrol: str = "scontrol"
    sacct: str = "sacct"
    # the agent (integrations/slurm/agent.py)
    preemptible_qos: str = "preemptible"
    agent_interval_s: float = 30.0
    agent_timeout_s: float = 10.0
    agent_log_file: Path | None = None  # default: <spool_dir>/agent.log
    agent_requeue: bool = True  # requeue the jobs on a node drained or down with a reason
    agent_release: bool = True  # ask again about queued jobs; release, cancel or leave them
    agent_preempt: bool = True  # carry out the preemptions the API names for pending jobs
    preempt_action: str = "requeue"  # what happens to a victim: "requeue" or "cancel"
    # pending jobs' Nice = -round(fair-share factor x scale) (0: leave Nice alone); see docs/slurm.md
    fairshare_nice_scale: int = 10_000
    sinfo: str = "sinfo"
    squeue: str = "squeue"
    scancel: str = "scancel"

    # -- the mappings, as job_submit.lua applies them ------------------------------------------
    def cluster_of(self, partition: str) -> str:
        first = partition.split(",")[0] if partition else ""
        return self.clusters.get(first, first or "unknown")

    def project_of(self, account: str) -> str:
        return self.projects.get(account, account or "unknown")

    def gpu_type_of(self, slurm_type: str | None, cluster: str) -> str:
        if slurm_type:
            return self.gpu_types.get(slurm_type, slurm_type)
        return self.default_gpu_types.get(cluster, self.default_gpu_type)

    def priority_class_of(self, qos: str | None) -> str:
        return self.priority_classes.get(qos or self.default_qos, self.default_priority_class)

    def job_events_topic(self) -> str:
        from allmende.core.settings import Settings  # the platform's topic naming

        return Settings(topic_prefix=self.topic_prefix).job_events_topic

    @property
    def bootstrap(self) -> str:
        return os.environ.get("KAFKA_BOOTSTRAP_SERVERS") or self.kafka_bootstrap_servers

    @property
    def hook_log(self) -> Path:
        return self.log_file or self.spool_dir / "hooks.log"

    @property
    def agent_log(self) -> Path:
        return self.agent_log_file or self.spool_dir / "agent.log"


def config_path(explicit: str | os.PathLike[str] | None = None) -> Path:
    if explicit:
        return Path(explicit)
    if env := os.environ.get("ALLMENDE_SLURM_CONFIG"):
        return Path(env)
    if conf := os.environ.get("SLURM_CONF"):
        candidate = Path(conf).parent / "allmende.json"
        if candidate.exists():
            return candidate
    return DEFAULT_PATH


_PATHS = {"spool_dir", "log_file", "agent_log_file", "ticket_key_file"}
_TUPLES = {"interactive_qos", "api_urls"}
PREEMPT_ACTIONS = ("requeue", "cancel")
MAX_NICE_SCALE = 1_000_000  # Slurm's Nice range is about +-2^31; priorities stay far from overflow


def load_config(explicit: str | os.PathLike[str] | None = None) -> SlurmConfig:
    path = config_path(explicit)
    try:
        data: dict[str, Any] = json.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"no configuration file at {path}") from None
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{path}: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: not a JSON object")
    known = set(SlurmConfig.__dataclass_fields__) - {"path"}
    values: dict[str, Any] = {"path": path}
    for key, value in data.items():
        if key not in known or value is None:
            continue  # keys for job_submit.lua only, comments ("_..."), nulls
        if key in _PATHS:
            value = Path(value)
        elif key in _TUPLES:
            value = tuple(value)
        values[key] = value
    if "spool_dir" not in values and (state := os.environ.get("ALLMENDE_SLURM_DIR")):
        values["spool_dir"] = Path(state) / "allmende-spool"
    for key in ("token", "submit_token"):
        if not values.get(key) and (token_file := data.get(f"{key}_file")):
            with contextlib.suppress(OSError):
                values[key] = Path(token_file).read_text().strip()
    if values.get("preempt_action", "requeue") not in PREEMPT_ACTIONS:
        raise ConfigError(f"{path}: preempt_action must be one of {', '.join(PREEMPT_ACTIONS)}")
    scale = values.get("fairshare_nice_scale", 0)
    if not isinstance(scale, int) or not 0 <= scale <= MAX_NICE_SCALE:
        raise ConfigError(f"{path}: fairshare_nice_scale must be an integer from 0 to {MAX_NICE_SCALE:,}")
    return SlurmConfig(**values)
