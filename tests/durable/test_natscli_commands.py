"""Every ``nats …`` command js-etl or the README prints, run with the real NATS CLI (v0.5.1).

Issue 17: printed fixes did not run (``nats consumer add … --pull --ack explicit`` prompts and
fails without a terminal; ``nats consumer edit --wait 16s`` named no stream or consumer; the
README's ``--priority-groups`` is not a flag). Each command here runs exactly as printed, in a
shell without a terminal, against a real nats-server; then js-etl must accept the result.

The CLI is built once per checkout into ``.tools/bin`` (fixture ``nats_cli`` in conftest.py).
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from js_etl.config import load_config
from js_etl.demo.server import LocalNatsServer
from js_etl.durable.policy import ensure_drain_consumer
from js_etl.jetstream import AckPolicy, ConsumerConfig, JetStreamSession, PriorityPolicy
from js_etl.jetstream.errors import (
    ConsumerConfigError,
    ConsumerNotFoundError,
    StreamNotFoundError,
)
from js_etl.jetstream.kv import KeyValue

REPO = Path(__file__).resolve().parents[2]
# What users read: the README and the docs site's pages (not the design records).
USER_DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def user_docs_text() -> str:
    return "\n".join(page.read_text() for page in USER_DOCS)

MIN_ACK_WAIT = 15.0  # what a drain with fetch.pull_timeout 5s needs
PRINTED = re.compile(r"`(nats [^`]+)`")


@pytest.fixture(scope="module")
def server() -> Iterator[LocalNatsServer]:
    """A server of this module's own: the README's commands use fixed names (ORDERS …)."""
    with LocalNatsServer() as s:
        yield s


@pytest.fixture
def js(server: LocalNatsServer) -> Iterator[JetStreamSession]:
    from js_etl.jetstream import ConnectionOptions

    with JetStreamSession(ConnectionOptions(servers=(server.url,), connect_timeout=2)) as session:
        yield session


def fresh_stream(js: JetStreamSession, name: str) -> None:
    try:
        js.run(js.admin.delete_stream(name))
    except StreamNotFoundError:  # not there yet
        pass
    js.run(js.admin.add_stream(name, [f"{name.lower()}.>"]))


def shell(command: str, nats_cli: str, server: LocalNatsServer, cwd: Path
          ) -> subprocess.CompletedProcess[str]:
    """Run ``command`` as a user would paste it: bash, no terminal, ``nats`` on PATH,
    ``NATS_URL`` set, and no CLI contexts of this machine (a HOME of its own)."""
    env = {**os.environ, "PATH": f"{Path(nats_cli).parent}{os.pathsep}{os.environ['PATH']}",
           "NATS_URL": server.url, "HOME": str(cwd), "NO_COLOR": "1"}
    env.pop("NATS_CONTEXT", None)
    return subprocess.run(["bash", "-euo", "pipefail", "-c", command], cwd=cwd, env=env,
                          capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=120,
                          check=False)


def printed_commands(message: str) -> list[str]:
    commands = PRINTED.findall(message)
    assert commands, f"no nats command in: {message}"
    return commands


def run_printed(message: str, nats_cli: str, server: LocalNatsServer, cwd: Path) -> None:
    for command in printed_commands(message):
        result = shell(command, nats_cli, server, cwd)
        assert result.returncode == 0, f"{command!r} failed: {result.stderr or result.stdout}"


def desired(name: str, **config: Any) -> ConsumerConfig:
    """The consumer a drain with default settings asks for (as
    js_etl.durable.policy.desired_consumer)."""
    return ConsumerConfig(durable_name=name, ack_wait=config.pop("ack_wait", 300.0),
                          max_ack_pending=config.pop("max_ack_pending", 100_000), **config)


def ensure(js: JetStreamSession, stream: str, config: ConsumerConfig) -> Any:
    return js.run(ensure_drain_consumer(js.admin, stream, config, create=False,
                                        min_ack_wait=MIN_ACK_WAIT))


# --- fixes js-etl prints -------------------------------------------------------------------------
def test_printed_fix_for_a_missing_consumer_runs(js, server, nats_cli, tmp_path):
    fresh_stream(js, "MISS")
    wanted = desired("etl", filter_subjects=("miss.a", "miss.b"))
    with pytest.raises(ConsumerNotFoundError) as err:
        ensure(js, "MISS", wanted)

    run_printed(str(err.value), nats_cli, server, tmp_path)

    info = ensure(js, "MISS", wanted)  # accepted now
    assert info.config.ack_policy is AckPolicy.EXPLICIT and info.config.deliver_subject is None
    assert (info.config.ack_wait, info.config.max_ack_pending) == (300.0, 100_000)
    assert info.config.filter_subjects == ("miss.a", "miss.b")


def test_printed_fix_for_a_short_ack_wait_runs(js, server, nats_cli, tmp_path):
    fresh_stream(js, "WAIT")
    js.run(js.admin.create_consumer("WAIT", ConsumerConfig(durable_name="etl", ack_wait=5)))
    with pytest.raises(ConsumerConfigError) as err:
        ensure(js, "WAIT", desired("etl"))
    assert "partition_max_bytes" not in str(err.value)

    run_printed(str(err.value), nats_cli, server, tmp_path)

    assert ensure(js, "WAIT", desired("etl")).config.ack_wait == 16.0


def test_headers_only_consumer_made_with_the_cli_is_refused_and_the_fix_runs(js, server,
                                                                             nats_cli, tmp_path):
    fresh_stream(js, "HDRS")
    made = shell("nats consumer add HDRS etl --pull --ack explicit --headers-only --defaults",
                 nats_cli, server, tmp_path)
    assert made.returncode == 0, made.stderr
    with pytest.raises(ConsumerConfigError) as err:
        ensure(js, "HDRS", desired("etl"))
    assert "headers only" in str(err.value)

    run_printed(str(err.value), nats_cli, server, tmp_path)

    ensure(js, "HDRS", desired("etl"))  # accepted now


@pytest.mark.parametrize("kind", ["push", "ack none"])
def test_printed_fix_for_a_consumer_that_cannot_be_changed_runs(js, server, nats_cli, tmp_path,
                                                                kind):
    fresh_stream(js, "KIND")
    config = (ConsumerConfig(durable_name="etl", deliver_subject="push.to.me") if kind == "push"
              else ConsumerConfig(durable_name="etl", ack_policy=AckPolicy.NONE))
    js.run(js.admin.create_consumer("KIND", config))
    with pytest.raises(ConsumerConfigError) as err:
        ensure(js, "KIND", desired("etl"))

    run_printed(str(err.value), nats_cli, server, tmp_path)

    replacement = printed_commands(str(err.value))[0].split()[4]  # nats consumer add KIND <name>
    assert replacement == "etl_pull"
    ensure(js, "KIND", desired(replacement, ack_wait=30.0))  # the new consumer serves a drain


def backfill_config(server: LocalNatsServer, stream: str, tmp_path: Path) -> Any:
    return load_config(None, [f"nats.servers={server.url}", f"source.stream={stream}",
                              "source.consumer=etl", f"target.path={tmp_path / 'table'}",
                              f"source.filter_subjects=[{stream.lower()}.x]"], environ={})


def test_backfill_and_rewind_printed_commands_run(js, server, nats_cli, tmp_path):
    from js_etl.backfill import run as backfill
    from js_etl.backfill.run import Backfill, RangeRequest
    from js_etl.durable.rewind import plan_rewind, rewind_consumer
    from js_etl.errors import RangeError, RewindUnsupportedError
    from js_etl.jetstream.errors import BadRequestError

    fresh_stream(js, "BACK")
    for i in range(10):
        js.run(js.conn.nc.request("back.x", b"%d" % i, timeout=5))
    config = backfill_config(server, "BACK", tmp_path)

    # A backfill into the drain's own table, before its consumer exists: create it after the
    # range first.
    with pytest.raises(RangeError) as err:
        Backfill(config, RangeRequest.parse(from_seq=1, to_seq=4),
                 drain_target=backfill.SAME_AS_TARGET).plan()
    run_printed(str(err.value), nats_cli, server, tmp_path)
    info = js.consumer_info("BACK", "etl")
    assert (info.config.opt_start_seq, info.num_pending) == (5, 6)
    assert info.config.filter_subjects == ("back.x",)

    # Rewind on a server without consumer reset: delete and recreate at the new position.
    plan = plan_rewind(js, config, 3)

    async def no_reset(*args: Any) -> int:
        raise BadRequestError("unknown API: CONSUMER.RESET (simulating nats-server < 2.14)",
                              code=400)

    js.admin.reset_consumer = no_reset  # type: ignore[method-assign]
    with pytest.raises(RewindUnsupportedError) as err:
        rewind_consumer(js, config, plan)
    run_printed(str(err.value), nats_cli, server, tmp_path)
    info = js.consumer_info("BACK", "etl")
    assert (info.config.opt_start_seq, info.num_pending) == (3, 8)

    # Rewinding a consumer that does not exist prints the command that creates it there.
    js.run(js.admin.delete_consumer("BACK", "etl"))
    with pytest.raises(ConsumerNotFoundError) as err:
        plan_rewind(js, config, 7)
    run_printed(str(err.value), nats_cli, server, tmp_path)
    assert js.consumer_info("BACK", "etl").num_pending == 4


# --- commands in the README and the docs -------------------------------------------------
def readme_commands() -> list[str]:
    """Complete ``nats`` commands in the README and the docs pages: inline code and ``sh`` blocks
    (run whole)."""
    text = user_docs_text()
    commands = [c for c in PRINTED.findall(text) if "…" not in c]
    for block in re.findall(r"```sh\n(.*?)```", text, re.DOTALL):
        if re.search(r"^nats ", block, re.MULTILINE):
            commands.append(block.strip())
    return list(dict.fromkeys(commands))  # each once, wherever it is shown


def readme_elided_commands() -> list[str]:
    """``nats`` commands the README shows with parts elided (``…``): their flags must exist."""
    return list(dict.fromkeys(c for c in PRINTED.findall(user_docs_text()) if "…" in c))


def test_printed_fix_for_a_server_side_max_deliver_runs(js, server, nats_cli, tmp_path):
    fresh_stream(js, "MAXD")
    made = shell("nats consumer add MAXD etl --pull --ack explicit --max-deliver 2 --defaults",
                 nats_cli, server, tmp_path)
    assert made.returncode == 0, made.stderr
    with pytest.raises(ConsumerConfigError) as err:
        ensure(js, "MAXD", desired("etl"))
    assert "max_deliver 2" in str(err.value)

    run_printed(str(err.value), nats_cli, server, tmp_path)

    assert ensure(js, "MAXD", desired("etl")).config.max_deliver in (None, -1)  # accepted now


def test_the_readme_shows_the_fixes_of_issue_17():
    commands = " ".join(readme_commands())
    for fix in ("--pull --ack explicit", "--defaults", "--no-headers-only -f", "--wait 16s -f",
                "--pinned-groups etl", "--config overflow.json"):
        assert fix in commands, fix


def prepare(js: JetStreamSession, command: str) -> None:
    """What a README command expects to exist: the example stream, and for ``edit`` the
    consumer in the state the fix is for (a short ack_wait, or headers only)."""
    fresh_stream(js, "ORDERS")
    if command.startswith("nats kv"):  # the lease bucket a drain creates
        js.run(KeyValue(js.conn, command.split()[3]).ensure(ttl=60, replicas=1))
    for line in command.splitlines():
        words = shlex.split(line) if line.startswith("nats consumer edit") else []
        if words:
            broken = ({"headers_only": True} if "--no-headers-only" in words
                      else {"max_deliver": 2} if "--max-deliver=-1" in words
                      else {"ack_wait": 5_000_000_000})
            js.run(js.conn.request(f"CONSUMER.CREATE.ORDERS.{words[4]}", {
                "stream_name": "ORDERS", "action": "create",
                "config": {"durable_name": words[4], "ack_policy": "explicit", **broken}}))
            with pytest.raises(ConsumerConfigError):  # the state the fix is for
                ensure(js, "ORDERS", desired(words[4], ack_wait=30.0))


@pytest.mark.parametrize("command", readme_commands())
def test_readme_command_runs(js, server, nats_cli, tmp_path, command):
    prepare(js, command)

    result = shell(command, nats_cli, server, tmp_path)

    assert result.returncode == 0, f"{command!r} failed: {result.stderr or result.stdout}"
    for line in command.splitlines():
        words = shlex.split(line) if line.startswith("nats consumer") else []
        if not words:
            continue
        info = js.consumer_info(words[3], words[4])
        if "--pinned-groups" in words:
            assert info.config.priority_policy is PriorityPolicy.PINNED_CLIENT
        elif "--config" in words:
            assert info.config.priority_policy is PriorityPolicy.OVERFLOW
            assert info.config.priority_groups == ("etl",)
        else:  # a drain fix: js-etl accepts the consumer now
            ensure(js, "ORDERS", desired(words[4], ack_wait=30.0))


def cli_flags(nats_cli: str, subcommand: list[str], server: LocalNatsServer, cwd: Path
              ) -> set[str]:
    shown = shell(f"nats {' '.join(subcommand)} --help", nats_cli, server, cwd)
    help_text = shown.stdout + shown.stderr
    flags = set(re.findall(r"--(?:\[no-\])?([a-z][a-z0-9-]*)", help_text))
    return {f"--{f}" for f in flags} | {f"--no-{f}" for f in flags} | {"-f", "-s"}


@pytest.mark.parametrize("command", readme_elided_commands())
def test_readme_elided_command_uses_real_flags(server, nats_cli, tmp_path, command):
    for part in command.split("&&"):
        words = part.split()
        subcommand = [w for w in words[1:3] if not w.startswith(("-", "…"))]
        known = cli_flags(nats_cli, subcommand, server, tmp_path)
        used = {w.split("=")[0] for w in words if w.startswith("-")}
        assert used <= known, f"{part.strip()!r}: unknown flags {sorted(used - known)}"
