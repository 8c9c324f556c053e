"""What the application's packages share: atomic file writes (`files`), markdown tables (`tables`)
and the cache of jitted functions (`jitting`). Each is the one implementation of its kind."""
