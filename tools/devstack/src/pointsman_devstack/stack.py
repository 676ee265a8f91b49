"""The local stack: Redis, the simulator pods, the collector, the picker and Envoy, started in that order.

Each stage waits until its processes are ready; if one fails, everything already started is stopped
and :class:`StackError` says which process failed and shows its last lines. The stack writes, in its
run dir, the config the services read (the user's config with this stack's ports and Redis
substituted), the Envoy bootstrap, one log file per process, and ``pids.json``: the PID of every
process it started (rewritten as each starts), for whoever must check that none outlived it.

Every child gets SIGKILL if the stack's process dies (``lifeline``). For fault tests a process can be
killed (:meth:`Stack.kill`) and started again as it was (:meth:`Stack.restart`); the pods can run one
process each (``SimOptions.process_per_pod``) so that one can die alone, and the collector can run as
several replicas sharing the pool (``StackPorts.more_collectors``).
"""

from __future__ import annotations

import ipaddress
import json
import os
import shutil
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import TracebackType
from typing import Any

import httpx
import yaml

from pointsman_devstack import envoy
from pointsman_devstack.errors import StackCancelled, StackError
from pointsman_devstack.ports import free_port
from pointsman_devstack.process import Echo, ManagedProcess
from pointsman_devstack.readiness import Probe, all_ready, grpc_serving, http_ok, wait_ready
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
    # Collector replicas beyond the first (their HTTP ports); with any, the replicas share the pool.
    more_collectors: tuple[int, ...] = ()

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
    def free(cls, pod_count: int, picker_replicas: int = 1, collector_replicas: int = 1) -> StackPorts:
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
            more_collectors=tuple(free_port() for _ in range(collector_replicas - 1)),
        )

    @property
    def pickers(self) -> tuple[tuple[int, int, int], ...]:
        """(ext_proc, health, metrics) of every picker replica, the first one first."""
        return ((self.picker, self.picker_health, self.picker_metrics), *self.more_pickers)

    @property
    def collectors(self) -> tuple[int, ...]:
        """The HTTP port of every collector replica, the first one first."""
        return (self.collector, *self.more_collectors)

    def table(self) -> list[tuple[str, int]]:
        rows = [("gateway (Envoy)", self.gateway), ("Envoy admin", self.envoy_admin)]
        rows += [(f"pod {i}", port) for i, port in enumerate(self.pods)]
        rows += [("collector HTTP", self.collector)]
        rows += [(f"collector {i} HTTP", port) for i, port in enumerate(self.more_collectors, start=2)]
        rows += [
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
    # One simulator process per pod (named sim-0, sim-1, ...), so that one pod can die alone; else one
    # process (sim) serves them all.
    process_per_pod: bool = False
    # Where the pods send their spans (--otlp-traces-endpoint); for_config: the config's tracing.endpoint
    # when tracing is on.
    otlp_traces_endpoint: str | None = None

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
        process_per_pod: bool = False,
    ) -> SimOptions:
        base, served = served_models(config)
        tracing = config.tracing
        return cls(
            model=model or base,
            adapters=tuple(adapters) if adapters is not None else served,
            max_loras=max_loras,
            max_num_seqs=max_num_seqs,
            speedup=speedup,
            process_per_pod=process_per_pod,
            otlp_traces_endpoint=tracing.endpoint if tracing.enabled else None,
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
    if ports.more_collectors:
        doc["collector"]["sharing"] = True
    return doc


def _with_listen(doc: dict[str, Any], **addresses: str) -> dict[str, Any]:
    """``doc`` with some of its listen addresses replaced: ``collector="h:p"``, ``picker=...``,
    ``picker_health=...``, ``picker_metrics=...``."""
    keys = {
        "collector": ("collector", "listen"),
        "picker": ("picker", "listen"),
        "picker_health": ("picker", "healthListen"),
        "picker_metrics": ("picker", "metricsListen"),
    }
    out = {section: dict(value) if isinstance(value, dict) else value for section, value in doc.items()}
    for name, address in addresses.items():
        section, key = keys[name]
        out[section][key] = address
    return out


def _http_probe(url: str) -> Callable[[httpx.Client], Probe]:
    return lambda client: http_ok(client, url)


def _grpc_probe(address: str) -> Callable[[httpx.Client], Probe]:
    return lambda _client: grpc_serving(address)


@dataclass(frozen=True)
class _Role:
    """One process of the stack: how to start it and how to tell it is ready (kept for restart())."""

    name: str
    argv: tuple[str, ...]
    probe: Callable[[httpx.Client], Probe]
    what: str


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
    # How often Envoy exports its spans, when the config traces (None: Envoy's 5 s).
    envoy_trace_flush_ms: int | None = None
    envoy_log_level: str = "warning"
    startup_timeout: float = 30.0
    stop_grace: float = 5.0


class Stack:
    """Start with :meth:`start` (or ``with Stack(...) as stack``); :meth:`stop` is idempotent.

    :meth:`cancel` and :meth:`hurry` only set a flag, so a signal handler may call them: the start-up
    waits raise :class:`StackCancelled` at their next poll once cancelled, and a stop that was hurried
    SIGKILLs each process still stopping instead of waiting out its grace.
    """

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
        self.pids_file = self.run_dir / "pids.json"
        self.redis: RedisServer | None = None
        self._processes: list[ManagedProcess] = []
        self._roles: dict[str, _Role] = {}
        self._env: dict[str, str] = {}
        self._cancelled = False
        self._hurried = False

    # -- addresses -----------------------------------------------------------------------------------
    @property
    def gateway_url(self) -> str:
        return f"http://{join_host_port(LOOPBACK, self.ports.gateway)}"

    @property
    def collector_url(self) -> str:
        return f"http://{join_host_port(LOOPBACK, self.ports.collector)}"

    @property
    def collector_urls(self) -> tuple[str, ...]:
        """Every collector replica's HTTP address, the first one's first."""
        return tuple(f"http://{join_host_port(LOOPBACK, port)}" for port in self.ports.collectors)

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

    def process(self, name: str) -> ManagedProcess:
        """The process named ``name`` (``sim``, ``sim-0``, ``collector-2``, ``picker``, ``envoy``...)."""
        for process in self._processes:
            if process.name == name:
                return process
        raise StackError(f"no process {name!r}; the stack runs {[p.name for p in self._processes]}")

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
        # Each is forgotten only once stopped: a stop() cut short by an exception can be called again.
        while self._processes:
            self._processes[-1].stop(self.options.stop_grace, hurry=lambda: self._hurried)
            self._processes.pop()
        if self.redis is not None:
            self.redis.stop()
            self.redis = None

    def cancel(self) -> None:
        """Ask a :meth:`start` under way to give up (it raises :class:`StackCancelled`). Only sets a flag."""
        self._cancelled = True

    def hurry(self) -> None:
        """Make the stop under way (or the next) SIGKILL what is left at once. Only sets a flag."""
        self._cancelled = True
        self._hurried = True

    @property
    def cancelled(self) -> bool:
        return self._cancelled

    def kill(self, name: str) -> None:
        """SIGKILL one process (a crash); :meth:`restart` starts it again."""
        self.process(name).kill()

    def restart(self, name: str, *, wait: bool = True) -> ManagedProcess:
        """Stop the process named ``name`` (if it still runs) and start it again as it was started; with
        ``wait``, return once it is ready as at start-up."""
        index = next((i for i, p in enumerate(self._processes) if p.name == name), None)
        if index is None:
            raise StackError(f"no process {name!r}; the stack runs {[p.name for p in self._processes]}")
        self._processes[index].stop(self.options.stop_grace)
        role = self._roles[name]
        process = self._launch(role)
        self._processes[index] = process
        self._write_pids()
        if wait:
            with httpx.Client(timeout=1.0) as client:
                self._wait(process, role, client)
        return process

    def check(self) -> None:
        """Raise :class:`StackError` if a process has exited since it started."""
        for process in self._processes:
            code = process.returncode
            if code is not None:
                raise process.error(f"{process.name} exited with code {code}")

    def _start_all(self) -> None:
        env = dict(self.options.environ)
        promised = {port for _, port in self.ports.table()}  # not bound yet: Redis must not take one
        self.redis = start_redis(env, allow_docker=self.options.allow_docker, avoid=promised)
        self._write_pids()
        # The services prefer REDIS_URL over the config file; point it at this stack's Redis.
        env["REDIS_URL"] = self.redis.url
        # Python children buffer stdout in a pipe; unbuffered, their log lines arrive as they happen.
        env["PYTHONUNBUFFERED"] = "1"
        if self._config.tracing.enabled and self._config.tracing.protocol != "grpc":
            # The simulator's flag names only the endpoint; the protocol comes as vLLM's does.
            env.setdefault("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", self._config.tracing.protocol)
        self._env = env
        derived = derive_config(self._config, self.ports, self.redis.url, self.host)
        self._write_yaml(self.config_file, derived)
        # Each further replica gets the same config with its own listen ports.
        collector_files = [self.config_file]
        for i, port in enumerate(self.ports.more_collectors, start=2):
            path = self.run_dir / f"pointsman-collector-{i}.yaml"
            self._write_yaml(path, _with_listen(derived, collector=join_host_port(LOOPBACK, port)))
            collector_files.append(path)
        picker_files = [self.config_file]
        for i, (ext_proc, health, metrics) in enumerate(self.ports.more_pickers, start=2):
            path = self.run_dir / f"pointsman-picker-{i}.yaml"
            listen = _with_listen(
                derived,
                picker=join_host_port(LOOPBACK, ext_proc),
                picker_health=join_host_port(LOOPBACK, health),
                picker_metrics=join_host_port(LOOPBACK, metrics),
            )
            self._write_yaml(path, listen)
            picker_files.append(path)
        envoy_options = envoy.EnvoyOptions.from_config(
            load_config(self.config_file, environ={}),
            gateway_listen=join_host_port(LOOPBACK, self.ports.gateway),
            admin_listen=join_host_port(LOOPBACK, self.ports.envoy_admin),
        )
        pickers = tuple(join_host_port(LOOPBACK, ports[0]) for ports in self.ports.pickers)
        envoy_options = replace(envoy_options, pickers=pickers)
        if envoy_options.tracing is not None and self.options.envoy_trace_flush_ms is not None:
            flush = replace(envoy_options.tracing, flush_interval_ms=self.options.envoy_trace_flush_ms)
            envoy_options = replace(envoy_options, tracing=flush)
        envoy.write_bootstrap(envoy_options, self.envoy_file)

        # Each stage's processes start together, then the stage waits until every one is ready.
        stages = [
            self._sim_roles(),
            self._collector_roles(collector_files),
            self._picker_roles(picker_files),
            [self._envoy_role()],
        ]
        with httpx.Client(timeout=1.0) as client:
            for roles in stages:
                self._check_cancelled()
                started = []
                for role in roles:
                    self._roles[role.name] = role
                    started.append((self._launch(role), role))
                    self._processes.append(started[-1][0])
                    self._write_pids()
                for process, role in started:
                    self._wait(process, role, client)

    def _check_cancelled(self) -> None:
        if self._cancelled:
            raise StackCancelled("stopped while starting")

    def _launch(self, role: _Role) -> ManagedProcess:
        log_path = self.run_dir / f"{role.name}.log"
        return ManagedProcess(role.name, role.argv, env=self._env, log_path=log_path, echo=self._echo)

    def _wait(self, process: ManagedProcess, role: _Role, client: httpx.Client) -> None:
        wait_ready(
            process,
            role.probe(client),
            timeout=self.options.startup_timeout,
            what=role.what,
            cancelled=lambda: self._cancelled,
        )

    def _sim_roles(self) -> list[_Role]:
        script = _console_script("pointsman-sim")
        if not self.sim.process_per_pod:
            addresses = self.pod_addresses

            def every_pod(client: httpx.Client) -> Probe:
                return all_ready([http_ok(client, f"http://{a}/health") for a in addresses])

            argv = (script, *self._sim_args(self.ports.pods))
            return [_Role("sim", argv, every_pod, "every pod answering /health")]
        roles = []
        for i, (port, address) in enumerate(zip(self.ports.pods, self.pod_addresses, strict=True)):
            argv = (script, *self._sim_args((port,)))
            roles.append(_Role(f"sim-{i}", argv, _http_probe(f"http://{address}/health"), "/health 200"))
        return roles

    def _collector_roles(self, files: Sequence[Path]) -> list[_Role]:
        script = _console_script("pointsman-collector")
        roles = []
        for i, (path, url) in enumerate(zip(files, self.collector_urls, strict=True)):
            name = "collector" if i == 0 else f"collector-{i + 1}"
            roles.append(
                _Role(
                    name,
                    (script, "--config", str(path)),
                    _http_probe(f"{url}/readyz"),
                    "/readyz 200 (Redis reached, a snapshot published)",
                )
            )
        return roles

    def _picker_roles(self, files: Sequence[Path]) -> list[_Role]:
        script = _console_script("pointsman-picker")
        roles = []
        for i, (path, ports) in enumerate(zip(files, self.ports.pickers, strict=True)):
            name = "picker" if i == 0 else f"picker-{i + 1}"
            health = _grpc_probe(join_host_port(LOOPBACK, ports[1]))
            roles.append(_Role(name, (script, "--config", str(path)), health, "gRPC health SERVING"))
        return roles

    def _envoy_role(self) -> _Role:
        argv = [envoy.find_envoy(), "-c", str(self.envoy_file), "--log-level", self.options.envoy_log_level]
        # Hot restart would make every Envoy on this machine share one shared-memory region: the
        # second stack (tests beside `make run`) fails with "unable to bind domain socket".
        argv.append("--disable-hot-restart")
        if self.options.envoy_concurrency is not None:
            argv += ["--concurrency", str(self.options.envoy_concurrency)]
        return _Role("envoy", tuple(argv), _http_probe(f"{self.admin_url}/ready"), "admin /ready")

    def _write_yaml(self, path: Path, doc: Mapping[str, Any]) -> None:
        path.write_text(yaml.safe_dump(dict(doc), sort_keys=False), encoding="utf-8")

    def _write_pids(self) -> None:
        """``pids.json``: this process and each child's latest PID, replaced atomically."""
        pids: dict[str, int] = {}
        if self.redis is not None and self.redis.pid is not None:
            pids["redis"] = self.redis.pid
        pids |= {process.name: process.pid for process in self._processes}
        temporary = self.pids_file.with_suffix(".tmp")
        temporary.write_text(json.dumps({"stack": os.getpid(), "processes": pids}), encoding="utf-8")
        temporary.replace(self.pids_file)

    def _sim_args(self, ports: Sequence[int]) -> list[str]:
        sim = self.sim
        args = ["--host", self.host, "--ports", ",".join(str(p) for p in ports), "--model", sim.model]
        if sim.adapters:
            args += ["--adapters", ",".join(sim.adapters)]
        if sim.max_loras is not None:
            args += ["--max-loras", str(sim.max_loras)]
        if sim.max_num_seqs is not None:
            args += ["--max-num-seqs", str(sim.max_num_seqs)]
        if sim.speedup is not None:
            args += ["--speedup", f"{sim.speedup:g}"]
        if sim.otlp_traces_endpoint is not None:
            args += ["--otlp-traces-endpoint", sim.otlp_traces_endpoint]
        return args


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
