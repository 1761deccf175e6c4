"""What live tests need to run ``busd`` itself as a user does, and to see an agent's processes.

Live cancel tests (Claude Code, Copilot) start ``busd run``, ``busd serve``
and ``busd cancel`` as subprocesses in an ``env -i``-like environment of the
test's own directories, read their output line by line as it comes, and
check from ``/proc`` that the agent's processes are gone afterwards. The
two ways to cancel a run mid-answer are here once (:func:`ctrl_c_midway`,
:func:`busd_cancel_midway`), with what both must leave on the bus
(:func:`cancelled_midway`); the stand-in model is ``messages_stand_in.py``
in slow mode.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import msgspec
import trio

from busd.client import connect

BUSD: Final = Path(sys.executable).with_name("busd")
PYTHON: Final = Path(sys.executable)
RUN_EXIT_CANCELLED: Final = 130


def busd_env(root: Path, **extra: str) -> dict[str, str]:
    """An ``env -i``-like environment with its home, runtime, state and temp under ``root``."""
    env = {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": str(root / "home"),
        "XDG_RUNTIME_DIR": str(root / "run"),
        "XDG_STATE_HOME": str(root / "state"),
        "TMPDIR": str(root / "tmp"),
        "LANG": "C.UTF-8",
    }
    for name in ("HOME", "XDG_RUNTIME_DIR", "XDG_STATE_HOME", "TMPDIR"):
        Path(env[name]).mkdir(parents=True, exist_ok=True, mode=0o700)
    return {**env, **extra}


def children(pid: int) -> dict[int, list[int]]:
    """Every process's children, from ``/proc`` (``pid`` is where the walk will start)."""
    tree: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue  # it ended meanwhile
        parent = int(stat.rpartition(")")[2].split()[1])
        tree.setdefault(parent, []).append(int(entry.name))
    tree.setdefault(pid, [])
    return tree


def descendants(pid: int) -> dict[int, str]:
    """The processes below ``pid``, with their command lines."""
    tree = children(pid)
    found: dict[int, str] = {}
    todo = list(tree[pid])
    while todo:
        child = todo.pop()
        try:
            found[child] = (
                (Path("/proc") / str(child) / "cmdline")
                .read_bytes()
                .replace(b"\0", b" ")
                .decode(errors="replace")
            )
        except OSError:
            continue
        todo.extend(tree.get(child, ()))
    return found


def gone(pid: int) -> bool:
    """Whether ``pid`` has exited (a zombie nobody reaped yet has: only its entry is left)."""
    try:
        stat = (Path("/proc") / str(pid) / "stat").read_text()
    except OSError:
        return True
    return stat.rpartition(")")[2].split()[0] == "Z"


class Program:
    """A subprocess whose stdout is read as lines while it runs; stderr is kept whole."""

    def __init__(self, process: trio.Process, log: Path) -> None:
        self.process = process
        self.log = log
        self.lines: list[str] = []
        self._buffer = b""
        self._eof = False

    @classmethod
    async def start(
        cls,
        name: str,
        argv: Sequence[str | os.PathLike[str]],
        *,
        env: Mapping[str, str],
        cwd: Path,
    ) -> Program:
        """Start ``argv`` in ``cwd``; its stderr goes to ``cwd/NAME.stderr``."""
        log = cwd / f"{name}.stderr"
        with log.open("wb") as err:
            process = await trio.lowlevel.open_process(
                [str(a) for a in argv],
                env=dict(env),
                cwd=cwd,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=err,
                start_new_session=True,  # its own process group, as a terminal's job is
            )
        return cls(process, log)

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def stderr(self) -> str:
        return self.log.read_text(errors="replace")

    async def _more(self) -> bool:
        assert self.process.stdout is not None
        chunk = await self.process.stdout.receive_some(1 << 16)
        if not chunk:
            self._eof = True
            if self._buffer:
                self.lines.append(self._buffer.decode(errors="replace"))
                self._buffer = b""
            return False
        self._buffer += chunk
        *whole, self._buffer = self._buffer.split(b"\n")
        self.lines.extend(line.decode(errors="replace") for line in whole)
        return True

    async def wait_line(self, wanted: Callable[[str], bool]) -> str:
        """The first line (read so far or to come) for which ``wanted`` is true."""
        checked = 0
        while True:
            for line in self.lines[checked:]:
                if wanted(line):
                    return line
            checked = len(self.lines)
            if self._eof or not await self._more():
                raise AssertionError(f"no such line; stderr:\n{self.stderr[-3000:]}")

    async def finish(self) -> int:
        """Read stdout to its end, then the exit code."""
        while not self._eof and await self._more():
            pass
        return await self.process.wait()

    def envelopes(self) -> list[dict[str, Any]]:
        """Its stdout's JSON lines (``busd run --json``)."""
        return [json.loads(line) for line in self.lines if line.startswith("{")]

    async def stop(self) -> None:
        """SIGTERM, then SIGKILL after five seconds; never raises (cleanup)."""
        with trio.CancelScope(shield=True):
            if self.process.returncode is None:
                self.process.send_signal(signal.SIGTERM)
                with trio.move_on_after(5):
                    await self.process.wait()
                    return
                self.process.kill()
            await self.process.wait()


