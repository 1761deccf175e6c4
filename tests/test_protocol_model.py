"""A model of the wire protocol, run against a real ``busd serve`` (hypothesis stateful).

Three clients, each a plain blocking Unix socket speaking docs/protocol.md
with this module's own codec (msgspec dicts, not ``busd.wire``: the test
must not share the daemon's mistakes), send random interleavings of every
client frame, one frame a write or pipelined in one write: subscribe,
unsubscribe and re-subscribe with reused ids, valid, refused and oversize
publishes, floods, every request, ping, a second hello, garbage, ingest,
bye, abrupt close, and stretches of not reading. A ``ping`` closes each
group of frames, so the model knows what the daemon has read when its
``pong`` arrives: errors and replies before it belong to that group, and a
subscription is *confirmed* from then on.

Checked after every step, or as frames arrive:

- the daemon is alive and answers ``status`` on a fresh connection;
- the seqs each subscription gets strictly increase, and a resumed one's
  start past its ``since_seq``;
- an event reaches only subscriptions whose filter matches it, never
  twice, and nothing of a refused publish frame is delivered;
- every error, reply and ``pong`` is the one the frames sent call for;
- every goodbye carries a resume point, and a subscription misses nothing
  that matched from its confirmation to its goodbye: what it did not
  receive has a ``seq`` past ``resume_seq``, and arrives when a fresh
  connection subscribes with ``since_seq=resume_seq`` (before a marker that
  connection publishes right after: then the answer needs no timeout);
- at the end, every client still connected gets ``goodbye(shutdown)`` and
  the daemon exits 0 on SIGTERM.

CI runs ``BUSD_MODEL_EXAMPLES`` examples (default 60, about 30 s when all
pass) of at most ``BUSD_MODEL_STEPS`` steps (default 30), each against a
daemon of its own. ``BUSD_MODEL_SHRINK=0`` skips shrinking a failure (which
may take hypothesis five minutes), and ``BUSD_MODEL_IGNORE`` counts the
violations it names instead of failing on them, to look past a known bug.
``contrib/soak/soak.py`` runs the same machine for as long as asked,
against one long-lived daemon.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import itertools
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal, TypeAlias

import msgspec
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

# -- the daemon under test -----------------------------------------------------

MAX_SUBSCRIPTIONS = 4
OUTBOUND_CAP = 16_384
DAEMON_ARGS: tuple[str, ...] = (
    # A small ring, so resumes read the journal; small caps, so a client that
    # stops reading becomes a slow consumer within one example.
    "--replay=64",
    f"--outbound-cap={OUTBOUND_CAP}",
    f"--max-subscriptions={MAX_SUBSCRIPTIONS}",
    "--max-requests=4",
    "--log-level=warning",
)
UNREAD_GRACE = 1.0
"""Seconds of not reading after which the daemon may close without a goodbye getting out
(its shortest closing timeout is one second)."""
CRASH_GRACE = 3.0
"""Seconds a daemon that is crashing may take to exit: a crash cuts every connection first,
and is reported as the crash (not as what a client saw of it), so failures replay alike."""
IO_TIMEOUT = float(os.environ.get("BUSD_MODEL_TIMEOUT", "10"))
"""Seconds any one answer may take before the daemon counts as stalled."""
RESUME_ATTEMPTS = 5
"""Resuming connections, one after the other's goodbye, before giving up."""
IGNORED = frozenset(filter(None, os.environ.get("BUSD_MODEL_IGNORE", "").split(",")))
"""Kinds of violation (class names below) to count instead of raising: NoGoodbye,
RefusedDelivered, WrongAnswer (errors only), ResumeSkips, ResumeMisses."""


class ServeProcess:
    """``busd serve`` on a private socket and journal, its log kept in a file.

    Blocking, for a state machine that runs without an event loop.
    :meth:`spawn` starts one ahead of time: an example waits for its daemon
    only as long as the previous example took less than a start (~0.5 s).
    """

    _spare: ClassVar[ServeProcess | None] = None

    @classmethod
    def spawn(cls) -> ServeProcess:
        """A daemon ready to serve; the next one starts meanwhile."""
        daemon = cls._spare or cls()
        cls._spare = cls()
        daemon.ready()
        return daemon

    @classmethod
    def discard_spare(cls) -> None:
        if cls._spare is not None:
            cls._spare.close()
            cls._spare = None

    def __init__(self, args: Sequence[str] = DAEMON_ARGS, *, directory: Path | None = None) -> None:
        """Socket, journal and log in ``directory`` (kept), else in a fresh one (removed)."""
        self._owns_directory = directory is None
        self.directory = directory or Path(tempfile.mkdtemp(prefix="busd-model-"))
        self.socket = str(self.directory / "bus.sock")
        self.log = self.directory / "serve.log"
        command = [sys.executable, "-m", "busd", "serve", "--socket", self.socket]
        command += ["--journal", str(self.directory / "journal.sqlite3"), *args]
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(
                command,
                cwd=self.directory,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=log,
            )
        self.returncode: int | None = None
        self._ready = False

    def ready(self) -> None:
        """Wait until it listens (it says so on stdout)."""
        if self._ready:
            return
        assert self.process.stdout is not None
        ready, _, _ = select.select([self.process.stdout], [], [], 30)
        line = self.process.stdout.readline().decode() if ready else ""
        if "listening on" not in line:
            self.process.kill()
            self.process.wait()
            raise RuntimeError(f"busd serve did not start: {line!r}\n{self.log_tail()}")
        self._ready = True

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self.process.poll() is None

    def terminate(self) -> None:
        """SIGTERM: the daemon says goodbye to everyone and exits."""
        if self.alive():
            self.process.send_signal(signal.SIGTERM)

    def wait(self, timeout: float = 30) -> int:
        """The exit code; a daemon still running after ``timeout`` is killed (and fails)."""
        try:
            code = self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            code = -signal.SIGKILL
        self.returncode = code
        return code

    def close(self) -> None:
        """Kill what is left and remove the directory it made (idempotent)."""
        if self.alive():
            self.process.kill()
        self.process.wait()
        if self.process.stdout is not None:
            self.process.stdout.close()
        if self._owns_directory:
            shutil.rmtree(self.directory, ignore_errors=True)

    def rss_kib(self) -> int:
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        return 0

    def open_fds(self) -> int:
        return len(os.listdir(f"/proc/{self.pid}/fd"))

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])


# -- the test's own codec --------------------------------------------------------

Frame: TypeAlias = dict[str, Any]
_encode = msgspec.msgpack.Encoder().encode


def framed(value: object) -> bytes:
    """One frame: a 4-byte big-endian length, then the msgpack body."""
    body = _encode(value)
    return len(body).to_bytes(4, "big") + body


def raw_frame(body: bytes) -> bytes:
    return len(body).to_bytes(4, "big") + body


class Stalled(AssertionError):
    """The daemon did not answer within ``IO_TIMEOUT``."""


class BadServerFrame(AssertionError):
    """The daemon sent a body that is not one msgpack map with an ``op``, or a frame cut short."""


