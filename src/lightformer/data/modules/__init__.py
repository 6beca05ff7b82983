"""One thin data module per task family, composing a source, its preparation, its loading and its objective."""
