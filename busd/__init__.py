"""busd: one ordered, typed, coalesced event stream for AI coding agents and their frontends.

The public surface is re-exported here; the modules behind it are free to move.
"""

from __future__ import annotations

from ._version import __version__ as __version__
from .client import Acked as Acked
from .client import Batch as Batch
from .client import Client as Client
from .client import ClientStatistics as ClientStatistics
from .client import ClientSubscription as ClientSubscription
from .client import ConnectionLost as ConnectionLost
from .client import DaemonNotRunning as DaemonNotRunning
from .client import NotJournaled as NotJournaled
from .client import RequestFailed as RequestFailed
from .client import SubscribeFailed as SubscribeFailed
from .client import connect as connect
from .core.accounting import Accountant as Accountant
from .core.accounting import Derived as Derived
from .core.bus import Bus as Bus
from .core.bus import BusStatistics as BusStatistics
from .core.bus import Handle as Handle
from .core.bus import Handler as Handler
from .core.bus import HandlerError as HandlerError
from .core.catalog import Catalog as Catalog
from .core.coalesce import Accumulator as Accumulator
from .core.coalesce import AccumulatorFull as AccumulatorFull
from .core.coalesce import AccumulatorStatistics as AccumulatorStatistics
from .core.coalesce import Keyer as Keyer
from .core.coalesce import chain_keyers as chain_keyers
from .core.coalesce import coalescing_key as coalescing_key
from .core.cohorts import SharedBatch as SharedBatch
from .core.context import ContextRegistry as ContextRegistry
from .core.context import ContextRegistryStatistics as ContextRegistryStatistics
from .core.context import ContextStatistics as ContextStatistics
from .core.context import ContextWindow as ContextWindow
from .core.correlation import CorrelationStatistics as CorrelationStatistics
from .core.correlation import Correlator as Correlator
from .core.correlation import DuplicateRun as DuplicateRun
from .core.correlation import Route as Route
from .core.correlation import Run as Run
from .core.correlation import UnknownRun as UnknownRun
from .core.errors import BusdError as BusdError
from .core.errors import CatalogConflict as CatalogConflict
from .core.errors import InvalidPattern as InvalidPattern
from .core.errors import PluginConfigError as PluginConfigError
from .core.errors import UnknownEventType as UnknownEventType
from .core.estimate import estimate_json_tokens as estimate_json_tokens
from .core.estimate import estimate_tokens as estimate_tokens
from .core.events import *  # noqa: F403 - the catalog is public by design
from .core.events import __all__ as _event_names
from .core.history import History as History
from .core.history import Replay as Replay
from .core.patterns import Pattern as Pattern
from .core.permissions import PermissionDecision as PermissionDecision
from .core.prices import ModelPrice as ModelPrice
from .core.prices import cost_usd as cost_usd
from .core.prices import price_of as price_of
from .core.sessions import SessionRegistry as SessionRegistry
from .core.sessions import SessionSnapshot as SessionSnapshot
from .core.sessions import SessionSummary as SessionSummary
from .core.stats import StatsRegistry as StatsRegistry
from .core.stats import StatsRegistryStatistics as StatsRegistryStatistics
from .core.stats import StreamingStatsTracker as StreamingStatsTracker
from .core.stats import TrackerStatistics as TrackerStatistics
from .core.toolmetrics import ToolTracker as ToolTracker
from .core.toolmetrics import ToolTrackerStatistics as ToolTrackerStatistics
from .core.usage import UnknownProvider as UnknownProvider
from .core.usage import UsageLedger as UsageLedger
from .core.usage import UsageLedgerStatistics as UsageLedgerStatistics
from .core.usage import add_usage as add_usage
from .core.usage import cache_hit_percent as cache_hit_percent
from .core.usage import merge_cumulative as merge_cumulative
from .core.usage import normalize_usage as normalize_usage
from .daemon.accounting import AccountingService as AccountingService
from .daemon.batching import BatchDispatcher as BatchDispatcher
from .daemon.batching import DispatcherStatistics as DispatcherStatistics
from .daemon.batching import Overflow as Overflow
from .daemon.batching import SubscriberOverflowed as SubscriberOverflowed
from .daemon.endpoint import AlreadyRunning as AlreadyRunning
from .daemon.endpoint import Endpoint as Endpoint
from .daemon.hub import Daemon as Daemon
from .daemon.hub import DaemonConfig as DaemonConfig
from .daemon.journal import Journal as Journal
from .daemon.journal import JournalSpan as JournalSpan
from .daemon.journalfile import JournalError as JournalError
from .daemon.journalfile import JournalReader as JournalReader
from .daemon.journalfile import Retention as Retention
from .daemon.journalfile import SessionRecord as SessionRecord
from .daemon.server import Server as Server
from .frontends.humanize import format_duration as format_duration
from .frontends.humanize import format_tokens as format_tokens
from .frontends.humanize import status_line as status_line
from .frontends.humanize import summary_line as summary_line
from .frontends.transcript import Message as Message
from .frontends.transcript import Transcript as Transcript
from .frontends.transcript import build_transcript as build_transcript
from .plugins.adapters import Adapter as Adapter
from .plugins.adapters import Emitted as Emitted
from .plugins.adapters import Translator as Translator
from .plugins.adapters import TranslatorStatistics as TranslatorStatistics
from .plugins.adapters import as_mapping as as_mapping
from .plugins.agenthooks import AgentHooks as AgentHooks
from .plugins.agenthooks import Ask as Ask
from .plugins.agenthooks import HookCommands as HookCommands
from .plugins.agenthooks import Report as Report
from .plugins.agenthooks import Settled as Settled
from .plugins.attachers import Attacher as Attacher
from .plugins.attachers import AttachOptions as AttachOptions
from .plugins.attachers import Sink as Sink
from .plugins.drivers import Driver as Driver
from .plugins.drivers import RunContext as RunContext
from .plugins.drivers import RunRequest as RunRequest
from .plugins.hookspecs import Service as Service
from .plugins.hookspecs import hookimpl as hookimpl
from .plugins.host import HostConfig as HostConfig
from .plugins.host import PluginHost as PluginHost
from .plugins.manager import HookFailure as HookFailure
from .plugins.manager import PluginInfo as PluginInfo
from .plugins.manager import PluginManager as PluginManager
from .plugins.manager import supervise as supervise
from .plugins.replay import ReplayDriver as ReplayDriver
from .wire import PROTOCOL_VERSION as PROTOCOL_VERSION
from .wire import Encoder as Encoder
from .wire import FrameDecoder as FrameDecoder
from .wire import ProtocolError as ProtocolError
from .wire import ServerFrameDecoder as ServerFrameDecoder
from .wire import ServerHandshake as ServerHandshake
from .wire import client_frame_decoder as client_frame_decoder
from .wire import encode_envelope as encode_envelope
from .wire import encode_frame as encode_frame
from .wire import server_frame_decoder as server_frame_decoder
from .wire.address import EndpointError as EndpointError
from .wire.address import resolve_socket_path as resolve_socket_path
from .wire.roles import DEFAULT_GRANTS as DEFAULT_GRANTS
from .wire.roles import RIGHTS as RIGHTS
from .wire.roles import ROLES as ROLES
from .wire.schema import protocol_schema as protocol_schema