class Peer:
    """One blocking connection to the daemon, frames in and out as dicts."""

    def __init__(self, path: str) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(IO_TIMEOUT)
        self.sock.connect(path)
        self._buffer = bytearray()
        self.eof = False

    def send(self, data: bytes) -> bool:
        """``False`` if the daemon closed the connection (what it sent is still readable)."""
        try:
            self.sock.settimeout(IO_TIMEOUT)
            self.sock.sendall(data)
        except (BrokenPipeError, ConnectionResetError):
            return False
        except TimeoutError:
            raise Stalled(f"the daemon read nothing for {IO_TIMEOUT} s") from None
        return True

    def _frames(self) -> list[Frame]:
        frames: list[Frame] = []
        buffer = self._buffer
        while len(buffer) >= 4:
            size = int.from_bytes(buffer[:4], "big")
            if len(buffer) < 4 + size:
                break
            body = bytes(buffer[4 : 4 + size])
            del buffer[: 4 + size]
            try:
                frame = msgspec.msgpack.decode(body)
            except msgspec.DecodeError as exc:
                raise BadServerFrame(f"undecodable frame from the daemon: {exc}") from None
            if not isinstance(frame, dict) or not isinstance(frame.get("op"), str):
                raise BadServerFrame(f"a frame that is not a map with an op: {frame!r}")
            frames.append(frame)
        return frames

    def _take(self, data: bytes) -> None:
        if data:
            self._buffer += data
        else:
            self.eof = True

    def _torn(self) -> None:
        """At the end, after every complete frame: what is left is a frame cut short."""
        if self.eof and self._buffer:
            size = int.from_bytes(self._buffer[:4].ljust(4, b"\0"), "big")
            raise BadServerFrame(
                f"the daemon closed the connection {len(self._buffer) - 4} bytes into a frame "
                f"of {size}: the frame was cut (its head: {bytes(self._buffer[:40])!r})"
            )

    def receive_nowait(self) -> list[Frame]:
        """Whatever frames are complete now, without waiting."""
        self.sock.settimeout(0)
        while not self.eof:
            try:
                data = self.sock.recv(1 << 16)
            except BlockingIOError:
                break
            except ConnectionResetError:
                data = b""
            self._take(data)
        frames = self._frames()
        if not frames:
            self._torn()
        return frames

    def receive(self, deadline: float) -> list[Frame]:
        """At least one frame, or ``[]`` once the daemon closed; ``Stalled`` past ``deadline``."""
        while True:
            frames = self._frames()
            if not frames:
                self._torn()
            if frames or self.eof:
                return frames
            self.sock.settimeout(max(0.001, deadline - time.monotonic()))
            try:
                data = self.sock.recv(1 << 16)
            except TimeoutError:
                raise Stalled(f"no frame from the daemon within {IO_TIMEOUT} s") from None
            except ConnectionResetError:
                data = b""
            self._take(data)

    def close(self) -> None:
        self.sock.close()


# -- what can go wrong (one class each, so hypothesis reports them apart) -------


class DaemonDied(AssertionError):
    """The daemon process exited, or exited non-zero on SIGTERM."""


class StatusUnanswered(AssertionError):
    """A fresh connection did not get its ``status`` reply."""


class SeqNotIncreasing(AssertionError):
    """A subscription got a ``seq`` not above the previous one (or not past its ``since_seq``)."""


class ConnectFailed(AssertionError):
    """The daemon runs, but a connection to it failed."""


class WrongDelivery(AssertionError):
    """An event reached a subscription it does not match, twice, or after it ended."""


class RefusedDelivered(AssertionError):
    """An event of a publish frame the daemon had to refuse was delivered."""


class WrongAnswer(AssertionError):
    """An error, reply or pong that the frames sent do not call for (or one missing)."""


class NoGoodbye(AssertionError):
    """The connection ended without a ``goodbye`` carrying a resume point."""


class ResumeSkips(AssertionError):
    """An event that matched was neither delivered nor after ``goodbye.resume_seq``."""


class ResumeMisses(AssertionError):
    """Resuming from ``goodbye.resume_seq`` did not deliver what the connection missed."""


# -- events the model publishes and can recognise ------------------------------

KINDS: dict[str, str] = {
    # Lifecycle events are never superseded; a tool start keyed by a unique
    # call id never is either; deltas merge, losslessly (tokens end with ";").
    "info": "stream.session.info",
    "warning": "stream.session.warning",
    "turn": "stream.turn.start",
    "delta": "stream.text.delta",
    "tool": "stream.tool.start",
}
SESSIONS = (None, "s1", "s2")


def event_body(kind: str, token: str, slot: int) -> dict[str, Any]:
    name = KINDS[kind]
    if kind in ("info", "warning"):
        return {"type": name, "message": token}
    if kind == "turn":
        return {"type": name, "turn_id": token}
    if kind == "delta":
        return {"type": name, "message_id": f"m{slot}", "text": token + ";"}
    return {"type": name, "tool_call_id": token, "name": "Read"}


def tokens_in(event: Any) -> list[str]:
    """The model's tokens an event carries (several in a merged delta), last one last."""
    if not isinstance(event, dict):
        return []
    kind = event.get("type")
    value: Any = None
    if kind in ("stream.session.info", "stream.session.warning"):
        value = event.get("message")
    elif kind == "stream.turn.start":
        value = event.get("turn_id")
    elif kind == "stream.tool.start":
        value = event.get("tool_call_id")
    elif kind == "stream.text.delta":
        text = event.get("text")
        return text.split(";")[:-1] if isinstance(text, str) else []
    return [value] if isinstance(value, str) else []


def pattern_matches(pattern: str, name: str) -> bool:
    """NATS token matching, written again here: the model's own oracle."""
    tokens, parts = pattern.split("."), name.split(".")
    for i, token in enumerate(tokens):
        if token == ">":
            return len(parts) > i
        if i >= len(parts) or (token != "*" and token != parts[i]):
            return False
    return len(tokens) == len(parts)


def pattern_valid(pattern: str) -> bool:
    tokens = pattern.split(".")
    return (
        all(
            token and (token in ("*", ">") or not ("*" in token or ">" in token))
            for token in tokens
        )
        and ">" not in tokens[:-1]
    )


@dataclass(frozen=True)
class Filter:
    patterns: tuple[str, ...]
    sessions: tuple[str, ...] | None
    owned_only: bool

    def admits(self, name: str, session: str | None) -> bool:
        if self.owned_only:  # the model's runs are all refused: it owns none
            return False
        if self.sessions is not None and session not in self.sessions:
            return False
        return any(pattern_matches(p, name) for p in self.patterns)


# -- actions: what a client may send ---------------------------------------------


def _short_repr(self: object) -> str:
    """Fields that differ from their default only: falsifying examples stay readable."""
    shown = []
    for f in dataclasses.fields(self):  # type: ignore[arg-type]
        value = getattr(self, f.name)
        if f.default is dataclasses.MISSING or value != f.default:
            shown.append(f"{f.name}={value!r}")
    return f"{type(self).__name__}({', '.join(shown)})"


