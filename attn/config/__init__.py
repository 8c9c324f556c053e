"""Settings as frozen dataclasses and the ml_collections configs built from them (`configurable`)."""
