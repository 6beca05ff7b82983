"""The families: one ``DataModule`` subclass per batch shape; the public data-module names are their presets."""
