"""What the application's packages share: atomic file writes (`files`), markdown tables (`tables`),
the cache of jitted functions (`jitting`) and the registry of applications (`applications`). Each
is the one implementation of its kind."""
