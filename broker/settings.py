"""The broker's one configuration object, read from the environment (prefix ``BROKER_``)."""

from __future__ import annotations

from datetime import datetime
from functools import lru_cache
from pathlib import Path

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from broker.private_files import private_dir


class Settings(BaseSettings):
    """Every knob of the broker; environment variables are ``BROKER_<FIELD>``."""

    model_config = SettingsConfigDict(env_prefix="BROKER_", extra="ignore")

    data_dir: Path = Field(default=Path(".broker"), description="Local folder for embedded state.")
    database_url: str | None = Field(
        default=None, description="SQLAlchemy URL; default: SQLite file in data_dir."
    )
    admin_token: SecretStr | None = None
    agent_secret: SecretStr | None = Field(
        default=None,
        description="Key that per-attempt agent tokens derive from; default: one generated "
        "once and kept in data_dir/agent_secret (set it when workers run on several machines).",
    )
    progress_speed_margin: float = Field(
        default=3.0,
        ge=1,
        description="An agent may report up to this times the predicted speed of its GPUs.",
    )
    progress_skew_seconds: float = Field(
        default=120.0, ge=0, description="Clock skew allowed to agents' reports (broker s)."
    )
    agent_silence_seconds: float = Field(
        default=600.0,
        gt=0,
        description="Broker seconds an agent may be silent (after its boot grace) before its "
        "attempt is declared lost and the job relaunched.",
    )
    agent_boot_grace_seconds: float = Field(
        default=600.0,
        ge=0,
        description="Extra broker seconds an instance has for its agent's first call.",
    )
    agent_report_seconds: float = Field(
        default=60.0,
        gt=0,
        description="Broker seconds between an agent's progress reports (its heartbeat).",
    )
    agent_log_limit_bytes: int = Field(
        default=4 * 1024 * 1024,
        ge=0,
        description="Program output kept per attempt; beyond it one truncation line is kept.",
    )
    agent_log_flush_seconds: float = Field(
        default=2.0, gt=0, description="Wall seconds between an agent's log uploads."
    )

    # Celery
    celery_broker_url: str | None = Field(
        default=None, description="Default: kombu's file-system transport in data_dir."
    )
    celery_result_backend: str | None = None
    celery_queue: str = Field(
        default="broker", max_length=100, description="Queue the broker's tasks go through."
    )
    tick_seconds: float = Field(default=5.0, gt=0, description="Beat interval of tick (wall s).")
    observe_batch_size: int = Field(
        default=100,
        ge=1,
        le=1000,
        description="Live attempts one observe task takes: one describe per region for all.",
    )
    reconcile_seconds: float = Field(default=30.0, gt=0)
    reconcile_min_age_seconds: float = Field(
        default=600.0,
        ge=0,
        description="Broker seconds an unknown tagged instance lives before reconcile ends it.",
    )
    refresh_prices_seconds: float = Field(default=3600.0, gt=0)
    api_threads: int = Field(
        default=8,
        ge=1,
        le=200,
        description="Threads the API runs its database work in (sync routes, authentication "
        "misses, admission).",
    )
    launch_batch_seconds: float = Field(
        default=0.02,
        ge=0,
        le=5,
        description="Wall seconds the API gathers admitted jobs' launches into one task "
        "(0: one task per job, published in the request).",
    )
    key_check_seconds: float = Field(
        default=1.0,
        ge=0,
        description="Wall seconds an API process trusts a team key it checked before checking "
        "it again (a key revoked through another process stops working there within this "
        "time; 0: every request).",
    )
    price_check_seconds: float = Field(
        default=2.0,
        ge=0,
        description="Wall seconds between a process's checks for newly stored prices (0: on "
        "every quote and re-plan).",
    )
    price_history_days: float = Field(
        default=30.0, gt=0, description="Days of price history kept (the current price always)."
    )
    spot_model_refit_seconds: float = Field(
        default=600.0, gt=0, description="Beat interval of the spot model's refit (wall s)."
    )

    # Spend control (broker/services/spend_control.py)
    lease_seconds: float = Field(
        default=600.0, gt=0, description="Spend granted ahead of a running attempt (broker s)."
    )
    lease_ticks: float = Field(
        default=6.0, ge=3, description="... and at least this many ticks of spend ahead."
    )
    max_live_attempts_per_team: int = Field(
        default=32, gt=0, description="Live attempts a team may have; more jobs wait queued."
    )
    max_live_attempts: int = Field(
        default=1000, gt=0, description="Live attempts in the whole broker; more jobs wait."
    )

    # Time
    clock_scale: float = Field(default=1.0, gt=0, description="Simulated seconds per wall second.")
    clock_epoch: datetime | None = Field(
        default=None, description="Wall time at which the scaled clock equals itself."
    )
    clock_schedule: Path | None = Field(
        default=None,
        description="The scaled clock's schedule file (the embedded stack lowers the scale "
        "there when its control loop lags); overrides clock_scale and clock_epoch.",
    )
    loop_lag_file: Path | None = Field(
        default=None,
        description="Where the workers append how late control-loop tasks start (embedded).",
    )

    # Clouds
    aws_endpoint_url: str | None = None
    aws_region: str = "us-east-1"
    aws_access_key_id: str | None = None
    aws_secret_access_key: SecretStr | None = None
    aws_regions: list[str] = Field(default_factory=lambda: ["us-east-1", "us-east-2", "us-west-2"])
    gcp_endpoint_url: str | None = None
    gcp_billing_endpoint_url: str | None = Field(
        default=None, description="Cloud Billing Catalog API endpoint (default: Google's)."
    )
    gcp_project: str = "broker-local"
    gcp_zones: list[str] = Field(
        default_factory=lambda: ["us-central1-a", "us-central1-b", "us-east1-b"]
    )
    # What a real instance is launched with (providers/aws.py, providers/gcp.py)
    aws_image_ids: dict[str, str] = Field(
        default_factory=dict,
        description='AMI per "<region>/<arch>" or "<arch>" (x86_64, arm64); default: the '
        "newest Deep Learning Base OSS Nvidia Driver GPU AMI of the region.",
    )
    aws_image_owners: list[str] = Field(
        default_factory=lambda: ["amazon"],
        description="Owners whose AMIs the default image lookup considers.",
    )
    aws_instance_profile: str | None = Field(
        default=None, description="IAM instance profile (name) the instances run with."
    )
    gcp_image_project: str = "deeplearning-platform-release"
    gcp_image_families: dict[str, str] = Field(
        default_factory=lambda: {"x86_64": "common-cu124-debian-11-py310"},
        description="Deep Learning VM image family per architecture (x86_64, arm64).",
    )
    gcp_service_account: str | None = Field(
        default=None, description="Service account email the instances run as."
    )
    checkpoint_bucket: str = "broker-checkpoints"
    workdir_limit_bytes: int = Field(
        default=64 * 1024 * 1024,
        gt=0,
        description="Largest workdir tar.gz POST /v1/workdirs takes (its body limit).",
    )
    workdir_unpacked_limit_bytes: int = Field(
        default=1024 * 1024 * 1024,
        gt=0,
        description="Most bytes an uploaded workdir may unpack to (its files' sizes summed).",
    )
    log_follow_seconds: float = Field(
        default=3600.0,
        gt=0,
        description="Wall seconds GET /v1/jobs/{id}/logs?follow=true streams at most.",
    )

    # Local cloud
    local_fault_rate: float = Field(default=0.0, ge=0, le=1)

    # API
    api_url: str = "http://127.0.0.1:8000"
    api_token: SecretStr | None = None
    max_body_bytes: int = Field(default=64 * 1024, gt=0)
    header_timeout_seconds: float = Field(
        default=10.0, gt=0, description="Wall seconds a client has to send a request's headers."
    )
    body_timeout_seconds: float = Field(
        default=30.0, gt=0, description="Wall seconds a client has to send a request's body."
    )
    metrics_token: SecretStr | None = Field(
        default=None, description="Bearer token for /metrics' per-team figures (or the admin's)."
    )
    session_secret: SecretStr | None = Field(
        default=None, description="Key that signs dashboard sessions; default: from admin_token."
    )
    session_seconds: float = Field(
        default=12 * 3600.0, gt=0, description="Wall seconds a dashboard login lasts."
    )
    trust_forwarded_proto: bool = Field(
        default=False, description="Believe X-Forwarded-Proto (behind a TLS-ending proxy)."
    )
    log_format: str = Field(default="text", pattern="^(text|json)$")
    log_level: str = Field(
        default="INFO",
        pattern="(?i)^(debug|info|warning|error|critical)$",
        description="The API's log level (a Celery worker takes its --loglevel).",
    )

    # Metrics
    metrics_dir: Path | None = Field(
        default=None,
        description="prometheus_client's per-process files; default: data_dir/metrics.",
    )

    # The policy's solved plans, shared by the processes of one machine (a cache)
    plan_store_dir: Path | None = Field(
        default=None,
        description="Folder of the policy's solved plans (one file each); default: data_dir/plans.",
    )

    # Liveness (GET /healthz)
    heartbeat_seconds: float = Field(
        default=10.0, gt=0, description="Beat's heartbeat and the API's probe interval (wall s)."
    )
    liveness_timeout_seconds: float = Field(
        default=60.0, gt=0, description="Silence after which a worker or beat counts as dead."
    )

    # Test-only fault point: the name of a lifecycle step at which the worker exits.
    fault_point: str | None = None

    @field_validator("clock_epoch")
    @classmethod
    def _epoch_aware(cls, value: datetime | None) -> datetime | None:
        if value is not None and value.tzinfo is None:
            raise ValueError("clock_epoch must carry a UTC offset")
        return value

    @property
    def resolved_database_url(self) -> str:
        """The database URL, defaulting to a SQLite file in ``data_dir``."""
        if self.database_url:
            return self.database_url
        return f"sqlite:///{(self.data_dir / 'broker.db').resolve()}"

    @property
    def celery_control_queue(self) -> str:
        """The queue of the beat's tasks (tick, reconcile, price refresh)."""
        return self.celery_queue + ".control"

    @property
    def celery_observe_queue(self) -> str:
        """The queue of the tick's observations, apart from launches and terminations, so a
        backlog of launches never holds up watching what runs."""
        return self.celery_queue + ".observe"

    @property
    def resolved_plan_store_dir(self) -> Path:
        """The folder of the policy's shared plans, defaulting to ``data_dir/plans``."""
        return (self.plan_store_dir or self.data_dir / "plans").resolve()

    @property
    def resolved_metrics_dir(self) -> Path:
        """The folder of the processes' metric files, defaulting to ``data_dir/metrics``."""
        return (self.metrics_dir or self.data_dir / "metrics").resolve()

    @property
    def resolved_celery_broker_url(self) -> str:
        """The Celery broker URL, defaulting to kombu's file-system transport in ``data_dir``."""
        return self.celery_broker_url or "filesystem://"

    @property
    def celery_transport(self) -> str | None:
        """The kombu transport class for the broker URL (None: the URL's own)."""
        if self.resolved_celery_broker_url.startswith("filesystem://"):
            return "broker.devstack.fs_transport:Transport"  # fs_transport.TRANSPORT_PATH
        return None

    def celery_transport_options(self) -> dict[str, object]:
        """Transport options for the broker URL (the file-system transport's folders)."""
        if not self.resolved_celery_broker_url.startswith("filesystem://"):
            return {}
        queue = (self.data_dir / "celery" / "queue").resolve()
        control = (self.data_dir / "celery" / "control").resolve()
        for folder in (queue, control):
            private_dir(folder)
        return {
            "data_folder_in": str(queue),
            "data_folder_out": str(queue),
            "control_folder": str(control),
            "polling_interval": 0.1,
        }


@lru_cache
def get_settings() -> Settings:
    """The process-wide settings (cached; tests clear the cache to change them)."""
    return Settings()
