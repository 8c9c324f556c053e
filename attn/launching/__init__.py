"""Running experiments: the entry points' shared command-line conventions (`cli`: settings
dataclasses as flags, logging, one-line errors, serving a page), where runs execute
(`launchers`: local processes or a Slurm job array) and headless Chromium (`browser`)."""
