"""The one place the version is set: the `cobalt-agents` distribution takes it from here
([tool.hatch.version] in pyproject.toml), `cobalt --version` prints it and `cobalt.__version__`
re-exports it."""

__version__ = "0.1.0"
