"""Settings of the Kubernetes backend (no ``kubernetes`` import: the CLI reads the defaults)."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["K8sSettings"]


@dataclass
class K8sSettings:
    """What ``forge k8s render`` (and later the k8s launcher) needs beyond the tasks."""

    image: str = "forge-rollout:latest"
    """The rollout image (k8s_jobs/Dockerfile): Forge, mitmproxy and the harness CLIs."""
    namespace: str = "forge"
    harness: str | None = None
    """Template for every task (each task's ``harness`` otherwise)."""
    n: int = 1
    model: str | None = None
    policy_version: int | None = None
    run_name: str = "forge"
    """Prefix of Job names."""
    ca_secret: str = "forge-ca"
    """Secret with mitmproxy-ca.pem (key and certificate) and mitmproxy-ca-cert.pem."""
    runs_pvc: str = "forge-shards"
    """ReadWriteMany claim where each rollout's shards and rows go (<claim>/<rollout-id>)."""
    transparent: bool = False
    proxy_port: int = 8080
    upstreams: list[str] = field(default_factory=list)
    """forge_upstream redirects for the sidecar (e.g. a policy server)."""
    cpu: str = "4"
    memory: str = "4Gi"
    """Requests per pod (the OpenForgeRL paper ran 4 CPU / 4 GiB per rollout)."""
    ttl_s: int = 3600
    backoff_limit: int = 2
    """Pod retries after infra errors (exit 75) and disruptions."""
    harness_config: str | None = None
    """Path of a harness config file inside the image (FORGE_HARNESS_CONFIG)."""
