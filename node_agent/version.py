"""The agent version string (its own module: the editable install may map ``node_agent`` as a namespace)."""

__version__ = "0.1.0"
