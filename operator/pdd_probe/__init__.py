"""The NIXL transfer probe, shared by what runs beside the engine (the sidecar) and what runs
before it with its devices (the node's preflight)."""
