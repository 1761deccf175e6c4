"""busd: one ordered, typed, coalesced event stream for AI coding agents and their frontends.

The public surface is re-exported here; the modules behind it are free to move.
"""

from __future__ import annotations

from ._version import __version__ as __version__
from .accounting import Accountant as Accountant
from .accounting import AccountingService as AccountingService
from .accounting import Derived as Derived
from .adapters import Adapter as Adapter
from .adapters import Emitted as Emitted
from .adapters import Translator as Translator
from .adapters import TranslatorStatistics as TranslatorStatistics
from .adapters import as_mapping as as_mapping
from .batching import BatchDispatcher as BatchDispatcher
from .batching import DispatcherStatistics as DispatcherStatistics
from .batching import Flusher as Flusher
from .batching import FlusherStatistics as FlusherStatistics
from .batching import Overflow as Overflow
from .batching import SubscriberOverflowed as SubscriberOverflowed
from .bus import Bus as Bus
from .bus import BusStatistics as BusStatistics
from .bus import Handle as Handle
from .bus import Handler as Handler
from .bus import HandlerError as HandlerError
from .catalog import Catalog as Catalog
from .client import Batch as Batch
from .client import Client as Client
from .client import ClientSubscription as ClientSubscription
from .client import ConnectionLost as ConnectionLost
from .client import DaemonNotRunning as DaemonNotRunning
from .client import RequestFailed as RequestFailed
from .client import SubscribeFailed as SubscribeFailed
from .client import connect as connect
from .coalesce import Accumulator as Accumulator
from .coalesce import AccumulatorFull as AccumulatorFull
from .coalesce import AccumulatorStatistics as AccumulatorStatistics
from .coalesce import Keyer as Keyer
from .coalesce import chain_keyers as chain_keyers
from .coalesce import coalescing_key as coalescing_key
from .context import ContextRegistry as ContextRegistry
from .context import ContextRegistryStatistics as ContextRegistryStatistics
from .context import ContextStatistics as ContextStatistics
from .context import ContextWindow as ContextWindow
from .correlation import CorrelationStatistics as CorrelationStatistics
from .correlation import Correlator as Correlator
from .correlation import DuplicateRun as DuplicateRun
from .correlation import Route as Route
from .correlation import Run as Run
from .correlation import UnknownRun as UnknownRun
from .daemon import Daemon as Daemon
from .daemon import DaemonConfig as DaemonConfig
from .endpoint import AlreadyRunning as AlreadyRunning
from .endpoint import Endpoint as Endpoint
from .endpoint import EndpointError as EndpointError
from .endpoint import resolve_socket_path as resolve_socket_path
from .errors import BusdError as BusdError
from .errors import CatalogConflict as CatalogConflict
from .errors import InvalidPattern as InvalidPattern
from .errors import UnknownEventType as UnknownEventType
from .estimate import estimate_json_tokens as estimate_json_tokens
from .estimate import estimate_tokens as estimate_tokens
from .events import *  # noqa: F403 - the catalog is public by design
from .events import __all__ as _event_names
from .history import History as History
from .history import Replay as Replay
from .hookspecs import Service as Service
from .hookspecs import hookimpl as hookimpl
from .humanize import format_duration as format_duration
from .humanize import format_tokens as format_tokens
from .humanize import status_line as status_line
from .humanize import summary_line as summary_line
from .journal import Journal as Journal
from .journal import JournalSpan as JournalSpan
from .journalfile import JournalError as JournalError
from .journalfile import JournalReader as JournalReader
from .journalfile import Retention as Retention
from .journalfile import SessionRecord as SessionRecord
from .patterns import Pattern as Pattern
from .plugins import HookFailure as HookFailure
from .plugins import PluginInfo as PluginInfo
from .plugins import PluginManager as PluginManager
from .plugins import supervise as supervise
from .protocol import PROTOCOL_VERSION as PROTOCOL_VERSION
from .protocol import Encoder as Encoder
from .protocol import FrameDecoder as FrameDecoder
from .protocol import ProtocolError as ProtocolError
from .protocol import ServerFrameDecoder as ServerFrameDecoder
from .protocol import ServerHandshake as ServerHandshake
from .protocol import client_frame_decoder as client_frame_decoder
from .protocol import encode_envelope as encode_envelope
from .protocol import encode_frame as encode_frame
from .protocol import server_frame_decoder as server_frame_decoder
from .replay import ReplayDriver as ReplayDriver
from .server import Server as Server
from .sessions import SessionRegistry as SessionRegistry
from .sessions import SessionSnapshot as SessionSnapshot
from .sessions import SessionSummary as SessionSummary
from .stats import StatsRegistry as StatsRegistry
from .stats import StatsRegistryStatistics as StatsRegistryStatistics
from .stats import StreamingStatsTracker as StreamingStatsTracker
from .stats import TrackerStatistics as TrackerStatistics
from .toolmetrics import ToolTracker as ToolTracker
from .toolmetrics import ToolTrackerStatistics as ToolTrackerStatistics
from .transcript import Message as Message
from .transcript import Transcript as Transcript
from .transcript import build_transcript as build_transcript
from .usage import UnknownProvider as UnknownProvider
from .usage import UsageLedger as UsageLedger
from .usage import UsageLedgerStatistics as UsageLedgerStatistics
from .usage import add_usage as add_usage
from .usage import merge_cumulative as merge_cumulative
from .usage import normalize_usage as normalize_usage

__all__ = [
    "__version__",
    "Accountant",
    "AccountingService",
    "Accumulator",
    "AccumulatorFull",
    "AccumulatorStatistics",
    "Adapter",
    "add_usage",
    "AlreadyRunning",
    "as_mapping",
    "Batch",
    "BatchDispatcher",
    "build_transcript",
    "Bus",
    "BusdError",
    "BusStatistics",
    "Catalog",
    "CatalogConflict",
    "chain_keyers",
    "Client",
    "client_frame_decoder",
    "ClientSubscription",
    "coalescing_key",
    "connect",
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
    "DuplicateRun",
    "Emitted",
    "encode_envelope",
    "encode_frame",
    "Encoder",
    "Endpoint",
    "EndpointError",
    "estimate_json_tokens",
    "estimate_tokens",
    "Flusher",
    "FlusherStatistics",
    "format_duration",
    "format_tokens",
    "FrameDecoder",
    "Handle",
    "Handler",
    "HandlerError",
    "History",
    "HookFailure",
    "hookimpl",
    "InvalidPattern",
    "Journal",
    "JournalError",
    "JournalReader",
    "JournalSpan",
    "Keyer",
    "merge_cumulative",
    "Message",
    "normalize_usage",
    "Overflow",
    "Pattern",
    "PluginInfo",
    "PluginManager",
    "PROTOCOL_VERSION",
    "ProtocolError",
    "Replay",
    "ReplayDriver",
    "RequestFailed",
    "resolve_socket_path",
    "Retention",
    "Route",
    "Run",
    "Server",
    "server_frame_decoder",
    "ServerFrameDecoder",
    "ServerHandshake",
    "Service",
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
