"""The local stack: Redis, the simulator pods, the collector, the picker and Envoy, started in that order.

Each stage waits until its process is ready; if one fails, everything already started is stopped and
:class:`StackError` says which process failed and shows its last lines. The stack writes, in its run
dir, the config the services read (the user's config with this stack's ports and Redis substituted),
the Envoy bootstrap, and one log file per process.
"""

from __future__ import annotations

import ipaddress
import os
import shutil
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import TracebackType
from typing import Any

import httpx
import yaml

from pointsman_devstack import envoy
from pointsman_devstack.errors import StackError
from pointsman_devstack.ports import free_port
from pointsman_devstack.process import Echo, ManagedProcess
from pointsman_devstack.readiness import all_ready, grpc_serving, http_ok, wait_ready
from pointsman_devstack.redis_server import RedisServer, start_redis
from pointsman_shared.config import PointsmanConfig, join_host_port, load_config, split_host_port

LOOPBACK = "127.0.0.1"


@dataclass(frozen=True)
class StackPorts:
    """Every port the stack listens on (all on loopback)."""

    gateway: int
    envoy_admin: int
    pods: tuple[int, ...]
    collector: int
    picker: int
    picker_health: int
    picker_metrics: int
    # Replicas beyond the first: (ext_proc, health, metrics) ports each; all behind the one Envoy.
    more_pickers: tuple[tuple[int, int, int], ...] = ()

    @classmethod
    def from_config(
        cls,
        config: PointsmanConfig,
        *,
        gateway: int = envoy.DEFAULT_GATEWAY_PORT,
        envoy_admin: int = envoy.DEFAULT_ADMIN_PORT,
    ) -> StackPorts:
        """The ports the config file names (``make run``)."""
        return cls(
            gateway=gateway,
            envoy_admin=envoy_admin,
            pods=tuple(split_host_port(e)[1] for e in config.pool.endpoints),
            collector=split_host_port(config.collector.listen)[1],
            picker=split_host_port(config.picker.listen)[1],
            picker_health=split_host_port(config.picker.health_listen)[1],
            picker_metrics=split_host_port(config.picker.metrics_listen)[1],
        )

    @classmethod
    def free(cls, pod_count: int, picker_replicas: int = 1) -> StackPorts:
        """Ports nobody listens on now, so tests can run beside a `make run` stack."""
        return cls(
            gateway=free_port(),
            envoy_admin=free_port(),
            pods=tuple(free_port() for _ in range(pod_count)),
            collector=free_port(),
            picker=free_port(),
            picker_health=free_port(),
            picker_metrics=free_port(),
            more_pickers=tuple((free_port(), free_port(), free_port()) for _ in range(picker_replicas - 1)),
        )

    @property
    def pickers(self) -> tuple[tuple[int, int, int], ...]:
        """(ext_proc, health, metrics) of every picker replica, the first one first."""
        return ((self.picker, self.picker_health, self.picker_metrics), *self.more_pickers)

    def table(self) -> list[tuple[str, int]]:
        rows = [("gateway (Envoy)", self.gateway), ("Envoy admin", self.envoy_admin)]
        rows += [(f"pod {i}", port) for i, port in enumerate(self.pods)]
        rows += [
            ("collector HTTP", self.collector),
            ("picker ext_proc", self.picker),
            ("picker health", self.picker_health),
            ("picker metrics", self.picker_metrics),
        ]
        for i, (ext_proc, health, metrics) in enumerate(self.more_pickers, start=2):
            rows += [
                (f"picker {i} ext_proc", ext_proc),
                (f"picker {i} health", health),
                (f"picker {i} metrics", metrics),
            ]
        return rows


@dataclass(frozen=True)
class SimOptions:
    """What the simulator pods serve. ``None`` leaves the simulator's own default."""

    model: str
    adapters: tuple[str, ...]
    max_loras: int | None = None
    max_num_seqs: int | None = None
    speedup: float | None = None

    @classmethod
    def for_config(
        cls,
        config: PointsmanConfig,
        *,
        model: str | None = None,
        adapters: Sequence[str] | None = None,
        max_loras: int | None = None,
        max_num_seqs: int | None = None,
        speedup: float | None = None,
    ) -> SimOptions:
        base, served = served_models(config)
        return cls(
            model=model or base,
            adapters=tuple(adapters) if adapters is not None else served,
            max_loras=max_loras,
            max_num_seqs=max_num_seqs,
            speedup=speedup,
        )


def served_models(config: PointsmanConfig) -> tuple[str, tuple[str, ...]]:
    """The base model and the adapters a pool must serve for ``config``'s models to resolve.

    The first model without targetModels is the base; every other name a request can resolve to (the
    targets, and the other models without targets) is an adapter.
    """
    untargeted = [m.model_name for m in config.models if not m.target_models]
    if not untargeted:
        raise StackError("the config names no base model: give one model without targetModels")
    base = untargeted[0]
    adapters: list[str] = []
    for model in config.models:
        names = [t.name for t in model.target_models] or [model.model_name]
        adapters += [n for n in names if n != base and n not in adapters]
    return base, tuple(adapters)


