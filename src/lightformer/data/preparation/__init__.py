"""How raw data is prepared once per job: tokenizers (``lightformer.tokenization``) trained on a bounded sample, token
shards and records written by every core into a folder named by the sources' fingerprint (``prepare``, ``caching``)."""
