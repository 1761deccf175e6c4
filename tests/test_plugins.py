"""The plugin system under deliberately broken plugins, with a real daemon where it matters.

Each test builds its own :class:`PluginManager` with ``environ={}`` (nothing
autoloads) and registers toy plugins directly, except where entry points
themselves are under test: there a throwaway distribution is put on
``sys.path`` so ``importlib.metadata`` really finds it.
"""

from __future__ import annotations

import importlib.util
import itertools
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import AsyncIterator, Callable, Hashable, Iterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio
import trio.testing
from click.testing import CliRunner

from busd.cli import main as cli
from busd.client import ClientSubscription, connect
from busd.core.catalog import Catalog
from busd.core.errors import PluginConfigError
from busd.core.events import (
    Envelope,
    Event,
    InternalError,
    PermissionRequested,
    SessionIdle,
    SessionInfo,
    SessionStart,
    TextComplete,
    TextDelta,
    TokenUsage,
    TurnEnd,
    Usage,
    event_type,
)
from busd.core.reports import REPORT_EVERY
from busd.daemon.batching import BatchDispatcher
from busd.daemon.endpoint import Endpoint
from busd.daemon.hub import Daemon
from busd.daemon.server import Server
from busd.plugins.adapters import Adapter, Emitted, Translator, as_mapping
from busd.plugins.hookspecs import Service, hookimpl
from busd.plugins.host import PluginHost
from busd.plugins.manager import KEPT_FAILURES, HookFailure, PluginManager, supervise
from busd.wire import Ingest

from .daemon_helpers import RawClient

TEMPLATE = Path(__file__).resolve().parent.parent / "contrib" / "plugin-template"


# -- toys ------------------------------------------------------------------------


class ToyTranslator(Translator):
    """``{"type": "say", "text": ...}`` → session start (once) and text deltas; finish completes."""

    def __init__(self, *, session_id: str | None = None, explode_on_close: bool = False) -> None:
        super().__init__(session_id=session_id, adapter="toy")
        self.explode_on_close = explode_on_close
        self.text: list[str] | None = None

    def translate(self, raw: object, now: float) -> list[Emitted]:
        event = as_mapping(raw)
        if event.get("type") != "say":
            self.unknown(str(event.get("type")))
            return []
        text = event["text"]  # KeyError: malformed
        out = []
        if self.text is None:
            self.text = []
            out.append(self.emit(SessionStart(model=f"toy@{now}")))
        self.text.append(text)
        out.append(self.emit(TextDelta(message_id="m1", text=text)))
        return out

    def close(self, now: float) -> list[Emitted]:
        if self.explode_on_close:
            raise RuntimeError("close exploded")
        if self.text is None:
            return []
        return [
            self.emit(TextComplete(message_id="m1", text="".join(self.text))),
            self.emit(SessionIdle()),
        ]


class ToyAdapter:
    def __init__(self, name: str = "toy") -> None:
        self.name = name

    def translator(self, *, session_id: str | None = None) -> Translator:
        return ToyTranslator(session_id=session_id)


class AdapterPlugin:
    def __init__(self, *adapters: object) -> None:
        self.adapters = adapters

    @hookimpl
    def busd_adapters(self) -> Sequence[object]:
        return self.adapters


class RaisingPlugin:
    """Every hook it implements raises."""

    @hookimpl
    def busd_adapters(self) -> Sequence[Adapter]:
        raise RuntimeError("adapter hook exploded")

    @hookimpl
    def busd_startup(self, daemon: PluginHost) -> None:
        raise RuntimeError("startup hook exploded")

    @hookimpl
    def busd_shutdown(self, daemon: PluginHost) -> None:
        raise RuntimeError("shutdown hook exploded")


class Lifecycle:
    def __init__(self) -> None:
        self.calls: list[str] = []

    @hookimpl
    def busd_startup(self, daemon: PluginHost) -> None:
        self.calls.append("startup")

    @hookimpl
    def busd_shutdown(self, daemon: PluginHost) -> None:
        self.calls.append("shutdown")


class BuildFinished(Event, frozen=True, tag="acme.build.finished"):
    target: str
    ok: bool = True


class BuildProgress(Event, frozen=True, tag="acme.build.progress"):
    build: str
    percent: int


class FakeSessionStart(Event, frozen=True, tag="stream.session.start"):
    """A plugin type that tries to take a built-in name."""

    hijacked: bool = True


class EventTypes:
    def __init__(self, *types: type[Event]) -> None:
        self.types = types

    @hookimpl
    def busd_event_types(self) -> Sequence[type[Event]]:
        return self.types


