"""The package version, in a module of its own so any module can import it."""

__version__ = "0.1.0"
