"""A standalone NIXL push engine that moves KV-shaped bytes the way vLLM's push
connector does, and measures it (``python -m pdctl.connector.probe``, ``pdctl probe``).

Pure modules (no NIXL): :mod:`.plan` (block geometry, contiguous-run merging, descriptor
tables, checksum ranges), :mod:`.protocol` (registration and completion notifications),
:mod:`.match` (registrations vs finished blocks in either order, expiry, duplicates,
multi-rank notification counting), :mod:`.ucxlog` (which UCX transport carried the
WRITEs). NIXL I/O lives in :mod:`.engine`; :mod:`.session` runs the two ends over a small
TCP control channel; :mod:`.__main__` is the command line.
"""
