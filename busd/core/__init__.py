"""The sans-I/O core: the event catalog and everything that reasons about events.

Events and the catalog, patterns, the bus, correlation, coalescing,
history, sessions, the permission rules and the accounting (usage, context,
stats, tool metrics, estimates). Pure and synchronous: no sockets, no files,
no event loop (an import-linter contract says so), so all of it is tested
without I/O. The layers above feed it and act on what it answers.
"""
