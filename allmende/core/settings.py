"""All configuration, from environment variables prefixed `ALLMENDE_` (the README's configuration table)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal, Self

from pydantic import AliasChoices, Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from allmende.core.paths import default_state_dir


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="ALLMENDE_", extra="ignore", populate_by_name=True)

    # Every piece of local state below, unless set on its own (allmende.core.paths).
    state_dir: Path = Field(default_factory=default_state_dir)

    # Kafka. KAFKA_BOOTSTRAP_SERVERS (no prefix) wins, as the tests and compose use it.
    kafka_bootstrap_servers: str = Field(
        default="127.0.0.1:19092",
        validation_alias=AliasChoices("KAFKA_BOOTSTRAP_SERVERS", "ALLMENDE_KAFKA_BOOTSTRAP_SERVERS"),
    )
    topic_prefix: str = "allmende"
    topic_partitions: int = Field(default=6, ge=1, le=1000)

    # ClickHouse: `chdb:///path` (embedded, one process owns it) or `http://host:8123`.
    clickhouse_dsn: str = ""  # default: chdb://<state_dir>/chdb
    clickhouse_database: str = "allmende"

    # Ledger writer batching: flush at this many records or after this many milliseconds.
    writer_batch_max: int = Field(default=20_000, ge=1)
    # Each batch is an insert, a part ClickHouse merges later, in the API's process when embedded:
    # a second between inserts keeps the merges, and the admission tail they cause, small.
    writer_batch_wait_ms: int = Field(default=1000, ge=1)
    writer_enabled: bool = True
    writer_group: str = "allmende-ledger-writer"
    # "assign": one writer takes all partitions (embedded chDB). "group": writers share the
    # partitions through a consumer group (ClickHouse server, scaled out).
    writer_mode: Literal["assign", "group"] = "assign"

    # Metering worker (faust).
    meter_app_id: str = "allmende-meter"
    meter_data_dir: Path = Path()  # default: <state_dir>/faust
    # The worker's asyncio loop (faust's F_LOOP, chosen before faust is imported): "uvloop" or "aio".
    meter_loop: Literal["uvloop", "aio"] = "uvloop"

    # HTTP API.
    api_host: str = "127.0.0.1"
    api_port: int = 8000
    # Prometheus /metrics of meter workers and standalone writers (the API serves its own); 0: off.
    metrics_host: str = "127.0.0.1"
    meter_metrics_port: int = Field(default=9102, ge=0, le=65535)
    writer_metrics_port: int = Field(default=9103, ge=0, le=65535)
    collector_metrics_port: int = Field(default=9104, ge=0, le=65535)

    # GPU samples (`allmende collect dcgm`): the firehose is kept this long on its topic (what a
    # replay can rebuild squatting from); the ledger keeps what the meter made of them.
    gpu_samples_retention_days: int = Field(default=30, ge=1, le=3660)

    # Who may do what: admin tokens (comma-separated) may change budgets; `user:token` pairs are
    # project leads, who may read the balances of the projects (and groups) they lead.
    admin_tokens: str = ""
    lead_tokens: str = ""
    scheduler_tokens: str = ""  # the cluster scheduler's own tokens: admission and preemption
    # Submit tokens may only ask for admission (POST /v1/admission): what Slurm's cli_filter sends
    # from users' own sbatch/salloc/srun, so it may be readable by every user of the cluster.
    submit_tokens: str = ""
    # A command-line client's own token (`allmende budget ...`).
    token: str = ""
    # Browser sign-in (docs/security.md): the cookie holds an opaque session id, the session lives in
    # the API process's memory for this long after sign-in (absolute, not sliding), at most this many
    # at once (the oldest go first). A restart of the API signs everyone out.
    session_ttl_s: int = Field(default=8 * 3600, ge=60, le=30 * 86_400)
    session_max: int = Field(default=10_000, ge=1, le=1_000_000)
    # Sign-in through the organisation's identity provider (docs/auth.md); off while no issuer.
    # The pages use the authorization code flow with PKCE as this client; the API also takes the
    # issuer's access tokens (Bearer) whose audience is `oidc_audience`. Who is what comes from one
    # claim (a dotted path, e.g. `realm_access.roles`): a value among `oidc_admin_values` makes an
    # admin, one matching `oidc_lead_pattern` (`{node}`: a project or group id) a lead of that node.
    oidc_issuer: str = ""
    oidc_client_id: str = "allmende-pages"
    oidc_client_secret: str = ""
    oidc_audience: str = "allmende-api"
    oidc_roles_claim: str = "groups"
    oidc_admin_values: str = "/allmende-admins"
    oidc_lead_pattern: str = "/leads/{node}"
    oidc_name_claim: str = "preferred_username"
    oidc_scopes: str = "openid profile email"
    # `allmende login`'s client (the device flow for people; client credentials for scripts).
    oidc_cli_client_id: str = "allmende-cli"
    oidc_cli_client_secret: str = ""
    oidc_clock_skew_s: int = Field(default=30, ge=0, le=600)  # a token's exp/iat/nbf, this much either way
    # Where the browser reaches the API (the redirect URI's base) when a proxy hides it; by default
    # the request's own base URL.
    public_url: str = ""
    # How often the API looks for allocations whose period has ended (expiry, rollover).
    expiry_check_s: float = Field(default=60.0, gt=0)
    # An allocation expires this long after its period ends, and only once the ledger has caught
    # up: jobs that ran across the end report their last usage late.
    expiry_grace_s: int = Field(default=86_400, ge=0)

    # Fair share (Slurm's PriorityDecayHalfLife, PriorityUsageResetPeriod); 0: no decay.
    fairshare_enabled: bool = True
    fairshare_algorithm: Literal["classic", "fair_tree"] = "fair_tree"
    fairshare_half_life_s: int = Field(default=7 * 86_400, ge=0)
    fairshare_reset: Literal["none", "quarterly"] = "none"
    fairshare_publish_s: float = Field(default=10.0, gt=0)
    # How long the API waits at start for the ledger replay behind admission before serving.
    startup_replay_timeout_s: float = Field(default=120.0, ge=0)
    # Checkpoints (allmende/core/checkpoints.py): every this many seconds, once caught up and
    # changed, the fair-share usage is written with the offsets it covers, and a start loads it and
    # reads only the tail. 0: never (every start replays the whole ledger stream).
    checkpoint_every_s: float = Field(default=60.0, ge=0)
    checkpoint_dir: Path = Path()  # default: <state_dir>/checkpoints

    # Kafka away: a write (admission, host report, admin command) not in its log by then is
    # answered 503 and never takes effect; a read waits this long for news, then answers from the
    # last state it has, saying how old that is.
    write_timeout_ms: int = Field(default=250, ge=20, le=60_000)
    # How long a thread may hold the interpreter before another is let in (CPython's default is
    # 5 ms). The API's writers and Kafka clients run on threads beside the event loop; each time
    # the loop wakes for a request it may wait that long for them, several times per request.
    gil_switch_interval_us: int = Field(default=1000, ge=100, le=100_000)
    # The API freezes the survivors of each full collection (allmende/core/gc_pauses.py); this
    # often it unfreezes and collects once in full, so dead cycles frozen meanwhile are freed.
    gc_thaw_every_s: float = Field(default=600.0, ge=1.0)
    read_timeout_ms: int = Field(default=250, ge=10, le=60_000)

    # The meter refuses an event whose instant is further ahead of its clock than this (a node's
    # wrong clock would otherwise charge hours that have not happened); a replay of the past is
    # unaffected.
    clock_skew_s: int = Field(default=300, ge=0)
    # A job that ended this long ago leaves every process's memory (admission, the meter's table
    # and its changelog, fair share's per-entry revisions, the writer's cache): history stays in
    # ClickHouse. An event of a job older than this behind its stream is dead-lettered (`retired`).
    ended_job_retention_s: int = Field(default=7 * 86_400, ge=1)

    # Admission: an admitted job that has not started by then frees its GPUs and its hold.
    admission_enabled: bool = True
    admission_start_deadline_s: int = Field(default=3600, ge=1)
    # Admission tickets (domain/admission_tickets.py): with a key, every admit or queue answer
    # carries the decision signed (HMAC-SHA256), valid this long, for Slurm's job_submit.lua to
    # check locally; the same key goes into its config (`ticket_key_file`). Empty: no tickets.
    admission_ticket_key: str = ""
    admission_ticket_key_file: Path | None = None
    admission_ticket_ttl_s: int = Field(default=300, ge=10, le=86_400)
    # A hot standby: with election on, every API process with the admission role is an instance;
    # the one holding the lease (a consumer-group assignment on `<prefix>.admission-lease`) decides
    # and writes through a transactional producer (a paused old leader's writes are fenced); the
    # others follow the log, answer reads, and refuse writes with 503 `not-leader`. A leader that
    # stops heartbeating for the lease timeout loses the lease (the broker's
    # group.min.session.timeout.ms must allow it; the local broker's does).
    admission_election: bool = False
    admission_lease_timeout_ms: int = Field(default=3000, ge=1000, le=60_000)
    instance_name: str = ""  # this process in logs and the lease's group (default: host:pid)
    interactive_max_gpus_per_user: int = Field(default=8, ge=0)
    interactive_max_hours: int = Field(default=8, ge=0)

    # Squatting: a job whose GPU utilisation stays under this share for longer than the grace
    # period is flagged, with what it has cost so far (domain/squatting.py). At most 25 %: the
    # ledger keeps the pieces under that apart for it (`low_pieces`).
    squat_max_utilization: float = Field(default=0.05, ge=0.0, le=0.25)
    squat_grace_s: int = Field(default=1800, ge=0)
    # A running job past its requested run time by more than this is flagged "overran" on its
    # project's page (charged all the same: the GPUs were held).
    overrun_grace_s: int = Field(default=900, ge=0)
    # How far back from the ledger's clock the alerter looks for clusters run above their capacity.
    capacity_lookback_s: int = Field(default=7 * 86_400, ge=3600)
    # ... and its GPUs go first to a job that needs them (a preemption victim whatever its class,
    # after jobs on unhealthy hosts; never a time-slice or interactive job): domain/preemption.py.
    squat_reclaim: bool = True
    # ... and the burn alerter tells its user and project leads, once per idle stretch, through the
    # alert webhooks (`SquattingFlagged` on `<prefix>.alerts`).
    squat_alerts: bool = True

    # Burn warnings (domain/burn_alerts.py): once per crossing, as an event on `<prefix>.alerts`
    # and a POST of a Slack-compatible body to each webhook URL (comma-separated).
    burn_warning_days_early: int = Field(default=7, ge=0)  # trailing-7-day forecast runs out this early
    burn_warning_budget_shares: str = "0.5,0.8,1.0"  # shares of the budget whose passing warns
    # Reminders this many days before a period's allocations end (comma-separated; empty: none).
    burn_warning_expiry_days: str = "14"
    alerts_enabled: bool = True
    alert_webhook_urls: str = ""
    # Burn warnings and reminders by e-mail too, to the project's leads (services/alert_mail.py):
    # over SMTP at smtp_host (empty: no e-mail); a lead's address from `lead_emails`
    # (`name:address,...`), else `email_address_template` with {name} (e.g. `{name}@example.org`).
    smtp_host: str = ""
    smtp_port: int = Field(default=25, ge=1, le=65535)
    smtp_starttls: bool = False
    smtp_username: str = ""
    smtp_password: str = ""
    smtp_from: str = "allmende@localhost"
    lead_emails: str = ""
    email_address_template: str = ""
    alert_check_s: float = Field(default=60.0, gt=0)

    log_level: str = "INFO"
    log_json: bool = True

    # Local broker started by the project.
    kafka_home: Path = Path()  # default: <state_dir>/kafka
    run_dir: Path = Path()  # default: <state_dir>/run

    @model_validator(mode="after")
    def _under_state_dir(self) -> Self:
        """Paths not set on their own go under `state_dir` (pydantic has no defaults from fields)."""
        derived = {
            "clickhouse_dsn": f"chdb://{self.state_dir / 'chdb'}",
            "meter_data_dir": self.state_dir / "faust",
            "kafka_home": self.state_dir / "kafka",
            "checkpoint_dir": self.state_dir / "checkpoints",
            "run_dir": self.state_dir / "run",
        }
        for name, value in derived.items():
            if name not in self.model_fields_set:
                setattr(self, name, value)
        return self

    def ticket_key(self) -> bytes | None:
        """The admission tickets' signing key (the file's first line wins); None: no tickets."""
        if self.admission_ticket_key_file is not None:
            text = self.admission_ticket_key_file.read_text().strip()
        else:
            text = self.admission_ticket_key.strip()
        return text.encode() if text else None

    def topic(self, name: str) -> str:
        return f"{self.topic_prefix}.{name}"

    @property
    def job_events_topic(self) -> str:
        return self.topic("job-events")

    @property
    def ledger_entries_topic(self) -> str:
        return self.topic("ledger-entries")

    @property
    def admin_events_topic(self) -> str:
        return self.topic("admin-events")

    @property
    def admission_topic(self) -> str:
        return self.topic("admission")

    @property
    def admission_lease_topic(self) -> str:
        return self.topic("admission-lease")

    @property
    def admission_writer_id(self) -> str:
        """The admission log's one transactional id: a new leader's producer fences the last."""
        return self.topic("admission-writer")

    @property
    def fairshare_topic(self) -> str:
        return self.topic("fairshare")

    @property
    def alerts_topic(self) -> str:
        return self.topic("alerts")

    @property
    def dead_letter_topic(self) -> str:
        return self.topic("dead-letter")

    @property
    def gpu_samples_topic(self) -> str:
        return self.topic("gpu-samples")
