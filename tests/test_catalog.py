from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest
from click.testing import CliRunner

from busd.cli import main
from busd.core.catalog import Catalog
from busd.core.catalogdoc import render_markdown
from busd.core.errors import CatalogConflict, UnknownEventType
from busd.core.events import (
    BUILTIN_EVENTS,
    Envelope,
    Event,
    PermissionOption,
    PermissionRequested,
    TextDelta,
    TokenUsage,
    Usage,
)

DOCS = Path(__file__).resolve().parent.parent / "docs"

BASELINE = {
    "stream.session.start",
    "stream.session.idle",
    "stream.session.error",
    "stream.session.retry",
    "stream.session.info",
    "stream.session.warning",
    "stream.session.title_changed",
    "stream.session.compaction",
    "stream.session.truncation",
    "stream.turn.start",
    "stream.turn.end",
    "stream.text.delta",
    "stream.text.complete",
    "stream.thinking.delta",
    "stream.thinking.complete",
    "stream.tool.start",
    "stream.tool.partial_result",
    "stream.tool.complete",
    "stream.agent.start",
    "stream.agent.update",
    "stream.agent.complete",
    "stream.usage",
    "stream.permission.requested",
    "stream.permission.resolved",
    "busd.stats",
    "busd.context",
    "busd.tool.timeout",
    "busd.run.started",
    "busd.run.cancelled",
    "busd.run.finished",
}


def test_the_catalog_holds_the_design_baseline() -> None:
    assert set(Catalog().names()) >= BASELINE


def test_docs_events_md_is_generated_from_the_code() -> None:
    committed = (DOCS / "events.md").read_text(encoding="utf-8")
    assert committed == render_markdown(), (
        "docs/events.md is stale: run `busd catalog --format markdown > docs/events.md`"
    )


def test_every_type_and_field_is_in_the_docs() -> None:
    page = render_markdown()
    for cls in BUILTIN_EVENTS:
        assert f"### `{cls.__struct_config__.tag}`" in page
        for field in msgspec.structs.fields(cls):
            assert f"| `{field.encode_name}` |" in page


@pytest.mark.parametrize("cls", BUILTIN_EVENTS, ids=lambda c: c.__struct_config__.tag)
def test_every_event_documents_why_it_exists(cls: type[Event]) -> None:
    assert (cls.__doc__ or "").strip()


def test_envelopes_round_trip_through_msgpack_and_json_with_defaults_omitted() -> None:
    catalog = Catalog()
    envelope: Envelope[Event] = Envelope(
        7,
        1.5,
        PermissionRequested(
            request_id="r1",
            tool="Write",
            input={"path": "a.txt"},
            options=[PermissionOption(id="allow", kind="allow_once")],
        ),
        session_id="s1",
    )
    packed = msgspec.msgpack.encode(envelope)
    assert msgspec.msgpack.Decoder(catalog.envelope_type()).decode(packed) == envelope
    as_json = msgspec.json.encode(envelope)
    wire = json.loads(as_json)
    assert wire["event"]["type"] == "stream.permission.requested"
    assert "run_id" not in wire  # default, omitted
    assert "category" not in wire["event"]
    assert msgspec.json.Decoder(catalog.envelope_type()).decode(as_json) == envelope


def test_decoders_include_plugin_types_registered_before_they_are_built() -> None:
    class Custom(Event, frozen=True, tag="acme.custom"):
        value: int = 0

    catalog = Catalog()
    catalog.register(Custom)
    catalog.freeze()
    packed = msgspec.msgpack.encode(Envelope(1, 0.0, Custom(value=3)))
    assert msgspec.msgpack.Decoder(catalog.envelope_type()).decode(packed).event == Custom(value=3)
    with pytest.raises(RuntimeError, match="frozen"):
        catalog.register(TextDelta)


def test_registration_rejects_conflicts_and_non_events() -> None:
    class Impostor(Event, frozen=True, tag="stream.text.delta"):
        pass

    class Untagged(Event, frozen=True):
        pass

    catalog = Catalog()
    catalog.register(TextDelta)  # the same class again is fine
    with pytest.raises(CatalogConflict, match=r"stream\.text\.delta"):
        catalog.register(Impostor)
    with pytest.raises(UnknownEventType, match="dotted tag"):
        catalog.register(Untagged)
    with pytest.raises(UnknownEventType):
        catalog.register(TokenUsage)  # type: ignore[arg-type]
    with pytest.raises(UnknownEventType, match="unknown event type"):
        catalog.get("stream.nope")


def test_json_schema_covers_every_event_type() -> None:
    schema = Catalog().json_schema()
    mapping = schema["$defs"]["Envelope"]["properties"]["event"]["discriminator"]["mapping"]
    assert set(mapping) == set(Catalog().names())


def test_cli_prints_schema_markdown_and_names() -> None:
    runner = CliRunner()
    schema = runner.invoke(main, ["catalog", "--format", "schema"])
    assert schema.exit_code == 0
    assert (
        "stream.usage"
        in json.loads(schema.output)["$defs"]["Envelope"]["properties"]["event"]["discriminator"][
            "mapping"
        ]
    )
    markdown = runner.invoke(main, ["catalog", "--format", "markdown"])
    assert markdown.output == render_markdown()
    names = runner.invoke(main, ["catalog"])
    assert names.output.splitlines() == Catalog().names()


def test_usage_counts_are_not_mutable_in_place() -> None:
    usage = Usage(tokens=TokenUsage(output_tokens=3))
    with pytest.raises(AttributeError):
        usage.tokens = TokenUsage()  # type: ignore[misc]
