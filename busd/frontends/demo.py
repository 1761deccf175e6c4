"""``busd demo``: a daemon, four recorded agent runs and a watcher, in one process.

The demo starts a real daemon on a temporary socket, starts one run per
bundled recording (Claude Code, Copilot, OpenCode, ACP) with the built-in
``replay`` driver, which plays each SDK's raw stream through its real adapter
with the recorded timing, and attaches ``busd watch`` to it over the socket,
like any other frontend. Other frontends (``busd watch``, ``busd web``,
``busd tail``) can attach to the same socket while it runs; it prints how,
and the live screen keeps saying it in its header.

Permission requests in the recordings wait for an answer, as a live agent's
would: at a terminal the person watching answers them; otherwise (or with
``--yes``) the demo answers them itself, as a separate client named
``busd-demo (auto-approve)``, so the run can finish unattended.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import trio

from ..client import ConnectionLost, RequestFailed, connect
from ..core.events import PermissionRequested
from .local import StartLocal
from .watch import watch

__all__ = ["BUNDLED", "DemoRun", "attach_hint", "bundled_recordings", "run_demo"]

BUNDLED = ("claude_code", "copilot", "opencode", "acp")
"""The recordings in ``busd/data/recordings``, in the order the demo starts them."""

AUTO_APPROVER = "busd-demo (auto-approve)"

Echo = Callable[[str], None]


@dataclass(frozen=True)
class DemoRun:
    """One bundled recording: which adapter reads it and what it was asked."""

    name: str
    adapter: str
    title: str
    prompt: str


def bundled_recordings(names: Sequence[str] = BUNDLED) -> list[DemoRun]:
    """The headers of the bundled recordings (their first line)."""
    runs = []
    folder = resources.files("busd") / "data" / "recordings"
    for name in names:
        with (folder / f"{name}.jsonl").open("r", encoding="utf-8") as file:
            header = json.loads(file.readline())
        runs.append(
            DemoRun(
                name=name,
                adapter=header["adapter"],
                title=header.get("title", name),
                prompt=header.get("prompt", ""),
            )
        )
    return runs


async def _auto_approve(path: Path, *, task_status: trio.TaskStatus[None]) -> None:
    """Answer every permission request with its first allowing option, until goodbye."""
    with contextlib.suppress(ConnectionLost):
        await _approve_all(path, task_status=task_status)


async def _approve_all(path: Path, *, task_status: trio.TaskStatus[None]) -> None:
    async with (
        connect(path, client=AUTO_APPROVER, role="responder") as client,
        client.subscribe(["stream.permission.requested"], since_seq=0, window_ms=0) as sub,
    ):
        task_status.started()
        async for batch in sub:
            for envelope in batch.events:
                event = envelope.event
                if isinstance(event, PermissionRequested) and envelope.run_id is not None:
                    allow = next((o for o in event.options if o.kind == "allow_once"), None)
                    with contextlib.suppress(RequestFailed):  # someone else answered first
                        await client.reply_permission(
                            event.request_id,
                            option_id=allow.id if allow is not None else None,
                            allow=None if allow is not None else True,
                        )


async def run_demo(
    echo: Echo,
    *,
    start_local: StartLocal,
    speed: float = 1.0,
    plain: bool = False,
    auto_approve: bool = False,
    keep: bool = False,
    names: Sequence[str] = BUNDLED,
    socket_dir: Path | None = None,
) -> int:
    """Serve (with ``start_local``), replay ``names`` and watch them; returns the exit status."""
    runs = bundled_recordings(names)
    async with start_local(directory=socket_dir) as daemon:
        missing = sorted({run.adapter for run in runs} - set(daemon.adapters))
        if missing:
            echo(
                f"busd demo: no adapter plugin for {', '.join(missing)}; install the built-in "
                "adapters with `pip install -r requirements.txt` from a clone of busd\n"
            )
            return 1
        path = daemon.path
        async with trio.open_nursery() as nursery:
            echo(_attach_help(path, runs=len(runs), keep=keep))
            if auto_approve:
                await nursery.start(_auto_approve, path)
            async with connect(path, client="busd-demo") as client:
                for run in runs:
                    await client.start_run(
                        run.adapter,
                        run.prompt,
                        session_id=f"demo-{run.name}",
                        driver="replay",
                        options={"recording": run.name, "speed": speed},
                    )
            code = await watch(
                path,
                plain=plain,
                exit_when_idle=True,
                name="busd-demo watch",
                header=attach_hint(path),
            )
            if keep and code == 0:
                echo(f"busd demo: still serving on {path}; Ctrl-C to stop\n")
                with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
                    async for _ in signals:
                        break
            await daemon.shutdown("demo over")
            nursery.cancel_scope.cancel()
    return code


def attach_hint(path: Path) -> str:
    """The live screen's header: the same commands, on one line (it wraps when narrow)."""
    return f"more frontends: BUSD_SOCKET={path} busd watch (or busd web, busd tail --pretty)"


def _attach_help(path: Path, *, runs: int, keep: bool) -> str:
    env = f"BUSD_SOCKET={path}"
    lines = [
        f"busd demo: a daemon on {path}, replaying {runs} recorded agent "
        + ("run." if runs == 1 else "runs."),
        "Attach more frontends to it from another terminal:",
        f"  {env} busd watch",
        f"  {env} busd web",
        f"  {env} busd tail --pretty",
    ]
    if not keep:
        lines.append("(the demo ends when the runs do; `busd demo --keep` keeps it serving)")
    return "\n".join(lines) + "\n\n"


def default_interactive() -> bool:
    """A person is watching: both ends of the terminal are a tty."""
    return os.isatty(0) and os.isatty(1)
