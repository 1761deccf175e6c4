"""Regenerate busd/data/prices.json from the installed ccusage, and check busd prices as it does.

Usage, from the repository root with busd's virtualenv (after ``npm ci`` in
contrib/agents, which installs the pinned ccusage)::

    python contrib/agents/update_prices.py            # write busd/data/prices.json
    python contrib/agents/update_prices.py --check    # exit 1 if the file is not what this writes

The table is ccusage's own offline data (what ``ccusage --offline`` prices
with: a snapshot of LiteLLM's model_prices_and_context_window.json taken when
that ccusage was built), read by running ccusage's ``PricingFetcher`` in
offline mode under Node.js, so the models, their order (which decides fuzzy
matches) and the provider prefixes are exactly ccusage's. To move to a newer
snapshot, bump ``ccusage`` in contrib/agents/package.json, ``npm install``
there, and run this.

Before writing, every model of the new table, and variants of their names
(prefixed, dated, upper case, short aliases, unknown names), is priced for
several usages (including each field above 200k tokens) both by ccusage and
by ``busd.core.prices``; any difference aborts, so a ccusage that changed its
rules is noticed here and not in a user's bill.

``date`` in the header is the day the table's content was extracted: kept
from the existing file when the content is unchanged (so a rerun reproduces
the file byte for byte), today (UTC) otherwise, or ``--date``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, NoReturn

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from busd.core.events import TokenUsage  # noqa: E402
from busd.core.prices import PriceTable  # noqa: E402

CCUSAGE = ROOT / "contrib" / "agents" / "node_modules" / "ccusage"
TABLE = ROOT / "busd" / "data" / "prices.json"
GENERATOR = "python contrib/agents/update_prices.py"

# Loads ccusage's offline pricing with ccusage's own code and answers on stdout:
# the table (models in ccusage's order, its prefixes) and the cost of each probe.
_NODE = r"""
const [chunk] = process.argv.slice(1);
let probesJson = "";
for await (const piece of process.stdin) probesJson += piece;
const mod = await import(chunk);
const Fetcher = Object.values(mod).find(
	(v) => typeof v === "function" && v.name === "PricingFetcher",
);
if (Fetcher === undefined) throw new Error(`no PricingFetcher exported by ${chunk}`);
const fetcher = new Fetcher(true);
const loaded = await fetcher.fetchModelPricing();
if (loaded.type !== "Success") throw new Error(`offline pricing did not load: ${loaded.error}`);
const costs = [];
for (const [model, usage] of JSON.parse(probesJson)) {
	const r = await fetcher.calculateCostFromTokens(usage, model);
	costs.push(r.type === "Success" ? r.value : null);
}
process.stdout.write(JSON.stringify({
	prefixes: fetcher.providerPrefixes,
	models: [...loaded.value.entries()],
	costs,
}));
"""

_USAGES: list[TokenUsage] = [
    TokenUsage(input_tokens=3, output_tokens=7, cache_read_tokens=11, cache_write_tokens=13),
    TokenUsage(
        input_tokens=1234, output_tokens=567, cache_read_tokens=89_012, cache_write_tokens=3456
    ),
    TokenUsage(input_tokens=200_000, output_tokens=200_000, cache_read_tokens=200_000),
    TokenUsage(input_tokens=250_001, output_tokens=5, cache_read_tokens=10, cache_write_tokens=20),
    TokenUsage(
        input_tokens=2, output_tokens=300_000, cache_read_tokens=987_654, cache_write_tokens=1
    ),
    TokenUsage(input_tokens=1, output_tokens=1, cache_read_tokens=1, cache_write_tokens=654_321),
    TokenUsage(),
]

_ALIASES = ["opus", "sonnet", "haiku", "Opus-4-5", "sonnet-4-5", "3-5-haiku-20241022"]
_ALIASES += ["haiku-20240307", "claude-opus-4-1-20990101", "anthropic/claude-sonnet-4-5"]
_UNKNOWN = ["gpt-5-codex", "gemini-2.5-pro", "<synthetic>", "claude-opus-4-6", "x"]


def fail(message: str) -> NoReturn:
    print(f"update_prices: {message}", file=sys.stderr)
    raise SystemExit(1)


def _chunk() -> Path:
    """The dist module of the installed ccusage that defines its ``PricingFetcher``."""
    dist = CCUSAGE / "dist"
    found = [p for p in sorted(dist.glob("*.js")) if "PricingFetcher = class" in p.read_text()]
    if len(found) != 1:
        fail(f"expected one module defining PricingFetcher in {dist}, found {len(found)}")
    return found[0]


def _node(chunk: Path, probes: list[tuple[str, dict[str, int]]]) -> dict[str, Any]:
    node = shutil.which("node")
    if node is None:
        fail("node (Node.js) is not on PATH")
    run = subprocess.run(
        [node, "--input-type=module", "-e", _NODE, chunk.as_uri()],
        input=json.dumps(probes),
        capture_output=True,
        text=True,
        check=False,
    )
    if run.returncode != 0:
        fail(f"ccusage's PricingFetcher failed: {run.stderr.strip()}")
    answer: dict[str, Any] = json.loads(run.stdout)
    return answer


def _wire(usage: TokenUsage) -> dict[str, int]:
    """A busd usage in the Anthropic field names ccusage reads."""
    return {
        "input_tokens": usage.input_tokens,
        "output_tokens": usage.output_tokens,
        "cache_creation_input_tokens": usage.cache_write_tokens,
        "cache_read_input_tokens": usage.cache_read_tokens,
    }


def render(version: str, url: str, answer: dict[str, Any], date: str) -> bytes:
    """The file's bytes: a header saying where it comes from, then the models in ccusage's order."""
    doc = {
        "source": (
            f"ccusage {version} offline data (its PricingFetcher in offline mode): "
            "a snapshot of LiteLLM model_prices_and_context_window.json"
        ),
        "source_url": url,
        "ccusage_version": version,
        "date": date,
        "generator": GENERATOR,
        "provider_prefixes": answer["prefixes"],
        "models": dict(answer["models"]),
    }
    return (json.dumps(doc, indent=2) + "\n").encode()


def _date_of(path: Path) -> str | None:
    try:
        date = json.loads(path.read_bytes())["date"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return date if isinstance(date, str) else None


def verify(table: bytes, chunk: Path) -> int:
    """Price every probe with ccusage and with busd; abort on any difference. Returns the count."""
    prices = PriceTable(table)
    names = [*prices.prices, *_ALIASES, *_UNKNOWN]
    names += [f"anthropic/{k}" for k in prices.prices] + [k.upper() for k in prices.prices]
    names += [f"{k}-20991231" for k in prices.prices]
    probes = [(name, usage) for name in names for usage in _USAGES]
    theirs = _node(chunk, [(name, _wire(usage)) for name, usage in probes])["costs"]
    for (name, usage), their in zip(probes, theirs, strict=True):
        ours = prices.cost_usd(name, usage)
        expected = None if their == 0 and prices.price_of(name) is None else their
        if ours != expected:
            fail(f"{name!r} {usage}: ccusage says {their}, busd says {ours}")
    return len(probes)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="compare, do not write")
    parser.add_argument("--output", type=Path, default=TABLE, help=f"default: {TABLE}")
    parser.add_argument("--date", help="the header's date (YYYY-MM-DD)")
    args = parser.parse_args(argv)
    if not (CCUSAGE / "package.json").is_file():
        fail(f"ccusage is not installed in {CCUSAGE.parent} (run npm ci in contrib/agents)")
    version = json.loads((CCUSAGE / "package.json").read_text())["version"]
    chunk = _chunk()
    url = re.search(r'LITELLM_PRICING_URL = "([^"]+)"', chunk.read_text())
    if url is None:
        fail(f"no LITELLM_PRICING_URL in {chunk}")
    answer = _node(chunk, [])
    old = _date_of(args.output)
    date = args.date
    if date is None and old is not None:
        same = args.output.read_bytes() == render(version, url.group(1), answer, old)
        date = old if same else None
    if date is None:
        date = datetime.datetime.now(datetime.UTC).date().isoformat()
    table = render(version, url.group(1), answer, date)
    probed = verify(table, chunk)
    if args.check:
        if not args.output.is_file() or args.output.read_bytes() != table:
            fail(f"{args.output} is not what ccusage {version} gives: run {GENERATOR}")
        print(f"{args.output}: up to date with ccusage {version}; {probed} probes agree")
        return
    args.output.write_bytes(table)
    print(f"wrote {args.output}: {len(answer['models'])} models from ccusage {version}; ", end="")
    print(f"{probed} probes agree")


if __name__ == "__main__":
    main()