def manager(*plugins: object, slow_hook: float = 0.25) -> PluginManager:
    """A manager with nothing autoloaded and ``plugins`` registered in order."""
    pm = PluginManager(environ={}, slow_hook=slow_hook)
    for index, plugin in enumerate(plugins):
        pm.register(plugin, name=f"{type(plugin).__name__.lower()}-{index}")
    return pm


def internal_errors(daemon: Daemon) -> list[InternalError]:
    """Every ``busd.internal.error`` the daemon publishes from now on (a live list)."""
    seen: list[InternalError] = []

    def record(envelope: Envelope[Event]) -> None:
        assert isinstance(envelope.event, InternalError)
        seen.append(envelope.event)

    daemon.bus.on("busd.internal.error", record)
    return seen


# -- isolation: raising, slow, failing to load --------------------------------------


def test_a_raising_hook_is_skipped_and_the_other_plugins_still_answer(
    caplog: pytest.LogCaptureFixture,
) -> None:
    reported: list[HookFailure] = []
    pm = manager(
        AdapterPlugin(ToyAdapter("one")), RaisingPlugin(), AdapterPlugin(ToyAdapter("two"))
    )
    pm.on_error = reported.append

    adapters = pm.adapters()

    assert sorted(adapters) == ["one", "two"]
    failure = HookFailure(
        plugin="raisingplugin-1", hook="busd_adapters", error="RuntimeError: adapter hook exploded"
    )
    assert pm.failures == [failure]
    assert reported == [failure]
    assert "adapter hook exploded" in caplog.text


def test_something_that_is_no_adapter_is_reported_and_the_rest_kept() -> None:
    pm = manager(AdapterPlugin(ToyAdapter("one"), "not an adapter"))

    assert sorted(pm.adapters()) == ["one"]
    assert [(f.hook, f.error) for f in pm.failures] == [
        ("busd_adapters", "TypeError: 'not an adapter' is no adapter")
    ]


def test_when_two_plugins_offer_one_adapter_name_the_first_registered_keeps_it() -> None:
    first, second = ToyAdapter("same"), ToyAdapter("same")
    pm = PluginManager(environ={})
    pm.register(AdapterPlugin(first), name="early")
    pm.register(AdapterPlugin(second), name="late")  # pluggy would ask this one first

    assert pm.adapters()["same"] is first
    [failure] = pm.failures
    assert (failure.plugin, failure.hook) == ("late", "busd_adapters")
    assert "already provided by 'early'" in failure.error


async def test_a_raising_hook_becomes_an_internal_error_event_and_the_daemon_runs_on() -> None:
    lifecycle = Lifecycle()
    daemon = Daemon(plugins=manager(AdapterPlugin(ToyAdapter()), RaisingPlugin(), lifecycle))
    errors = internal_errors(daemon)

    async with trio.open_nursery() as nursery:
        await nursery.start(daemon.run)
        # Hooks that ran before the bus had a publisher are reported once it has one.
        assert [(e.plugin, e.where) for e in errors] == [
            ("raisingplugin-1", "busd_adapters"),
            ("raisingplugin-1", "busd_startup"),
        ]
        assert errors[0].message == "RuntimeError: adapter hook exploded"
        assert sorted(daemon.adapters) == ["toy"]
        assert lifecycle.calls == ["startup"]
        assert daemon.publish(SessionInfo(message="still here")).seq > 0
        nursery.cancel_scope.cancel()

    assert lifecycle.calls == ["startup", "shutdown"]
    assert (errors[-1].plugin, errors[-1].where) == ("raisingplugin-1", "busd_shutdown")
    assert daemon.status()["plugin_failures"] == 3


def test_a_blocking_hook_is_flagged_and_logged_and_still_counts(
    caplog: pytest.LogCaptureFixture,
) -> None:
    class Blocking:
        @hookimpl
        def busd_adapters(self) -> Sequence[Adapter]:
            time.sleep(0.3)  # the behaviour under test: a hook that blocks the daemon
            return [ToyAdapter("slow")]

    pm = manager(Blocking(), AdapterPlugin(ToyAdapter("fast")), slow_hook=0.1)

    with caplog.at_level(logging.WARNING, logger="busd.plugins"):
        adapters = pm.adapters()

    assert sorted(adapters) == ["fast", "slow"]
    [(plugin, hook, elapsed)] = pm.slow_calls
    assert (plugin, hook) == ("blocking-0", "busd_adapters")
    assert elapsed >= 0.3
    assert "'blocking-0' blocked the daemon" in caplog.text
    assert pm.failures == []


