"""One package per API the gateway speaks; each stands on the shared generation core."""
