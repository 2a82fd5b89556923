"""The ``pdctl`` command line: a thin layer over :mod:`pdctl.sdk` (and the TUI)."""