GOOD_PLUGIN = """
from busd.plugins.adapters import Translator
from busd.plugins.hookspecs import hookimpl


class _Nothing(Translator):
    def translate(self, raw, now):
        return []


class _Adapter:
    name = "good-sdk"

    def translator(self, *, session_id=None):
        return _Nothing(session_id=session_id)


@hookimpl
def busd_adapters():
    return [_Adapter()]
"""


@pytest.fixture
def installed_plugins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A distribution on ``sys.path``: entry point ``good`` loads, ``bad`` raises at import."""
    modules = {"busd_test_good_plugin": GOOD_PLUGIN, "busd_test_bad_plugin": "1 / 0\n"}
    for module, source in modules.items():
        (tmp_path / f"{module}.py").write_text(source)
    info = tmp_path / "busd_test_plugins-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: busd-test-plugins\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(
        "[busd]\ngood = busd_test_good_plugin\nbad = busd_test_bad_plugin\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delenv("BUSD_DISABLE_PLUGIN_AUTOLOAD", raising=False)
    monkeypatch.delenv("BUSD_BLOCK_PLUGINS", raising=False)
    yield tmp_path
    for module in modules:
        sys.modules.pop(module, None)


def ours(pm: PluginManager) -> tuple[list[str], list[HookFailure]]:
    """The names and failures of the test distribution's plugins (others may be installed)."""
    names = [info.name for info in pm.plugins() if info.name in ("good", "bad")]
    return names, [f for f in pm.failures if f.plugin in ("good", "bad")]


@pytest.mark.usefixtures("installed_plugins")
def test_a_plugin_that_fails_to_import_is_recorded_and_the_rest_load() -> None:
    pm = PluginManager(environ={})
    pm.load_entry_points()

    names, failures = ours(pm)
    assert names == ["good"]
    assert [(f.plugin, f.hook, f.error) for f in failures] == [
        ("bad", "<load>", "ZeroDivisionError: division by zero")
    ]
    [info] = [info for info in pm.plugins() if info.name == "good"]
    assert (info.distribution, info.version) == ("busd-test-plugins", "1.0")
    assert (info.module, info.hooks) == ("busd_test_good_plugin", ["busd_adapters"])
    assert "good-sdk" in pm.adapters()


@pytest.mark.usefixtures("installed_plugins")
def test_disable_autoload_loads_no_entry_point() -> None:
    pm = PluginManager(environ={"BUSD_DISABLE_PLUGIN_AUTOLOAD": "1"})
    pm.load_entry_points()

    assert pm.autoload_disabled
    assert [info.name for info in pm.plugins()] == ["busd.replay"]  # busd's own stays
    assert pm.failures == []


@pytest.mark.usefixtures("installed_plugins")
def test_blocked_plugins_are_skipped_by_name() -> None:
    pm = PluginManager(environ={"BUSD_BLOCK_PLUGINS": " good , other"})
    pm.load_entry_points()

    assert pm.blocked == {"good", "other"}
    names, failures = ours(pm)
    assert names == []
    assert [f.plugin for f in failures] == ["bad"]  # blocking one leaves the others alone

    pm = PluginManager(environ={"BUSD_BLOCK_PLUGINS": "bad"})
    pm.load_entry_points()
    assert ours(pm) == (["good"], [])


@pytest.mark.usefixtures("installed_plugins")
def test_busd_plugins_json_lists_plugins_hooks_adapters_and_failures() -> None:
    result = CliRunner().invoke(cli, ["plugins", "--json"])

    assert result.exit_code == 0, result.output
    listing = json.loads(result.stdout)
    [good] = [p for p in listing["plugins"] if p["name"] == "good"]
    assert good == {
        "name": "good",
        "version": "1.0",
        "distribution": "busd-test-plugins",
        "module": "busd_test_good_plugin",
        "hooks": ["busd_adapters"],
    }
    assert "good-sdk" in listing["adapters"]
    assert {"plugin": "bad", "hook": "<load>", "error": "ZeroDivisionError: division by zero"} in (
        listing["failures"]
    )
    assert listing["autoload_disabled"] is False


# -- registration: event types and coalescing keys ----------------------------------------


@asynccontextmanager
async def serving(path: Path, plugins: PluginManager) -> AsyncIterator[Server]:
    """A daemon with ``plugins`` serving ``path`` in this test's nursery."""
    with Endpoint.bind(path) as endpoint:
        server = Server(Daemon(plugins=plugins, socket_path=str(path)), endpoint.socket)
        async with trio.open_nursery() as nursery:
            await nursery.start(server.run)
            yield server
            nursery.cancel_scope.cancel()