def cancelled_midway(envelopes: Sequence[Mapping[str, Any]], run_id: str, partial: str) -> None:
    """Assert what a run cancelled mid-answer left on the bus (issue 17).

    It finished ``cancelled`` without an error; the partial text
    (``partial``) is complete and marked ``stopped``; the last turn ended
    ``cancelled``; no ``stream.session.error`` was published; the session
    went idle, aborted.
    """
    ours = [e["event"] for e in envelopes if e.get("run_id") == run_id]

    def of(kind: str) -> list[Mapping[str, Any]]:
        return [event for event in ours if event["type"] == kind]

    assert of("stream.session.error") == []
    [finished] = of("busd.run.finished")
    assert (finished["status"], finished.get("error")) == ("cancelled", None)
    assert len(of("busd.run.cancelled")) == 1
    texts = of("stream.text.complete")
    assert texts, "no text completed"
    assert (texts[-1]["text"], texts[-1].get("stopped")) == (partial, True)
    turns = of("stream.turn.end")
    assert turns, "no turn ended"
    assert turns[-1]["finish_reason"] == "cancelled"
    idle = of("stream.session.idle")
    assert idle, "the session never went idle"
    assert idle[-1].get("aborted") is True


# -- cancelling a run mid-answer, two ways --------------------------------------------------

REACH: Final = 150.0
"""Seconds an agent may take to start and stream (a loaded machine takes tens of them)."""


@dataclass
class Midway:
    """What a cancel mid-answer left: exit code, output, the agent's processes, the events."""

    code: int
    run: Program
    processes: dict[int, str]
    envelopes: list[dict[str, Any]]
    run_id: str
    serve: Program | None = None
    daemon_alive: bool = field(default=False)

    def assert_stopped_cleanly(self, partial: str) -> None:
        """Exit 130, none of the agent's processes left, the run cancelled as it should
        be (:func:`cancelled_midway`), and no traceback shown."""
        assert self.code == RUN_EXIT_CANCELLED, self.run.stderr
        alive = {pid: cmd for pid, cmd in self.processes.items() if not gone(pid)}
        assert alive == {}, self.run.stderr
        cancelled_midway(self.envelopes, self.run_id, partial)
        assert "Traceback" not in self.run.stderr


async def _stalled(standin: Any) -> None:
    """The stand-in has sent every word of the answer and holds its request open."""
    with trio.fail_after(REACH):
        while not standin.stalled.is_set():  # set by the stand-in's own thread
            await trio.to_thread.run_sync(standin.stalled.wait, 0.5)


def _last_word(last: str) -> Callable[[str], bool]:
    def seen(line: str) -> bool:
        if '"stream.text.delta"' not in line:
            return False
        return bool(json.loads(line)["event"]["text"].endswith(last))

    return seen