def pod_host(config: PointsmanConfig) -> str:
    """The one loopback IP all of ``pool.endpoints`` use; the local stack runs those pods itself."""
    if not config.pool.endpoints:
        raise StackError("pool.endpoints is empty: list the simulator pods, e.g. 127.0.0.1:8001")
    hosts = {split_host_port(e)[0] for e in config.pool.endpoints}
    host = hosts.pop()
    if hosts:
        raise StackError("pool.endpoints: the local stack runs every pod in one process, on one host")
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        # Envoy's ORIGINAL_DST cluster parses the destination header as an IP, never a name.
        raise StackError(f"pool.endpoints: {host!r} is not an IP address; write 127.0.0.1") from None
    if not loopback:
        raise StackError(f"pool.endpoints: {host} is not loopback; the local stack runs its pods locally")
    return host


def derive_config(config: PointsmanConfig, ports: StackPorts, redis_url: str, host: str) -> dict[str, Any]:
    """``config`` as a document, with this stack's endpoints, listen addresses and Redis."""
    doc = config.model_dump(mode="json", by_alias=True, exclude_none=True)
    doc["pool"]["endpoints"] = [join_host_port(host, port) for port in ports.pods]
    doc["collector"]["listen"] = join_host_port(LOOPBACK, ports.collector)
    doc["picker"]["listen"] = join_host_port(LOOPBACK, ports.picker)
    doc["picker"]["healthListen"] = join_host_port(LOOPBACK, ports.picker_health)
    doc["picker"]["metricsListen"] = join_host_port(LOOPBACK, ports.picker_metrics)
    doc["redis"]["url"] = redis_url
    return doc


@dataclass(frozen=True)
class StackOptions:
    config_path: Path
    run_dir: Path
    # None: the ports the config file names, Envoy on 8080 (admin 9901).
    ports: StackPorts | None = None
    # None: SimOptions.for_config(config).
    sim: SimOptions | None = None
    # The environment the services inherit (thresholds, REDIS_URL); start_redis honours REDIS_URL too.
    environ: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))
    allow_docker: bool = True
    envoy_concurrency: int | None = 2
    envoy_log_level: str = "warning"
    startup_timeout: float = 30.0
    stop_grace: float = 5.0


