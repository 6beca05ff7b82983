"""How prepared data reaches every process: streamed shards and records, epoch-seeded samplers, padded batches."""
