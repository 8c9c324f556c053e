"""The entry points (`python -m experiments.NAME`), one flat folder of four kinds: train, bench,
report and tools. experiments/README.md lists each module by kind, with what it does and a
command; configs/ holds the presets and web/ the pages' templates."""