@dataclass(frozen=True, repr=False)
class Sub:
    id: int
    patterns: tuple[str, ...] = (">",)
    sessions: tuple[str, ...] | None = None
    owned_only: bool = False
    window_ms: int = 16
    deltas: str = "merged"
    since: int | Literal["ahead"] | None = None
    """``None``: live only; ``k``: ``k`` before the highest seq seen; ``"ahead"``: past the head."""

    __repr__ = _short_repr


@dataclass(frozen=True, repr=False)
class Unsub:
    id: int

    __repr__ = _short_repr


@dataclass(frozen=True, repr=False)
class Pub:
    events: tuple[tuple[str, str | None], ...]
    """(kind, session) pairs."""
    run: bool = False
    """Give every event a ``run_id`` no client started."""
    flaw: str | None = None
    """``None``, or what makes the daemon refuse the whole frame (see ``FLAWS``)."""

    __repr__ = _short_repr


FLAWS = ("unknown_type", "bad_field", "daemon_type", "ext", "binary")


@dataclass(frozen=True, repr=False)
class Flood:
    count: int
    session: str | None = None

    __repr__ = _short_repr


REQUESTS: dict[str, tuple[dict[str, Any], frozenset[str]]] = {
    # command map, and the answers the docs allow (besides too_many_requests)
    "status": ({"cmd": "status"}, frozenset({"ok"})),
    "sessions": ({"cmd": "sessions", "limit": 5}, frozenset({"ok"})),
    "snapshot": ({"cmd": "snapshot", "session_id": "s1"}, frozenset({"ok", "unknown_session"})),
    "snapshot_unknown": ({"cmd": "snapshot", "session_id": "nope"}, frozenset({"unknown_session"})),
    "stats": ({"cmd": "stats"}, frozenset({"ok"})),
    "stats_unknown": ({"cmd": "stats", "session_id": "nope"}, frozenset({"unknown_session"})),
    "runs": ({"cmd": "runs"}, frozenset({"ok"})),
    "start_run_bad_adapter": (
        {"cmd": "start_run", "adapter": "nope", "prompt": "hi"},
        frozenset({"unknown_adapter"}),
    ),
    "cancel_run_unknown": ({"cmd": "cancel_run", "run_id": "nope"}, frozenset({"unknown_run"})),
    "permission_reply_unknown": (
        {"cmd": "permission_reply", "request_id": "nope", "allow": True},
        frozenset({"unknown_request"}),
    ),
    "unknown_command": ({"cmd": "reboot"}, frozenset({"unknown_command"})),
    "malformed_command": ({"cmd": "snapshot"}, frozenset({"malformed_frame"})),
}


@dataclass(frozen=True, repr=False)
class Req:
    command: str

    __repr__ = _short_repr


@dataclass(frozen=True, repr=False)
class Ping:
    __repr__ = _short_repr


@dataclass(frozen=True, repr=False)
class HelloAgain:
    __repr__ = _short_repr


GARBAGE: dict[str, bytes] = {
    "not_msgpack": raw_frame(b"\xc1"),
    "not_a_map": framed([1, 2]),
    "no_op": framed({"id": 1}),
    "unknown_op": framed({"op": "teleport"}),
    "server_op": framed({"op": "welcome", "server": "x"}),
    "wrong_type": framed({"op": "subscribe", "id": "one"}),
    "trailing_bytes": raw_frame(_encode({"op": "ping"}) + b"\x00"),
    "invalid_utf8": raw_frame(b"\x82\xa2op\xa4ping\xa5nonce\xa2\xff\xfe"),
}


@dataclass(frozen=True, repr=False)
class Garbage:
    kind: str

    __repr__ = _short_repr


@dataclass(frozen=True, repr=False)
class Ingest:
    sdk: str
    end: bool = False

    __repr__ = _short_repr


Action: TypeAlias = Sub | Unsub | Pub | Flood | Req | Ping | HelloAgain | Garbage | Ingest

# -- what the model knows ----------------------------------------------------------


@dataclass(eq=False)
class Token:
    """One event the model published, recognised wherever it is delivered."""

    name: str
    session: str | None
    accepted: bool
    """The frame was valid: the daemon must publish the event (else: must not)."""
    processed: bool = False
    """The daemon read it: its publisher got the pong that followed, or someone received it."""
    seq: int | None = None
    """Known once some subscription received the event unmerged."""


