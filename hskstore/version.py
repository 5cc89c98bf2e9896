"""hsk's version, in a module of its own so every module can read it without importing the package."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("hsk")
except PackageNotFoundError:  # running from a source tree without installing
    __version__ = "0.0.0+source"