@pytest.fixture
def sock_path() -> Iterator[Path]:
    # AF_UNIX paths are short: pytest's tmp_path can be too long.
    directory = Path(tempfile.mkdtemp(prefix="busd-", dir="/tmp"))
    yield directory / "bus.sock"
    shutil.rmtree(directory, ignore_errors=True)


async def collect_until(
    sub: ClientSubscription, done: Callable[[Envelope[Event]], bool]
) -> list[Envelope[Event]]:
    """Envelopes up to the first that is ``done`` (a guard fails a hung test)."""
    got: list[Envelope[Event]] = []
    with trio.fail_after(10):
        async for batch in sub:
            for envelope in batch.events:
                got.append(envelope)
                if done(envelope):
                    return got
    raise AssertionError(f"the subscription ended after {got!r}")


async def test_plugin_event_types_are_published_and_decoded_like_built_in_ones(
    sock_path: Path,
) -> None:
    catalog = Catalog()
    catalog.register(BuildFinished)  # the clients' side: they know the plugin's types too

    async with (
        serving(sock_path, manager(EventTypes(BuildFinished))) as server,
        connect(sock_path, client="ui", catalog=catalog) as ui,
        ui.subscribe(["acme.>"], window_ms=0) as sub,
        connect(sock_path, client="ci", role="agent", catalog=catalog) as ci,
    ):
        assert "acme.build.finished" in server.daemon.catalog
        assert server.daemon.catalog.frozen
        await ci.publish(BuildFinished(target="wheel", ok=False), session_id="s1")

        [envelope] = await collect_until(sub, lambda e: True)

    assert envelope.event == BuildFinished(target="wheel", ok=False)
    # The daemon labels the source from the connection (docs/protocol.md, hello).
    assert (envelope.session_id, envelope.source) == (
        "s1",
        f"ci[pid={os.getpid()},uid={os.getuid()}]",
    )
    assert ci.errors == []


async def test_a_plugin_type_taking_a_built_in_name_is_refused_and_the_daemon_starts() -> None:
    daemon = Daemon(plugins=manager(EventTypes(FakeSessionStart, BuildFinished)))
    errors = internal_errors(daemon)

    async with trio.open_nursery() as nursery:
        await nursery.start(daemon.run)
        nursery.cancel_scope.cancel()

    assert daemon.catalog.get("stream.session.start") is SessionStart
    assert daemon.catalog.get("acme.build.finished") is BuildFinished  # the rest still count
    [error] = errors
    assert error.where == "busd_event_types"
    assert "'stream.session.start' is already busd.core.events.SessionStart" in error.message


class BuildKeys:
    """Keys build progress per build; records every envelope it is asked about."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    @hookimpl
    def busd_coalescing_key(self, envelope: Envelope[Event]) -> Hashable | None:
        event = envelope.event
        self.asked.append(event_type(event))
        if isinstance(event, BuildProgress):
            return ("acme.build.progress", envelope.session_id, event.build)
        return None


class RaisingKeys:
    @hookimpl
    def busd_coalescing_key(self, envelope: Envelope[Event]) -> Hashable | None:
        raise RuntimeError("keyer exploded")


class UnhashableKeys:
    @hookimpl
    def busd_coalescing_key(self, envelope: Envelope[Event]) -> Hashable | None:
        return ["acme", envelope.seq]  # type: ignore[return-value]


def test_an_unhashable_plugin_key_is_a_plugin_failure_not_a_key() -> None:
    keys = BuildKeys()
    daemon = Daemon(plugins=manager(keys, UnhashableKeys(), EventTypes(BuildProgress)))
    progress = Envelope[Event](seq=1, ts=0.0, event=BuildProgress(build="a", percent=1))
    assert daemon.keyer(progress) == ("acme.build.progress", None, "a")  # the next plugin's
    [failure] = daemon.plugins.failures
    assert (failure.plugin, failure.hook) == ("unhashablekeys-1", "busd_coalescing_key")
    assert "unhashable" in failure.error


def test_a_hook_failing_on_every_call_is_counted_always_and_reported_now_and_then(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A keyer that raises is asked for every keyed envelope of every cohort: a log line,
    a kept failure and a ``busd.internal.error`` each time flooded the log and the bus and
    grew without bound in a daemon left running."""
    now = [0.0]
    pm = PluginManager(environ={}, clock=lambda: now[0])
    pm.register(RaisingKeys(), name="raisingkeys")
    pm.register(EventTypes(BuildProgress), name="types")
    reported: list[HookFailure] = []
    pm.on_error = reported.append
    progress = Envelope[Event](seq=1, ts=0.0, event=BuildProgress(build="a", percent=1))

    with caplog.at_level(logging.ERROR, logger="busd.plugins"):
        for _ in range(1000):
            assert pm.coalescing_key(progress) is None
        assert pm.failure_count == 1000
        assert len(pm.failures) == KEPT_FAILURES  # the latest, for busd plugins
        assert [f.error for f in reported] == ["RuntimeError: keyer exploded"]
        assert len(caplog.records) == 1
        now[0] += REPORT_EVERY - 0.5
        pm.coalescing_key(progress)
        assert len(reported) == 1  # still within the interval
        now[0] += 0.5
        pm.coalescing_key(progress)
    assert pm.failure_count == 1002
    assert [f.error for f in reported][1:] == [
        "RuntimeError: keyer exploded (and 1000 more failures of this hook since the last "
        f"report, {REPORT_EVERY:g} s ago)"
    ]
    assert len(caplog.records) == 2


