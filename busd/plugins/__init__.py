"""The plugin layer: the hookspecs, the plugin manager, and the contracts plugins implement.

Adapters (raw SDK events to catalog events), drivers (running a prompt with
an SDK), the built-in ``replay`` driver, and :class:`~.host.PluginHost`, the
Protocol a plugin's hooks see the daemon through. Depends on the core and
the wire protocol only; the daemon depends on it, never the other way.
"""
