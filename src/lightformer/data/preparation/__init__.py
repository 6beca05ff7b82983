"""How raw data is prepared once per job: tokenizers trained on a bounded sample (``tokenizers``), token shards and
records written by every core into a folder named by the sources' fingerprint (``prepare``, ``caching``)."""
