"""The console script: config errors exit 2; a real process serves, goes SERVING, and stops on SIGTERM."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from pathlib import Path

import grpc
import pytest
import redis
from grpc_health.v1 import health_pb2, health_pb2_grpc
from picker_builders import pod, snapshot

from pointsman_devstack.ports import free_port
from pointsman_picker.__main__ import main
from pointsman_picker.health import EXT_PROC_SERVICE
from pointsman_shared.codec import encode_pool
from pointsman_shared.keys import RedisKeys


def test_unreadable_config_exits_2(tmp_path, capsys):
    assert main(["--config", str(tmp_path / "missing.yaml")]) == 2
    assert "cannot read" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("text", "path"),
    [
        ("picker:\n  maxBodyBytes: -1\n", "picker.maxBodyBytes"),
        ("plugins:\n  - {type: magic}\n", "plugins[0].type"),
        ("picker:\n  profile: nope\n", "picker.profile"),
    ],
)
def test_invalid_config_exits_2_and_names_the_path(tmp_path, capsys, text, path):
    config = tmp_path / "bad.yaml"
    config.write_text(text)
    assert main(["--config", str(config)]) == 2
    assert path in capsys.readouterr().err


def test_no_config_is_a_usage_error(monkeypatch):
    monkeypatch.delenv("POINTSMAN_CONFIG", raising=False)
    with pytest.raises(SystemExit) as caught:
        main([])
    assert caught.value.code == 2


async def health_status(port: int, service: str = "") -> int | None:
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            request = health_pb2.HealthCheckRequest(service=service)
            return (await health_pb2_grpc.HealthStub(channel).Check(request, timeout=1)).status
    except grpc.aio.AioRpcError:
        return None


async def wait_status(port: int, status: int, service: str = "", within: float = 15.0) -> None:
    deadline = time.monotonic() + within
    while await health_status(port, service) != status:
        assert time.monotonic() < deadline, f"port {port} never reported {status}"
        await asyncio.sleep(0.05)


async def test_the_process_serves_from_redis_and_stops_on_sigterm(tmp_path, redis_url):
    listen, health = free_port(), free_port()
    path = tmp_path / "pointsman.yaml"
    path.write_text(
        f"""
pool: {{name: proc-pool}}
redis: {{url: "{redis_url}"}}
picker:
  listen: 127.0.0.1:{listen}
  healthListen: 127.0.0.1:{health}
  metricsListen: 127.0.0.1:{free_port()}
"""
    )
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "pointsman_picker",
        "--config",
        str(path),
        env=env,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        await wait_status(health, health_pb2.HealthCheckResponse.NOT_SERVING)
        keys = RedisKeys("proc-pool")
        blob = encode_pool(snapshot(pod(), pool="proc-pool", published_at=time.time()))  # fresh: ready
        with redis.Redis.from_url(redis_url) as client:
            client.hset(keys.snapshot, mapping={"version": 1, "data": blob})
            client.publish(keys.channel, 1)
        await wait_status(health, health_pb2.HealthCheckResponse.SERVING)
        await wait_status(listen, health_pb2.HealthCheckResponse.SERVING, EXT_PROC_SERVICE)
        process.send_signal(signal.SIGTERM)
        _, stderr = await asyncio.wait_for(process.communicate(), 15)
        assert process.returncode == 0, stderr.decode()
        assert b"Traceback" not in stderr
    finally:
        if process.returncode is None:
            process.kill()
            await process.communicate()


UPSTREAM_PLUGINS = Path(__file__).parents[3] / "shared/tests/data/upstream/default-plugins.yaml"


async def test_an_upstream_deployment_s_args_run_it_with_only_a_redis_url_added(redis_url):
    """The args upstream's chart gives its picker (GIE v1.5.0), its EndpointPickerConfig, REDIS_URL."""
    listen, health, metrics = free_port(), free_port(), free_port()
    args = [
        "--pool-name", "up-pool",
        "--pool-namespace", "default",
        "--pool-group", "inference.networking.k8s.io",
        "--zap-encoder", "json",
        "--config-file", str(UPSTREAM_PLUGINS),
        "--tracing=false",
        "--metrics-endpoint-auth=false",
        "--grpc-port", str(listen),
        "--grpc-health-port", str(health),
        "--metrics-port", str(metrics),
        "-v", "1",
    ]  # fmt: skip
    env = {**os.environ, "REDIS_URL": redis_url}
    env.pop("POINTSMAN_CONFIG", None)
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "pointsman_picker", *args, env=env, stderr=asyncio.subprocess.PIPE
    )
    try:
        # Upstream's probes: liveness at once, readiness and inference-extension with a fresh snapshot.
        await wait_status(health, health_pb2.HealthCheckResponse.SERVING, "liveness")
        assert await health_status(health, "readiness") == health_pb2.HealthCheckResponse.NOT_SERVING
        blob = encode_pool(snapshot(pod(), pool="up-pool", published_at=time.time()))
        keys = RedisKeys("up-pool")
        with redis.Redis.from_url(redis_url) as client:
            client.hset(keys.snapshot, mapping={"version": 1, "data": blob})
            client.publish(keys.channel, 1)
        for service in ("readiness", "inference-extension"):
            await wait_status(health, health_pb2.HealthCheckResponse.SERVING, service)
        await wait_status(listen, health_pb2.HealthCheckResponse.SERVING, EXT_PROC_SERVICE)
        process.send_signal(signal.SIGTERM)
        _, stderr = await asyncio.wait_for(process.communicate(), 15)
        assert process.returncode == 0, stderr.decode()
        log = stderr.decode()
        assert "--zap-encoder is accepted and not used" in log
        assert "metrics-data-source is left out" in log
        assert "prefix-cache-scorer" not in log  # translated, kept
        assert "Traceback" not in log
    finally:
        if process.returncode is None:
            process.kill()
            await process.communicate()