def _agent_processes(agent: str, *roots: int) -> dict[int, str]:
    found: dict[int, str] = {}
    for root in roots:
        found.update(descendants(root))
    assert any(agent in command for command in found.values()), f"no {agent} under {roots}: {found}"
    return found


async def ctrl_c_midway(
    root: Path,
    standin: Any,
    run_args: Sequence[str | os.PathLike[str]],
    *,
    env: Mapping[str, str],
    agent: str,
    last: str,
    job: bool = False,
) -> Midway:
    """``busd run --json RUN_ARGS`` (its own in-process daemon), SIGINT once the answer stalls.

    The SIGINT goes to ``busd run``, or with ``job`` to its whole process
    group, as a terminal's Ctrl-C does (the agent gets it too, unless its
    driver started it in a group of its own).
    """
    argv: list[str | os.PathLike[str]] = [BUSD, "run", "--json", "--log-level", "warning"]
    argv += ["--socket", root / "nobody.sock"]
    run = await Program.start("busd-run", [*argv, *run_args], env=env, cwd=root)
    try:
        await _stalled(standin)
        with trio.fail_after(30):
            await run.wait_line(_last_word(last))
        processes = _agent_processes(agent, run.pid)
        if job:
            os.killpg(run.pid, signal.SIGINT)  # busd run leads its own group (start_new_session)
        else:
            run.process.send_signal(signal.SIGINT)
        with trio.fail_after(30):
            code = await run.finish()
    finally:
        await run.stop()
    envelopes = run.envelopes()
    return Midway(code, run, processes, envelopes, envelopes[0]["run_id"])


async def busd_cancel_midway(
    root: Path,
    standin: Any,
    run_args: Sequence[str | os.PathLike[str]],
    *,
    env: Mapping[str, str],
    agent: str,
    last: str,
) -> Midway:
    """``busd run --pretty RUN_ARGS`` via ``busd serve``; ``busd cancel`` once the answer stalls.

    A subscriber of the test records what the daemon publishes; the
    processes are looked at while the daemon still runs.
    """
    socket = root / "run" / "bus.sock"
    serve = await Program.start(
        "busd-serve",
        [BUSD, "serve", "--socket", socket, "--no-journal", "--log-level", "warning"],
        env=env,
        cwd=root,
    )
    run: Program | None = None
    seen: list[dict[str, Any]] = []
    said = trio.Event()
    wanted = _last_word(last)
    try:
        with trio.fail_after(60):
            await serve.wait_line(lambda line: "listening on" in line)
        async with connect(socket, client="test-watcher") as watcher, trio.open_nursery() as n:

            async def watch() -> None:
                async with watcher.subscribe([">"], window_ms=0) as subscription:
                    async for batch in subscription:
                        for envelope in batch.events:
                            line = msgspec.json.encode(envelope).decode()
                            seen.append(json.loads(line))
                            if wanted(line):
                                said.set()

            n.start_soon(watch)
            argv: list[str | os.PathLike[str]] = [BUSD, "run", "--pretty", "--socket", socket]
            argv += run_args
            run = await Program.start("busd-run", argv, env=env, cwd=root)
            await _stalled(standin)
            with trio.fail_after(30):
                await said.wait()
            processes = _agent_processes(agent, serve.pid, run.pid)
            [run_id] = {e["run_id"] for e in seen if e["event"]["type"] == "busd.run.started"}
            cancel = await Program.start(
                "busd-cancel",
                [BUSD, "cancel", run_id, "--socket", socket, "--reason", "enough"],
                env=env,
                cwd=root,
            )
            with trio.fail_after(30):
                assert await cancel.finish() == 0, cancel.stderr
                code = await run.finish()
            n.cancel_scope.cancel()
        alive = serve.process.returncode is None and all(gone(pid) for pid in processes)
    finally:
        if run is not None:
            await run.stop()
        await serve.stop()
    assert run is not None
    return Midway(code, run, processes, seen, run_id, serve, alive)
