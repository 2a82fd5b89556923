"""The pdctl terminal UI (Textual). Talks only to :mod:`pdctl.sdk`."""