__all__ = [
    "__version__",
    "DEFAULT_GRANTS",
    "RIGHTS",
    "ROLES",
    "Accountant",
    "AccountingService",
    "Accumulator",
    "Acked",
    "AccumulatorFull",
    "AccumulatorStatistics",
    "Adapter",
    "AgentHooks",
    "add_usage",
    "AlreadyRunning",
    "as_mapping",
    "Ask",
    "Attacher",
    "AttachOptions",
    "Batch",
    "BatchDispatcher",
    "build_transcript",
    "cache_hit_percent",
    "Bus",
    "BusdError",
    "BusStatistics",
    "Catalog",
    "CatalogConflict",
    "chain_keyers",
    "Client",
    "client_frame_decoder",
    "ClientStatistics",
    "ClientSubscription",
    "coalescing_key",
    "connect",
    "cost_usd",
    "ConnectionLost",
    "ContextRegistry",
    "ContextRegistryStatistics",
    "ContextStatistics",
    "ContextWindow",
    "CorrelationStatistics",
    "Correlator",
    "Daemon",
    "DaemonConfig",
    "DaemonNotRunning",
    "Derived",
    "DispatcherStatistics",
    "Driver",
    "DuplicateRun",
    "Emitted",
    "encode_envelope",
    "encode_frame",
    "Encoder",
    "Endpoint",
    "EndpointError",
    "estimate_json_tokens",
    "estimate_tokens",
    "format_duration",
    "format_tokens",
    "FrameDecoder",
    "Handle",
    "Handler",
    "HandlerError",
    "History",
    "HookCommands",
    "HookFailure",
    "hookimpl",
    "HostConfig",
    "InvalidPattern",
    "Journal",
    "JournalError",
    "JournalReader",
    "JournalSpan",
    "Keyer",
    "merge_cumulative",
    "Message",
    "ModelPrice",
    "normalize_usage",
    "Overflow",
    "Pattern",
    "PermissionDecision",
    "PluginConfigError",
    "PluginHost",
    "price_of",
    "PluginInfo",
    "PluginManager",
    "PROTOCOL_VERSION",
    "ProtocolError",
    "Replay",
    "Report",
    "ReplayDriver",
    "NotJournaled",
    "RequestFailed",
    "protocol_schema",
    "resolve_socket_path",
    "Retention",
    "Route",
    "Run",
    "RunContext",
    "RunRequest",
    "Server",
    "server_frame_decoder",
    "ServerFrameDecoder",
    "ServerHandshake",
    "Service",
    "Settled",
    "SharedBatch",
    "Sink",
    "SessionRecord",
    "SessionRegistry",
    "SessionSnapshot",
    "SessionSummary",
    "StatsRegistry",
    "StatsRegistryStatistics",
    "status_line",
    "StreamingStatsTracker",
    "SubscribeFailed",
    "SubscriberOverflowed",
    "summary_line",
    "supervise",
    "ToolTracker",
    "ToolTrackerStatistics",
    "TrackerStatistics",
    "Transcript",
    "Translator",
    "TranslatorStatistics",
    "UnknownEventType",
    "UnknownProvider",
    "UnknownRun",
    "UsageLedger",
    "UsageLedgerStatistics",
    *_event_names,
]