async def test_a_keyer_failing_on_every_envelope_is_one_internal_error_not_one_each() -> None:
    daemon = Daemon(plugins=manager(RaisingKeys(), EventTypes(BuildProgress)))
    errors = internal_errors(daemon)
    progress = Envelope[Event](seq=1, ts=0.0, event=BuildProgress(build="a", percent=1))
    async with trio.open_nursery() as nursery:
        await nursery.start(daemon.run)
        for _ in range(500):
            assert daemon.keyer(progress) is None  # no key: kept, never superseded
        assert [(e.plugin, e.where, e.message) for e in errors] == [
            ("raisingkeys-0", "busd_coalescing_key", "RuntimeError: keyer exploded")
        ]
        assert daemon.status()["plugin_failures"] == 500
        nursery.cancel_scope.cancel()


async def test_a_plugin_key_lets_the_later_event_supersede_the_earlier_one(
    autojump_clock: trio.testing.MockClock,
) -> None:
    keys = BuildKeys()
    daemon = Daemon(plugins=manager(keys, RaisingKeys(), EventTypes(BuildProgress)))
    batches: list[list[Envelope[Event]]] = []

    async def send(batch: list[Envelope[Event]]) -> None:
        batches.append(batch)

    dispatcher = BatchDispatcher(send, window=1.0, keyer=daemon.keyer)
    daemon.bus.on(">", dispatcher.add)
    async with trio.open_nursery() as nursery:
        await nursery.start(dispatcher.run)
        # One synchronous step: all of these land in the same window.
        for build, percent in (("a", 10), ("b", 50), ("a", 90)):
            daemon.publish(BuildProgress(build=build, percent=percent), session_id="s1")
        daemon.publish(SessionInfo(message="built-in, never asked"), session_id="s1")
        daemon.publish(Usage(tokens=TokenUsage(output_tokens=3)), session_id="s1")
        await dispatcher.flush()
        nursery.cancel_scope.cancel()

    [batch] = batches
    survivors = [
        (e.event.build, e.event.percent) for e in batch if isinstance(e.event, BuildProgress)
    ]
    assert survivors == [("b", 50), ("a", 90)]  # the survivor keeps its later position
    assert [event_type(e.event) for e in batch][2:] == ["stream.session.info", "stream.usage"]
    for event in (SessionInfo(message="x"), TurnEnd(), Usage(tokens=TokenUsage())):
        daemon.keyer(Envelope(seq=1, ts=0.0, event=event, session_id="s1"))
    assert set(keys.asked) == {"acme.build.progress"}  # built-in types are never asked
    # The raising keyer (asked first: registered later) was skipped, not fatal.
    assert {(f.plugin, f.hook) for f in daemon.plugins.failures} == {
        ("raisingkeys-1", "busd_coalescing_key")
    }


# -- decisions: permission policy -----------------------------------------------------


class Policy:
    def __init__(self, answer: object) -> None:
        self.answer = answer
        self.asked = 0

    @hookimpl
    def busd_permission_policy(
        self, request: PermissionRequested, envelope: Envelope[Event]
    ) -> object:
        self.asked += 1
        return self.answer


REQUEST = PermissionRequested(request_id="r1", tool="bash", input={"command": "rm -rf build"})
ENVELOPE: Envelope[Event] = Envelope(seq=7, ts=0.0, event=REQUEST, session_id="s1")


def test_the_first_policy_with_an_opinion_decides_and_the_rest_are_not_asked() -> None:
    allow, deny, undecided = Policy("allow"), Policy("deny"), Policy(None)
    pm = PluginManager(environ={})
    for name, plugin in (("allow", allow), ("deny", deny), ("undecided", undecided)):
        pm.register(plugin, name=name)  # asked last registered first

    assert pm.permission_policy(REQUEST, ENVELOPE) == "deny"
    assert (undecided.asked, deny.asked, allow.asked) == (1, 1, 0)

    pm.unregister("deny")
    pm.unregister("allow")
    assert pm.permission_policy(REQUEST, ENVELOPE) is None  # nobody has an opinion


