"""How prepared data reaches every process: shards and records streamed with a resumable position (``streaming``),
epoch-seeded orders and token-budget batches (``sampling``), padded batches (``sequences``)."""
