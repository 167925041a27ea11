"""taskgrove: the service (A2A agent, engine, HTTP surfaces)."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("taskgrove")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0.0.0"