async def test_a_policy_returning_garbage_is_reported_and_counts_as_no_opinion() -> None:
    pm = PluginManager(environ={})
    pm.register(Policy("allow"), name="allow")
    pm.register(Policy("yes please"), name="garbage")
    daemon = Daemon(plugins=pm)
    errors = internal_errors(daemon)

    async with trio.open_nursery() as nursery:
        await nursery.start(daemon.run)
        decision = daemon.plugins.permission_policy(REQUEST, ENVELOPE)
        nursery.cancel_scope.cancel()

    assert decision == "allow"
    [error] = errors
    assert (error.plugin, error.where) == ("garbage", "busd_permission_policy")
    assert "'yes please'" in error.message


# -- lifecycle: services, startup, shutdown -------------------------------------------------


class Services:
    def __init__(self, *services: Service) -> None:
        self.services = services

    @hookimpl
    def busd_services(self, daemon: PluginHost) -> Sequence[Service]:
        return self.services


async def test_a_crashing_service_restarts_with_backoff_then_is_disabled_and_the_daemon_lives(
    autojump_clock: trio.testing.MockClock,
) -> None:
    attempts: list[float] = []
    steady: list[str] = []

    async def crashing() -> None:
        attempts.append(trio.current_time())
        raise ConnectionError("bridge lost")

    async def steady_service() -> None:
        steady.append("running")
        try:
            await trio.sleep_forever()
        finally:
            steady.append("cancelled")

    daemon = Daemon(plugins=manager(Services(crashing), Services(steady_service)))
    errors = internal_errors(daemon)
    disabled = trio.Event()

    def on_error(envelope: Envelope[Event]) -> None:
        if isinstance(envelope.event, InternalError) and "disabled" in envelope.event.message:
            disabled.set()

    daemon.bus.on("busd.internal.error", on_error)

    async with trio.open_nursery() as nursery:
        await nursery.start(daemon.run)
        await disabled.wait()
        await trio.sleep(3600)  # virtual time: a disabled service is never tried again
        assert len(attempts) == 5
        assert steady == ["running"]
        assert daemon.publish(SessionInfo(message="still up")).seq > 0
        nursery.cancel_scope.cancel()

    assert steady == ["running", "cancelled"]  # shutdown is how a service is told to stop
    gaps = [later - earlier for earlier, later in itertools.pairwise(attempts)]
    assert gaps == pytest.approx([0.5, 1.0, 2.0, 4.0])
    assert [(e.plugin, e.where) for e in errors] == [("services-0", "service services-0")] * 5
    assert [e.message for e in errors] == ["ConnectionError: bridge lost (restarting)"] * 4 + [
        "ConnectionError: bridge lost (disabled after repeated failures)"
    ]


async def test_a_service_that_returns_is_done_and_is_not_restarted(
    autojump_clock: trio.testing.MockClock,
) -> None:
    runs = 0
    reports: list[bool] = []

    async def fails_twice() -> None:
        nonlocal runs
        runs += 1
        if runs <= 2:
            raise RuntimeError("not yet")

    await supervise(
        "twice", fails_twice, on_failure=lambda n, e, disabled: reports.append(disabled)
    )

    assert runs == 3
    assert reports == [False, False]


async def test_a_service_that_ran_a_while_before_failing_starts_its_count_afresh(
    autojump_clock: trio.testing.MockClock,
) -> None:
    reports: list[bool] = []

    async def hourly_hiccup() -> None:
        await trio.sleep(60)  # longer than max_backoff: it was healthy
        raise RuntimeError("hiccup")

    with trio.move_on_after(600):
        await supervise(
            "hiccup",
            hourly_hiccup,
            on_failure=lambda n, e, d: reports.append(d),
            max_failures=2,
            max_backoff=30,
        )

    assert len(reports) >= 5
    assert not any(reports)


async def test_startup_and_shutdown_are_called_once_each_around_run() -> None:
    lifecycle = Lifecycle()
    daemon = Daemon(plugins=manager(lifecycle))

    assert lifecycle.calls == []
    async with trio.open_nursery() as nursery:
        await nursery.start(daemon.run)
        assert lifecycle.calls == ["startup"]  # before run() reports it started
        await trio.testing.wait_all_tasks_blocked()
        assert lifecycle.calls == ["startup"]
        nursery.cancel_scope.cancel()

    assert lifecycle.calls == ["startup", "shutdown"]


