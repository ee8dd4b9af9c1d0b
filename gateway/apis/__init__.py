"""The APIs the gateway speaks, one folder each over the shared core."""
