"""The sans-I/O core: the event catalog and everything that reasons about events.

Events and the catalog, patterns, the bus, correlation, coalescing,
history, sessions, the permission rules and the accounting (usage, context,
stats, tool metrics, estimates, prices). Pure and synchronous: no sockets,
no files (but the package's own price table, read once like a module's
source), no event loop (an import-linter contract says so), so all of it is
tested without I/O. The layers above feed it and act on what it answers.
"""