# -- the adapter contract ---------------------------------------------------------------


def say(text: str) -> dict[str, str]:
    return {"type": "say", "text": text}


def test_feed_never_raises_counts_bad_input_and_warns_once_per_kind(
    caplog: pytest.LogCaptureFixture,
) -> None:
    stream: list[object] = [
        say("a"),
        {"type": "say"},  # malformed: no text
        {"type": "say"},
        42,  # not even a mapping
        {"type": "shout"},  # a kind the translator does not know
        {"type": "shout"},
        say("b"),
    ]
    translator = ToyTranslator(session_id="s1")

    with caplog.at_level(logging.WARNING, logger="busd.adapters"):
        emitted = [e for raw in stream for e in translator.feed(raw, 5.0)]

    assert [e.event for e in emitted] == [
        SessionStart(model="toy@5.0"),
        TextDelta(message_id="m1", text="a"),
        TextDelta(message_id="m1", text="b"),
    ]
    assert {e.session_id for e in emitted} == {"s1"}
    stats = translator.statistics()
    assert (stats.raw_events, stats.emitted) == (7, 3)
    assert stats.malformed == {"say": 2, "int": 1}
    assert stats.unknown == {"shout": 2}
    assert len(caplog.records) == 3  # one per kind, not one per event
    assert "malformed 'say' event (KeyError: 'text')" in caplog.text
    # Deterministic: the same input at the same times says the same thing.
    again = ToyTranslator(session_id="s1")
    assert [e for raw in stream for e in again.feed(raw, 5.0)] == emitted


def test_finish_is_idempotent_and_a_raising_close_is_contained() -> None:
    translator = ToyTranslator(session_id="s1")
    translator.feed(say("done"), 0.0)

    assert [e.event for e in translator.finish(1.0)] == [
        TextComplete(message_id="m1", text="done"),
        SessionIdle(),
    ]
    assert translator.finish(2.0) == []

    exploding = ToyTranslator(explode_on_close=True)
    assert exploding.finish(1.0) == []
    assert exploding.statistics().malformed == {"<finish>": 1}
    assert exploding.finish(2.0) == []


# -- ingest end to end: a real daemon on a real socket ---------------------------------------


def is_idle(envelope: Envelope[Event]) -> bool:
    return isinstance(envelope.event, SessionIdle)


async def test_ingested_raw_events_are_translated_in_the_daemon_and_reach_subscribers(
    sock_path: Path,
) -> None:
    async with (
        serving(sock_path, manager(AdapterPlugin(ToyAdapter()))),
        connect(sock_path, client="ui") as ui,
        ui.subscribe(["stream.>"], deltas="raw", window_ms=0) as sub,
        connect(sock_path, client="agent", role="agent") as agent,
    ):
        await agent.send_frame(Ingest(sdk="toy", session_id="s1", events=[say("Hel")]))
        ending = Ingest(sdk="toy", session_id="s1", events=[say("lo"), {"type": "say"}], end=True)
        await agent.send_frame(ending)
        first = await collect_until(sub, is_idle)
        # ``end`` dropped the translator: the same stream starts afresh.
        await agent.send_frame(Ingest(sdk="toy", session_id="s1", events=[say("again")]))
        second = await collect_until(sub, lambda e: isinstance(e.event, TextDelta))
        await agent.flush()
        assert agent.errors == []  # a malformed raw event is not the client's error

    assert [event_type(e.event) for e in first] == [
        "stream.session.start",
        "stream.text.delta",
        "stream.text.delta",
        "stream.text.complete",
        "stream.session.idle",
    ]
    assert [e.event.text for e in first if isinstance(e.event, TextDelta | TextComplete)] == [
        "Hel",
        "lo",
        "Hello",
    ]
    assert {(e.session_id, e.source) for e in first + second} == {
        ("s1", f"agent[pid={os.getpid()},uid={os.getuid()}]/toy")
    }
    assert [event_type(e.event) for e in second] == ["stream.session.start", "stream.text.delta"]


async def test_ingest_for_an_unknown_sdk_is_refused_naming_the_loaded_adapters(
    sock_path: Path,
) -> None:
    plugins = manager(AdapterPlugin(ToyAdapter("toy"), ToyAdapter("other")))
    async with (
        serving(sock_path, plugins),
        connect(sock_path, client="agent", role="agent") as agent,
    ):
        await agent.send_frame(Ingest(sdk="nope", events=[say("lost")]))
        await agent.flush()

    [error] = agent.errors
    assert (error.code, error.fatal) == ("unknown_sdk", False)
    assert error.message == "no adapter for sdk 'nope' is loaded (loaded: other, toy)"


