"""The daemon: the Trio shell around the core.

The hub (:mod:`.hub`) owns the bus, correlation, sessions, history and
accounting; the server and its connections speak the wire protocol on the
Unix socket (:mod:`.endpoint` binds it); runs and the permission broker drive
agents; the journal keeps history on disk. Each connection's tasks live in
its own scope.
"""