@dataclass(eq=False)
class SubModel:
    """One subscription as the model expects it to behave."""

    client: int
    id: int
    filter: Filter
    since: int | None
    label: str
    confirmed: bool = False
    """Its pong arrived: every matching event published from now on must arrive."""
    expecting: bool = True
    """No unsubscribe, re-subscribe, bye or fatal frame sent since."""
    dropped: bool = False
    """Unsubscribed or replaced: what it had batched may be dropped."""
    last_seq: int = 0
    expected: set[str] = field(default_factory=set)
    received: set[str] = field(default_factory=set)
    credited: set[str] = field(default_factory=set)
    """Received while a subscribe or unsubscribe of its id was in flight: maybe its own."""
    gaps: list[tuple[int, int]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    """What happened to it that a failure message should mention."""

    def describe(self) -> str:
        notes = [*self.notes, *(f"a gap {a}..{b} was reported" for a, b in self.gaps)]
        return f"{self.label} [{'; '.join(notes)}]" if notes else self.label

    def __post_init__(self) -> None:
        self.last_seq = self.since or 0


@dataclass(frozen=True)
class Must:
    codes: frozenset[str]
    ref: int | None
    why: str


@dataclass(eq=False)
class Group:
    """Frames written together up to a ping: what the daemon owes before its pong."""

    nonce: int
    actions: list[Action] = field(default_factory=list)
    musts: list[Must] = field(default_factory=list)
    mays: set[str] = field(default_factory=set)
    transitions: list[tuple[int, SubModel | None]] = field(default_factory=list)
    requests: list[int] = field(default_factory=list)
    tokens: list[str] = field(default_factory=list)
    errors: list[Frame] = field(default_factory=list)


@dataclass(eq=False)
class Client:
    slot: int
    peer: Peer
    reading: bool = True
    live: dict[int, SubModel] = field(default_factory=dict)
    """Subscriptions as the daemon has them once it has read everything sent."""
    current: dict[int, SubModel] = field(default_factory=dict)
    """Subscriptions as of the last pong: who arriving events belong to."""
    groups: deque[Group] = field(default_factory=deque)
    requests: dict[int, tuple[str, frozenset[str]]] = field(default_factory=dict)
    answered: set[int] = field(default_factory=set)
    welcomed: bool = False
    goodbye: Frame | None = None
    fatal: Frame | None = None
    sent_fatal: bool = False
    """An oversize prefix was sent: a fatal error is due."""
    unread_since: float | None = None
    longest_unread: float = 0.0
    ended: bool = False
    history: list[str] = field(default_factory=list)

    def unread_for(self) -> float:
        """The longest stretch this client left the daemon's frames unread, in seconds."""
        now = time.monotonic()
        current = 0.0 if self.unread_since is None else now - self.unread_since
        return max(self.longest_unread, current)

    def pending_subs(self, sub_id: int) -> list[SubModel]:
        return [s for g in self.groups for i, s in g.transitions if i == sub_id and s is not None]

    def in_flux(self, sub_id: int) -> bool:
        return any(i == sub_id for g in self.groups for i, _ in g.transitions)


def _answers(musts: Sequence[Must], errors: Sequence[Frame], mays: set[str]) -> bool:
    """Whether ``errors`` are ``musts`` in order, one each, with only ``mays`` in between."""

    @functools.cache
    def fits(i: int, j: int) -> bool:
        if j == len(errors):
            return i == len(musts)
        code, ref = errors[j].get("code"), errors[j].get("ref")
        owed = i < len(musts) and code in musts[i].codes and musts[i].ref in (None, ref)
        return (owed and fits(i + 1, j + 1)) or (code in mays and fits(i, j + 1))

    return fits(0, 0)


def _session(f: Filter) -> str | None:
    """A session ``f`` admits."""
    return None if f.sessions is None else f.sessions[0]


def _tag() -> str:
    return uuid.uuid4().hex[:6]


# -- the machine -------------------------------------------------------------------

slots = st.integers(0, 2)
sub_ids = st.integers(1, MAX_SUBSCRIPTIONS + 1)
VALID_PATTERNS = (
    ">",
    "stream.>",
    "stream.session.*",
    "stream.text.delta",
    "stream.tool.start",
    "stream.*.start",
    "busd.>",
)
INVALID_PATTERNS = ("stream.te*", "stream..info", ">.x", "")
pattern_lists = st.one_of(
    st.lists(st.sampled_from(VALID_PATTERNS), min_size=1, max_size=2, unique=True).map(tuple),
    st.tuples(st.sampled_from(VALID_PATTERNS), st.sampled_from(INVALID_PATTERNS)),
)
subscribes = st.builds(
    Sub,
    id=sub_ids,
    patterns=pattern_lists,
    sessions=st.none() | st.sampled_from([("s1",), ("s2",), ("s1", "s2")]),
    owned_only=st.booleans(),
    window_ms=st.sampled_from([0, 16, 100]),
    deltas=st.sampled_from(["merged", "raw"]),
    since=st.none() | st.integers(0, 40) | st.just("ahead"),
)
publishes = st.builds(
    Pub,
    events=st.lists(
        st.tuples(st.sampled_from(sorted(KINDS)), st.sampled_from(SESSIONS)),
        min_size=1,
        max_size=4,
    ).map(tuple),
    run=st.booleans(),
    flaw=st.none() | st.none() | st.sampled_from(FLAWS),
)
actions: st.SearchStrategy[Action] = st.one_of(
    subscribes,
    st.builds(Unsub, id=sub_ids),
    publishes,
    st.builds(Req, command=st.sampled_from(sorted(REQUESTS))),
    st.just(Ping()),
    st.just(HelloAgain()),
    st.builds(Garbage, kind=st.sampled_from(sorted(GARBAGE))),
    st.builds(Ingest, sdk=st.sampled_from(["anthropic", "no-such-sdk"]), end=st.booleans()),
)

Step = Callable[..., None]


def guarded(method: Step) -> Step:
    """Count the step, and mark the machine broken when it fails: teardown then only cleans up."""

    @functools.wraps(method)
    def wrapper(self: ProtocolModel, *args: Any, **kwargs: Any) -> None:
        if method.__name__ != "daemon_answers_status":
            self.stats["steps"] += 1
        try:
            try:
                method(self, *args, **kwargs)
            except Stalled:
                self._check_alive(grace=CRASH_GRACE)
                raise
        except BaseException as exc:
            self.broken = True
            self.stats[f"violation: {type(exc).__name__}"] += 1
            raise

    return wrapper


class ProtocolModel(RuleBasedStateMachine):
    """Clients against one daemon; every answer is checked against the model."""

    daemon_factory: ClassVar[Callable[[], ServeProcess] | None] = None
    """Set by the soak: a long-lived daemon shared by every example (not stopped here)."""
    stats: ClassVar[Counter[str]] = Counter()
    """Examples, steps, exits and violations, summed over a run (the soak prints them)."""
    ignored_examples: ClassVar[dict[str, list[str]]] = {}
    """The first few messages of each kind of violation counted and ignored."""

    def __init__(self) -> None:
        super().__init__()
        self.broken = False
        factory = type(self).daemon_factory
        self.owns_daemon = factory is None
        self.daemon = ServeProcess.spawn() if factory is None else factory()
        self.stats["examples"] += 1
        self.tag = _tag()
        self.serial = itertools.count(1)
        self.clients: dict[int, Client] = {}
        self.silent: list[Peer] = []
        self.tokens: dict[str, Token] = {}
        try:
            status = self._status()
        except BaseException:
            if self.owns_daemon:  # no teardown for a machine that was never made
                self.daemon.close()
            raise
        self.adapters: list[str] = status["adapters"]
        self.max_seq: int = status["head_seq"]
        """The highest seq seen: ``Sub.since`` counts back from it."""

    # -- connections -------------------------------------------------------------

    def _client(self, slot: int) -> Client:
        client = self.clients.get(slot)
        if client is None or client.ended:
            peer = self._connect()
            client = Client(slot, peer)
            self.clients[slot] = client
            peer.send(
                framed({"op": "hello", "protocol": 1, "client": f"model-{slot}", "role": "admin"})
            )
            client.history.append("connected")
        return client

    def _connect(self) -> Peer:
        try:
            return Peer(self.daemon.socket)
        except OSError as exc:
            self._check_alive(grace=CRASH_GRACE)
            raise ConnectFailed(f"connecting to the running daemon failed: {exc!r}") from None

    def _fail(self, violation: AssertionError) -> None:
        """Raise ``violation``, unless BUSD_MODEL_IGNORE names its kind: then count it and go on.

        For looking past a known failure while it is being fixed; the soak
        prints what it counted.
        """
        kind = type(violation).__name__
        if kind not in IGNORED:
            raise violation
        self.stats[f"ignored: {kind}"] += 1
        examples = self.ignored_examples.setdefault(kind, [])
        if len(examples) < 20:
            examples.append(str(violation))

    def _note(self, client: Client, what: str) -> None:
        client.history.append(what)
        del client.history[:-12]

    # -- sending -------------------------------------------------------------------

    def _send(self, client: Client, items: Sequence[Action], *, dense: bool = False) -> None:
        """Write ``items`` in one write, a ping after each (or after all, ``dense``)."""
        data = bytearray()
        group = Group(next(self.serial))
        for index, action in enumerate(items):
            data += self._apply(client, action, group)
            if not dense or index == len(items) - 1:
                data += framed({"op": "ping", "nonce": group.nonce})
                client.groups.append(group)
                group = Group(next(self.serial))
        self._note(client, f"sent {list(items)!r}{' dense' if dense else ''}")
        client.peer.send(bytes(data))
        if client.reading:
            self._settle(client)

    def _apply(self, client: Client, action: Action, group: Group) -> bytes:
        """The frames for ``action``; what the daemon owes for them goes into ``group``."""
        group.actions.append(action)
        match action:
            case Sub():
                return self._subscribe(client, action, group)
            case Unsub(id=sub_id):
                old = client.live.pop(sub_id, None)
                if old is None:
                    group.musts.append(Must(frozenset({"unknown_subscription"}), sub_id, "unsub"))
                else:
                    old.expecting, old.dropped = False, True
                    group.transitions.append((sub_id, None))
                return framed({"op": "unsubscribe", "id": sub_id})
            case Pub():
                return self._publish(client, action, group)
            case Flood(count=count, session=session):
                body = [
                    self._outgoing(client, "info", session, None, group, accepted=True)
                    for _ in range(count)
                ]
                return framed({"op": "publish", "events": body})
            case Req(command=name):
                request_id = next(self.serial)
                command, answers = REQUESTS[name]
                client.requests[request_id] = (name, answers)
                group.requests.append(request_id)
                return framed({"op": "request", "id": request_id, "command": command})
            case Ping():
                return b""  # the group's own ping follows
            case HelloAgain():
                group.musts.append(Must(frozenset({"bad_handshake"}), None, "second hello"))
                return framed({"op": "hello", "protocol": 1, "client": "again"})
            case Garbage(kind=kind):
                codes = frozenset({"malformed_frame", "unknown_frame"})
                group.musts.append(Must(codes, None, f"garbage {kind}"))
                return GARBAGE[kind]
            case Ingest(sdk=sdk, end=end):
                if sdk not in self.adapters:
                    group.musts.append(Must(frozenset({"unknown_sdk"}), None, "ingest"))
                payload = [{"type": "message_start", "message": {"id": "x"}}, {"type": "?"}]
                frame = {"op": "ingest", "sdk": sdk, "events": payload, "session_id": "si"}
                return framed({**frame, "end": end})
        raise AssertionError(action)

    def _subscribe(self, client: Client, action: Sub, group: Group) -> bytes:
        sub_id = action.id
        since: int | None
        if action.since == "ahead":
            since = self.max_seq + 1_000_000
        elif action.since is None:
            since = None
        else:
            since = max(0, self.max_seq - action.since)
        frame: Frame = {
            "op": "subscribe",
            "id": sub_id,
            "patterns": list(action.patterns),
            "owned_only": action.owned_only,
            "window_ms": action.window_ms,
            "deltas": action.deltas,
        }
        if action.sessions is not None:
            frame["sessions"] = list(action.sessions)
        if since is not None:
            frame["since_seq"] = since
        old = client.live.get(sub_id)
        if old is None and len(client.live) >= MAX_SUBSCRIPTIONS:
            group.musts.append(Must(frozenset({"too_many_subscriptions"}), sub_id, "subscribe"))
        elif not all(pattern_valid(p) for p in action.patterns):
            # protocol.md: "no subscription is made"; a live one with this id stays.
            group.musts.append(Must(frozenset({"invalid_pattern"}), sub_id, "subscribe"))
            if old is not None:
                old.notes.append(f"a re-subscribe {action!r} was refused: it must stay live")
        else:
            if action.since == "ahead":
                group.musts.append(Must(frozenset({"seq_ahead"}), sub_id, "since ahead"))
            if old is not None:
                old.expecting, old.dropped = False, True
            sub = SubModel(
                client.slot,
                sub_id,
                Filter(action.patterns, action.sessions, action.owned_only),
                None if action.since == "ahead" else since,
                f"client {client.slot} sub {sub_id} {action!r} (since_seq={since})",
            )
            client.live[sub_id] = sub
            group.transitions.append((sub_id, sub))
        return framed(frame)

    def _outgoing(
        self,
        client: Client,
        kind: str,
        session: str | None,
        run: str | None,
        group: Group,
        *,
        accepted: bool,
    ) -> dict[str, Any]:
        token = f"{self.tag}.{next(self.serial)}"
        name = KINDS[kind]
        self.tokens[token] = Token(name, session, accepted)
        group.tokens.append(token)
        if accepted:
            for other in self.clients.values():
                for sub in other.current.values():
                    if sub.confirmed and sub.expecting and sub.filter.admits(name, session):
                        sub.expected.add(token)
        outgoing: dict[str, Any] = {"event": event_body(kind, token, client.slot)}
        if session is not None:
            outgoing["session_id"] = session
        if run is not None:
            outgoing["run_id"] = run
        return outgoing

    def _publish(self, client: Client, action: Pub, group: Group) -> bytes:
        accepted = action.flaw is None
        run = "r-nobody-started" if action.run else None
        events = [
            self._outgoing(client, kind, session, run, group, accepted=accepted)
            for kind, session in action.events
        ]
        bad: dict[str, Any] | None = None
        match action.flaw:
            case "unknown_type":
                bad = {"event": {"type": "stream.no.such"}}
            case "bad_field":
                bad = {"event": {"type": "stream.session.info", "message": 5}}
            case "daemon_type":
                # Decodes, but clients may not publish busd.*: the frame is all or nothing.
                bad = {"event": {"type": "busd.internal.error", "where": "x", "message": "y"}}
            case "ext":
                ext = msgspec.msgpack.Ext(1, b"e")
                bad = {"event": {**event_body("tool", "ext", 0), "input": {"x": ext}}}
            case "binary":
                bad = {"event": {**event_body("tool", "bin", 0), "input": {"x": b"\x00\x01"}}}
        if bad is not None:
            events.insert(len(events) // 2, bad)
            codes = frozenset({"invalid_event", "malformed_frame", "forbidden"})
            group.musts.append(Must(codes, None, f"publish with {action.flaw}"))
            group.mays |= codes  # one error per refused event is fine too
        return framed({"op": "publish", "events": events})

    # -- receiving -------------------------------------------------------------------

    def _settle(self, client: Client) -> None:
        """Read until every group sent has its pong (or the connection ended)."""
        deadline = time.monotonic() + IO_TIMEOUT
        while client.groups and not client.ended:
            self._take(client, client.peer.receive(deadline))

    def _drain(self, client: Client) -> None:
        for frame in client.peer.receive_nowait():
            self._on_frame(client, frame)
        if client.peer.eof and not client.ended:
            self._on_frame(client, None)

    def _read_to_end(self, client: Client) -> None:
        deadline = time.monotonic() + IO_TIMEOUT
        while not client.ended:
            self._take(client, client.peer.receive(deadline))

    def _take(self, client: Client, frames: list[Frame]) -> None:
        for frame in frames:
            self._on_frame(client, frame)
        if not frames:
            self._on_frame(client, None)

    def _on_frame(self, client: Client, frame: Frame | None) -> None:
        """One frame from the daemon (``None``: it closed the connection)."""
        if client.ended:
            raise WrongAnswer(f"client {client.slot}: a frame after goodbye: {frame!r}")
        if frame is None:
            self._on_closed(client)
            return
        op = frame["op"]
        if client.goodbye is not None:
            raise WrongAnswer(f"client {client.slot}: {op} after goodbye {client.goodbye!r}")
        if not client.welcomed:
            if op != "welcome":
                raise WrongAnswer(f"client {client.slot}: {frame!r} instead of welcome")
            client.welcomed = True
            self.max_seq = max(self.max_seq, int(frame["head_seq"]))
            return
        match op:
            case "events":
                self._on_events(client, frame)
            case "gap":
                for sub in self._owners(client, frame["sub"], "gap"):
                    sub.gaps.append((frame["from_seq"], frame["to_seq"]))
            case "reply":
                self._on_reply(client, frame)
            case "error":
                self._on_error(client, frame)
            case "pong":
                self._on_pong(client, frame)
            case "goodbye":
                client.goodbye = frame
                self._note(client, f"got {frame!r}")
            case _:
                raise WrongAnswer(f"client {client.slot}: unexpected {frame!r}")

    def _owners(self, client: Client, sub_id: int, what: str) -> list[SubModel]:
        """Who an events or gap frame for ``sub_id`` may belong to.

        While a subscribe or unsubscribe of that id waits for its pong, the
        frame may be the old subscription's or the new one's: both are
        credited, and ``seq`` order is not judged across the switch.
        """
        owners = [s for s in (client.current.get(sub_id), *client.pending_subs(sub_id)) if s]
        if not owners:
            live = [s.describe() for s in client.current.values()]
            raise WrongDelivery(
                f"client {client.slot}: {what} for subscription {sub_id}, which is not live "
                f"(live, as the model has them: {live}); recent: {client.history}"
            )
        return owners

    def _on_events(self, client: Client, frame: Frame) -> None:
        sub_id = frame["sub"]
        owners = self._owners(client, sub_id, "events")
        judged = None if client.in_flux(sub_id) else owners[0]
        for envelope in frame["events"]:
            seq = envelope["seq"]
            self.max_seq = max(self.max_seq, seq)
            if judged is not None:
                if seq <= judged.last_seq:
                    raise SeqNotIncreasing(
                        f"{judged.describe()}: seq {seq} after {judged.last_seq}; "
                        f"recent: {client.history}"
                    )
                judged.last_seq = seq
            found = [t for t in tokens_in(envelope.get("event")) if t in self.tokens]
            for position, token in enumerate(found):
                last = position == len(found) - 1
                self._delivered(client, owners, judged, token, envelope, last=last)

    def _delivered(
        self,
        client: Client,
        owners: list[SubModel],
        judged: SubModel | None,
        token: str,
        envelope: Frame,
        *,
        last: bool,
    ) -> None:
        info = self.tokens[token]
        if not info.accepted:
            self._fail(
                RefusedDelivered(
                    f"client {client.slot} sub {owners[0].id}: event {token} ({info.name}) of a "
                    f"refused publish frame was delivered as seq {envelope['seq']}"
                )
            )
            return
        info.processed = True
        if last:
            info.seq = envelope["seq"]
        if not any(sub.filter.admits(info.name, info.session) for sub in owners):
            raise WrongDelivery(
                f"{owners[0].describe()}: got {info.name} in session {info.session} "
                f"(seq {envelope['seq']}), which its filter excludes"
            )
        if judged is None:
            for sub in owners:
                sub.credited.add(token)
            return
        if token in judged.received:
            raise WrongDelivery(f"{judged.describe()}: event {token} delivered twice")
        judged.received.add(token)

    def _on_reply(self, client: Client, frame: Frame) -> None:
        request_id = frame["id"]
        if request_id not in client.requests or request_id in client.answered:
            raise WrongAnswer(f"client {client.slot}: reply to no pending request: {frame!r}")
        client.answered.add(request_id)
        name, answers = client.requests[request_id]
        code = "ok" if frame.get("ok") else (frame.get("error") or {}).get("code")
        if code not in answers and code != "too_many_requests":
            raise WrongAnswer(
                f"client {client.slot}: request {name} answered {code!r}, expected one of "
                f"{sorted(answers)}: {frame!r}"
            )

    def _on_error(self, client: Client, frame: Frame) -> None:
        if frame.get("fatal"):
            if not client.sent_fatal:
                raise WrongAnswer(
                    f"client {client.slot}: fatal {frame!r}; recent: {client.history}"
                )
            client.fatal = frame
            return
        if not client.groups:
            raise WrongAnswer(f"client {client.slot}: an error nothing sent calls for: {frame!r}")
        client.groups[0].errors.append(frame)

    def _on_pong(self, client: Client, frame: Frame) -> None:
        if not client.groups or frame.get("nonce", 0) != client.groups[0].nonce:
            raise WrongAnswer(f"client {client.slot}: pong out of order: {frame!r}")
        group = client.groups.popleft()
        self._judge_errors(client, group)
        for request_id in group.requests:
            if request_id not in client.answered:
                name = client.requests[request_id][0]
                raise WrongAnswer(f"client {client.slot}: request {name} had no reply before pong")
        for token in group.tokens:
            self.tokens[token].processed = True
        for sub_id, sub in group.transitions:
            if sub is None:
                client.current.pop(sub_id, None)
                continue
            client.current[sub_id] = sub
            if sub.expecting:
                sub.confirmed = True
                self._expect_replay(sub)

    def _expect_replay(self, sub: SubModel) -> None:
        """A resuming subscription owes what matched past ``since_seq``, as far as it is known."""
        if sub.since is None:
            return
        for token, info in self.tokens.items():
            if (
                info.accepted
                and info.seq is not None
                and info.seq > sub.since
                and sub.filter.admits(info.name, info.session)
            ):
                sub.expected.add(token)

    def _judge_errors(self, client: Client, group: Group) -> None:
        """The group's errors answer its frames in order: each owed one once, extras allowed."""
        errors = group.errors
        if any(error.get("code") == "internal" for error in errors):
            raise WrongAnswer(f"client {client.slot}: the daemon failed on {group.actions!r}")
        if not _answers(group.musts, errors, group.mays):
            owed = [(m.why, sorted(m.codes), m.ref) for m in group.musts]
            got = [(e.get("code"), e.get("ref"), e.get("message")) for e in errors]
            self._fail(
                WrongAnswer(
                    f"client {client.slot}: {group.actions!r} owes errors {owed} in this order "
                    f"(and may add {sorted(group.mays)}), but got {got}"
                )
            )

    def _on_closed(self, client: Client) -> None:
        """The daemon closed the connection: whatever the reason, nothing may be lost."""
        client.ended = True
        client.peer.close()
        self._note(client, "closed by the daemon")
        goodbye = client.goodbye
        if goodbye is None and client.unread_for() >= UNREAD_GRACE:
            # A client that reads nothing for so long may be cut off before its goodbye
            # gets through ("while the socket still writes"): nothing to check.
            self.stats["closed while not reading"] += 1
            return
        if goodbye is None:
            if client.fatal is None:
                self._check_alive(grace=CRASH_GRACE)  # a crashing daemon cuts everyone off
            why = f"after fatal {client.fatal!r}" if client.fatal else "without any frame"
            self._fail(
                NoGoodbye(
                    f"client {client.slot}: the daemon closed the connection {why}, with no "
                    f"goodbye (issue 14: every goodbye carries a resume point); "
                    f"recent: {client.history}"
                )
            )
            return
        resume = goodbye.get("resume_seq")
        if not isinstance(resume, int):
            self._fail(NoGoodbye(f"client {client.slot}: {goodbye!r} carries no resume_seq"))
            return
        subs = [s for s in {*client.current.values(), *client.live.values()} if s.confirmed]
        missing = {s: self._missing(s) for s in subs if not s.dropped}
        for sub, tokens in missing.items():
            skipped = sorted(
                (info.seq, token)
                for token in tokens
                if (info := self.tokens[token]).seq is not None and info.seq <= resume
            )
            if skipped:
                self._fail(
                    ResumeSkips(
                        f"{sub.describe()}: {goodbye!r}, but {len(skipped)} events it matched were "
                        f"never delivered and are at or before resume_seq {resume}, as (seq, "
                        f"event): {skipped[:5]} (received {len(sub.received)} of "
                        f"{len(sub.expected)} expected); recent: {client.history}"
                    )
                )
        if self.daemon.alive() and any(missing.values()):
            self._resume(client, resume, {s: t for s, t in missing.items() if t})

    def _missing(self, sub: SubModel) -> set[str]:
        got = sub.received | sub.credited
        return {t for t in sub.expected - got if self.tokens[t].processed}

    def _resume(self, client: Client, resume: int, missing: dict[SubModel, set[str]]) -> None:
        """Subscribe again from ``resume_seq`` on a fresh connection: what was missed must arrive.

        As a client would, it follows a goodbye on the way (a slow consumer
        resumes from its new point), a few times at most.
        """
        wanted = {s.id: set(tokens) for s, tokens in missing.items()}
        since = resume
        endings: list[str] = []
        for _ in range(RESUME_ATTEMPTS):
            goodbye = self._resume_once(client, since, missing, wanted)
            if not any(wanted.values()):
                return
            endings.append(f"from {since}: {goodbye!r}" if goodbye else f"from {since}: no goodbye")
            if goodbye is None or not isinstance(goodbye.get("resume_seq"), int):
                break
            since = goodbye["resume_seq"]
        subs = {s.id: s for s in missing}
        lost = {
            subs[i].describe(): [(t, self.tokens[t].seq) for t in sorted(ts)][:5]
            for i, ts in wanted.items()
            if ts
        }
        self._fail(
            ResumeMisses(
                f"client {client.slot} ended with {client.goodbye!r}; subscribing again "
                f"from resume_seq {resume} did not bring what it missed, as (event, seq) "
                f"by subscription: {lost}; the resuming connections ended {endings}; "
                f"recent: {client.history}"
            )
        )

    def _resume_once(
        self,
        client: Client,
        since: int,
        missing: dict[SubModel, set[str]],
        wanted: dict[int, set[str]],
    ) -> Frame | None:
        """One resuming connection: reads until each subscription's marker, or its end.

        After subscribing it publishes a marker each subscription matches:
        the replay comes first and the marker after it, so once a marker is
        in, whatever that subscription still wants was skipped. Returns the
        goodbye, if the daemon ended the connection with one.
        """
        peer = self._connect()
        markers: dict[int, str] = {}
        try:
            data = framed({"op": "hello", "protocol": 1, "client": "model-resume", "role": "admin"})
            events = []
            for sub in missing:
                f = sub.filter
                frame: Frame = {"op": "subscribe", "id": sub.id, "patterns": list(f.patterns)}
                if f.sessions is not None:
                    frame["sessions"] = list(f.sessions)
                data += framed({**frame, "window_ms": 0, "since_seq": since})
                kind = next(k for k, name in KINDS.items() if f.admits(name, _session(f)))
                markers[sub.id] = f"{self.tag}.marker.{next(self.serial)}"
                event = event_body(kind, markers[sub.id], 9)
                events.append({"event": event, "session_id": _session(f)})
            peer.send(data + framed({"op": "publish", "events": events}))
            last: dict[int, int] = {}
            while markers and not peer.eof:
                for frame in peer.receive(time.monotonic() + IO_TIMEOUT):  # while it progresses
                    if frame["op"] == "goodbye":
                        return frame
                    if frame["op"] != "events":
                        continue
                    sub_id = frame["sub"]
                    for envelope in frame["events"]:
                        seq = envelope["seq"]
                        if seq <= max(since, last.get(sub_id, 0)):
                            raise SeqNotIncreasing(
                                f"resume of client {client.slot} sub {sub_id} from "
                                f"{since}: seq {seq} after {last.get(sub_id)}"
                            )
                        last[sub_id] = seq
                        tokens = set(tokens_in(envelope.get("event")))
                        wanted[sub_id] -= tokens
                        if markers.get(sub_id) in tokens:
                            del markers[sub_id]
            return None
        finally:
            peer.close()

    # -- rules -----------------------------------------------------------------------

    @rule(slot=slots, action=actions)
    @guarded
    def act(self, slot: int, action: Action) -> None:
        """One frame, then a ping."""
        self._send(self._client(slot), [action])

    @rule(slot=slots, items=st.lists(actions, min_size=2, max_size=6), dense=st.booleans())
    @guarded
    def pipeline(self, slot: int, items: list[Action], dense: bool) -> None:
        """Several frames in one write: a ping after each, or one after all (``dense``)."""
        self._send(self._client(slot), items, dense=dense)

    @rule(slot=slots, count=st.sampled_from([300, 2500]), session=st.sampled_from(SESSIONS))
    @guarded
    def flood(self, slot: int, count: int, session: str | None) -> None:
        """One publish frame of many events: enough, with a client not reading, to overflow it."""
        self._send(self._client(slot), [Flood(count, session)])

    @rule(slot=slots)
    @guarded
    def stop_reading(self, slot: int) -> None:
        client = self._client(slot)
        client.reading = False
        if client.unread_since is None:
            client.unread_since = time.monotonic()
        self._note(client, "stopped reading")

    @rule(slot=slots)
    @guarded
    def resume_reading(self, slot: int) -> None:
        client = self._client(slot)
        client.reading = True
        client.longest_unread = client.unread_for()
        client.unread_since = None
        self._note(client, "reads again")
        self._send(client, [Ping()])

    @rule(slot=slots, first=st.lists(actions, max_size=3))
    @guarded
    def bye(self, slot: int, first: list[Action]) -> None:
        """Leave politely: every reply owed, then goodbye(bye) with a resume point."""
        client = self._client(slot)
        if first:
            self._send(client, first, dense=True)
        self._leave(client)

    def _leave(self, client: Client) -> None:
        slot = client.slot
        self._end_subscriptions(client)
        client.peer.send(framed({"op": "bye"}))
        self._note(client, "sent bye")
        self._read_to_end(client)
        reason = None if client.goodbye is None else client.goodbye.get("reason")
        if reason not in (None, "bye", "slow_consumer"):
            raise WrongAnswer(f"client {slot}: bye answered with {client.goodbye!r}")
        unanswered = [n for i, (n, _) in client.requests.items() if i not in client.answered]
        if client.goodbye is not None and client.goodbye.get("reason") == "bye" and unanswered:
            raise WrongAnswer(f"client {slot}: left with requests unanswered: {unanswered}")

    @rule(slot=slots)
    @guarded
    def oversize(self, slot: int) -> None:
        """A length prefix past max_frame: fatal, but the goodbye must still say where to resume."""
        client = self._client(slot)
        self._end_subscriptions(client)
        client.sent_fatal = True
        client.peer.send((1 << 20 | 1).to_bytes(4, "big"))
        self._note(client, "sent an oversize prefix")
        self._read_to_end(client)
        fatal, goodbye = client.fatal, client.goodbye or {}
        if goodbye.get("reason") == "slow_consumer" or client.unread_for() >= UNREAD_GRACE:
            return  # maybe dropped before the daemon read the prefix
        if fatal is None or fatal.get("code") != "frame_too_large":
            raise WrongAnswer(f"client {slot}: oversize frame answered {fatal!r}")

    @rule(slot=slots, partial=st.booleans())
    @guarded
    def close(self, slot: int, partial: bool) -> None:
        """Hang up without bye, maybe in the middle of a frame."""
        client = self._client(slot)
        if partial:
            client.peer.send(framed({"op": "ping", "nonce": 1})[:5])
        client.peer.close()
        client.ended = True

    @rule(kind=st.sampled_from(["garbage", "version", "subscribe_first", "oversize"]))
    @guarded
    def bad_handshake(self, kind: str) -> None:
        """A first frame that is not a good hello: one fatal error, then the end."""
        peer = self._connect()
        try:
            first = {
                "garbage": raw_frame(b"\xc1"),
                "version": framed({"op": "hello", "protocol": 99, "client": "x"}),
                "subscribe_first": framed({"op": "subscribe", "id": 1}),
                "oversize": (1 << 24).to_bytes(4, "big"),
            }[kind]
            peer.send(first)
            frames: list[Frame] = []
            deadline = time.monotonic() + IO_TIMEOUT
            while not peer.eof:
                frames += peer.receive(deadline)
            fatal = [f for f in frames if f["op"] == "error" and f.get("fatal")]
            if len(fatal) != 1 or frames[-1]["op"] not in ("error", "goodbye"):
                raise WrongAnswer(f"a bad first frame ({kind}) was answered {frames!r}")
        finally:
            peer.close()

    @precondition(lambda self: len(self.silent) < 3)
    @rule()
    @guarded
    def silent_socket(self) -> None:
        """A socket that never says hello, kept open to the end."""
        self.silent.append(self._connect())

    def _end_subscriptions(self, client: Client) -> None:
        """Nothing published from now on is owed to this connection."""
        for sub in (*client.current.values(), *client.live.values()):
            sub.expecting = False

    # -- invariants ------------------------------------------------------------------

    @invariant()
    @guarded
    def daemon_answers_status(self) -> None:
        self._check_alive()
        for client in list(self.clients.values()):
            if client.reading and not client.ended:
                self._drain(client)
        self._status()

    def _check_alive(self, grace: float = 0.0) -> None:
        """``DaemonDied``, with its log, if the daemon exited (or does within ``grace`` s)."""
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.daemon.process.wait(grace)
        if not self.daemon.alive():
            raise DaemonDied(
                f"busd serve exited {self.daemon.process.returncode}:\n{self.daemon.log_tail()}"
            )

    def _status(self) -> dict[str, Any]:
        """``status`` on a fresh connection: hello, request and bye in one write."""
        peer = self._connect()
        try:
            peer.send(
                framed({"op": "hello", "protocol": 1, "client": "model-status"})
                + framed({"op": "request", "id": 1, "command": {"cmd": "status"}})
                + framed({"op": "bye"})
            )
            frames: list[Frame] = []
            deadline = time.monotonic() + IO_TIMEOUT
            try:
                while not peer.eof:
                    frames += peer.receive(deadline)
            except Stalled:
                raise StatusUnanswered(f"status: no answer in {IO_TIMEOUT} s: {frames!r}") from None
            ops = [f["op"] for f in frames]
            reply = next((f for f in frames if f["op"] == "reply"), None)
            if ops != ["welcome", "reply", "goodbye"] or reply is None or not reply.get("ok"):
                self._check_alive(grace=CRASH_GRACE)
                raise StatusUnanswered(f"status on a fresh connection: {frames!r}")
            result: dict[str, Any] = reply["result"]
            return result
        finally:
            peer.close()

    # -- the end ---------------------------------------------------------------------

    def teardown(self) -> None:
        try:
            if not self.broken:
                self._finish()
        finally:
            for client in self.clients.values():
                client.peer.close()
            for peer in self.silent:
                peer.close()
            if self.owns_daemon:
                self.daemon.close()

    def _finish(self) -> None:
        """Everyone reading leaves with bye; the others get goodbye(shutdown) on SIGTERM."""
        for client in self.clients.values():
            if client.reading and not client.ended:
                self._leave(client)
        for peer in self.silent:
            peer.close()  # one still in its handshake holds a shutdown for its whole grace
        if not self.owns_daemon:
            return
        self.daemon.terminate()
        for client in self.clients.values():
            if not client.ended:
                self._end_subscriptions(client)
                self._read_to_end(client)
                reason = (client.goodbye or {}).get("reason")
                if reason not in ("shutdown", "slow_consumer"):
                    self._fail(NoGoodbye(f"client {client.slot} at shutdown: {client.goodbye!r}"))
        code = self.daemon.wait()
        if code != 0:
            self.stats["daemon_exits_nonzero"] += 1
            raise DaemonDied(f"busd serve exited {code} on SIGTERM:\n{self.daemon.log_tail()}")


EXAMPLES = int(os.environ.get("BUSD_MODEL_EXAMPLES", "60"))
STEPS = int(os.environ.get("BUSD_MODEL_STEPS", "30"))


SHRINK = os.environ.get("BUSD_MODEL_SHRINK", "1") != "0"


def model_settings(
    examples: int = EXAMPLES, steps: int = STEPS, *, shrink: bool = SHRINK, **extra: Any
) -> settings:
    """Bounded for CI; every example starts its own daemon (about half a second)."""
    phases = tuple(p for p in Phase if shrink or p is not Phase.shrink)
    return settings(
        max_examples=examples,
        stateful_step_count=steps,
        deadline=None,
        phases=phases,
        suppress_health_check=list(HealthCheck),
        **extra,
    )


def test_protocol_model() -> None:
    try:
        run_state_machine_as_test(ProtocolModel, settings=model_settings())
    finally:
        ServeProcess.discard_spare()