async def test_a_connection_closed_mid_stream_still_gets_its_streams_finished(
    sock_path: Path,
) -> None:
    async with (
        serving(sock_path, manager(AdapterPlugin(ToyAdapter()))),
        connect(sock_path, client="ui") as ui,
        ui.subscribe(["stream.>"], sessions=["s2"], deltas="raw", window_ms=0) as sub,
    ):
        raw = await RawClient.open(sock_path)
        await raw.send(Ingest(sdk="toy", session_id="s2", events=[say("cut short")]))
        await raw.aclose()  # no end, no bye: the connection just goes away

        got = await collect_until(sub, is_idle)

    assert [e.event for e in got[2:]] == [
        TextComplete(message_id="m1", text="cut short"),
        SessionIdle(),
    ]
    assert {e.source for e in got} == {f"raw[pid={os.getpid()},uid={os.getuid()}]/toy"}


# -- the third-party template, installed like any plugin -------------------------------------------

TRANSLATE_WITH_ECHO = textwrap.dedent(
    """
    import json

    import busd_echo
    from busd.core.events import event_type
    from busd.plugins.manager import PluginManager

    manager = PluginManager()
    manager.load_entry_points()
    translator = manager.adapters()["echo"].translator(session_id="s1")
    emitted = translator.feed({"type": "say", "text": "hi"}, 0.0) + translator.finish(1.0)
    print(json.dumps({
        "module": busd_echo.__file__,
        "events": [[event_type(e.event), e.session_id] for e in emitted],
    }))
    """
)


def run(args: list[str], env: dict[str, str]) -> str:
    proc = subprocess.run(args, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def test_the_plugin_template_installs_and_loads_as_a_third_party_plugin(tmp_path: Path) -> None:
    target = tmp_path / "site-packages"
    pip = [sys.executable, "-m", "pip", "install", "--no-deps", "--no-compile", "--quiet"]
    if importlib.util.find_spec("hatchling") is not None:  # build offline with ours
        pip += ["--no-build-isolation", "--no-index"]
    pip += ["--disable-pip-version-check", "--target", str(target), str(TEMPLATE)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("BUSD_")}
    env["PYTHONPATH"] = str(target)
    run(pip, env)

    listing = json.loads(run([sys.executable, "-m", "busd", "plugins", "--json"], env))
    [echo] = [p for p in listing["plugins"] if p["name"] == "echo"]
    assert echo == {
        "name": "echo",
        "version": "0.1.0",
        "distribution": "busd-echo",
        "module": "busd_echo",
        "hooks": ["busd_adapters"],
    }
    assert "echo" in listing["adapters"]

    translated = json.loads(run([sys.executable, "-c", TRANSLATE_WITH_ECHO], env))
    assert translated == {
        "module": str(target / "busd_echo" / "__init__.py"),
        "events": [
            ["stream.session.start", "s1"],
            ["stream.text.delta", "s1"],
            ["stream.text.complete", "s1"],
            ["stream.session.idle", "s1"],
        ],
    }


def test_the_templates_own_tests_pass_against_this_busd(monkeypatch: pytest.MonkeyPatch) -> None:
    """The root run does not collect contrib/, so run the template's tests from here."""
    monkeypatch.syspath_prepend(str(TEMPLATE))
    path = TEMPLATE / "tests" / "test_echo.py"
    spec = importlib.util.spec_from_file_location("busd_echo_template_tests", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.delitem(sys.modules, "busd_echo", raising=False)  # import it from TEMPLATE
    try:
        spec.loader.exec_module(module)
        tests = [getattr(module, name) for name in dir(module) if name.startswith("test_")]
        assert tests
        for test in tests:
            test()
    finally:
        sys.modules.pop("busd_echo", None)


def test_a_configuration_error_is_not_contained_but_raised() -> None:
    """Other hook failures are skipped and reported; unusable options stop the daemon."""

    class Broken:
        @hookimpl
        def busd_services(self, daemon: PluginHost) -> Sequence[Service]:
            raise RuntimeError("a bug")

    class Misconfigured:
        @hookimpl
        def busd_services(self, daemon: PluginHost) -> Sequence[Service]:
            raise PluginConfigError("[plugins.x]: unknown option 'ulr'")

    manager = PluginManager(environ={})
    manager.register(Broken(), name="broken")
    daemon = Daemon(plugins=manager)
    assert manager.services(daemon) == []
    assert [f.plugin for f in manager.failures] == ["broken"]
    manager.register(Misconfigured(), name="x")
    with pytest.raises(PluginConfigError, match="unknown option 'ulr'"):
        manager.services(daemon)