class Stack:
    """Start with :meth:`start` (or ``with Stack(...) as stack``); :meth:`stop` is idempotent."""

    def __init__(self, options: StackOptions, *, echo: Echo | None = None) -> None:
        self.options = options
        self.run_dir = options.run_dir
        self._echo = echo
        self._config = load_config(options.config_path, environ={})
        self.host = pod_host(self._config)
        self.ports = options.ports or StackPorts.from_config(self._config)
        if len(self.ports.pods) != len(self._config.pool.endpoints):
            raise StackError(
                f"{len(self.ports.pods)} pod ports for {len(self._config.pool.endpoints)} pool.endpoints"
            )
        self.sim = options.sim or SimOptions.for_config(self._config)
        self.config_file = self.run_dir / "pointsman.yaml"
        self.envoy_file = self.run_dir / "envoy.yaml"
        self.redis: RedisServer | None = None
        self._processes: list[ManagedProcess] = []

    # -- addresses -----------------------------------------------------------------------------------
    @property
    def gateway_url(self) -> str:
        return f"http://{join_host_port(LOOPBACK, self.ports.gateway)}"

    @property
    def collector_url(self) -> str:
        return f"http://{join_host_port(LOOPBACK, self.ports.collector)}"

    @property
    def admin_url(self) -> str:
        return f"http://{join_host_port(LOOPBACK, self.ports.envoy_admin)}"

    @property
    def pod_addresses(self) -> tuple[str, ...]:
        """``ip:port`` of each pod, as the picker names them in the destination header."""
        return tuple(join_host_port(self.host, port) for port in self.ports.pods)

    @property
    def redis_url(self) -> str:
        if self.redis is None:
            raise StackError("the stack is not started")
        return self.redis.url

    @property
    def processes(self) -> tuple[ManagedProcess, ...]:
        return tuple(self._processes)

    # -- lifecycle -----------------------------------------------------------------------------------
    def __enter__(self) -> Stack:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def start(self) -> None:
        if self.redis is not None or self._processes:
            raise StackError("the stack is already started")
        self.run_dir.mkdir(parents=True, exist_ok=True)
        try:
            self._start_all()
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """Stop every process in reverse start order, then Redis. Safe to call any number of times."""
        # Each is forgotten only once stopped: a stop() cut short by a signal can be called again.
        while self._processes:
            self._processes[-1].stop(self.options.stop_grace)
            self._processes.pop()
        if self.redis is not None:
            self.redis.stop()
            self.redis = None

    def check(self) -> None:
        """Raise :class:`StackError` if a process has exited since it started."""
        for process in self._processes:
            code = process.returncode
            if code is not None:
                raise process.error(f"{process.name} exited with code {code}")

    def _start_all(self) -> None:
        env = dict(self.options.environ)
        self.redis = start_redis(env, allow_docker=self.options.allow_docker)
        # The services prefer REDIS_URL over the config file; point it at this stack's Redis.
        env["REDIS_URL"] = self.redis.url
        # Python children buffer stdout in a pipe; unbuffered, their log lines arrive as they happen.
        env["PYTHONUNBUFFERED"] = "1"
        derived = derive_config(self._config, self.ports, self.redis.url, self.host)
        self.config_file.write_text(yaml.safe_dump(derived, sort_keys=False), encoding="utf-8")
        # Each further picker replica gets the same config with its own listen ports.
        replica_files = [self.config_file]
        for i, (ext_proc, health, metrics) in enumerate(self.ports.more_pickers, start=2):
            derived["picker"]["listen"] = join_host_port(LOOPBACK, ext_proc)
            derived["picker"]["healthListen"] = join_host_port(LOOPBACK, health)
            derived["picker"]["metricsListen"] = join_host_port(LOOPBACK, metrics)
            path = self.run_dir / f"pointsman-picker-{i}.yaml"
            path.write_text(yaml.safe_dump(derived, sort_keys=False), encoding="utf-8")
            replica_files.append(path)
        envoy_options = envoy.EnvoyOptions.from_config(
            load_config(self.config_file, environ={}),
            gateway_listen=join_host_port(LOOPBACK, self.ports.gateway),
            admin_listen=join_host_port(LOOPBACK, self.ports.envoy_admin),
        )
        pickers = tuple(join_host_port(LOOPBACK, ports[0]) for ports in self.ports.pickers)
        envoy.write_bootstrap(replace(envoy_options, pickers=pickers), self.envoy_file)

        timeout = self.options.startup_timeout
        with httpx.Client(timeout=1.0) as client:
            sim = self._spawn("sim", [_console_script("pointsman-sim"), *self._sim_args()], env)
            pods = [http_ok(client, f"http://{address}/health") for address in self.pod_addresses]
            wait_ready(sim, all_ready(pods), timeout=timeout, what="every pod answering /health")

            config = ["--config", str(self.config_file)]
            collector = self._spawn("collector", [_console_script("pointsman-collector"), *config], env)
            ready = http_ok(client, f"{self.collector_url}/readyz")
            wait_ready(
                collector, ready, timeout=timeout, what="/readyz 200 (Redis reached, a snapshot published)"
            )

            for i, (path, ports) in enumerate(zip(replica_files, self.ports.pickers, strict=True)):
                name = "picker" if i == 0 else f"picker-{i + 1}"
                argv = [_console_script("pointsman-picker"), "--config", str(path)]
                picker = self._spawn(name, argv, env)
                serving = grpc_serving(join_host_port(LOOPBACK, ports[1]))
                wait_ready(picker, serving, timeout=timeout, what="gRPC health SERVING")

            envoy_args = ["-c", str(self.envoy_file), "--log-level", self.options.envoy_log_level]
            # Hot restart would make every Envoy on this machine share one shared-memory region: the
            # second stack (tests beside `make run`) fails with "unable to bind domain socket".
            envoy_args.append("--disable-hot-restart")
            if self.options.envoy_concurrency is not None:
                envoy_args += ["--concurrency", str(self.options.envoy_concurrency)]
            proxy = self._spawn("envoy", [envoy.find_envoy(), *envoy_args], env)
            wait_ready(
                proxy, http_ok(client, f"{self.admin_url}/ready"), timeout=timeout, what="admin /ready"
            )

    def _sim_args(self) -> list[str]:
        sim = self.sim
        args = [
            "--host",
            self.host,
            "--ports",
            ",".join(str(p) for p in self.ports.pods),
            "--model",
            sim.model,
        ]
        if sim.adapters:
            args += ["--adapters", ",".join(sim.adapters)]
        if sim.max_loras is not None:
            args += ["--max-loras", str(sim.max_loras)]
        if sim.max_num_seqs is not None:
            args += ["--max-num-seqs", str(sim.max_num_seqs)]
        if sim.speedup is not None:
            args += ["--speedup", f"{sim.speedup:g}"]
        return args

    def _spawn(self, name: str, argv: list[str], env: Mapping[str, str]) -> ManagedProcess:
        process = ManagedProcess(name, argv, env=env, log_path=self.run_dir / f"{name}.log", echo=self._echo)
        self._processes.append(process)
        return process


def _console_script(name: str) -> str:
    """A console script of this virtualenv (``make install`` puts them beside the interpreter)."""
    beside = Path(sys.executable).parent / name
    if beside.is_file():
        return str(beside)
    found = shutil.which(name)
    if found is None:
        raise StackError(f"{name} is not installed: run `make install`")
    return found


def default_run_dir(root: Path = Path(".run")) -> Path:
    """``.run/stack-<date>-<time>-<pid>``: one directory per run, kept for reading the logs after."""
    return root / time.strftime(f"stack-%Y%m%d-%H%M%S-{os.getpid()}")
