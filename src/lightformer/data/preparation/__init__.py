"""How raw data is prepared once per job into a fingerprinted folder (docs/data.md, "What preparation does")."""
