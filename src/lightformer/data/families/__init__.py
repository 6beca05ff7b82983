"""The families: one data module per batch shape a task trains on (``data.module.DataModule`` subclassed once
each); the public data-module names are short presets of a family and a source."""
