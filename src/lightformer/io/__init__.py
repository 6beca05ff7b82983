"""What runs write and read besides the data: checkpoints (safe reading, the start from other weights),
files (atomic writes, UTF-8 reading, locks), and the Hugging Face and timm layouts of each model family
(``hf_layouts``: a model folder both ways; ``layouts/``: one module per family)."""
